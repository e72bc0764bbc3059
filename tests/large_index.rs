//! Matrices past the 32-bit boundaries: a weight of 2^32 + 2^21 elements
//! whose planes take 2.7 GB (byte offsets past 2^31, element indices past
//! 2^32), and 128 experts of 2.7 GB in all (the last experts' planes past
//! 2^31 bytes), through dequantize, every `linear` path and every
//! `expert_linear` path. The outputs are checked where the offsets are
//! large: sampled element ranges at and past 2^31 and 2^32, and sampled
//! output columns (every column reads the last K tiles, which lie past 2^31
//! bytes of planes).
//!
//! Needs a GPU with 16 GiB of memory (peak ≈ 12 GB: the planes and an
//! f16 copy of the weight); smaller GPUs skip visibly. The tolerances are
//! those of `tests/linear.rs` (f16: ‖y − ref‖/‖s‖ ≤ 1e-3, max ≤ 4e-3).

mod common;

use half::f16;
use kbit::{Codebook, Context, Element, KbitWeight, Kernel, Shape, TiledWeight, reference};
use kbit_format::{e4m4, planes, quant, tile};
use rand::Rng;
use rand::rngs::SmallRng;

/// The dense weight: N = 2^17 + 64 columns (a partial last tile for
/// 128-column kernels), K = 2^15; 4 297 064 448 elements.
const N: usize = (1 << 17) + 64;
const K: usize = 1 << 15;
/// 5 bits: the largest planes per element (2.69 GB here).
const BITS: u32 = 5;
/// Device memory the tests need.
const MIN_MEM: usize = 16 << 30;

/// The GPU context where it has the memory, else `None` after a visible
/// skip line.
fn big_gpu(test: &str) -> Option<Context> {
    let ctx = common::gpu(test)?;
    if ctx.info().total_mem < MIN_MEM {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED (GPU memory {} GiB < {} GiB): {test}",
            ctx.info().total_mem >> 30,
            MIN_MEM >> 30
        );
        return None;
    }
    Some(ctx)
}

/// The tests' lock (one at a time: each holds ≈ 12 GB), a GPU with the
/// memory, and fresh random values; `None` after a visible skip line.
fn big_case(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Context, SmallRng)> {
    let serial = common::serial();
    let ctx = big_gpu(test)?;
    Some((serial, ctx, common::rng(test)))
}

/// A runtime-layout weight of random planes (uniform indices) and random
/// scales between 1/32 and 1.94 (E4M4 exponents 6..=11).
fn random_tiled(rng: &mut SmallRng, shape: Shape, cb: &Codebook) -> TiledWeight {
    assert_eq!(shape.k % 64, 0, "no padding block to clear");
    let mut packed = vec![0u32; shape.tiled_words(cb.bits())];
    rng.fill(packed.as_mut_slice());
    let scales: Vec<u8> = (0..shape.tiled_scales()).map(|_| rng.random_range(0x60u8..0xC0)).collect();
    TiledWeight::from_parts(shape, cb.clone(), packed, scales).unwrap()
}

/// Element `(n, kk)` of the dequantized weight, as
/// `reference::dequantize_tiled` computes it, without the whole matrix.
fn weight_at(w: &TiledWeight, n: usize, kk: usize) -> f32 {
    let (nd, bits, kb) = (w.shape().n as u64, w.codebook().bits() as usize, kk / 32);
    let wi = tile::word_index(nd, n as u64, kb as u64, bits as u64) as usize;
    let amax = e4m4::decode(w.scales()[tile::scale_index(nd, n as u64, kb as u64) as usize]);
    quant::dequant(w.codebook().values()[planes::index(&w.packed()[wi..wi + bits], kk % 32) as usize], amax)
}

/// Columns `cols` of the weight, as the rows of a `[cols.len(), K]` matrix.
fn columns(w: &TiledWeight, cols: &[usize]) -> Vec<f32> {
    let k = w.shape().k;
    cols.iter().flat_map(|&n| (0..k).map(move |kk| weight_at(w, n, kk))).collect()
}

/// Checks columns `cols` of `y` (`m` rows of `n_dim`) against x · Wᵀ of
/// those columns (`w_cols`, from [`columns`]), on the scale of the products
/// (`common::product_errors`).
fn check_columns(y: &[f16], n_dim: usize, x: &[f16], m: usize, w_cols: &[f32], cols: &[usize], what: &str) {
    let sub = Shape::new(cols.len(), x.len() / m).unwrap();
    let want = reference::matmul_f64(x, m, w_cols, sub).unwrap();
    let got: Vec<f32> = (0..m).flat_map(|r| cols.iter().map(move |&c| y[r * n_dim + c].to_f32())).collect();
    let (rel, worst) = common::product_errors(&got, &want, x, m, w_cols, sub);
    assert!(rel <= 1e-3 && worst <= 4e-3, "{what}: relative error {rel:.2e} (≤ 1e-3), max error {worst:.2e} (≤ 4e-3)");
}

/// Sampled output columns: the first, the middle and the last ones,
/// and a few at random.
fn sample_columns(rng: &mut SmallRng, n_dim: usize) -> Vec<usize> {
    let mut cols: Vec<usize> = (0..8).chain(n_dim / 2 - 4..n_dim / 2 + 4).chain(n_dim - 16..n_dim).collect();
    cols.extend((0..8).map(|_| rng.random_range(0..n_dim)));
    cols
}

#[test]
fn weight_at_matches_the_reference_dequantize() {
    let mut rng = common::rng("weight_at_matches_the_reference_dequantize");
    for bits in 2..=5 {
        let shape = Shape::new(67, 192).unwrap();
        let w = random_tiled(&mut rng, shape, &Codebook::nf(bits).unwrap());
        let want: Vec<f32> = reference::dequantize_tiled(&w);
        for n in 0..shape.n {
            for kk in 0..shape.k {
                assert_eq!(weight_at(&w, n, kk).to_bits(), want[n * shape.k + kk].to_bits(), "k={bits} ({n}, {kk})");
            }
        }
    }
}

/// The dense weight, on the GPU and on the host.
fn big_weight(ctx: &Context, rng: &mut SmallRng) -> (KbitWeight, TiledWeight) {
    let shape = Shape::new(N, K).unwrap();
    assert!(shape.numel() > 1 << 32 && shape.tiled_words(BITS) * 4 > 1 << 31);
    let host = random_tiled(rng, shape, &Codebook::nf(BITS).unwrap());
    (ctx.upload(&host).unwrap(), host)
}

#[test]
fn dequantize_past_2_pow_32_elements() {
    const TEST: &str = "dequantize_past_2_pow_32_elements";
    let Some((_serial, ctx, mut rng)) = big_case(TEST) else { return };
    let (w, host) = big_weight(&ctx, &mut rng);
    let s = ctx.stream();
    let numel = N * K;
    let mut out = s.alloc_zeros::<f16>(numel).unwrap();
    // Element ranges at the start, across 2^31 and 2^32, and at the end,
    // poisoned with NaN before the call.
    let ranges = [0..4096, (1 << 31) - 2048..(1 << 31) + 2048, (1 << 32) - 2048..(1 << 32) + 2048, numel - 4096..numel];
    for r in &ranges {
        s.memcpy_htod(&vec![f16::NAN; r.len()], &mut out.slice_mut(r.clone())).unwrap();
    }
    ctx.dequantize(&w, &mut out).unwrap();
    for r in ranges {
        let got = s.clone_dtoh(&out.slice(r.clone())).unwrap();
        let want: Vec<f16> = r.clone().map(|i| f16::from_f32_rne(weight_at(&host, i / K, i % K))).collect();
        common::assert_bits_eq(&got, &want, &format!("{TEST}: elements {r:?}"));
    }
    ctx.synchronize().unwrap();
}

#[test]
fn linear_past_2_pow_31_bytes_of_planes() {
    const TEST: &str = "linear_past_2_pow_31_bytes_of_planes";
    let Some((_serial, ctx, mut rng)) = big_case(TEST) else { return };
    let (w, host) = big_weight(&ctx, &mut rng);
    let cols = sample_columns(&mut rng, N);
    let w_cols = columns(&host, &cols);
    // (rows, forced kernel): the GEMV, the tensor-core GEMM at one and
    // several m blocks (the warpgroup form on sm_90 at 64 rows, where
    // `linear` takes it on a matrix this large), dequantize + cuBLAS.
    let cases = [
        (1, Some(Kernel::Scalar)),
        (1, Some(Kernel::Mma)),
        (1, None),
        (16, None),
        (64, Some(Kernel::Mma)),
        (4, Some(Kernel::DequantCublas)),
    ];
    for (m, forced) in cases {
        ctx.force_kernel(forced).unwrap();
        let x: Vec<f16> = common::gaussian(&mut rng, m * K, 1.0);
        let dx = ctx.stream().clone_htod(&x).unwrap();
        let mut dy = ctx.stream().clone_htod(&vec![f16::NAN; m * N]).unwrap();
        let kernel = ctx.linear(&dx, m, &w, &mut dy).unwrap_or_else(|e| panic!("{TEST} M={m} {forced:?}: {e}"));
        let y = ctx.stream().clone_dtoh(&dy).unwrap();
        ctx.synchronize().unwrap();
        check_columns(&y, N, &x, m, &w_cols, &cols, &format!("{TEST} M={m} via {kernel}"));
    }
    ctx.force_kernel(None).unwrap();
}

#[test]
fn expert_linear_past_2_pow_31_bytes_of_planes() {
    const TEST: &str = "expert_linear_past_2_pow_31_bytes_of_planes";
    let Some((_serial, ctx, mut rng)) = big_case(TEST) else { return };
    // 128 experts of [8192, 4096] at 5 bits: 2.68 GB of planes; expert 103
    // and later start past 2^31 bytes.
    let (num, shape) = (128, Shape::new(8192, 4096).unwrap());
    let cb = Codebook::nf(BITS).unwrap();
    let tiled: Vec<TiledWeight> = (0..num).map(|_| random_tiled(&mut rng, shape, &cb)).collect();
    assert!(103 * shape.tiled_words(BITS) * 4 > 1 << 31);
    let experts = ctx.upload_experts(&tiled).unwrap();
    let cols = sample_columns(&mut rng, shape.n);
    // Rows per expert (others empty) and max_m: one row each (the grouped
    // GEMV), up to 8 (the grouped tensor-core GEMM), 70 (dequantize +
    // strided-batched cuBLAS).
    let cases: [(&[(usize, usize)], usize); 3] =
        [(&[(0, 1), (64, 1), (126, 1), (127, 1)], 1), (&[(0, 3), (110, 1), (127, 8)], 8), (&[(5, 2), (127, 70)], 70)];
    for (rows, max_m) in cases {
        let mut counts = vec![0usize; num];
        for &(e, r) in rows {
            counts[e] = r;
        }
        let mut offsets = vec![0u32];
        for c in &counts {
            offsets.push(offsets[offsets.len() - 1] + *c as u32);
        }
        let total = offsets[num] as usize;
        let x: Vec<f16> = common::gaussian(&mut rng, total * shape.k, 1.0);
        let dx = ctx.stream().clone_htod(&x).unwrap();
        let doff = ctx.stream().clone_htod(&offsets).unwrap();
        let mut dy = ctx.stream().clone_htod(&vec![f16::NAN; total * shape.n]).unwrap();
        let kernel = ctx
            .expert_linear(&dx, &doff, max_m, &experts, &mut dy)
            .unwrap_or_else(|e| panic!("{TEST} max_m={max_m}: {e}"));
        let y = ctx.stream().clone_dtoh(&dy).unwrap();
        ctx.synchronize().unwrap();
        for &(e, r) in rows {
            let a = offsets[e] as usize;
            check_columns(
                &y[a * shape.n..(a + r) * shape.n],
                shape.n,
                &x[a * shape.k..(a + r) * shape.k],
                r,
                &columns(&tiled[e], &cols),
                &cols,
                &format!("{TEST} max_m={max_m} expert {e} via {kernel}"),
            );
        }
    }
}
