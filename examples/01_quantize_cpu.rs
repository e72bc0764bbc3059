//! Quantize a random matrix on the CPU at k = 2..5, repack it to the runtime
//! layout, dequantize it and print the error per bit width.
//!
//! `cargo run --release --example 01_quantize_cpu`

mod common;

use kbit::{Codebook, ScaleMode, Shape, reference};

fn main() -> kbit::Result<()> {
    let shape = Shape::new(1024, 2048)?;
    // A deterministic, roughly Gaussian matrix (sum of uniforms).
    let mut rng = common::XorShift(0x2545_f491_4f6c_dd1d);
    let w: Vec<f32> = (0..shape.numel()).map(|_| (0..4).map(|_| rng.uniform()).sum::<f32>() * 0.05).collect();
    let power: f64 = w.iter().map(|&v| (v as f64).powi(2)).sum();
    println!("W[{}, {}], {} quant blocks", shape.n, shape.k, shape.num_blocks());
    println!("{:>3} {:>12} {:>12} {:>10}", "k", "bytes", "vs fp16", "NMSE");
    for bits in 2..=5 {
        let flat = reference::quantize(&w, shape, &Codebook::nf(bits)?)?;
        let tiled = reference::repack(&flat, ScaleMode::Strict)?;
        let back: Vec<f32> = reference::dequantize_tiled(&tiled);
        let err: f64 = w.iter().zip(&back).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let bytes = shape.tiled_bytes(bits);
        println!("{bits:>3} {bytes:>12} {:>11.2}x {:>10.5}", (shape.numel() * 2) as f64 / bytes as f64, err / power);
    }
    Ok(())
}
