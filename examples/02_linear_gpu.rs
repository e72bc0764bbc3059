//! Quantize a random `W[N, K]` on the GPU and run `linear` for M rows,
//! printing the kernel the dispatch picked and the error against the CPU
//! reference. Handy as a profiler target too.
//!
//! `cargo run --release --example 02_linear_gpu -- [K N M bits [repeats]]`
//! (default 4096 14336 1 4 1)

use half::f16;
use kbit::{Codebook, Context, ScaleMode, Shape, reference};

fn main() -> kbit::Result<()> {
    let mut args = Vec::new();
    for a in std::env::args().skip(1) {
        match a.parse::<usize>() {
            Ok(v) if v > 0 => args.push(v),
            _ => {
                eprintln!("usage: 02_linear_gpu [K N M bits [repeats]] (positive integers), got {a:?}");
                std::process::exit(2);
            }
        }
    }
    let get = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (k, n, m, bits, repeats) = (get(0, 4096), get(1, 14336), get(2, 1), get(3, 4) as u32, get(4, 1));
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(kbit::Error::NoDevice(why)) => {
            eprintln!("02_linear_gpu: no CUDA GPU ({why})");
            std::process::exit(3);
        }
        Err(e) => return Err(e),
    };
    let shape = Shape::new(n, k)?;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
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
