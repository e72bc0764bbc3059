//! Quantize `W[N, K]` (f16/bf16/f32) to the flat layout, bit-identical to the
//! CPU reference: one warp per 32-value block, lane i holds element i.

use crate::elem::Elem;
use crate::ptx;
use crate::tile_io::{codebook_at, stage_codebook};
use kbit_format::{BLOCK, quant};

/// Body of the `kbit_quantize_k{K}_{T}` kernels.
///
/// Per block: the warp reduces `amax` with butterfly shuffles (`f32::max`
/// ignores NaN like the reference), every lane picks its nearest codebook
/// entry, and `K` ballots build the bit planes; lane `j < K` stores plane `j`
/// and lane 0 the f32 absmax. A non-finite value records the block in
/// `status` (smallest block wins) for the host to report.
///
/// # Safety
/// `w` holds `num_blocks·32` values, `packed` `num_blocks·K` words, `absmax`
/// `num_blocks` floats, `cb` `2^K` floats; `status` is one valid word; the
/// launch has ≥ 128 bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run<const K: usize, T: Elem>(
    w: *const T::Raw,
    cb: *const f32,
    packed: *mut u32,
    absmax: *mut f32,
    status: *mut u32,
    num_blocks: u64,
) {
    // Shared memory, not a register array: the search loop over 2^K entries
    // is not fully unrolled for k = 5, and a register array indexed in a loop
    // would live on the stack.
    let book = unsafe { stage_codebook::<K>(cb) };
    let lane = ptx::lane();
    let warps = ptx::grid_threads() / 32;
    let mut blk = ptx::global_tid() / 32;
    while blk < num_blocks {
        let x = T::to_f32(unsafe { *w.add((blk * BLOCK as u64 + lane as u64) as usize) });
        if ptx::ballot(!x.is_finite()) != 0 {
            if lane == 0 {
                unsafe { ptx::red_min_u32(status, blk as u32) };
            }
        } else {
            let mut amax = quant::absmax_step(0.0, x);
            for m in [16, 8, 4, 2, 1] {
                amax = amax.max(f32::from_bits(ptx::shfl_bfly(amax.to_bits(), m)));
            }
            let r = quant::normalize(x, amax);
            let idx = quant::nearest(r, 1 << K, |i| unsafe { codebook_at(book, i as u32) });
            let mut mine = 0u32;
            for j in 0..K {
                let plane = ptx::ballot((idx >> j) & 1 != 0);
                if lane == j as u32 {
                    mine = plane;
                }
            }
            if (lane as usize) < K {
                unsafe { *packed.add((blk * K as u64 + lane as u64) as usize) = mine };
            }
            if lane == 0 {
                unsafe { *absmax.add(blk as usize) = amax };
            }
        }
        blk += warps;
    }
}
