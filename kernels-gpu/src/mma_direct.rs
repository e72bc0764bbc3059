//! Kernel 2, direct-load variant: the tensor-core dequant GEMM for M ≤ 16.
//! Each lane loads the plane words and scale bytes of two whole quant
//! blocks straight into registers (one 16-byte load each at k = 4), a
//! step ahead of the step it multiplies; nothing of the weights passes
//! through shared memory but the pair-table lookups. The 8 columns of
//! each mma's B are activation rows, so one, four or eight staged rows
//! cost the same per step: the same loads, lookups and mmas, and
//! activation loads of the same width. Sixteen rows are two such column
//! tiles: each decoded A meets both (twice the mmas and activation loads,
//! the same decode). The layout of a step, the lane map and shared memory
//! are in `kbit_format::mma_direct`.
//!
//! Per lane and step (64 weights): 32 pair lookups and 32 scale products
//! (the pair table of the other tensor-core kernels; at k ≤ 4 the index
//! words come from `kbit_format::mma::merged_pair_words`, each block's
//! planes rotated once for its four pair offsets), 8 mmas with the
//! weights as A (16 columns) and the activation rows as B, 4 shared loads
//! of staged activations, 2 weight loads (predicated, no branch).
//!
//! # Work mapping
//!
//! The grid is persistent. A team of 16 warps walks groups `slot, slot +
//! slots, …` of 16 columns; warp w of the team takes the steps `w, w + 16,
//! …` of each and accumulates them in one set of f32 registers. A block
//! holds one team (slot = block, slots = grid) or two (team h: slot =
//! block + h·grid, slots = 2·grid), which share the pair table and the
//! staged activations, so that an SM builds and stages them once. After a
//! group each warp stores its accumulators to its team's reduction
//! buffer, one team barrier (the block's, or named barrier 1 + h), and one
//! thread per output adds the team's 16 warps' values in warp order and
//! rounds once to T (the order depends on nothing but the shape: the same
//! bits on every call and with either team count). A team's groups
//! alternate between its two buffers, so the next group's stores never
//! meet this group's reads without the barrier between.
//!
//! # Early decode
//!
//! The `kbit_mma_direct_early_…` instances (`EARLY`, one team, k ≤ 4, one
//! or four staged rows) decode half of each warp's first step (the a
//! registers of mmas `2q`) before the grid-dependency wait, after one
//! block barrier that publishes the table, and load the warp's next item
//! there too: where a call's blocks wait resident beside the previous
//! call's, that work leaves the path after the release. The mmas run in
//! the same order on the same values: the same bits as the plain instance.
//!
//! # Activations in registers
//!
//! The `kbit_mma_direct_xreg_…` instances (`XREG`, one team, no early
//! decode; K ≤ 2048, so every warp has at most one step per group) stage
//! nothing: after the grid-dependency wait each lane loads the B registers
//! of its warp's step from global memory (`load_x`) and keeps them for
//! every group. The table's block barrier moves before the wait and none
//! follows it. The staged-row region of shared memory stays in the layout
//! (`kbit_format::mma_direct`), unused. The mmas run in the same order on
//! the same values: the same bits as the staged instance.
//!
//! # Numerics
//!
//! Each weight is `T(T(cb) · T(amax))` and the products are summed in f32
//! on the tensor cores, as in the other tensor-core kernels.

use crate::fragment::{self, MmaElem, PAIRS};
use crate::mma::unrolled;
use crate::ptx;
use kbit_format::mma as geo;
use kbit_format::mma_direct as dg;

/// Kernel arguments (all validated by the host).
#[derive(Clone, Copy)]
pub struct Args {
    /// Activations `[M, K]`, 16-byte aligned.
    pub x: *const u16,
    /// The weight in the runtime layout: plane words, E4M4 scale bytes,
    /// and the codebook (`2^k` f32).
    pub packed: *const u32,
    /// See `packed`.
    pub scales: *const u8,
    /// See `packed`.
    pub cb: *const f32,
    /// Output `[M, N]`.
    pub y: *mut u16,
    /// Rows of x and y (1..=R; 1 with R = 1).
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K (a multiple of 32).
    pub k: u32,
}

/// Where a lane's blocks of one group lie: the slot of its block in
/// column g at step 0, and the columns from g to N (≤ 0 past N or past
/// the last group; column g + 8 exists when this is above 8).
#[derive(Clone, Copy)]
struct LaneBlocks {
    slot0: u32,
    room: i32,
}

impl LaneBlocks {
    /// The blocks of lane (`g`, `t`) in `group`.
    #[inline(always)]
    fn of(a: &Args, group: u32, g: u32, t: u32) -> Self {
        let c = (dg::GROUP_COLS * group).wrapping_add(g);
        // Runtime layout: block (c, qb) is slot (kt·N + c)·2 + qb % 2 with
        // kt = qb / 2; at qb = 4s + t that is 4N·s + (t / 2)·2N + 2c + t % 2
        // (slots fit 32 bits), and column c + 8 is 16 slots on.
        let slot0 = ((t >> 1) * 2 * a.n).wrapping_add(2 * c).wrapping_add(t & 1);
        Self { slot0, room: a.n.wrapping_sub(c) as i32 }
    }

    /// The same lane's blocks `groups` groups on (`of` at `group + groups`).
    #[inline(always)]
    fn advance(self, groups: u32) -> Self {
        let cols = dg::GROUP_COLS * groups;
        Self { slot0: self.slot0.wrapping_add(2 * cols), room: self.room.wrapping_sub(cols as i32) }
    }
}

/// A lane's weights of one step: the plane words and scale bytes of its
/// quant block in columns g (`[0]`) and g + 8 (`[1]`).
#[derive(Clone, Copy)]
struct Blocks<const K: usize> {
    planes: [[u32; K]; 2],
    scales: [u32; 2],
}

impl<const K: usize> Blocks<K> {
    const ZERO: Self = Self { planes: [[0; K]; 2], scales: [0; 2] };

    /// Loads the blocks of step `s` at `at` over these, by predicated
    /// loads: a block past N or K keeps its scale byte and gets arbitrary
    /// plane bits, i.e. finite weights (past K they meet zero activations,
    /// past N or the last group their outputs are dropped), so no branch,
    /// copy or zeroing is needed.
    ///
    /// # Safety
    /// The host validated the weight for `a.n`, `a.k`.
    #[inline(always)]
    unsafe fn load_over(&mut self, a: &Args, at: &LaneBlocks, s: u32, t: u32) {
        let in_k = 32 * (4 * s + t) < a.k;
        let slot = at.slot0.wrapping_add(4 * a.n * s) as usize;
        unrolled!(2, j => {
            let on = in_k && at.room > 8 * j as i32;
            let slot = slot + 16 * j;
            self.planes[j] = unsafe { load_planes_if::<K>(a.packed.wrapping_add(slot * K), on) };
            self.scales[j] = unsafe { ptx::ld_nc_u8_if(a.scales.wrapping_add(slot), on, [self.scales[j]]) }[0];
        });
    }
}

/// One quant block's `K` plane words from global memory when `on`, else
/// arbitrary bits (every bit pattern is a valid block), as wide as the
/// block's alignment allows (k = 2: 8 bytes, k = 4: 16 bytes).
///
/// # Safety
/// When `on`: `p` points at `K` words of the weight, aligned to `4·K` when
/// K is 2 or 4.
#[inline(always)]
unsafe fn load_planes_if<const K: usize>(p: *const u32, on: bool) -> [u32; K] {
    let mut w = [0u32; K];
    unsafe {
        match K {
            2 => w.copy_from_slice(&ptx::ld_nc_v2_l2_256_if(p, on)),
            4 => w.copy_from_slice(&ptx::ld_nc_v4_if(p, on)),
            _ => {
                for (j, wj) in w.iter_mut().enumerate() {
                    *wj = ptx::ld_nc_u32_if(p.wrapping_add(j), on)[0];
                }
            }
        }
    }
    w
}

/// A step's weights ready for the lookups: the planes of each block
/// pre-rotated for [`merged_pair_words`](geo::merged_pair_words) (k ≤ 4;
/// k = 5 keeps them as loaded for the split table), and the decoded scales.
#[derive(Clone, Copy)]
struct Ready<const K: usize> {
    planes: [[u32; K]; 2],
    s2: [u32; 2],
}

impl<const K: usize> Ready<K> {
    #[inline(always)]
    fn of<T: MmaElem>(b: &Blocks<K>) -> Self {
        let planes = if K == 5 { b.planes } else { b.planes.map(|p| geo::prerotate(&p)) };
        Self { planes, s2: b.scales.map(T::scale_x2) }
    }

    /// The scaled a registers of block `j` for pair offset `h` (pairs
    /// `8q + 2h`, q = 0..4).
    ///
    /// # Safety
    /// The table at `tbl` was built for `K`, `T` and [`dg::table_mb`].
    #[inline(always)]
    unsafe fn weights<T: MmaElem>(&self, j: usize, h: u32, tbl: u32, lanes: u32) -> [u32; 4] {
        let (planes, s2) = (&self.planes[j], self.s2[j]);
        if K == 5 {
            unsafe { fragment::dequant::<K, 1, T>(planes, &geo::rotations(2 * h), tbl, lanes, s2) }
        } else {
            let (lo, hi) = geo::merged_pair_words(planes, h, lanes);
            unsafe { fragment::lookups::<T>(lo, hi, tbl, s2) }
        }
    }
}

/// A step's B registers, per column tile (`[1]` used at sixteen staged
/// rows only): chunk i2 of the lane's quarter and row.
type StepX = [[[u32; 4]; 4]; 2];

/// A group's accumulators, per column tile (as [`StepX`]).
type Acc = [[f32; 4]; 2];

/// Multiplies one step: `w` (this lane's blocks), the staged activations
/// of the step at `xs` (this lane's quarter and row already added; the
/// second tile's row 128 bytes on), into `acc`.
#[inline(always)]
unsafe fn step_mma<const K: usize, const R: u32, T: MmaElem>(
    w: &Ready<K>,
    xs: u32,
    tbl: u32,
    lanes: u32,
    acc: &mut Acc,
) {
    // B of mmas 2·i2 and 2·i2 + 1 (chunk i2 of the lane's quarter).
    let tile =
        |xs: u32| -> [[u32; 4]; 4] { core::array::from_fn(|i2| unsafe { ptx::ld_shared_v4(xs + 64 * R * i2 as u32) }) };
    let xb: StepX = [tile(xs), if dg::tiles(R) == 2 { tile(xs + 128) } else { [[0; 4]; 4] }];
    unsafe { step_mma_x::<K, R, T>(w, &xb, tbl, lanes, acc) };
}

/// [`step_mma`] with the step's activations `xb` already in registers.
/// Tile 0's mmas run in the same order whatever `R`: the same sums at
/// one, four, eight and sixteen staged rows.
#[inline(always)]
unsafe fn step_mma_x<const K: usize, const R: u32, T: MmaElem>(
    w: &Ready<K>,
    xb: &StepX,
    tbl: u32,
    lanes: u32,
    acc: &mut Acc,
) {
    unrolled!(2, odd => {
        let a = unsafe { decode_half::<K, T>(w, odd as u32, tbl, lanes) };
        unrolled!(4, q => {
            let i = 2 * q + odd;
            unrolled!(2, j => {
                if (j as u32) < dg::tiles(R) {
                    let x = &xb[j][i / 2];
                    let b = if i % 2 == 0 { [x[0], x[1]] } else { [x[2], x[3]] };
                    acc[j] = T::mma(a[q], b, acc[j]);
                }
            });
        });
    });
}

/// The A registers of half `odd` of one step's mmas (mmas `2q + odd`,
/// q = 0..4): [`step_mma`]'s decode, and the early instances' ahead of the
/// step's activations.
///
/// # Safety
/// As [`Ready::weights`].
#[inline(always)]
unsafe fn decode_half<const K: usize, T: MmaElem>(w: &Ready<K>, odd: u32, tbl: u32, lanes: u32) -> [[u32; 4]; 4] {
    let [t0, t2] = dg::two_t(odd);
    let f = |j: usize, two_t: u32| unsafe { w.weights::<T>(j, two_t / 2, tbl, lanes) };
    // Pairs 8q + two_t: a0 (row g) / a1 (row g + 8) at two_t = 4·odd,
    // a2 / a3 at 4·odd + 2, for mma 2q + odd.
    let (a0, a1, a2, a3) = (f(0, t0), f(1, t0), f(0, t2), f(1, t2));
    core::array::from_fn(|q| [a0[q], a1[q], a2[q], a3[q]])
}

/// Multiplies half `odd` of a step decoded by [`decode_half`] with its
/// staged activations at `xs` into `acc`, in [`step_mma`]'s order (the same
/// sums when half 0 goes first): mma `2q + odd` takes half `odd` of chunk q.
#[inline(always)]
unsafe fn half_mma<const R: u32, T: MmaElem>(a: &[[u32; 4]; 4], odd: u32, xs: u32, acc: &mut [f32; 4]) {
    unrolled!(4, q => {
        let b = unsafe { ptx::ld_shared_v2(xs + 64 * R * q as u32 + 8 * odd) };
        *acc = T::mma(a[q], b, *acc);
    });
}

/// [`half_mma`] with the step's activations in registers (`xb`, as in
/// [`step_mma_x`]).
#[inline(always)]
fn half_mma_x<T: MmaElem>(a: &[[u32; 4]; 4], odd: usize, xb: &[[u32; 4]; 4], acc: &mut [f32; 4]) {
    unrolled!(4, q => {
        let x = &xb[q];
        let b = if odd == 0 { [x[0], x[1]] } else { [x[2], x[3]] };
        *acc = T::mma(a[q], b, *acc);
    });
}

/// What a warp's steps share: the lane's place, the step count and the
/// shared-memory addresses.
struct Walk {
    t: u32,
    w: u32,
    k_steps: u32,
    slots: u32,
    x_lane: u32,
    step_bytes: u32,
    tbl: u32,
    lanes: u32,
}

impl Walk {
    /// Step `s` of the group of `at`: multiplies `cur` into `acc` while
    /// the warp's next step (in this group, or its first of the block's
    /// next group, when `at` moves there) loads over `nxt`. Returns the
    /// next step. (`cur` is a copy of `nxt`: loading over a second buffer
    /// taken in turn would save the copy, but two buffers live through the
    /// loop cost more registers than the 64 a thread has.)
    ///
    /// # Safety
    /// As [`run`]; `cur` holds step `s` of the group of `at`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step<const K: usize, const R: u32, T: MmaElem, const XREG: bool>(
        &self,
        a: &Args,
        cur: &Blocks<K>,
        nxt: &mut Blocks<K>,
        at: &mut LaneBlocks,
        s: u32,
        acc: &mut Acc,
        xb: &StepX,
    ) -> u32 {
        let ready = Ready::of::<T>(cur);
        let sn = s + dg::WARPS;
        if XREG && K == 4 {
            // The warp's one step: the next group's weights load over
            // zeros once both halves are decoded, so that neither the
            // block words nor the prerotated ones are live beside the 16
            // activation registers (k = 4 spilled with the load first).
            let a0 = unsafe { decode_half::<K, T>(&ready, 0, self.tbl, self.lanes) };
            half_mma_x::<T>(&a0, 0, &xb[0], &mut acc[0]);
            let a1 = unsafe { decode_half::<K, T>(&ready, 1, self.tbl, self.lanes) };
            *nxt = Blocks::ZERO;
            *at = at.advance(self.slots);
            unsafe { nxt.load_over(a, at, self.w, self.t) };
            half_mma_x::<T>(&a1, 1, &xb[0], &mut acc[0]);
            return sn;
        }
        if sn < self.k_steps {
            unsafe { nxt.load_over(a, at, sn, self.t) };
        } else {
            *at = at.advance(self.slots);
            unsafe { nxt.load_over(a, at, self.w, self.t) };
        }
        if XREG {
            unsafe { step_mma_x::<K, R, T>(&ready, xb, self.tbl, self.lanes, acc) };
        } else {
            unsafe { step_mma::<K, R, T>(&ready, self.x_lane + s * self.step_bytes, self.tbl, self.lanes, acc) };
        }
        sn
    }
}

/// The activations of warp `w`'s one step (`XREG`: K ≤ 2048, so no warp
/// has a second) for lane (`g`, `t`): row g % R (zeros at rows ≥ M),
/// quarter t, chunks i2 = 0..4, i.e. the B registers `step_mma` reads out
/// of the staged copy: `x[r][128 w + 32 t ..][..32]`, 64 contiguous bytes
/// (zeros past K, which is a multiple of 32).
///
/// # Safety
/// `a.x` holds `a.m` rows of `a.k` values, 16-byte aligned.
#[inline(always)]
unsafe fn load_x<const R: u32>(a: &Args, w: u32, g: u32, t: u32) -> [[u32; 4]; 4] {
    let r = g % R;
    let e = dg::STEP_K * w + 32 * t;
    let on = r < a.m && e < a.k;
    let p = a.x.wrapping_add((r * a.k + e) as usize) as *const u32;
    core::array::from_fn(|i2| if on { unsafe { ptx::ld_nc_v4(p.wrapping_add(4 * i2)) } } else { [0; 4] })
}

/// [`stage_x`]'s round of rows `r0 .. r0 + 4` of sixteen for chunk `e` at
/// `place` (step, chunk, quarter). (Beside the rounds of 1, 4 and 8 rows
/// rather than folded into them: one loop for all four changed the code
/// ptxas made of the smaller instances, and spilled the early-decode one.)
///
/// # Safety
/// As [`stage_x`].
#[inline(always)]
unsafe fn stage_rows16(xbase: u32, x: *const u16, m: u32, k: u32, e: u32, place: (u32, u32, u32), r0: u32) {
    let (s, i2, t) = place;
    let v: [[u32; 4]; STAGE_ROWS as usize] = core::array::from_fn(|j| {
        let r = r0 + j as u32;
        if r < m && e < k {
            unsafe { ptx::ld_nc_v4(x.wrapping_add((r * k + e) as usize) as *const u32) }
        } else {
            [0; 4]
        }
    });
    unrolled!(4, j => {
        unsafe { ptx::st_shared_v4(xbase + dg::x_offset16(s, i2, t, r0 + j as u32), v[j]) };
    });
}

/// Activation rows whose chunks a thread loads before it stores them.
const STAGE_ROWS: u32 = 4;

/// Stages the activations in the step order of `kbit_format::mma_direct`
/// (rows ≥ M and elements past K as zeros): 16-byte loads and stores (the
/// same copies by `cp.async` made every call ≈ 2.7 µs slower, measured).
/// A thread loads its chunk of [`STAGE_ROWS`] rows before it stores any:
/// one round trip per chunk of K and four rows rather than per chunk and
/// row (R = 4 on K = 8192 took 8 in turn, R = 8 on K = 2048 took 8). The
/// caller's block barrier publishes them.
///
/// # Safety
/// `x` holds `m` rows of `k` values, 16-byte aligned; the block has
/// `TEAMS ·` [`dg::THREADS`] threads, all of which call this.
#[inline(always)]
unsafe fn stage_x<const R: u32, const TEAMS: u32>(xbase: u32, x: *const u16, m: u32, k: u32, tid: u32) {
    let chunks = dg::steps(k) * (dg::STEP_K / 8);
    let mut c = tid;
    while c < chunks {
        let e = 8 * c;
        let (s, i2, t, _) = dg::x_place(e);
        // Four rows at a time (eight loads in flight spilled at R = 8);
        // sixteen rows in four such rounds.
        if R > 8 {
            unrolled!(4, h => {
                let r0 = STAGE_ROWS * h as u32;
                unsafe { stage_rows16(xbase, x, m, k, e, (s, i2, t), r0) };
            });
        } else {
            unrolled!(2, h => {
                let r0 = STAGE_ROWS * h as u32;
                if r0 < R {
                    let v: [[u32; 4]; STAGE_ROWS as usize] = core::array::from_fn(|j| {
                        let r = r0 + j as u32;
                        if r < R && r < m && e < k {
                            unsafe { ptx::ld_nc_v4(x.wrapping_add((r * k + e) as usize) as *const u32) }
                        } else {
                            [0; 4]
                        }
                    });
                    unrolled!(4, j => {
                        let r = r0 + j as u32;
                        if r < R {
                            unsafe { ptx::st_shared_v4(xbase + dg::x_offset(R, s, i2, t, r), v[j]) };
                        }
                    });
                }
            });
        }
        c += TEAMS * dg::THREADS;
    }
}

/// Body of the `kbit_mma_direct_k{K}_r{R}_{T}` kernels (`TEAMS` = 1), of
/// the `kbit_mma_direct_teams_…` ones (`TEAMS` = 2: two teams of 16 warps
/// in one block share the table and the staged activations, so an SM
/// builds and stages them once rather than once per block) and of the
/// `kbit_mma_direct_early_…` ones (`EARLY`: see the module docs).
///
/// # Safety
/// The host validated every pointer and size in `a` (M ≤ R, or M = 1 with
/// R = 1); the launch has `TEAMS ·` [`dg::THREADS`] threads and
/// `mma_direct::smem_bytes(K, R, k, TEAMS)` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run<const K: usize, const R: u32, T: MmaElem, const TEAMS: u32, const EARLY: bool, const XREG: bool>(
    a: &Args,
) {
    const { assert!(K >= 2 && K <= 5 && (R == 1 || R == 4 || R == 8 || R == 16) && (TEAMS == 1 || TEAMS == 2)) };
    const { assert!(R <= 8 || (TEAMS == 1 && !EARLY && !XREG)) };
    const { assert!(!EARLY || (TEAMS == 1 && K <= 4)) };
    const { assert!(!XREG || (TEAMS == 1 && !EARLY)) };
    let tid = ptx::tid();
    let (lane, w) = (tid & 31, if TEAMS == 1 { tid >> 5 } else { (tid >> 5) % dg::WARPS });
    let team = if TEAMS == 1 { 0 } else { tid / dg::THREADS };
    let (g, t) = (lane >> 2, lane & 3);
    let smem = ptx::smem_base();
    let tbl = smem;
    let xbase = smem + dg::x_base(K as u32);
    let (groups, k_steps) = (dg::groups(a.n), dg::steps(a.k));
    // Team `team` of block b is group slot b + team · grid of TEAMS · grid.
    let slot = ptx::bid() + team * ptx::grid_dim();

    // Codebook and the first step's weights before the wait (neither is
    // written by a kernel this launch may overlap), then the activations.
    let table = tid < geo::THREADS;
    let share = match (table, K == 5) {
        (false, _) => fragment::TableShare::ZERO,
        (true, true) => unsafe { fragment::load_table::<K, 1>(a.cb, tid) },
        (true, false) => unsafe { fragment::load_table::<K, PAIRS>(a.cb, tid) },
    };
    let mut at = LaneBlocks::of(a, slot, g, t);
    let mut blk = Blocks::<K>::ZERO;
    unsafe { blk.load_over(a, &at, w, t) };
    if table && K == 5 {
        unsafe { fragment::store_table::<K, 1, T>(tbl, &share, tid) };
    } else if table {
        unsafe { fragment::store_table::<K, PAIRS, T>(tbl, &share, tid) };
    }
    let lanes = geo::lane_bytes(lane, K as u32, dg::table_mb(K as u32));
    // EARLY: the first half of the warp's first step decoded before the
    // release (weights and table need no earlier kernel), and the item after
    // it loaded. (Decoded whether or not the warp has a step: only its use
    // is conditional.)
    let (first, first_ready) = if EARLY {
        ptx::bar_sync();
        let r = Ready::of::<T>(&blk);
        let f = unsafe { decode_half::<K, T>(&r, 0, tbl, lanes) };
        // Loaded over zeros, not over the decoded block (whose values a
        // predicated load would otherwise keep live).
        blk = Blocks::ZERO;
        if w + dg::WARPS < k_steps {
            unsafe { blk.load_over(a, &at, w + dg::WARPS, t) };
        } else {
            at = at.advance(ptx::grid_dim());
            unsafe { blk.load_over(a, &at, w, t) };
        }
        (f, r)
    } else {
        ([[0u32; 4]; 4], Ready { planes: [[0; K]; 2], s2: [0; 2] })
    };
    // XREG: the table's barrier before the release, the activations
    // straight into registers after it, and no barrier there.
    if XREG {
        ptx::bar_sync();
    }
    ptx::after_producers();
    let xb: StepX = [if XREG { unsafe { load_x::<R>(a, w, g, t) } } else { [[0; 4]; 4] }, [[0; 4]; 4]];
    if !XREG {
        unsafe { stage_x::<R, TEAMS>(xbase, a.x, a.m, a.k, tid) };
        ptx::bar_sync();
    }

    let walk = Walk {
        t,
        w,
        k_steps,
        slots: TEAMS * ptx::grid_dim(),
        // This lane's quarter and activation row within a step's chunk.
        x_lane: xbase + if R == 16 { dg::x_offset16(0, 0, t, g) } else { dg::x_offset(R, 0, 0, t, g % R) },
        step_bytes: if R == 16 { dg::x_offset16(1, 0, 0, 0) } else { dg::x_offset(R, 1, 0, 0, 0) },
        tbl,
        lanes,
    };
    // A group's accumulators and the warp's next step in it. With EARLY
    // the first group's first step, half decoded before the release, is
    // multiplied here (its registers end before the loop).
    let mut acc: Acc = [[0f32; 4]; 2];
    let mut s = w;
    if EARLY && w < k_steps {
        let xs = walk.x_lane + w * walk.step_bytes;
        unsafe { half_mma::<R, T>(&first, 0, xs, &mut acc[0]) };
        let second = unsafe { decode_half::<K, T>(&first_ready, 1, tbl, lanes) };
        unsafe { half_mma::<R, T>(&second, 1, xs, &mut acc[0]) };
        s = w + dg::WARPS;
    }
    // The team's groups slot + i·slots, i = 0, 1, …; i's parity picks the
    // team's reduction buffer.
    let mut i = 0;
    loop {
        let group = slot + i * walk.slots;
        if group >= groups {
            break;
        }
        // `blk` holds the next group's first step when the loop ends.
        while s < k_steps {
            let cur = blk;
            s = unsafe { walk.step::<K, R, T, XREG>(a, &cur, &mut blk, &mut at, s, &mut acc, &xb) };
        }
        // (The thread index read again here: what derives from it is
        // recomputed per group rather than held through the steps.)
        let tid = ptx::tid_here();
        let (team, tid) = if TEAMS == 1 { (0, tid) } else { (tid / dg::THREADS, tid % dg::THREADS) };
        let red = smem + dg::red_base(K as u32, R, a.k, 2 * team + (i & 1));
        unrolled!(2, j => {
            if (j as u32) < dg::tiles(R) {
                let at = red + dg::RED_BYTES * j as u32 + 16 * tid;
                unsafe { ptx::st_shared_v4(at, acc[j].map(f32::to_bits)) };
            }
        });
        if TEAMS == 1 {
            ptx::bar_sync();
        } else {
            // Barrier 0 is the block's; team h waits on 1 + h.
            ptx::bar_sync_named(1 + team, dg::THREADS);
        }
        // One thread per output (x row, group column), warps added in order;
        // rows 8..16 in the second tile.
        let outs = a.m * dg::GROUP_COLS;
        if tid < outs {
            let (row, col) = (tid / dg::GROUP_COLS, tid % dg::GROUP_COLS);
            let n = dg::GROUP_COLS * group + col;
            if n < a.n {
                let (tile, row8) = if dg::tiles(R) == 2 { (row / 8, row % 8) } else { (0, row) };
                let (src_lane, i) = dg::c_source(row8, col);
                let at = red + dg::RED_BYTES * tile + 16 * src_lane + 4 * i;
                let mut v = unsafe { ptx::ld_shared_f32(at) };
                for ww in 1..dg::WARPS {
                    v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(at + 512 * ww) });
                }
                unsafe { *a.y.add(row as usize * a.n as usize + n as usize) = T::from_f32(v) };
            }
        }
        acc = [[0f32; 4]; 2];
        s = w;
        i += 1;
    }
}
