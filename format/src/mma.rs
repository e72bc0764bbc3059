//! Geometry of the tensor-core dequant GEMM (kernel 2), shared by the host
//! (launch planning, shared-memory sizes) and the device (offsets, thread
//! maps), so that both sides agree by construction.
//!
//! A block has [`THREADS`] = 256 threads (8 warps) and owns an output tile of
//! `16·MB` rows × `TILE_N = 32·NF` columns (`MB` m16 blocks, `NF` n8
//! fragments per warp). Warp `w` multiplies K half `w / 4` (quant block
//! `h` of each 64-wide K tile) for column group `w % 4` (`8·NF` columns).
//!
//! Dynamic shared memory, in order (all offsets 16-byte aligned):
//!
//! ```text
//! [ table  | misc 64 B | epilogue | stage 0 | stage 1 | ... | stage S-1 ]
//! table:    codebook lookup, 4^k pair entries, C = table_copies(k, MB) copies
//!           of each: word e·C + lane % C (byte address e·4C + 4·(lane % C):
//!           one `prmt` per lookup, see pair_words); C = 32 for k <= 4 (one
//!           copy per lane: conflict-free lookups), 4 for k = 5 from two m
//!           blocks on. k = 5 at one m block: 4^4 entries of 8 bytes, 16
//!           copies (see splits_low_bit); the K-slot and warpgroup
//!           kernels' layout (PAIRS): 8 copies of the 4^5 pair entries
//! misc:     the split-K "last block" flag (bytes 0..4); the grouped kernel
//!           parks its unit's six base pointers in bytes 16..64
//! epilogue: 16·MB × TILE_N f32, K-half reduction in fragment order
//! stage:    KT tile slots [ slot 0 | slot 1 | ... | slot KT-1 ], slot j holds
//!           K tile kt + j of the stage (kt = the stage's first tile)
//! slot:     [ A: 16·MB rows × 128 B (XOR-swizzled) | W: plane words | S: scale bytes ]
//! ```
//!
//! A stage carries `KT` ([`MIN_STAGE_TILES`]..=[`MAX_STAGE_TILES`]) K tiles
//! between two block barriers; the host chooses `KT` and the stage count `S`
//! per launch so that `S · KT` slots fit the instance's shared memory
//! (`smem_bytes(mb, nf, bits, S, KT)`). Offsets inside a slot
//! ([`a_offset`], [`w_offset`], [`s_offset`]) do not depend on `KT`; slot
//! `j` of a stage starts `j · tile_bytes` after the stage.

/// Threads per block.
pub const THREADS: u32 = 256;
/// Column groups (warps along N); the other factor 2 of the 8 warps is the K half.
pub const COL_GROUPS: u32 = 4;
/// Fewest pipeline stages.
pub const MIN_STAGES: u32 = 2;
/// Most pipeline stages (the kernel's wait-group switch covers this many).
pub const MAX_STAGES: u32 = 12;
/// Fewest K tiles per stage.
pub const MIN_STAGE_TILES: u32 = 1;
/// Most K tiles per stage (`KT`).
pub const MAX_STAGE_TILES: u32 = 4;
/// Most K-tile slots a launch uses: [`MAX_STAGES`] × [`MAX_STAGE_TILES`].
pub const MAX_TILE_SLOTS: u32 = MAX_STAGES * MAX_STAGE_TILES;
/// Largest M (rows of activations): 4 m16 blocks.
pub const MAX_M: u32 = 64;
/// Bytes of one activation row of a K tile (64 values of 2 bytes).
pub const A_ROW_BYTES: u32 = 128;
/// Bytes of the misc region.
pub const MISC_BYTES: u32 = 64;

/// Output columns of a block tile.
#[inline(always)]
pub const fn tile_n(nf: u32) -> u32 {
    8 * nf * COL_GROUPS
}

/// The table layout of the K-slot and warpgroup kernels, passed where the
/// pipelined kernel passes its m blocks: the one-m-block layout, without
/// the split of [`splits_low_bit`] (k = 5: 8 copies of the 4^5 pair
/// entries, 32 KiB). At k = 5 the split table made the
/// pipelined kernel 5-10 % faster (H200: Llama-3-70B and -8B, `moe_dn` ×8
/// grouped, M = 5..16) but the K-slot kernel 3-7 % slower on the Qwen3
/// dense shapes (`gate/up` +7 %) and the warpgroup GEMM 10 % slower at
/// M = 128.
pub const PAIRS: u32 = 0;

/// Whether the table of a `bits`-bit weight at `mb` m blocks splits off
/// the low index bit (k = 5 at one m block of the pipelined kernel; not
/// [`PAIRS`]): an entry is then addressed by
/// the upper k − 1 bits of the pair's two indices and holds 8 bytes, the
/// pair's values with both low bits 0 (word 0) and both 1 (word 1); one
/// `prmt` per lookup picks each half from the word its low bit names
/// ([`low_bit_selects`]). 16 copies of 8 bytes give each lane of a half
/// warp its own two banks, so a 64-bit lookup takes the two wavefronts of
/// its 256 bytes, where 8 copies of the 4^5-entry table took ≈ 3 for half
/// the bytes, in the same 32 KiB.
#[inline(always)]
pub const fn splits_low_bit(bits: u32, mb: u32) -> bool {
    bits == 5 && mb == 1
}

/// Index bits of an element that address the table: k, or k − 1 where the
/// low bit is split off ([`splits_low_bit`]).
#[inline(always)]
pub const fn table_index_bits(bits: u32, mb: u32) -> u32 {
    bits - splits_low_bit(bits, mb) as u32
}

/// Bytes of one copy of an entry: a pair of values (4), or two pairs where
/// the low bit is split off (8).
#[inline(always)]
pub const fn entry_bytes(bits: u32, mb: u32) -> u32 {
    if splits_low_bit(bits, mb) { 8 } else { 4 }
}

/// Entries of the lookup table: one per pair of table indices
/// ([`table_index_bits`]), 4^k or 4^(k − 1).
#[inline(always)]
pub const fn table_entries(bits: u32, mb: u32) -> u32 {
    1 << (2 * table_index_bits(bits, mb))
}

/// Copies of each table entry ([`entry_bytes`] each); lane l reads copy
/// `l % copies`. With 32 (one per lane) 32 lanes with arbitrary indices hit
/// 32 distinct banks: k = 2, 3 (2, 8 KiB) and k = 4 (32 KiB) except at two
/// m blocks. With C copies the 32/C lanes of a copy share 32/C banks: a
/// lookup costs ≈ 2 shared-memory wavefronts for C = 16, ≈ 3 for C = 8,
/// ≈ 3.3 for C = 4, and the table is smaller, which leaves more shared
/// memory for pipeline stages. One m block dequantizes for 16 rows and is
/// bound by its lookups; more m blocks spend more per weight on mma and
/// prefer the deeper pipeline. Measured on Llama-3-70B gate/up (H100):
/// - k = 5 (one copy per lane would take 128 KiB): 8 copies (32 KiB) at one
///   m block, 2 % faster than 4 there; 4 copies (16 KiB) from two m blocks
///   on, 4 % faster at M = 32 and 10 % at M = 64. Either is 5-15 % faster
///   than two single-index lookups per pair. One m block of the pipelined
///   kernel now takes the split table of [`splits_low_bit`] (16 copies of
///   8 bytes, 32 KiB); the K-slot and warpgroup kernels ([`PAIRS`]) keep
///   the 8 copies of 4 bytes.
/// - k = 4, two m blocks: 16 copies, 5-10 % faster at M = 17..32. At three
///   m blocks 16 copies made 70B 17 % faster but the design shapes and
///   Llama-3-8B 2-5 % slower; at four, no faster.
#[inline(always)]
pub const fn table_copies(bits: u32, mb: u32) -> u32 {
    match (bits, mb) {
        (5, 1) => 16,
        (5, PAIRS) => 8,
        (5, _) => 4,
        (4, 2) => 16,
        _ => 32,
    }
}

/// Bytes of the lookup table: entries × copies × entry bytes.
#[inline(always)]
pub const fn table_bytes(bits: u32, mb: u32) -> u32 {
    table_entries(bits, mb) * table_copies(bits, mb) * entry_bytes(bits, mb)
}

/// Bytes of the epilogue buffer: 16·MB × TILE_N f32.
#[inline(always)]
pub const fn epi_bytes(mb: u32, nf: u32) -> u32 {
    16 * mb * tile_n(nf) * 4
}

/// Offset of the misc region.
#[inline(always)]
pub const fn misc_offset(bits: u32, mb: u32) -> u32 {
    table_bytes(bits, mb)
}

/// Offset of the epilogue buffer.
#[inline(always)]
pub const fn epi_offset(bits: u32, mb: u32) -> u32 {
    misc_offset(bits, mb) + MISC_BYTES
}

/// Offset of stage 0, on a 128-byte line (see [`tile_bytes`]).
#[inline(always)]
pub const fn stages_offset(mb: u32, nf: u32, bits: u32) -> u32 {
    (epi_offset(bits, mb) + epi_bytes(mb, nf)).next_multiple_of(128)
}

/// Bytes of a slot's activation tile (16·MB rows of 64 values).
#[inline(always)]
pub const fn a_bytes(mb: u32) -> u32 {
    16 * mb * A_ROW_BYTES
}

/// 16-byte chunks of a slot's activation tile.
#[inline(always)]
pub const fn a_chunks(mb: u32) -> u32 {
    a_bytes(mb) / 16
}

/// 16-byte chunks of a slot's weight planes: TILE_N columns × 2 blocks × k
/// words, plus one chunk when k is odd (the span may start 8 bytes into a
/// chunk: see [`w_window`]).
#[inline(always)]
pub const fn w_chunks(nf: u32, bits: u32) -> u32 {
    w_span_chunks(nf, bits) + (bits & 1)
}

/// 16-byte chunks of a slot's scale bytes: TILE_N × 2 bytes plus one chunk
/// for a span that starts inside a chunk.
#[inline(always)]
pub const fn s_chunks(nf: u32) -> u32 {
    s_span_chunks(nf) + 1
}

/// 16-byte chunks of a slot's weight planes that lie inside the window of a
/// full tile (TILE_N valid columns): the whole plane span, `8·k` bytes per
/// column. With odd k the last chunk of [`w_chunks`] follows them: it holds
/// the first `w_window`'s offset (0 or 8) bytes past the span.
#[inline(always)]
pub const fn w_span_chunks(nf: u32, bits: u32) -> u32 {
    tile_n(nf) * bits / 2
}

/// 16-byte chunks of a slot's scale bytes inside the window of a full tile
/// (2 bytes per column); the last chunk of [`s_chunks`] follows them and
/// holds the window's offset (0..16) bytes.
#[inline(always)]
pub const fn s_span_chunks(nf: u32) -> u32 {
    tile_n(nf) / 8
}

/// Threads along the chunk axis of the copy grid of a part with `chunks`
/// 16-byte chunks per slot: the largest power of two ≤ `min(chunks, THREADS)`.
///
/// The copies of one stage part (the `len × chunks` chunks of its `len` ≤ KT
/// slots) are shared by the [`THREADS`] threads as a grid of
/// [`copy_slot_threads`] slot rows × `copy_chunk_threads` chunk columns:
/// thread `t` starts at [`copy_start`]`(t)` = (slot `j0`, chunk `c0`) and
/// copies chunks `c0 + cols·q` (q < [`copy_chunk_rounds`], while < `chunks`)
/// of slots `j0 + rows·p` (p < [`copy_slot_rounds`], while < `len` ≤
/// [`copy_stage_tiles`]), so that
/// its slots and chunks step by constants.
#[inline(always)]
pub const fn copy_chunk_threads(chunks: u32) -> u32 {
    let c = if chunks < THREADS { chunks } else { THREADS };
    if c == 0 { 1 } else { 1 << (31 - c.leading_zeros()) }
}

/// Threads along the slot axis of the copy grid: `THREADS / cols`.
#[inline(always)]
pub const fn copy_slot_threads(chunks: u32) -> u32 {
    THREADS / copy_chunk_threads(chunks)
}

/// Chunk steps of one thread per slot (1 or 2: `cols > chunks / 2`).
#[inline(always)]
pub const fn copy_chunk_rounds(chunks: u32) -> u32 {
    chunks.div_ceil(copy_chunk_threads(chunks))
}

/// Whether the instance (`mb` m blocks, `nf` fragments) runs
/// wide stages: 4 K tiles of 128 columns between barriers (128 weights per
/// thread), in as few as 2 stages, where the others plan 256 tile columns
/// (64 weights per thread) in at least 3. One or two m blocks, 128
/// columns, every k: a stage costs these instances about 110 warp
/// instructions besides its tiles' ≈ 115 each (one m block, k = 4: the
/// wait, the barrier, the copy issue, the cursor), and halving the stages
/// (with stream-K on the large matrices at one m block) took Llama-3-70B
/// gate/up at M = 4..16 from 72 to 61 µs at k = 4, 69 to 60 at k = 3, 72
/// to 52 at k = 2 and 111 to 90 at k = 5, and Llama-3-8B gate/up at
/// M = 17..32 from 28–42 to 22–36 µs (sm_90). Not from three m blocks,
/// whose shared memory holds fewer than two stages of 4 at two blocks
/// per SM.
#[inline(always)]
pub const fn wide_stages(mb: u32, nf: u32) -> bool {
    mb <= 2 && tile_n(nf) == 128
}

/// The most K tiles per stage that the copy grid of an instance covers:
/// `256 / TILE_N` (4 at TILE_N 64, 2 at 128), or 4 with [`wide_stages`];
/// the largest KT the host plans. Stages of a larger KT (only on request)
/// take the kernel's edge copies.
#[inline(always)]
pub const fn copy_stage_tiles(mb: u32, nf: u32) -> u32 {
    let kt = if wide_stages(mb, nf) { MAX_STAGE_TILES } else { THREADS / tile_n(nf) };
    if kt > MAX_STAGE_TILES { MAX_STAGE_TILES } else { kt }
}

/// Slot steps of one thread per stage, enough for `stage_tiles` slots.
#[inline(always)]
pub const fn copy_slot_rounds(chunks: u32, stage_tiles: u32) -> u32 {
    stage_tiles.div_ceil(copy_slot_threads(chunks))
}

/// Thread `tid`'s first (slot, chunk) in the copy grid of a part with
/// `chunks` chunks per slot.
#[inline(always)]
pub const fn copy_start(tid: u32, chunks: u32) -> (u32, u32) {
    let cols = copy_chunk_threads(chunks);
    (tid / cols, tid % cols)
}

/// Offset of the weight planes inside a slot.
#[inline(always)]
pub const fn w_offset(mb: u32) -> u32 {
    a_bytes(mb)
}

/// Offset of the scale bytes inside a slot, on a 128-byte line.
#[inline(always)]
pub const fn s_offset(mb: u32, nf: u32, bits: u32) -> u32 {
    (a_bytes(mb) + 16 * w_chunks(nf, bits)).next_multiple_of(128)
}

/// Bytes of one K-tile slot, a multiple of 128: with stage 0 on a
/// 128-byte line every part of every slot (A, W, S) starts on one, so a
/// warp's 16-byte `cp.async` chunks from a line-aligned global span fill
/// whole shared-memory lines (a destination straddling lines costs about
/// twice the wavefronts).
#[inline(always)]
pub const fn tile_bytes(mb: u32, nf: u32, bits: u32) -> u32 {
    (s_offset(mb, nf, bits) + 16 * s_chunks(nf)).next_multiple_of(128)
}

/// Bytes of one pipeline stage of `kt` K tiles.
#[inline(always)]
pub const fn stage_bytes(mb: u32, nf: u32, bits: u32, kt: u32) -> u32 {
    kt * tile_bytes(mb, nf, bits)
}

/// Dynamic shared memory of a launch with `stages` stages of `kt` K tiles.
#[inline(always)]
pub const fn smem_bytes(mb: u32, nf: u32, bits: u32, stages: u32, kt: u32) -> u32 {
    stages_offset(mb, nf, bits) + stages * stage_bytes(mb, nf, bits, kt)
}

/// f32 values of one split's partial tile in the split-K workspace.
#[inline(always)]
pub const fn slot_f32(mb: u32, nf: u32) -> u32 {
    16 * mb * tile_n(nf)
}

/// Byte offset of activation (row, 16-byte chunk) in a slot's A tile: rows
/// of 128 bytes, chunk `c` stored at `c ^ (row % 8)`, so the 8 rows an
/// `ldmatrix` phase reads (and the rows a warp's `cp.async` writes) fall in
/// distinct bank groups.
#[inline(always)]
pub const fn a_offset(row: u32, chunk: u32) -> u32 {
    row * A_ROW_BYTES + ((chunk ^ (row & 7)) << 4)
}

/// `ldmatrix.x4` source row for `lane` in m16 block `mb`: lanes 0-7 and
/// 16-23 address rows 0-7, lanes 8-15 and 24-31 rows 8-15, which yields the
/// mma A fragment a0..a3 = (rows 0-7 | 8-15) × (k 0-7 | 8-15).
#[inline(always)]
pub const fn ldmatrix_row(mb: u32, lane: u32) -> u32 {
    16 * mb + (lane & 15)
}

/// `ldmatrix.x4` source chunk (8 columns) for `lane` in k16 step `kstep`
/// (0..4 inside the K tile): lanes 16-31 take the upper 8 columns.
#[inline(always)]
pub const fn ldmatrix_chunk(kstep: u32, lane: u32) -> u32 {
    2 * kstep + (lane >> 4)
}

/// `ldmatrix.x2` source row for `lane` when M ≤ 8 (rows 8-15 of the m16
/// block are zero): lanes 0-7 and 8-15 both address rows 0-7, which yields
/// the A registers a0 and a2 (a1 = a3 = 0), which are also the B registers
/// b0, b1 of these rows as the B operand ([`swapped_c_pos`]). Lanes 16-31 repeat lanes 0-15
/// (`ldmatrix.x2` reads only the addresses of lanes 0-15).
#[inline(always)]
pub const fn ldmatrix_x2_row(lane: u32) -> u32 {
    lane & 7
}

/// `ldmatrix.x2` source chunk for `lane` in k16 step `kstep`: lanes 8-15
/// take the upper 8 columns.
#[inline(always)]
pub const fn ldmatrix_x2_chunk(kstep: u32, lane: u32) -> u32 {
    2 * kstep + ((lane >> 3) & 1)
}

/// K half (quant block h of the K tile) that warp `warp` multiplies.
#[inline(always)]
pub const fn warp_k_half(warp: u32) -> u32 {
    warp >> 2
}

/// Column group of warp `warp`.
#[inline(always)]
pub const fn warp_col_group(warp: u32) -> u32 {
    warp & 3
}

/// Tile column of the B fragment `f` that `lane` of a warp in column group
/// `cg` dequantizes (mma B map: lane holds column `lane / 4`).
#[inline(always)]
pub const fn b_col(nf: u32, cg: u32, f: u32, lane: u32) -> u32 {
    cg * 8 * nf + 8 * f + (lane >> 2)
}

/// Element (0..32) of the quant block that `lane` holds in byte `q` (0..4)
/// of its plane view, `e` = 0 (low half of the b register) or 1 (high half).
///
/// Byte q = 2·s + r holds the pair for k16 step `s` of the block (k steps
/// 2h and 2h+1 of the tile) in register `b_r`: mma B map b0 = k (2t, 2t+1),
/// b1 = k (2t+8, 2t+9) with t = lane % 4.
#[inline(always)]
pub const fn b_elem(lane: u32, q: u32, e: u32) -> u32 {
    8 * q + 2 * (lane & 3) + e
}

/// Row of accumulator value `i` (0..4) of m16 block `mb` (mma C map: c0, c1
/// in row lane / 4, c2, c3 eight rows below).
#[inline(always)]
pub const fn c_row(mb: u32, lane: u32, i: u32) -> u32 {
    16 * mb + (lane >> 2) + 8 * (i >> 1)
}

/// Tile column of accumulator value `i` of fragment `f` (c0, c2 in column
/// 2·(lane % 4), c1, c3 one to the right).
#[inline(always)]
pub const fn c_col(nf: u32, cg: u32, f: u32, lane: u32, i: u32) -> u32 {
    cg * 8 * nf + 8 * f + 2 * (lane & 3) + (i & 1)
}

/// With at most 8 activation rows the kernels swap the mma operands: the
/// dequantized weights of fragments `2p` and `2p + 1` are the A operand
/// (a0 = b0 of fragment 2p, a1 = b0 of 2p + 1, a2 = b1 of 2p, a3 = b1 of
/// 2p + 1: A rows g and g + 8 are the two fragments' columns g), and the
/// activation rows 0-7 from `ldmatrix.x2` are the B operand (b0, b1 = the
/// registers the x2 load returns). One mma then covers 16 columns and 8
/// rows with no zero rows. Accumulator value `i` of pair `p` in `lane`
/// holds (activation row, column within the warp's `8·nf` columns)
/// `(2·(lane % 4) + i % 2, 16p + 8·(i / 2) + lane / 4)`.
#[inline(always)]
pub const fn swapped_c_pos(p: u32, lane: u32, i: u32) -> (u32, u32) {
    (2 * (lane & 3) + (i & 1), 16 * p + 8 * (i >> 1) + (lane >> 2))
}

/// Where the value that the unswapped C map ([`c_row`], [`c_col`]) puts in
/// register `e` (0, 1) of fragment `f` of `lane` lies in the swapped
/// accumulators ([`swapped_c_pos`]): `(source lane, register of pair f / 2)`.
/// Row `lane / 4`, column `8f + 2·(lane % 4) + e` is held by the lane whose
/// `lane % 4` is half the row and whose `lane / 4` is the column in its
/// fragment, in the register of fragment `f % 2` and row parity.
#[inline(always)]
pub const fn swapped_source(f: u32, lane: u32, e: u32) -> (u32, u32) {
    let (g, t) = (lane >> 2, lane & 3);
    (4 * (2 * t + e) + (g >> 1), 2 * (f & 1) + (g & 1))
}

/// The weight bytes a block stages for K tile `kt` and columns
/// `n0 .. n0 + n_valid` of an `N`-column matrix with `bits`-bit planes:
/// `(aligned start, offset of the first column inside the window, end)`,
/// all in bytes from the start of the plane array. The window starts at a
/// 16-byte boundary so that `cp.async` moves 16-byte chunks; bytes past
/// `end` are zero-filled.
#[inline(always)]
pub const fn w_window(n_dim: u64, kt: u64, n0: u64, n_valid: u64, bits: u64) -> (u64, u32, u64) {
    let start = (kt * n_dim + n0) * 8 * bits;
    (start & !15, (start & 15) as u32, start + n_valid * 8 * bits)
}

/// As [`w_window`] for the E4M4 scale bytes (2 per column).
#[inline(always)]
pub const fn s_window(n_dim: u64, kt: u64, n0: u64, n_valid: u64) -> (u64, u32, u64) {
    let start = (kt * n_dim + n0) * 2;
    (start & !15, (start & 15) as u32, start + n_valid * 2)
}

/// The low 4 bits of the window starts of [`w_window`] and [`s_window`]:
/// where column `n0` begins inside the staged weight and scale windows.
/// Wrapping u32 arithmetic is exact for these bits.
#[inline(always)]
pub const fn window_offsets(n_dim: u32, kt: u32, n0: u32, bits: u32) -> (u32, u32) {
    let col = kt.wrapping_mul(n_dim).wrapping_add(n0);
    (col.wrapping_mul(8 * bits) & 15, col.wrapping_mul(2) & 15)
}

/// The byte offset of the lane's copy inside a table entry of the table of
/// a `bits`-bit weight at `mb` m blocks, `entry_bytes · (lane % C)` with C
/// = [`table_copies`], in every byte: ready to be merged into
/// [`pair_words`] by [`entry_words`].
#[inline(always)]
pub const fn lane_bytes(lane: u32, bits: u32, mb: u32) -> u32 {
    (entry_bytes(bits, mb) * (lane % table_copies(bits, mb))) * 0x0101_0101
}

/// [`pair_words`] of the planes that address the table of a `K`-bit weight
/// at `mb` m blocks: all `K`, or planes 1.. where the low bit is split off
/// ([`splits_low_bit`]; its 16 copies of 8 bytes are laid out as 32 of 4).
/// `lanes` = [`lane_bytes`]`(lane, K, mb)`.
#[inline(always)]
pub fn entry_words<const K: usize>(planes: &[u32; K], rot: &[u32; 8], lanes: u32, mb: u32) -> (u32, u32) {
    if splits_low_bit(K as u32, mb) {
        let upper = [planes[1 % K], planes[2 % K], planes[3 % K], planes[4 % K]];
        pair_words(&upper, rot, lanes, 32)
    } else {
        pair_words(planes, rot, lanes, table_copies(K as u32, mb))
    }
}

/// `prmt` selectors that pick the values of pair q (elements `8q + two_t`
/// and `8q + two_t + 1`, as in [`pair_words`]) from the two words of an
/// entry of the split table ([`splits_low_bit`]) by the elements' low index
/// bits, plane 0's bits: word 0 holds the selectors of q = 0 (bits 0..16)
/// and q = 2 (bits 16..32), word 1 those of q = 1 and 3. A selector is
/// `0x3210`, plus `0x0044` when a's bit is set (bytes 4, 5: word 1's low
/// half) and `0x4400` when b's is (bytes 6, 7); `(x · 0x2244) & 0x4444`
/// of the two bits `x` = a | b << 1 gives both additions at once.
#[inline(always)]
pub const fn low_bit_selects(plane0: u32, two_t: u32) -> [u32; 2] {
    let r = plane0.rotate_right(two_t);
    [half_word_selects(r), half_word_selects(r >> 8)]
}

/// The selectors of [`low_bit_selects`] from the bit pairs at bits 0 and 16.
#[inline(always)]
const fn half_word_selects(x: u32) -> u32 {
    ((x & 0x0003_0003).wrapping_mul(0x2244) & 0x4444_4444) | 0x3210_3210
}

/// Index bits of a pair entry that sit in the low address byte, above the
/// copy offset, for a table of `copies` copies: `8 − log2(4·C)` (32 copies:
/// 1, 8: 3, 4: 4).
#[inline(always)]
pub const fn lo_index_bits(copies: u32) -> u32 {
    6 - copies.trailing_zeros()
}

/// The rotation amounts of [`pair_words`] for a lane with `two_t` =
/// 2·(lane % 4): entry i is `two_t + 2 − i` (mod 32).
#[inline(always)]
pub const fn rotations(two_t: u32) -> [u32; 8] {
    let mut r = [0u32; 8];
    let mut i = 0;
    while i < 8 {
        r[i] = two_t.wrapping_add(2).wrapping_sub(i as u32) & 31;
        i += 1;
    }
    r
}

/// The two words `(lo, hi)` from which one byte permute per lookup
/// ([`entry_select`]) builds the table address of the pair of elements
/// `8q + two_t` (a) and `8q + two_t + 1` (b) of a quant block with bit
/// planes `planes`, for q = 0..4, in a table of `copies` copies (a power of
/// two, 4..=32, with 2k − L ≤ 7) of 4 bytes. `rot` = [`rotations`]`(two_t)`,
/// `lanes` = `4·(lane % copies)` in every byte ([`lane_bytes`]).
///
/// The address of interleaved pair index `e` (`a0 b0 a1 b1 …`, LSB first)
/// for lane `l` is `e·4C + 4·(l % C)`: byte 0 holds the copy offset (from
/// bit 2) and the low `L` = [`lo_index_bits`] index bits (bits `8 − L` ..
/// 7), byte 1 the other index bits. Plane j holds index bits 2j, 2j + 1, so
/// it is rotated right by `two_t + L − 2j` (`rot[2j + 2 − L]`, or `rot[0] +
/// (L − 2 − 2j)` for the first planes when L > 2), which moves bits `8q + two_t + e` to `8q +
/// 2j − L + e`: at or above bit 0 of byte q they are kept in `hi`, below it
/// they belong to byte q − 1 (mod 4) of `lo`, beside the copy offset.
/// - k ≤ 4 (L = 1): b0 lands in bit 0 of byte q of `hi`, a0 in bit 7 of
///   byte q − 1; plane j ≥ 1 in bits `2j − 1`, `2j` of `hi`.
/// - k = 5, 8 copies (L = 3): a0, b0 in bits 5, 6 and a1 in bit 7 of byte
///   q − 1, b1 in bit 0 of byte q; plane j ≥ 2 in bits `2j − 3`, `2j − 2`
///   of `hi`.
/// - k = 5, 4 copies (L = 4): planes 0 and 1 in bits 4..7 of byte q − 1,
///   plane j ≥ 2 in bits `2j − 4`, `2j − 3` of `hi`.
///
/// Bit 7 of every `hi` byte is zero (2k − L ≤ 7).
#[inline(always)]
pub fn pair_words<const K: usize>(planes: &[u32; K], rot: &[u32; 8], lanes: u32, copies: u32) -> (u32, u32) {
    let l = lo_index_bits(copies) as i32;
    if l == 1 {
        // The common case, spelled out (the kernels' schedules were tuned on it).
        let r0 = planes[0].rotate_right(rot[1]);
        let mut hi = r0 & 0x0101_0101;
        for (j, &p) in planes.iter().enumerate().skip(1) {
            hi |= p.rotate_right(rot[(2 * j + 1) & 7]) & (0x0303_0303 << (2 * j - 1));
        }
        return ((r0 & 0x8080_8080) | lanes, hi);
    }
    let (mut lo, mut hi) = (lanes, 0u32);
    for (j, &p) in planes.iter().enumerate() {
        // Rotation two_t + L − 2j: rot[2j + 2 − L], or past rot[0] for the
        // first planes when L > 2.
        let i = 2 * j as i32 + 2 - l;
        let r = p.rotate_right(if i >= 0 { rot[i as usize & 7] } else { rot[0] + (-i) as u32 });
        let pos = 2 * j as i32 - l;
        if pos >= 0 {
            hi |= r & (0x0303_0303 << pos);
        } else if pos == -1 {
            hi |= r & 0x0101_0101;
            lo |= r & 0x8080_8080;
        } else {
            lo |= r & (0x0303_0303 << (pos + 8));
        }
    }
    (lo, hi)
}

/// The planes of one quant block rotated left by `2j − 1` (plane j), the
/// part of [`merged_pair_words`] shared by its four pair offsets: element e
/// of plane j then sits at bit `e + 2j − 1`, so that the two bits of plane
/// j of pair `8q + 2h` sit at `8q + 2h + 2j − 1` and `+ 2j` for every j and
/// the pair's whole interleaved index is one 8-bit run starting at
/// `8q + 2h − 1`.
///
/// ```
/// use kbit_format::mma::prerotate;
/// assert_eq!(prerotate(&[0b10, 0b1]), [0b1, 0b10]);
/// ```
#[inline(always)]
pub fn prerotate<const K: usize>(planes: &[u32; K]) -> [u32; K] {
    core::array::from_fn(|j| planes[j].rotate_left((2 * j as u32).wrapping_sub(1) & 31))
}

/// [`pair_words`] of a 32-copy table (K ≤ 4 only) at `two_t = 2h`, built from
/// [`prerotate`]d planes: the runs of the four pairs `8q + 2h` are merged
/// from the planes by K − 1 bit selects (plane j owns bits `2h + 2j − 1`
/// and `2h + 2j` of every byte), one rotation right by 2h moves run q to
/// bit `8q − 1`, and two masks split it into `lo` (bit 7 of each byte, the
/// pair's a0, beside the copy offset) and `hi` (the other `2k − 1` bits).
/// Per block that is K rotations, then K + 2 operations per h, against
/// about 2K + 1 per h for [`pair_words`] itself.
///
/// ```
/// use kbit_format::mma::{lane_bytes, merged_pair_words, pair_words, prerotate, rotations, PAIRS};
/// let planes = [0x1234_5678, 0x9abc_def0, 0x0f1e_2d3c, 0x4b5a_6978];
/// let lanes = lane_bytes(5, 4, PAIRS);
/// for h in 0..4 {
///     let want = pair_words(&planes, &rotations(2 * h), lanes, 32);
///     assert_eq!(merged_pair_words(&prerotate(&planes), h, lanes), want);
/// }
/// ```
#[inline(always)]
pub fn merged_pair_words<const K: usize>(pre: &[u32; K], h: u32, lanes: u32) -> (u32, u32) {
    debug_assert!(K >= 2 && K <= 4);
    let mut run = pre[K - 1];
    let mut j = K - 1;
    while j > 0 {
        j -= 1;
        let own = 0x0303_0303u32.rotate_left((2 * h + 2 * j as u32).wrapping_sub(1) & 31);
        run = (pre[j] & own) | (run & !own);
    }
    let r = run.rotate_right(2 * h);
    let index_bits = 0x0101_0101u32.wrapping_mul((1u32 << (2 * K - 1)) - 1);
    ((r & 0x8080_8080) | lanes, r & index_bits)
}

/// `prmt` selector that builds the table address of byte q (0..4) from
/// `(lo, hi)` of [`pair_words`]: byte 0 = byte `(q + 3) % 4` of `lo`, byte 1
/// = byte q of `hi`, bytes 2 and 3 = the sign of byte q of `hi`, i.e. zero.
#[inline(always)]
pub const fn entry_select(q: u32) -> u32 {
    let h = 4 + (q & 3);
    ((q + 3) & 3) | h << 4 | (h | 8) << 8 | (h | 8) << 12
}

/// CPU model of `prmt.b32 d, a, b, sel` (default mode): byte i of `d` is
/// byte `sel[4i+2..4i]` of `b:a`, or its sign replicated when bit
/// `4i + 3` of `sel` is set.
#[inline(always)]
pub const fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let v = (b as u64) << 32 | a as u64;
    let mut d = 0u32;
    let mut i = 0;
    while i < 4 {
        let n = (sel >> (4 * i)) & 15;
        let byte = ((v >> (8 * (n & 7))) & 0xff) as u32;
        let byte = if n & 8 != 0 { if byte & 0x80 != 0 { 0xff } else { 0 } } else { byte };
        d |= byte << (8 * i);
        i += 1;
    }
    d
}

/// Codebook index of element a (`parity` 0) or b (1) of interleaved pair
/// index `e` (see [`pair_words`]).
#[inline(always)]
pub const fn deinterleave(e: u32, parity: u32, bits: u32) -> u32 {
    let mut v = 0;
    let mut j = 0;
    while j < bits {
        v |= ((e >> (2 * j + parity)) & 1) << j;
        j += 1;
    }
    v
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::{vec, vec::Vec};

    /// Every chunk count of a part that the kernels copy through the grid.
    fn part_chunks() -> Vec<u32> {
        let mut v: Vec<u32> = (1..=4).map(a_chunks).collect();
        for nf in [2, 4] {
            v.push(s_span_chunks(nf));
            v.extend((2..=5).map(|bits| w_span_chunks(nf, bits)));
        }
        v
    }

    /// Every part of every slot starts on a 128-byte line and the parts do
    /// not overlap: a `cp.async` destination straddling lines costs about
    /// twice the shared-memory wavefronts.
    #[test]
    fn slot_parts_start_on_lines() {
        for (mb, nf, bits) in
            (1..=4).flat_map(|mb| [2, 4].into_iter().flat_map(move |nf| (2..=5).map(move |b| (mb, nf, b))))
        {
            let (a, w, sc, t) = (0, w_offset(mb), s_offset(mb, nf, bits), tile_bytes(mb, nf, bits));
            for (what, at) in [("stages", stages_offset(mb, nf, bits)), ("A", a), ("W", w), ("S", sc), ("slot", t)] {
                assert_eq!(at % 128, 0, "{what} of mb={mb} nf={nf} k={bits} at {at}");
            }
            assert!(w >= a + a_bytes(mb) && sc >= w + 16 * w_chunks(nf, bits) && t >= sc + 16 * s_chunks(nf));
            assert!(stages_offset(mb, nf, bits) >= epi_offset(bits, mb) + epi_bytes(mb, nf));
        }
    }

    #[test]
    fn copy_grid_covers_the_planned_stage_tiles() {
        for mb in 1..=4 {
            let wide = mb <= 2;
            assert!(wide_stages(mb, 4) == wide && !wide_stages(mb, 2));
            assert_eq!((copy_stage_tiles(mb, 2), copy_stage_tiles(mb, 4)), (4, if wide { 4 } else { 2 }));
        }
    }

    #[test]
    fn copy_grid_covers_every_chunk_of_a_stage_once() {
        for chunks in part_chunks() {
            let (cols, rows) = (copy_chunk_threads(chunks), copy_slot_threads(chunks));
            assert!(cols.is_power_of_two() && cols <= chunks && 2 * cols > chunks.min(THREADS), "{chunks}");
            assert_eq!(cols * rows, THREADS);
            assert!(copy_chunk_rounds(chunks) <= 2);
            for (kt, len) in (1..=MAX_STAGE_TILES).flat_map(|kt| (1..=kt).map(move |len| (kt, len))) {
                assert!(copy_slot_rounds(chunks, kt) <= kt);
                let mut seen = vec![0u32; (len * chunks) as usize];
                for tid in 0..THREADS {
                    let (j0, c0) = copy_start(tid, chunks);
                    for p in 0..copy_slot_rounds(chunks, kt) {
                        for q in 0..copy_chunk_rounds(chunks) {
                            let (j, c) = (j0 + rows * p, c0 + cols * q);
                            if j < len && c < chunks {
                                seen[(j * chunks + c) as usize] += 1;
                            }
                        }
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{chunks} chunks, {len} of {kt} slots");
            }
        }
    }

    /// The byte count of chunk `ch` of a window (start, _, end), as the
    /// general copy computes it: bytes before `end`, at most 16.
    fn window_bytes(start: u64, end: u64, ch: u32) -> u64 {
        end.saturating_sub(start + 16 * ch as u64).min(16)
    }

    #[test]
    fn full_tile_windows_are_whole_chunks_then_the_offset() {
        for nf in [2, 4] {
            let tn = tile_n(nf) as u64;
            for n in [tn, 2 * tn + 8, 4100, 28672, 28673] {
                for kt in 0..6 {
                    for n0 in (0..n.saturating_sub(tn - 1)).step_by(tn as usize) {
                        for bits in 2..=5u32 {
                            let (w0, woff, wend) = w_window(n, kt, n0, tn, bits as u64);
                            let span = w_span_chunks(nf, bits);
                            for ch in 0..span {
                                assert_eq!(window_bytes(w0, wend, ch), 16);
                            }
                            for ch in span..w_chunks(nf, bits) {
                                assert_eq!(window_bytes(w0, wend, ch), woff as u64, "k{bits} n{n} kt{kt} n0 {n0}");
                            }
                        }
                        let (s0, soff, send) = s_window(n, kt, n0, tn);
                        let span = s_span_chunks(nf);
                        for ch in 0..span {
                            assert_eq!(window_bytes(s0, send, ch), 16);
                        }
                        assert_eq!(s_chunks(nf), span + 1);
                        assert_eq!(window_bytes(s0, send, span), soff as u64);
                    }
                }
            }
        }
    }
}
