//! Row gather/scatter between the concatenated MoE activations
//! (`[total_rows, C]`, expert `e` owning rows `off[e] .. off[e+1]`) and a
//! padded per-expert batch (`[E, max_m, C]`, rows past an expert's count
//! zero). They let the dequantize + cuBLAS path run one strided-batched GEMM
//! over all experts while the row counts stay on the device (no host sync).
//!
//! Elements are moved as raw 16-bit values (f16 or bf16 alike).
//!
//! # Mapping
//!
//! Padded row `p = e·max_m + r` (expert `e`, its row `r`) is one block's
//! job; blocks take rows `bid, bid + grid, …`, so the only divisions are
//! one per row. The block's threads stride over the row: by 16-byte chunks
//! (8 elements) when `C` is a multiple of 8 and both arrays are 16-byte
//! aligned, else by elements. A thread loads up to [`BATCH`] of its pieces
//! before it stores any, so that many loads are in flight per thread.

use crate::ptx;
use core::num::NonZeroU32;

/// Loads a thread issues before its stores.
const BATCH: u32 = 4;

/// Copies one row of `cols` elements from `src` (zeros where `src` is
/// `None`) to `dst` with the threads of the block; `vec`: 16-byte chunks.
///
/// # Safety
/// `src` (if any) and `dst` hold `cols` elements; with `vec`, both are
/// 16-byte aligned and `cols` is a multiple of 8.
#[inline(always)]
unsafe fn copy_row(src: Option<*const u16>, dst: *mut u16, cols: u32, vec: bool) {
    let (t, nt) = (ptx::tid(), ptx::block_dim());
    let (pieces, width) = if vec { (cols / 8, 8) } else { (cols, 1) };
    let mut c = t;
    while c < pieces {
        // Pieces c, c + nt, …, c + (BATCH − 1)·nt: loads, then stores.
        let mut v = [[0u32; 4]; BATCH as usize];
        for (j, vj) in v.iter_mut().enumerate() {
            let cj = c + j as u32 * nt;
            if let Some(s) = src
                && cj < pieces
            {
                let at = unsafe { s.add((cj * width) as usize) };
                *vj = if vec { unsafe { ptx::ld_nc_v4(at as *const u32) } } else { [unsafe { *at } as u32, 0, 0, 0] };
            }
        }
        for (j, vj) in v.iter().enumerate() {
            let cj = c + j as u32 * nt;
            if cj < pieces {
                let at = unsafe { dst.add((cj * width) as usize) };
                if vec { unsafe { ptx::st_v4(at as *mut u32, *vj) } } else { unsafe { *at = vj[0] as u16 } }
            }
        }
        c += BATCH * nt;
    }
}

/// Whether rows of `cols` elements at `a` and `b` can move in 16-byte chunks.
#[inline(always)]
fn vectorizable(a: *const u16, b: *const u16, cols: u32) -> bool {
    cols % 8 == 0 && (a as usize | b as usize) % 16 == 0
}

/// One padded row: `p = e·max_m + r`, and expert `e`'s first row in the
/// concatenated array and its row count.
#[derive(Clone, Copy)]
struct PaddedRow {
    p: u32,
    e: u32,
    r: u32,
    start: u32,
    rows: u32,
}

/// Runs `f` on this block's padded rows `bid, bid + grid, … < E·max_m`.
/// An expert's rows are `offsets[e] .. offsets[e + 1]` cut to
/// `0 .. total_rows` (empty where they decrease), so offsets that break
/// their contract change which rows move but never reach past the
/// concatenated arrays, as in the grouped kernels (`gemv::grouped_unit`).
///
/// # Safety
/// `offsets` holds `E + 1` values and `E·max_m` fits in u32.
#[inline(always)]
unsafe fn each_row(offsets: *const u32, experts: u32, max_m: u32, total_rows: u32, mut f: impl FnMut(PaddedRow)) {
    let Some(max_m_nz) = NonZeroU32::new(max_m) else { return };
    let mut p = ptx::bid();
    while p < experts * max_m {
        let (e, r) = (p / max_m_nz, p % max_m_nz);
        let end = unsafe { *offsets.add(e as usize + 1) }.min(total_rows);
        let start = unsafe { *offsets.add(e as usize) }.min(end);
        let rows = end - start;
        f(PaddedRow { p, e, r, start, rows });
        p += ptx::grid_dim();
    }
}

/// Gathers `x[total_rows, cols]` into `xp[E, max_m, cols]`, zero-filling the
/// rows an expert does not have. An expert with more than `max_m` rows
/// records itself in `status` (its extra rows are not computed).
///
/// # Safety
/// `offsets` holds `E + 1` values (rows outside `0 .. total_rows` are never
/// read: [`each_row`]); `x` holds `total_rows·cols` elements, `xp`
/// `E·max_m·cols`, and `E·max_m` fits in u32.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gather(
    x: *const u16,
    offsets: *const u32,
    xp: *mut u16,
    status: *mut u32,
    experts: u32,
    max_m: u32,
    cols: u32,
    total_rows: u32,
) {
    let vec = vectorizable(x, xp, cols);
    unsafe {
        each_row(offsets, experts, max_m, total_rows, |row| {
            let src = (row.r < row.rows).then(|| x.add((row.start + row.r) as usize * cols as usize));
            copy_row(src, xp.add(row.p as usize * cols as usize), cols, vec);
            if row.r == 0 && row.rows > max_m && ptx::tid() == 0 {
                ptx::red_min_u32(status, row.e);
            }
        })
    }
}

/// Scatters `yp[E, max_m, cols]` back to `y[total_rows, cols]`, rows an
/// expert owns only.
///
/// # Safety
/// As [`gather`], with `yp` and `y` in the roles of `xp` and `x` (rows
/// outside `0 .. total_rows` are never written).
#[inline(always)]
pub unsafe fn scatter(
    yp: *const u16,
    offsets: *const u32,
    y: *mut u16,
    experts: u32,
    max_m: u32,
    cols: u32,
    total_rows: u32,
) {
    let vec = vectorizable(yp, y, cols);
    unsafe {
        each_row(offsets, experts, max_m, total_rows, |row| {
            if row.r < row.rows {
                let dst = y.add((row.start + row.r) as usize * cols as usize);
                copy_row(Some(yp.add(row.p as usize * cols as usize)), dst, cols, vec);
            }
        })
    }
}
