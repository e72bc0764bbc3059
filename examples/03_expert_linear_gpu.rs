//! One MoE decode step: route T tokens to their top-R of E experts, group
//! the activations by expert, run `expert_linear` and compare every
//! token's output against the CPU reference of its expert.
//!
//! `cargo run --release --example 03_expert_linear_gpu -- [K N E T R bits]`
//! (default 2048 512 64 4 8 4: 4 tokens, top-8 of 64 experts of
//! `W[512, 2048]`, 4 bits).
//!
//! The routing is known on the host here; an engine that routes on the GPU
//! computes the same offsets there. Either way `max_m`, which sizes the
//! launch, is a bound that needs no look at the routing: T, the most rows
//! any expert can get.

mod common;

use half::f16;
use kbit::{Codebook, ScaleMode, Shape, reference};

fn main() -> kbit::Result<()> {
    let args = common::positive_args("03_expert_linear_gpu [K N E T R bits]");
    let get = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (k, n, num_experts, tokens, top, bits) =
        (get(0, 2048), get(1, 512), get(2, 64), get(3, 4), get(4, 8), get(5, 4));
    if top > num_experts {
        eprintln!("03_expert_linear_gpu: top-{top} routing needs at least {top} experts, got {num_experts}");
        std::process::exit(2);
    }
    let ctx = common::context_or_exit("03_expert_linear_gpu")?;
    let shape = Shape::new(n, k)?;
    let mut rng = common::XorShift(0x2545_f491_4f6c_dd1d);

    // Experts quantized on the CPU (the reference quantizer) and uploaded
    // as one concatenated weight.
    let cb = Codebook::nf(bits as u32)?;
    let tiled = (0..num_experts)
        .map(|_| {
            let w: Vec<f32> = (0..shape.numel()).map(|_| rng.uniform() * 0.1).collect();
            reference::repack(&reference::quantize(&w, shape, &cb)?, ScaleMode::Strict)
        })
        .collect::<kbit::Result<Vec<_>>>()?;
    let experts = ctx.upload_experts(&tiled)?;

    // Top-R routing: each token picks R distinct experts.
    let x_tokens: Vec<Vec<f16>> = (0..tokens).map(|_| (0..k).map(|_| f16::from_f32(rng.uniform())).collect()).collect();
    let mut picks = vec![Vec::new(); num_experts];
    for t in 0..tokens {
        let mut chosen = Vec::with_capacity(top);
        while chosen.len() < top {
            let e = (rng.next_u64() % num_experts as u64) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
                picks[e].push(t);
            }
        }
    }
    // Rows grouped by expert: expert e owns rows offsets[e]..offsets[e + 1].
    let mut offsets = vec![0u32];
    let mut x = Vec::with_capacity(tokens * top * k);
    for p in &picks {
        for &t in p {
            x.extend_from_slice(&x_tokens[t]);
        }
        offsets.push(offsets[offsets.len() - 1] + p.len() as u32);
    }
    let rows = tokens * top;
    let max_m = tokens;

    let stream = ctx.stream();
    let dx = stream.clone_htod(&x)?;
    let doff = stream.clone_htod(&offsets)?;
    let mut dy = stream.alloc_zeros::<f16>(rows * n)?;
    let kernel = ctx.expert_linear(&dx, &doff, max_m, &experts, &mut dy)?;
    let y = stream.clone_dtoh(&dy)?;
    ctx.synchronize()?;

    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (e, p) in picks.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        let (a, b) = (offsets[e] as usize, offsets[e + 1] as usize);
        let dense: Vec<f32> = reference::dequantize_tiled(&tiled[e]);
        let want = reference::matmul_f64(&x[a * k..b * k], b - a, &dense, shape)?;
        for (g, r) in y[a * n..b * n].iter().zip(&want) {
            num += (g.to_f64() - r).powi(2);
            den += r * r;
        }
    }
    let active = picks.iter().filter(|p| !p.is_empty()).count();
    println!(
        "{tokens} tokens, top-{top} of {num_experts} experts W[{n}, {k}] (k = {bits}), {active} experts with rows, \
         max_m = {max_m} on {}: kernel {kernel}, relative error {:.2e}",
        ctx.info().name,
        (num / den).sqrt()
    );
    Ok(())
}
