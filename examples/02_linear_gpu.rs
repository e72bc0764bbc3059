//! Quantize a random `W[N, K]` on the GPU and run `linear` for M rows,
//! printing the kernel the dispatch picked and the error against the CPU
//! reference. Handy as a profiler target too.
//!
//! `cargo run --release --example 02_linear_gpu -- [K N M bits [repeats]]`
//! (default 4096 14336 1 4 1)

mod common;

use half::f16;
use kbit::{Codebook, ScaleMode, Shape, reference};

fn main() -> kbit::Result<()> {
    let args = common::positive_args("02_linear_gpu [K N M bits [repeats]]");
    let get = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (k, n, m, bits, repeats) = (get(0, 4096), get(1, 14336), get(2, 1), get(3, 4) as u32, get(4, 1));
    let ctx = common::context_or_exit("02_linear_gpu")?;
    let shape = Shape::new(n, k)?;
    let mut rng = common::XorShift(0x9e37_79b9_7f4a_7c15);
    let mut rnd = move || rng.uniform();
    let w: Vec<f16> = (0..shape.numel()).map(|_| f16::from_f32(rnd() * 0.1)).collect();
    let x: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rnd())).collect();
    let stream = ctx.stream();
    let flat = ctx.quantize(&stream.clone_htod(&w)?, shape, &Codebook::nf(bits)?)?;
    let weight = ctx.repack(&flat, ScaleMode::Strict)?;
    ctx.synchronize()?;
    let dx = stream.clone_htod(&x)?;
    let mut dy = stream.alloc_zeros::<f16>(m * n)?;
    let mut kernel = None;
    for _ in 0..repeats {
        kernel = Some(ctx.linear(&dx, m, &weight, &mut dy)?);
    }
    let y = stream.clone_dtoh(&dy)?;
    ctx.synchronize()?;
    let dense: Vec<f32> = reference::dequantize_tiled(&ctx.download(&weight)?);
    let want = reference::matmul_f64(&x, m, &dense, shape)?;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, r) in y.iter().zip(&want) {
        num += (g.to_f64() - r).powi(2);
        den += r * r;
    }
    println!(
        "{} · W[{n}, {k}] (k = {bits}) on {}: kernel {}, relative error {:.2e}",
        format_args!("x[{m}, {k}]"),
        ctx.info().name,
        kernel.expect("at least one call"),
        (num / den).sqrt()
    );
    Ok(())
}
