//! Geometry of the direct-load variant of the tensor-core GEMM (kernel 2
//! for M ≤ 16), shared by the host (grid, shared memory)
//! and the device.
//!
//! No pipeline in shared memory: every lane loads the plane words and
//! scale bytes of its own two quant blocks straight into registers, one
//! step ahead of the one it multiplies. A team of [`THREADS`] = 512
//! threads (16 warps) walks 16-column groups `slot, slot + slots, …`;
//! warp `w` of a team takes the 128-wide K steps `w, w + 16, …` of every
//! group. A block holds one team (`slot = bid`, `slots = grid`) or two
//! (team h: `slot = bid + h·grid`, `slots = 2·grid`) that share the table
//! and the staged activations.
//!
//! # Lane map (one step: 16 columns × 4 quant blocks)
//!
//! Lane l (g = l / 4, t = l % 4) owns quant block `4s + t` (K tile
//! `2s + t / 2`, half `t % 2`) of columns `16G + g` (mma row g) and
//! `16G + g + 8` (row g + 8): all 32 weights of each, one contiguous run
//! of k words in the runtime layout. The sum over K does not care which
//! K position sits in which k slot of an mma as long as A and B agree, so
//! each mma's 16 k slots are 4 positions of each lane's block: mma i
//! (0..8) takes positions `4i .. 4i + 4` of the block of lane t in its k
//! slots `2t, 2t + 1` (positions 4i, 4i + 1) and `2t + 8, 2t + 9`
//! (4i + 2, 4i + 3). Those are the pairs `8q + two_t` of
//! `mma::pair_words` with q = i / 2, two_t = 4·(i % 2) (a0, a1) and
//! 4·(i % 2) + 2 (a2, a3), so the pair table and lookups of the other
//! tensor-core kernels serve unchanged. B holds the activation rows as its
//! 8 columns (lane group g' reads row `g' % R`); of D only columns < M
//! are kept. With sixteen rows each A meets two Bs, rows 0..8 and 8..16
//! (lane group g' reads rows g' and g' + 8), into two sets of accumulators
//! ([`tiles`]).
//!
//! # Shared memory
//!
//! ```text
//! [ table | x | red 0 | red 1 (| red 2 | red 3 with two teams) ]
//! table: the pair table of [`table_mb`] (`mma::table_bytes(k, table_mb(k))`)
//! x:     R activation rows (R = 1 at M = 1, 4 at M = 2..4, 8 at M =
//!        5..8, else 16) in step order: for step s, 8-element chunk i2 of
//!        a block (0..4), lane quarter t, row r: 16 bytes at
//!        ((4s + i2)·4 + t)·R + r' (r' = r; r ^ (t & 2) at R = 4, r ^ 2t
//!        at R = 8 and (r & 8) | (r & 7) ^ 2t at R = 16 against bank
//!        conflicts, see [`x_offset`]), holding elements
//!        128s + 32t + 8·i2 .. + 8 (zero past K and for rows ≥ M), so
//!        that one 16-byte load gives a lane the B registers of mmas
//!        2·i2 and 2·i2 + 1
//! red:   two buffers per team of [tile][warp][lane] × 4 f32 (a
//!        group's accumulators, one tile or two at R = 16; a team's groups
//!        alternate buffers, so one team barrier per group suffices)
//! ```

use crate::mma;

/// Threads of a team (16 warps); a block holds one or two teams.
pub const THREADS: u32 = 512;
/// Warps per team: the K slots of a group.
pub const WARPS: u32 = THREADS / 32;
/// Output columns of a group (the 16 rows of the swapped mma's A).
pub const GROUP_COLS: u32 = 16;
/// K elements of a step: one quant block per lane quarter.
pub const STEP_K: u32 = 128;
/// Largest M.
pub const MAX_M: u32 = 16;

/// Activation rows staged for `m` rows: 1, 4, 8 or 16.
///
/// ```
/// use kbit_format::mma_direct::rows;
/// assert_eq!((rows(1), rows(2), rows(4), rows(5), rows(8)), (1, 4, 4, 8, 8));
/// assert_eq!((rows(9), rows(16)), (16, 16));
/// ```
#[inline(always)]
pub const fn rows(m: u32) -> u32 {
    if m <= 1 {
        1
    } else if m <= 4 {
        4
    } else if m <= 8 {
        8
    } else {
        16
    }
}

/// The mma column tiles (Bs of 8 activation rows) of `r` staged rows: 2
/// at sixteen, else 1.
///
/// ```
/// use kbit_format::mma_direct::tiles;
/// assert_eq!((tiles(1), tiles(8), tiles(16)), (1, 1, 2));
/// ```
#[inline(always)]
pub const fn tiles(r: u32) -> u32 {
    if r > 8 { 2 } else { 1 }
}

/// Steps of a K: `ceil(K / 128)`.
#[inline(always)]
pub const fn steps(k: u32) -> u32 {
    k.div_ceil(STEP_K)
}

/// Groups of an N: `ceil(N / 16)`.
#[inline(always)]
pub const fn groups(n: u32) -> u32 {
    n.div_ceil(GROUP_COLS)
}

/// Bytes of the staged activations: `r` rows of `steps(k)` steps.
#[inline(always)]
pub const fn x_bytes(r: u32, k: u32) -> u32 {
    r * steps(k) * STEP_K * 2
}

/// The pair-table layout (the `mb` of `mma::table_bytes` and friends):
/// at k = 5 the split table of one m block (`mma::splits_low_bit`: 16
/// copies of 8 bytes, two wavefronts a lookup), else [`mma::PAIRS`] (32
/// copies, one wavefront).
#[inline(always)]
pub const fn table_mb(bits: u32) -> u32 {
    if bits == 5 { 1 } else { mma::PAIRS }
}

/// Offset of the staged activations.
#[inline(always)]
pub const fn x_base(bits: u32) -> u32 {
    mma::table_bytes(bits, table_mb(bits))
}

/// Byte offset, within the staged activations, of the 16 bytes of row `r`
/// of `rows_r` rows, step `s`, chunk `i2`, lane quarter `t`. A 16-byte
/// load is served in four phases of 8 lanes (g = 2p, 2p + 1, t = 0..3:
/// rows `g % rows_r` of every quarter). With four rows the row slot is
/// `r ^ (t & 2)`: unswizzled the chunks `4t + r` of a phase meet in pairs
/// on the same banks (t and t + 2); with eight it is `r ^ 2t`, where
/// unswizzled the chunks `8t + r` of all four quarters would share two
/// bank groups. Sixteen rows ([`x_offset16`]) are two such blocks of
/// eight (rows `r` and `r + 8` of a lane 128 bytes apart). Swizzled, the 8
/// chunks of a phase cover all 32 banks once.
///
/// ```
/// use kbit_format::mma_direct::{x_offset, x_offset16};
/// // Row 0, elements 32·t .. of step 0, chunk 0: the four quarters side by side.
/// assert_eq!([0, 1, 2, 3].map(|t| x_offset(1, 0, 0, t, 0)), [0, 16, 32, 48]);
/// assert_eq!(x_offset(4, 1, 2, 3, 1), (((4 + 2) * 4 + 3) * 4 + 3) * 16);
/// // The 8 chunks of each phase of a load (lane groups g = 2p, 2p + 1)
/// // fall in 8 distinct bank groups, at every step and chunk.
/// let at = |rows_r, s, i2, t, r| if rows_r == 16 { x_offset16(s, i2, t, r) } else { x_offset(rows_r, s, i2, t, r) };
/// for (rows_r, tile) in [(4, 0), (8, 0), (16, 0), (16, 8)] {
///     for (s, i2) in [(0, 0), (3, 1)] {
///         for p in 0..4 {
///             let mut seen = [false; 8];
///             for t in 0..4 {
///                 for g in [2 * p, 2 * p + 1] {
///                     let group = (at(rows_r, s, i2, t, tile + g % rows_r) / 16 % 8) as usize;
///                     assert!(!seen[group]);
///                     seen[group] = true;
///                 }
///             }
///         }
///     }
/// }
/// // Sixteen rows: a lane's row g + 8 sits 128 bytes after its row g.
/// assert_eq!(x_offset16(2, 1, 3, 13), x_offset16(2, 1, 3, 5) + 128);
/// ```
#[inline(always)]
pub const fn x_offset(rows_r: u32, s: u32, i2: u32, t: u32, r: u32) -> u32 {
    let slot = match rows_r {
        4 => r ^ (t & 2),
        8 => r ^ (2 * t),
        _ => r,
    };
    (((4 * s + i2) * 4 + t) * rows_r + slot) * 16
}

/// [`x_offset`] at sixteen rows: two blocks of eight, each swizzled as
/// eight rows are (`(r & 8) | (r & 7) ^ 2t`). (A function of its own, so
/// that the arms of `x_offset` stay as the instances of 1, 4 and 8 rows
/// were compiled and measured with.)
#[inline(always)]
pub const fn x_offset16(s: u32, i2: u32, t: u32, r: u32) -> u32 {
    (((4 * s + i2) * 4 + t) * 16 + ((r & 8) | ((r & 7) ^ (2 * t)))) * 16
}

/// Where element `e` (0..K) of an activation row goes: (step, chunk,
/// quarter, element in chunk).
///
/// ```
/// use kbit_format::mma_direct::x_place;
/// assert_eq!(x_place(0), (0, 0, 0, 0));
/// assert_eq!(x_place(128 + 32 * 3 + 8 * 2 + 5), (1, 2, 3, 5));
/// ```
#[inline(always)]
pub const fn x_place(e: u32) -> (u32, u32, u32, u32) {
    let (s, in_step) = (e / STEP_K, e % STEP_K);
    (s, (in_step % 32) / 8, in_step / 32, in_step % 8)
}

/// Bytes of one tile of a reduction buffer: 16 warps × 32 lanes × 4 f32.
pub const RED_BYTES: u32 = WARPS * 32 * 16;

/// Offset of reduction buffer `p` for `r` staged rows: 0 and 1 for the
/// first team (groups alternate between them), 2 and 3 for the second;
/// a buffer holds [`tiles`]`(r)` tiles of [`RED_BYTES`].
#[inline(always)]
pub const fn red_base(bits: u32, r: u32, k: u32, p: u32) -> u32 {
    x_base(bits) + x_bytes(r, k) + p * tiles(r) * RED_BYTES
}

/// Dynamic shared memory of a launch with `teams` teams of [`WARPS`] warps
/// per block (1 or 2): one table and one copy of the staged activations,
/// two reduction buffers per team.
///
/// ```
/// use kbit_format::mma_direct::smem_bytes;
/// // k = 4, one row, K = 8192: 32 KiB table + 16 KiB activations + 2 × 8 KiB.
/// assert_eq!(smem_bytes(4, 1, 8192, 1), 32768 + 16384 + 16384);
/// // Eight rows, two teams: 32 KiB + 128 KiB + 4 × 8 KiB.
/// assert_eq!(smem_bytes(4, 8, 8192, 2), 32768 + 131072 + 32768);
/// // Sixteen rows, K = 2048: 32 KiB + 64 KiB + 2 × 2 tiles × 8 KiB.
/// assert_eq!(smem_bytes(4, 16, 2048, 1), 32768 + 65536 + 32768);
/// ```
#[inline(always)]
pub const fn smem_bytes(bits: u32, r: u32, k: u32, teams: u32) -> u32 {
    red_base(bits, r, k, 2 * teams)
}

/// (row of x, column within the group) of accumulator register `i` (0..4)
/// of lane `lane`: D row g or g + 8 (the column), D column 2t or 2t + 1
/// (the activation row; plus 8 in the second tile of sixteen rows).
///
/// ```
/// use kbit_format::mma_direct::c_pos;
/// assert_eq!(c_pos(0, 0), (0, 0));
/// assert_eq!(c_pos(4 * 5 + 1, 3), (3, 13));
/// ```
#[inline(always)]
pub const fn c_pos(lane: u32, i: u32) -> (u32, u32) {
    (2 * (lane % 4) + (i & 1), lane / 4 + 8 * (i >> 1))
}

/// The lane and register that hold (x row `row`, group column `col`):
/// the inverse of [`c_pos`].
///
/// ```
/// use kbit_format::mma_direct::{c_pos, c_source};
/// for lane in 0..32 {
///     for i in 0..4 {
///         let (row, col) = c_pos(lane, i);
///         assert_eq!(c_source(row, col), (lane, i));
///     }
/// }
/// ```
#[inline(always)]
pub const fn c_source(row: u32, col: u32) -> (u32, u32) {
    (4 * (col % 8) + row / 2, 2 * (col / 8) + row % 2)
}

/// The pair-table rotation offsets (`two_t` of `mma::pair_words`) whose
/// four pairs fill mma registers a0 (`[0]`) and a2 (`[1]`) of the mmas
/// `2q + odd`, q = 0..4.
#[inline(always)]
pub const fn two_t(odd: u32) -> [u32; 2] {
    [4 * odd, 4 * odd + 2]
}
