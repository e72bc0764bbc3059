//! The per-block quantization rule (FORMAT.md "Choosing indices").

/// Lower bound on the divisor, so an all-zero block divides by 1e-8, not 0.
pub const AMAX_FLOOR: f32 = 1e-8;

/// `max |x_i|`, ignoring NaN unless every value is NaN (then NaN).
///
/// `f32::max` returns the non-NaN operand, which is exactly that rule;
/// on the GPU it lowers to `max.f32`, which has the same semantics.
#[inline(always)]
pub fn absmax_step(acc: f32, x: f32) -> f32 {
    acc.max(x.abs())
}

/// Index of the codebook entry nearest `r`, scanning in increasing index
/// order with strict `<` (ties go to the lowest index). A NaN `r` gives 0.
///
/// `cb(i)` returns entry `i`; `n` is the codebook length. Distances are
/// `|r − cb_i|` in f32, the same IEEE operations on every target.
#[inline(always)]
pub fn nearest(r: f32, n: usize, cb: impl Fn(usize) -> f32) -> u32 {
    let mut best = 0u32;
    let mut best_d = f32::INFINITY;
    for i in 0..n {
        let d = (r - cb(i)).abs();
        if d < best_d {
            best_d = d;
            best = i as u32;
        }
    }
    best
}

/// The value an element of a block is scaled by before the codebook search:
/// `x / max(amax, 1e-8)` (IEEE division).
#[inline(always)]
pub fn normalize(x: f32, amax: f32) -> f32 {
    x / amax.max(AMAX_FLOOR)
}

/// The dequantized value `f32(cb · amax)` used by every path that works in f32.
#[inline(always)]
pub fn dequant(cb: f32, amax: f32) -> f32 {
    cb * amax
}
