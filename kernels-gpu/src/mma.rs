//! Kernel 2: tensor-core dequant GEMM `y[M, N] = x[M, K] · Wᵀ`, M ≤ 64,
//! reading the runtime (tiled) weight layout. A bandwidth engine: the weight
//! stream is read once, 16 bytes per `cp.async`, several stages deep, and
//! dequantized straight into `mma.m16n8k16` B fragments.
//!
//! # Block tile and thread maps
//!
//! 256 threads = 8 warps; a block computes 16·MB rows (all of M: rows ≥ M
//! are zero-filled) × TILE_N = 32·NF columns, KT 64-wide K tiles per
//! pipeline stage (KT = 1, 2 or 4, chosen by the host per launch: with
//! KT·TILE_N = 256 every thread dequantizes 64 weights between barriers,
//! 128 in the wide stages of `kbit_format::mma::wide_stages`).
//! For each K tile, warp w: K half `kh = w / 4` (quant block h of the tile, k16 steps 2kh and
//! 2kh+1), column group `cg = w % 4` (8·NF columns). Lane l, g = l / 4,
//! t = l % 4 (`kbit_format::mma` holds these maps as functions, unit-tested
//! on the CPU):
//! - A (ldmatrix.x4): lane l addresses row `16mb + l % 16`, 8-column chunk
//!   `2·kstep + l / 16`, giving a0..a3 = A[g | g+8][2t.. | 2t+8..]. With
//!   M ≤ 8 and one m block (`x2_loop`) the operands are swapped:
//!   `ldmatrix.x2` of rows 0-7 gives the B registers, the weights of
//!   fragments 2p and 2p + 1 are the A operand (`fragment::mma_swapped`).
//! - B (dequantized): lane l holds column `cg·8NF + 8f + g`, elements
//!   `8q + 2t + e` of the warp's quant block (see `fragment`): q = 0, 1 →
//!   b0, b1 of step 2kh, q = 2, 3 → b0, b1 of step 2kh+1.
//! - C (accumulators, f32): c0, c1 = row `16mb + g`, columns `2t, 2t+1` of
//!   fragment f; c2, c3 = row `16mb + g + 8`.
//!
//! # Shared memory (offsets in `kbit_format::mma`)
//!
//! `[table | misc | epilogue | stage 0 .. stage S-1]`; a stage is KT slots
//! of `tile_bytes` each, slot j holding K tile `kt + j` of the stage (its
//! first tile `kt`). Stage 0, the slots and their A, W and S parts start
//! on 128-byte lines, so the copies of a line-aligned global span fill
//! whole shared-memory lines. Per slot:
//! - A: 16·MB rows × 128 bytes; 16-byte chunk c of row r at
//!   `r·128 + 16·(c ^ (r % 8))` (XOR swizzle: the 8 rows of an ldmatrix
//!   phase hit 8 distinct bank groups, as do a warp's cp.async writes).
//! - W: the contiguous plane span of the tile's TILE_N columns (2·k words
//!   per column), fetched from the 16-byte boundary below its start; column
//!   c, block h starts at `off_w + (2k·c + k·h)·4`, `off_w` ∈ {0, 8}.
//! - S: the span of 2·TILE_N scale bytes, likewise; (c, h) at `off_s + 2c + h`.
//!
//! Bytes past the last valid column (and past the arrays) are zero-filled
//! by `cp.async`'s src-size; activations past K columns likewise, so
//! `K % 64 == 32` never reads x beyond K and its zero half tile multiplies
//! zeros. Activation rows past M are zero-filled too (interior stages by
//! `cp.async`'s ignore-src predicate, the address clamped to row M − 1).
//! With M ≤ 8 and one m block (the instances of `x2_loop`), interior
//! stages do not write rows 8-15, and nothing reads them.
//!
//! # Pipeline
//!
//! The block walks its work items (persistent grid: items b, b + grid, …)
//! as one stream of stages. A stage holds the next `len = min(KT, kt_end −
//! kt)` K tiles `kt .. kt + len` of one item, never two items: an item of
//! `t` tiles takes `ceil(t / KT)` stages, the last one partial when KT does
//! not divide `t` (its unused slots are neither copied nor read). Both
//! cursors derive `len` from the same (item, kt), so the loader and the
//! compute agree stage by stage, and each item's K tiles are computed
//! exactly once, in order. The loader cursor runs S−1 stages ahead of the
//! compute cursor, across item boundaries. Before the programmatic-launch
//! wait, a dense launch builds its decode table and either requests the
//! planes and scales of those first stages into L2 or (two m blocks at
//! k ≥ 4) issues their copies (no earlier kernel writes weights or
//! codebooks), so that their latency overlaps the previous launch's tail.
//! After it come the copies of the same stages (only the activations where
//! the weights are on their way), one commit group per stage; early weight
//! copies join the first. Each iteration: wait until ≤ S−2 copy groups are
//! pending (the current stage has landed), barrier
//! (everyone finished the previous stage, whose buffer is refilled next),
//! issue the copies of stage i+S−1, commit (always, so group counting
//! holds), compute the `len` tiles of stage i slot by slot. The copies of a
//! stage are spread over all 256 threads. Interior stages (see `issue`) use
//! the copy grid of `kbit_format::mma::copy_start`: a thread's chunks of a
//! part sit at constant steps, so a stage costs a few address computations
//! and one branch-free run of plain 16-byte copies. Edge stages clamp every
//! chunk: chunk c (16 bytes) of the stage's A (likewise W, S) part is chunk
//! `c % C` of slot `c / C`, with C the chunks per slot (a constant, so the
//! division is a multiply). (Weights
//! carry no L2 evict-first policy: on sm_90 the driver's JIT turned
//! `cp.async` with both a src-size and a cache-policy operand into an
//! illegal instruction.)
//!
//! # Split-K protocol
//!
//! Item = (n tile, split); split s covers K tiles `[s·tps, min((s+1)·tps,
//! k_tiles))`, never empty (the host plans `splits = ceil(k_tiles / tps)`).
//! At an item's end the two K-half warps of each column group add their
//! accumulators through the epilogue buffer. With one split the sum goes
//! straight to y. Otherwise:
//! 1. The block stores the f32 partial tile to its own workspace slot
//!    `item` (fragment order, 16 B per thread and fragment); block barrier.
//! 2. Thread 0: `fence.acq_rel.gpu`, then `atom.acq_rel.gpu.add(counter[n
//!    tile], 1)` (the barrier orders the other threads' stores before the
//!    fence, whose release the atomic carries to GPU scope; one fence per
//!    block instead of one per thread); the block learns through shared
//!    memory whether it saw `splits − 1` (last).
//! 3. The last block (ordered after the other partials by thread 0's
//!    acquiring atomic and a block barrier) reads every split's slot in split order
//!    0, 1, …, splits−1 (L2 loads, `ld.cg`) and adds them in that fixed
//!    order, so the result is bit-identical whichever block arrives last;
//!    it rounds to T, writes y, and resets the counter to 0.
//!
//! Stream-K (the `kbit_mma_stream_*` instances, `STREAM`) replaces the
//! grid stride: block b owns the iterations `[b·P, min((b+1)·P, T))` of
//! the T = n tiles × K tiles iterations in (n tile, K tile) order, P = `tiles_per_split`, so every
//! block gets the same share when the n tiles do not divide evenly over
//! the grid. Its items are the pieces of that range inside each n tile
//! (one or a few per block); the piece of block b in n tile t publishes
//! to slot `t + b` (pieces in (t, b) order, so slots are unique), n tile t
//! has the pieces of blocks `t·K_tiles / P ..= ((t+1)·K_tiles − 1) / P`,
//! and the last arriving block adds them in block order, as above. An n
//! tile inside one block's range is written directly.
//!
//! Every slot is fully written before it is read, so the workspace needs no
//! clearing; the counters are left at zero. Steady state: no memset, no
//! allocation, nothing host-side per call.
//!
//! # Grouped (kernel 5)
//!
//! [`run_grouped`] runs this body once per MoE expert in one launch: grid
//! row `blockIdx.y` is a grouped unit that finds its expert and rows on the
//! device, offsets the matrix, activation, output, workspace and counter
//! pointers to that expert's share, and walks the same per-expert plan.

use crate::fragment::{self, MmaElem};
use crate::ptx;
use core::num::NonZeroU32;
use kbit_format::mma as geo;
use kbit_format::tile::TILE_K;

/// Runs `$body` with `$i` = 0, 1, … `$n − 1` (`$n` ≤ 4, a constant) as
/// straight-line code. LLVM does not always fully unroll loops with large
/// bodies, and a register array indexed by a loop variable then moves to the
/// stack; constant indices keep the accumulators in registers.
macro_rules! unrolled {
    ($n:expr, $i:ident => $body:block) => {{
        if 0 < $n {
            let $i: usize = 0;
            $body
        }
        if 1 < $n {
            let $i: usize = 1;
            $body
        }
        if 2 < $n {
            let $i: usize = 2;
            $body
        }
        if 3 < $n {
            let $i: usize = 3;
            $body
        }
    }};
}
pub(crate) use unrolled;

/// Kernel arguments (all validated by the host).
#[derive(Clone, Copy)]
pub struct Args {
    /// Activations `[M, K]`, 16-byte aligned.
    pub x: *const u16,
    /// Plane words of the runtime layout.
    pub packed: *const u32,
    /// E4M4 scale bytes of the runtime layout.
    pub scales: *const u8,
    /// Codebook, `2^k` f32.
    pub cb: *const f32,
    /// Output `[M, N]`.
    pub y: *mut u16,
    /// Split-K workspace: `items · slot_f32` floats (unused with 1 split).
    pub ws: *mut f32,
    /// Split-K arrival counters, one per n tile, zero on entry and exit.
    pub counters: *mut u32,
    /// Rows of x and y (1..=64).
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K (a multiple of 32).
    pub k: u32,
    /// `ceil(K / 64)`.
    pub k_tiles: u32,
    /// Splits per n tile (1 with stream-K).
    pub splits: u32,
    /// K tiles per split; with stream-K the (n tile, K tile) iterations
    /// per block, P.
    pub tiles_per_split: u32,
    /// n tiles × splits; with stream-K n tiles + grid (the workspace slots).
    pub items: u32,
    /// Pipeline stages (2..=12), matching the launch's shared memory.
    pub stages: u32,
    /// K tiles per stage, KT (1..=4), matching the launch's shared memory.
    pub stage_tiles: u32,
    /// Bit 0: y may be written as 32-bit pairs (N even and y 4-aligned).
    pub flags: u32,
}

/// Where the body finds the rows and the six base pointers of [`Args`] (x,
/// planes, scales, y, split-K workspace, counters): they are read at each
/// use, not kept in registers across the main loop.
pub trait Bases: Copy {
    /// Whether [`run`] starts before the launch's grid-dependency wait, so
    /// that it may request its first weights before it (dense launches; a
    /// grouped unit learns its expert only after the wait).
    const BEFORE_WAIT: bool;
    /// Rows M.
    fn m(self, a: &Args) -> u32;
    /// Activations.
    fn x(self, a: &Args) -> *const u16;
    /// Plane words.
    fn packed(self, a: &Args) -> *const u32;
    /// Scale bytes.
    fn scales(self, a: &Args) -> *const u8;
    /// Output.
    fn y(self, a: &Args) -> *mut u16;
    /// Split-K workspace.
    fn ws(self, a: &Args) -> *mut f32;
    /// Split-K arrival counters.
    fn counters(self, a: &Args) -> *mut u32;
}

/// The pointers of [`Args`] themselves: kernel parameters, which ptxas
/// re-reads from the constant bank wherever they are used.
#[derive(Clone, Copy)]
pub struct Params;

impl Bases for Params {
    const BEFORE_WAIT: bool = true;
    #[inline(always)]
    fn m(self, a: &Args) -> u32 {
        a.m
    }
    #[inline(always)]
    fn x(self, a: &Args) -> *const u16 {
        a.x
    }
    #[inline(always)]
    fn packed(self, a: &Args) -> *const u32 {
        a.packed
    }
    #[inline(always)]
    fn scales(self, a: &Args) -> *const u8 {
        a.scales
    }
    #[inline(always)]
    fn y(self, a: &Args) -> *mut u16 {
        a.y
    }
    #[inline(always)]
    fn ws(self, a: &Args) -> *mut f32 {
        a.ws
    }
    #[inline(always)]
    fn counters(self, a: &Args) -> *mut u32 {
        a.counters
    }
}

/// Values computed per block (a grouped unit's rows, and pointers to its
/// expert, rows and workspace share), parked in the misc region of shared
/// memory at this address and loaded where used: the rows at byte 4, x,
/// planes, scales, y, workspace and counters at bytes 16..64. Kept in
/// registers, they cost the grouped instances up to 32 registers over the
/// dense ones, and the two- and four-m-block ones their second block per
/// SM.
#[derive(Clone, Copy)]
pub struct Staged(u32);

impl Staged {
    /// Byte offset of the rows in the misc region (the split-K flag is at 0).
    const ROWS: u32 = 4;
    /// Byte offset of the pointers in the misc region.
    const POINTERS: u32 = 16;

    /// Parks `rows` and `p` (x, planes, scales, y, workspace, counters) in
    /// the misc region at `misc`; thread 0 stores, and the barrier
    /// publishes them to the block.
    #[inline(always)]
    unsafe fn park(misc: u32, rows: u32, p: [u64; 6], tid: u32) -> Self {
        if tid == 0 {
            let at = misc + Self::POINTERS;
            let w = |i: usize| [p[i] as u32, (p[i] >> 32) as u32, p[i + 1] as u32, (p[i + 1] >> 32) as u32];
            unsafe {
                ptx::st_shared_u32(misc + Self::ROWS, rows);
                ptx::st_shared_v4(at, w(0));
                ptx::st_shared_v4(at + 16, w(2));
                ptx::st_shared_v4(at + 32, w(4));
            }
        }
        ptx::bar_sync();
        Staged(misc)
    }

    #[inline(always)]
    fn load(self, i: u32) -> u64 {
        // Reloaded after each write to memory, merged between two.
        let [lo, hi] = unsafe { ptx::ld_shared_v2_const(self.0 + Self::POINTERS + 8 * i) };
        lo as u64 | (hi as u64) << 32
    }
}

impl Bases for Staged {
    const BEFORE_WAIT: bool = false;
    #[inline(always)]
    fn m(self, _: &Args) -> u32 {
        unsafe { ptx::ld_shared_u32_const(self.0 + Self::ROWS) }
    }
    #[inline(always)]
    fn x(self, _: &Args) -> *const u16 {
        self.load(0) as *const u16
    }
    #[inline(always)]
    fn packed(self, _: &Args) -> *const u32 {
        self.load(1) as *const u32
    }
    #[inline(always)]
    fn scales(self, _: &Args) -> *const u8 {
        self.load(2) as *const u8
    }
    #[inline(always)]
    fn y(self, _: &Args) -> *mut u16 {
        self.load(3) as *mut u16
    }
    #[inline(always)]
    fn ws(self, _: &Args) -> *mut f32 {
        self.load(4) as *mut f32
    }
    #[inline(always)]
    fn counters(self, _: &Args) -> *mut u32 {
        self.load(5) as *mut u32
    }
}

/// One work item's position in the stream of K tiles.
#[derive(Clone, Copy)]
struct Cursor {
    item: u32,
    nt: u32,
    kt: u32,
    kt_end: u32,
    n0: u32,
    n_valid: u32,
}

/// What every cursor needs to walk the items.
#[derive(Clone, Copy)]
struct Sched {
    n: u32,
    k_tiles: u32,
    splits: NonZeroU32,
    tps: u32,
    items: u32,
    tile_n: u32,
    grid: u32,
    /// K tiles per stage (≥ 1).
    kt: u32,
    /// Stream-K: block b owns iterations `[b·tps, min((b+1)·tps, total))`.
    stream: bool,
    /// n tiles × K tiles (stream-K).
    total: u32,
    /// `k_tiles` and `tps` as divisors (stream-K).
    k_tiles_nz: NonZeroU32,
    tps_nz: NonZeroU32,
}

impl Cursor {
    #[inline(always)]
    fn at(item: u32, s: &Sched) -> Self {
        let nt = item / s.splits;
        let sp = item % s.splits;
        let kt = sp * s.tps;
        let n0 = nt * s.tile_n;
        Self { item, nt, kt, kt_end: (kt + s.tps).min(s.k_tiles), n0, n_valid: s.n.saturating_sub(n0).min(s.tile_n) }
    }

    /// Stream-K: the first piece of block `b`: from iteration `b·P` (n
    /// tile `b·P / k_tiles`) to the end of that tile or of the block's
    /// range; its item (workspace slot) is `n tile + b`.
    #[inline(always)]
    fn first_piece(b: u32, s: &Sched) -> Self {
        let g = b * s.tps;
        let nt = g / s.k_tiles_nz;
        let kt = g - nt * s.k_tiles;
        let n0 = nt * s.tile_n;
        let end = (g + s.tps).min(s.total);
        let item = if g < end { nt + b } else { u32::MAX };
        Self {
            item,
            nt,
            kt,
            kt_end: (kt + (end - g)).min(s.k_tiles),
            n0,
            n_valid: s.n.saturating_sub(n0).min(s.tile_n),
        }
    }

    /// Block `b`'s first item.
    #[inline(always)]
    fn first(b: u32, s: &Sched) -> Self {
        if s.stream { Self::first_piece(b, s) } else { Self::at(b, s) }
    }

    /// The block's item after this one: the next item of the grid stride,
    /// or with stream-K the block's piece of the next n tile, if its range
    /// reaches that far (it starts there, at K tile 0).
    #[inline(always)]
    fn next_item(&self, s: &Sched) -> Self {
        if s.stream {
            let b = self.item.wrapping_sub(self.nt);
            let g = (self.nt + 1) * s.k_tiles;
            let end = (b * s.tps + s.tps).min(s.total);
            let n0 = self.n0 + s.tile_n;
            let live = self.kt_end == s.k_tiles && g < end;
            Self {
                item: if live { self.item + 1 } else { u32::MAX },
                nt: self.nt + 1,
                kt: 0,
                kt_end: end.saturating_sub(g).min(s.k_tiles),
                n0,
                n_valid: s.n.saturating_sub(n0).min(s.tile_n),
            }
        } else {
            Self::at(self.item.saturating_add(s.grid), s)
        }
    }

    #[inline(always)]
    fn live(&self, s: &Sched) -> bool {
        self.item < s.items
    }

    /// K tiles of the stage that starts at `kt`: `min(KT, kt_end − kt)`,
    /// at least 1 while the cursor is live (items are never empty).
    #[inline(always)]
    fn stage_len(&self, s: &Sched) -> u32 {
        self.kt_end.saturating_sub(self.kt).min(s.kt)
    }

    /// Next stage; past the item's last tile, the block's next item.
    #[inline(always)]
    fn advance(&mut self, s: &Sched) {
        self.kt += self.stage_len(s);
        if self.kt == self.kt_end {
            *self = self.next_item(s);
        }
    }
}

/// Body of the `kbit_mma_k{K}_m{MB}_n{32·NF}_{T}` kernels.
///
/// # Safety
/// The host validated every pointer and size in `a` (see [`Args`]); the
/// launch has 256 threads, `smem_bytes(MB, NF, K, stages, stage_tiles)` bytes of dynamic
/// shared memory and at most `items` blocks.
#[inline(always)]
pub unsafe fn run<const K: usize, const MB: usize, const NF: usize, T: MmaElem, const STREAM: bool, B: Bases>(
    a: &Args,
    b: B,
) {
    const { assert!(MB >= 1 && MB <= 4 && (NF == 2 || NF == 4) && K >= 2 && K <= 5) };
    let (kb, mbu, nfu) = (K as u32, MB as u32, NF as u32);
    let tid = ptx::tid();
    let smem = ptx::smem_base();
    let tbl = smem;
    let st0 = smem + geo::stages_offset(mbu, nfu, kb);
    let tb = geo::tile_bytes(mbu, nfu, kb);
    let kt_stage = a.stage_tiles.max(1);
    let stb = kt_stage * tb;
    let st_end = st0 + a.stages * stb;
    let next = |b: u32| if b + stb == st_end { st0 } else { b + stb };

    let Some(splits) = NonZeroU32::new(a.splits) else { return ptx::after_producers() };
    // Divisors of the stream-K piece arithmetic (unused otherwise).
    let (k_tiles_nz, tps_nz) = if STREAM {
        let (Some(kt), Some(p)) = (NonZeroU32::new(a.k_tiles), NonZeroU32::new(a.tiles_per_split)) else {
            return ptx::after_producers();
        };
        (kt, p)
    } else {
        (NonZeroU32::MIN, NonZeroU32::MIN)
    };
    let s = Sched {
        n: a.n,
        k_tiles: a.k_tiles,
        splits,
        tps: a.tiles_per_split,
        items: a.items,
        tile_n: geo::tile_n(nfu),
        grid: ptx::grid_dim(),
        kt: kt_stage,
        stream: STREAM,
        total: if STREAM { a.n.div_ceil(geo::tile_n(nfu)) * a.k_tiles } else { 0 },
        k_tiles_nz,
        tps_nz,
    };

    // Before the grid-dependency wait, a dense launch does everything that
    // needs no data an earlier kernel may write (the codebook and the
    // weights): it requests the planes and scales of its first stages (into
    // L2, or straight into their slots: `early_weight_copies`) and builds
    // its decode table, so that their latency passes while the previous
    // launch finishes (not the 64-accumulator instances, MB = 4 with 128
    // columns: an early request took them from 124–128 to 157–162
    // registers, one block per SM; they serve M > 48, where the prologue is
    // a small part of a call). A grouped unit is past the wait already (it
    // had to find its expert).
    let table = unsafe { fragment::load_table::<K, MB>(a.cb, tid) };
    // The M ≤ 8 loop copies and reads A rows 0-7 only.
    let x2 = x2_loop(MB) && b.m(a) <= 8;
    if table_first(K, MB) {
        unsafe { fragment::store_table::<K, MB, T>(tbl, &table, tid) };
    }
    // Early copies of the first S−1 stages' weights are not committed: they
    // join the first group the prologue commits below.
    let early = B::BEFORE_WAIT && early_weight_copies(K, MB);
    if B::BEFORE_WAIT && MB * NF < 16 && !early {
        unsafe { prefetch_prologue::<K, NF, B>(a, b, &s, tid) };
    }
    if early {
        let mut c = Cursor::first(ptx::bid(), &s);
        let mut buf = st0;
        for _ in 1..a.stages {
            if c.live(&s) {
                unsafe { issue::<K, MB, NF, false, WEIGHTS, B>(a, b, &c, c.stage_len(&s), buf, tid) };
                c.advance(&s);
            }
            buf = next(buf);
        }
    }
    if B::BEFORE_WAIT && !table_first(K, MB) {
        unsafe { fragment::store_table::<K, MB, T>(tbl, &table, tid) };
    }
    // Activations, outputs, workspace and counters come after the wait.
    ptx::after_producers();
    let mut ld = Cursor::first(ptx::bid(), &s);
    let mut cs = ld;
    let (mut buf_w, mut buf_r) = (st0, st0);

    // Prologue: the first S−1 stages, one commit group each.
    for _ in 1..a.stages {
        if ld.live(&s) {
            // (All 16·MB rows, those past M zero-filled.)
            let len = ld.stage_len(&s);
            if early {
                unsafe { issue::<K, MB, NF, false, ACTIVATIONS, B>(a, b, &ld, len, buf_w, tid) };
            } else {
                unsafe { issue::<K, MB, NF, false, ALL_PARTS, B>(a, b, &ld, len, buf_w, tid) };
            }
            ld.advance(&s);
        }
        ptx::cp_async_commit();
        buf_w = next(buf_w);
    }
    // A grouped unit's decode table: codebook loads before the first
    // copies, stores after them (see `table_first`). The main loop's first
    // barrier publishes the table.
    if !B::BEFORE_WAIT && !table_first(K, MB) {
        unsafe { fragment::store_table::<K, MB, T>(tbl, &table, tid) };
    }

    let ln = Lanes::new::<K, MB, NF>(tid);
    // 0 (the host validates KT ≤ 4), but unknown to the compilers.
    let zero = a.stage_tiles >> 3;
    // The main loop, compiled twice where `x2_loop` says so: with M ≤ 8 the
    // interior copies skip A rows 8-15, which nothing reads (the operands
    // are swapped, `compute`). A branch per stage instead would stop ptxas
    // from interleaving a stage's tiles.
    macro_rules! main_loop {
        ($x2:literal) => {{
            let mut ln = ln;
            let mut acc = [[[0f32; 4]; NF]; MB];
            while cs.live(&s) {
                ptx::cp_async_wait_dyn(a.stages - 2);
                ptx::bar_sync();
                if ld.live(&s) {
                    unsafe { issue::<K, MB, NF, $x2, ALL_PARTS, B>(a, b, &ld, ld.stage_len(&s), buf_w, tid) };
                    ld.advance(&s);
                }
                ptx::cp_async_commit();
                buf_w = next(buf_w);

                // The stage's tiles, slot by slot (a block-uniform count), unrolled
                // so that slot offsets fold into the loads' immediates. A full stage
                // of 4 or 2 tiles runs without a branch between its tiles, so that
                // ptxas can interleave the shared loads of one tile with the math of
                // another (one tile alone is a dependent chain: planes → pair words
                // → table → scale → mma). Not for the 128-column tiles of 2..4 m
                // blocks: there the straight-line stage takes those instances past
                // 128 registers (one block per SM instead of two).
                let len = cs.stage_len(&s);
                ln.carry(zero);
                const { assert!(geo::MAX_STAGE_TILES == 4) };
                macro_rules! tile {
                    ($j:expr) => {{
                        let j = $j as u32;
                        unsafe { compute::<K, MB, NF, T, $x2>(a, cs.kt + j, cs.n0, buf_r + j * tb, tbl, &ln, &mut acc) };
                    }};
                }
                let straight = NF == 2 || MB == 1;
                match len {
                    4 if straight => unrolled!(4, j => { tile!(j) }),
                    2 if straight => unrolled!(2, j => { tile!(j) }),
                    _ => unrolled!(geo::MAX_STAGE_TILES, j => {
                        if (j as u32) < len {
                            tile!(j);
                        }
                    }),
                }
                buf_r = next(buf_r);

                cs.kt += len;
                if cs.kt == cs.kt_end {
                    let sums = if $x2 { unswap(&acc, tid & 31) } else { acc };
                    unsafe { epilogue::<K, MB, NF, T, B>(a, b, &cs, &s, smem, tid, &sums) };
                    acc = [[[0f32; 4]; NF]; MB];
                    cs = cs.next_item(&s);
                }
            }
        }};
    }
    if x2 {
        main_loop!(true)
    } else {
        main_loop!(false)
    }
    ptx::cp_async_wait::<0>();
}

/// Body of the `kbit_mma_grouped_k{K}_m{MB}_n64_{T}` kernels (kernel 5):
/// the GEMM of [`run`] over MoE experts, all in one launch with no host
/// sync. Grid `(plan grid, units)`: row `u = blockIdx.y` of the grid is
/// grouped unit `u` (`crate::gemv::grouped_unit`: an expert, or with as
/// many experts as rows the unit of an expert's first row), which runs
/// [`run`] with its own plan-sized grid on that expert's matrix and its
/// first `min(rows, max_m)` rows. Units without an expert return at once.
///
/// Every expert has the same shape, so one per-expert plan (`a.splits`,
/// `a.items`, …) serves all; unit `u` owns workspace slots
/// `u·items .. (u+1)·items` and counters `u·n_tiles .. (u+1)·n_tiles`, so
/// experts never share a split-K slot or counter. An expert's result is
/// bit-identical to [`run`] on that expert alone with the same plan.
///
/// # Safety
/// As [`run`] with `a.m = max_m` (1..=16·MB), plus: `packed`/`scales` hold
/// `num_experts` matrices `[N, K]` back to back (`tile::words` /
/// `tile::scales` apart); `offsets` holds `num_experts + 1` values (if they
/// are not non-decreasing from 0 with `offsets[E] = total_rows`, results
/// are unspecified but every access stays inside `total_rows` rows); `x`/`y`
/// hold `total_rows` rows; the workspace and counters hold `gridDim.y`
/// units' shares; `status` is a global word.
#[inline(always)]
pub unsafe fn run_grouped<const K: usize, const MB: usize, const NF: usize, T: MmaElem>(
    a: &Args,
    offsets: *const u32,
    num_experts: u32,
    total_rows: u32,
    status: *mut u32,
) {
    // The expert offsets come from earlier kernels (the router): nothing is
    // read before the wait here (the body's second wait returns at once).
    ptx::after_producers();
    let unit = ptx::bid_y();
    // (An expert with more rows than max_m is recorded in `status`.)
    let Some((e, row, rows)) =
        (unsafe { crate::gemv::grouped_unit(offsets, num_experts, total_rows, status, a.m, unit) })
    else {
        return;
    };
    let (e, row, unit) = (e as u64, row as u64, unit as u64);
    let (n, k) = (a.n as u64, a.k as u64);
    let words = kbit_format::tile::words(a.n as usize, a.k as usize, K) as u64;
    let scale_bytes = kbit_format::tile::scales(a.n as usize, a.k as usize) as u64;
    let n_tiles = a.n.div_ceil(geo::tile_n(NF as u32)) as u64;
    let slot_f32 = geo::slot_f32(MB as u32, NF as u32) as u64;
    let bases = [
        a.x.wrapping_add((row * k) as usize) as u64,
        a.packed.wrapping_add((e * words) as usize) as u64,
        a.scales.wrapping_add((e * scale_bytes) as usize) as u64,
        a.y.wrapping_add((row * n) as usize) as u64,
        a.ws.wrapping_add((unit * a.items as u64 * slot_f32) as usize) as u64,
        a.counters.wrapping_add((unit * n_tiles) as usize) as u64,
    ];
    let misc = ptx::smem_base() + geo::misc_offset(K as u32, MB as u32);
    let staged = unsafe { Staged::park(misc, rows, bases, ptx::tid()) };
    unsafe { run::<K, MB, NF, T, false, Staged>(a, staged) }
}

/// 128-byte lines that one K tile's plane window can touch: its
/// `TILE_N·8k` bytes from a 16-byte boundary, counted from the line below.
const fn w_lines(nf: u32, bits: u32) -> u32 {
    geo::tile_n(nf) * 8 * bits / 128 + 1
}

/// Likewise for the `2·TILE_N` scale bytes.
const fn s_lines(nf: u32) -> u32 {
    geo::tile_n(nf) * 2 / 128 + 1
}

/// L2 prefetches of the planes and scales of the block's first `S − 1`
/// stages (the ones the prologue copies), issued before the
/// grid-dependency wait. The copies that follow the wait then find them in
/// L2 (or on their way there). Thread `t` takes line `t % L` of tile `t / L`
/// of each stage, L = [`w_lines`] + [`s_lines`] lines per tile: one line per
/// thread and stage at most. Lines past a window's end (a partial last n
/// tile) are skipped, so every address lies inside the arrays.
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn prefetch_prologue<const K: usize, const NF: usize, B: Bases>(a: &Args, b: B, s: &Sched, tid: u32) {
    let (kb, nfu) = (K as u32, NF as u32);
    let (wl, per_tile) = (w_lines(nfu, kb), w_lines(nfu, kb) + s_lines(nfu));
    const { assert!((w_lines(4, 5) + s_lines(4)) * geo::MAX_STAGE_TILES <= geo::THREADS) };
    let (j, l) = (tid / per_tile, tid % per_tile);
    let mut c = Cursor::first(ptx::bid(), s);
    for _ in 1..a.stages {
        if !c.live(s) {
            break;
        }
        if j < c.stage_len(s) {
            let (kt, n0, nv) = ((c.kt + j) as u64, c.n0 as u64, c.n_valid as u64);
            let (base, lo, end, line) = if l < wl {
                let (w0, _, wend) = geo::w_window(a.n as u64, kt, n0, nv, K as u64);
                (b.packed(a) as *const u8, w0, wend, l)
            } else {
                let (s0, _, send) = geo::s_window(a.n as u64, kt, n0, nv);
                (b.scales(a), s0, send, l - wl)
            };
            let at = (lo & !127) + 128 * line as u64;
            if at < end {
                unsafe { ptx::prefetch_l2(base.wrapping_add(at.max(lo) as usize)) };
            }
        }
        c.advance(s);
    }
}

/// Whether an instance stores its decode table right after the codebook
/// loads (otherwise later, so that the codebook loads wait behind nothing:
/// after the L2 prefetches or early weight copies in a dense launch, after
/// the first copies in a grouped one). Measured per instance (when every launch stored its table
/// after its first copies), the order moves ptxas's schedule of the whole
/// kernel: the 32-row tiles at k = 2 ran 3-6 % faster table-first (Qwen3
/// gate/up at M = 32: 11.0 → 10.4 µs), every other instance as fast or
/// faster table-last (block TOTAL at M = 16, k = 4: −8 %).
const fn table_first(k: usize, mb: usize) -> bool {
    k == 2 && mb == 2
}

/// Whether an instance has the M ≤ 8 main loop (interior copies of A rows
/// 0-7 only, swapped operands, see [`compute`]): every one-m-block
/// instance. The instances that had only the plain loop before (k = 2,
/// and 64-column tiles at k = 3, 4), where the earlier form of this loop
/// (A = rows 0-7, a1 = a3 = 0) had been slower, gained with the swap
/// (H200, M = 5 and 8: Llama-3-70B k = 2 −9 %, Llama-3-8B k = 2 −5 %,
/// `moe_dn` ×8 grouped k = 2..4 −2 to −4 %).
const fn x2_loop(mb: usize) -> bool {
    mb == 1
}

/// Whether a dense launch copies the weights of its first stages into
/// their slots before the grid-dependency wait (otherwise it requests them
/// into L2 there, [`prefetch_prologue`], and copies them with the
/// activations after it). Measured against the L2 requests on the H100
/// (M = 24 and 32): two m blocks 2-7 % faster at k = 4 on the Qwen3 dense
/// shapes (Llama-3-8B 2 % slower) and 2-3.5 % at k = 5 (Llama-3-70B 2-3.5 %
/// slower), but 1-6 % slower at k = 3 and ±2 % at k = 2; one m block no
/// faster (k = 4 `o` 5 % slower at M = 5..16).
const fn early_weight_copies(bits: usize, mb: usize) -> bool {
    mb == 2 && bits >= 4
}

/// [`issue`] parts: the activation tile of each slot.
const ACTIVATIONS: u32 = 1;
/// [`issue`] parts: the plane and scale spans of each slot.
const WEIGHTS: u32 = 2;
/// [`issue`] parts: everything a stage holds.
const ALL_PARTS: u32 = ACTIVATIONS | WEIGHTS;

/// Issues the copies of the `len` K tiles `c.kt ..` (activations, planes,
/// scales; the `PARTS` of them) of one stage into its slots at `buf`. Not
/// committed here.
///
/// Interior stages (the common case: the stage ends at or before column K,
/// so it holds no zero half tile, and the n tile is full, so every chunk of
/// the plane and scale spans lies inside the arrays; KT as the host plans
/// it, at most `geo::copy_stage_tiles`) take plain 16-byte copies through
/// the copy grid of `geo::copy_start`. Other stages take the edge copies,
/// which clamp every chunk. Both write the same bytes to the
/// slots `< len`.
#[inline(always)]
unsafe fn issue<const K: usize, const MB: usize, const NF: usize, const X2: bool, const PARTS: u32, B: Bases>(
    a: &Args,
    b: B,
    c: &Cursor,
    len: u32,
    buf: u32,
    tid: u32,
) {
    let nfu = NF as u32;
    let interior = c.kt + len <= a.k / TILE_K as u32 && c.n_valid == geo::tile_n(nfu);
    // The instances with 64 accumulators per thread (MB = 4, TILE_N 128)
    // keep the edge copies: the interior copies' addresses and predicates
    // would raise them from 123–144 to ≈ 160 registers.
    if MB * NF < 16 && interior && a.stage_tiles <= geo::copy_stage_tiles(MB as u32, nfu) {
        unsafe { issue_interior::<K, MB, NF, X2, PARTS, B>(a, b, c, len, buf, tid) };
    } else {
        if PARTS & ACTIVATIONS != 0 {
            unsafe { issue_a_edge::<K, MB, NF, B>(a, b, c.kt, len, buf, tid) };
        }
        if PARTS & WEIGHTS != 0 {
            unsafe { issue_ws_edge::<K, MB, NF, B>(a, b, c, len, buf, tid) };
        }
    }
}

/// One thread's copies of the span chunks of a part in the copy grid (see
/// `geo::copy_start`; stages of at most `kt_max` = `geo::copy_stage_tiles` K
/// tiles): `src` and `dst` address its first chunk (slot j0,
/// chunk c0); its next slot is `slot_step` bytes further in global memory
/// and `rows·tb` in shared memory, its next chunk `16·cols` bytes in both.
/// Slot steps never branch (a branch costs the `cp.async` after it its own
/// pipeline padding): slots `≥ kt` (the stage's KT) are predicated off, the
/// unused slots `len..kt` of a partial stage zero-filled without reading
/// (ignore-src; the compute never reads them). Chunk steps past the span
/// branch (warp-uniform: `chunks − cols` is a multiple of 32).
///
/// # Safety
/// Every chunk of a slot `< len` lies inside its array; the stage's slots
/// `len..kt` are free.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one thread's grid position, spelled out
#[allow(unused_assignments)] // the last unrolled round advances `at` for nothing
unsafe fn copy_grid(
    kt_max: u32,
    src: *const u8,
    slot_step: u64,
    dst: u32,
    tb: u32,
    j0: u32,
    c0: u32,
    len: u32,
    kt: u32,
    chunks: u32,
) {
    let (rows, cols) = (geo::copy_slot_threads(chunks), geo::copy_chunk_threads(chunks));
    unrolled!(geo::copy_chunk_rounds(chunks), q => {
        let off = 16 * cols * q as u32;
        if q == 0 || c0 + cols * (q as u32) < chunks {
            let mut at = src.wrapping_add(off as usize);
            unrolled!(geo::copy_slot_rounds(chunks, kt_max), p => {
                let d = rows * p as u32;
                unsafe { ptx::cp_async_16_if_or_zero(dst + d * tb + off, at, j0 + d < kt, j0 + d >= len) };
                at = at.wrapping_add(slot_step as usize);
            });
        }
    });
}

/// Interior copies of a stage (see [`issue`]). Activations: 8 chunks of 16
/// bytes per row of each slot, rows ≥ M zero-filled (ignore-src, the address
/// clamped to row M − 1); with `X2` (M ≤ 8, see [`x2_loop`]) rows 8-15 are
/// neither written nor read. Planes and scales: the span chunks of each slot's
/// windows, then per slot the one chunk past the span (scales; planes for
/// odd k), which holds the window's offset bytes (0..16) and is zero-filled
/// beyond (warps 7 and 6 issue these).
#[inline(always)]
unsafe fn issue_interior<
    const K: usize,
    const MB: usize,
    const NF: usize,
    const X2: bool,
    const PARTS: u32,
    B: Bases,
>(
    a: &Args,
    b: B,
    c: &Cursor,
    len: u32,
    buf: u32,
    tid: u32,
) {
    let (kb, mbu, nfu) = (K as u32, MB as u32, NF as u32);
    let tb = geo::tile_bytes(mbu, nfu, kb);
    let tile_n = geo::tile_n(nfu) as u64;
    let (n, n0) = (a.n as u64, c.n0 as u64);
    let (packed, scales) = (b.packed(a) as *const u8, b.scales(a));
    let kt_stage = a.stage_tiles.max(1);
    let kt_max = geo::copy_stage_tiles(mbu, nfu);
    // With 48 accumulators per thread (MB = 3, TILE_N 128) the copy grid's
    // per-thread offsets are recomputed per stage rather than kept in
    // registers for the whole loop (which would take the instance past 128
    // registers, i.e. cost it its second block per SM).
    let tid = if MB * NF >= 12 { ptx::tid_here() } else { tid };

    if PARTS & ACTIVATIONS != 0 {
        // Activations: column 64·(kt + j0) of row 0; slots step by 64·rows columns.
        let chunks = geo::a_chunks(mbu);
        let (rows, cols) = (geo::copy_slot_threads(chunks), geo::copy_chunk_threads(chunks));
        let (j0, c0) = geo::copy_start(tid, chunks);
        let x = (b.x(a) as *const u8).wrapping_add(2 * TILE_K * (c.kt + j0) as usize);
        unrolled!(geo::copy_chunk_rounds(chunks), q => {
            let ch = c0 + cols * q as u32;
            if q == 0 || ch < chunks {
                let (row, cc) = (ch >> 3, ch & 7);
                let row_bytes = 2 * row.min(b.m(a) - 1) as u64 * a.k as u64;
                let src = x.wrapping_add((row_bytes + 16 * cc as u64) as usize);
                let dst = buf + j0 * tb + geo::a_offset(row, cc);
                let live = !X2 || row < 8;
                unrolled!(geo::copy_slot_rounds(chunks, kt_max), p => {
                    let d = rows * p as u32;
                    let at = src.wrapping_add(2 * TILE_K * d as usize);
                    let (copy, zero) = (live && j0 + d < kt_stage, row >= b.m(a) || j0 + d >= len);
                    unsafe { ptx::cp_async_16_if_or_zero(dst + d * tb, at, copy, zero) };
                });
            }
        });
    }

    if PARTS & WEIGHTS == 0 {
        return;
    }
    // Planes: the window of K tile kt + j0 from its 16-byte boundary.
    let w_span = geo::w_span_chunks(nfu, kb);
    let (j0, c0) = geo::copy_start(tid, w_span);
    let (w0, _, _) = geo::w_window(n, (c.kt + j0) as u64, n0, tile_n, K as u64);
    let src = packed.wrapping_add((w0 + 16 * c0 as u64) as usize);
    let step = geo::copy_slot_threads(w_span) as u64 * n * 8 * K as u64;
    let dst = buf + j0 * tb + geo::w_offset(mbu) + 16 * c0;
    unsafe { copy_grid(kt_max, src, step, dst, tb, j0, c0, len, kt_stage, w_span) };
    // Scales, likewise (most warps have no scale chunk: they branch past).
    let s_span = geo::s_span_chunks(nfu);
    let (j0, c0) = geo::copy_start(tid, s_span);
    if j0 < len {
        let (s0, _, _) = geo::s_window(n, (c.kt + j0) as u64, n0, tile_n);
        let src = scales.wrapping_add((s0 + 16 * c0 as u64) as usize);
        let step = geo::copy_slot_threads(s_span) as u64 * n * 2;
        let dst = buf + j0 * tb + geo::s_offset(mbu, nfu, kb) + 16 * c0;
        unsafe { copy_grid(kt_max, src, step, dst, tb, j0, c0, len, kt_stage, s_span) };
    }

    // The chunk past each span.
    let j = tid.wrapping_sub(7 * 32);
    if j < len {
        let (s0, off, _) = geo::s_window(n, (c.kt + j) as u64, n0, tile_n);
        let src = if off > 0 { scales.wrapping_add((s0 + 16 * s_span as u64) as usize) } else { scales };
        let dst = buf + j * tb + geo::s_offset(mbu, nfu, kb) + 16 * s_span;
        unsafe { ptx::cp_async_16_zfill(dst, src, off) };
    }
    let j = tid.wrapping_sub(6 * 32);
    if K % 2 == 1 && j < len {
        let (w0, off, _) = geo::w_window(n, (c.kt + j) as u64, n0, tile_n, K as u64);
        let src = if off > 0 { packed.wrapping_add((w0 + 16 * w_span as u64) as usize) } else { packed };
        let dst = buf + j * tb + geo::w_offset(mbu) + 16 * w_span;
        unsafe { ptx::cp_async_16_zfill(dst, src, off) };
    }
}

/// Edge activation copies: chunk `i` is chunk `i % C` of slot `i / C` (C
/// the chunks per slot), threads take `tid, tid + 256, …`; rows ≥ M and
/// columns ≥ K zero-filled.
#[inline(always)]
unsafe fn issue_a_edge<const K: usize, const MB: usize, const NF: usize, B: Bases>(
    a: &Args,
    b: B,
    kt: u32,
    len: u32,
    buf: u32,
    tid: u32,
) {
    let (kb, mbu, nfu) = (K as u32, MB as u32, NF as u32);
    let tb = geo::tile_bytes(mbu, nfu, kb);
    let a_chunks = geo::a_chunks(mbu);
    let mut i = tid;
    while i < len * a_chunks {
        let j = i / a_chunks;
        let ch = i - j * a_chunks;
        let (row, cc) = (ch >> 3, ch & 7);
        let col = (kt + j) as u64 * TILE_K as u64 + 8 * cc as u64;
        let ok = row < b.m(a) && col < a.k as u64;
        let x = b.x(a);
        let src = if ok { unsafe { x.add((row as u64 * a.k as u64 + col) as usize) } } else { x };
        let dst = buf + j * tb + geo::a_offset(row, cc);
        unsafe { ptx::cp_async_16_zfill(dst, src as *const u8, if ok { 16 } else { 0 }) };
        i += geo::THREADS;
    }
}

/// Edge plane and scale copies (last n tile of a matrix whose N is not a
/// multiple of TILE_N): chunk `i` of a part is chunk `i % C` of slot
/// `i / C`, threads take `tid, tid + 256, …`; each chunk reads the bytes of
/// its window before the window's end, the rest is zero-filled.
#[inline(always)]
unsafe fn issue_ws_edge<const K: usize, const MB: usize, const NF: usize, B: Bases>(
    a: &Args,
    b: B,
    c: &Cursor,
    len: u32,
    buf: u32,
    tid: u32,
) {
    let (kb, mbu, nfu) = (K as u32, MB as u32, NF as u32);
    let tb = geo::tile_bytes(mbu, nfu, kb);
    // Weight planes: each tile's column span, from the 16-byte boundary below it.
    let (n, n0, nv) = (a.n as u64, c.n0 as u64, c.n_valid as u64);
    let w_chunks = geo::w_chunks(nfu, kb);
    let packed = b.packed(a) as *const u8;
    let mut i = tid;
    while i < len * w_chunks {
        let j = i / w_chunks;
        let ch = i - j * w_chunks;
        let (w0, _, wend) = geo::w_window(n, (c.kt + j) as u64, n0, nv, K as u64);
        let ga = w0 + 16 * ch as u64;
        let bytes = if wend > ga { (wend - ga).min(16) as u32 } else { 0 };
        let src = if bytes > 0 { unsafe { packed.add(ga as usize) } } else { packed };
        let dst = buf + j * tb + geo::w_offset(mbu) + 16 * ch;
        unsafe { ptx::cp_async_16_zfill(dst, src, bytes) };
        i += geo::THREADS;
    }
    // Scale bytes, likewise (TILE_N/8 + 1 chunks per tile).
    let s_chunks = geo::s_chunks(nfu);
    let mut i = tid;
    while i < len * s_chunks {
        let j = i / s_chunks;
        let ch = i - j * s_chunks;
        let (s0, _, send) = geo::s_window(n, (c.kt + j) as u64, n0, nv);
        let ga = s0 + 16 * ch as u64;
        let bytes = if send > ga { (send - ga).min(16) as u32 } else { 0 };
        let scales = b.scales(a);
        let src = if bytes > 0 { unsafe { scales.add(ga as usize) } } else { scales };
        let dst = buf + j * tb + geo::s_offset(mbu, nfu, kb) + 16 * ch;
        unsafe { ptx::cp_async_16_zfill(dst, src, bytes) };
        i += geo::THREADS;
    }
}

/// A thread's fixed offsets into any K-tile slot (computed once per launch,
/// so the tile loop only adds the slot address).
#[derive(Clone, Copy)]
struct Lanes {
    /// `ldmatrix` source of m block 0, k16 steps 2kh and 2kh + 1 (m block
    /// `mb` adds `16·mb` rows: same `row % 8`, same swizzle).
    a: [u32; 2],
    /// `ldmatrix.x2` source of k16 steps 2kh and 2kh + 1 (the M ≤ 8 loop).
    a8: [u32; 2],
    /// Plane words of fragment 0's (column, quant block), without the
    /// window offset; fragment f adds `64·k·f` (8 columns).
    w: u32,
    /// Scale byte of fragment 0's (column, quant block), without the window
    /// offset; fragment f adds `16·f`.
    s: u32,
    /// `rotations(2·(lane % 4))`.
    rot: [u32; 8],
    /// `lane_bytes(lane, K, MB)`.
    lanes: u32,
}

impl Lanes {
    #[inline(always)]
    fn new<const K: usize, const MB: usize, const NF: usize>(tid: u32) -> Self {
        let (kb, mbu, nfu) = (K as u32, MB as u32, NF as u32);
        let lane = tid & 31;
        let warp = tid >> 5;
        let kh = geo::warp_k_half(warp);
        let col = geo::b_col(nfu, geo::warp_col_group(warp), 0, lane);
        let row = geo::ldmatrix_row(0, lane);
        Self {
            a: [0, 1].map(|s2| geo::a_offset(row, geo::ldmatrix_chunk(2 * kh + s2, lane))),
            a8: [0, 1].map(|s2| geo::a_offset(geo::ldmatrix_x2_row(lane), geo::ldmatrix_x2_chunk(2 * kh + s2, lane))),
            w: geo::w_offset(mbu) + 4 * kb * kh + 8 * kb * col,
            s: geo::s_offset(mbu, nfu, kb) + kh + 2 * col,
            rot: geo::rotations(2 * (lane & 3)),
            lanes: geo::lane_bytes(lane, kb, mbu),
        }
    }

    /// Adds `zero` (always 0) to the lane-derived values, once per stage.
    /// The values then depend on the loop and stay in registers: without
    /// this ptxas recomputes them from the thread index in every tile.
    #[inline(always)]
    fn carry(&mut self, zero: u32) {
        for r in self.rot.iter_mut() {
            *r = (*r + zero) & 31;
        }
        self.lanes += zero;
    }
}

/// Multiplies K tile `kt` of the n tile at column `n0`, staged in the slot
/// at `buf`, into the accumulators. The M ≤ 8 loop (`X2`, one m block)
/// swaps the operands: `ldmatrix.x2` of rows 0-7 gives the B registers,
/// fragments 2p and 2p + 1 are the A operand, and `acc[0][p]` holds pair p
/// in the swapped C map (`kbit_format::mma::swapped_c_pos`; [`unswap`]
/// turns it back). Otherwise A comes from `ldmatrix.x4`.
#[inline(always)]
unsafe fn compute<const K: usize, const MB: usize, const NF: usize, T: MmaElem, const X2: bool>(
    a: &Args,
    kt: u32,
    n0: u32,
    buf: u32,
    tbl: u32,
    ln: &Lanes,
    acc: &mut [[[f32; 4]; NF]; MB],
) {
    let kb = K as u32;
    let (off_w, off_s) = geo::window_offsets(a.n, kt, n0, kb);
    let w_base = buf + ln.w + off_w;
    let s_base = buf + ln.s + off_s;
    let weights = |f: usize| {
        let planes = unsafe { fragment::load_planes::<K>(w_base + 64 * kb * f as u32) };
        let scale = unsafe { ptx::ld_shared_u8(s_base + 16 * f as u32) };
        unsafe { fragment::dequant::<K, MB, T>(&planes, &ln.rot, tbl, ln.lanes, T::scale_x2(scale)) }
    };

    if X2 && MB == 1 {
        let x = [0, 1].map(|s2| unsafe { ptx::ldmatrix_x2(buf + ln.a8[s2]) });
        unrolled!(NF / 2, p => {
            let (w0, w1) = (weights(2 * p), weights(2 * p + 1));
            acc[0][p] = fragment::mma_swapped::<T>(&w0, &w1, &x, acc[0][p]);
        });
        return;
    }
    let mut frag_a = [[[0u32; 4]; 2]; MB];
    unrolled!(MB, mb => {
        for s2 in 0..2 {
            let at = buf + ln.a[s2] + 16 * geo::A_ROW_BYTES * mb as u32;
            frag_a[mb][s2] = unsafe { ptx::ldmatrix_x4(at) };
        }
    });
    unrolled!(NF, f => {
        let b = weights(f);
        unrolled!(MB, mb => {
            acc[mb][f] = T::mma(frag_a[mb][0], [b[0], b[1]], acc[mb][f]);
            acc[mb][f] = T::mma(frag_a[mb][1], [b[2], b[3]], acc[mb][f]);
        });
    });
}

/// The accumulators of the M ≤ 8 loop (pair p of the swapped C map in
/// `acc[0][p]`) in the C map of every other loop (fragment f in
/// `acc[0][f]`; c2, c3, rows 8-15, zero): each value comes from the lane
/// and register of `kbit_format::mma::swapped_source`, two shuffles per
/// value (the register depends on the receiving lane's row parity).
#[inline(always)]
fn unswap<const MB: usize, const NF: usize>(acc: &[[[f32; 4]; NF]; MB], lane: u32) -> [[[f32; 4]; NF]; MB] {
    let mut out = [[[0f32; 4]; NF]; MB];
    let odd = (lane >> 2) & 1 == 1;
    unrolled!(NF, f => {
        for e in 0..2u32 {
            let (src, reg) = geo::swapped_source(f as u32, lane, e);
            // Both candidates of the pair: registers reg & !1 and reg | 1.
            let even_reg = (reg & 2) as usize;
            let lo = ptx::shfl_idx(acc[0][f / 2][even_reg].to_bits(), src);
            let hi = ptx::shfl_idx(acc[0][f / 2][even_reg + 1].to_bits(), src);
            out[0][f][e as usize] = f32::from_bits(if odd { hi } else { lo });
        }
    });
    out
}

/// Index of (m block, fragment, thread of K half 0) in fragment order: the
/// layout of the epilogue buffer and of a workspace slot, in 16-byte units.
#[inline(always)]
fn frag_index(nf: u32, mb: u32, f: u32, t128: u32) -> u32 {
    (mb * nf + f) * 128 + t128
}

/// Finishes an item: K-half reduction into the epilogue buffer, then y
/// directly (one split) or the split-K protocol (see the module docs). The
/// loops after the reduction index 16-byte chunks of the tile in fragment
/// order (chunk = `frag_index`), never a register array, so the
/// accumulators stay in registers.
#[inline(always)]
unsafe fn epilogue<const K: usize, const MB: usize, const NF: usize, T: MmaElem, B: Bases>(
    a: &Args,
    b: B,
    c: &Cursor,
    s: &Sched,
    smem: u32,
    tid: u32,
    acc: &[[[f32; 4]; NF]; MB],
) {
    let (kb, nfu) = (K as u32, NF as u32);
    let epi = smem + geo::epi_offset(kb, MB as u32);
    let misc = smem + geo::misc_offset(kb, MB as u32);
    let upper = tid >= 128;
    let t128 = tid & 127;
    // K half 1 parks its sums; K half 0 adds its own and leaves the tile.
    if upper {
        unrolled!(MB, mb => {
            unrolled!(NF, f => {
                let v = acc[mb][f].map(f32::to_bits);
                unsafe { ptx::st_shared_v4(epi + 16 * frag_index(nfu, mb as u32, f as u32, t128), v) };
            });
        });
    }
    ptx::bar_sync();
    if !upper {
        unrolled!(MB, mb => {
            unrolled!(NF, f => {
                let at = epi + 16 * frag_index(nfu, mb as u32, f as u32, t128);
                let v = unsafe { ptx::ld_shared_v4(at) };
                let w = [0, 1, 2, 3].map(|i| (acc[mb][f][i] + f32::from_bits(v[i])).to_bits());
                unsafe { ptx::st_shared_v4(at, w) };
            });
        });
    }
    ptx::bar_sync();
    let chunks_per_thread = (MB * NF / 2) as u32;
    // The n tile's items (partials): its splits, or with stream-K the
    // pieces of blocks `fb ..= lb` (see the module docs).
    let fb = if s.stream { c.nt * s.k_tiles / s.tps_nz } else { 0 };
    let count = if s.stream { ((c.nt + 1) * s.k_tiles - 1) / s.tps_nz - fb + 1 } else { s.splits.get() };

    if count == 1 {
        for j in 0..chunks_per_thread {
            let chunk = tid + geo::THREADS * j;
            let v = unsafe { ptx::ld_shared_v4(epi + 16 * chunk) }.map(f32::from_bits);
            unsafe { store_chunk::<NF, T, B>(a, b, c.n0, chunk, &v) };
        }
        return;
    }

    // 1. Publish this split's partial in its own slot.
    let slot_f32 = geo::slot_f32(MB as u32, nfu) as u64;
    let slot = unsafe { b.ws(a).add((c.item as u64 * slot_f32) as usize) } as *mut u32;
    for j in 0..chunks_per_thread {
        let chunk = tid + geo::THREADS * j;
        let v = unsafe { ptx::ld_shared_v4(epi + 16 * chunk) };
        unsafe { ptx::st_cg_v4(slot.add(4 * chunk as usize), v) };
    }
    ptx::bar_sync();
    // 2. Count the arrival; the block that completes the count reduces.
    // The barrier orders every thread's stores before thread 0's fence,
    // whose release (with the atomic) publishes them at GPU scope.
    let counter = unsafe { b.counters(a).add(c.nt as usize) };
    if tid == 0 {
        ptx::fence_acq_rel_gpu();
        let old = unsafe { ptx::atom_add_acq_rel_gpu(counter, 1) };
        unsafe { ptx::st_shared_u32(misc, (old == count - 1) as u32) };
    }
    ptx::bar_sync();
    if unsafe { ptx::ld_shared_u32(misc) } == 0 {
        return;
    }
    // 3. Last block: sum all slots in split order, write y, reset the
    // counter. Thread 0's acquiring atomic, then the barrier above, order
    // the other blocks' partials before these loads.
    // The workspace slot of the tile's first item: `nt·splits`, or `nt + fb`.
    let first_slot = if s.stream { (c.nt + fb) as u64 } else { c.nt as u64 * s.splits.get() as u64 };
    let first = unsafe { b.ws(a).add((first_slot * slot_f32) as usize) } as *const u32;
    let step = slot_f32 as usize;
    let splits = count;
    for j in 0..chunks_per_thread {
        let chunk = tid + geo::THREADS * j;
        let p = unsafe { first.add(4 * chunk as usize) };
        // Same sums either way; which way is faster depends on the instance
        // (ptxas schedules the whole kernel around it): rounds for the
        // 64-column tiles of one m block, the small matrices whose calls
        // split K and end in this reduction; batches elsewhere (with rounds
        // the two-m-block instances measured 3-5 % slower at M = 32).
        let sum = if MB == 1 && NF == 2 {
            unsafe { sum_splits_in_rounds(p, step, splits) }
        } else {
            unsafe { sum_splits_in_batches(p, step, splits) }
        };
        unsafe { store_chunk::<NF, T, B>(a, b, c.n0, chunk, &sum) };
    }
    if tid == 0 {
        unsafe { ptx::st_relaxed_gpu_u32(counter, 0) };
    }
}

/// `Σ_s p[s·step .. s·step + 4]` over the `splits` slots, added in split
/// order from split 0's value itself (`((p0 + p1) + p2) + …`, f32):
/// `REDUCE_ROUND` loads per round, the whole round in flight (one L2 round
/// trip for up to 4 splits; past the last split the loads repeat it and are
/// not added).
///
/// # Safety
/// `p + s·step` is a valid, 16-aligned global address for every `s < splits`;
/// `splits ≥ 1`.
#[inline(always)]
unsafe fn sum_splits_in_rounds(p: *const u32, step: usize, splits: u32) -> [f32; 4] {
    let mut sum = [0f32; 4];
    let mut sp = 0u32;
    while sp < splits {
        let v: [[u32; 4]; REDUCE_ROUND] = core::array::from_fn(|u| {
            let at = (sp + u as u32).min(splits - 1) as usize * step;
            unsafe { ptx::ld_cg_v4(p.add(at)) }
        });
        for (u, vu) in v.iter().enumerate() {
            let i = sp + u as u32;
            let x = vu.map(f32::from_bits);
            if i == 0 {
                sum = x;
            } else if i < splits {
                sum = [0, 1, 2, 3].map(|e| sum[e] + x[e]);
            }
        }
        sp += REDUCE_ROUND as u32;
    }
    sum
}

/// [`sum_splits_in_rounds`]'s sum, with split 0 loaded first, then batches
/// of four independent loads, then the rest one by one.
///
/// # Safety
/// As [`sum_splits_in_rounds`].
#[inline(always)]
unsafe fn sum_splits_in_batches(p: *const u32, step: usize, splits: u32) -> [f32; 4] {
    let mut sum = unsafe { ptx::ld_cg_v4(p) }.map(f32::from_bits);
    let mut sp = 1u32;
    while sp + 4 <= splits {
        let v: [[u32; 4]; 4] = core::array::from_fn(|u| unsafe { ptx::ld_cg_v4(p.add((sp as usize + u) * step)) });
        for vu in v {
            sum = [0, 1, 2, 3].map(|i| sum[i] + f32::from_bits(vu[i]));
        }
        sp += 4;
    }
    while sp < splits {
        let v = unsafe { ptx::ld_cg_v4(p.add(sp as usize * step)) };
        sum = [0, 1, 2, 3].map(|i| sum[i] + f32::from_bits(v[i]));
        sp += 1;
    }
    sum
}

/// Split partials a reducing thread loads per round (see
/// [`sum_splits_in_rounds`]).
const REDUCE_ROUND: usize = 4;

/// Stores chunk `chunk` (fragment order) of a finished tile.
#[inline(always)]
unsafe fn store_chunk<const NF: usize, T: MmaElem, B: Bases>(a: &Args, b: B, n0: u32, chunk: u32, v: &[f32; 4]) {
    let nfu = NF as u32;
    let (mbf, tt) = (chunk >> 7, chunk & 127);
    unsafe { store4::<NF, T>(a, b.m(a), b.y(a), n0, mbf / nfu, mbf % nfu, tt >> 5, tt & 31, v) };
}

/// Rounds one accumulator fragment (C map) to T and stores the elements
/// inside `[M, N]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // a fragment's position, spelled out
unsafe fn store4<const NF: usize, T: MmaElem>(
    a: &Args,
    m: u32,
    y: *mut u16,
    n0: u32,
    mb: u32,
    f: u32,
    cg: u32,
    lane: u32,
    v: &[f32; 4],
) {
    for half in 0..2 {
        let row = geo::c_row(mb, lane, 2 * half);
        let col = n0 + geo::c_col(NF as u32, cg, f, lane, 0);
        if row < m {
            let idx = (row as u64 * a.n as u64 + col as u64) as usize;
            let (lo, hi) = (T::from_f32(v[2 * half as usize]), T::from_f32(v[2 * half as usize + 1]));
            unsafe {
                if a.flags & 1 != 0 && col + 1 < a.n {
                    *(y.add(idx) as *mut u32) = lo as u32 | (hi as u32) << 16;
                } else {
                    if col < a.n {
                        *y.add(idx) = lo;
                    }
                    if col + 1 < a.n {
                        *y.add(idx + 1) = hi;
                    }
                }
            }
        }
    }
}
