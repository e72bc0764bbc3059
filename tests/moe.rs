//! `expert_linear`: dispatch by max_m, and the batched dequant + cuBLAS path
//! against the CPU reference, per expert, with poisoned outputs.

mod common;

use half::{bf16, f16};
use kbit::{Codebook, Context, Element, Error, Kernel, ScaleMode, Shape, reference};

struct Case {
    experts: kbit::KbitExperts,
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
    Case { experts: ctx.upload_experts(&tiled).unwrap(), dense, shape }
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
    let mut offsets = vec![0u32];
    for r in rows {
        offsets.push(offsets.last().unwrap() + *r as u32);
    }
    let x: Vec<T> = common::uniform(rng, total * shape.k);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let doff = ctx.stream().clone_htod(&offsets).unwrap();
    let mut dy = ctx.stream().clone_htod(&vec![T::nan(); total * shape.n]).unwrap();
    let kernel = ctx.expert_linear(&dx, &doff, max_m, &case.experts, &mut dy).unwrap();
    ctx.synchronize().unwrap();
    let y: Vec<f32> = ctx.stream().clone_dtoh(&dy).unwrap().iter().map(|v| v.to_f32()).collect();
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
    kernel
}

#[test]
fn expert_linear_dispatches_by_max_m_and_matches_reference() {
    let Some(ctx) = common::gpu("expert_linear_dispatches_by_max_m_and_matches_reference") else { return };
    let mut rng = common::rng("expert_linear_dispatches_by_max_m_and_matches_reference");
    for (bits, k, n) in [(4, 2048, 512), (2, 512, 2048), (3, 96, 72), (3, 96, 36), (5, 2048, 512)] {
        let case = make_experts(&ctx, &mut rng, 8, k, n, bits);
        let small = [1, 3, 0, 2, 4, 1, 0, 4];
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &small, 4), Kernel::GroupedScalar);
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &small, 4), Kernel::GroupedScalar);
        let large = [5, 9, 0, 2, 16, 1, 0, 7];
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &large, 16), Kernel::DequantCublas);
        assert_eq!(check::<bf16>(&ctx, &mut rng, &case, &large, 24), Kernel::DequantCublas);
        // The cuBLAS path forced at small max_m, and one expert only.
        ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &small, 4), Kernel::DequantCublas);
        ctx.force_kernel(None).unwrap();
        assert_eq!(check::<f16>(&ctx, &mut rng, &case, &[0, 0, 0, 0, 0, 33, 0, 0], 33), Kernel::DequantCublas);
    }
}

#[test]
fn expert_linear_edge_cases() {
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
    // Argument errors.
    let bad_off = ctx.stream().clone_htod(&[0u32, 12]).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &bad_off, 5, &case.experts, &mut y), Err(Error::Length { .. })));
    assert!(ctx.expert_linear(&x, &off, 2, &case.experts, &mut y).is_err(), "12 rows > 2 × 4 experts");
    ctx.force_kernel(Some(Kernel::GroupedScalar)).unwrap();
    assert!(matches!(ctx.expert_linear(&x, &off, 5, &case.experts, &mut y), Err(Error::NotApplicable { .. })));
    ctx.force_kernel(None).unwrap();
}

/// The cuBLAS path's row gather/scatter moves 16-byte chunks where the row
/// length and the arrays allow, single elements otherwise: activations and
/// outputs one element past an aligned start must give the same bits.
#[test]
fn expert_linear_unaligned_rows_match_aligned() {
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
    assert_eq!(ctx.expert_linear(&x_aligned, &off, 9, &case.experts, &mut y_aligned).unwrap(), Kernel::DequantCublas);
    let mut y_view = y_shifted.slice_mut(1..);
    ctx.expert_linear(&dx.slice(1..), &off, 9, &case.experts, &mut y_view).unwrap();
    ctx.synchronize().unwrap();
    let (a, b) = (ctx.stream().clone_dtoh(&y_aligned).unwrap(), ctx.stream().clone_dtoh(&y_shifted).unwrap());
    assert!(b[0].is_nan(), "the element before the outputs was written");
    assert!(a.iter().all(|v| v.is_finite()), "an output row was not written");
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b[1..].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
