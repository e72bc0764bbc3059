//! Benchmark data: random weights and activations, quantized on the GPU,
//! and enough distinct copies of each weight that every call reads it from
//! DRAM (cold L2).

use crate::cli::BenchShape;
use cudarc::driver::{CudaSlice, CudaStream};
use kbit::{Codebook, Context, Element, KbitWeight, ScaleMode, Shape};
use rayon::prelude::*;
use std::sync::Arc;

/// Most copies of one weight (tiny custom shapes would otherwise need
/// thousands; past this the L2 is not fully cold for them).
pub const MAX_COPIES: usize = 2048;

/// Distinct weight copies to rotate over so that the bytes read between two
/// uses of one copy exceed 2× L2: `2·L2 / bytes + 2`, or 1 when one call
/// alone reads more than 2× L2.
pub fn copies_for(bytes_per_call: usize, l2_bytes: usize) -> usize {
    let bytes = bytes_per_call.max(1);
    if bytes > 2 * l2_bytes { 1 } else { (2 * l2_bytes / bytes + 2).min(MAX_COPIES) }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` pseudo-random values with mean 0 and standard deviation `sigma`
/// (sum of four uniforms, bounded by ±3.46σ), in parallel, reproducible
/// from `seed`.
pub fn random<T: Element>(len: usize, seed: u64, sigma: f32) -> Vec<T> {
    let mut out = vec![T::from_f32_rne(0.0); len];
    // The sum of four U(0, 1) has variance 4/12: scale by sqrt(3) for unit variance.
    let scale = sigma * 3f32.sqrt() / 65_536.0;
    out.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        let mut state = splitmix(seed ^ (c as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        for v in chunk {
            state = splitmix(state);
            let u = (state & 0xFFFF) + ((state >> 16) & 0xFFFF) + ((state >> 32) & 0xFFFF) + (state >> 48);
            // u: sum of four 16-bit uniforms, mean 4 · 65535/2.
            *v = T::from_f32_rne((u as f32 - 131_070.0) * scale);
        }
    });
    out
}

/// Copies of one (possibly multi-expert) quantized weight: `copies[c][e]`.
pub struct KbitCopies {
    pub copies: Vec<Vec<KbitWeight>>,
    /// The experts of each copy concatenated (for the grouped kernels);
    /// empty for a single-matrix shape.
    pub experts: Vec<kbit::KbitExperts>,
    /// Compressed bytes one call reads (all experts).
    pub bytes_per_call: usize,
}

/// Quantizes `src` (`experts` matrices `[N, K]` back to back, on the
/// device) to k bits on the GPU, then repacks it into as many copies as
/// cold L2 needs (`extra_bytes_per_call` counts other per-copy traffic,
/// such as a dequantize output).
pub fn kbit_copies<T: Element>(
    ctx: &Context,
    src: &CudaSlice<T>,
    shape: &BenchShape,
    bits: u32,
    extra_bytes_per_call: usize,
) -> kbit::Result<KbitCopies> {
    let s = Shape::new(shape.n, shape.k)?;
    let cb = Codebook::nf(bits)?;
    let numel = s.numel();
    let flats = (0..shape.experts)
        .map(|e| ctx.quantize(&src.slice(e * numel..(e + 1) * numel), s, &cb))
        .collect::<kbit::Result<Vec<_>>>()?;
    let bytes_per_call = shape.experts * s.tiled_bytes(bits);
    let n = copies_for(bytes_per_call + extra_bytes_per_call, ctx.info().l2_bytes);
    let copies = (0..n)
        .map(|_| flats.iter().map(|f| ctx.repack(f, ScaleMode::Strict)).collect::<kbit::Result<Vec<_>>>())
        .collect::<kbit::Result<Vec<_>>>()?;
    let experts = if shape.experts > 1 {
        copies.iter().map(|c| ctx.concat_experts(&c.iter().collect::<Vec<_>>())).collect::<kbit::Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    ctx.synchronize()?;
    Ok(KbitCopies { copies, experts, bytes_per_call })
}

/// `src` and `copies − 1` device copies of it (for the dense baseline).
pub fn dense_copies<T: Element>(
    stream: &Arc<CudaStream>,
    src: &CudaSlice<T>,
    copies: usize,
) -> kbit::Result<Vec<CudaSlice<T>>> {
    (1..copies).map(|_| Ok(stream.clone_dtod(src)?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_cover_twice_the_l2() {
        let l2 = 50 << 20;
        for bytes in [300_000, 5 << 20, 21 << 20, 60 << 20, 99 << 20] {
            let c = copies_for(bytes, l2);
            // Between two uses of one copy, the other copies alone stream > 2× L2.
            assert!((c - 1) * bytes > 2 * l2, "{bytes}: {c}");
        }
        assert_eq!(copies_for(470 << 20, l2), 1);
        assert_eq!(copies_for(1, l2), MAX_COPIES);
    }

    #[test]
    fn random_values_have_the_asked_spread() {
        let v: Vec<f32> = random(1 << 20, 7, 0.5);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{}", var.sqrt());
        assert!(v.iter().all(|x| x.abs() <= 0.5 * 3.47));
        assert_eq!(random::<f32>(1000, 7, 0.5), random::<f32>(1000, 7, 0.5));
        assert_ne!(random::<f32>(1000, 7, 0.5), random::<f32>(1000, 8, 0.5));
    }
}
