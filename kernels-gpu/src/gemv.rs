//! Scalar GEMV `y[M, N] = x[M, K] · Wᵀ` for M = 1..4 on the runtime (tiled)
//! layout: dense (kernel 1) and grouped over MoE experts (kernel 4), f16 or
//! bf16 activations, f32 accumulation, deterministic.
//!
//! # Work mapping
//!
//! A block owns [`g::BLOCK_COLS`] = 32 consecutive columns, two groups of
//! 16, and all of K; its `W` warps split the K tiles (`W` and the staging
//! chunk `R` are packed in `geom`, see `kbit_format::gemv::Geometry`).
//! Warp `w` takes the K tiles `kt = w, w + W, w + 2W, …`. Lane `l` is
//! column `l / 2` of each group and half `h = l % 2` of the tile: the 16
//! columns of a group are 32 consecutive quant blocks in the runtime layout,
//! so for one tile and group the warp reads one contiguous span of `32·k`
//! words and the lane's block starts `l·k` words into it (k = 4: one
//! 16-byte load per lane, 512 contiguous bytes per warp), plus its scale
//! byte (32 contiguous bytes). Loads run three tiles ahead of the math (four
//! register buffers used in turn, the loop unrolled by four), evict-first in
//! L1 and L2: nothing of the weights is read twice. The dense grid is
//! persistent (one round of resident blocks, each walking column blocks
//! `b, b + grid, …`) and a lane's loads form one stream across its column
//! blocks, so the pipeline does not drain between them.
//!
//! # Teams
//!
//! A block may hold `H` teams of `W` warps (`H` = 2 for dense calls on
//! large matrices when registers and shared memory allow; 1 otherwise).
//! The teams share the decode table and the activations, which are then
//! staged once for all of K; each team has its own rings, reduction buffer
//! and named barrier (`1 + team`) and walks its own column blocks: team
//! `h` of block `b` is virtual block `b + h·grid` of a grid of `H·grid`.
//! With one block per SM, each SM then takes column blocks `b, b + grid,
//! …`, and no SM gets more than one column block above the average (two
//! blocks of one team each would be paired on an SM as the hardware
//! places them, and an SM holding two blocks with one extra column block
//! each sets the kernel's time).
//!
//! # Activations and decode
//!
//! `x` for `R·W` consecutive tiles (all of K when it fits: then once per
//! block) is staged in shared memory as f32
//! (`[tile][row][h][36]`: the 4 floats of padding put the two halves a warp
//! reads at once in different banks); lanes read it with broadcast 16-byte
//! loads, 8 activations of all M rows at a time, and use them for both
//! column groups. Rows past the caller's row count and columns past K are
//! staged as zeros, so `x` is never read out of bounds and the zero half
//! tile of `K % 64 == 32` contributes exactly 0. Bit planes are turned into
//! table fields with a few shifts and masks (`kbit_format::gemv`), and one
//! shared-memory load dequantizes a whole field: four codebook values for
//! k = 2, two for k = 3, 4 (per-lane replicated tables, conflict-free), one
//! for k = 5. A lookup's address is one `prmt` for k = 5 (the field bytes
//! are entry offsets) and at M = 1 (a row and a column word,
//! `kbit_format::gemv`, "Table addresses"); at M ≥ 2 for k ≤ 4 it is a
//! `prmt` and a multiply-add. The codebook values are FMA'd into a per-block dot product,
//! which is scaled once by the block's E4M4 scale.
//!
//! # Pair sums (k = 2, M = 1)
//!
//! With one row at k = 2 a block stages, instead of the activations, the
//! 2 KiB pair-sum table of every K tile (`kbit_format::gemv`, "Pair
//! sums"), built from `x` and the four codebook values ([`build_sums`]);
//! a lane's block is then 16 `prmt` + 4-byte lookup + add. Where the
//! tables of all of K do not fit (Llama-3-70B: 256 KiB), a block walks K in
//! chunks of `R·W` tiles, each chunk over all of its column blocks, and its
//! threads keep their accumulators between chunks in shared memory
//! (`Geometry::sums_slot_bytes`): each chunk's tables are built once per
//! block, and every output is summed exactly as in one pass.
//!
//! # Reduction
//!
//! Each lane keeps one f32 accumulator per (group, row). At the end the two
//! halves of a column meet through a lane shuffle, the `W` warp partials of
//! each (row, column) go through their own shared buffer and one thread adds them in
//! warp order. The order is fixed by `W`, which the host derives from the
//! shape alone (`kbit_format::gemv::warps`), so results are identical run to
//! run and the grouped kernel matches the dense one bit for bit. No atomics,
//! no cross-block traffic.
//!
//! # Grouped
//!
//! The grid is `units × column blocks`, `units = min(experts, total_rows)`
//! (`crate::gemv::grouped_unit`). With fewer experts than rows, block
//! `(e, cb)` works on expert `e`'s rows (none: it exits). Otherwise block
//! `(row, cb)` finds the expert owning `row` (each warp counts the offsets
//! `≤ row`, a cached scan with no dependent loads); only the block of an
//! expert's first row works, and empty experts own no row and launch
//! nothing. Either way at most `max_m` rows; an expert with one row runs
//! the one-row code (at k = 2 the pair sums), as a dense call of it would.

use crate::elem::{Bf16, Elem, F16};
use crate::ptx;
use crate::stage_x;
use core::num::NonZeroU32;
use kbit_format::gemv::{self as g, Geometry};
use kbit_format::{e4m4, tile};

/// Column groups per block.
const G: usize = g::COL_GROUPS as usize;

/// One K tile of a lane: its quant block in each of the `NG` column groups
/// (planes and E4M4 scale byte), read from the warp's ring.
#[derive(Clone, Copy)]
struct Unit<const K: usize, const NG: usize> {
    planes: [[u32; K]; NG],
    scales: [u32; NG],
}

/// Global byte addresses of the spans of one K tile of a column block (the
/// plane words of quant blocks `2·(kt·N + first_col) ..`, `64·k` words, and
/// their 64 scale bytes), and the step to the warp's next tile.
#[derive(Clone, Copy)]
struct Spans {
    planes: u64,
    scales: u64,
}

impl Spans {
    /// The spans of tile `kt`, columns `first_col .. first_col + 32`.
    #[inline(always)]
    fn at<const K: usize>(packed: *const u32, scales: *const u8, n_dim: u64, kt: u64, first_col: u64) -> Self {
        let block = 2 * (kt * n_dim + first_col);
        Self { planes: packed as u64 + 4 * K as u64 * block, scales: scales as u64 + block }
    }

    /// The distance between a warp's consecutive tiles (`W` tiles apart).
    #[inline(always)]
    fn step<const K: usize>(n_dim: u64, warps: u64) -> Self {
        Self { planes: 8 * K as u64 * warps * n_dim, scales: 2 * warps * n_dim }
    }

    #[inline(always)]
    fn advance(&mut self, by: Spans) {
        self.planes = self.planes.wrapping_add(by.planes);
        self.scales = self.scales.wrapping_add(by.scales);
    }
}

/// 16-byte chunks of a stage's plane span of `ng` column groups: `8k·ng`,
/// plus one for odd k, whose spans are only 8-aligned (even-k spans are
/// 16-aligned whenever the matrix is: `8k` bytes per quant block pair).
const fn plane_chunks(k: usize, ng: usize) -> u32 {
    8 * (k * ng) as u32 + (k % 2) as u32
}

/// Issues the copies of one K tile's spans of `NG` column groups into the
/// ring stage at shared address `dst`: each span from the 16-byte boundary
/// at or below its start (plane chunks, then `2·NG + 1` chunks of scales).
/// Away from the end of the arrays every copy is a plain 16-byte
/// `cp.async` (a lane issues at most `ceil(chunks / 32)`); near it, bytes
/// at or past `words_end` / `scales_end` are zero-filled and never read.
/// Where the copies end before the arrays do is `plain` when the caller
/// knows it ([`Plain`]), else found from the addresses. The caller commits.
///
/// # Safety
/// `dst` is a stage of [`g::stage_bytes`]; everything between the aligned
/// starts and the ends is readable global memory; `plain` is `Some(true)`
/// only where the copies end before `words_end` and `scales_end`.
#[inline(always)]
unsafe fn copy_tile<const K: usize, const NG: usize>(
    sp: Spans,
    plain: Option<bool>,
    words_end: u64,
    scales_end: u64,
    lane: u32,
    dst: u32,
) {
    let chunks = plane_chunks(K, NG);
    let scale_chunks = 2 * NG as u32 + 1;
    let plane0 = sp.planes & !15;
    let scale0 = sp.scales & !15;
    let inside = match plain {
        Some(plain) => plain,
        None => plane0 + 16 * chunks as u64 <= words_end && scale0 + 16 * scale_chunks as u64 <= scales_end,
    };
    if inside {
        for j in 0..chunks.div_ceil(32) {
            let c = lane + 32 * j;
            if c < chunks {
                unsafe { ptx::cp_async_16(dst + 16 * c, (plane0 + 16 * c as u64) as *const u8) };
            }
        }
        if lane < scale_chunks {
            unsafe {
                ptx::cp_async_16(dst + g::stage_scales(K as u32) + 16 * lane, (scale0 + 16 * lane as u64) as *const u8)
            };
        }
        return;
    }
    let mut c = lane;
    while c < chunks {
        let at = plane0 + 16 * c as u64;
        let size = words_end.saturating_sub(at).min(16) as u32;
        let src = if size > 0 { at } else { plane0 };
        unsafe { ptx::cp_async_16_zfill(dst + 16 * c, src as *const u8, size) };
        c += 32;
    }
    if lane < scale_chunks {
        let at = scale0 + 16 * lane as u64;
        let size = scales_end.saturating_sub(at).min(16) as u32;
        let src = if size > 0 { at } else { scale0 };
        unsafe { ptx::cp_async_16_zfill(dst + g::stage_scales(K as u32) + 16 * lane, src as *const u8, size) };
    }
}

/// Which copies of a column block's tiles end before the arrays do, by
/// tile index alone. A tile's copies start at or below its spans and end
/// at most 16 bytes past them (`copy_tile`); the spans of column block
/// `cb < last` are followed by those of `cb + 1` in the same tile row, and
/// the last column block's (which may reach up to 31 columns past `N`, 62
/// scale bytes) by the rows of the tiles after it, `2N` scale bytes and
/// `8kN` plane bytes each. So the copies of tile `kt` are plain unless the
/// column block is the last and fewer than `ceil(40 / N)` tile rows follow
/// (`2N·rows ≥ 2·31 + 16`, and the plane bytes then suffice too).
#[derive(Clone, Copy)]
struct Plain {
    last_cb: u32,
    safe_tiles: u32,
}

impl Plain {
    #[inline(always)]
    fn new(n_dim: u32, k_tiles: u32, cols: u32) -> Self {
        let after = if n_dim >= 40 { 1 } else { 40_u32.div_ceil(n_dim.max(1)) };
        Self { last_cb: n_dim.saturating_sub(1) / cols, safe_tiles: k_tiles.saturating_sub(after) }
    }

    /// Whether the copies of tile `kt` of column block `cb` are plain.
    #[inline(always)]
    fn at(&self, cb: u32, kt: u32) -> bool {
        cb != self.last_cb || kt < self.safe_tiles
    }
}

/// Reads a lane's unit from a landed stage: block `32·gi + lane` of the
/// plane span (k words each; k = 2 and 4 spans start 16-aligned, so the
/// block is 8- or 16-aligned) and its scale byte.
///
/// # Safety
/// The stage holds the copies of `spans` and they are visible to this lane.
#[inline(always)]
unsafe fn read_unit<const K: usize, const NG: usize>(stage: u32, sp: Spans, lane: u32) -> Unit<K, NG> {
    let planes_at = stage + (sp.planes & 15) as u32;
    let scales_at = stage + g::stage_scales(K as u32) + (sp.scales & 15) as u32;
    let mut u = Unit { planes: [[0; K]; NG], scales: [0; NG] };
    for gi in 0..NG {
        let at = planes_at + 4 * (32 * K as u32 * gi as u32 + K as u32 * lane);
        unsafe {
            match K {
                2 => {
                    let v = ptx::ld_shared_v2(at);
                    u.planes[gi][0] = v[0];
                    u.planes[gi][1 % K] = v[1];
                }
                4 => {
                    let v = ptx::ld_shared_v4(at);
                    for j in 0..K {
                        u.planes[gi][j] = v[j % 4];
                    }
                }
                _ => {
                    for j in 0..K {
                        u.planes[gi][j] = ptx::ld_shared_u32(at + 4 * j as u32);
                    }
                }
            }
            u.scales[gi] = ptx::ld_shared_u8(scales_at + 32 * gi as u32 + lane);
        }
    }
    u
}

/// Writes the decode table for k = `K` at shared address `table` in the
/// layout of the instances for `M` rows (`kbit_format::gemv`: the row
/// layout when `rows(M)`, the field layout otherwise). For k ≤ 4 field `f`
/// fills its `field_bytes` at `field_offset(f)` with its replicated entry
/// (k = 2: 8 copies of the 4 values of a quad; k = 3, 4: 16 or 32 copies of
/// the 2 values of a pair), one thread per field, 16 bytes per store;
/// thread `f` starts at store `f % 8` so the 8 lanes of a quarter-warp
/// always write 8 different bank groups. For k = 5, `cb[g]` at
/// `4g`. The caller's next block barrier publishes it.
///
/// # Safety
/// `cb` holds `2^K` floats; the table fits the dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn build_table<const K: usize, const M: usize>(cb: *const f32, table: u32) {
    let entry = |i: u32| unsafe { ptx::ld_nc_u32((cb as *const u32).add(i as usize)) };
    let nt = ptx::block_dim();
    let mut f = ptx::tid();
    if K <= 4 {
        let rows = g::rows(M as u32);
        let stores = g::field_bytes(K as u32, rows) / 16;
        while f < g::table_fields(K as u32) {
            let v = if K == 2 {
                [
                    entry(g::quad_index(f, 0)),
                    entry(g::quad_index(f, 1)),
                    entry(g::quad_index(f, 2)),
                    entry(g::quad_index(f, 3)),
                ]
            } else {
                let (a, b) = (entry(g::pair_index(f, 0, K as u32)), entry(g::pair_index(f, 1, K as u32)));
                [a, b, a, b]
            };
            let at = table + g::field_offset(K as u32, rows, f);
            for j in 0..stores {
                let store = (j + f) % stores;
                unsafe { ptx::st_shared_v4(at + 16 * store, v) };
            }
            f += nt;
        }
    } else {
        while f < 32 {
            unsafe { ptx::st_shared_u32(table + 4 * f, entry(f)) };
            f += nt;
        }
    }
}

/// Stages `x` for tiles `first_tile .. first_tile + tiles` as f32 at shared
/// address `xs` in this variant's layout (`[tile][row][h][36]`, see
/// [`g::x_tile_floats`]: octet `o` of a row lies in half `o / 4`), through
/// [`stage_x::stage`] (`LEAD` and `between` as there).
///
/// # Safety
/// `x` holds `rows` rows of `k_dim` values and is 16-aligned; the staged
/// tiles fit the dynamic shared memory.
#[inline(always)]
unsafe fn stage_x<const M: usize, T: Elem<Raw = u16>, const LEAD: u32>(
    x: *const u16,
    k_dim: u32,
    rows: u32,
    first_tile: u32,
    tiles: u32,
    xs: u32,
    between: impl FnOnce(),
) {
    let stride = g::x_tile_floats(M as u32);
    let dst = |tc: u32, r: u32, o: u32| xs + (tc * stride + (r * 2 + (o >> 2)) * g::X_HALF_FLOATS + 8 * (o & 3)) * 4;
    unsafe { stage_x::stage::<M, T, LEAD>(x, k_dim, rows, first_tile, tiles, dst, between) }
}

/// The staged activations of 8 consecutive K positions, all rows (row
/// stride two padded halves).
///
/// # Safety
/// `addr` is 16-aligned and inside a staged tile.
#[inline(always)]
unsafe fn load_x8<const M: usize>(addr: u32) -> [[f32; 8]; M] {
    core::array::from_fn(|r| {
        let row = addr + 8 * g::X_HALF_FLOATS * r as u32;
        let (a, b) = unsafe { (ptx::ld_shared_v4(row), ptx::ld_shared_v4(row + 16)) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]].map(f32::from_bits)
    })
}

/// Lookup words of one block for the instances for `M` rows
/// (`kbit_format::gemv`). k = 5: the entry offsets of the singles in words
/// 0..8. k ≤ 4 with `rows(M)` ("Table addresses"): quad rows in words 0,
/// 1 and their columns in 4, 5 (k = 2), pair rows in 0..4 and columns in
/// 4..8 (k = 3, 4), `copy` being the thread's `copy_byte`; otherwise the
/// fields themselves: quads in words 0, 1, pairs in 0..4.
#[inline(always)]
pub(crate) fn lookup_words<const K: usize, const M: usize>(planes: &[u32; K], copy: u32) -> [u32; 8] {
    let rows = g::rows(M as u32);
    if K == 2 && rows {
        let a = g::quad_addresses::<K>(planes, copy);
        [a.row[0], a.row[1], 0, 0, a.col[0], a.col[1], 0, 0]
    } else if K == 2 {
        let q = g::quad_words::<K>(planes);
        [q[0], q[1], 0, 0, 0, 0, 0, 0]
    } else if K <= 4 && rows {
        let a = g::pair_addresses::<K>(planes, copy);
        [a.row[0], a.row[1], a.row[2], a.row[3], a.col[0], a.col[1], a.col[2], a.col[3]]
    } else if K <= 4 {
        let p = g::pair_words::<K>(planes);
        [p[0], p[1], p[2], p[3], 0, 0, 0, 0]
    } else {
        g::wide_words::<K>(planes)
    }
}

/// The shared address of lookup `q` of octet `m8` from [`lookup_words`]
/// (k ≤ 4): one `prmt` of the row and column words with `rows(M)`, else
/// the field byte times 128 from this thread's copy at `mine`.
#[inline(always)]
pub(crate) fn lookup_at<const M: usize>(w: &[u32; 8], q: usize, m8: u32, table: u32, mine: u32) -> u32 {
    if g::rows(M as u32) {
        table + ptx::prmt(w[4 + q], w[q], g::address_select(m8))
    } else {
        mine + ptx::prmt(w[q], 0, 0x4440 | m8) * 128
    }
}

/// The codebook values of elements `8m8 .. 8m8 + 8` of a block, in element
/// order, from its [`lookup_words`]: one shared load per quad, pair or
/// single. `mine` is this thread's copy of the table (`table + copy`).
///
/// # Safety
/// The table is built and published.
#[inline(always)]
unsafe fn decode8<const K: usize, const M: usize>(w: &[u32; 8], m8: u32, table: u32, mine: u32) -> [f32; 8] {
    let at = |q: usize| lookup_at::<M>(w, q, m8, table, mine);
    let v: [u32; 8] = unsafe {
        if K == 2 {
            // Quad a is elements 8m8 + {0, 1, 4, 5}, quad b + {2, 3, 6, 7}.
            let a = ptx::ld_shared_v4(at(0));
            let b = ptx::ld_shared_v4(at(1));
            [a[0], a[1], b[0], b[1], a[2], a[3], b[2], b[3]]
        } else if K <= 4 {
            // Pair q is elements 8m8 + 2q, 8m8 + 2q + 1.
            let p: [[u32; 2]; 4] = core::array::from_fn(|q| ptx::ld_shared_v2(at(q)));
            [p[0][0], p[0][1], p[1][0], p[1][1], p[2][0], p[2][1], p[3][0], p[3][1]]
        } else {
            core::array::from_fn(|c| ptx::ld_shared_u32(table + ptx::prmt(w[c], 0, 0x4440 | m8)))
        }
    };
    v.map(f32::from_bits)
}

/// Calls `f` for the four octets `m8 = 0..4` of a block: spelled out when
/// `unroll` (a compile-time value in every caller), so that each octet's
/// `prmt` selectors are immediates, which a loop the optimizer keeps
/// rolled would not give; else as a loop it may keep rolled (fewer
/// registers).
#[inline(always)]
pub(crate) fn each_octet(unroll: bool, mut f: impl FnMut(u32)) {
    if unroll {
        f(0);
        f(1);
        f(2);
        f(3);
    } else {
        for m8 in 0..4 {
            f(m8);
        }
    }
}

/// Accumulates one K tile of a lane (its block in each column group) into
/// `acc[gi][r]`: per group the block dot product `d` over the 32 elements
/// in order, then `acc = fma(d, scale, acc)`.
///
/// # Safety
/// The table is published; `xs` is the lane's staged half tile.
#[inline(always)]
unsafe fn fma_unit<const M: usize, const K: usize, const NG: usize>(
    u: &Unit<K, NG>,
    table: u32,
    copy: u32,
    xs: u32,
    acc: &mut [[f32; M]; NG],
) {
    let f: [[u32; 8]; NG] = core::array::from_fn(|gi| lookup_words::<K, M>(&u.planes[gi], copy));
    let mine = table + (copy & 0xFF);
    let mut d = [[0f32; M]; NG];
    each_octet(true, |m8| {
        let x = unsafe { load_x8::<M>(xs + 32 * m8) };
        for gi in 0..NG {
            let v = unsafe { decode8::<K, M>(&f[gi], m8, table, mine) };
            for c in 0..8 {
                for r in 0..M {
                    d[gi][r] = ptx::fma_rn_f32(v[c], x[r][c], d[gi][r]);
                }
            }
        }
    });
    for gi in 0..NG {
        // One row: the shift-and-multiply decode (the instances of more
        // rows keep the register allocation of the biased one).
        let scale = if M == 1 { e4m4::decode(u.scales[gi] as u8) } else { e4m4::decode_biased(u.scales[gi] as u8) };
        for r in 0..M {
            acc[gi][r] = ptx::fma_rn_f32(d[gi][r], scale, acc[gi][r]);
        }
    }
}

/// Builds the pair-sum tables (`kbit_format::gemv`, "Pair sums") of tiles
/// `first_tile .. first_tile + tiles` at shared address `at`, 2 KiB a tile.
/// Unit `u` is pair `j = (u / 2) % 16` of half `h = u % 2` of tile
/// `u / 32`: one 4-byte load of its two activations (zeros past K), four
/// products `cb[a] · x_0`, sixteen FMAs, four 16-byte stores, the store
/// order rotated by `j` so that the eight threads of a quarter-warp (four
/// pairs of both halves) write eight different bank groups.
///
/// # Safety
/// `cb` holds 4 floats, `x` `k_dim` values (16-aligned); the tiles fit the
/// dynamic shared memory; the caller's next block barrier publishes them.
#[inline(always)]
unsafe fn build_sums<T: Elem<Raw = u16>>(
    cb: *const f32,
    x: *const u16,
    k_dim: u32,
    first_tile: u32,
    tiles: u32,
    at: u32,
) {
    let entry = |i: usize| f32::from_bits(unsafe { ptx::ld_nc_u32((cb as *const u32).add(i)) });
    let (c0, c1, c2, c3) = (entry(0), entry(1), entry(2), entry(3));
    let nt = ptx::block_dim();
    let mut u = ptx::tid();
    while u < 32 * tiles {
        let (tc, h, j) = (u >> 5, u & 1, (u >> 1) & 15);
        let pos = (first_tile + tc) as u64 * 64 + 32 * h as u64 + 2 * j as u64;
        let raw = if pos < k_dim as u64 { unsafe { ptx::ld_nc_u32(x.add(pos as usize) as *const u32) } } else { 0 };
        let (x0, x1) = (T::to_f32(raw as u16), T::to_f32((raw >> 16) as u16));
        let first = [c0, c1, c2, c3].map(|v| ptx::mul_rn_f32(v, x0));
        let dst = at + tc * g::SUMS_TILE_BYTES + g::sum_offset(j, h, 0);
        for s in 0..4u32 {
            // Store `q` holds nibbles `4q .. 4q + 4`: nibble `4q + i` pairs
            // `cb[(i & 1) + 2·(q & 1)]` for x_0 with `cb[(i >> 1) + 2·(q >> 1)]`
            // for x_1 (`sum_indices`), picked by selects rather than by a
            // run-time array index.
            // (Named values, not arrays: the compiler turns a select between
            // two elements of one array into an index into local memory.)
            let q = (s + j) & 3;
            let (odd_a, odd_b) = (q & 1 != 0, q & 2 != 0);
            let (a0, a1) = if odd_a { (first[2], first[3]) } else { (first[0], first[1]) };
            let (b0, b1) = if odd_b { (c2, c3) } else { (c0, c1) };
            let v = [
                ptx::fma_rn_f32(b0, x1, a0),
                ptx::fma_rn_f32(b0, x1, a1),
                ptx::fma_rn_f32(b1, x1, a0),
                ptx::fma_rn_f32(b1, x1, a1),
            ]
            .map(f32::to_bits);
            unsafe { ptx::st_shared_v4(dst + 16 * q, v) };
        }
        u += nt;
    }
}

/// Accumulates one K tile of a lane with pair sums (M = 1, k = 2) into
/// `acc[gi][0]`: per group the block dot product `d = s_0 + … + s_15`
/// looked up in the tile's table at `tile` (a multiple of 256), then
/// `acc = fma(d, scale, acc)`.
///
/// # Safety
/// The tile's table is built and published.
#[inline(always)]
unsafe fn sums_unit<const M: usize, const K: usize, const NG: usize>(
    u: &Unit<K, NG>,
    tile: u32,
    h: u32,
    acc: &mut [[f32; M]; NG],
) {
    for gi in 0..NG {
        let f = g::sum_words::<K>(&u.planes[gi], h);
        let sum = |w: u32, j: u32| unsafe { ptx::ld_shared_f32(ptx::prmt(w, tile, g::sum_select(j)) + g::sum_row(j)) };
        let mut d = 0f32;
        // Pairs 4b .. 4b + 4 from byte b of the four words, spelled out so
        // that every word index and selector is a constant.
        each_octet(true, |b| {
            let s = [sum(f[0], 4 * b), sum(f[1], 4 * b + 1), sum(f[2], 4 * b + 2), sum(f[3], 4 * b + 3)];
            d = if b == 0 { s[0] } else { ptx::add_rn_f32(d, s[0]) };
            d = ptx::add_rn_f32(ptx::add_rn_f32(ptx::add_rn_f32(d, s[1]), s[2]), s[3]);
        });
        acc[gi][0] = ptx::fma_rn_f32(d, e4m4::decode(u.scales[gi] as u8), acc[gi][0]);
    }
}

/// The column blocks a block computes, in order: `first, first + step, …`
/// (`count` of them).
#[derive(Clone, Copy)]
struct Items {
    first: u32,
    step: u32,
    count: u32,
}

/// Where the copy stream of a warp is: tile iteration `i` of item `item`
/// (column block `cb`), in the chunk of iterations `lo .. hi` (with pair
/// sums; otherwise all of them).
struct Stream {
    i: u32,
    item: u32,
    cb: u32,
    lo: u32,
    hi: u32,
}

/// A thread's place in its team (module docs, "Teams"): the team's
/// `W` warps share a named barrier, a reduction buffer and a list of
/// column blocks.
#[derive(Clone, Copy)]
struct Team {
    /// The team's index in the block (its barrier is `1 + id`).
    id: u32,
    /// The thread's index inside the team, `0 .. 32·W`.
    t: u32,
    /// Warps per team, `W`.
    warps: u32,
}

impl Team {
    /// The calling thread's team under geometry `geo` in an instance of `H`
    /// teams per block (`H = 1`: the whole block, with nothing to compute).
    #[inline(always)]
    fn of<const H: u32>(geo: &Geometry) -> Self {
        let t = ptx::tid();
        if H == 1 {
            Self { id: 0, t, warps: geo.warps() }
        } else {
            Self { id: t >> (5 + geo.log_warps), t: t & (32 * geo.warps() - 1), warps: geo.warps() }
        }
    }

    /// Barrier of the team's threads only (the block barrier when `H = 1`).
    #[inline(always)]
    fn sync<const H: u32>(&self) {
        if H == 1 { ptx::bar_sync() } else { ptx::bar_sync_named(1 + self.id, 32 * self.warps) }
    }
}

/// Reduces one column block's accumulators and writes its outputs: the two
/// halves of a column meet through a shuffle (`a_0 + a_1`, the same sum in
/// both lanes); warp partials go to `red[warp][row][col]` at `red` (the
/// team's buffer), then one thread per (row, column) adds them in warp
/// order and rounds.
///
/// # Safety
/// Every thread of the team calls it; `red` has room for `W·M·32` floats
/// and nobody reads it any more; `y` holds `rows` rows of `n_dim`.
#[inline(always)]
unsafe fn epilogue<const M: usize, const K: usize, T: Elem<Raw = u16>, const H: u32, const NG: usize>(
    acc: &[[f32; M]; NG],
    red: u32,
    team: Team,
    y: *mut u16,
    rows: u32,
    n_dim: u64,
    first_col: u64,
) {
    let (lane, warp) = (team.t & 31, team.t >> 5);
    let cols = 16 * NG as u32;
    let mut part = [[0f32; M]; NG];
    for gi in 0..NG {
        for r in 0..M {
            let other = f32::from_bits(ptx::shfl_bfly(acc[gi][r].to_bits(), 1));
            part[gi][r] =
                if lane & 1 == 0 { ptx::add_rn_f32(acc[gi][r], other) } else { ptx::add_rn_f32(other, acc[gi][r]) };
        }
    }
    team.sync::<H>();
    if lane & 1 == 0 {
        for gi in 0..NG {
            let col = 16 * gi as u32 + lane / 2;
            for r in 0..M {
                unsafe { ptx::st_shared_f32(red + ((warp * M as u32 + r as u32) * cols + col) * 4, part[gi][r]) };
            }
        }
    }
    team.sync::<H>();
    let mut q = team.t;
    while q < cols * M as u32 {
        let r = q / cols;
        let c = q % cols;
        // The warps' partials in warp order, loaded four at a time at M = 1
        // and at M = 2 below k = 5 (there the rounds took the two-team
        // instance from 64 to 80 registers, out of its teamed plan; the
        // plain loop adds in the same order).
        let v = if M == 1 || (M == 2 && K != 5) {
            unsafe {
                crate::gemv_slots::sum_slots_in_order::<2, 4>(red + (r * cols + c) * 4, M as u32 * cols * 4, team.warps)
            }
        } else {
            let mut v = unsafe { ptx::ld_shared_f32(red + (r * cols + c) * 4) };
            for w in 1..team.warps {
                v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(red + ((w * M as u32 + r) * cols + c) * 4) });
            }
            v
        };
        let nn = first_col + c as u64;
        if r < rows && nn < n_dim {
            unsafe { *y.add((r as u64 * n_dim + nn) as usize) = T::from_f32(v) };
        }
        q += 32 * team.warps;
    }
}

/// The GEMV of one block: each team computes its column blocks
/// `items(team)` (32 columns each, masked at `n_dim`): all of K, `rows ≤ M`
/// rows of `x` (row stride `k_dim`) into `y` (row stride `n_dim`). Each warp streams its tiles
/// through its own ring of `S` shared-memory stages with `cp.async`,
/// `S − 1` tiles ahead of the math and across item boundaries, so the next
/// column block's first tiles are in flight while this one is reduced.
/// `S` is the const parameter where it is not 0 (it must then equal the
/// geometry's), else the geometry's: with a constant the wait for a tile
/// is one instruction, with a run-time count a jump through the eleven
/// counts `cp.async.wait_group` can take here (≈ 12 warp instructions a
/// tile, 4 % of a one-row k = 4 tile). `DENSE`: a dense call (the copy
/// bounds of its one-row k = 2 and two-team k = 5 instances come from the
/// tile index, [`Plain`]); the grouped kernel passes `false`.
///
/// # Safety
/// The pointers describe an `[n_dim, k_dim]` runtime-layout matrix with its
/// `2^K`-entry codebook (readable from the 16-byte boundaries at or below
/// `packed` and `scales`), `rows` rows of activations (16-aligned) and of
/// outputs; the launch has `32·W·H` threads and `Geometry::smem_bytes` of
/// dynamic shared memory; with `H > 1` the staging chunk covers all of K
/// (pair sums: any chunk).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn body<
    const M: usize,
    const K: usize,
    T: Elem<Raw = u16>,
    const H: u32,
    const NG: usize,
    const S: u32,
    const DENSE: bool,
>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    rows: u32,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    items: impl FnOnce(u32) -> Items,
) {
    let geo = Geometry::unpack(geom);
    // The ring depth: `S` when the instance fixes it (then the wait below
    // is one instruction with a constant count), else the geometry's.
    let stages = if S == 0 { geo.stages() } else { S };
    let sums = g::sums(K as u32, M as u32);
    let t = ptx::tid();
    let lane = t & 31;
    let team = Team::of::<H>(&geo);
    let items = items(team.id);
    // The warp's K slot (its place in the team) and its ring (its place in
    // the block).
    let warp = team.t >> 5;
    let ring_warp = t >> 5;
    let n_dim = n_dim as u64;
    let k_tiles = (k_dim >> 6) + (k_dim & 63 != 0) as u32;
    let n_iter = (k_tiles + geo.warps() - 1) >> geo.log_warps;
    let chunk_mask = geo.chunk() - 1;
    // One chunk covers all of K: staged once, kept for every item.
    let x_resident = geo.chunk() >= n_iter;
    let words_end = packed as u64 + 4 * tile::words(n_dim as usize, k_dim as usize, K) as u64;
    let scales_end = scales as u64 + tile::scales(n_dim as usize, k_dim as usize) as u64;
    let plain = Plain::new(n_dim as u32, k_tiles, 16 * NG as u32);

    let base = ptx::smem_base();
    let xs = base + g::block_table_bytes(K as u32, M as u32);
    let red = base + geo.red_offset(K as u32, M as u32) + team.id * geo.red_bytes(M as u32);
    let stage_bytes = g::stage_bytes(K as u32);
    let ring = base + geo.ring_offset(K as u32, M as u32) + ring_warp * stages * stage_bytes;
    // The table and this lane's copy in it.
    let table = base;
    let copy = g::copy_byte(K as u32, g::rows(M as u32), t);
    let x_tile_bytes = g::x_tile_bytes(K as u32, M as u32);
    let x_half = (lane & 1) * g::X_HALF_FLOATS * 4;
    let ok = |i: u32| (i << geo.log_warps) + warp < k_tiles;
    // The spans of the warp's first tile of column block `cb`, and the step
    // to its next tile.
    let cols = 16 * NG as u64;
    let first_spans = |cb: u32| Spans::at::<K>(packed, scales, n_dim, warp as u64, cb as u64 * cols);
    // With pair sums, the spans of iteration `i` of column block `cb`.
    let spans_at = |cb: u32, i: u32| {
        if sums {
            Spans::at::<K>(packed, scales, n_dim, ((i << geo.log_warps) + warp) as u64, cb as u64 * cols)
        } else {
            first_spans(cb)
        }
    };
    let step = Spans::step::<K>(n_dim, geo.warps() as u64);
    // Pair sums on more than one chunk walk chunk by chunk, each chunk over
    // all items (`Geometry::sums_slot_bytes`); everything else item by
    // item over all of K. `next_chunk(hi)` is the end of the chunk after
    // the one that ends at `hi`.
    let chunked = sums && !x_resident;
    let next_chunk = |hi: u32| if chunked { (hi + geo.chunk()).min(n_iter) } else { n_iter };
    // The copy stream: one commit group per step (empty past the block's
    // last item or K), so "tile j landed" is "at most S − 2 groups pending".
    let mut ahead = Stream { i: 0, item: 0, cb: items.first, lo: 0, hi: next_chunk(0) };
    let mut ahead_spans = first_spans(items.first);
    // Ring stage of the next copy and of the next step (`S` need not be a
    // power of two: the indices wrap by compare).
    let mut copy_stage = 0u32;
    let mut copy_next = || {
        if ahead.item < items.count && ok(ahead.i) {
            let dst = ring + copy_stage * stage_bytes;
            // By tile index in the dense one-row k = 2 instances (pair
            // sums) and the two-team k = 5 one; elsewhere the test of the
            // addresses: at M ≥ 2 and in the grouped kernel the index test
            // moved instances past 64 registers, and in the other one-row
            // instances it measured slower under CUDA graphs (one-team k = 4
            // on Llama-3-70B +12 %, with 3 % fewer instructions).
            let plain = if M == 1 && (K == 2 || K == 5 && H == 2) && DENSE {
                Some(plain.at(ahead.cb, (ahead.i << geo.log_warps) + warp))
            } else {
                None
            };
            unsafe { copy_tile::<K, NG>(ahead_spans, plain, words_end, scales_end, lane, dst) };
        }
        ptx::cp_async_commit();
        copy_stage += 1;
        if copy_stage == stages {
            copy_stage = 0;
        }
        ahead.i += 1;
        ahead_spans.advance(step);
        if ahead.i == if sums { ahead.hi } else { n_iter } {
            ahead.item += 1;
            ahead.cb = ahead.cb.wrapping_add(items.step);
            if sums && ahead.item == items.count {
                ahead.item = 0;
                ahead.cb = items.first;
                ahead.lo = ahead.hi;
                ahead.hi = next_chunk(ahead.hi);
            }
            ahead.i = if sums { ahead.lo } else { 0 };
            ahead_spans = spans_at(ahead.cb, ahead.i);
        }
    };
    let mut j = 0;
    while j + 1 < stages {
        copy_next();
        j += 1;
    }
    // Weights and codebook are never written by the kernels this launch may
    // overlap; activations and outputs are touched only from here on.
    ptx::after_producers();
    // The table and the first chunk of activations load side by side (pair
    // sums: the first chunk's tables); the barrier publishes both.
    if sums {
        unsafe { build_sums::<T>(cb, x, k_dim, 0, geo.chunk() << geo.log_warps, xs) };
    } else {
        unsafe {
            stage_x::<M, T, 2>(x, k_dim, rows, 0, geo.chunk() << geo.log_warps, xs, || build_table::<K, M>(cb, base));
        }
    }
    ptx::bar_sync();
    // A team with no column block (not in the host's teamed plans) still
    // builds its share of every chunk's tables with the other team.
    if chunked && H > 1 && items.count == 0 {
        let mut lo = geo.chunk();
        while lo < n_iter {
            ptx::bar_sync();
            unsafe { build_sums::<T>(cb, x, k_dim, lo << geo.log_warps, geo.chunk() << geo.log_warps, xs) };
            ptx::bar_sync();
            lo += geo.chunk();
        }
        return ptx::cp_async_wait::<0>();
    }
    // Pair sums between chunks: slot `item` of this thread's accumulators.
    let slot = |item: u32, gi: usize| {
        base + geo.smem_bytes(K as u32, M as u32) + ((item * NG as u32 + gi as u32) * ptx::block_dim() + t) * 4
    };

    let mut acc = [[0f32; M]; NG];
    let (mut i, mut item, mut step_stage) = (0u32, 0u32, 0u32);
    let (mut lo, mut hi) = (0u32, next_chunk(0));
    let mut spans_now = first_spans(items.first);
    while if sums { items.count > 0 && lo < n_iter } else { item < items.count } {
        // This step's tile has landed (this lane's copies, then the
        // warp's); the stage read one step ago is free for the copies S − 1
        // steps ahead.
        match S {
            2 => ptx::cp_async_wait::<0>(),
            3 => ptx::cp_async_wait::<1>(),
            4 => ptx::cp_async_wait::<2>(),
            _ => ptx::cp_async_wait_dyn(stages - 2),
        }
        ptx::syncwarp();
        copy_next();
        if chunked && i == lo && item == 0 && lo != 0 {
            // Everyone is done with the previous chunk: its tables make way
            // for this one's.
            ptx::bar_sync();
            unsafe { build_sums::<T>(cb, x, k_dim, lo << geo.log_warps, geo.chunk() << geo.log_warps, xs) };
            ptx::bar_sync();
        }
        if chunked && i == lo && lo != 0 {
            for (gi, a) in acc.iter_mut().enumerate() {
                a[0] = unsafe { ptx::ld_shared_f32(slot(item, gi)) };
            }
        }
        if !sums && i & chunk_mask == 0 && (i | item) != 0 && !x_resident {
            // Everyone is done with the previous chunk; stage the next
            // R·W tiles; publish.
            ptx::bar_sync();
            unsafe { stage_x::<M, T, 0>(x, k_dim, rows, i << geo.log_warps, geo.chunk() << geo.log_warps, xs, || {}) };
            ptx::bar_sync();
        }
        let cb_now = items.first + item * items.step;
        if ok(i) {
            let stage = ring + step_stage * stage_bytes;
            let u = unsafe { read_unit::<K, NG>(stage, spans_now, lane) };
            let staged = ((i & chunk_mask) << geo.log_warps) + warp;
            if sums {
                unsafe { sums_unit::<M, K, NG>(&u, xs + staged * x_tile_bytes, lane & 1, &mut acc) };
            } else {
                unsafe { fma_unit::<M, K, NG>(&u, table, copy, xs + staged * x_tile_bytes + x_half, &mut acc) };
            }
        }
        step_stage += 1;
        if step_stage == stages {
            step_stage = 0;
        }
        i += 1;
        spans_now.advance(step);
        if i == if sums { hi } else { n_iter } {
            if hi < n_iter {
                for (gi, a) in acc.iter().enumerate() {
                    unsafe { ptx::st_shared_f32(slot(item, gi), a[0]) };
                }
            } else {
                unsafe { epilogue::<M, K, T, H, NG>(&acc, red, team, y, rows, n_dim, cb_now as u64 * cols) };
            }
            acc = [[0f32; M]; NG];
            item += 1;
            if sums && item == items.count {
                item = 0;
                lo = hi;
                hi = next_chunk(hi);
            }
            i = if sums { lo } else { 0 };
            spans_now = spans_at(items.first.wrapping_add(item.wrapping_mul(items.step)), i);
        }
    }
    // No copy may still be in flight when the block exits.
    ptx::cp_async_wait::<0>();
}

/// Body of `kbit_gemv_[teams_]m{M}_k{K}_{T}`: a persistent grid; team `h`
/// of block `b` is virtual block `v = b + h·grid` of `H·grid` and computes
/// column blocks `v, v + H·grid, …` (32 columns each) of all `M` rows, so
/// a block's teams together take `b, b + grid, b + 2·grid, …`.
///
/// At k = 2 and M = 2 (`kbit_format::gemv::splits_last_round`), where the
/// last round of column blocks would leave more than half of the grid idle,
/// the grid stops after the whole rounds
/// (`kbit_format::gemv::split_last_round`, which the host applies alike)
/// and the host launches [`last_round`] on the rest.
///
/// # Safety
/// As [`body`] with `rows = M`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn dense<const M: usize, const K: usize, T: Elem<Raw = u16>, const H: u32>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
) {
    let col_blocks = n_dim.div_ceil(g::BLOCK_COLS);
    let (b, grid) = (ptx::bid(), ptx::grid_dim());
    let Some(step) = NonZeroU32::new(grid.wrapping_mul(H)) else { return ptx::after_producers() };
    let col_blocks = if g::splits_last_round(K as u32, M as u32) {
        match g::split_last_round(col_blocks, step.get()) {
            Some(whole) => whole,
            None => col_blocks,
        }
    } else {
        col_blocks
    };
    let items = |h: u32| {
        let v = b + h * grid;
        let count = if v < col_blocks { (col_blocks - v + step.get() - 1) / step } else { 0 };
        Items { first: v, step: step.get(), count }
    };
    // One row at k ≤ 4: one loop per ring depth of the Llama-size plans,
    // each with a constant wait (the others take the run-time count). At
    // k = 5 the constant wait measured slower (3 % fewer instructions,
    // issued less often); the two-team k = 3 instance runs Llama-3-70B
    // with 6 stages, where the extra loops only cost (+0.6 %); more rows
    // hold no gain worth the code.
    let constant = M == 1 && K <= 4 && !(K == 3 && H == 2);
    let stages = if constant { Geometry::unpack(geom).stages() } else { 0 };
    unsafe {
        match stages {
            2 => body::<M, K, T, H, G, 2, true>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, items),
            3 => body::<M, K, T, H, G, 3, true>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, items),
            4 => body::<M, K, T, H, G, 4, true>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, items),
            _ => body::<M, K, T, H, G, 0, true>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, items),
        }
    }
}

/// Body of `kbit_gemv_half_m{M}_k2_{T}`: the last round of a dense call
/// split off by [`dense`], as 16-column groups `first .. units` (group `j`
/// is columns `16j .. 16j + 16`), block `b` taking group `first + b`, one
/// team per block. A group is summed exactly as in a whole column block,
/// so the split does not change a result.
///
/// # Safety
/// As [`body`] with `rows = M`; `first .. units` are groups of the matrix
/// and the grid has `units − first` blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn last_round<const M: usize, T: Elem<Raw = u16>>(
    packed: *const u32,
    scales: *const u8,
    cb: *const f32,
    x: *const u16,
    y: *mut u16,
    n_dim: u32,
    k_dim: u32,
    geom: u32,
    first: u32,
    units: u32,
) {
    let group = first + ptx::bid();
    let items = |_| Items { first: group, step: 1, count: (group < units) as u32 };
    unsafe { body::<M, 2, T, 1, 1, 0, true>(packed, scales, cb, x, y, M as u32, n_dim, k_dim, geom, items) }
}

/// The expert owning activation row `row` and its rows: `(e, start, end)`
/// with `e` the number of `offsets[j] ≤ row` for `j` in `1..num_experts`,
/// `start` the largest `offsets[j] ≤ row` for `j < num_experts` and `end`
/// the smallest `offsets[j] > row` for `j` in `1..=num_experts`; with
/// non-decreasing offsets from 0, `offsets[e]` and `offsets[e + 1]`. One
/// round of loads (lane `l` reads `offsets[l + 32i]`) and three warp
/// reductions: the expert's bounds are not a second, dependent round of
/// loads. Every lane gets the same answer; with malformed offsets `e`
/// still lies in `0..num_experts`.
///
/// # Safety
/// `offsets` holds `num_experts + 1` values; all 32 lanes of the warp call it.
#[inline(always)]
pub(crate) unsafe fn expert_of_row(offsets: *const u32, num_experts: u32, row: u32) -> (u32, u32, u32) {
    let (mut count, mut start, mut end) = (0u32, 0u32, u32::MAX);
    let mut j = ptx::lane();
    while j <= num_experts {
        let o = unsafe { ptx::ld_nc_u32(offsets.add(j as usize)) };
        let inner = j < num_experts;
        if o <= row {
            count += (j != 0 && inner) as u32;
            start = if inner { start.max(o) } else { start };
        } else if j != 0 {
            end = end.min(o);
        }
        j += 32;
    }
    (ptx::warp_sum_u32(count), ptx::warp_max_u32(start), ptx::warp_min_u32(end))
}

/// The work of grouped unit `unit` (block `b` is unit `b / col_blocks`):
/// `(expert, first row, rows)` with `rows` in `1..=max_m`, or `None`.
///
/// The host launches `min(num_experts, total_rows)` units. With fewer
/// experts than rows a unit is an expert (its rows, if any); otherwise a
/// unit is a row, and the unit of an expert's first row works for it. So
/// every expert with rows is computed by exactly one unit, and the grid
/// never has more units than there are experts or rows. An expert with
/// more than `max_m` rows (whose rows past `max_m` are not computed) is
/// recorded in the global word `status` (the smallest such expert wins),
/// as the tensor-core kernels record it.
///
/// # Safety
/// `offsets` holds `num_experts + 1` values; `status` is a global word; all
/// threads of the block call it.
#[inline(always)]
pub(crate) unsafe fn grouped_unit(
    offsets: *const u32,
    num_experts: u32,
    total_rows: u32,
    status: *mut u32,
    max_m: u32,
    unit: u32,
) -> Option<(u32, u32, u32)> {
    let (e, start, end) = if num_experts < total_rows {
        let (start, end) =
            unsafe { (ptx::ld_nc_u32(offsets.add(unit as usize)), ptx::ld_nc_u32(offsets.add(unit as usize + 1))) };
        (unit, start, end)
    } else {
        if unit >= total_rows {
            return None;
        }
        let (e, start, end) = unsafe { expert_of_row(offsets, num_experts, unit) };
        if start != unit {
            return None;
        }
        (e, start, end)
    };
    if e >= num_experts || start >= total_rows {
        return None;
    }
    // (Block-uniform: every warp records it, so no thread waits at a
    // divergent branch in the common case.)
    let all = end.saturating_sub(start);
    if all > max_m {
        unsafe { ptx::red_min_u32(status, e) };
    }
    let rows = all.min(max_m).min(total_rows - start);
    if rows == 0 { None } else { Some((e, start, rows)) }
}

/// Body of `kbit_grouped_gemv_m{M}_k{K}_{T}` (M = max_m): block
/// `b = unit·col_blocks + cb`; the block of an expert's unit
/// (`grouped_unit`) computes column block `cb` of that expert's first
/// `min(rows, M)` rows with exactly the dense code path; every other block
/// returns.
///
/// # Safety
/// `packed`/`scales` hold `num_experts` matrices `[n_dim, k_dim]` back to
/// back (`tile::words` / `tile::scales` apart); `offsets` holds
/// `num_experts + 1` values (if they are not non-decreasing from 0 with
/// `offsets[E] = total_rows`, results are unspecified but every access stays
/// inside `total_rows` rows); `x`/`y` hold `total_rows` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn grouped<const M: usize, const K: usize, T: Elem<Raw = u16>>(
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
    // The expert offsets come from earlier kernels (the router): nothing is
    // read before the wait here (the body's second wait returns at once).
    ptx::after_producers();
    let Some(col_blocks) = NonZeroU32::new(col_blocks) else { return };
    let b = ptx::bid();
    let col_block = b % col_blocks;
    let Some((e, row, rows)) =
        (unsafe { grouped_unit(offsets, num_experts, total_rows, status, M as u32, b / col_blocks) })
    else {
        return;
    };
    let e = e as u64;
    let words = tile::words(n_dim as usize, k_dim as usize, K) as u64;
    let bytes = tile::scales(n_dim as usize, k_dim as usize) as u64;
    let (packed, scales) = unsafe { (packed.add((e * words) as usize), scales.add((e * bytes) as usize)) };
    let (x, y) = unsafe { (x.add((row as u64 * k_dim as u64) as usize), y.add((row as u64 * n_dim as u64) as usize)) };
    let items = |_| Items { first: col_block, step: 1, count: 1 };
    // An expert with one row sums as the dense one-row call does, which at
    // k = 2 is the pair-sum order (`kbit_format::gemv`, "Summation order").
    if g::sums(K as u32, 1) && M > 1 && rows == 1 {
        unsafe { body::<1, K, T, 1, G, 0, false>(packed, scales, cb, x, y, 1, n_dim, k_dim, geom, items) }
    } else {
        unsafe { body::<M, K, T, 1, G, 0, false>(packed, scales, cb, x, y, rows, n_dim, k_dim, geom, items) }
    }
}

macro_rules! gemv_entries {
    ($($dense:ident $grouped:ident: $m:literal, $k:literal, $t:ty;)*) => {$(
        /// Dense scalar GEMV ([`dense`]) for this M, k and dtype.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $dense(
            packed: *const u32, scales: *const u8, cb: *const f32, x: *const u16, y: *mut u16,
            n_dim: u32, k_dim: u32, geom: u32,
        ) {
            unsafe { dense::<$m, $k, $t, 1>(packed, scales, cb, x, y, n_dim, k_dim, geom) }
        }

        /// Grouped (MoE) scalar GEMV ([`grouped`]) for this max_m, k and dtype.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $grouped(
            packed: *const u32, scales: *const u8, cb: *const f32, x: *const u16, y: *mut u16,
            offsets: *const u32, num_experts: u32, total_rows: u32, status: *mut u32, n_dim: u32, k_dim: u32,
            geom: u32, col_blocks: u32,
        ) {
            unsafe {
                grouped::<$m, $k, $t>(
                    packed, scales, cb, x, y, offsets, num_experts, total_rows, status, n_dim, k_dim, geom, col_blocks,
                )
            }
        }
    )*};
}

gemv_entries! {
    kbit_gemv_m1_k2_f16 kbit_grouped_gemv_m1_k2_f16: 1, 2, F16;
    kbit_gemv_m1_k3_f16 kbit_grouped_gemv_m1_k3_f16: 1, 3, F16;
    kbit_gemv_m1_k4_f16 kbit_grouped_gemv_m1_k4_f16: 1, 4, F16;
    kbit_gemv_m1_k5_f16 kbit_grouped_gemv_m1_k5_f16: 1, 5, F16;
    kbit_gemv_m2_k2_f16 kbit_grouped_gemv_m2_k2_f16: 2, 2, F16;
    kbit_gemv_m2_k3_f16 kbit_grouped_gemv_m2_k3_f16: 2, 3, F16;
    kbit_gemv_m2_k4_f16 kbit_grouped_gemv_m2_k4_f16: 2, 4, F16;
    kbit_gemv_m2_k5_f16 kbit_grouped_gemv_m2_k5_f16: 2, 5, F16;
    kbit_gemv_m3_k2_f16 kbit_grouped_gemv_m3_k2_f16: 3, 2, F16;
    kbit_gemv_m3_k3_f16 kbit_grouped_gemv_m3_k3_f16: 3, 3, F16;
    kbit_gemv_m3_k4_f16 kbit_grouped_gemv_m3_k4_f16: 3, 4, F16;
    kbit_gemv_m3_k5_f16 kbit_grouped_gemv_m3_k5_f16: 3, 5, F16;
    kbit_gemv_m4_k2_f16 kbit_grouped_gemv_m4_k2_f16: 4, 2, F16;
    kbit_gemv_m4_k3_f16 kbit_grouped_gemv_m4_k3_f16: 4, 3, F16;
    kbit_gemv_m4_k4_f16 kbit_grouped_gemv_m4_k4_f16: 4, 4, F16;
    kbit_gemv_m4_k5_f16 kbit_grouped_gemv_m4_k5_f16: 4, 5, F16;
    kbit_gemv_m1_k2_bf16 kbit_grouped_gemv_m1_k2_bf16: 1, 2, Bf16;
    kbit_gemv_m1_k3_bf16 kbit_grouped_gemv_m1_k3_bf16: 1, 3, Bf16;
    kbit_gemv_m1_k4_bf16 kbit_grouped_gemv_m1_k4_bf16: 1, 4, Bf16;
    kbit_gemv_m1_k5_bf16 kbit_grouped_gemv_m1_k5_bf16: 1, 5, Bf16;
    kbit_gemv_m2_k2_bf16 kbit_grouped_gemv_m2_k2_bf16: 2, 2, Bf16;
    kbit_gemv_m2_k3_bf16 kbit_grouped_gemv_m2_k3_bf16: 2, 3, Bf16;
    kbit_gemv_m2_k4_bf16 kbit_grouped_gemv_m2_k4_bf16: 2, 4, Bf16;
    kbit_gemv_m2_k5_bf16 kbit_grouped_gemv_m2_k5_bf16: 2, 5, Bf16;
    kbit_gemv_m3_k2_bf16 kbit_grouped_gemv_m3_k2_bf16: 3, 2, Bf16;
    kbit_gemv_m3_k3_bf16 kbit_grouped_gemv_m3_k3_bf16: 3, 3, Bf16;
    kbit_gemv_m3_k4_bf16 kbit_grouped_gemv_m3_k4_bf16: 3, 4, Bf16;
    kbit_gemv_m3_k5_bf16 kbit_grouped_gemv_m3_k5_bf16: 3, 5, Bf16;
    kbit_gemv_m4_k2_bf16 kbit_grouped_gemv_m4_k2_bf16: 4, 2, Bf16;
    kbit_gemv_m4_k3_bf16 kbit_grouped_gemv_m4_k3_bf16: 4, 3, Bf16;
    kbit_gemv_m4_k4_bf16 kbit_grouped_gemv_m4_k4_bf16: 4, 4, Bf16;
    kbit_gemv_m4_k5_bf16 kbit_grouped_gemv_m4_k5_bf16: 4, 5, Bf16;
}

/// Dense scalar GEMV with two teams per block ([`dense`] with `H = 2`,
/// module docs "Teams"), for M = 1, 2: the rows whose instances fit 1024
/// threads in registers and whose activations (all of K) fit beside two
/// teams' rings.
macro_rules! gemv_teams_entries {
    ($($name:ident: $m:literal, $k:literal, $t:ty;)*) => {$(
        /// Dense scalar GEMV, two teams per block, for this M, k and dtype.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            packed: *const u32, scales: *const u8, cb: *const f32, x: *const u16, y: *mut u16,
            n_dim: u32, k_dim: u32, geom: u32,
        ) {
            unsafe { dense::<$m, $k, $t, 2>(packed, scales, cb, x, y, n_dim, k_dim, geom) }
        }
    )*};
}

gemv_teams_entries! {
    kbit_gemv_teams_m1_k2_f16: 1, 2, F16; kbit_gemv_teams_m1_k3_f16: 1, 3, F16;
    kbit_gemv_teams_m1_k4_f16: 1, 4, F16; kbit_gemv_teams_m1_k5_f16: 1, 5, F16;
    kbit_gemv_teams_m2_k2_f16: 2, 2, F16; kbit_gemv_teams_m2_k3_f16: 2, 3, F16;
    kbit_gemv_teams_m2_k4_f16: 2, 4, F16; kbit_gemv_teams_m2_k5_f16: 2, 5, F16;
    kbit_gemv_teams_m1_k2_bf16: 1, 2, Bf16; kbit_gemv_teams_m1_k3_bf16: 1, 3, Bf16;
    kbit_gemv_teams_m1_k4_bf16: 1, 4, Bf16; kbit_gemv_teams_m1_k5_bf16: 1, 5, Bf16;
    kbit_gemv_teams_m2_k2_bf16: 2, 2, Bf16; kbit_gemv_teams_m2_k3_bf16: 2, 3, Bf16;
    kbit_gemv_teams_m2_k4_bf16: 2, 4, Bf16; kbit_gemv_teams_m2_k5_bf16: 2, 5, Bf16;
}

/// The last round of a dense k = 2 call of M = 2 on 16-column groups
/// ([`last_round`]).
macro_rules! gemv_half_entries {
    ($($name:ident: $m:literal, $t:ty;)*) => {$(
        /// Dense scalar GEMV on 16-column groups, k = 2, for this M and dtype.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            packed: *const u32, scales: *const u8, cb: *const f32, x: *const u16, y: *mut u16,
            n_dim: u32, k_dim: u32, geom: u32, first: u32, units: u32,
        ) {
            unsafe { last_round::<$m, $t>(packed, scales, cb, x, y, n_dim, k_dim, geom, first, units) }
        }
    )*};
}

gemv_half_entries! {
    kbit_gemv_half_m2_k2_f16: 2, F16; kbit_gemv_half_m2_k2_bf16: 2, Bf16;
}
