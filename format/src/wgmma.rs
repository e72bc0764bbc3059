//! Geometry of the warpgroup tensor-core GEMM (sm_90a, `kernels-gpu`
//! `wgmma`): block tile, shared-memory map and the thread → data maps, as
//! functions that the kernel, the host and the CPU tests share.
//!
//! The kernel computes `yᵀ = W · xᵀ`: the weight is the A operand of
//! `wgmma.m64n128k16` (64 weight columns per warpgroup, dequantized into
//! registers), the activations the B operand (128 rows of x, from shared
//! memory through a descriptor). Two consumer warpgroups decode and
//! multiply; a producer warpgroup fills the pipeline.
//!
//! ```
//! use kbit_format::wgmma as geo;
//! // Chunk 9 of a stage's activations: row 1, K chunk 1, at byte 144.
//! assert_eq!((geo::a_chunk_row(9), geo::a_chunk_col(9)), (1, 1));
//! assert_eq!(geo::a_offset(1, 8), 144);
//! assert!(geo::smem_bytes(4) <= 227 * 1024);
//! ```

use crate::mma::table_bytes;

/// Threads of the two consumer warpgroups (warps 0..8): they decode the
/// weights and issue the MMAs.
pub const CONSUMERS: u32 = 256;
/// Threads of the producer warpgroup (warps 8..12): they issue the
/// `cp.async` copies of the pipeline.
pub const PRODUCERS: u32 = 128;
/// Threads per block: two consumer warpgroups and one producer.
pub const THREADS: u32 = CONSUMERS + PRODUCERS;
/// Activation rows per block (the `n` of `m64n128k16`).
pub const TILE_M: u32 = 128;
/// Weight columns (outputs) per block: 64 per warpgroup.
pub const TILE_N: u32 = 128;
/// Pipeline stages of one K tile (64 values) each.
pub const STAGES: u32 = 8;
/// Bytes of a stage's activations: 128 rows × 64 values × 2 bytes.
pub const A_BYTES: u32 = TILE_M * 128;
/// 16-byte chunks of a stage's activations.
pub const A_CHUNKS: u32 = A_BYTES / 16;
/// Byte distance of core matrices adjacent along K (the descriptor's
/// leading-dimension offset): one 8 × 16-byte core matrix.
pub const LBO: u32 = 128;
/// Byte distance of core matrices adjacent along the rows (the stride
/// offset): the 8 K chunks of a tile.
pub const SBO: u32 = 1024;

/// 16-byte chunks of a stage's plane span: the 2·k words of 128 columns,
/// fetched from the 16-byte boundary below its start (one chunk more).
#[inline(always)]
pub const fn w_chunks(bits: u32) -> u32 {
    TILE_N * 2 * bits * 4 / 16 + 1
}

/// 16-byte chunks of a stage's scale span: 2 bytes per column, plus one
/// for the boundary below its start.
pub const S_CHUNKS: u32 = TILE_N * 2 / 16 + 1;

/// Bytes of one stage: activations, planes, scales, rounded up to 128.
#[inline(always)]
pub const fn stage_bytes(bits: u32) -> u32 {
    (A_BYTES + 16 * (w_chunks(bits) + S_CHUNKS)).div_ceil(128) * 128
}

/// Offset of stage 0, after the decode table (one m block's table of
/// `kbit_format::mma`).
#[inline(always)]
pub const fn stages_offset(bits: u32) -> u32 {
    table_bytes(bits, 1).div_ceil(128) * 128
}

/// Offset of the pipeline's barrier objects, after the stages: stage s
/// has a "full" barrier at `8·s` (its copies have landed) and an "empty"
/// one at `8·(STAGES + s)` (its consumers are done with it).
#[inline(always)]
pub const fn barriers_offset(bits: u32) -> u32 {
    stages_offset(bits) + STAGES * stage_bytes(bits)
}

/// Dynamic shared memory of a block.
#[inline(always)]
pub const fn smem_bytes(bits: u32) -> u32 {
    barriers_offset(bits) + 16 * STAGES
}

/// Activation row of chunk `q` (0..[`A_CHUNKS`]) of a stage.
#[inline(always)]
pub const fn a_chunk_row(q: u32) -> u32 {
    (q / 64) * 8 + q % 8
}

/// K chunk (8 values) of chunk `q` of a stage.
#[inline(always)]
pub const fn a_chunk_col(q: u32) -> u32 {
    (q / 8) % 8
}

/// Byte offset of activation (row, k) in a stage: the no-swizzle K-major
/// layout of the B descriptor. Core matrix (row / 8, k / 8) of 8 rows ×
/// 16 bytes sits at `(row / 8)·SBO + (k / 8)·LBO`, row `row % 8` of it at
/// 16 bytes a row. Chunk `q` lands at `16·q`: a warp's copies fill
/// contiguous lines.
#[inline(always)]
pub const fn a_offset(row: u32, k: u32) -> u32 {
    (row / 8) * SBO + (k / 8) * LBO + (row % 8) * 16 + (k % 8) * 2
}

/// The shared-memory matrix descriptor of the activations of k16 step
/// `step` (0..4) of the stage at shared address `stage`: start address,
/// LBO and SBO in 16-byte units, no swizzle.
#[inline(always)]
pub const fn b_descriptor(stage: u32, step: u32) -> u64 {
    let start = ((stage + 2 * LBO * step) & 0x3FFFF) >> 4;
    start as u64 | ((LBO >> 4) as u64) << 16 | ((SBO >> 4) as u64) << 32
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

/// Weight column (within the block tile) of accumulator `i` of lane
/// `lane` of warp `warp`: rows `g` (i % 4 < 2) and `g + 8` of the warp's 16.
#[inline(always)]
pub const fn d_col(warp: u32, lane: u32, i: u32) -> u32 {
    64 * (warp / 4) + 16 * (warp % 4) + lane / 4 + 8 * ((i / 2) & 1)
}
