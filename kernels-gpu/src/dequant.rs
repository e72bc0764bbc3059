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
//!
//! Decode: byte `q` of the planes are gathered by byte permutes into an 8×8
//! bit matrix whose transpose holds each element's codebook byte offset
//! (`PlaneWords::octet_offsets`), so a lookup is one permute and one
//! shared-memory load. Positions and storage slots are 32-bit (the host
//! bounds the matrix); only the pointers are 64-bit.

use crate::elem::Elem;
use crate::ptx;
use crate::tile_io::{PlaneWords, codebook_at_offset, octet_offset, stage_codebook};
use core::num::NonZeroU32;
use kbit_format::{e4m4, quant, tile};

/// Where a quant block's planes and scale live.
pub trait Layout {
    /// Scale storage: f32 (flat) or an E4M4 byte (runtime).
    type Scale: Copy;
    /// The scale of a thread with no block (never decoded into an output).
    const ZERO: Self::Scale;
    /// The block's storage slot: its planes are words `slot·k ..`, its
    /// scale is entry `slot`. Below 2^32 − 1 in both layouts (the host
    /// checks the shape), so 32-bit math.
    fn slot(n_dim: u32, kblocks: u32, at: BlockPos) -> u32;
    /// Loads the scale of slot `slot`.
    ///
    /// # Safety
    /// `slot` is a block's slot of the matrix `scales` belongs to.
    unsafe fn scale(scales: *const Self::Scale, slot: u32) -> Self::Scale;
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
    fn slot(_n_dim: u32, kblocks: u32, at: BlockPos) -> u32 {
        at.n * kblocks + at.kb
    }
    #[inline(always)]
    unsafe fn scale(scales: *const f32, slot: u32) -> f32 {
        unsafe { *scales.add(slot as usize) }
    }
    #[inline(always)]
    fn decode(s: f32) -> f32 {
        s
    }
}

impl Layout for Tiled {
    type Scale = u8;
    const ZERO: u8 = 0;
    /// `tile::scale_index` (= `tile::word_index / k`) in 32 bits.
    #[inline(always)]
    fn slot(n_dim: u32, _kblocks: u32, at: BlockPos) -> u32 {
        ((at.kb >> 1) * n_dim + at.n) * 2 + (at.kb & 1)
    }
    #[inline(always)]
    unsafe fn scale(scales: *const u8, slot: u32) -> u8 {
        unsafe { ptx::ld_nc_u8(scales.add(slot as usize)) }
    }
    #[inline(always)]
    fn decode(s: u8) -> f32 {
        e4m4::decode_biased(s)
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
pub struct BlockPos {
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

/// Issues the loads of quant block `at`.
///
/// # Safety
/// `packed`/`scales` describe an `[n_dim, 32·kblocks]` matrix in layout
/// `L`, and `at` is one of its blocks.
#[inline(always)]
unsafe fn fetch<const K: usize, L: Layout>(
    packed: *const u32,
    scales: *const L::Scale,
    n_dim: u32,
    kblocks: NonZeroU32,
    at: BlockPos,
) -> Fetched<K, L::Scale> {
    let slot = L::slot(n_dim, kblocks.get(), at);
    let words = packed.wrapping_add(slot as usize * K);
    unsafe { Fetched { planes: PlaneWords::load(words), scale: L::scale(scales, slot) } }
}

/// Body of the `kbit_dequant_{flat,tiled}_k{K}_{T}` kernels.
///
/// # Safety
/// `packed`/`scales` describe an `[n_dim, k_dim]` matrix in layout `L`
/// (`packed` 16-byte aligned), `cb` holds `2^K` floats, `out` has room for
/// `n_dim·k_dim` elements and is 16-byte aligned; the launch has ≥ 128
/// bytes of dynamic shared memory and a block size that is a multiple of 4.
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
    let blocks = n_dim.wrapping_mul(kblocks.get());
    // The stride is a multiple of 4 (the block size is), so a thread keeps
    // its octet `t % 4` and steps `stride / 4` quant blocks at a time; the
    // block counter `b` and the position `at` move together, in 32 bits.
    let stride = ptx::grid_threads();
    let step_blocks = (stride / 4) as u32;
    let step = BlockPos::of(step_blocks, kblocks);
    // `b < more_below` ⇔ the thread has a block after `b` (no overflow).
    let more_below = blocks.saturating_sub(step_blocks);
    let t = ptx::global_tid();
    let q = (t % 4) as u32;
    let mut b = (t / 4) as u32;
    let mut at = BlockPos::of(b, kblocks);
    let mut cur = Fetched { planes: PlaneWords::ZERO, scale: L::ZERO };
    if b < blocks {
        cur = unsafe { fetch::<K, L>(packed, scales, n_dim, kblocks, at) };
    }
    let book = unsafe { stage_codebook::<K>(cb) };
    let mut dst = out.wrapping_add(t as usize * 8);
    while b < blocks {
        // Prefetch the next block; the last trip loads its own block again
        // (an L1 hit) rather than branching around the loads.
        let more = b < more_below;
        if more {
            at = at.advance(step, kblocks);
        }
        let next = unsafe { fetch::<K, L>(packed, scales, n_dim, kblocks, at) };
        let amax = L::decode(cur.scale);
        let offs = cur.planes.octet_offsets(q);
        let v: [f32; 8] =
            core::array::from_fn(|e| quant::dequant(unsafe { codebook_at_offset(book, octet_offset(&offs, e)) }, amax));
        unsafe { T::store8(dst, v) };
        dst = dst.wrapping_add(stride as usize * 8);
        b = if more { b + step_blocks } else { blocks };
        cur = next;
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
