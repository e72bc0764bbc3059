//! Row gather/scatter between the concatenated MoE activations
//! (`[total_rows, C]`, expert `e` owning rows `off[e] .. off[e+1]`) and a
//! padded per-expert batch (`[E, max_m, C]`, rows past an expert's count
//! zero). They let the dequantize + cuBLAS path run one strided-batched GEMM
//! over all experts while the row counts stay on the device (no host sync).
//!
//! Elements are moved as raw 16-bit values (f16 or bf16 alike).

use crate::ptx;
use core::num::NonZeroU64;

/// Gathers `x[total_rows, cols]` into `xp[E, max_m, cols]`, zero-filling the
/// rows an expert does not have. An expert with more than `max_m` rows
/// records itself in `status` (its extra rows are not computed).
///
/// # Safety
/// `offsets` holds `E + 1` non-decreasing values ≤ rows of `x`; `xp` holds
/// `E·max_m·cols` elements.
#[inline(always)]
pub unsafe fn gather(
    x: *const u16,
    offsets: *const u32,
    xp: *mut u16,
    status: *mut u32,
    experts: u32,
    max_m: u32,
    cols: u32,
) {
    let (Some(cols_nz), Some(max_m_nz)) = (NonZeroU64::new(cols as u64), NonZeroU64::new(max_m as u64)) else {
        return;
    };
    let total = experts as u64 * max_m as u64 * cols as u64;
    let mut i = ptx::global_tid();
    while i < total {
        let c = i % cols_nz;
        let row = i / cols_nz; // e·max_m + r
        let e = row / max_m_nz;
        let r = row % max_m_nz;
        let start = unsafe { *offsets.add(e as usize) } as u64;
        let rows = unsafe { *offsets.add(e as usize + 1) } as u64 - start;
        let v = if r < rows { unsafe { *x.add(((start + r) * cols as u64 + c) as usize) } } else { 0 };
        unsafe { *xp.add(i as usize) = v };
        if r == 0 && c == 0 && rows > max_m as u64 {
            unsafe { ptx::red_min_u32(status, e as u32) };
        }
        i += ptx::grid_threads();
    }
}

/// Scatters `yp[E, max_m, cols]` back to `y[total_rows, cols]`, rows an
/// expert owns only.
///
/// # Safety
/// As [`gather`], with `yp` and `y` in the roles of `xp` and `x`.
#[inline(always)]
pub unsafe fn scatter(yp: *const u16, offsets: *const u32, y: *mut u16, experts: u32, max_m: u32, cols: u32) {
    let (Some(cols_nz), Some(max_m_nz)) = (NonZeroU64::new(cols as u64), NonZeroU64::new(max_m as u64)) else {
        return;
    };
    let total = experts as u64 * max_m as u64 * cols as u64;
    let mut i = ptx::global_tid();
    while i < total {
        let c = i % cols_nz;
        let row = i / cols_nz;
        let e = row / max_m_nz;
        let r = row % max_m_nz;
        let start = unsafe { *offsets.add(e as usize) } as u64;
        let rows = unsafe { *offsets.add(e as usize + 1) } as u64 - start;
        if r < rows {
            unsafe { *y.add(((start + r) * cols as u64 + c) as usize) = *yp.add(i as usize) };
        }
        i += ptx::grid_threads();
    }
}
