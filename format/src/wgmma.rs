//! Geometry of the warpgroup tensor-core GEMM (sm_90a, `kernels-gpu`
//! `wgmma`): block tile, shared-memory map and the thread → data maps, as
//! functions that the kernel, the host and the CPU tests share.
//!
//! The kernel computes `yᵀ = W · xᵀ`: the weight is the A operand of
//! `wgmma.m64n128k16` (64 weight columns per warpgroup, dequantized into
//! registers), the activations the B operand (128 rows of x, from shared
//! memory through a descriptor). Two consumer warpgroups decode and
//! multiply; a producer warpgroup fills the pipeline: one tensor copy
//! (TMA) per stage for the activations, `cp.async` for the weights.
//!
//! # Work of a block
//!
//! The output is cut into tiles of [`tile_m`] rows × [`TILE_N`] columns,
//! tile `t` at row tile `t % row_tiles` and column tile `t / row_tiles`
//! (consecutive blocks share weight columns). A launch has `full` whole
//! tiles and, with `splits > 1`, the tiles after them cut along K into
//! `splits` ranges of `tps` K tiles (the last shorter, never empty): block
//! `b < full` computes tile `b`, block `full + j` split `j % splits` of
//! tile `full + j / splits` ([`work`]). The launch groups its blocks in
//! clusters of `splits` (`full` is a multiple of it), so a split tile's
//! blocks are one cluster, cluster rank = split, and add their partials
//! through distributed shared memory.
//!
//! ```
//! use kbit_format::wgmma as geo;
//! // Activation (row 9, k 20) of a stage: row 9 at 9·128 bytes, its 16-byte
//! // chunk 2 stored as chunk 2 ^ (9 % 8) = 3 (the 128-byte swizzle).
//! assert_eq!(geo::a_offset(9, 20), 9 * 128 + 3 * 16 + 4 * 2);
//! assert!(geo::smem_bytes(4, 1) <= 227 * 1024 && geo::smem_bytes(5, 2) <= 227 * 1024);
//! ```

use crate::mma::table_bytes;

/// Threads of the two consumer warpgroups (warps 0..8): they decode the
/// weights and issue the MMAs.
pub const CONSUMERS: u32 = 256;
/// Threads of the producer warpgroup (warps 8..12): they issue the copies
/// of the pipeline.
pub const PRODUCERS: u32 = 128;
/// Threads per block: two consumer warpgroups and one producer.
pub const THREADS: u32 = CONSUMERS + PRODUCERS;
/// Activation rows of one half of a block tile (the `n` of
/// `m64n128k16`). A block computes one half (`h = 1`, 128 rows) or two
/// (`h = 2`, 256 rows: each k16 step issues an MMA per half with the same
/// A registers, so a weight is decoded once per 256 rows).
pub const HALF_M: u32 = 128;
/// Activation rows per block: `HALF_M · h`.
#[inline(always)]
pub const fn tile_m(h: u32) -> u32 {
    HALF_M * h
}
/// Weight columns (outputs) per block: 64 per warpgroup.
pub const TILE_N: u32 = 128;
/// Pipeline stages of one K tile (64 values) each: as many as fit the
/// shared memory at k = 5.
#[inline(always)]
pub const fn stages(h: u32) -> u32 {
    if h == 1 { 8 } else { 5 }
}
/// Bytes of a stage's activations: `tile_m(h)` rows × 64 values × 2 bytes
/// (the box of the activations' tensor copy); half `j` starts at
/// `j · a_bytes(1)`.
#[inline(always)]
pub const fn a_bytes(h: u32) -> u32 {
    tile_m(h) * 128
}
/// Alignment of a stage, and of the 128-byte swizzle pattern: 8 rows of
/// 128 bytes.
pub const ALIGN: u32 = 1024;
/// Byte distance of adjacent groups of 8 activation rows (the descriptor's
/// stride offset): one swizzle atom.
pub const SBO: u32 = 1024;

/// Most K splits of a tile: its blocks form one thread-block cluster, at
/// most 8 blocks (the portable cluster size).
pub const MAX_SPLITS: u32 = 8;

/// What one block computes: output tile `tile` (see the module docs) over
/// K tiles `kt0 .. kt1`, split `split` of that tile's `splits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    pub tile: u32,
    pub split: u32,
    pub splits: u32,
    pub kt0: u32,
    pub kt1: u32,
}

/// The work of block `b` of a launch with `full` whole tiles, then tiles
/// cut into `splits` K ranges of `tps` K tiles (`splits = ceil(k_tiles /
/// tps)`, so that none is empty).
///
/// ```
/// use kbit_format::wgmma::{work, Work};
/// // 2 whole tiles, then 3 splits of 11, 11 and 10 of 32 K tiles.
/// assert_eq!(work(1, 2, 3, 11, 32), Work { tile: 1, split: 0, splits: 1, kt0: 0, kt1: 32 });
/// assert_eq!(work(7, 2, 3, 11, 32), Work { tile: 3, split: 2, splits: 3, kt0: 22, kt1: 32 });
/// ```
#[inline(always)]
pub const fn work(b: u32, full: u32, splits: u32, tps: u32, k_tiles: u32) -> Work {
    if b < full || splits <= 1 {
        return Work { tile: b, split: 0, splits: 1, kt0: 0, kt1: k_tiles };
    }
    let j = b - full;
    let split = j % splits;
    let kt0 = split * tps;
    let end = kt0 + tps;
    Work { tile: full + j / splits, split, splits, kt0, kt1: if end < k_tiles { end } else { k_tiles } }
}

/// 16-byte chunks of a stage's plane span: the 2·k words of 128 columns,
/// fetched from the 16-byte boundary below its start (one chunk more).
#[inline(always)]
pub const fn w_chunks(bits: u32) -> u32 {
    TILE_N * 2 * bits * 4 / 16 + 1
}

/// 16-byte chunks of a stage's scale span: 2 bytes per column, plus one
/// for the boundary below its start.
pub const S_CHUNKS: u32 = TILE_N * 2 / 16 + 1;

/// Bytes of one stage: activations, planes, scales, rounded up to
/// [`ALIGN`] (every stage starts on a swizzle atom).
#[inline(always)]
pub const fn stage_bytes(bits: u32, h: u32) -> u32 {
    (a_bytes(h) + 16 * (w_chunks(bits) + S_CHUNKS)).div_ceil(ALIGN) * ALIGN
}

/// Offset of stage 0 from the first [`ALIGN`]-aligned shared address at or
/// after the end of the decode table (one m block's table of
/// `kbit_format::mma`, at the start of the dynamic shared memory, whose
/// own alignment the kernel does not assume).
#[inline(always)]
pub const fn table_end(bits: u32) -> u32 {
    table_bytes(bits, crate::mma::PAIRS)
}

/// Offset of the pipeline's barrier objects from stage 0, after the
/// stages: stage s has a "full" barrier at `8·s` (its copies have landed)
/// and an "empty" one at `8·(stages + s)` (its consumers are done with it).
#[inline(always)]
pub const fn barriers_offset(bits: u32, h: u32) -> u32 {
    stages(h) * stage_bytes(bits, h)
}

/// Dynamic shared memory of a block: the table, up to `ALIGN − 16` bytes
/// of padding to the first stage (the dynamic window is 16-aligned), the
/// stages and the barriers.
#[inline(always)]
pub const fn smem_bytes(bits: u32, h: u32) -> u32 {
    table_end(bits) + ALIGN - 16 + barriers_offset(bits, h) + 16 * stages(h)
}

/// Byte offset of activation (row, k) in a stage: the K-major layout with
/// the 128-byte swizzle that the tensor copy writes and the B descriptor
/// reads. Row `row` fills the 128 bytes at `128·row`, its 16-byte chunk
/// `k / 8` stored at chunk position `(k / 8) ^ (row % 8)`: the 8 rows of a
/// swizzle atom put a given chunk in 8 different bank groups.
#[inline(always)]
pub const fn a_offset(row: u32, k: u32) -> u32 {
    row * 128 + (((k / 8) ^ (row % 8)) * 16) + (k % 8) * 2
}

/// The shared-memory matrix descriptor of the activations of k16 step
/// `step` (0..4) of the half at shared address `stage` ([`ALIGN`]-aligned):
/// start address (the step's 32 bytes into each row; the hardware applies
/// the swizzle to the full address), the stride offset [`SBO`] in 16-byte
/// units, and layout type 1, the 128-byte swizzle. The leading offset is
/// not used by a swizzled K-major operand whose K extent is one atom.
#[inline(always)]
pub const fn b_descriptor(stage: u32, step: u32) -> u64 {
    let start = ((stage + 32 * step) & 0x3FFFF) >> 4;
    start as u64 | 1 << 16 | ((SBO >> 4) as u64) << 32 | 1 << 62
}

/// Weight column (within the block tile) of register `a_r` (r = 0..4) of
/// lane `lane` of warp `warp` (0..8): warpgroup `warp / 4` owns 64 columns,
/// each warp 16 of them, lane group g = lane / 4 rows g (a0, a2) and g + 8
/// (a1, a3) of its 16 — the `mma.m16n8k16` A layout.
#[inline(always)]
pub const fn a_col(warp: u32, lane: u32, r: u32) -> u32 {
    64 * (warp / 4) + 16 * (warp % 4) + lane / 4 + 8 * (r & 1)
}

/// Elements (k within the k16 step) of register `a_r` of lane `lane`:
/// `2t + 8·(r / 2)` and the next one, t = lane % 4.
#[inline(always)]
pub const fn a_k(lane: u32, r: u32) -> u32 {
    2 * (lane % 4) + 8 * (r / 2)
}

/// Activation row (within the block tile) of accumulator `i` (0..64) of
/// lane `lane`: the `m64nNk16` D layout, columns `8·(i / 4) + 2t + (i & 1)`.
#[inline(always)]
pub const fn d_row(lane: u32, i: u32) -> u32 {
    8 * (i / 4) + 2 * (lane % 4) + (i & 1)
}

/// Bytes of one row of the output staging tile: [`TILE_N`] 16-bit values.
pub const OUT_ROW_BYTES: u32 = TILE_N * 2;

/// Byte offset, in the output staging tile of a whole-tile block, of the
/// 8 outputs of activation row `row` (0..`tile_m(h)`) and weight columns
/// `8·chunk .. 8·chunk + 8` (chunk 0..16): rows of [`OUT_ROW_BYTES`], the
/// 16-byte chunks of a row stored at position `chunk ^ (row % 8)`. The
/// accumulators go in as transposed 8 × 8 matrices (8 rows, one chunk
/// each) and come out as whole rows (16 chunks of one row, 8 lanes per
/// 128 bytes); either way the 8 chunks that one wavefront touches fall in
/// 8 different bank groups.
///
/// ```
/// use kbit_format::wgmma::out_offset;
/// // Rows 0..8 of chunk 3: one chunk in each 16-byte bank group.
/// let mut groups: Vec<u32> = (0..8).map(|r| out_offset(r, 3) % 128 / 16).collect();
/// groups.sort();
/// assert_eq!(groups, (0..8).collect::<Vec<_>>());
/// // A split block stages its share (at most 8·h chunks of 8 rows) after
/// // its f32 partial (16 bytes × 256 threads × 16·h chunks), inside the
/// // stages, for every k.
/// use kbit_format::wgmma as geo;
/// for (bits, h) in (2..=5).flat_map(|b| [(b, 1), (b, 2)]) {
///     let end = 16 * geo::CONSUMERS * 16 * h + 8 * h * 8 * geo::OUT_ROW_BYTES;
///     assert!(end <= geo::barriers_offset(bits, h) && geo::tile_m(h) * geo::OUT_ROW_BYTES <= end);
/// }
/// ```
#[inline(always)]
pub const fn out_offset(row: u32, chunk: u32) -> u32 {
    row * OUT_ROW_BYTES + 16 * (chunk ^ (row % 8))
}

/// Weight column (within the block tile) of accumulator `i` of lane
/// `lane` of warp `warp`: rows `g` (i % 4 < 2) and `g + 8` of the warp's 16.
#[inline(always)]
pub const fn d_col(warp: u32, lane: u32, i: u32) -> u32 {
    64 * (warp / 4) + 16 * (warp % 4) + lane / 4 + 8 * ((i / 2) & 1)
}
