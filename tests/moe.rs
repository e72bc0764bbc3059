//! `expert_linear`: dispatch by max_m and expert count; the grouped tensor-core GEMM and the
//! batched dequant + cuBLAS path against the CPU reference, per expert, with
//! poisoned outputs.

mod common;

use half::{bf16, f16};
use kbit::{Codebook, Context, Element, Error, Kernel, ScaleMode, Shape, reference};

struct Case {
    experts: kbit::KbitExperts,
    /// Each expert alone, for the dense kernels.
    single: Vec<kbit::KbitWeight>,
    dense: Vec<Vec<f32>>,
    shape: Shape,
}

fn make_experts(ctx: &Context, rng: &mut rand::rngs::SmallRng, e: usize, k: usize, n: usize, bits: u32) -> Case {
    let shape = Shape::new(n, k).unwrap();
    let cb = Codebook::nf(bits).unwrap();
    let tiled: Vec<_> = (0..e)
        .map(|_| {
            let w: Vec<f32> = common::gaussian(rng, shape.numel(), 0.05);
            reference::repack(&reference::quantize(&w, shape, &cb).unwrap(), ScaleMode::Strict).unwrap()
        })
        .collect();
    let dense = tiled.iter().map(reference::dequantize_tiled::<f32>).collect();
    let single = tiled.iter().map(|t| ctx.upload(t).unwrap()).collect();
    Case { experts: ctx.upload_experts(&tiled).unwrap(), single, dense, shape }
}

/// Prefix sums of the rows per expert.
fn offsets_of(rows: &[usize]) -> Vec<u32> {
    let mut offsets = vec![0u32];
    for r in rows {
        offsets.push(offsets.last().unwrap() + *r as u32);
    }
    offsets
}

/// Runs expert_linear with the given rows per expert and checks every row
/// against the f64 reference of its expert. Returns the kernel that ran.
fn check<T: Element>(
    ctx: &Context,
    rng: &mut rand::rngs::SmallRng,
    case: &Case,
    rows: &[usize],
    max_m: usize,
) -> Kernel {
    let shape = case.shape;
    let total: usize = rows.iter().sum();
    let offsets = offsets_of(rows);
    let x: Vec<T> = common::uniform(rng, total * shape.k);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let doff = ctx.stream().clone_htod(&offsets).unwrap();
    let mut dy = ctx.stream().clone_htod(&vec![T::nan(); total * shape.n]).unwrap();
    let kernel = ctx.expert_linear(&dx, &doff, max_m, &case.experts, &mut dy).unwrap();
    ctx.synchronize().unwrap();
    let y: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
    check_rows(case, &x, &y, rows, &offsets, max_m, kernel);
    kernel
}

/// Checks every expert's rows of `y` against the f64 reference.
fn check_rows<T: Element>(
    case: &Case,
    x: &[T],
    y: &[f32],
    rows: &[usize],
    offsets: &[u32],
    max_m: usize,
    kernel: Kernel,
) {
    let shape = case.shape;
    for (e, r) in rows.iter().enumerate() {
        if *r == 0 {
            continue;
        }
        let (a, b) = (offsets[e] as usize, offsets[e + 1] as usize);
        let want = reference::matmul_f64(&x[a * shape.k..b * shape.k], *r, &case.dense[e], shape).unwrap();
        let (rel, worst) = common::errors(&y[a * shape.n..b * shape.n], &want, 1.0);
        let (rel_max, worst_max) = if T::DTYPE == kbit::Dtype::F16 { (2e-3, 4e-3) } else { (1e-2, 3e-2) };
        assert!(
            rel < rel_max && worst < worst_max,
            "{kernel} {:?} expert {e} ({r} rows, max_m {max_m}) [{},{}]: rel {rel:.2e} max {worst:.2e}",
            T::DTYPE,
            shape.n,
            shape.k
        );
    }
}

#[test]
fn expert_linear_dispatches_by_max_m_and_matches_reference() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("expert_linear_dispatches_by_max_m_and_matches_reference") else { return };
    let mut rng = common::rng("expert_linear_dispatches_by_max_m_and_matches_reference");
    let cases =
        [(4, 2048, 512), (2, 512, 2048), (3, 96, 72), (3, 96, 36), (5, 2048, 512), (3, 2048, 512), (5, 512, 2048)];
    for (bits, k, n) in cases {
        let case = make_experts(&ctx, &mut rng, 8, k, n, bits);
        // The tensor-core kernel's K-slot plan for `rows` rows of at most
        // `max_m` per expert (only on K ≥ 512).
        let kslots = |max_m: usize, rows: usize| {
            k >= 512
                && ctx
                    .grouped_mma_plan(kbit::Dtype::Bf16, max_m, &case.experts, rows, Default::default())
                    .unwrap()
                    .plan
                    .k_slots
        };
        // max_m = 2: the GEMV, but at k ≤ 4 where the tensor-core kernel
        // runs its K-slot plan.
        let tiny = [1, 2, 0, 2, 1, 1, 0, 2];
        let want = if bits <= 4 && kslots(2, tiny.iter().sum()) { Kernel::GroupedMma } else { Kernel::GroupedScalar };
        // (The case [512, 2048] at k = 3 takes that branch.)
        assert!(bits != 3 || k < 512 || want == Kernel::GroupedMma, "k={bits} [{n}, {k}]: no K-slot plan");
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &tiny, 2), want, "k={bits} [{n}, {k}]");
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &tiny, 2), want, "k={bits} [{n}, {k}]");
        // max_m = 4: the tensor-core kernel, but the GEMV at k ≥ 3 where
        // the tensor-core kernel has no K-slot plan.
        let small = [1, 3, 0, 2, 4, 1, 0, 4];
        let want = if bits >= 3 && !kslots(4, small.iter().sum()) { Kernel::GroupedScalar } else { Kernel::GroupedMma };
        // (The cases [2048, 512] at k = 5 and [72, 96] at k = 3 take that
        // branch.)
        assert!((bits, k) != (5, 512) || want == Kernel::GroupedScalar, "k={bits} [{n}, {k}]: a K-slot plan");
        assert!((bits, k) != (3, 96) || want == Kernel::GroupedScalar, "k={bits} [{n}, {k}]: a K-slot plan");
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &small, 4), want, "k={bits} [{n}, {k}]");
        // max_m = 3: the tensor-core kernel where it runs its K-slot plan
        // on K ≥ 512, the GEMV elsewhere.
        let threes = [1, 3, 0, 2, 3, 1, 0, 3];
        let want = if kslots(3, threes.iter().sum()) { Kernel::GroupedMma } else { Kernel::GroupedScalar };
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &threes, 3), want, "k={bits} [{n}, {k}]");
        let large = [5, 9, 0, 2, 16, 1, 0, 7];
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &large, 16), Kernel::GroupedMma);
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &large, 24), Kernel::GroupedMma);
        let one = [0, 0, 0, 0, 0, 33, 0, 0];
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &one, 33), Kernel::GroupedMma);
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &[3, 65, 0, 0, 0, 0, 1, 0], 65), Kernel::DequantCublas);
        // Each path forced where another would run.
        ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &small, 4), Kernel::DequantCublas);
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &large, 16), Kernel::DequantCublas);
        ctx.force_kernel(Some(Kernel::GroupedMma)).unwrap();
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &tiny, 2), Kernel::GroupedMma);
        ctx.force_kernel(Some(Kernel::GroupedScalar)).unwrap();
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &small, 4), Kernel::GroupedScalar);
        ctx.force_kernel(None).unwrap();
    }
}

#[test]
fn expert_linear_sends_many_two_row_experts_to_the_tensor_core_kernel() {
    let _serial = common::serial();
    let name = "expert_linear_sends_many_two_row_experts_to_the_tensor_core_kernel";
    let Some(ctx) = common::gpu(name) else { return };
    let mut rng = common::rng(name);
    let case = make_experts(&ctx, &mut rng, 40, 256, 136, 4);
    // 32 experts with one row each (max_m 1): the GEMV at any count.
    let mut ones = [0usize; 40];
    ones[..32].fill(1);
    assert_eq!(check::<f16>(&ctx, &mut rng, &case, &ones, 1), Kernel::GroupedScalar);
    let all: Vec<usize> = vec![1; 40];
    assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &all, 1), Kernel::GroupedScalar);
    // 20 experts with two rows (max_m 2): enough experts for the
    // tensor-core kernel.
    let twos: Vec<usize> = (0..40).map(|e| if e % 2 == 0 { 2 } else { 1 }).collect();
    assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &twos, 2), Kernel::GroupedMma);
    // 31 rows in all, so fewer than 32 experts can have rows: the GEMV.
    let mut fewer = [0usize; 40];
    fewer[..30].fill(1);
    fewer[3] = 2;
    assert_eq!(check::<f16>(&ctx, &mut rng, &case, &fewer, 2), Kernel::GroupedScalar);
    // max_m 3 follows the same rule.
    let threes: Vec<usize> = (0..40).map(|e| if e % 4 == 0 { 3 } else { 1 }).collect();
    assert_eq!(check::<f16>(&ctx, &mut rng, &case, &threes, 3), Kernel::GroupedMma);
    // (31 rows again: 26 experts with one row, one with two, one with three.)
    fewer[5] = 3;
    fewer[6] = 0;
    fewer[7] = 0;
    assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &fewer, 3), Kernel::GroupedScalar);
}

#[test]
fn expert_linear_edge_cases() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("expert_linear_edge_cases") else { return };
    let mut rng = common::rng("expert_linear_edge_cases");
    let case = make_experts(&ctx, &mut rng, 4, 256, 64, 4);
    // No rows at all: nothing to do, on both paths.
    let x = ctx.stream().alloc_zeros::<f16>(0).unwrap();
    let off = ctx.stream().clone_htod(&[0u32; 5]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(0).unwrap();
    ctx.expert_linear(&x, &off, 1, &case.experts, &mut y).unwrap();
    ctx.expert_linear(&x, &off, 8, &case.experts, &mut y).unwrap();
    ctx.synchronize().unwrap();
    // A max_m smaller than an expert's rows is reported by synchronize.
    let x = ctx.stream().alloc_zeros::<f16>(12 * 256).unwrap();
    let off = ctx.stream().clone_htod(&[0u32, 2, 2, 11, 12]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(12 * 64).unwrap();
    ctx.expert_linear(&x, &off, 5, &case.experts, &mut y).unwrap();
    let e = ctx.synchronize().unwrap_err();
    assert!(matches!(e, Error::ExpertRows { expert: 2 }), "{e}");
    ctx.synchronize().unwrap();
    // The same on the GEMV's path (max_m ≤ 4), the first such expert, and
    // through `grouped_gemv` itself. Four experts, 3 + 4 + 0 + 1 rows.
    let off8 = ctx.stream().clone_htod(&[0u32, 3, 7, 7, 8]).unwrap();
    let (x8, mut y8) = (x.slice(..8 * 256), y.slice_mut(..8 * 64));
    assert_eq!(ctx.expert_linear(&x8, &off8, 2, &case.experts, &mut y8).unwrap(), Kernel::GroupedScalar);
    let e = ctx.synchronize().unwrap_err();
    assert!(matches!(e, Error::ExpertRows { expert: 0 }), "{e}");
    ctx.grouped_gemv(&x8, &off8, 3, &case.experts, &mut y8).unwrap();
    let e = ctx.synchronize().unwrap_err();
    assert!(matches!(e, Error::ExpertRows { expert: 1 }), "{e}");
    ctx.grouped_gemv(&x8, &off8, 4, &case.experts, &mut y8).unwrap();
    ctx.synchronize().unwrap();
    // Argument errors.
    let bad_off = ctx.stream().clone_htod(&[0u32, 12]).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &bad_off, 5, &case.experts, &mut y), Err(Error::Length { .. })));
    assert!(ctx.expert_linear(&x, &off, 2, &case.experts, &mut y).is_err(), "12 rows > 2 × 4 experts");
    ctx.force_kernel(Some(Kernel::GroupedScalar)).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &off, 5, &case.experts, &mut y), Err(Error::NotApplicable { .. })));
    ctx.force_kernel(Some(Kernel::GroupedMma)).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &off, 65, &case.experts, &mut y), Err(Error::NotApplicable { .. })));
    ctx.force_kernel(Some(Kernel::Mma)).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &off, 5, &case.experts, &mut y), Err(Error::NotApplicable { .. })));
    ctx.force_kernel(None).unwrap();
    // The grouped tensor-core kernel: 16-byte aligned activations, max_m
    // in 1..=64, no stream-K.
    assert!(matches!(
        ctx.grouped_mma(&x, &off, 11, &case.experts, &mut y.slice_mut(0..11 * 64)),
        Err(Error::Length { .. })
    ));
    let xs = ctx.stream().alloc_zeros::<f16>(12 * 256 + 1).unwrap();
    assert!(matches!(ctx.grouped_mma(&xs.slice(1..), &off, 11, &case.experts, &mut y), Err(Error::Alignment { .. })));
    assert!(matches!(ctx.grouped_mma(&x, &off, 65, &case.experts, &mut y), Err(Error::Rows { .. })));
    let stream = kbit::MmaOptions { splits: kbit::Splits::Stream, ..Default::default() };
    assert!(matches!(ctx.grouped_mma_with(&x, &off, 11, &case.experts, &mut y, stream), Err(Error::SplitK { .. })));
    let f32x = ctx.stream().alloc_zeros::<f32>(12 * 256).unwrap();
    let mut f32y = ctx.stream().alloc_zeros::<f32>(12 * 64).unwrap();
    assert!(matches!(ctx.grouped_mma(&f32x, &off, 11, &case.experts, &mut f32y), Err(Error::Mismatch { .. })));
    // Too small a max_m on the tensor-core path is reported too.
    ctx.grouped_mma(&x, &off, 5, &case.experts, &mut y).unwrap();
    let e = ctx.synchronize().unwrap_err();
    assert!(matches!(e, Error::ExpertRows { expert: 2 }), "{e}");
    ctx.synchronize().unwrap();
}

/// Kernel 5 against kernel 2: each expert's rows bit-identical to the dense
/// tensor-core GEMM on that expert alone with the same split plan, and
/// within the reference tolerance; split counts forced to 1, to the
/// maximum and automatic; other SM counts; repeated calls identical
/// (workspace and counters left clean).
#[test]
fn grouped_mma_matches_dense_mma_per_expert() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("grouped_mma_matches_dense_mma_per_expert") else { return };
    let mut rng = common::rng("grouped_mma_matches_dense_mma_per_expert");
    let rows_8 = [5, 9, 0, 2, 16, 1, 0, 7];
    let cases: [(u32, usize, usize, &[usize], usize); 9] = [
        (4, 2048, 512, &rows_8, 16),
        (2, 512, 2048, &[17, 0, 33, 5], 33),
        (5, 2048, 512, &[0, 0, 0, 0, 0, 0, 0, 64], 64),
        (3, 96, 72, &[48, 1, 0, 31, 13], 48),
        (4, 32, 520, &[8, 8, 8, 8, 8, 8, 8, 8], 8),
        (2, 8192, 72, &[6, 0, 20], 20),
        (5, 1024, 200, &[64, 63, 1, 0, 40], 64),
        (3, 2048, 512, &[5; 64], 5),
        (4, 96, 4100, &[0, 0, 0], 9),
    ];
    for (i, &(bits, k, n, rows, max_m)) in cases.iter().enumerate() {
        let case = make_experts(&ctx, &mut rng, rows.len(), k, n, bits);
        let splits = [kbit::Splits::Fixed(1), kbit::Splits::Max, kbit::Splits::Auto][i % 3];
        let sms = [None, Some(128), Some(7)][i / 3 % 3];
        let opts = kbit::MmaOptions {
            splits,
            sm_count_override: sms,
            stage_tiles: None,
            tile_rows: None,
            k_slots: None,
            direct: None,
            teams: None,
            early_decode: None,
            x_registers: None,
        };
        if i % 2 == 0 {
            grouped_case::<f16>(&ctx, &mut rng, &case, rows, max_m, opts);
        } else {
            grouped_case::<bf16>(&ctx, &mut rng, &case, rows, max_m, opts);
        }
    }
}

/// The grouped K-slot variant (forced, and where the planner takes it)
/// against the dense K-slot variant on each expert alone, bit for bit, and
/// the f64 references: units that are experts (weights requested before
/// the grid-dependency wait) and units that are rows (64 experts of one
/// row, 10 experts of 3 rows), empty experts, M = 1..16, K % 64 == 32,
/// partial column blocks, no rows at all.
#[test]
fn grouped_kslots_match_dense_kslots_per_expert() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("grouped_kslots_match_dense_kslots_per_expert") else { return };
    let mut rng = common::rng("grouped_kslots_match_dense_kslots_per_expert");
    let forced = Some(true);
    // (k, K, N, rows per expert, max_m, MmaOptions::k_slots)
    type KslotCase<'a> = (u32, usize, usize, &'a [usize], usize, Option<bool>);
    let cases: [KslotCase; 9] = [
        (4, 2048, 512, &[1, 3, 0, 2, 4, 1, 0, 4], 4, None),
        (3, 2048, 512, &[8; 8], 8, None),
        (2, 2048, 512, &[5, 9, 0, 2, 16, 1, 0, 7], 16, forced),
        (5, 512, 2048, &[8, 0, 3, 1], 8, forced),
        (4, 96, 72, &[1; 64], 1, forced),
        (3, 2080, 520, &[0, 13, 0, 2], 13, forced),
        (2, 8192, 8, &[3, 0, 5], 5, forced),
        (5, 1024, 200, &[2, 0, 1, 0, 0, 0, 0, 0, 0, 0], 2, forced),
        (4, 2048, 512, &[0, 0, 0, 0], 4, forced),
    ];
    for (i, &(bits, k, n, rows, max_m, k_slots)) in cases.iter().enumerate() {
        let case = make_experts(&ctx, &mut rng, rows.len(), k, n, bits);
        let opts = kbit::MmaOptions { k_slots, ..Default::default() };
        let gp = if i % 2 == 0 {
            grouped_case::<f16>(&ctx, &mut rng, &case, rows, max_m, opts)
        } else {
            grouped_case::<bf16>(&ctx, &mut rng, &case, rows, max_m, opts)
        };
        if let Some(gp) = gp {
            assert!(gp.plan.k_slots, "case {i}: {gp:?}");
        }
    }
    // Past 16 rows the variant is refused by name.
    let case = make_experts(&ctx, &mut rng, 2, 64, 64, 4);
    let x = ctx.stream().clone_htod(&vec![f16::ZERO; 17 * 64]).unwrap();
    let off = ctx.stream().clone_htod(&[0u32, 17, 17]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(17 * 64).unwrap();
    let opts = kbit::MmaOptions { k_slots: forced, ..Default::default() };
    let e = ctx.grouped_mma_with(&x, &off, 17, &case.experts, &mut y, opts).unwrap_err();
    assert!(matches!(e, Error::Rows { m: 17, max: 16 }), "{e}");
}

/// One grouped call on fresh data against the references and kernel 2 on
/// each expert alone with the same plan (split count, or the K-slot
/// variant), then repeated; returns its launch.
fn grouped_case<T: Element>(
    ctx: &Context,
    rng: &mut rand::rngs::SmallRng,
    case: &Case,
    rows: &[usize],
    max_m: usize,
    opts: kbit::MmaOptions,
) -> Option<kbit::GroupedPlan> {
    let shape = case.shape;
    let total: usize = rows.iter().sum();
    let offsets = offsets_of(rows);
    let x: Vec<T> = common::uniform(rng, total.max(1) * shape.k);
    let x = &x[..total * shape.k];
    let dx = ctx.stream().clone_htod(x).unwrap();
    let doff = ctx.stream().clone_htod(&offsets).unwrap();
    let poisoned = vec![T::nan(); total * shape.n];
    let mut dy = ctx.stream().clone_htod(&poisoned).unwrap();
    let plan = ctx.grouped_mma_with(&dx, &doff, max_m, &case.experts, &mut dy, opts).unwrap();
    let what = format!(
        "{:?} k={} [{}, {}] rows {rows:?} max_m {max_m} {opts:?}: {plan:?}",
        T::DTYPE,
        case.experts.bits(),
        shape.n,
        shape.k
    );
    let Some(gp) = plan else {
        assert_eq!(total, 0, "{what}");
        return None;
    };
    assert_eq!(gp.units as usize, rows.len().min(total), "{what}");
    if opts.splits == kbit::Splits::Fixed(1) {
        assert_eq!(gp.plan.splits, 1, "{what}");
    }
    let got: Vec<T> = ctx.stream().clone_dtoh(&dy).unwrap();
    let y: Vec<f32> = got.iter().map(|v| v.to_f32()).collect();
    check_rows(case, x, &y, rows, &offsets, max_m, Kernel::GroupedMma);
    // Each expert alone through kernel 2 with the same splits.
    for (e, &r) in rows.iter().enumerate() {
        if r == 0 {
            continue;
        }
        let (a, b) = (offsets[e] as usize, offsets[e + 1] as usize);
        let xe = ctx.stream().clone_htod(&x[a * shape.k..b * shape.k]).unwrap();
        let mut ye = ctx.stream().clone_htod(&vec![T::nan(); r * shape.n]).unwrap();
        let dense = if gp.plan.k_slots {
            kbit::MmaOptions { k_slots: Some(true), ..Default::default() }
        } else {
            kbit::MmaOptions { splits: kbit::Splits::Fixed(gp.plan.splits), ..Default::default() }
        };
        let p = ctx.mma_gemm_with(&xe, r, &case.single[e], &mut ye, dense).unwrap();
        assert_eq!((p.splits, p.tiles_per_split), (gp.plan.splits, gp.plan.tiles_per_split), "{what}");
        assert_eq!(p.k_slots, gp.plan.k_slots, "{what}");
        let want: Vec<T> = ctx.stream().clone_dtoh(&ye).unwrap();
        common::assert_bits_eq(&got[a * shape.n..b * shape.n], &want, &format!("{what}: expert {e}"));
    }
    // Again into a fresh poisoned output: identical bits.
    let mut again = ctx.stream().clone_htod(&poisoned).unwrap();
    ctx.grouped_mma_with(&dx, &doff, max_m, &case.experts, &mut again, opts).unwrap();
    ctx.synchronize().unwrap();
    common::assert_bits_eq(&ctx.stream().clone_dtoh(&again).unwrap(), &got, &format!("{what}: repeated call"));
    Some(gp)
}

/// The cuBLAS path's row gather/scatter moves 16-byte chunks where the row
/// length and the arrays allow, single elements otherwise: activations and
/// outputs one element past an aligned start must give the same bits.
#[test]
fn expert_linear_unaligned_rows_match_aligned() {
    let _serial = common::serial();
    let Some(ctx) = common::gpu("expert_linear_unaligned_rows_match_aligned") else { return };
    let mut rng = common::rng("expert_linear_unaligned_rows_match_aligned");
    let case = make_experts(&ctx, &mut rng, 4, 256, 64, 4);
    // Rows per expert: 6, 0, 9, 5.
    let (shape, total) = (case.shape, 20);
    let off = ctx.stream().clone_htod(&[0u32, 6, 6, 15, 20]).unwrap();
    // x and y at element 1 of their buffers (2 bytes past a 256-byte start).
    let x: Vec<f16> = common::uniform(&mut rng, total * shape.k + 1);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let mut y_aligned = ctx.stream().clone_htod(&vec![f16::NAN; total * shape.n]).unwrap();
    let mut y_shifted = ctx.stream().clone_htod(&vec![f16::NAN; total * shape.n + 1]).unwrap();
    let x_aligned = ctx.stream().clone_htod(&x[1..]).unwrap();
    ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
    assert_eq!(ctx.expert_linear(&x_aligned, &off, 9, &case.experts, &mut y_aligned).unwrap(), Kernel::DequantCublas);
    let mut y_view = y_shifted.slice_mut(1..);
    ctx.expert_linear(&dx.slice(1..), &off, 9, &case.experts, &mut y_view).unwrap();
    ctx.force_kernel(None).unwrap();
    // Unforced, the unaligned activations take the cuBLAS path too, also
    // at max_m = 1 (4 rows, one per expert), where aligned ones take the GEMV.
    assert_eq!(ctx.expert_linear(&dx.slice(1..), &off, 9, &case.experts, &mut y_view).unwrap(), Kernel::DequantCublas);
    let ones = ctx.stream().clone_htod(&[0u32, 1, 2, 3, 4]).unwrap();
    let mut y1 = ctx.stream().clone_htod(&vec![f16::NAN; 4 * shape.n]).unwrap();
    let unaligned = ctx.expert_linear(&dx.slice(1..1 + 4 * shape.k), &ones, 1, &case.experts, &mut y1).unwrap();
    assert_eq!(unaligned, Kernel::DequantCublas);
    let aligned = ctx.expert_linear(&x_aligned.slice(0..4 * shape.k), &ones, 1, &case.experts, &mut y1).unwrap();
    assert_eq!(aligned, Kernel::GroupedScalar);
    ctx.synchronize().unwrap();
    let (a, b) = (ctx.stream().clone_dtoh(&y_aligned).unwrap(), ctx.stream().clone_dtoh(&y_shifted).unwrap());
    assert!(b[0].is_nan(), "the element before the outputs was written");
    assert!(a.iter().all(|v| v.is_finite()), "an output row was not written");
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b[1..].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// One capture serves every routing: the expert offsets stay on the
/// device, so a graph captured once follows the offsets and activations
/// written before each replay, on each `expert_linear` path (the same total
/// rows, as in a decode step of fixed tokens × top-k).
#[test]
fn expert_linear_graph_replays_follow_the_routing() {
    let _serial = common::serial();
    const TEST: &str = "expert_linear_graph_replays_follow_the_routing";
    let Some(ctx) = common::gpu(TEST) else { return };
    let mut rng = common::rng(TEST);
    let case = make_experts(&ctx, &mut rng, 8, 2048, 512, 4);
    let shape = case.shape;
    let s = ctx.stream();
    let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
    let paths: [(usize, Kernel, [[usize; 8]; 2]); 3] = [
        (1, Kernel::GroupedScalar, [[1, 1, 0, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0, 1]]),
        (8, Kernel::GroupedMma, [[8, 0, 3, 0, 1, 0, 0, 4], [2; 8]]),
        (70, Kernel::DequantCublas, [[70, 0, 0, 0, 0, 0, 0, 2], [0, 0, 36, 0, 0, 36, 0, 0]]),
    ];
    for (max_m, kernel, routings) in paths {
        let total: usize = routings[0].iter().sum();
        assert_eq!(total, routings[1].iter().sum::<usize>());
        let offsets = routings.map(|r| offsets_of(&r));
        let xs: [Vec<f16>; 2] = std::array::from_fn(|_| common::uniform(&mut rng, total * shape.k));
        let mut doff = s.clone_htod(&offsets[0]).unwrap();
        let mut dx = s.clone_htod(&xs[0]).unwrap();
        let mut dy = s.clone_htod(&vec![f16::NAN; total * shape.n]).unwrap();
        ctx.force_kernel(Some(kernel)).unwrap();
        // One eager call sets up what the path needs (cuBLAS, scratch).
        ctx.expert_linear(&dx, &doff, max_m, &case.experts, &mut dy).unwrap();
        ctx.synchronize().unwrap();
        s.begin_capture(mode).unwrap();
        let r = ctx.expert_linear(&dx, &doff, max_m, &case.experts, &mut dy);
        let graph = s.end_capture(flags).unwrap_or_else(|e| panic!("{kernel}: capture: {e} (call: {r:?})"));
        assert_eq!(r.unwrap(), kernel);
        let graph = graph.expect("a captured graph");
        for round in 0..4 {
            let i = round % 2;
            s.memcpy_htod(&offsets[i], &mut doff).unwrap();
            s.memcpy_htod(&xs[i], &mut dx).unwrap();
            s.memcpy_htod(&vec![f16::NAN; total * shape.n], &mut dy).unwrap();
            graph.launch().unwrap();
            let y: Vec<f32> = s.clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
            ctx.synchronize().unwrap();
            check_rows(&case, &xs[i], &y, &routings[i], &offsets[i], max_m, kernel);
        }
    }
    ctx.force_kernel(None).unwrap();
}

/// Offsets that break their contract (decreasing, past the rows, not from
/// 0) give unspecified rows but no access outside `x`, `y` or the weights,
/// on every path: no driver error at the next synchronize, a guard past
/// `y`'s end keeps its poison, and a correct call on the same context
/// still matches the reference.
#[test]
fn expert_linear_bad_offsets_stay_inside_the_arrays() {
    const TEST: &str = "expert_linear_bad_offsets_stay_inside_the_arrays";
    let _serial = common::serial();
    let Some(ctx) = common::gpu(TEST) else { return };
    let mut rng = common::rng(TEST);
    let case = make_experts(&ctx, &mut rng, 8, 2048, 512, 4);
    let (shape, s, total, guard) = (case.shape, ctx.stream(), 6, 4096);
    let bad: [[u32; 9]; 3] =
        [[0, 4, 2, 6, 1, 6, 6, 3, 6], [0, 2, 4, 1000, 1000, 70000, 4, 6, 6], [3, 3, 5, 6, 6, 6, 6, 6, 6]];
    for (max_m, kernel) in [(4, Kernel::GroupedScalar), (8, Kernel::GroupedMma), (70, Kernel::DequantCublas)] {
        ctx.force_kernel(Some(kernel)).unwrap();
        for offsets in &bad {
            let x: Vec<f16> = common::uniform(&mut rng, total * shape.k);
            let (dx, doff) = (s.clone_htod(&x).unwrap(), s.clone_htod(offsets).unwrap());
            let mut dy = s.clone_htod(&vec![f16::NAN; total * shape.n + guard]).unwrap();
            let ran = ctx.expert_linear(&dx, &doff, max_m, &case.experts, &mut dy.slice_mut(0..total * shape.n));
            assert_eq!(ran.unwrap(), kernel, "{offsets:?}");
            match ctx.synchronize() {
                Ok(()) | Err(Error::ExpertRows { .. }) => {}
                Err(e) => panic!("{kernel} {offsets:?}: {e}"),
            }
            let tail = s.clone_dtoh(&dy.slice(total * shape.n..)).unwrap();
            assert!(tail.iter().all(|v| v.is_nan()), "{kernel} {offsets:?}: wrote past y");
        }
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &[1, 0, 2, 0, 0, 1, 2, 0], max_m), kernel);
    }
    ctx.force_kernel(None).unwrap();
}
