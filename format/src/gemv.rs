//! The contract between the scalar GEMV kernels (kernels 1 and 4) and the
//! host that launches them: how bit planes become codebook-table fields,
//! the shared-memory layout, the packed launch geometry, and the K split
//! that fixes the summation order.
//!
//! # Decoding through a table
//!
//! A thread holds the k planes of one 32-value block. Instead of gathering
//! the k bits of every element one by one, it reshuffles the planes (a few
//! shifts and masks for all 32 elements) into words whose bytes are table
//! *fields*, then looks every field up in a table in shared memory:
//!
//! - k = 2 ([`quad_words`]): byte `m` of word 0 is the field of the
//!   elements `8m, 8m+1, 8m+4, 8m+5`, of word 1 of `8m+2, 8m+3, 8m+6, 8m+7`
//!   ([`quad_index`]). The table entry of a field is the four codebook
//!   values, 16 bytes, so one 128-bit shared load dequantizes four elements.
//!   Each field has 8 copies ([`copies`]): lane `l` reads copy `l % 8`,
//!   which puts the 8 lanes of a quarter-warp in 8 different groups of 4
//!   banks, so a lookup never conflicts.
//! - k = 3, 4 ([`pair_words`]): byte `m` of word `q` is the field of the
//!   element pair `(8m + 2q, 8m + 2q + 1)`; bit `2j + t` of the field is
//!   plane `j` of element `t` of the pair. The table entry of a field is the
//!   two codebook values, 8 bytes ([`pair_index`] gives their indices), so
//!   one 64-bit shared load dequantizes two elements. Each field has 16
//!   copies (lane `l` reads copy `l % 16`: the 16 lanes of a half-warp in
//!   16 different bank pairs), or 32 for k = 3 in the row layout below.
//! - k = 5 ([`wide_words`]): byte `m` of word `c` is 4× the codebook
//!   index of element `8m + c`, i.e. directly the byte offset of its entry
//!   in a table of the 32 codebook values in order (one per bank,
//!   conflict-free).
//!
//! ## Table addresses (k ≤ 4, M = 1)
//!
//! The instances for one row ([`rows`]) use the *row layout*; the others
//! keep the *field layout*, field `f` at `128·f`, and multiply the field
//! byte by 128 for each lookup. In the row layout the table is made of
//! 256-byte rows. A field `f` lives in row
//! `f & 0x7f` (k = 2, 4: its 128 bytes of copies at `(f >> 7) · 128` in
//! the row) or `f` (k = 3: its copies fill the row); see
//! [`field_offset`]. A lookup address is therefore two bytes, the row and
//! the offset in the row, and the kernels keep them in two words per field
//! word ([`AddressWords`]): byte `m` of `row[q]` is the row of field `m` of
//! word `q`, byte `m` of `col[q]` its offset in the row plus the lane's copy
//! ([`copy_byte`]). One `prmt` with selector [`address_select`]`(m)`
//! joins them into the address, so a lookup costs one permute and one
//! shared load. [`pair_addresses`] and [`quad_addresses`] build the two
//! words from the planes with no more shifts and masks than the fields
//! themselves.
//!
//! # Work mapping
//!
//! A block owns [`BLOCK_COLS`] consecutive columns (two groups of 16) and
//! all of K, split over its `W` warps ([`warps`]). Lane `l` of a warp is
//! column `l / 2` of a group and quant-block half `h = l % 2` of a 64-wide
//! K tile: in the runtime layout the 16 columns of a group are 32
//! consecutive quant blocks of one K tile, so the warp's load of one group
//! is a single contiguous span of `32·k` words, and the lane's own block
//! starts `l·k` words into it.
//!
//! # Summation order (the numerics contract)
//!
//! For a column `n` and row `r`, with `W = warps(N, K)`: warp slot `w`
//! owns the K tiles `kt = w, w + W, w + 2W, …` and walks them in increasing
//! order. For each tile and each half `h` it forms the block dot product
//! `d = fma(cb[idx_e], x_e, d)` over the 32 elements `e` in increasing
//! order, starting from 0 (`x_e` is the activation widened to f32, 0 past
//! K), and folds it into the half's accumulator `a_h = fma(d, s_h, a_h)`,
//! where `s_h = e4m4::decode(scale)` of that block. The slot's partial is
//! `a_0 + a_1`; the output is `((p_0 + p_1) + p_2) + … + p_{W-1}`, rounded
//! to nearest even. Nothing here depends on M, on the launch geometry or on
//! the GPU, so the grouped kernel reproduces the dense one bit for bit.
//!
//! One exception, the pair sums below: at k = 2 and M = 1 the block dot
//! product of a half is `d = s_0 + s_1 + … + s_15` (added in increasing
//! `j`, starting from `s_0`) over its 16 element pairs, with
//! `s_j = fma(cb[idx_{2j+1}], x_{2j+1}, cb[idx_{2j}] · x_{2j})` (the product
//! rounded to f32); the rest is as above. The grouped kernel computes an
//! expert with one row in this order whatever its `max_m`, so it still
//! reproduces the dense call on that expert alone.
//!
//! # Pair sums (k = 2, M = 1)
//!
//! With one row, a table can hold the products themselves rather than the
//! codebook values: for every element pair `j` of every half of a K tile,
//! the 16 sums `s_j` of the pair's index combinations ([`sum_indices`]),
//! 2 KiB per tile ([`SUMS_TILE_BYTES`], built from the activations by each
//! block). A pair then costs one `prmt` (its address), one 4-byte lookup
//! and one add, where the codebook table costs a 16-byte lookup per four
//! elements and four FMAs, so half the shared-memory traffic. The table of
//! a tile is laid out so that the 32 lanes of a warp, all at pair `j` of
//! their own half, read 32 different banks ([`sum_offset`]). Byte `b` of
//! [`sum_words`] word `q` is the low byte of the address of pair
//! `4b + q`; [`sum_select`] puts it into the tile's base address (a
//! multiple of 256) and [`sum_row`] adds the rest.

use crate::tile;

/// Most stages of a warp's weight ring.
pub const MAX_STAGES: u32 = 8;

/// Largest number of rows (M) the scalar GEMV kernels take.
pub const MAX_M: usize = 4;

/// Bytes of one table row (k ≤ 4) in the row layout: one field of k = 3,
/// two of k = 2, 4.
pub const ROW_BYTES: u32 = 256;

/// Whether the instances for `m` rows look fields up through address words
/// in the row layout (module docs, "Table addresses"): M = 1. The two extra
/// words per field word cost registers, which at M ≥ 2 take several
/// instances past 64 (half the resident warps); those extract each field
/// byte and multiply it by 128 (the field layout), one instruction more
/// per lookup.
#[inline(always)]
pub const fn rows(m: u32) -> bool {
    m == 1
}

/// Copies of each field of the decode table (k ≤ 4): 8 quads (k = 2),
/// 16 pairs (k = 3, 4), or 32 pairs for k = 3 in the row layout (`rows`),
/// so that a field's copies fill 128 bytes, or a row for k = 3.
#[inline(always)]
pub const fn copies(bits: u32, rows: bool) -> u32 {
    match bits {
        2 => 8,
        3 if rows => 32,
        _ => 16,
    }
}

/// Bytes of one table entry: four f32 codebook values (k = 2), two (k =
/// 3, 4), one (k = 5).
#[inline(always)]
pub const fn entry_bytes(bits: u32) -> u32 {
    match bits {
        2 => 16,
        3 | 4 => 8,
        _ => 4,
    }
}

/// Bytes of all copies of one field (k ≤ 4): 128, or 256 for k = 3 in the
/// row layout.
#[inline(always)]
pub const fn field_bytes(bits: u32, rows: bool) -> u32 {
    copies(bits, rows) * entry_bytes(bits)
}

/// Byte offset of field `f`'s first copy in the table (k ≤ 4): `128·f` in
/// the field layout; in the row layout (module docs, "Table addresses") row
/// `f` for k = 3, row `f & 0x7f` and half `f >> 7` for k = 2, 4.
#[inline(always)]
pub const fn field_offset(bits: u32, rows: bool, f: u32) -> u32 {
    if !rows {
        f * 128
    } else if bits == 3 {
        f * ROW_BYTES
    } else {
        (f & 0x7f) * ROW_BYTES + (f >> 7) * (ROW_BYTES / 2)
    }
}

/// The byte offset of thread `t`'s copy inside a field (k ≤ 4), in each
/// byte of a word: copy `t % copies`, `copy · entry_bytes` (below 128,
/// or 256 for k = 3 in the row layout).
#[inline(always)]
pub const fn copy_byte(bits: u32, rows: bool, t: u32) -> u32 {
    (t % copies(bits, rows)) * entry_bytes(bits) * 0x0101_0101
}

/// `prmt` selector joining byte `m` of a row word (second operand) and of
/// a column word (first operand) into a table address: result byte 0 =
/// column byte `m`, byte 1 = row byte `m`, bytes 2, 3 = its sign, 0 (rows
/// are below 128).
#[inline(always)]
pub const fn address_select(m: u32) -> u32 {
    m | (4 + m) << 4 | (0xC + m) << 8 | (0xC + m) << 12
}

/// Column groups of 16 per block (compile-time: each lane keeps one
/// accumulator per group and row).
pub const COL_GROUPS: u32 = 2;

/// Output columns per block.
pub const BLOCK_COLS: u32 = 16 * COL_GROUPS;

/// Where a dense call of `col_blocks` column blocks on a persistent grid
/// of `virtual_blocks` (blocks × teams) splits off its last round:
/// `Some(whole)` when that round is partial and at most half full, i.e.
/// the grid computes column blocks `0 .. whole` and the remaining ones go
/// to a second launch as 16-column groups, one block each; `None` when
/// the whole rounds cover the matrix, or the last round keeps more than
/// half the grid busy. The kernels and the host apply it alike where
/// [`splits_last_round`].
///
/// Run by the grid, such a round leaves each busy SM one column block on
/// 16 warps, bound by the latency of its own chain rather than by the
/// memory stream (Llama-3-70B gate/up: 896 column blocks on 264 virtual
/// blocks leave 104 for a fourth round); as groups, twice the blocks take
/// half the work each, but the second launch pays its own prologue (the
/// decode table, the activations). A group is summed exactly as in a whole
/// column block (the summation order above), so the split does not change
/// a result.
///
/// ```
/// use kbit_format::gemv::split_last_round;
/// assert_eq!(split_last_round(896, 264), Some(792));
/// assert_eq!(split_last_round(792, 264), None); // whole rounds
/// assert_eq!(split_last_round(448, 264), None); // 184 of 264: more than half
/// assert_eq!(split_last_round(100, 264), None); // no whole round
/// ```
pub const fn split_last_round(col_blocks: u32, virtual_blocks: u32) -> Option<u32> {
    if virtual_blocks == 0 || col_blocks < virtual_blocks {
        return None;
    }
    let last = col_blocks % virtual_blocks;
    if last == 0 || 2 * last > virtual_blocks { None } else { Some(col_blocks - last) }
}

/// Whether a dense block-variant call of `m` rows at `bits` splits off its
/// last round ([`split_last_round`]): k = 2, M = 2. Not at M = 1, where the
/// pair sums ([`sums`]) would have the second launch build the tables of
/// all of K for 16 columns a block; not at k = 3..5, where the round is
/// shorter than the second launch's prologue and drain.
#[inline(always)]
pub const fn splits_last_round(bits: u32, m: u32) -> bool {
    bits == 2 && m == 2
}

/// Most warps (K slots) per block: 512 threads, so every instance must fit
/// in 128 registers.
pub const MAX_WARPS: u32 = 16;

/// f32 values of one staged half tile (32 activations) plus 4 of padding,
/// so that the two halves a warp reads at once lie in different banks.
pub const X_HALF_FLOATS: u32 = 36;

/// Codebook index of element `t` (0 or 1) of a pair field (k = 2, 3, 4):
/// bit `2j + t` of the field is bit `j` of the index.
#[inline(always)]
pub const fn pair_index(field: u32, t: u32, bits: u32) -> u32 {
    let mut idx = 0;
    let mut j = 0;
    while j < bits {
        idx |= ((field >> (2 * j + t)) & 1) << j;
        j += 1;
    }
    idx
}

/// Codebook index of element `t` (0..4) of a k = 2 quad field: the
/// elements are `8m, 8m+1, 8m+4, 8m+5` (word 0) or `8m+2, 8m+3, 8m+6,
/// 8m+7` (word 1); plane 0 of element `t` is bit `4·(t/2) + t%2`, plane 1
/// the bit two above.
#[inline(always)]
pub const fn quad_index(field: u32, t: u32) -> u32 {
    let b = 4 * (t / 2) + t % 2;
    ((field >> b) & 1) | ((field >> (b + 2)) & 1) << 1
}

/// Interleaves planes 0 and 1 in 2-bit chunks: nibble `i` of the first word
/// holds bits `4i, 4i + 1` of both planes (`[p0, p0, p1, p1]`), nibble `i`
/// of the second bits `4i + 2, 4i + 3`.
#[inline(always)]
fn interleave2(p0: u32, p1: u32) -> (u32, u32) {
    let lo = (p0 & 0x3333_3333) | ((p1 << 2) & 0xCCCC_CCCC);
    let hi = ((p0 >> 2) & 0x3333_3333) | (p1 & 0xCCCC_CCCC);
    (lo, hi)
}

/// Quad-field words of one block for k = 2 (planes 0 and 1; see
/// [`quad_index`]): the 2-bit interleave of the two planes, whose nibble
/// `i` holds the pair `(4i, 4i + 1)` (word 0) or `(4i + 2, 4i + 3)` (word 1).
#[inline(always)]
pub fn quad_words<const K: usize>(planes: &[u32; K]) -> [u32; 2] {
    let p = |j: usize| planes.get(j).copied().unwrap_or(0);
    let (a, b) = interleave2(p(0), p(1));
    [a, b]
}

/// Pair-field words of one block for k = 2, 3, 4 (`K` planes): byte `m` of
/// word `q` is the field of elements `(8m + 2q, 8m + 2q + 1)`, bit `2j + t`
/// = plane `j` of element `8m + 2q + t` (absent planes read as zero).
#[inline(always)]
pub fn pair_words<const K: usize>(planes: &[u32; K]) -> [u32; 4] {
    let p = |j: usize| planes.get(j).copied().unwrap_or(0);
    // a: pairs (4i, 4i+1) of planes 0-1 in nibble i; b: pairs (4i+2, 4i+3).
    let (a, b) = interleave2(p(0), p(1));
    if K <= 2 {
        return [a & 0x0F0F_0F0F, b & 0x0F0F_0F0F, (a >> 4) & 0x0F0F_0F0F, (b >> 4) & 0x0F0F_0F0F];
    }
    let (c, d) = interleave2(p(2), p(3));
    // Nibble 2m of (a, c) is pair (8m, 8m+1), nibble 2m+1 pair (8m+4, 8m+5);
    // (b, d) likewise for (8m+2, 8m+3) and (8m+6, 8m+7).
    let even = |x: u32, y: u32| (x & 0x0F0F_0F0F) | ((y << 4) & 0xF0F0_F0F0);
    let odd = |x: u32, y: u32| ((x >> 4) & 0x0F0F_0F0F) | (y & 0xF0F0_F0F0);
    [even(a, c), even(b, d), odd(a, c), odd(b, d)]
}

/// Field words of one block for k = 5 (up to 5 planes; absent ones read
/// as zero): byte `m` of word `c` is 4× the codebook index of element
/// `8m + c`, the byte offset of its entry in the table (bit `2 + j` of the
/// byte is plane `j` of the element).
///
/// Plane `j` rotated left by `2 + j` has bit `8m + c` at `8m + c + 2 + j`
/// (mod 32) for every `j`, so word `c` takes, from each rotated plane, the
/// bits at `8m + 2 + j + c` (one AND-OR with a constant mask), and one
/// rotation right by `c` puts them at `8m + 2 + j`: 5 rotations and about 6
/// instructions a word.
///
/// ```
/// use kbit_format::gemv::wide_words;
/// // Element 9 (byte 1 of word 1) has index 0b10110: planes 1, 2, 4.
/// let planes = [0, 1 << 9, 1 << 9, 0, 1 << 9];
/// assert_eq!(wide_words(&planes)[1], (4 * 0b10110) << 8);
/// ```
#[inline(always)]
pub fn wide_words<const K: usize>(planes: &[u32; K]) -> [u32; 8] {
    let q: [u32; 5] = core::array::from_fn(|j| planes.get(j).copied().unwrap_or(0).rotate_left(2 + j as u32));
    core::array::from_fn(|c| {
        let mut w = 0;
        for (j, &qj) in q.iter().enumerate() {
            w |= qj & (0x0101_0101u32 << (2 + j)).rotate_left(c as u32);
        }
        w.rotate_right(c as u32)
    })
}

/// Table-address words of one block (k ≤ 4; module docs, "Table
/// addresses"): for field word `q`, `row[q]` holds the rows and `col[q]`
/// the in-row offsets (with the lane's copy) of its four fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressWords<const Q: usize> {
    /// Byte `m`: the row of field `m` (below 128).
    pub row: [u32; Q],
    /// Byte `m`: the field's offset in its row plus the copy offset.
    pub col: [u32; Q],
}

/// The fields of [`pair_words`] as table addresses (k = 3, 4); `copy` is
/// [`copy_byte`] of the thread. k = 4: a field's row is its bits 0..6 and
/// bit 7 selects the half row; k = 3 fields (6 bits) are whole rows.
#[inline(always)]
pub fn pair_addresses<const K: usize>(planes: &[u32; K], copy: u32) -> AddressWords<4> {
    let p = |j: usize| planes.get(j).copied().unwrap_or(0);
    let (a, b) = interleave2(p(0), p(1));
    let (c, d) = interleave2(p(2), p(3));
    // As in `pair_words`, with bit 7 of each field (plane 3 of the pair's
    // second element) moved from the row word to the column word.
    let (c4, d4) = (c << 4, d);
    let row = [
        (a & 0x0F0F_0F0F) | (c4 & 0x7070_7070),
        (b & 0x0F0F_0F0F) | ((d << 4) & 0x7070_7070),
        ((a >> 4) & 0x0F0F_0F0F) | (c & 0x7070_7070),
        ((b >> 4) & 0x0F0F_0F0F) | (d4 & 0x7070_7070),
    ];
    let half = [c4, d << 4, c, d4].map(|v| v & 0x8080_8080);
    AddressWords { row, col: half.map(|h| h | copy) }
}

/// The fields of [`quad_words`] as table addresses (k = 2): row = bits
/// 0..6 of the field, bit 7 the half row; `copy` is [`copy_byte`].
#[inline(always)]
pub fn quad_addresses<const K: usize>(planes: &[u32; K], copy: u32) -> AddressWords<2> {
    let p = |j: usize| planes.get(j).copied().unwrap_or(0);
    let (p0, p1) = (p(0), p(1));
    let p1s = p1 << 2;
    AddressWords {
        row: [(p0 & 0x3333_3333) | (p1s & 0x4C4C_4C4C), ((p0 >> 2) & 0x3333_3333) | (p1 & 0x4C4C_4C4C)],
        col: [(p1s & 0x8080_8080) | copy, (p1 & 0x8080_8080) | copy],
    }
}

/// Whether the block-variant instances for `m` rows at `bits` use pair-sum
/// tables instead of the codebook table (module docs, "Pair sums"): k = 2,
/// M = 1.
#[inline(always)]
pub const fn sums(bits: u32, m: u32) -> bool {
    bits == 2 && m == 1
}

/// Bytes of one K tile's pair-sum table: 2 halves × 16 pairs × 16 sums of
/// 4 bytes.
pub const SUMS_TILE_BYTES: u32 = 2048;

/// Byte offset in a tile's pair-sum table of the sum for nibble `n` of pair
/// `j` (0..16) of half `h`: the pairs `2i, 2i + 1` share a 256-byte row,
/// each pair 128 bytes of it, each half 64 of those. Lane `l` of a warp
/// works on half `l % 2`, so at one pair the two halves' 16-entry tables
/// fill the 32 banks once and a lookup never conflicts.
#[inline(always)]
pub const fn sum_offset(j: u32, h: u32, n: u32) -> u32 {
    256 * (j >> 1) + 128 * (j & 1) + 64 * h + 4 * n
}

/// Codebook indices of the two elements of a pair-sum nibble: bits
/// `[plane 0 of element 0, plane 0 of element 1, plane 1 of element 0,
/// plane 1 of element 1]` (the nibbles of `interleave2`).
#[inline(always)]
pub const fn sum_indices(n: u32) -> (u32, u32) {
    (quad_index(n, 0), quad_index(n, 1))
}

/// Pair-sum address words of one block (k = 2) of half `h`: byte `b` of
/// word `q` is the low byte of [`sum_offset`]`(j, h, n_j)` for pair
/// `j = 4b + q` (its nibble times 4, the half's and the pair's bit).
///
/// ```
/// use kbit_format::gemv::{sum_offset, sum_row, sum_words, sum_indices};
/// // Element e has index e % 4: plane 0 = e & 1, plane 1 = (e >> 1) & 1.
/// let planes = [0xAAAA_AAAA, 0xCCCC_CCCC];
/// let w = sum_words::<2>(&planes, 1);
/// for j in 0..16u32 {
///     let at = ((w[(j % 4) as usize] >> (8 * (j / 4))) & 0xFF) + sum_row(j);
///     let n = (at % 64) / 4;
///     assert_eq!(sum_indices(n), ((2 * j) % 4, (2 * j + 1) % 4));
///     assert_eq!(at, sum_offset(j, 1, n));
/// }
/// ```
#[inline(always)]
pub fn sum_words<const K: usize>(planes: &[u32; K], h: u32) -> [u32; 4] {
    let p = |j: usize| planes.get(j).copied().unwrap_or(0);
    // lo: nibble i is pair 2i; hi: pair 2i + 1.
    let (lo, hi) = interleave2(p(0), p(1));
    let even = 0x4040_4040 * (h & 1);
    let odd = even | 0x8080_8080;
    [
        ((lo << 2) & 0x3C3C_3C3C) | even,
        ((hi << 2) & 0x3C3C_3C3C) | odd,
        ((lo >> 2) & 0x3C3C_3C3C) | even,
        ((hi >> 2) & 0x3C3C_3C3C) | odd,
    ]
}

/// `prmt` selector for pair `j`: byte `j / 4` of its [`sum_words`] word
/// (first operand) as byte 0, bytes 1..3 of the tile's base address
/// (second operand, a multiple of 256) above it.
#[inline(always)]
pub const fn sum_select(j: u32) -> u32 {
    (j >> 2) | 0x7650
}

/// The part of pair `j`'s [`sum_offset`] above its low byte: `256·(j / 2)`.
#[inline(always)]
pub const fn sum_row(j: u32) -> u32 {
    256 * (j >> 1)
}

/// Number of fields of the k-bit decode table: 256 quads for k = 2, `4^k`
/// pairs for k = 3, 4, 32 single values for k = 5.
#[inline(always)]
pub const fn table_fields(bits: u32) -> u32 {
    match bits {
        2 => 256,
        3 | 4 => 1 << (2 * bits),
        _ => 32,
    }
}

/// Bytes of the decode table of the instances for `m` rows at the start of
/// dynamic shared memory (a multiple of 16): [`field_bytes`] per field for
/// k ≤ 4 (32 KiB for k = 2, 4; 8 KiB for k = 3, 16 KiB in the row
/// layout), 4 per value for k = 5.
#[inline(always)]
pub const fn table_bytes(bits: u32, m: u32) -> u32 {
    if bits <= 4 { table_fields(bits) * field_bytes(bits, rows(m)) } else { 32 * 4 }
}

/// f32 values per staged K tile of activations: `M` rows of two padded
/// halves (`[row][h][36]`).
#[inline(always)]
pub const fn x_tile_floats(m: u32) -> u32 {
    2 * X_HALF_FLOATS * m
}

/// Bytes of the codebook table of the block variant: [`table_bytes`], or
/// none with pair sums ([`sums`]), which build their tables from the
/// activations instead.
#[inline(always)]
pub const fn block_table_bytes(bits: u32, m: u32) -> u32 {
    if sums(bits, m) { 0 } else { table_bytes(bits, m) }
}

/// Bytes per K tile of what the block variant stages from the activations:
/// [`x_tile_floats`] f32 values, or a tile's pair-sum table ([`sums`]).
#[inline(always)]
pub const fn x_tile_bytes(bits: u32, m: u32) -> u32 {
    if sums(bits, m) { SUMS_TILE_BYTES } else { x_tile_floats(m) * 4 }
}

/// Whether a `[n, k]` matrix takes the column-slot variant
/// ([`crate::gemv_slots`]) rather than the block variant of this module:
/// matrices of fewer than 2^25 weights (the Qwen3-size dense and MoE
/// layers), where the column-slot variant spreads better over the GPU and
/// pays less per-block setup; larger ones (Llama-size) stream faster
/// through the block variant. It depends on the shape alone, so dense and
/// grouped calls of one shape sum in the same order.
pub const fn uses_slots(n: usize, k: usize) -> bool {
    n.saturating_mul(k) < 1 << 25
}

/// Number of warps (K slots) per block, `W`: the smallest power of two
/// that covers the K tiles, at most [`MAX_WARPS`]. It depends only on the
/// shape, so it fixes the summation order (module docs).
pub const fn warps(k: usize) -> u32 {
    let k_tiles = tile::k_tiles(k);
    let mut w = 1u32;
    while w < MAX_WARPS && (w as usize) < k_tiles {
        w *= 2;
    }
    w
}

/// Bytes of one stage of a warp's weight ring at bit width `bits`: the
/// block's plane span of one K tile (`64·k` words, `16k` chunks of 16
/// bytes) plus one chunk of alignment slack, then its 64 scale bytes plus
/// one chunk of slack (both are copied from the 16-byte boundary at or
/// below their start).
#[inline(always)]
pub const fn stage_bytes(bits: u32) -> u32 {
    (16 * bits + 1 + 5) * 16
}

/// Offset of the scale bytes inside a stage.
#[inline(always)]
pub const fn stage_scales(bits: u32) -> u32 {
    (16 * bits + 1) * 16
}

/// Launch geometry of one GEMV call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// log2 of the warps (K slots) per block (`W`).
    pub log_warps: u32,
    /// log2 of the loop iterations whose activations are staged at once (`R`).
    pub log_chunk: u32,
    /// Stages of each warp's weight ring (`S`, 2..=8; not a log).
    pub stages: u32,
    /// log2 of the teams per block (`H`): teams of `W` warps share the
    /// decode table and the activations (staged once, all of K), each
    /// working through its own column blocks with its own rings and
    /// reduction buffer. `H > 1` only with all of K staged at once, or
    /// with pair sums.
    pub log_teams: u32,
}

impl Geometry {
    /// Warps (K slots) per block.
    pub const fn warps(&self) -> u32 {
        1 << self.log_warps
    }
    /// Loop iterations per staged chunk of activations.
    pub const fn chunk(&self) -> u32 {
        1 << self.log_chunk
    }
    /// Stages of each warp's weight ring.
    pub const fn stages(&self) -> u32 {
        self.stages
    }
    /// Teams of `W` warps per block.
    pub const fn teams(&self) -> u32 {
        1 << self.log_teams
    }
    /// Threads per block: `H` teams of `W` warps.
    pub const fn threads(&self) -> u32 {
        32 * self.warps() * self.teams()
    }
    /// The one `u32` kernel argument:
    /// `log_warps | log_chunk << 8 | stages << 16 | log_teams << 24`.
    pub const fn pack(&self) -> u32 {
        self.log_warps | self.log_chunk << 8 | self.stages << 16 | self.log_teams << 24
    }
    /// Inverse of [`Geometry::pack`].
    #[inline(always)]
    pub const fn unpack(g: u32) -> Self {
        Self { log_warps: g & 0xFF, log_chunk: (g >> 8) & 0xFF, stages: (g >> 16) & 0xFF, log_teams: g >> 24 }
    }
    /// Offset of the reduction buffers (per team `W·M·BLOCK_COLS` floats of
    /// warp partials, [`Geometry::red_bytes`] apart): after the decode table
    /// and the staged activations (`R·W` tiles), which may stay resident
    /// across column blocks.
    pub const fn red_offset(&self, bits: u32, m: u32) -> u32 {
        block_table_bytes(bits, m) + self.chunk() * self.warps() * x_tile_bytes(bits, m)
    }
    /// Bytes of one team's reduction buffer.
    pub const fn red_bytes(&self, m: u32) -> u32 {
        self.warps() * m * BLOCK_COLS * 4
    }
    /// Bytes before the weight rings: the table, the staged activations and
    /// the teams' reduction buffers.
    pub const fn ring_offset(&self, bits: u32, m: u32) -> u32 {
        self.red_offset(bits, m) + self.teams() * self.red_bytes(m)
    }
    /// Dynamic shared memory in bytes for `m` rows at bit width `bits`:
    /// [`Geometry::ring_offset`], then one ring of `S` stages
    /// ([`stage_bytes`]) per warp of every team.
    pub const fn smem_bytes(&self, bits: u32, m: u32) -> u32 {
        self.ring_offset(bits, m) + self.teams() * self.warps() * self.stages() * stage_bytes(bits)
    }
    /// Bytes of the accumulator slots of a block that computes `items`
    /// column blocks with pair sums ([`sums`]) in more than one chunk:
    /// there the block walks all its column blocks for one chunk of K
    /// before the next (so each chunk's table is built once), and a
    /// thread's [`COL_GROUPS`] accumulators of column block `i` wait in slot
    /// `i` between chunks, at [`Geometry::smem_bytes`] past the base,
    /// `[i][group][thread]` f32.
    pub const fn sums_slot_bytes(&self, items: u32) -> u32 {
        items * COL_GROUPS * self.threads() * 4
    }
}
