//! Dequantize either layout to a dense `[N, K]` matrix of f16/bf16/f32.
//!
//! Thread mapping: each thread writes 8 consecutive outputs, a quarter of
//! one quant block, so a warp's 16- or 32-byte stores cover 512 or 1024
//! contiguous bytes. The four threads of a block read the same plane words
//! (one L1 line); byte `q` of each plane holds the index bits of elements
//! `8q .. 8q+7`. The host launches one round of resident blocks (more, in
//! waves, only where a thread would otherwise loop more than 16 times);
//! each thread loops over octets a grid apart and keeps the next octet's
//! loads in flight while it decodes and writes the current one, and its
//! first loads are issued before the codebook is staged, so the two first
//! latencies overlap.

use crate::elem::Elem;
use crate::ptx;
use crate::tile_io::{PlaneWords, codebook_at, stage_codebook};
use core::num::NonZeroU32;
use kbit_format::{e4m4, planes, quant, tile};

/// Where a quant block's planes and scale live.
pub trait Layout {
    /// Scale storage: f32 (flat) or an E4M4 byte (runtime).
    type Scale: Copy;
    /// A scale for the loads past the end (never decoded into an output).
    const ZERO: Self::Scale;
    /// Word offset of the block's plane 0, and its scale as stored.
    ///
    /// # Safety
    /// `(n, kb)` is inside the matrix the pointers describe.
    unsafe fn block(
        scales: *const Self::Scale,
        n_dim: u64,
        kblocks: u64,
        n: u64,
        kb: u64,
        bits: u64,
    ) -> (u64, Self::Scale);
    /// The scale's value.
    fn decode(s: Self::Scale) -> f32;
}

/// The flat interchange layout: block `b` at words `b·k`, f32 absmax `b`.
pub struct Flat;
/// The runtime tiled layout (`kbit_format::tile`).
pub struct Tiled;

impl Layout for Flat {
    type Scale = f32;
    const ZERO: f32 = 0.0;
    #[inline(always)]
    unsafe fn block(scales: *const f32, _n_dim: u64, kblocks: u64, n: u64, kb: u64, bits: u64) -> (u64, f32) {
        let b = n * kblocks + kb;
        (b * bits, unsafe { *scales.add(b as usize) })
    }
    #[inline(always)]
    fn decode(s: f32) -> f32 {
        s
    }
}

impl Layout for Tiled {
    type Scale = u8;
    const ZERO: u8 = 0;
    #[inline(always)]
    unsafe fn block(scales: *const u8, n_dim: u64, _kblocks: u64, n: u64, kb: u64, bits: u64) -> (u64, u8) {
        let s = unsafe { ptx::ld_nc_u8(scales.add(tile::scale_index(n_dim, n, kb) as usize)) };
        (tile::word_index(n_dim, n, kb, bits), s)
    }
    #[inline(always)]
    fn decode(s: u8) -> f32 {
        e4m4::decode(s)
    }
}

/// One octet's block planes and scale, as loaded (the odd-k select not yet
/// made, so that holding a prefetched block waits on nothing).
struct Fetched<const K: usize, S> {
    planes: PlaneWords<K>,
    scale: S,
}

/// Quant block `(n, kb)` of an octet thread: column `n`, block `kb` along K.
#[derive(Clone, Copy)]
struct BlockPos {
    n: u32,
    kb: u32,
}

impl BlockPos {
    /// Splits block index `b` (`n·kblocks + kb`). Block indices fit in u32
    /// (the host allows fewer than 2^32 blocks), so this is a 32-bit
    /// division, not a 64-bit software routine, and the loop below makes it
    /// twice per thread, not once per octet.
    #[inline(always)]
    fn of(b: u32, kblocks: NonZeroU32) -> Self {
        Self { n: b / kblocks, kb: b % kblocks }
    }

    /// The block `step` blocks further, with `step` itself split by
    /// [`BlockPos::of`] (so `step.kb < kblocks` and `kb` wraps at most once).
    /// Positions past the matrix are computed but never loaded.
    #[inline(always)]
    fn advance(self, step: BlockPos, kblocks: NonZeroU32) -> Self {
        let (mut n, mut kb) = (self.n.wrapping_add(step.n), self.kb + step.kb);
        if kb >= kblocks.get() {
            kb -= kblocks.get();
            n = n.wrapping_add(1);
        }
        Self { n, kb }
    }
}

/// Issues the loads of quant block `at` for an octet thread whose octet
/// index is `t` (zeros from `total = 4·n_dim·kblocks` on).
///
/// # Safety
/// `packed`/`scales` describe an `[n_dim, 32·kblocks]` matrix in layout `L`,
/// and `at` is the block of octet `t` while `t < total`.
#[inline(always)]
unsafe fn fetch<const K: usize, L: Layout>(
    packed: *const u32,
    scales: *const L::Scale,
    n_dim: u32,
    kblocks: NonZeroU32,
    at: BlockPos,
    t: u64,
    total: u64,
) -> Fetched<K, L::Scale> {
    if t >= total {
        return Fetched { planes: PlaneWords::ZERO, scale: L::ZERO };
    }
    let (word, scale) =
        unsafe { L::block(scales, n_dim as u64, kblocks.get() as u64, at.n as u64, at.kb as u64, K as u64) };
    Fetched { planes: unsafe { PlaneWords::load(packed.add(word as usize)) }, scale }
}

/// Body of the `kbit_dequant_{flat,tiled}_k{K}_{T}` kernels.
///
/// # Safety
/// `packed`/`scales` describe an `[n_dim, k_dim]` matrix in layout `L`,
/// `cb` holds `2^K` floats, `out` has room for `n_dim·k_dim` elements and is
/// 16-byte aligned; the launch has ≥ 128 bytes of dynamic shared memory and
/// a block size that is a multiple of 4.
#[inline(always)]
pub unsafe fn run<const K: usize, L: Layout, T: Elem>(
    packed: *const u32,
    scales: *const L::Scale,
    cb: *const f32,
    out: *mut T::Raw,
    n_dim: u32,
    k_dim: u32,
) {
    // Non-zero by construction (the host rejects K < 32), typed so that the
    // divisions carry no division-by-zero panic path.
    let Some(kblocks) = NonZeroU32::new(k_dim / 32) else { return };
    let total = n_dim as u64 * kblocks.get() as u64 * 4;
    // The stride is a multiple of 4 (the block size is), so a thread keeps
    // its octet `t % 4` and steps `stride / 4` quant blocks at a time.
    let stride = ptx::grid_threads();
    let step = BlockPos::of((stride / 4) as u32, kblocks);
    let mut t = ptx::global_tid();
    let q = (t % 4) as u32;
    let mut at = BlockPos::of((t / 4) as u32, kblocks);
    let mut cur = unsafe { fetch::<K, L>(packed, scales, n_dim, kblocks, at, t, total) };
    let book = unsafe { stage_codebook::<K>(cb) };
    while t < total {
        at = at.advance(step, kblocks);
        let next = unsafe { fetch::<K, L>(packed, scales, n_dim, kblocks, at, t + stride, total) };
        let amax = L::decode(cur.scale);
        let idx = planes::octet::<K>(&cur.planes.planes(), q);
        let v = idx.map(|i| quant::dequant(unsafe { codebook_at(book, i) }, amax));
        unsafe { T::store8(out.add((t * 8) as usize), v) };
        cur = next;
        t += stride;
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
