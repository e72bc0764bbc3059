//! The contract of the column-slot scalar GEMV, the variant for small
//! matrices (`kbit_format::gemv::uses_slots`): launch geometry, the staged
//! activation layout, and the K split that fixes its summation order. It
//! decodes with the same table fields as the block variant
//! ([`crate::gemv`]).
//!
//! # Work mapping
//!
//! A block owns `C` consecutive columns and all of K; its `C·S` threads are
//! (column, K slot) pairs: thread `t` is column `t % C`, slot `t / C`. Each
//! thread loads its own column's `2k` plane words per K tile, so narrow
//! matrices can still spread over the whole GPU (up to 32 slots per
//! column). A grouped block may hold `J = 2` such column groups, `J·C`
//! columns, thread `t` taking column `t % C` and then `t % C + C`
//! ([`Geometry::log_reps`]); every column is still summed in the order
//! below.
//!
//! # Summation order (the numerics contract)
//!
//! For a column `n` and row `r`, with `S = slots(N, K)`: slot `s` owns the K
//! tiles `kt = s, s + S, s + 2S, …` and walks them in increasing order, and
//! in a tile its two 32-value blocks in order. `x_e` is the activation
//! widened to f32 (0 past K) and `s_b = e4m4::decode(scale)` of the block;
//! everything is f32.
//!
//! - Folded blocks ([`folds`]: k = 2 at every row count, k = 4 with one
//!   row): `d[e % 2] = fma(cb[idx_e], x_e, d[e % 2])` over the block's
//!   elements in increasing order from `d = [0, 0]`, then for k = 2
//!   `acc[t] = fma(d[t], s_b, acc[t])` for `t = 0, 1`, and for k = 4
//!   `acc[0] = fma(d[1], s_b, fma(d[0], s_b, acc[0]))` (`acc[1]` stays 0):
//!   one multiply a block instead of one a weight.
//! - Otherwise (k = 3, 5; k = 4 with two rows or more): for each element
//!   `e` of the block in increasing order,
//!   `acc[e % 2] = fma(w_e, x_e, acc[e % 2])` with `w_e = cb[idx_e] · s_b`.
//!
//! The slot's partial is `acc[0] + acc[1]`; the
//! output is `((p_0 + p_1) + p_2) + … + p_{S-1}`, rounded to nearest even.
//! Nothing here depends on the launch geometry or on the GPU, and the
//! only dependence on M is [`folds`], on the row count of the problem
//! itself (the call's rows, or one expert's), never on the instance that
//! runs it. A grouped call runs every expert, one row or four, in the
//! instance for its `max_m` rows, and takes the one-row order for an
//! expert with one row, so it reproduces the dense call on that expert
//! alone bit for bit.

use crate::tile;

/// Largest number of K slots per column.
pub const MAX_SLOTS: u32 = 32;

/// Largest block the host launches (keeps every kernel within 128 registers).
pub const MAX_THREADS: u32 = 512;

/// f32 values per staged K tile of activations: `M` rows of 64, plus 4 of
/// padding so that slots sharing a warp read different banks.
#[inline(always)]
pub const fn x_tile_floats(m: u32) -> u32 {
    64 * m + 4
}

/// Threads a call aims for, `N·S` (about 500 per SM on 132 SMs), times
/// √2: `S` is `65536 / N` rounded to the nearest power of two on a log
/// scale. Rounding down instead gave K × N = 2048×5120 8 slots (5.0 µs a
/// call at M = 1, k = 4 on an H100, against 4.7 with 16) and 2048×10240 4
/// (8.7 µs against 7.6 with 8); 2048×4096 is faster with 16 than with 32
/// (3.5 against 4.2 µs; `bench-results/NOTES.md`).
pub const SLOT_THREADS_X_SQRT2: usize = 92_682;

/// Whether blocks of a `bits`-bit matrix are summed unscaled and scaled
/// once (module docs) in a problem of `rows` rows: k = 2 always, k = 4
/// with one row. There the multiply per weight is an eighth of a one-row
/// call's instructions; at two rows or more the extra sums per row take
/// the k = 4 instances past 64 registers, and at k = 3 the one-row
/// instances gained a register and lost time. k = 5 decodes one weight a
/// lookup and keeps its multiply.
///
/// ```
/// use kbit_format::gemv_slots::folds;
/// assert!(folds(2, 3) && folds(4, 1));
/// assert!(!folds(4, 2) && !folds(3, 1) && !folds(5, 1));
/// ```
#[inline(always)]
pub const fn folds(bits: u32, rows: u32) -> bool {
    bits == 2 || (bits == 4 && rows == 1)
}

/// Number of K slots per column, `S`: a power of two in 1..=32 that depends
/// only on the shape, so it fixes the summation order (module docs).
/// Narrow matrices get more slots, to spread their few columns over the GPU
/// ([`SLOT_THREADS_X_SQRT2`]); never more than K has tiles.
///
/// ```
/// use kbit_format::gemv_slots::slots;
/// assert_eq!(slots(4096, 2048), 16); // 65536 / 4096 = 16
/// assert_eq!(slots(5120, 2048), 16); // 12.8, nearer 16 than 8
/// assert_eq!(slots(512, 2048), 32); // at most 32
/// assert_eq!(slots(512, 96), 2); // K = 96 has 2 tiles
/// ```
pub const fn slots(n: usize, k: usize) -> u32 {
    let k_tiles = tile::k_tiles(k);
    let per_col = match SLOT_THREADS_X_SQRT2.checked_div(n) {
        Some(v) => v,
        None => MAX_SLOTS as usize,
    };
    let mut s = 4u32;
    while s < MAX_SLOTS && (2 * s as usize) <= per_col {
        s *= 2;
    }
    let tiles = if k_tiles == 0 { 1 } else { k_tiles.next_power_of_two() };
    if (s as usize) < tiles { s } else { tiles as u32 }
}

/// Launch geometry of one GEMV call, as log2 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// log2 of the columns per block (`C`).
    pub log_cols: u32,
    /// log2 of the K slots per column (`S`).
    pub log_slots: u32,
    /// log2 of the loop iterations whose activations are staged at once (`R`).
    pub log_chunk: u32,
    /// log2 of the column groups per block (`J`, grouped kernels only): a
    /// thread works on columns `c, c + C, …, c + (J − 1)·C` of the block's
    /// `J·C`, one after the other, each in the summation order of the
    /// module docs.
    pub log_reps: u32,
}

impl Geometry {
    /// Columns per block.
    pub const fn cols(&self) -> u32 {
        1 << self.log_cols
    }
    /// K slots per column.
    pub const fn slots(&self) -> u32 {
        1 << self.log_slots
    }
    /// Loop iterations per staged chunk of activations.
    pub const fn chunk(&self) -> u32 {
        1 << self.log_chunk
    }
    /// Column groups per block.
    pub const fn reps(&self) -> u32 {
        1 << self.log_reps
    }
    /// Columns per block, `J·C`.
    pub const fn span(&self) -> u32 {
        self.cols() << self.log_reps
    }
    /// Threads per block: thread `t` is column `t % C`, slot `t / C`.
    pub const fn threads(&self) -> u32 {
        self.cols() * self.slots()
    }
    /// The one `u32` kernel argument:
    /// `log_cols | log_slots << 8 | log_chunk << 16 | log_reps << 24`.
    pub const fn pack(&self) -> u32 {
        self.log_cols | self.log_slots << 8 | self.log_chunk << 16 | self.log_reps << 24
    }
    /// Inverse of [`Geometry::pack`].
    #[inline(always)]
    pub const fn unpack(g: u32) -> Self {
        Self { log_cols: g & 0xFF, log_slots: (g >> 8) & 0xFF, log_chunk: (g >> 16) & 0xFF, log_reps: g >> 24 }
    }
    /// Dynamic shared memory in bytes for `m` rows at bit width `bits`: the
    /// decode table, then the staged activations (`R·S` tiles), whose space
    /// the final slot reduction (`S·M·J·C` floats) reuses.
    pub const fn smem_bytes(&self, bits: u32, m: u32) -> u32 {
        let x = self.chunk() * self.slots() * x_tile_floats(m) * 4;
        let red = self.slots() * m * self.span() * 4;
        crate::gemv::table_bytes(bits, m) + if x > red { x } else { red }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemv::uses_slots;

    /// The kernels' tile cursor is a 32-bit quant-block index within one
    /// matrix: on every matrix this variant takes, the index of the last
    /// tile's second block plus one step of `S` tiles (a cursor advanced
    /// past the end, never read) must stay below 2^32.
    #[test]
    fn slot_matrices_index_their_blocks_in_u32() {
        let below = (1usize << 25) - 1;
        let shapes = [(1, below / 32 * 32), (below / 32, 32), (1 << 12, (1 << 13) - 32), (4095, 8192 - 64), (7, 96)];
        for (n, k) in shapes {
            assert!(uses_slots(n, k), "{n}x{k}");
            let (n64, tiles) = (n as u64, tile::k_tiles(k) as u64);
            let last = tile::scale_index(n64, n64 - 1, 2 * (tiles - 1)) + 1;
            let step = slots(n, k) as u64 * n64 * 2;
            assert!(last + step < 1 << 32, "{n}x{k}: {last} + {step}");
        }
        // Past the threshold the block variant takes the matrix.
        assert!(!uses_slots(1 << 13, 1 << 12));
    }
}
