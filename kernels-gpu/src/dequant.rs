//! Dequantize either layout to a dense `[N, K]` matrix of f16/bf16/f32.
//!
//! Thread mapping: each thread writes 8 consecutive outputs, a quarter of
//! one quant block, so a warp's 16- or 32-byte stores cover 512 or 1024
//! contiguous bytes. The four threads of a block read the same plane words
//! (one L1 line); byte `q` of each plane holds the index bits of elements
//! `8q .. 8q+7`.

use crate::elem::Elem;
use crate::ptx;
use crate::tile_io::{codebook_at, load_planes, stage_codebook};
use core::num::NonZeroU32;
use kbit_format::{e4m4, planes, quant, tile};

/// Where a quant block's planes and scale live.
pub trait Layout {
    /// Scale storage: f32 (flat) or an E4M4 byte (runtime).
    type Scale: Copy;
    /// Word offset of the block's plane 0 and its decoded scale.
    ///
    /// # Safety
    /// `(n, kb)` is inside the matrix the pointers describe.
    unsafe fn block(scales: *const Self::Scale, n_dim: u64, kblocks: u64, n: u64, kb: u64, bits: u64) -> (u64, f32);
}

/// The flat interchange layout: block `b` at words `b·k`, f32 absmax `b`.
pub struct Flat;
/// The runtime tiled layout (`kbit_format::tile`).
pub struct Tiled;

impl Layout for Flat {
    type Scale = f32;
    #[inline(always)]
    unsafe fn block(scales: *const f32, _n_dim: u64, kblocks: u64, n: u64, kb: u64, bits: u64) -> (u64, f32) {
        let b = n * kblocks + kb;
        (b * bits, unsafe { *scales.add(b as usize) })
    }
}

impl Layout for Tiled {
    type Scale = u8;
    #[inline(always)]
    unsafe fn block(scales: *const u8, n_dim: u64, _kblocks: u64, n: u64, kb: u64, bits: u64) -> (u64, f32) {
        let s = unsafe { ptx::ld_nc_u8(scales.add(tile::scale_index(n_dim, n, kb) as usize)) };
        (tile::word_index(n_dim, n, kb, bits), e4m4::decode(s))
    }
}

/// Body of the `kbit_dequant_{flat,tiled}_k{K}_{T}` kernels.
///
/// # Safety
/// `packed`/`scales` describe an `[n_dim, k_dim]` matrix in layout `L`,
/// `cb` holds `2^K` floats, `out` has room for `n_dim·k_dim` elements and is
/// 16-byte aligned; the launch has ≥ 128 bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run<const K: usize, L: Layout, T: Elem>(
    packed: *const u32,
    scales: *const L::Scale,
    cb: *const f32,
    out: *mut T::Raw,
    n_dim: u32,
    k_dim: u32,
) {
    let book = unsafe { stage_codebook::<K>(cb) };
    // Non-zero by construction (the host rejects K < 32), typed so that the
    // divisions below carry no division-by-zero panic path. Block indices
    // fit in u32 (the host allows fewer than 2^32 blocks), so the per-thread
    // row/column split is a 32-bit division, not a 64-bit software routine.
    let Some(kblocks) = NonZeroU32::new(k_dim / 32) else { return };
    let total = n_dim as u64 * kblocks.get() as u64 * 4;
    let mut t = ptx::global_tid();
    while t < total {
        let b = (t / 4) as u32;
        let q = (t % 4) as u32;
        let (n, kb) = ((b / kblocks) as u64, (b % kblocks) as u64);
        let (word, amax) = unsafe { L::block(scales, n_dim as u64, kblocks.get() as u64, n, kb, K as u64) };
        let w = unsafe { load_planes::<K>(packed.add(word as usize)) };
        let idx = planes::octet::<K>(&w, q);
        let v = idx.map(|i| quant::dequant(unsafe { codebook_at(book, i) }, amax));
        unsafe { T::store8(out.add((t * 8) as usize), v) };
        t += ptx::grid_threads();
    }
}

/// Body of the `kbit_grouped_dequant_k{K}_{T}` kernels: `blockIdx.y` is the
/// expert; an expert with no rows (from the device-side `offsets`) is
/// skipped, so only active experts cost bandwidth. Expert `e` reads its
/// runtime-layout weight at `e·words` / `e·scales` and writes `out[e, N, K]`.
///
/// # Safety
/// As [`run`] for each expert; `offsets` holds `gridDim.y + 1` values.
#[inline(always)]
pub unsafe fn run_grouped<const K: usize, T: Elem>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    out: *mut T::Raw,
    offsets: *const u32,
    n_dim: u32,
    k_dim: u32,
) {
    let e = ptx::bid_y() as usize;
    if unsafe { *offsets.add(e + 1) == *offsets.add(e) } {
        return;
    }
    let words = tile::words(n_dim as usize, k_dim as usize, K);
    let sc = tile::scales(n_dim as usize, k_dim as usize);
    let numel = n_dim as usize * k_dim as usize;
    unsafe { run::<K, Tiled, T>(packed.add(e * words), scales.add(e * sc), cb, out.add(e * numel), n_dim, k_dim) }
}
