//! GPU quantize, repack, dequantize and the tensor-core self-test, against
//! the CPU reference: bit-identical, fresh random data, poisoned outputs.

mod common;

use half::{bf16, f16};
use kbit::{Codebook, Context, Element, Error, ScaleMode, Shape, reference};
use rand::Rng;

fn all_shapes() -> Vec<(&'static str, usize, usize)> {
    common::SHAPES.iter().chain(common::AWKWARD.iter()).copied().collect()
}

fn poisoned<T: Element>(ctx: &Context, len: usize) -> cudarc::driver::CudaSlice<T> {
    ctx.stream().clone_htod(&vec![T::nan(); len]).unwrap()
}

fn check_shape<T: Element>(ctx: &Context, rng: &mut rand::rngs::SmallRng, name: &str, k: usize, n: usize, bits: u32) {
    let shape = Shape::new(n, k).unwrap();
    let cb = Codebook::nf(bits).unwrap();
    let scale = rng.random_range(0.01f32..2.0);
    let w: Vec<T> = common::gaussian(rng, shape.numel(), scale);
    let what = format!("{name} [{n},{k}] k={bits} {:?}", T::DTYPE);

    // Quantize: GPU vs CPU, bit-identical (padding included).
    let want = reference::quantize(&w, shape, &cb).unwrap();
    let dw = ctx.stream().clone_htod(&w).unwrap();
    let got = ctx.download_flat(&ctx.quantize(&dw, shape, &cb).unwrap()).unwrap();
    assert_eq!(got.packed(), want.packed(), "{what}: quantize planes");
    assert_eq!(common::bits(got.absmax()), common::bits(want.absmax()), "{what}: quantize absmax");

    // Repack: GPU (from the CPU flat weight) vs CPU.
    let want_t = reference::repack(&want, ScaleMode::Strict).unwrap();
    let flat_dev = ctx.upload_flat(&want).unwrap();
    let tiled_dev = ctx.repack(&flat_dev, ScaleMode::Strict).unwrap();
    let got_t = ctx.download(&tiled_dev).unwrap();
    assert_eq!(got_t, want_t, "{what}: repack");

    // Dequantize both layouts to f16, bf16, f32 into poisoned buffers.
    dequant_both::<f16>(ctx, &want, &flat_dev, &want_t, &tiled_dev, &what);
    dequant_both::<bf16>(ctx, &want, &flat_dev, &want_t, &tiled_dev, &what);
    dequant_both::<f32>(ctx, &want, &flat_dev, &want_t, &tiled_dev, &what);
}

fn dequant_both<T: Element>(
    ctx: &Context,
    flat: &kbit::FlatWeight,
    flat_dev: &kbit::DeviceFlatWeight,
    tiled: &kbit::TiledWeight,
    tiled_dev: &kbit::KbitWeight,
    what: &str,
) {
    let len = flat.shape().numel();
    let mut out = poisoned::<T>(ctx, len);
    ctx.dequantize_flat(flat_dev, &mut out).unwrap();
    let got = ctx.stream().clone_dtoh(&out).unwrap();
    common::assert_bits_eq(
        &got,
        &reference::dequantize_flat::<T>(flat),
        &format!("{what}: dequant flat -> {:?}", T::DTYPE),
    );
    let mut out = poisoned::<T>(ctx, len);
    ctx.dequantize(tiled_dev, &mut out).unwrap();
    let got = ctx.stream().clone_dtoh(&out).unwrap();
    common::assert_bits_eq(
        &got,
        &reference::dequantize_tiled::<T>(tiled),
        &format!("{what}: dequant tiled -> {:?}", T::DTYPE),
    );
}

#[test]
fn quantize_repack_dequantize_match_cpu_on_all_shapes() {
    let Some(ctx) = common::gpu("quantize_repack_dequantize_match_cpu_on_all_shapes") else { return };
    let mut rng = common::rng("quantize_repack_dequantize_match_cpu_on_all_shapes");
    for (name, k, n) in all_shapes() {
        for bits in 2..=5 {
            // Every dtype on the awkward and small shapes; f16 weights (the
            // usual checkpoint dtype) on the large ones, bf16/f32 on a rotation.
            check_shape::<f16>(&ctx, &mut rng, name, k, n, bits);
            match (bits as usize + n) % 3 {
                0 => check_shape::<bf16>(&ctx, &mut rng, name, k, n, bits),
                1 => check_shape::<f32>(&ctx, &mut rng, name, k, n, bits),
                _ => {}
            }
            if k * n <= 1 << 16 {
                check_shape::<bf16>(&ctx, &mut rng, name, k, n, bits);
                check_shape::<f32>(&ctx, &mut rng, name, k, n, bits);
            }
        }
    }
    eprintln!("quantize/repack/dequantize: {} shapes × k=2..5 bit-identical", all_shapes().len());
}

#[test]
fn gpu_quantize_reports_the_first_non_finite_block() {
    let Some(ctx) = common::gpu("gpu_quantize_reports_the_first_non_finite_block") else { return };
    let shape = Shape::new(64, 256).unwrap();
    let mut w = vec![f16::from_f32(0.25); shape.numel()];
    w[5 * 256 + 100] = f16::INFINITY; // block 5·8 + 3 = 43
    w[40 * 256 + 7] = f16::NAN; // block 320
    let dw = ctx.stream().clone_htod(&w).unwrap();
    ctx.quantize(&dw, shape, &Codebook::nf(4).unwrap()).unwrap();
    let e = ctx.synchronize().unwrap_err();
    assert!(matches!(e, Error::NonFinite { block: 43, .. }), "{e}");
    // The status is cleared once reported.
    ctx.synchronize().unwrap();
}

#[test]
fn gpu_repack_reports_scale_out_of_range_and_saturates_on_request() {
    let Some(ctx) = common::gpu("gpu_repack_reports_scale_out_of_range_and_saturates_on_request") else { return };
    let shape = Shape::new(4, 128).unwrap();
    let mut w = vec![0.5f32; shape.numel()];
    w[2 * 128 + 64] = -100.0; // block 2·4 + 2 = 10
    let flat = reference::quantize(&w, shape, &Codebook::nf(3).unwrap()).unwrap();
    let dev = ctx.upload_flat(&flat).unwrap();
    let strict = ctx.repack(&dev, ScaleMode::Strict).unwrap();
    let e = ctx.download(&strict).unwrap_err();
    assert!(matches!(e, Error::ScaleRange { block: 10, .. }), "{e}");
    let sat = ctx.download(&ctx.repack(&dev, ScaleMode::Saturate).unwrap()).unwrap();
    assert_eq!(sat, reference::repack(&flat, ScaleMode::Saturate).unwrap());
}

#[test]
fn dequantize_rejects_wrong_output_length() {
    let Some(ctx) = common::gpu("dequantize_rejects_wrong_output_length") else { return };
    let shape = Shape::new(8, 64).unwrap();
    let flat = reference::quantize(&vec![0.1f32; 512], shape, &Codebook::nf(2).unwrap()).unwrap();
    let w = ctx.upload(&reference::repack(&flat, ScaleMode::Strict).unwrap()).unwrap();
    let mut out = ctx.stream().alloc_zeros::<f16>(511).unwrap();
    assert!(matches!(ctx.dequantize(&w, &mut out), Err(Error::Length { expected: 512, got: 511, .. })));
    let mut big = ctx.stream().alloc_zeros::<f16>(520).unwrap();
    let mut view = big.slice_mut(4..516);
    assert!(matches!(ctx.dequantize(&w, &mut view), Err(Error::Alignment { .. })));
}

fn mma_case(ctx: &Context, rng: &mut rand::rngs::SmallRng, dtype: kbit::Dtype) {
    let (a, w): (Vec<f32>, Vec<f32>) = match dtype {
        kbit::Dtype::F16 => (
            common::uniform::<f16>(rng, 256).iter().map(|v| v.to_f32()).collect(),
            common::uniform::<f16>(rng, 128).iter().map(|v| v.to_f32()).collect(),
        ),
        _ => (
            common::uniform::<bf16>(rng, 256).iter().map(|v| v.to_f32()).collect(),
            common::uniform::<bf16>(rng, 128).iter().map(|v| v.to_f32()).collect(),
        ),
    };
    let raw = |v: &[f32]| -> Vec<u16> {
        v.iter()
            .map(|&x| if dtype == kbit::Dtype::F16 { f16::from_f32(x).to_bits() } else { bf16::from_f32(x).to_bits() })
            .collect()
    };
    let c = ctx.mma_selftest(dtype, &raw(&a).try_into().unwrap(), &raw(&w).try_into().unwrap()).unwrap();
    for i in 0..16 {
        for j in 0..8 {
            let want: f64 = (0..16).map(|k| a[i * 16 + k] as f64 * w[j * 16 + k] as f64).sum();
            assert!((c[i * 8 + j] as f64 - want).abs() < 1e-5, "{dtype:?} C[{i}][{j}] = {} want {want}", c[i * 8 + j]);
        }
    }
}

#[test]
fn tensor_core_building_blocks_compute_a_tile_product() {
    let Some(ctx) = common::gpu("tensor_core_building_blocks_compute_a_tile_product") else { return };
    let mut rng = common::rng("tensor_core_building_blocks_compute_a_tile_product");
    for _ in 0..4 {
        mma_case(&ctx, &mut rng, kbit::Dtype::F16);
        mma_case(&ctx, &mut rng, kbit::Dtype::Bf16);
    }
}
