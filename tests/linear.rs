//! `Context::linear` against the CPU reference (f64 matmul of the
//! dequantized weights), on fresh random data with NaN-poisoned outputs,
//! plus argument validation and kernel forcing.
//!
//! Tolerances: the tensor-core and cuBLAS paths multiply weights rounded to
//! T (f16/bf16; the tensor-core kernels round the codebook entry and its
//! product with the scale) with f32 accumulation and round the output to
//! T; the reference uses the exact f32 weights in f64. Expected errors are
//! about half to one ulp of T per weight and half an ulp per output. They
//! scale with s, s² = Σ_k (x·w)² per output (`common::product_errors`),
//! not with the outputs, which for N = 1 can cancel to a small fraction of
//! s; we assert
//!   f16:  ‖y − ref‖/‖s‖ ≤ 1e-3,  max |y − ref| / max(|ref|, rms(s)) ≤ 4e-3 (≈ 4 f16 ulps)
//!   bf16: ‖y − ref‖/‖s‖ ≤ 8e-3,  max |y − ref| / max(|ref|, rms(s)) ≤ 3e-2 (≈ 4 bf16 ulps)

mod common;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use kbit::{Codebook, Context, Dtype, Element, Error, KbitWeight, Kernel, ScaleMode, Shape, TiledWeight, reference};
use rand::Rng;
use rand::rngs::SmallRng;

/// Batch sizes the tests cover (each shape sees every one).
const MS: [usize; 5] = [1, 5, 17, 64, 300];

fn tolerance<T: Element>() -> (f64, f64) {
    match T::DTYPE {
        kbit::Dtype::F16 => (1e-3, 4e-3),
        _ => (8e-3, 3e-2),
    }
}

/// A random weight quantized on the GPU (bit-identical to the CPU
/// reference, tested elsewhere), with its host copy for the reference.
fn random_weight(ctx: &Context, rng: &mut SmallRng, shape: Shape, bits: u32) -> (KbitWeight, TiledWeight) {
    let scale = rng.random_range(0.02f32..1.5);
    let w: Vec<f32> = common::gaussian(rng, shape.numel(), scale);
    let flat = ctx.quantize(&ctx.stream().clone_htod(&w).unwrap(), shape, &Codebook::nf(bits).unwrap()).unwrap();
    let dev = ctx.repack(&flat, ScaleMode::Strict).unwrap();
    let host = ctx.download(&dev).unwrap();
    (dev, host)
}

fn poisoned<T: Element>(ctx: &Context, len: usize) -> CudaSlice<T> {
    ctx.stream().clone_htod(&vec![T::nan(); len]).unwrap()
}

/// Runs `linear` for one (weight, M, T) and checks it against `want_w`
/// (the dequantized f32 weights).
fn check_linear<T: Element>(
    ctx: &Context,
    rng: &mut SmallRng,
    w: &KbitWeight,
    want_w: &[f32],
    m: usize,
    what: &str,
) -> Kernel {
    let shape = w.shape();
    let x: Vec<T> = common::gaussian(rng, m * shape.k, 1.0);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let mut dy = poisoned::<T>(ctx, m * shape.n);
    let kernel = ctx.linear(&dx, m, w, &mut dy).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(ctx.last_kernel(), Some(kernel), "{what}: last_kernel");
    let got: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
    ctx.synchronize().unwrap();
    let want = reference::matmul_f64(&x, m, want_w, shape).unwrap();
    let (rel, worst) = common::product_errors(&got, &want, &x, m, want_w, shape);
    let (tol_rel, tol_max) = tolerance::<T>();
    assert!(
        rel <= tol_rel && worst <= tol_max,
        "{what} M={m} {:?} via {kernel}: relative error {rel:.2e} (≤ {tol_rel:.0e}), max error {worst:.2e} (≤ {tol_max:.0e})",
        T::DTYPE
    );
    kernel
}

/// The kernel automatic dispatch picks for M rows of a dense `shape`
/// layer of `bits` bits, on a device with the warpgroup GEMM (sm_90) or
/// without.
fn expected_kernel(ctx: &Context, m: usize, w: &kbit::KbitWeight) -> Kernel {
    let (shape, bits) = (w.shape(), w.bits());
    let wgmma = ctx.wgmma_slots(bits, Dtype::F16);
    let weights = shape.n * shape.k;
    let wgmma_from = |least: usize| wgmma.is_some() && weights >= least;
    match m {
        1..=4 if kbit::small_m::prefers_mma(m, shape, bits) => Kernel::Mma,
        1..=4 => Kernel::Scalar,
        5..=32 => Kernel::Mma,
        33..=48 if weights >= 1 << 21 => Kernel::Mma,
        49..=64 if weights >= 1 << 22 => Kernel::Mma,
        65..=512 if wgmma_from(1 << 22) => Kernel::Mma,
        513..=768 if wgmma_from(1 << 23) => Kernel::Mma,
        769..=2048 if wgmma_from(1 << 24) => Kernel::Mma,
        _ => Kernel::DequantCublas,
    }
}

#[test]
fn linear_matches_reference_on_design_shapes() {
    let test = "linear_matches_reference_on_design_shapes";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let mut seen = [[false; MS.len()]; common::SHAPES.len()];
    for (si, &(name, k, n)) in common::SHAPES.iter().enumerate() {
        let shape = Shape::new(n, k).unwrap();
        for bits in 2..=5u32 {
            let (w, host) = random_weight(&ctx, &mut rng, shape, bits);
            let want_w = reference::dequantize_tiled::<f32>(&host);
            // Each (k, dtype) pair of a shape gets another M, so every shape
            // sees every M (8 pairs over 5 values of M).
            for dt in 0..2usize {
                let mi = ((bits as usize - 2) * 2 + dt + si) % MS.len();
                let what = format!("{name} [{n},{k}] k={bits}");
                let kernel = if dt == 0 {
                    check_linear::<f16>(&ctx, &mut rng, &w, &want_w, MS[mi], &what)
                } else {
                    check_linear::<bf16>(&ctx, &mut rng, &w, &want_w, MS[mi], &what)
                };
                assert_eq!(kernel, expected_kernel(&ctx, MS[mi], &w), "{what}: dispatch at M = {}", MS[mi]);
                seen[si][mi] = true;
            }
        }
    }
    assert!(seen.iter().all(|s| s.iter().all(|&b| b)), "every shape × M covered");
    eprintln!("linear: {} shapes × k=2..5 × f16/bf16, M ∈ {MS:?}", common::SHAPES.len());
}

#[test]
fn linear_matches_reference_on_awkward_shapes() {
    let test = "linear_matches_reference_on_awkward_shapes";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    for (i, &(name, k, n)) in common::AWKWARD.iter().enumerate() {
        let shape = Shape::new(n, k).unwrap();
        let bits = 2 + (i as u32 % 4);
        let (w, host) = random_weight(&ctx, &mut rng, shape, bits);
        let want_w = reference::dequantize_tiled::<f32>(&host);
        let what = format!("{name} [{n},{k}] k={bits}");
        for m in [1, 3, 33] {
            check_linear::<f16>(&ctx, &mut rng, &w, &want_w, m, &what);
            check_linear::<bf16>(&ctx, &mut rng, &w, &want_w, m, &what);
        }
    }
}

#[test]
fn linear_dispatch_around_the_crossovers() {
    // M = 2..4: the scalar GEMV or the MMA kernel as the measured table
    // says (`kbit::small_m`; both kinds occur below).
    // M = 48: the MMA kernel from 2^21 weights, M = 56 from 2^22 (on sm_90
    // its warpgroup form on 8192 columns and more), dequant + cuBLAS below
    // (`kv`, 2^20, and the 2^19 matrix). On sm_90 the warpgroup GEMM at
    // M = 100 and 200 from 2^22 weights, at M = 600 from 2^23 and at
    // M = 1000 from 2^24; elsewhere dequant + cuBLAS. Every result checked
    // against the reference.
    let test = "linear_dispatch_around_the_crossovers";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    // (N, K): exactly 2^27 weights (M = 2, 3 only), 2^25 and more, exactly
    // 2^24, exactly 2^23, between (Qwen3 gate/up), exactly 2^22, exactly
    // 2^20 (`kv`) and below; M = 600 and 1000 up to 2^24.
    let shapes =
        [(16384, 8192), (4100, 8192), (8192, 2048), (4096, 2048), (5120, 2048), (2048, 2048), (512, 2048), (256, 2048)];
    let mut seen_small_m = [false; 2];
    for (n, k) in shapes {
        let shape = Shape::new(n, k).unwrap();
        let ms: &[usize] = match n * k {
            w if w >= 1 << 27 => &[2, 3],
            w if w > 1 << 24 => &[2, 3, 4, 48, 56, 100, 200],
            _ => &[2, 3, 4, 48, 56, 100, 200, 600, 1000],
        };
        for bits in [2, 3, 4, 5] {
            let (w, host) = random_weight(&ctx, &mut rng, shape, bits);
            let want_w = reference::dequantize_tiled::<f32>(&host);
            let what = format!("[{n},{k}] k={bits}");
            for &m in ms {
                let kernel = check_linear::<f16>(&ctx, &mut rng, &w, &want_w, m, &what);
                assert_eq!(kernel, expected_kernel(&ctx, m, &w), "{what}: dispatch at M = {m}");
                if m <= 4 {
                    seen_small_m[(kernel == Kernel::Mma) as usize] = true;
                }
            }
        }
    }
    assert_eq!(seen_small_m, [true, true], "M ≤ 4 ran both the GEMV and the MMA kernel");
}

#[test]
fn linear_accepts_views_and_small_then_large_weights() {
    // Row slices of larger buffers (as MoE expert batches are), and a
    // scratch buffer that has to grow between calls.
    let test = "linear_accepts_views_and_small_then_large_weights";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    for (n, k) in [(128, 256), (2048, 1024), (64, 512)] {
        let shape = Shape::new(n, k).unwrap();
        let (w, host) = random_weight(&ctx, &mut rng, shape, 4);
        let want_w = reference::dequantize_tiled::<f32>(&host);
        let (m, skip) = (7, 3);
        let x: Vec<f16> = common::gaussian(&mut rng, (m + skip) * k, 1.0);
        let dx = ctx.stream().clone_htod(&x).unwrap();
        let mut dy = poisoned::<f16>(&ctx, (m + skip) * n);
        let xv = dx.slice(skip * k..);
        let mut yv = dy.slice_mut(skip * n..);
        ctx.linear(&xv, m, &w, &mut yv).unwrap();
        let got: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
        assert!(got[..skip * n].iter().all(|v| v.is_nan()), "rows before the view stay untouched");
        let want = reference::matmul_f64(&x[skip * k..], m, &want_w, shape).unwrap();
        let (rel, worst) = common::product_errors(&got[skip * n..], &want, &x[skip * k..], m, &want_w, shape);
        assert!(rel <= 1e-3 && worst <= 4e-3, "[{n},{k}] view: {rel:.2e} {worst:.2e}");
    }
}

#[test]
fn linear_is_capturable_in_a_cuda_graph() {
    let test = "linear_is_capturable_in_a_cuda_graph";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(512, 2048).unwrap();
    let (w, host) = random_weight(&ctx, &mut rng, shape, 3);
    let want_w = reference::dequantize_tiled::<f32>(&host);
    let m = 9;
    let x: Vec<f16> = common::gaussian(&mut rng, m * shape.k, 1.0);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let mut dy = poisoned::<f16>(&ctx, m * shape.n);

    // Capturing before any eager call would have to allocate: refused, and
    // the capture can still be ended cleanly.
    let s = ctx.stream();
    let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
    // (The dequant + cuBLAS path is the one with resources to set up; the
    // MMA kernel that automatic dispatch picks at this M needs none.)
    ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
    s.begin_capture(mode).unwrap();
    let refused = ctx.linear(&dx, m, &w, &mut dy);
    let _ = s.end_capture(flags);
    ctx.force_kernel(None).unwrap();
    assert!(matches!(refused, Err(Error::NotApplicable { kernel: Kernel::DequantCublas, .. })), "{refused:?}");

    // Capture and replay on the cuBLAS path and on the kernel automatic
    // dispatch picks (MMA at this M).
    for forced in [Some(Kernel::DequantCublas), None] {
        ctx.force_kernel(forced).unwrap();
        // Set up ahead (handle, workspace, scratch), then one eager call so that
        // cuBLAS has loaded its kernel for this shape before the capture.
        ctx.prepare_linear(shape).unwrap();
        ctx.linear(&dx, m, &w, &mut dy).unwrap();
        let eager: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
        ctx.synchronize().unwrap();
        let mut dy = poisoned::<f16>(&ctx, m * shape.n);
        s.begin_capture(mode).unwrap();
        let r = ctx.linear(&dx, m, &w, &mut dy);
        let graph = s.end_capture(flags).unwrap_or_else(|e| panic!("{forced:?}: capture: {e} (call: {r:?})"));
        let graph = graph.expect("a captured graph");
        r.unwrap();
        // Nothing ran yet: the output is still poisoned.
        assert!(ctx.stream().clone_dtoh(&dy).unwrap().iter().all(|v| v.is_nan()));
        for _ in 0..3 {
            graph.launch().unwrap();
        }
        let got: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
        ctx.synchronize().unwrap();
        let want = reference::matmul_f64(&x, m, &want_w, shape).unwrap();
        for (name, got) in [("eager", &eager), ("graph replay", &got)] {
            let (rel, worst) = common::product_errors(got, &want, &x, m, &want_w, shape);
            assert!(rel <= 1e-3 && worst <= 4e-3, "{forced:?} {name}: {rel:.2e} {worst:.2e}");
        }
    }
    ctx.force_kernel(None).unwrap();
}

fn small_weight(ctx: &Context) -> KbitWeight {
    let shape = Shape::new(64, 128).unwrap();
    let w: Vec<f32> = (0..shape.numel()).map(|i| (i as f32 * 0.37).sin()).collect();
    let flat = reference::quantize(&w, shape, &Codebook::nf(4).unwrap()).unwrap();
    ctx.upload(&reference::repack(&flat, ScaleMode::Strict).unwrap()).unwrap()
}

#[test]
fn linear_rejects_bad_arguments() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("linear_rejects_bad_arguments") else { return };
    let w = small_weight(&ctx); // N = 64, K = 128
    let s = ctx.stream();
    let m = 3;
    let x = s.alloc_zeros::<f16>(m * 128).unwrap();
    let mut y = s.alloc_zeros::<f16>(m * 64).unwrap();

    // f32 activations: a clear dtype error.
    let x32 = s.alloc_zeros::<f32>(m * 128).unwrap();
    let mut y32 = s.alloc_zeros::<f32>(m * 64).unwrap();
    let e = ctx.linear(&x32, m, &w, &mut y32).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }) && e.to_string().contains("f16 or bf16"), "{e}");

    // M = 0.
    let e = ctx.linear(&x.slice(0..0), 0, &w, &mut y.slice_mut(0..0)).unwrap_err();
    assert!(matches!(e, Error::Rows { m: 0, .. }), "{e}");

    // x and y lengths that do not match M·K and M·N.
    let e = ctx.linear(&x, m + 1, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 512, got: 384, .. }) && e.to_string().contains("activations"), "{e}");
    let e = ctx.linear(&x.slice(0..128), 1, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 64, got: 192, .. }) && e.to_string().contains("outputs"), "{e}");

    // Wrong dtype pairing cannot compile (x and y share T); a bf16 call works.
    let xb = s.alloc_zeros::<bf16>(m * 128).unwrap();
    let mut yb = s.alloc_zeros::<bf16>(m * 64).unwrap();
    assert_eq!(ctx.linear(&xb, m, &w, &mut yb).unwrap(), expected_kernel(&ctx, m, &w));
    ctx.synchronize().unwrap();
}

#[test]
fn forcing_kernels() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("forcing_kernels") else { return };
    assert_eq!(ctx.last_kernel(), None);
    assert_eq!(ctx.forced_kernel(), None);
    let w = small_weight(&ctx);
    let s = ctx.stream();
    let x = s.alloc_zeros::<f16>(2 * 128).unwrap();
    let mut y = s.alloc_zeros::<f16>(2 * 64).unwrap();

    // Kernels this build lacks cannot be forced; the setting stays as it was.
    for k in Kernel::ALL.into_iter().filter(|k| !k.is_available()) {
        let e = ctx.force_kernel(Some(k)).unwrap_err();
        assert!(matches!(e, Error::NotApplicable { kernel, .. } if kernel == k), "{e}");
        assert_eq!(ctx.forced_kernel(), None);
    }
    ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
    assert_eq!(ctx.forced_kernel(), Some(Kernel::DequantCublas));
    assert_eq!(ctx.linear(&x, 2, &w, &mut y).unwrap(), Kernel::DequantCublas);
    assert_eq!(ctx.last_kernel(), Some(Kernel::DequantCublas));
    // Grouped kernels never serve linear, once they exist either.
    for k in [Kernel::GroupedScalar, Kernel::GroupedMma] {
        if ctx.force_kernel(Some(k)).is_ok() {
            let e = ctx.linear(&x, 2, &w, &mut y).unwrap_err();
            assert!(matches!(e, Error::NotApplicable { kernel, .. } if kernel == k), "{e}");
        }
    }
    ctx.force_kernel(None).unwrap();
    assert_eq!(ctx.forced_kernel(), None);
    assert!(ctx.linear(&x, 2, &w, &mut y).is_ok());
    ctx.synchronize().unwrap();
}

#[test]
fn kernel_names() {
    let names: Vec<String> = Kernel::ALL.iter().map(|k| k.to_string()).collect();
    assert_eq!(names, ["scalar", "mma", "dequant_cublas", "grouped_scalar", "grouped_mma"]);
    for k in Kernel::ALL {
        assert_eq!(Kernel::from_name(k.name()), Some(k));
    }
    assert_eq!(Kernel::from_name("fp16"), None);
    assert!(Kernel::DequantCublas.is_available());
    let e = Error::NotApplicable { kernel: Kernel::Mma, why: "M = 300 beyond 16".into() };
    assert_eq!(e.to_string(), "kernel mma not applicable: M = 300 beyond 16");
}

/// Programmatic launches (sm_90: a GEMV or GEMM kernel starts while the
/// kernel before it is still running, and waits for it before it touches
/// activations) keep every dependency of a chain of layers. Layer i reads
/// buffer i % 2 and writes buffer (i + 1) % 2: it reads what layer i − 1
/// just wrote, and overwrites what layer i − 1 read. GEMV and tensor-core
/// kernels alternate at M = 1 and 4 (forced), M = 12 takes the automatic
/// (split-K) plan, M = 200 alternates the warpgroup GEMM (sm_90) with
/// dequant + cuBLAS, and layer 3 reads a weight repacked on the stream right
/// before it. The chain launched serially is checked against the reference
/// layer by layer; launched programmatically, eagerly and replayed from a
/// CUDA graph, it must give the same bits.
#[test]
fn programmatic_launches_keep_every_dependency() {
    let test = "programmatic_launches_keep_every_dependency";
    let _serial = common::serial();
    let Some(mut ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let (d, layers, repacked) = (1024, 6, 3);
    let shape = Shape::new(d, d).unwrap();
    let cb = Codebook::nf(4).unwrap();
    // Weights of scale 1/√K keep activations near unit scale along the chain.
    let flats: Vec<_> = (0..layers)
        .map(|_| {
            let w: Vec<f32> = common::gaussian(&mut rng, d * d, 1.0 / (d as f32).sqrt());
            ctx.quantize(&ctx.stream().clone_htod(&w).unwrap(), shape, &cb).unwrap()
        })
        .collect();
    let ws: Vec<KbitWeight> = flats.iter().map(|f| ctx.repack(f, ScaleMode::Strict).unwrap()).collect();
    let want_ws: Vec<Vec<f32>> =
        ws.iter().map(|w| reference::dequantize_tiled::<f32>(&ctx.download(w).unwrap())).collect();
    let s = ctx.stream().clone();

    let mut runs = vec![
        (1, [Some(Kernel::Scalar), Some(Kernel::Mma)]),
        (4, [Some(Kernel::Scalar), Some(Kernel::Mma)]),
        (12, [None, None]),
    ];
    if ctx.has_wgmma() {
        // The warpgroup GEMM (sm_90, M > 64) between cuBLAS layers.
        runs.push((200, [Some(Kernel::Mma), None]));
    }
    for (m, kinds) in runs {
        // Two inputs, used in turn, so that a layer reading a buffer too
        // early would see the other input's values.
        let xs: [Vec<f16>; 2] = [common::gaussian(&mut rng, m * d, 1.0), common::gaussian(&mut rng, m * d, 1.0)];
        // Runs the chain on input `x` from fresh, poisoned buffers and
        // returns the last output; `check` compares every layer with the
        // reference (and synchronizes after each), `repack` takes layer 3's
        // weight from a repack enqueued right before it.
        let chain = |ctx: &Context, bufs: &mut [CudaSlice<f16>; 2], x: &[f16], check: bool, repack: bool| {
            s.memcpy_htod(x, &mut bufs[0]).unwrap();
            s.memcpy_htod(&vec![f16::NAN; m * d], &mut bufs[1]).unwrap();
            for (i, w) in ws.iter().enumerate() {
                ctx.force_kernel(kinds[i % 2]).unwrap();
                let fresh = (repack && i == repacked).then(|| ctx.repack(&flats[i], ScaleMode::Strict).unwrap());
                let w = fresh.as_ref().unwrap_or(w);
                let [a, b] = bufs;
                let (input, output) = if i % 2 == 0 { (&*a, b) } else { (&*b, a) };
                let kernel = ctx.linear(input, m, w, output).unwrap();
                if check {
                    let xin: Vec<f16> = s.clone_dtoh(input).unwrap();
                    let got: Vec<f32> = s.clone_dtoh(&*output).unwrap().iter().map(|v| v.to_f32()).collect();
                    let want = reference::matmul_f64(&xin, m, &want_ws[i], shape).unwrap();
                    let (rel, worst) = common::product_errors(&got, &want, &xin, m, &want_ws[i], shape);
                    assert!(rel <= 1e-3 && worst <= 4e-3, "M={m} layer {i} via {kernel}: {rel:.2e} {worst:.2e}");
                }
            }
            ctx.force_kernel(None).unwrap();
            ctx.synchronize().unwrap();
            s.clone_dtoh(&bufs[layers % 2]).unwrap()
        };
        let mut bufs = [s.alloc_zeros::<f16>(m * d).unwrap(), s.alloc_zeros::<f16>(m * d).unwrap()];

        ctx.set_programmatic_launch(false);
        let want = [chain(&ctx, &mut bufs, &xs[0], true, true), chain(&ctx, &mut bufs, &xs[1], true, true)];
        let programmatic = ctx.set_programmatic_launch(true);
        eprintln!("{test}: M={m}: programmatic launches {}", if programmatic { "on" } else { "unavailable" });
        for round in 0..4 {
            let got = chain(&ctx, &mut bufs, &xs[round % 2], false, true);
            common::assert_bits_eq(&got, &want[round % 2], &format!("M={m} eager round {round}"));
        }

        // The same chain (without the repack, which allocates) captured once
        // and replayed; the first layer's input is set outside the graph.
        let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
        s.begin_capture(mode).unwrap();
        for (i, w) in ws.iter().enumerate() {
            ctx.force_kernel(kinds[i % 2]).unwrap();
            let [a, b] = &mut bufs;
            let (input, output) = if i % 2 == 0 { (&*a, b) } else { (&*b, a) };
            ctx.linear(input, m, w, output).unwrap();
        }
        ctx.force_kernel(None).unwrap();
        let graph = s.end_capture(flags).unwrap().expect("a captured graph");
        for round in 0..4 {
            s.memcpy_htod(&xs[round % 2], &mut bufs[0]).unwrap();
            s.memcpy_htod(&vec![f16::NAN; m * d], &mut bufs[1]).unwrap();
            graph.launch().unwrap();
            ctx.synchronize().unwrap();
            let got = s.clone_dtoh(&bufs[layers % 2]).unwrap();
            common::assert_bits_eq(&got, &want[round % 2], &format!("M={m} graph replay {round}"));
        }
    }
}
