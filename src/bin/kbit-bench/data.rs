//! Benchmark data: weights quantized on the GPU, and enough distinct
//! copies of each weight that every call reads it from DRAM (cold L2).

use crate::cli::BenchShape;
use cudarc::driver::{CudaSlice, CudaStream};
use kbit::{Codebook, Context, Element, KbitWeight, ScaleMode, Shape};
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
}
