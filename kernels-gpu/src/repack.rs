//! Repack the flat layout into the runtime (tiled) layout with E4M4 scales.

use crate::ptx;
use crate::tile_io::load_planes;
use core::num::NonZeroU64;
use kbit_format::{e4m4, tile};

/// Body of the `kbit_repack_k{K}` kernels: one thread per quant block.
///
/// Reads block `b = n·(K/32) + kb` of the flat layout (K words, f32 absmax),
/// writes its planes to `tile::word_index` and its E4M4 scale to
/// `tile::scale_index`. An absmax that E4M4 cannot hold (> 31 without
/// `saturate`, negative, NaN) records the block in `status`. The zero half
/// tiles of `K % 64 == 32` come from the zero-filled output allocation.
///
/// # Safety
/// Buffers sized for an `[n_dim, k_dim]` matrix in both layouts; `status` valid.
#[inline(always)]
pub unsafe fn run<const K: usize>(
    flat: *const u32,
    flat_absmax: *const f32,
    tiled: *mut u32,
    scales: *mut u8,
    status: *mut u32,
    n_dim: u32,
    k_dim: u32,
    saturate: u32,
) {
    // Non-zero by construction (the host rejects K < 32), typed so that the
    // divisions below carry no division-by-zero panic path.
    let Some(kblocks) = NonZeroU64::new((k_dim / 32) as u64) else { return };
    let total = n_dim as u64 * kblocks.get();
    let mut b = ptx::global_tid();
    while b < total {
        let n = b / kblocks;
        let kb = b % kblocks;
        let planes = unsafe { load_planes::<K>(flat.add((b * K as u64) as usize)) };
        let amax = unsafe { *flat_absmax.add(b as usize) };
        let code = match e4m4::encode(amax, saturate != 0) {
            Ok(c) => c,
            Err(_) => {
                unsafe { ptx::red_min_u32(status, b as u32) };
                0
            }
        };
        let w = tile::word_index(n_dim as u64, n, kb, K as u64);
        for (j, &pj) in planes.iter().enumerate() {
            unsafe { *tiled.add(w as usize + j) = pj };
        }
        unsafe { *scales.add(tile::scale_index(n_dim as u64, n, kb) as usize) = code };
        b += ptx::grid_threads();
    }
}
