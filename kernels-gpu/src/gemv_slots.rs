//! Scalar GEMV, column-slot variant: `y[M, N] = x[M, K] · Wᵀ` for
//! M = 1..4 on the runtime (tiled) layout, dense (kernel 1) and grouped over
//! MoE experts (kernel 4), for the small matrices that
//! `kbit_format::gemv::uses_slots` gives it (the block variant in
//! [`crate::gemv`] takes the others). f16 or bf16 activations, f32
//! accumulation, deterministic.
//!
//! # Work mapping
//!
//! A block owns `C` consecutive columns and all of K; its `C·S` threads are
//! (column, K slot) pairs: thread `t` is column `t % C`, slot `t / C` (`C`,
//! `S` and the staging chunk `R` are powers of two packed in `geom`, see
//! `kbit_format::gemv_slots::Geometry`). Slot `s` takes the K tiles
//! `kt = s, s + S, s + 2S, …`; for one tile the thread loads its column's
//! 2k plane words (contiguous: k = 2 one 16-byte load, k = 4 two, k = 3 and
//! 5 three or five 8-byte loads) and the two scale bytes, so consecutive
//! lanes read one contiguous span. When `C ≥ 32` a warp is 32 columns of
//! one slot; when `C < 32` (narrow matrices, to fill the GPU) a warp holds
//! `32 / C` slots. Weight loads run two tiles ahead of the math (three
//! register buffers used in turn, the loop unrolled by three; the first
//! two tiles, the first activations and the codebook are all requested
//! before the prologue waits on any of them), evict-first
//! in L1 and L2: a column's later loads hit the sectors its first load
//! brought into L1, and nothing of the weights is worth keeping in L2.
//! The grouped instances keep two buffers (tile i + 2 is requested when
//! tile i is done): MoE experts are small matrices whose threads own one
//! or two K tiles, where a third buffer adds registers and no loads in
//! flight (it took the 512-thread grouped blocks of k = 5 at M = 1, 2 and
//! of k = 2 at M = 2 past 64 registers, i.e. to one block per SM).
//!
//! # Activations and decode
//!
//! `x` for `R·S` consecutive tiles is staged in shared memory as f32
//! (`[tile][row][64]`, 4 floats of padding per tile so that slots sharing a
//! warp hit different banks); lanes of one slot read it with broadcast
//! 16-byte loads. Rows past the caller's row count and columns past K are
//! staged as zeros, so `x` is never read out of bounds and the zero half
//! tile of `K % 64 == 32` contributes exactly 0. Bit planes are turned into
//! table fields with a few shifts and masks (`kbit_format::gemv`), and one
//! shared-memory load dequantizes a whole field: four codebook values for
//! k = 2, two for k = 3, 4 (per-lane replicated tables, conflict-free), one
//! for k = 5.
//! Where the block is folded (`kbit_format::gemv_slots::folds`: k = 2,
//! and k = 4 when the problem has one row) the codebook values are FMA'd
//! into the block's even- and odd-element dot products, which the block's
//! scale multiplies once as they are folded into the accumulators;
//! otherwise each weight is `f32(cb · scale)`, formed once and FMA'd into
//! all M rows. A grouped instance for more rows runs its one-row experts'
//! k = 4 blocks folded, as the dense one-row call does.
//!
//! # Reduction
//!
//! Every thread keeps two f32 accumulators per row (even and odd elements
//! of the tile, for instruction-level parallelism). At the end the `S` slot
//! partials of each (row, column) go through shared memory and one thread
//! adds them in slot order. The order is fixed by `S`, which the host
//! derives from the shape alone (`kbit_format::gemv_slots::slots`), and by
//! whether the problem has one row (`kbit_format::gemv_slots::folds`), so
//! results are identical run to run and the grouped kernel matches the
//! dense one bit for bit. No atomics, no cross-block traffic.
//!
//! # Grouped
//!
//! The grid is `units × column blocks`, `units = min(experts, total_rows)`
//! (`crate::gemv::grouped_unit`). With fewer experts than rows, block
//! `(e, cb)` works on expert `e`'s rows (none: it exits). Otherwise block
//! `(row, cb)` finds the expert owning `row` (each warp counts the offsets
//! `≤ row`, a cached scan with no dependent loads); only the block of an
//! expert's first row works, and empty experts own no row and launch
//! nothing. Either way at most `max_m` rows.
//!
//! When every slot owns one K tile (`S ≥` the K tiles: the MoE expert
//! shapes) and the units would need more than one block per SM, the host
//! gives each block two column groups (`Geometry::log_reps = 1`, [`pair`]):
//! a thread works on columns `c` and `c + C` of the block's `2C`, both
//! tiles loaded before the grid-dependency wait from the guessed expert
//! (`unit`), so that with half the blocks the next launch's blocks find
//! room beside this one's and their loads overlap it, as the dense
//! kernel's do. With a unit per row, a working block's first row is its
//! unit, so after the wait its activations are requested together with
//! the expert offsets (one round of loads, not two). Each column is summed
//! exactly as by the dense kernel.

use crate::elem::{Bf16, Elem, F16};
use crate::gemv::{build_table, each_octet, grouped_unit, lookup_at, lookup_words};
use crate::ptx;
use crate::stage_x;
use core::num::NonZeroU32;
use kbit_format::gemv as g;
use kbit_format::gemv_slots::{self as gs, Geometry};
use kbit_format::{MAX_BITS, e4m4, tile};

/// One column's K tile: planes of both 32-value blocks and the two scale
/// bytes (`h = 0` in bits 0..8, `h = 1` in bits 8..16).
#[derive(Clone, Copy)]
struct Tile<const K: usize> {
    planes: [[u32; K]; 2],
    scales: u32,
}

impl<const K: usize> Tile<K> {
    const ZERO: Self = Self { planes: [[0; K]; 2], scales: 0 };

    /// Block `h` (0 or 1): its planes and its scale byte.
    #[inline(always)]
    fn block(&self, h: usize) -> (&[u32; K], u32) {
        (&self.planes[h], (self.scales >> (8 * h)) & 0xFF)
    }
}

/// Where the next tile of a thread's column lies: the matrix's words and
/// scale bytes, the scale index of the tile's first quant block, and how
/// far the following tile (`kt + S`) is. The index is 32-bit: this variant
/// takes matrices of fewer than 2^25 weights
/// ([`uses_slots`](kbit_format::gemv::uses_slots)), i.e. fewer than 2^20
/// quant blocks, and one step past the last tile stays far below 2^32.
/// (Two 64-bit pointers and steps held two registers more in every
/// iteration of the main loop.)
#[derive(Clone, Copy)]
struct Cursor {
    words: *const u32,
    scales: *const u8,
    at: u32,
    step: u32,
}

impl Cursor {
    /// The cursor of tile `kt` of column `n` (`tile::scale_index`),
    /// stepping `slots` tiles at a time.
    #[inline(always)]
    fn new(packed: *const u32, scales: *const u8, n_dim: u64, n: u64, kt: u64, slots: u64) -> Self {
        // Block (n, 2·kt) is h = 0 of tile kt; h = 1 and its planes follow.
        Self { words: packed, scales, at: tile::scale_index(n_dim, n, 2 * kt) as u32, step: (slots * n_dim * 2) as u32 }
    }

    /// Moves to the slot's next tile (the index may then lie past the
    /// matrix: it is only read while the tile exists).
    #[inline(always)]
    fn advance(&mut self) {
        self.at = self.at.wrapping_add(self.step);
    }

    /// Word 0 of the tile under the cursor (`tile::word_index`).
    #[inline(always)]
    fn tile_words<const K: usize>(&self) -> *const u32 {
        self.words.wrapping_add(self.at as usize * K)
    }

    /// The tile's first scale byte.
    #[inline(always)]
    fn tile_scales(&self) -> *const u8 {
        self.scales.wrapping_add(self.at as usize)
    }

    /// Loads the tile under the cursor: `2K` words (k = 2: one 16-byte
    /// load, k = 4: two; k = 3, 5: 8-byte loads, as their columns are only
    /// 8-aligned) and the 2 scale bytes.
    ///
    /// # Safety
    /// The tile exists; `packed` is 16-aligned.
    #[inline(always)]
    unsafe fn load<const K: usize>(&self, policy: u64) -> Tile<K> {
        let w = self.tile_words::<K>();
        let mut words = [0u32; 2 * MAX_BITS as usize];
        unsafe {
            match K {
                2 => {
                    let a = ptx::ld_stream_v4(w, policy);
                    words[0] = a[0];
                    words[1] = a[1];
                    words[2] = a[2];
                    words[3] = a[3];
                }
                4 => {
                    let a = ptx::ld_stream_v4(w, policy);
                    let b = ptx::ld_stream_v4(w.add(4), policy);
                    words[0] = a[0];
                    words[1] = a[1];
                    words[2] = a[2];
                    words[3] = a[3];
                    words[4] = b[0];
                    words[5] = b[1];
                    words[6] = b[2];
                    words[7] = b[3];
                }
                _ => {
                    for i in 0..K {
                        let a = ptx::ld_stream_v2(w.add(2 * i), policy);
                        words[2 * i] = a[0];
                        words[2 * i + 1] = a[1];
                    }
                }
            }
            Tile {
                planes: core::array::from_fn(|h| core::array::from_fn(|j| words[h * K + j])),
                scales: ptx::ld_stream_u16(self.tile_scales() as *const u16, policy) as u32,
            }
        }
    }
}

/// Stages `x` for tiles `first_tile .. first_tile + tiles` as f32 at shared
/// address `xs` in this variant's layout (`[tile][row][64]`, tile stride
/// `x_tile_floats(M)`), through [`stage_x::stage`] (`LEAD` and `between`
/// as there).
///
/// # Safety
/// `x` holds `rows` rows of `k_dim` values and is 16-aligned; the staged
/// tiles fit the dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_x<const M: usize, T: Elem<Raw = u16>, const LEAD: u32>(
    x: *const u16,
    k_dim: u32,
    rows: u32,
    first_tile: u32,
    tiles: u32,
    xs: u32,
    between: impl FnOnce(),
) {
    let stride = gs::x_tile_floats(M as u32);
    let dst = |tc: u32, r: u32, o: u32| xs + (tc * stride + r * 64 + 8 * o) * 4;
    unsafe { stage_x::stage::<M, T, LEAD>(x, k_dim, rows, first_tile, tiles, dst, between) }
}

/// The staged activations of 8 consecutive K positions, all rows.
///
/// # Safety
/// `addr` is 16-aligned and inside a staged tile.
#[inline(always)]
unsafe fn load_x8<const M: usize>(addr: u32) -> [[f32; 8]; M] {
    core::array::from_fn(|r| {
        let row = addr + 256 * r as u32;
        let (a, b) = unsafe { (ptx::ld_shared_v4(row), ptx::ld_shared_v4(row + 16)) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]].map(f32::from_bits)
    })
}

/// Accumulates one tile of one column into `acc`: the two 32-value blocks
/// one after the other, each with its own scale, in the summation order of
/// `kbit_format::gemv_slots` (`one_row`: the problem has one row, see
/// [`fma_block`]). Written as
/// two calls, not a loop, so that no array is indexed by a loop counter
/// that might stay a run-time value (it would live on the stack).
///
/// # Safety
/// As [`fma_block`].
#[inline(always)]
unsafe fn fma_tile<const M: usize, const K: usize>(
    t: &Tile<K>,
    table: u32,
    copy: u32,
    xs: u32,
    acc: &mut [[f32; M]; 2],
    one_row: bool,
) {
    unsafe {
        fma_block::<M, K>(t.block(0), table, copy, xs, acc, one_row);
        fma_block::<M, K>(t.block(1), table, copy, xs + 4 * 32, acc, one_row);
    }
}

/// Accumulates one 32-value block (planes, E4M4 scale byte) whose staged
/// activations start at `xs` (row stride 64 floats).
///
/// `table` is the decode table and `copy` the thread's copy in it
/// (`kbit_format::gemv::copy_byte`, k ≤ 4). k = 2 decodes 4 elements per
/// table load, k = 3, 4 two, k = 5 one (addresses as in
/// `crate::gemv::lookup_at`).
///
/// `one_row`: the problem has one row (the call's, or a grouped call's
/// expert's; true whenever M = 1), which at k = 4 sums the block in the
/// folded order of `kbit_format::gemv_slots::folds` into row 0 alone.
/// A grouped instance for more rows takes it at run time for its one-row
/// experts, so that each matches the dense one-row call bit for bit.
///
/// # Safety
/// The table and the block's activations are staged and published.
#[inline(always)]
unsafe fn fma_block<const M: usize, const K: usize>(
    (planes, scale): (&[u32; K], u32),
    table: u32,
    copy: u32,
    xs: u32,
    acc: &mut [[f32; M]; 2],
    one_row: bool,
) {
    let byte = scale;
    let scale = e4m4::decode_biased(byte as u8);
    let mine = table + (copy & 0xFF);
    if K == 2 {
        // Block dot products of the even and odd elements, scaled once as
        // they are folded in (a multiply per weight here would take the
        // instances past 64 registers).
        let mut d = [[0f32; M]; 2];
        let w = lookup_words::<K, M>(planes, copy);
        each_octet(g::rows(M as u32), |m8| {
            let x = unsafe { load_x8::<M>(xs + 32 * m8) };
            let (fa, fb) = (lookup_at::<M>(&w, 0, m8, table, mine), lookup_at::<M>(&w, 1, m8, table, mine));
            let (a, b) = unsafe { (ptx::ld_shared_v4(fa), ptx::ld_shared_v4(fb)) };
            // Quad a is elements 8m8 + {0, 1, 4, 5}, quad b + {2, 3, 6, 7}.
            let v = [a[0], a[1], b[0], b[1], a[2], a[3], b[2], b[3]];
            for c in 0..8 {
                for r in 0..M {
                    d[c % 2][r] = ptx::fma_rn_f32(f32::from_bits(v[c]), x[r][c], d[c % 2][r]);
                }
            }
        });
        for t in 0..2 {
            for r in 0..M {
                acc[t][r] = ptx::fma_rn_f32(d[t][r], scale, acc[t][r]);
            }
        }
    } else if K <= 4 && one_row && gs::folds(K as u32, 1) {
        // (k = 4.) Row 0's unscaled even and odd sums (the table in the layout of
        // M rows, the staged row 0 at `xs`), both scaled into `acc[0][0]`.
        let w = lookup_words::<K, M>(planes, copy);
        let mut d = [0f32; 2];
        each_octet(g::rows(M as u32), |m8| {
            let [x] = unsafe { load_x8::<1>(xs + 32 * m8) };
            for q in 0..4 {
                let v = unsafe { ptx::ld_shared_v2(lookup_at::<M>(&w, q, m8, table, mine)) };
                d[0] = ptx::fma_rn_f32(f32::from_bits(v[0]), x[2 * q], d[0]);
                d[1] = ptx::fma_rn_f32(f32::from_bits(v[1]), x[2 * q + 1], d[1]);
            }
        });
        // (The scale decoded here, after the sums, holds one register
        // fewer through them.)
        let scale = e4m4::decode_biased(byte as u8);
        acc[0][0] = ptx::fma_rn_f32(d[1], scale, ptx::fma_rn_f32(d[0], scale, acc[0][0]));
    } else if K <= 4 {
        let w = lookup_words::<K, M>(planes, copy);
        each_octet(g::rows(M as u32), |m8| {
            let x = unsafe { load_x8::<M>(xs + 32 * m8) };
            for q in 0..4 {
                let v = unsafe { ptx::ld_shared_v2(lookup_at::<M>(&w, q, m8, table, mine)) };
                let w0 = ptx::mul_rn_f32(f32::from_bits(v[0]), scale);
                let w1 = ptx::mul_rn_f32(f32::from_bits(v[1]), scale);
                for r in 0..M {
                    acc[0][r] = ptx::fma_rn_f32(w0, x[r][2 * q], acc[0][r]);
                    acc[1][r] = ptx::fma_rn_f32(w1, x[r][2 * q + 1], acc[1][r]);
                }
            }
        });
    } else {
        let fields = g::wide_words::<K>(planes);
        each_octet(g::rows(M as u32), |m8| {
            let x = unsafe { load_x8::<M>(xs + 32 * m8) };
            for c in 0..8 {
                let f = ptx::prmt(fields[c], 0, 0x4440 | m8);
                let w = ptx::mul_rn_f32(f32::from_bits(unsafe { ptx::ld_shared_u32(table + f) }), scale);
                for r in 0..M {
                    acc[c % 2][r] = ptx::fma_rn_f32(w, x[r][c], acc[c % 2][r]);
                }
            }
        });
    }
}

/// Accumulates one K tile of both columns of a pairs-form thread (columns
/// `c` and `c + C` own the same K tile, so they read the same staged
/// activations) into `acc_a` and `acc_b`: each column's arithmetic and
/// order are [`fma_tile`]'s, but every octet of activations is loaded once
/// for both, so a step's `2M` activation loads serve two columns instead of
/// one. [`pair`] takes it at M ≥ 2 and k ≤ 4 (not for an expert with one
/// row at k = 4, which is folded: [`fma_block`]). H100, 8 experts of M rows,
/// against one column after the other: `moe_dn` (512 → 2048) at M = 2
/// −3 to −10 %, at M = 3 −9 to −13 %, `moe_gu` (2048 → 512) at M = 2, 3
/// −6 to −13 %, M = 4 k = 2 −14 %; at M = 1 it lost 2–10 % and at k = 5
/// 5–17 % (more registers for no fewer instructions that bind). The
/// blocks are spelled out, not looped over (see [`fma_tile`]); the octets
/// are [`octet_quads`] and [`octet_pairs`], which [`fma_block`] does not
/// share: through them the dense instances' PTX changed (sm_90 M = 3, 4,
/// k = 2: 2–4 more registers).
///
/// # Safety
/// As [`fma_block`], with k ≤ 4.
#[inline(always)]
unsafe fn fma_tile_pair<const M: usize, const K: usize>(
    ta: &Tile<K>,
    tb: &Tile<K>,
    table: u32,
    copy: u32,
    xs: u32,
    acc_a: &mut [[f32; M]; 2],
    acc_b: &mut [[f32; M]; 2],
) {
    unsafe {
        fma_block_pair::<M, K>(ta.block(0), tb.block(0), table, copy, xs, acc_a, acc_b);
        fma_block_pair::<M, K>(ta.block(1), tb.block(1), table, copy, xs + 4 * 32, acc_a, acc_b);
    }
}

/// [`fma_block`] for the same block of two columns `a` and `b` (planes,
/// scale byte; k ≤ 4), one load of each activation octet for both.
///
/// # Safety
/// As [`fma_block`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fma_block_pair<const M: usize, const K: usize>(
    a: (&[u32; K], u32),
    b: (&[u32; K], u32),
    table: u32,
    copy: u32,
    xs: u32,
    acc_a: &mut [[f32; M]; 2],
    acc_b: &mut [[f32; M]; 2],
) {
    let (sa, sb) = (e4m4::decode_biased(a.1 as u8), e4m4::decode_biased(b.1 as u8));
    let mine = table + (copy & 0xFF);
    let (wa, wb) = (lookup_words::<K, M>(a.0, copy), lookup_words::<K, M>(b.0, copy));
    if K == 2 {
        let (mut da, mut db) = ([[0f32; M]; 2], [[0f32; M]; 2]);
        each_octet(g::rows(M as u32), |m8| {
            let x = unsafe { load_x8::<M>(xs + 32 * m8) };
            unsafe {
                octet_quads::<M>(&wa, &x, m8, table, mine, &mut da);
                octet_quads::<M>(&wb, &x, m8, table, mine, &mut db);
            }
        });
        fold_block(&da, sa, acc_a);
        fold_block(&db, sb, acc_b);
    } else {
        each_octet(g::rows(M as u32), |m8| {
            let x = unsafe { load_x8::<M>(xs + 32 * m8) };
            unsafe {
                octet_pairs::<M>(&wa, &x, m8, table, mine, sa, acc_a);
                octet_pairs::<M>(&wb, &x, m8, table, mine, sb, acc_b);
            }
        });
    }
}

/// k = 2: folds a block's even and odd dot products `d` into `acc` with
/// the block's scale.
#[inline(always)]
fn fold_block<const M: usize>(d: &[[f32; M]; 2], scale: f32, acc: &mut [[f32; M]; 2]) {
    for t in 0..2 {
        for r in 0..M {
            acc[t][r] = ptx::fma_rn_f32(d[t][r], scale, acc[t][r]);
        }
    }
}

/// k = 2: elements `8m8 .. 8m8 + 8` of a block (two quad loads, addresses
/// from the block's [`lookup_words`] `w`) into the unscaled even and odd
/// dot products `d` against the staged activations `x`.
///
/// # Safety
/// The table is built and published.
#[inline(always)]
unsafe fn octet_quads<const M: usize>(
    w: &[u32; 8],
    x: &[[f32; 8]; M],
    m8: u32,
    table: u32,
    mine: u32,
    d: &mut [[f32; M]; 2],
) {
    let (fa, fb) = (lookup_at::<M>(w, 0, m8, table, mine), lookup_at::<M>(w, 1, m8, table, mine));
    let (a, b) = unsafe { (ptx::ld_shared_v4(fa), ptx::ld_shared_v4(fb)) };
    // Quad a is elements 8m8 + {0, 1, 4, 5}, quad b + {2, 3, 6, 7}.
    let v = [a[0], a[1], b[0], b[1], a[2], a[3], b[2], b[3]];
    for c in 0..8 {
        for r in 0..M {
            d[c % 2][r] = ptx::fma_rn_f32(f32::from_bits(v[c]), x[r][c], d[c % 2][r]);
        }
    }
}

/// k = 3, 4: elements `8m8 .. 8m8 + 8` of a block (four pair loads), each
/// weight `cb · scale`, into `acc` (even and odd elements).
///
/// # Safety
/// As [`octet_quads`].
#[inline(always)]
unsafe fn octet_pairs<const M: usize>(
    w: &[u32; 8],
    x: &[[f32; 8]; M],
    m8: u32,
    table: u32,
    mine: u32,
    scale: f32,
    acc: &mut [[f32; M]; 2],
) {
    for q in 0..4 {
        let v = unsafe { ptx::ld_shared_v2(lookup_at::<M>(w, q, m8, table, mine)) };
        let w0 = ptx::mul_rn_f32(f32::from_bits(v[0]), scale);
        let w1 = ptx::mul_rn_f32(f32::from_bits(v[1]), scale);
        for r in 0..M {
            acc[0][r] = ptx::fma_rn_f32(w0, x[r][2 * q], acc[0][r]);
            acc[1][r] = ptx::fma_rn_f32(w1, x[r][2 * q + 1], acc[1][r]);
        }
    }
}

/// The GEMV of one block: `C` columns starting at `col_block·C`, all of K,
/// `rows ≤ M` rows of `x` (row stride `k_dim`) into `y` (row stride `n_dim`).
///
/// # Safety
/// The pointers describe an `[n_dim, k_dim]` runtime-layout matrix with its
/// `2^K`-entry codebook, `rows` rows of activations (16-aligned) and of
/// outputs; the launch has `C·S` threads and `Geometry::smem_bytes` of
/// dynamic shared memory. `GROUPED`: two tile buffers instead of three
/// (module docs); the same arithmetic in the same order either way.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn body<const M: usize, const K: usize, T: Elem<Raw = u16>, const GROUPED: bool>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    rows: u32,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    col_block: u32,
) {
    let geo = Geometry::unpack(geom);
    let t = ptx::tid();
    let cols = geo.cols();
    let col = t & (cols - 1);
    let slot = t >> geo.log_cols;
    let n_dim = n_dim as u64;
    let first_col = col_block as u64 * cols as u64;
    let n = first_col + col as u64;
    let col_ok = n < n_dim;
    let k_tiles = (k_dim >> 6) + (k_dim & 63 != 0) as u32;
    let n_iter = (k_tiles + geo.slots() - 1) >> geo.log_slots;
    let chunk_mask = geo.chunk() - 1;

    let base = ptx::smem_base();
    let xs = base + g::table_bytes(K as u32, M as u32);
    // The table and this thread's copy in it.
    let table = base;
    let copy = g::copy_byte(K as u32, g::rows(M as u32), t);
    let x_tile_bytes = gs::x_tile_floats(M as u32) * 4;
    let policy = ptx::policy_evict_first();
    let kt_of = |i: u32| (i << geo.log_slots) + slot;
    let ok = |i: u32| col_ok && kt_of(i) < k_tiles;
    // `ahead` points at the next tile to load. The first two tiles are
    // requested in the prologue; then, with three buffers used in turn,
    // loads run two tiles ahead of the math; with two, tile i + 2 is
    // requested once tile i is done (no register moves either way).
    let mut ahead = Cursor::new(packed, scales, n_dim, n, slot as u64, geo.slots() as u64);
    let mut fetch = |i: u32, t: &mut Tile<K>| {
        if ok(i) {
            *t = unsafe { ahead.load::<K>(policy) };
        }
        ahead.advance();
    };
    // The prologue's global reads go out before anything waits on one: the
    // first two tiles and the codebook (the table is built before the
    // wait), then, after it, the first chunk of activations. One barrier
    // publishes table and activations.
    let (mut ta, mut tb, mut tc) = (Tile::<K>::ZERO, Tile::<K>::ZERO, Tile::<K>::ZERO);
    fetch(0, &mut ta);
    fetch(1, &mut tb);
    if !GROUPED && col_ok {
        // The thread's later tiles go to L2 now: before the wait this
        // block may be running beside the previous launch, and its loads
        // after the wait then come from L2 instead of DRAM. (This also
        // keeps the two loads above ahead of the wait: with nothing between
        // them, ptxas scheduled the wait first; `tests/ptx.rs` checks it.)
        let later = Cursor::new(packed, scales, n_dim, n, (2 << geo.log_slots) + slot as u64, geo.slots() as u64);
        unsafe { prefetch_tiles::<K>(later, 2, n_iter, |i| kt_of(i) < k_tiles) };
    }
    // Weights and codebook are never written by the kernels this launch may
    // overlap, so the decode table is built before the wait too;
    // activations and outputs are touched only after it.
    unsafe { build_table::<K, M>(cb, base) };
    ptx::after_producers();
    unsafe { stage_x::<M, T, 2>(x, k_dim, rows, 0, geo.chunk() << geo.log_slots, xs, || {}) };
    ptx::bar_sync();

    let mut acc = [[0f32; M]; 2];
    // A grouped block of an expert with one row sums it as the dense
    // one-row call does ([`fma_block`]).
    let one_row = M == 1 || rows == 1;
    // Iteration i: stage activations when a later chunk starts, then tile i.
    macro_rules! step {
        ($i:expr, $t:expr) => {{
            let i: u32 = $i;
            if i & chunk_mask == 0 && i != 0 {
                // Everyone is done with the previous chunk; stage the next
                // R·S tiles; publish.
                ptx::bar_sync();
                unsafe {
                    stage_x::<M, T, 0>(x, k_dim, rows, i << geo.log_slots, geo.chunk() << geo.log_slots, xs, || {})
                };
                ptx::bar_sync();
            }
            if ok(i) {
                let staged = ((i & chunk_mask) << geo.log_slots) + slot;
                unsafe { fma_tile::<M, K>(&$t, table, copy, xs + staged * x_tile_bytes, &mut acc, one_row) };
            }
        }};
    }
    let mut i = 0;
    while !GROUPED && i < n_iter {
        fetch(i + 2, &mut tc);
        step!(i, ta);
        if i + 1 >= n_iter {
            break;
        }
        fetch(i + 3, &mut ta);
        step!(i + 1, tb);
        if i + 2 >= n_iter {
            break;
        }
        fetch(i + 4, &mut tb);
        step!(i + 2, tc);
        i += 3;
    }
    while GROUPED && i < n_iter {
        step!(i, ta);
        fetch(i + 2, &mut ta);
        if i + 1 >= n_iter {
            break;
        }
        step!(i + 1, tb);
        fetch(i + 3, &mut tb);
        i += 2;
    }

    // Slot partials `red[slot][row][col]` over the staged activations, then
    // one thread per (row, column) adds them in slot order.
    ptx::bar_sync();
    for r in 0..M {
        let p = ptx::add_rn_f32(acc[0][r], acc[1][r]);
        unsafe { ptx::st_shared_f32(xs + ((slot * M as u32 + r as u32) * cols + col) * 4, p) };
    }
    ptx::bar_sync();
    let mut q = t;
    while q < cols * M as u32 {
        let r = q >> geo.log_cols;
        let c = q & (cols - 1);
        // (At M ≥ 2 the rounds took some instances past 64 registers, i.e.
        // to one 512-thread block per SM; the plain loop adds in the same
        // order. At k = 5 rounds of sixteen were no faster here and made
        // the pairs form's calls 5 % slower.)
        let v = if M == 1 {
            unsafe {
                if K == 5 {
                    sum_slots_in_order::<0, 4>(xs + c * 4, cols * 4, geo.slots())
                } else {
                    sum_slots_in_order::<0, 16>(xs + c * 4, cols * 4, geo.slots())
                }
            }
        } else {
            let mut v = unsafe { ptx::ld_shared_f32(xs + (r * cols + c) * 4) };
            for s in 1..geo.slots() {
                v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(xs + ((s * M as u32 + r) * cols + c) * 4) });
            }
            v
        };
        let nn = first_col + c as u64;
        if r < rows && nn < n_dim {
            unsafe { *y.add((r as u64 * n_dim + nn) as usize) = T::from_f32(v) };
        }
        q += ptx::block_dim();
    }
}

/// Where a block's columns and slot partials lie: its first column, the
/// matrix width, `2^log_span` columns per block, and the reduction buffer
/// `red[slot][row][column]` (f32) at shared address `xs`.
struct Columns {
    xs: u32,
    first_col: u64,
    n_dim: u64,
    log_span: u32,
    slots: u32,
}

/// Stores this thread's slot partials (`parts[j]`, even and odd element
/// sums, of column `col + j·C`,
/// `C = 2^log_span / J`) in the reduction buffer over the staged
/// activations, then one thread per (row, column) adds the `S` partials in
/// slot order (at M = 1 `ROUND` loads in flight, [`sum_slots_in_order`])
/// and writes y (rows `< rows`, columns `< N`).
///
/// # Safety
/// Every thread of the block calls it once; `y` holds `rows` rows of `N`.
#[inline(always)]
unsafe fn finish<const M: usize, const J: usize, T: Elem<Raw = u16>, const ROUND: usize>(
    at: &Columns,
    parts: [[[f32; M]; 2]; J],
    t: u32,
    slot: u32,
    col: u32,
    rows: u32,
    y: *mut u16,
) {
    let (xs, log_span) = (at.xs, at.log_span);
    let span = 1u32 << log_span;
    let red = |s: u32, r: u32, c: u32| xs + ((s * M as u32 + r) * span + c) * 4;
    ptx::bar_sync();
    for (j, acc) in parts.iter().enumerate() {
        for r in 0..M {
            let p = ptx::add_rn_f32(acc[0][r], acc[1][r]);
            unsafe { ptx::st_shared_f32(red(slot, r as u32, col + j as u32 * (span / J as u32)), p) };
        }
    }
    ptx::bar_sync();
    let mut q = t;
    while q < span * M as u32 {
        let r = q >> log_span;
        let c = q & (span - 1);
        let v = if M == 1 {
            unsafe { sum_slots_in_order::<1, ROUND>(red(0, 0, c), span * 4, at.slots) }
        } else {
            let mut v = unsafe { ptx::ld_shared_f32(red(0, r, c)) };
            for s in 1..at.slots {
                v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(red(s, r, c)) });
            }
            v
        };
        let nn = at.first_col + c as u64;
        if r < rows && nn < at.n_dim {
            unsafe { *y.add((r as u64 * at.n_dim + nn) as usize) = T::from_f32(v) };
        }
        q += ptx::block_dim();
    }
}

/// `((v_0 + v_1) + v_2) + … + v_{S−1}` (f32 adds, round to nearest) of
/// the slot partials `v_s` at `base + s·stride`, in slot order. The loads go
/// in rounds of `ROUND`, a whole round in flight (past the last slot a
/// round repeats it and does not add it), so a sum of S partials waits
/// about S / `ROUND` shared-memory latencies instead of S. `SITE` only
/// separates the copies of its callers ([`body`] 0, [`pair`] 1, the block
/// variant's reduction 2): with one function for several, LLVM shaped the
/// dense instances' loop differently and ptxas took some of them past 64
/// registers.
///
/// # Safety
/// `base + s·stride` is a valid shared address for every `s < slots`;
/// `slots ≥ 1`.
#[inline(always)]
pub(crate) unsafe fn sum_slots_in_order<const SITE: u8, const ROUND: usize>(base: u32, stride: u32, slots: u32) -> f32 {
    let at = |s: u32| base + s.min(slots - 1) * stride;
    let mut v = 0f32;
    let mut s = 0u32;
    while s < slots && ROUND == 4 {
        // Rounds of four spelled out: the block variant's instances were
        // allocated around this form.
        let (x0, x1, x2, x3) = unsafe {
            (
                ptx::ld_shared_f32(at(s)),
                ptx::ld_shared_f32(at(s + 1)),
                ptx::ld_shared_f32(at(s + 2)),
                ptx::ld_shared_f32(at(s + 3)),
            )
        };
        v = if s == 0 { x0 } else { ptx::add_rn_f32(v, x0) };
        if s + 1 < slots {
            v = ptx::add_rn_f32(v, x1);
        }
        if s + 2 < slots {
            v = ptx::add_rn_f32(v, x2);
        }
        if s + 3 < slots {
            v = ptx::add_rn_f32(v, x3);
        }
        s += 4;
    }
    while s < slots && ROUND != 4 {
        let x: [f32; ROUND] = core::array::from_fn(|j| unsafe { ptx::ld_shared_f32(at(s + j as u32)) });
        for (j, &xj) in x.iter().enumerate() {
            let i = s + j as u32;
            if i == 0 {
                v = xj;
            } else if i < slots {
                v = ptx::add_rn_f32(v, xj);
            }
        }
        s += ROUND as u32;
    }
    v
}

/// Body of `kbit_gemv_m{M}_k{K}_{T}`: block `b` computes columns
/// `b·C .. (b+1)·C` of all `M` rows.
///
/// # Safety
/// As [`body`] with `rows = M`; grid `ceil(N / C)` blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn dense<const M: usize, const K: usize, T: Elem<Raw = u16>>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
) {
    unsafe { body::<M, K, T, false>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, ptx::bid()) }
}

/// Requests into L2 the plane words and scale bytes of tiles `from .. to`
/// of one thread of [`body`] (`at` is the cursor of tile `from`, `exists`
/// says whether tile `i` lies inside K): the first and last byte of each
/// tile's span, which covers the lines of the 16..40-byte plane span of
/// k = 2..5 (a warp's requests for one line are merged).
///
/// # Safety
/// `at` describes a column of the matrix (only tiles that exist are requested).
#[inline(always)]
unsafe fn prefetch_tiles<const K: usize>(mut at: Cursor, from: u32, to: u32, exists: impl Fn(u32) -> bool) {
    let mut i = from;
    while i < to {
        if exists(i) {
            let w = at.tile_words::<K>().cast::<u8>();
            unsafe {
                ptx::prefetch_l2(w);
                ptx::prefetch_l2(w.wrapping_add(8 * K - 1));
                ptx::prefetch_l2(at.tile_scales());
            }
        }
        at.advance();
        i += 1;
    }
}

/// Requests into L2 the first two K tiles that this thread of [`body`]
/// loads for column block `col_block` of the matrix at `packed` / `scales`
/// ([`prefetch_tiles`]).
///
/// # Safety
/// As [`body`] (only addresses of tiles that exist are requested).
#[inline(always)]
unsafe fn prefetch_first_tiles<const K: usize>(
    packed: *const u32,
    scales: *const u8,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    col_block: u32,
) {
    let geo = Geometry::unpack(geom);
    let t = ptx::tid();
    let cols = geo.cols();
    let slot = t >> geo.log_cols;
    let n = col_block as u64 * cols as u64 + (t & (cols - 1)) as u64;
    let k_tiles = (k_dim >> 6) + (k_dim & 63 != 0) as u32;
    if n >= n_dim as u64 {
        return;
    }
    let at = Cursor::new(packed, scales, n_dim as u64, n, slot as u64, geo.slots() as u64);
    unsafe { prefetch_tiles::<K>(at, 0, 2, |i| (i << geo.log_slots) + slot < k_tiles) };
}

/// Body of `kbit_grouped_gemv_m{M}_k{K}_{T}` (M = max_m): block
/// `b = unit·col_blocks + cb`; the block of an expert's unit
/// (`grouped_unit`) computes column block `cb` of that expert's first
/// `min(rows, M)` rows with exactly the dense code path; every other block
/// returns. `PAIRS` (the `kbit_grouped_gemv_pairs_*` entries): blocks of
/// two column groups, [`pair`]; a separate entry, so that each path gets
/// its own register allocation (in one kernel both took up to 72).
///
/// # Safety
/// `packed`/`scales` hold `num_experts` matrices `[n_dim, k_dim]` back to
/// back (`tile::words` / `tile::scales` apart); `offsets` holds
/// `num_experts + 1` values (if they are not non-decreasing from 0 with
/// `offsets[E] = total_rows`, results are unspecified but every access stays
/// inside `total_rows` rows); `x`/`y` hold `total_rows` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn grouped<const M: usize, const K: usize, T: Elem<Raw = u16>, const PAIRS: bool>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    offsets: *const u32,
    num_experts: u32,
    total_rows: u32,
    status: *mut u32,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    col_blocks: u32,
) {
    let Some(col_blocks) = NonZeroU32::new(col_blocks) else { return ptx::after_producers() };
    let b = ptx::bid();
    let col_block = b % col_blocks;
    let words = tile::words(n_dim as usize, k_dim as usize, K) as u64;
    let bytes = tile::scales(n_dim as usize, k_dim as usize) as u64;
    // The expert offsets come from earlier kernels (the router) and are read
    // only after the wait. Before it, the block requests into L2 the first
    // weight tiles of expert `unit` (weights are never written by the
    // kernels this launch may overlap): its expert when there are fewer
    // experts than rows, and, with as many, the expert of row `unit`
    // whenever every expert has one row (the decode step of a MoE layer
    // whose active experts were passed); a wrong guess costs two tiles
    // per thread of bandwidth, nothing else. Only blocks of the first wave
    // (at most two 512-thread blocks per SM) do it: a later block starts
    // after the wait has passed, and its request would only precede its
    // own loads (64 experts × 1 row: 2-5 % slower with every block
    // requesting).
    let unit = b / col_blocks;
    if PAIRS {
        let m = Matrices { packed, scales, words, bytes };
        let rows = Rows { x, y, offsets, num_experts, total_rows, status };
        return unsafe { pair::<M, K, T>(&m, cb, &rows, n_dim, k_dim, geom, col_block, unit) };
    }
    if num_experts <= total_rows && unit < num_experts && b < 2 * ptx::sm_id_bound() {
        let e = unit as u64;
        let (p, s) = (packed.wrapping_add((e * words) as usize), scales.wrapping_add((e * bytes) as usize));
        unsafe { prefetch_first_tiles::<K>(p, s, n_dim, k_dim, geom, col_block) };
    }
    ptx::after_producers();
    let Some((e, row, rows)) = (unsafe { grouped_unit(offsets, num_experts, total_rows, status, M as u32, unit) })
    else {
        return;
    };
    let e = e as u64;
    unsafe {
        body::<M, K, T, true>(
            packed.add((e * words) as usize),
            scales.add((e * bytes) as usize),
            cb,
            x.add((row as u64 * k_dim as u64) as usize),
            y.add((row as u64 * n_dim as u64) as usize),
            rows,
            n_dim,
            k_dim,
            geom,
            col_block,
        )
    }
}

/// The experts' matrices back to back: planes at `packed + e·words`,
/// scales at `scales + e·bytes`.
struct Matrices {
    packed: *const u32,
    scales: *const u8,
    words: u64,
    bytes: u64,
}

impl Matrices {
    /// Expert `e`'s plane and scale arrays.
    #[inline(always)]
    fn of(&self, e: u32) -> (*const u32, *const u8) {
        let e = e as u64;
        (self.packed.wrapping_add((e * self.words) as usize), self.scales.wrapping_add((e * self.bytes) as usize))
    }
}

/// The grouped call's activations, outputs, expert offsets and status
/// word.
struct Rows {
    x: *const u16,
    y: *mut u16,
    offsets: *const u32,
    num_experts: u32,
    total_rows: u32,
    status: *mut u32,
}

/// A grouped block of two column groups (`J = 2`, the host's choice for
/// matrices whose slots own one K tile each, `S ≥` the K tiles, when the
/// units would otherwise need more than one block per SM): columns `col`
/// and `col + C` of the block's `2C`. Each thread's two tiles are loaded
/// before the grid-dependency wait, from expert `unit` (its expert when
/// there are fewer experts than rows, and with as many, the expert of row
/// `unit` whenever every expert has one row: the decode step of a MoE
/// layer), and again after it only when the guess was wrong. With half
/// the blocks, the next launch's blocks find room beside this one's and
/// do the same. Each column's arithmetic is the dense kernel's, in its
/// order (one tile per slot, slot partials added in slot order); at M ≥ 2
/// and k ≤ 4 the two columns share each activation load
/// ([`fma_tile_pair`]).
///
/// # Safety
/// As [`grouped`], with `S ≥ k_tiles` and `log_reps = 1` in `geom` (the
/// host launches the pairs entries with such geometries only).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pair<const M: usize, const K: usize, T: Elem<Raw = u16>>(
    m: &Matrices,
    cb: *const f32,
    io: &Rows,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    col_block: u32,
    unit: u32,
) {
    let geo = Geometry::unpack(geom);
    let t = ptx::tid();
    let cols = geo.cols();
    let col = t & (cols - 1);
    let slot = t >> geo.log_cols;
    let n_dim = n_dim as u64;
    let first_col = col_block as u64 * 2 * cols as u64;
    let (n_a, n_b) = (first_col + col as u64, first_col + (col + cols) as u64);
    let k_tiles = (k_dim >> 6) + (k_dim & 63 != 0) as u32;
    let policy = ptx::policy_evict_first();
    // Tile `slot` of column n (the slot's only tile), if it exists.
    let load = |(p, s): (*const u32, *const u8), n: u64| {
        if n < n_dim && slot < k_tiles {
            unsafe { Cursor::new(p, s, n_dim, n, slot as u64, geo.slots() as u64).load::<K>(policy) }
        } else {
            Tile::<K>::ZERO
        }
    };
    let guessed = io.num_experts <= io.total_rows && unit < io.num_experts;
    let (mut ta, mut tb) = (Tile::<K>::ZERO, Tile::<K>::ZERO);
    if guessed {
        (ta, tb) = (load(m.of(unit), n_a), load(m.of(unit), n_b));
    }
    let base = ptx::smem_base();
    // The codebook is never written by the kernels this launch may overlap.
    unsafe { build_table::<K, M>(cb, base) };
    ptx::after_producers();
    let xs = base + g::table_bytes(K as u32, M as u32);
    let x_of = |row: u32| io.x.wrapping_add((row as u64 * k_dim as u64) as usize);
    let work = |unit| unsafe { grouped_unit(io.offsets, io.num_experts, io.total_rows, io.status, M as u32, unit) };
    // With a unit per row (no fewer experts than rows) a working block's
    // first row is its unit: its activations are requested with the
    // offsets, not after them. Rows past the expert's own are staged too;
    // their sums are never stored.
    // (At M ≤ 2 a thread has one unit to stage in blocks of 16 or more
    // columns, as on the MoE shapes, so one load goes ahead; in narrower
    // blocks the second is loaded after the offsets.)
    let mut found = None;
    if io.num_experts >= io.total_rows {
        let (x, ahead) = (x_of(unit), io.total_rows.saturating_sub(unit).min(M as u32));
        let between = || found = work(unit);
        unsafe {
            if M <= 2 {
                stage_x::<M, T, 1>(x, k_dim, ahead, 0, geo.slots(), xs, between)
            } else {
                stage_x::<M, T, 2>(x, k_dim, ahead, 0, geo.slots(), xs, between)
            }
        }
    } else {
        found = work(unit);
    }
    let Some((e, row, rows)) = found else {
        return;
    };
    if !guessed || e != unit {
        (ta, tb) = (load(m.of(e), n_a), load(m.of(e), n_b));
    }
    if io.num_experts < io.total_rows {
        unsafe { stage_x::<M, T, 2>(x_of(row), k_dim, rows, 0, geo.slots(), xs, || {}) };
    }
    let y = io.y.wrapping_add((row as u64 * n_dim) as usize);
    let copy = g::copy_byte(K as u32, g::rows(M as u32), t);
    ptx::bar_sync();
    // Staged tile `slot` of the one chunk (all of K).
    let at_x = xs + slot * gs::x_tile_floats(M as u32) * 4;
    let (mut acc_a, mut acc_b) = ([[0f32; M]; 2], [[0f32; M]; 2]);
    // Slots past K hold zero tiles (scale 0) against zero activations:
    // they add +0, as the dense kernel's skipped tiles leave +0. An expert
    // with one row is summed as the dense one-row call sums it
    // ([`fma_block`]), at k = 4 one column after the other.
    let one_row = M == 1 || rows == 1;
    let folded_one_row = K != 2 && one_row && gs::folds(K as u32, 1);
    if M >= 2 && K <= 4 && !folded_one_row {
        // Both columns over each staged activation octet.
        unsafe { fma_tile_pair::<M, K>(&ta, &tb, base, copy, at_x, &mut acc_a, &mut acc_b) };
    } else if M == 1 && K <= 3 {
        // The two columns' block 0, a warp barrier, then their block 1:
        // each staged activation octet is loaded once for both columns in
        // 56-63 registers (both tiles left free take 96-100). Each column
        // still sums block 0, then block 1. H100, 8 experts: k = 2
        // -10 to -13 %, k = 3 -2 %. At k = 4, 5 this form takes 69 and 72
        // registers, one block per SM (+16 to +19 %; k = 4 held to 64:
        // +7 to +8 %, at 64 experts -1 to 0 %), so k = 4 keeps the free
        // interleave below and k = 5 the barrier.
        unsafe {
            fma_block::<M, K>(ta.block(0), base, copy, at_x, &mut acc_a, one_row);
            fma_block::<M, K>(tb.block(0), base, copy, at_x, &mut acc_b, one_row);
            ptx::syncwarp();
            fma_block::<M, K>(ta.block(1), base, copy, at_x + 4 * 32, &mut acc_a, one_row);
            fma_block::<M, K>(tb.block(1), base, copy, at_x + 4 * 32, &mut acc_b, one_row);
        }
    } else {
        unsafe { fma_tile::<M, K>(&ta, base, copy, at_x, &mut acc_a, one_row) };
        // One tile at a time (a warp barrier between them), except at
        // M = 1, k = 4. Left free, ptxas interleaves the two: at M = 1,
        // k = 4 in 54 registers, each staged activation octet loaded once
        // for both columns; at k = 5 slower, with more rows in up to
        // twice the registers.
        if M != 1 || K != 4 {
            ptx::syncwarp();
        }
        unsafe { fma_tile::<M, K>(&tb, base, copy, at_x, &mut acc_b, one_row) };
    }
    let at = Columns { xs, first_col, n_dim, log_span: geo.log_cols + 1, slots: geo.slots() };
    unsafe {
        if K == 5 {
            finish::<M, 2, T, 4>(&at, [acc_a, acc_b], t, slot, col, rows, y)
        } else {
            finish::<M, 2, T, 16>(&at, [acc_a, acc_b], t, slot, col, rows, y)
        }
    }
}

/// One grouped entry point: [`grouped`] with `PAIRS` for this max_m, k and dtype.
macro_rules! grouped_entry {
    ($name:ident, $doc:literal, $m:literal, $k:literal, $t:ty, $pairs:literal) => {
        #[doc = $doc]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            packed: *const u32,
            scales: *const u8,
            cb: *const f32,
            x: *const u16,
            y: *mut u16,
            offsets: *const u32,
            num_experts: u32,
            total_rows: u32,
            status: *mut u32,
            n_dim: u32,
            k_dim: u32,
            geom: u32,
            col_blocks: u32,
        ) {
            unsafe {
                grouped::<$m, $k, $t, $pairs>(
                    packed,
                    scales,
                    cb,
                    x,
                    y,
                    offsets,
                    num_experts,
                    total_rows,
                    status,
                    n_dim,
                    k_dim,
                    geom,
                    col_blocks,
                )
            }
        }
    };
}

macro_rules! gemv_slots_entries {
    ($($dense:ident $grouped:ident $pairs:ident: $m:literal, $k:literal, $t:ty;)*) => {$(
        /// Dense column-slot scalar GEMV ([`dense`]) for this M, k and dtype.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $dense(
            packed: *const u32, scales: *const u8, cb: *const f32, x: *const u16, y: *mut u16,
            n_dim: u32, k_dim: u32, geom: u32,
        ) {
            unsafe { dense::<$m, $k, $t>(packed, scales, cb, x, y, n_dim, k_dim, geom) }
        }

        grouped_entry!($grouped, "Grouped (MoE) column-slot scalar GEMV ([`grouped`]).", $m, $k, $t, false);
        grouped_entry!(
            $pairs,
            "Grouped column-slot scalar GEMV, two column groups per block ([`pair`]; `geom` with `log_reps = 1`).",
            $m, $k, $t, true
        );
    )*};
}

gemv_slots_entries! {
    kbit_gemv_slots_m1_k2_f16 kbit_grouped_gemv_slots_m1_k2_f16 kbit_grouped_gemv_pairs_m1_k2_f16: 1, 2, F16;
    kbit_gemv_slots_m1_k3_f16 kbit_grouped_gemv_slots_m1_k3_f16 kbit_grouped_gemv_pairs_m1_k3_f16: 1, 3, F16;
    kbit_gemv_slots_m1_k4_f16 kbit_grouped_gemv_slots_m1_k4_f16 kbit_grouped_gemv_pairs_m1_k4_f16: 1, 4, F16;
    kbit_gemv_slots_m1_k5_f16 kbit_grouped_gemv_slots_m1_k5_f16 kbit_grouped_gemv_pairs_m1_k5_f16: 1, 5, F16;
    kbit_gemv_slots_m2_k2_f16 kbit_grouped_gemv_slots_m2_k2_f16 kbit_grouped_gemv_pairs_m2_k2_f16: 2, 2, F16;
    kbit_gemv_slots_m2_k3_f16 kbit_grouped_gemv_slots_m2_k3_f16 kbit_grouped_gemv_pairs_m2_k3_f16: 2, 3, F16;
    kbit_gemv_slots_m2_k4_f16 kbit_grouped_gemv_slots_m2_k4_f16 kbit_grouped_gemv_pairs_m2_k4_f16: 2, 4, F16;
    kbit_gemv_slots_m2_k5_f16 kbit_grouped_gemv_slots_m2_k5_f16 kbit_grouped_gemv_pairs_m2_k5_f16: 2, 5, F16;
    kbit_gemv_slots_m3_k2_f16 kbit_grouped_gemv_slots_m3_k2_f16 kbit_grouped_gemv_pairs_m3_k2_f16: 3, 2, F16;
    kbit_gemv_slots_m3_k3_f16 kbit_grouped_gemv_slots_m3_k3_f16 kbit_grouped_gemv_pairs_m3_k3_f16: 3, 3, F16;
    kbit_gemv_slots_m3_k4_f16 kbit_grouped_gemv_slots_m3_k4_f16 kbit_grouped_gemv_pairs_m3_k4_f16: 3, 4, F16;
    kbit_gemv_slots_m3_k5_f16 kbit_grouped_gemv_slots_m3_k5_f16 kbit_grouped_gemv_pairs_m3_k5_f16: 3, 5, F16;
    kbit_gemv_slots_m4_k2_f16 kbit_grouped_gemv_slots_m4_k2_f16 kbit_grouped_gemv_pairs_m4_k2_f16: 4, 2, F16;
    kbit_gemv_slots_m4_k3_f16 kbit_grouped_gemv_slots_m4_k3_f16 kbit_grouped_gemv_pairs_m4_k3_f16: 4, 3, F16;
    kbit_gemv_slots_m4_k4_f16 kbit_grouped_gemv_slots_m4_k4_f16 kbit_grouped_gemv_pairs_m4_k4_f16: 4, 4, F16;
    kbit_gemv_slots_m4_k5_f16 kbit_grouped_gemv_slots_m4_k5_f16 kbit_grouped_gemv_pairs_m4_k5_f16: 4, 5, F16;
    kbit_gemv_slots_m1_k2_bf16 kbit_grouped_gemv_slots_m1_k2_bf16 kbit_grouped_gemv_pairs_m1_k2_bf16: 1, 2, Bf16;
    kbit_gemv_slots_m1_k3_bf16 kbit_grouped_gemv_slots_m1_k3_bf16 kbit_grouped_gemv_pairs_m1_k3_bf16: 1, 3, Bf16;
    kbit_gemv_slots_m1_k4_bf16 kbit_grouped_gemv_slots_m1_k4_bf16 kbit_grouped_gemv_pairs_m1_k4_bf16: 1, 4, Bf16;
    kbit_gemv_slots_m1_k5_bf16 kbit_grouped_gemv_slots_m1_k5_bf16 kbit_grouped_gemv_pairs_m1_k5_bf16: 1, 5, Bf16;
    kbit_gemv_slots_m2_k2_bf16 kbit_grouped_gemv_slots_m2_k2_bf16 kbit_grouped_gemv_pairs_m2_k2_bf16: 2, 2, Bf16;
    kbit_gemv_slots_m2_k3_bf16 kbit_grouped_gemv_slots_m2_k3_bf16 kbit_grouped_gemv_pairs_m2_k3_bf16: 2, 3, Bf16;
    kbit_gemv_slots_m2_k4_bf16 kbit_grouped_gemv_slots_m2_k4_bf16 kbit_grouped_gemv_pairs_m2_k4_bf16: 2, 4, Bf16;
    kbit_gemv_slots_m2_k5_bf16 kbit_grouped_gemv_slots_m2_k5_bf16 kbit_grouped_gemv_pairs_m2_k5_bf16: 2, 5, Bf16;
    kbit_gemv_slots_m3_k2_bf16 kbit_grouped_gemv_slots_m3_k2_bf16 kbit_grouped_gemv_pairs_m3_k2_bf16: 3, 2, Bf16;
    kbit_gemv_slots_m3_k3_bf16 kbit_grouped_gemv_slots_m3_k3_bf16 kbit_grouped_gemv_pairs_m3_k3_bf16: 3, 3, Bf16;
    kbit_gemv_slots_m3_k4_bf16 kbit_grouped_gemv_slots_m3_k4_bf16 kbit_grouped_gemv_pairs_m3_k4_bf16: 3, 4, Bf16;
    kbit_gemv_slots_m3_k5_bf16 kbit_grouped_gemv_slots_m3_k5_bf16 kbit_grouped_gemv_pairs_m3_k5_bf16: 3, 5, Bf16;
    kbit_gemv_slots_m4_k2_bf16 kbit_grouped_gemv_slots_m4_k2_bf16 kbit_grouped_gemv_pairs_m4_k2_bf16: 4, 2, Bf16;
    kbit_gemv_slots_m4_k3_bf16 kbit_grouped_gemv_slots_m4_k3_bf16 kbit_grouped_gemv_pairs_m4_k3_bf16: 4, 3, Bf16;
    kbit_gemv_slots_m4_k4_bf16 kbit_grouped_gemv_slots_m4_k4_bf16 kbit_grouped_gemv_pairs_m4_k4_bf16: 4, 4, Bf16;
    kbit_gemv_slots_m4_k5_bf16 kbit_grouped_gemv_slots_m4_k5_bf16 kbit_grouped_gemv_pairs_m4_k5_bf16: 4, 5, Bf16;
}
