//! Scalar GEMV for M = 1..4 rows (kernel 1) and its grouped MoE form
//! (kernel 4): launch planning, validation and the launches.
//!
//! Two variants, chosen by the shape alone
//! ([`kbit_format::gemv::uses_slots`]) so that dense and grouped calls of
//! one shape sum in the same order:
//!
//! - **block** (`kernels-gpu/src/gemv.rs`, matrices of 2^25 weights and
//!   more): each block owns 32 columns and all of K, split over `W` warps
//!   (`W` from K alone, [`kbit_format::gemv::warps`]); weights stream
//!   through per-warp `cp.async` rings; the dense grid is persistent.
//! - **column-slot** (`kernels-gpu/src/gemv_slots.rs`, smaller matrices):
//!   each block owns `C` columns × `S` K slots (`S` from the shape,
//!   [`kbit_format::gemv_slots::slots`]); `C` is chosen here so that narrow
//!   matrices still fill the GPU.
//!
//! Either way the partials of an output are added in a fixed order, so
//! results are deterministic and the grouped kernel reproduces the dense one
//! bit for bit. Geometry, staging chunk and ring depth are planned here.

use crate::context::STATUS_EXPERT_ROWS;
use crate::device::dptr;
use crate::launch::{self, args};
use crate::module::names;
use crate::weight::check_len;
use crate::{Context, DeviceInfo, Dtype, Element, Error, KbitExperts, KbitWeight, Result, Shape};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::sys::CUfunction_attribute as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DevicePtr, DevicePtrMut, LaunchConfig};
use kbit_format::gemv::{self as g, Geometry};
use kbit_format::gemv_slots::{self as gs, Geometry as SlotGeometry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Largest M (rows) of the scalar GEMV, and largest `max_m` of its grouped form.
pub const GEMV_MAX_M: usize = g::MAX_M;

/// The GEMV entry points, looked up once per context.
pub(crate) struct GemvKernels {
    funcs: Vec<CudaFunction>,
    /// Largest block each instance can be launched with (its register use).
    max_threads: Vec<u32>,
    /// Resident blocks per SM of (instance, geometry), asked of the driver
    /// once: it sizes the persistent dense grid.
    resident: Mutex<HashMap<(usize, u32), u32>>,
}

/// Dtypes of the GEMV kernels, in table order.
pub(crate) const GEMV_DTYPES: [Dtype; 2] = [Dtype::F16, Dtype::Bf16];

/// Largest M with a two-team instance (`names::gemv_teams`).
pub(crate) const TEAMS_MAX_M: usize = 2;

/// Table index of an instance of one of the four families
/// (`names::all_gemv`).
fn slot(slots: bool, grouped: bool, m: usize, bits: u32, dtype: Dtype) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    let family = 2 * slots as usize + grouped as usize;
    ((family * GEMV_MAX_M + (m - 1)) * 4 + (bits - 2) as usize) * GEMV_DTYPES.len() + d
}

/// Table index of a two-team instance (after the four families).
fn teams_slot(m: usize, bits: u32, dtype: Dtype) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    4 * GEMV_MAX_M * 4 * GEMV_DTYPES.len() + ((m - 1) * 4 + (bits - 2) as usize) * GEMV_DTYPES.len() + d
}

/// Table index of a pairs instance (after the two-team ones).
fn pairs_slot(m: usize, bits: u32, dtype: Dtype) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    let before = (4 * GEMV_MAX_M + TEAMS_MAX_M) * 4 * GEMV_DTYPES.len();
    before + ((m - 1) * 4 + (bits - 2) as usize) * GEMV_DTYPES.len() + d
}

/// Table index of a half instance, k = 2, M = 2 (after the pairs ones).
fn half_slot(dtype: Dtype) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    let before = (5 * GEMV_MAX_M + TEAMS_MAX_M) * 4 * GEMV_DTYPES.len();
    before + d
}

impl GemvKernels {
    /// Resolves every `kbit_[grouped_]gemv_*` entry and lets it use the
    /// device's opt-in shared memory (the k = 4 decode table alone is 32 KB).
    pub(crate) fn load(ctx: &Arc<CudaContext>, module: &Arc<CudaModule>) -> Result<Self> {
        let optin = ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let mut funcs = Vec::new();
        let mut max_threads = Vec::new();
        for name in names::all_gemv() {
            let f = module.load_function(&name).map_err(|_| Error::MissingKernel(name))?;
            f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin)?;
            max_threads.push(f.max_threads_per_block()?.max(32) as u32);
            funcs.push(f);
        }
        Ok(Self { funcs, max_threads, resident: Mutex::new(HashMap::new()) })
    }

    /// Resident blocks per SM (at least 1) of instance `i` launched with
    /// `threads` threads and `smem_bytes` of shared memory, cached by
    /// `(i, geom)` (the packed geometry fixes both).
    fn resident_blocks(&self, i: usize, geom: u32, threads: u32, smem_bytes: u32) -> Result<u32> {
        let key = (i, geom);
        let mut cache = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&b) = cache.get(&key) {
            return Ok(b);
        }
        let b =
            self.funcs[i].occupancy_max_active_blocks_per_multiprocessor(threads, smem_bytes as usize, None)?.max(1);
        cache.insert(key, b);
        Ok(b)
    }

    /// The instance and launch of one call: the variant comes from the
    /// shape ([`g::uses_slots`]), then that variant's plan. `units` as in
    /// [`GemvPlan::new`]. A dense call of the block variant gets a
    /// persistent grid (one round of resident blocks).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        grouped: bool,
        shape: Shape,
        m: usize,
        bits: u32,
        dtype: Dtype,
        device: &DeviceInfo,
        units: usize,
    ) -> Result<(&CudaFunction, GemvLaunch)> {
        let slots = g::uses_slots(shape.n, shape.k);
        let (i, launch) = if slots {
            // Grouped calls whose plan pairs column groups take the pairs
            // instance; the plan fits both instances' block limits.
            let (one, two) = (slot(slots, grouped, m, bits, dtype), pairs_slot(m, bits, dtype));
            let max_threads =
                if grouped { self.max_threads[one].min(self.max_threads[two]) } else { self.max_threads[one] };
            let plan = |max_threads: u32| -> Result<(usize, SlotPlan, u32)> {
                let p = SlotPlan::new(shape, bits, m, device.sm_count, units, max_threads);
                let i = if p.geometry.reps() > 1 { two } else { one };
                let resident = self.resident_blocks(i, p.geometry.pack(), p.geometry.threads(), p.smem_bytes)?;
                Ok((i, p, resident))
            };
            let (mut i, mut p, mut resident) = plan(max_threads)?;
            // A dense grid that needs a second round because the instance's
            // registers or shared memory fit too few of its blocks per SM
            // (M = 4, k = 5 on 2048×5120: 320 blocks of 256 threads, two per
            // SM) takes the widest narrower blocks that fit one round, if any.
            // So does a k = 5 grid of M ≤ 3 whose block takes a whole SM: it
            // leaves no room for the next call's blocks (programmatic
            // launches), and k = 5's 128-byte decode table makes narrower
            // blocks cheap (k ≤ 4 build 8–32 KiB in every block). H100, µs,
            // 2048×4096 / 4096×2048 at M = 1: 4.93 / 5.12 → 4.59 / 4.80; at
            // M = 3 6.73 / 7.18 → 6.35 / 7.10. At M = 4, where every block
            // stages four rows of activations, 5120×2048 and 4096×2048 lost
            // (9.55 / 7.95 → 10.37 / 8.47).
            let fits = |p: &SlotPlan, resident: u32| p.col_blocks as u64 <= resident as u64 * device.sm_count as u64;
            let roomy = |resident: u32| bits <= 4 || m > 3 || resident >= 2;
            let settled = |p: &SlotPlan, resident: u32| fits(p, resident) && roomy(resident);
            let mut narrower = p.geometry.threads() / 2;
            while units <= 1 && !settled(&p, resident) && narrower >= 32 {
                let (j, q, r) = plan(narrower)?;
                if fits(&q, r) {
                    (i, p, resident) = (j, q, r);
                }
                narrower = q.geometry.threads() / 2;
            }
            let (geom, threads) = (p.geometry.pack(), p.geometry.threads());
            let launch = GemvLaunch {
                geom,
                threads,
                smem_bytes: p.smem_bytes,
                col_blocks: p.col_blocks,
                grid: p.col_blocks,
                resident,
                last_round: None,
            };
            (i, launch)
        } else {
            // A dense call of M ≤ 2 takes the two-team instance when its plan
            // comes out teamed, the one-team instance otherwise.
            let teamed = match (grouped, m <= TEAMS_MAX_M) {
                (false, true) => {
                    let t = teams_slot(m, bits, dtype);
                    let p = GemvPlan::new(shape, bits, m, self.max_threads[t], device, units, Call::Teamed)?;
                    (p.geometry.teams() > 1).then_some((t, p))
                }
                _ => None,
            };
            let (i, p) = match teamed {
                Some(tp) => tp,
                None => {
                    let i = slot(slots, grouped, m, bits, dtype);
                    let call = if grouped { Call::Grouped } else { Call::Dense };
                    (i, GemvPlan::new(shape, bits, m, self.max_threads[i], device, units, call)?)
                }
            };
            let (geom, threads) = (p.geometry.pack(), p.geometry.threads());
            let resident = self.resident_blocks(i, geom, threads, p.smem_bytes)?;
            let grid = if grouped {
                p.col_blocks
            } else {
                // One round of resident blocks; a block's teams take column
                // blocks `b, b + grid, …` between them.
                p.col_blocks.div_ceil(p.geometry.teams()).min(resident.saturating_mul(device.sm_count).max(1))
            };
            let mut launch = GemvLaunch {
                geom,
                threads,
                smem_bytes: p.smem_bytes,
                col_blocks: p.col_blocks,
                grid,
                resident,
                last_round: None,
            };
            // At k = 2, M = 2 the last, partial round of column blocks (at
            // most half of the virtual blocks busy) runs as half column
            // blocks on a launch of its own; the dense kernel stops before it
            // by the same rule (`g::splits_last_round`). Measured on
            // Llama-3-70B gate/up at M = 2: −4.9 % (H100; −5.7 % on an
            // H200), but k = 3..5 +7 to +9 % (H200), where that round is
            // shorter than the second launch's own prologue (decode table,
            // activations) and drain; and at M = 1 since pair sums, whose
            // second launch builds the tables of all of K for 16 columns.
            let virtual_blocks = grid * p.geometry.teams();
            if !grouped
                && g::splits_last_round(bits, m as u32)
                && let Some(whole) = g::split_last_round(p.col_blocks, virtual_blocks)
            {
                let h = half_slot(dtype);
                let hp = GemvPlan::new(shape, bits, m, self.max_threads[h], device, 1, Call::Dense)?;
                let (hgeom, hthreads) = (hp.geometry.pack(), hp.geometry.threads());
                let first = 2 * whole;
                let groups = shape.n.div_ceil(16) as u32;
                launch.last_round = Some(HalfLaunch {
                    index: h,
                    geom: hgeom,
                    threads: hthreads,
                    smem_bytes: hp.smem_bytes,
                    first,
                    units: groups,
                    resident: self.resident_blocks(h, hgeom, hthreads, hp.smem_bytes)?,
                });
            }
            (i, launch)
        };
        let half_smem = launch.last_round.map_or(0, |h| h.smem_bytes);
        if launch.smem_bytes.max(half_smem) as usize > device.max_smem_per_block {
            return Err(Error::SharedMemory {
                kernel: names::gemv(grouped, slots, m, bits, dtype),
                available: device.max_smem_per_block,
            });
        }
        let f = &self.funcs[i];
        Ok((f, launch))
    }
}

/// How one GEMV call is launched, whichever the variant.
#[derive(Clone, Copy, Debug)]
struct GemvLaunch {
    /// The packed geometry argument.
    geom: u32,
    threads: u32,
    smem_bytes: u32,
    /// Column blocks of the matrix.
    col_blocks: u32,
    /// Blocks of a dense launch (grouped: per activation row).
    grid: u32,
    /// Blocks of this instance and geometry that fit on one SM.
    resident: u32,
    /// Dense, k = 2: the launch of the half instance that computes the
    /// column blocks past `whole` of [`g::split_last_round`] (the dense
    /// kernel stops there by the same rule).
    last_round: Option<HalfLaunch>,
}

/// The second launch of a dense call whose last round of column blocks is
/// split into 16-column groups (`kbit_gemv_half_*`, one block per group).
#[derive(Clone, Copy, Debug)]
struct HalfLaunch {
    /// Kernel table index.
    index: usize,
    geom: u32,
    threads: u32,
    smem_bytes: u32,
    /// The groups `first .. units` it computes.
    first: u32,
    units: u32,
    /// Its blocks that fit on one SM.
    resident: u32,
}

/// Smallest K on which a dense column-slot call of M ≥ 2 rows aims at 1/M
/// of M = 1's blocks ([`SlotPlan::new`]). Measured on narrow matrices
/// (H100, k = 2..5, M = 2..4): N = 512 with K = 2048, 4096 and 7168 gain
/// up to 20 %; K = 1024 × N = 1024 is mixed (±10 % by k and M), and
/// K = 512 × N = 2048 loses up to 50 % at M = 4.
const SLOT_WIDE_MIN_K: usize = 2048;

/// Launch plan of the column-slot variant (`kbit_format::gemv_slots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotPlan {
    /// Columns per block, K slots, staging chunk.
    pub geometry: SlotGeometry,
    /// Blocks along N: `ceil(N / C)`.
    pub col_blocks: u32,
    /// Dynamic shared memory per block.
    pub smem_bytes: u32,
}

impl SlotPlan {
    /// Plans `m` rows against a `shape` weight of `bits` bits on a device
    /// with `sm_count` SMs; `units` as in [`GemvPlan::new`], `max_threads`
    /// the instance's block limit.
    ///
    /// `S` is [`gs::slots`] of the shape (never anything else: it fixes the
    /// summation order). `C` is the widest power of two (≥ one warp per
    /// block, ≤ `max_threads / S`) that still gives about one block per SM
    /// (7/8 of them; a dense call of M rows on K ≥ [`SLOT_WIDE_MIN_K`] 1/M
    /// of that, as each block stages all M rows of the activations: `kv`,
    /// 2048×512, at M = 2 runs 64 blocks of 8 columns 10–19 % faster than
    /// 128 of 4 on an H100), so
    /// narrow matrices spread over the whole GPU while wide
    /// ones keep many columns per block; a dense matrix that this gives
    /// between one and one and a half blocks per SM gets half that `C`.
    /// The staging chunk `R` (loop
    /// iterations, `R·S` tiles) holds about 64 (tile, row) pairs (128 at M ≤ 2) of
    /// activations, at least one iteration's `S` tiles and at most all of K.
    /// A grouped call (`units > 1`) whose slots own one K tile each and
    /// whose blocks would outnumber the SMs gives each block two column
    /// groups (`J = 2`, the kernels' pair path): half the blocks, every
    /// thread's two tiles loaded before the grid-dependency wait.
    pub fn new(shape: Shape, bits: u32, m: usize, sm_count: u32, units: usize, max_threads: u32) -> Self {
        let s = gs::slots(shape.n, shape.k);
        let lo = (32 / s).max(1);
        let hi = (max_threads.min(gs::MAX_THREADS) / s).max(lo);
        // A grouped call whose slots own one K tile each takes blocks of
        // half the columns where those still hold a warp of columns, at
        // four rows and k ≤ 4 (twice the blocks, two per SM at 8 experts),
        // and at one row where the wide blocks (two column groups each)
        // would already be more than two per SM. H100, µs, `moe_dn` (K =
        // 512 → N = 2048, 8 slots, 64 → 32 columns): ×8 at four rows, k = 2
        // / 3 / 4: 4.69 / 5.14 / 5.46 → 4.53 / 4.80 / 5.04; ×64 at one row
        // (1024 wide blocks), k = 2 / 3 / 4 / 5: 17.40 / 19.85 / 20.79 /
        // 25.66 → 16.91 / 17.82 / 18.74 / 22.75. ×8 at one to three rows
        // (128 wide blocks) and at k = 5 the narrower blocks lost 3–15 %,
        // and `moe_gu` ×8 (32 slots, 16 → 8 columns) lost at every M.
        let one_tile = s as usize >= kbit_format::tile::k_tiles(shape.k);
        let crowded = units * shape.n.div_ceil(2 * hi as usize) > 2 * sm_count as usize;
        let narrow = (m == 4 && bits <= 4) || (m == 1 && crowded);
        let hi = if units > 1 && narrow && one_tile && hi >= 64 { hi / 2 } else { hi };
        // A dense block stages all M rows of the activations: at M ≥ 2 on
        // long K, fewer, wider blocks (each block's share of the GPU times
        // M). Short K stages little and wants the blocks (H100, µs, M = 2 /
        // 4, N × K = 512×4096 at k = 4 3.92 / 6.26 against 4.95 / 6.92 with
        // M = 1's blocks; 2048×512 at k = 5 2.17 / 3.45 against 1.87 / 2.30).
        let per_row = if units <= 1 && shape.k >= SLOT_WIDE_MIN_K { m.max(1) } else { 1 };
        let want = (sm_count as usize * 7).div_ceil(8 * per_row).max(1);
        let mut c = 1u32 << hi.ilog2();
        while c > lo && units.max(1) * shape.n.div_ceil(c as usize) < want {
            c /= 2;
        }
        // A dense matrix of between one and one and a half blocks per SM
        // would leave the SMs that get a second block finishing alone
        // (2048×5120: 160 blocks on 132 SMs); halving C evens the shares.
        let blocks = shape.n.div_ceil(c as usize);
        if units <= 1 && c > lo && blocks > sm_count as usize && 2 * blocks <= 3 * sm_count as usize {
            c /= 2;
        }
        let n_iter = kbit_format::tile::k_tiles(shape.k).div_ceil(s as usize) as u32;
        // One or two rows stage up to 128 (tile, row) pairs (at most 34
        // KiB). H100, µs, k = 2..5: K × N = 5120×2048 in one chunk of 3
        // iterations ran 4.5 % faster at M = 1 than in two; at M = 2, in
        // chunks of 2 instead of 1, 2 % faster at k ≤ 4 and 4.6 % slower at
        // k = 5, 4096×2048 (2 iterations) 6 % faster and 7168×2048 4–9 %.
        // At M = 3, 4 they lost as often as they won (`gateup`, GLM shared
        // +7 % at M = 4, k = 4; `q`, `o` −3 to −6 %).
        let pairs = if m <= 2 { 128 } else { 64 };
        let per_chunk = (pairs / (s * m as u32)).max(1);
        let chunk = (1u32 << per_chunk.ilog2()).min(n_iter.next_power_of_two());
        // Grouped calls whose slots own one K tile each and whose units
        // would need more than one block per SM: two column groups per
        // block, so the grid fits one round with room for the next launch.
        let two = units > 1 && n_iter == 1 && units * shape.n.div_ceil(c as usize) > sm_count as usize;
        let geometry =
            SlotGeometry { log_cols: c.ilog2(), log_slots: s.ilog2(), log_chunk: chunk.ilog2(), log_reps: two as u32 };
        Self {
            geometry,
            col_blocks: shape.n.div_ceil(geometry.span() as usize) as u32,
            smem_bytes: geometry.smem_bytes(bits, m as u32),
        }
    }
}

/// Column blocks per SM from which a dense block-variant call runs one
/// block of two teams per SM. With fewer the per-SM shares are coarse
/// either way (H100, M = 1..2: 4096×14336, 3.4 column blocks per SM, ran
/// 20.2 µs with two blocks per SM and 21.8 µs teamed; 8192×28672, 6.8 per
/// SM, 59.8 µs and 57.3 µs). Pair sums (k = 2, M = 1) team from two
/// column blocks per SM: their tables (2 KiB a K tile) leave room for one
/// block per SM, and two teams share them (H200, Llama-3-8B gate/up: 12.58
/// µs with one team, 11.39 teamed).
pub(crate) const TEAMED_MIN_COL_BLOCKS_PER_SM: usize = 4;

/// What a block-variant GEMV launch is for: it decides the teams and what
/// the shared memory must hold besides the instance's own layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// A dense call whose instance may hold two teams per block.
    Teamed,
    /// A dense call of one team per block.
    Dense,
    /// A grouped call: one column block per block, and (k = 2, `max_m` ≥ 2)
    /// room for the pair-sum layout of an expert with one row
    /// (`kbit_format::gemv`, "Summation order").
    Grouped,
}

/// Launch plan of one GEMV call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemvPlan {
    /// Warps per block (K slots) and staging chunk.
    pub geometry: Geometry,
    /// Blocks along N: `ceil(N / 32)`.
    pub col_blocks: u32,
    /// Dynamic shared memory per block.
    pub smem_bytes: u32,
}

impl GemvPlan {
    /// Plans `m` rows against a `shape` weight of `bits` bits for an
    /// instance whose largest block is `max_threads` (its register use), on
    /// `device` (SM count, shared memory per SM and per block). `units` is
    /// how many matrices share the launch (1 dense; for grouped, the
    /// experts that may have rows).
    ///
    /// `W` is [`g::warps`] of K, never anything else (it fixes the
    /// summation order); an instance too large for it is an error. Shared
    /// memory is sized for two blocks per SM when there are more column
    /// blocks than SMs, else for one. Within that: short K (≤ 3 tiles per
    /// warp) first gets rings deep enough to have all its tiles in flight
    /// at once; then the staging chunk `R` (loop iterations, `R·W` tiles)
    /// grows up to all of K (activations staged once per block), at least
    /// about 64 (tile, row) pairs; then the rings get the most stages that
    /// still fit (at most [`g::MAX_STAGES`], at least 2).
    ///
    /// A dense call ([`Call::Teamed`]) whose instance can hold two teams of
    /// `W` warps and whose matrix has at least
    /// [`TEAMED_MIN_COL_BLOCKS_PER_SM`] column blocks per SM gets one block
    /// per SM of two teams instead ([`GemvPlan::teamed`]), when that fits.
    ///
    /// Pair sums (k = 2, M = 1) stage 2 KiB of tables per K tile: when the
    /// least chunk does not fit two blocks per SM the call takes one, and
    /// when the chunk leaves part of K out, shared memory also holds the
    /// accumulator slots of the block's column blocks
    /// ([`Geometry::sums_slot_bytes`]; a dense block computes at most
    /// `ceil(col_blocks / SMs)`, a grouped one one).
    pub fn new(
        shape: Shape,
        bits: u32,
        m: usize,
        max_threads: u32,
        device: &DeviceInfo,
        units: usize,
        call: Call,
    ) -> Result<Self> {
        let w = g::warps(shape.k);
        if 32 * w > max_threads {
            return Err(Error::NotApplicable {
                kernel: crate::Kernel::Scalar,
                why: format!("k={bits} m={m}: needs {} threads per block, the build allows {max_threads}", 32 * w),
            });
        }
        let col_blocks = shape.n.div_ceil(g::BLOCK_COLS as usize);
        let n_iter = kbit_format::tile::k_tiles(shape.k).div_ceil(w as usize) as u32;
        // Pair sums share their tables between the teams: from two column
        // blocks per SM (`TEAMED_MIN_COL_BLOCKS_PER_SM`).
        let min_per_sm = if g::sums(bits, m as u32) { 2 } else { TEAMED_MIN_COL_BLOCKS_PER_SM };
        if call == Call::Teamed
            && 64 * w <= max_threads
            && col_blocks >= min_per_sm * device.sm_count as usize
            && let Some(p) = Self::teamed(w, n_iter, col_blocks, bits, m, device)
        {
            return Ok(p);
        }
        let geo =
            |chunk: u32, stages: u32| Geometry { log_warps: w.ilog2(), log_chunk: chunk.ilog2(), stages, log_teams: 0 };
        let items = if call == Call::Grouped { 1 } else { col_blocks.div_ceil(device.sm_count as usize).max(1) };
        let bytes = |geo: Geometry| {
            let chunked = geo.chunk() < n_iter;
            let slots = |m: u32, items: usize| {
                if g::sums(bits, m) && chunked { geo.sums_slot_bytes(items as u32) } else { 0 }
            };
            let own = geo.smem_bytes(bits, m as u32) + slots(m as u32, items);
            let one_row = if call == Call::Grouped && m > 1 && g::sums(bits, 1) {
                geo.smem_bytes(bits, 1) + slots(1, 1)
            } else {
                0
            };
            own.max(one_row) as usize
        };
        // Pair sums' tables are 7 times the activations they replace: any
        // chunk down to one iteration.
        let per_chunk = if g::sums(bits, m as u32) { 1 } else { (64 / (w * m as u32)).max(1) };
        let least = (1u32 << per_chunk.ilog2()).min(n_iter.next_power_of_two());
        // Two blocks per SM only pay when there is work for them (and, with
        // pair sums, only when the least chunk leaves room for two). The
        // driver reserves 1 KB of shared memory per block.
        let two = col_blocks * units.max(1) > device.sm_count as usize && !g::sums(bits, m as u32);
        let fits = |chunk: u32, stages: u32| {
            let bytes = bytes(geo(chunk, stages));
            if two { 2 * (bytes + 1024) <= device.max_smem_per_sm } else { bytes <= device.max_smem_per_block }
        };
        let deep = if n_iter <= 3 { n_iter + 1 } else { 2 };
        let first = if fits(least, deep) { deep } else { 2 };
        let mut chunk = n_iter.next_power_of_two();
        while chunk > least && !fits(chunk, first) {
            chunk /= 2;
        }
        let stages = (first..=g::MAX_STAGES).rev().find(|&s| fits(chunk, s)).unwrap_or(2);
        let geometry = geo(chunk, stages);
        Ok(Self { geometry, col_blocks: col_blocks as u32, smem_bytes: bytes(geometry) as u32 })
    }

    /// The plan of one block per SM holding two teams of `W` warps, if it
    /// fits: the teams share one decode table and the activations, staged
    /// once for all of K, and each gets the deepest rings (2 stages at
    /// least) that still fit one block per SM. Two blocks per SM would
    /// hold the same warps but pair their column blocks as the hardware
    /// happens to place them (an SM holding two blocks with one column block
    /// more each finishes last); one block per SM takes `grid` column
    /// blocks at a time, so the SMs' shares differ by at most one.
    ///
    /// Pair sums may instead walk K in chunks (the largest that fits with
    /// two stages), with accumulator slots for every thread of the block
    /// and the column blocks of one team.
    fn teamed(w: u32, n_iter: u32, col_blocks: usize, bits: u32, m: usize, device: &DeviceInfo) -> Option<Self> {
        let sums = g::sums(bits, m as u32);
        let items = col_blocks.div_ceil(2 * device.sm_count as usize).max(1) as u32;
        let geo =
            |chunk: u32, stages: u32| Geometry { log_warps: w.ilog2(), log_chunk: chunk.ilog2(), stages, log_teams: 1 };
        let bytes = |geo: Geometry| {
            let slots = if sums && geo.chunk() < n_iter { geo.sums_slot_bytes(items) } else { 0 };
            (geo.smem_bytes(bits, m as u32) + slots) as usize
        };
        // The driver reserves 1 KB of shared memory per block.
        let fits = |chunk: u32, stages: u32| {
            let bytes = bytes(geo(chunk, stages));
            bytes <= device.max_smem_per_block && bytes + 1024 <= device.max_smem_per_sm
        };
        let mut chunk = n_iter.next_power_of_two();
        while sums && chunk > 1 && !fits(chunk, 2) {
            chunk /= 2;
        }
        let stages = (2..=g::MAX_STAGES).rev().find(|&s| fits(chunk, s))?;
        let geometry = geo(chunk, stages);
        Some(Self { geometry, col_blocks: col_blocks as u32, smem_bytes: bytes(geometry) as u32 })
    }
}

/// The kernel table slot of a dtype, or the error for f32.
fn gemv_dtype(op: &'static str, dtype: Dtype) -> Result<Dtype> {
    if GEMV_DTYPES.contains(&dtype) {
        Ok(dtype)
    } else {
        Err(Error::Mismatch { what: op, left: format!("{dtype:?} activations"), right: "f16 or bf16".into() })
    }
}

fn check_rows(m: usize) -> Result<()> {
    if (1..=GEMV_MAX_M).contains(&m) { Ok(()) } else { Err(Error::Rows { m, max: GEMV_MAX_M }) }
}

impl Context {
    /// Scalar GEMV `y[M, N] = x[M, K] · Wᵀ` for M = 1..=4 (kernel 1):
    /// each codebook value is looked up once and FMA'd into all M rows in
    /// f32, with the block's absmax applied per weight or once per block
    /// dot product (the summation orders below); on matrices of 2^25
    /// weights and more at k = 2 and M = 1 the lookups are of pair sums
    /// `x₀·cb[a] + x₁·cb[b]` built from the activations instead. The output
    /// is rounded to nearest even. Deterministic: the
    /// same inputs give the same bits on every run (the summation orders
    /// are documented in [`kbit_format::gemv`] and
    /// [`kbit_format::gemv_slots`]).
    ///
    /// `x` is row-major `[m, K]` (16-byte aligned), `y` row-major `[m, N]`;
    /// f16 or bf16. Asynchronous on [`Context::stream`]; allocates nothing
    /// and never synchronizes, so it can be captured in a CUDA graph.
    ///
    /// ```no_run
    /// use half::f16;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(4096, 2048)?; // N = 4096 outputs, K = 2048 inputs
    /// let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.upload(&kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?)?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 2 * 2048])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(2 * 4096)?;
    /// ctx.gemv(&x, 2, &weight, &mut y)?;
    /// let y = ctx.stream().clone_dtoh(&y)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for f32 activations, [`Error::Rows`] for `m`
    /// outside 1..=4, [`Error::Length`] if `x` or `y` do not hold `m·K` and
    /// `m·N` elements, [`Error::Alignment`] if `x` is not 16-byte aligned,
    /// [`Error::SharedMemory`] on a device with too little shared memory.
    pub fn gemv<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let dtype = gemv_dtype("gemv: activation dtype", T::DTYPE)?;
        check_rows(m)?;
        let shape = w.shape();
        check_len("gemv: activations x (M·K)", m * shape.k, x.len())?;
        check_len("gemv: output y (M·N)", m * shape.n, y.len())?;
        let xp = dptr(x, self);
        if xp % 16 != 0 {
            return Err(Error::Alignment { what: "gemv: activations x", align: 16 });
        }
        let bits = w.bits();
        let (f, launch) = self.kernels.gemv.launch(false, shape, m, bits, dtype, self.info(), 1)?;
        let s = self.stream();
        let (yp, _guard) = y.device_ptr_mut(s);
        let (pp, sp, cp) = (dptr(&w.packed, self), dptr(&w.scales, self), dptr(&w.cb, self));
        let (n, k, geom) = (shape.n as u32, shape.k as u32, launch.geom);
        let mut cfg = LaunchConfig {
            grid_dim: (launch.grid, 1, 1),
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.smem_bytes,
        };
        let programmatic = self.programmatic_now(&mut cfg, launch.resident);
        unsafe { launch::launch(s, f, cfg, programmatic, &mut args![pp, sp, cp, xp, yp, n, k, geom])? };
        let Some(half) = launch.last_round else { return Ok(()) };
        let (geom, first, units) = (half.geom, half.first, half.units);
        let mut cfg = LaunchConfig {
            grid_dim: (units - first, 1, 1),
            block_dim: (half.threads, 1, 1),
            shared_mem_bytes: half.smem_bytes,
        };
        let programmatic = self.programmatic_now(&mut cfg, half.resident);
        let f = &self.kernels.gemv.funcs[half.index];
        unsafe { launch::launch(s, f, cfg, programmatic, &mut args![pp, sp, cp, xp, yp, n, k, geom, first, units]) }
    }

    /// Grouped scalar GEMV over MoE experts (kernel 4), all experts in one
    /// launch: for every expert `e`, rows `offsets[e] .. offsets[e+1]` of
    /// `y[total_rows, N]` are `x[same rows, K] · W_eᵀ`, computed exactly as
    /// [`Context::gemv`] would compute them for that expert alone (bit for
    /// bit).
    ///
    /// - `x`: `[total_rows, K]`, the rows of all experts concatenated in
    ///   expert order (16-byte aligned); `total_rows = x.len() / K`.
    /// - `expert_offsets`: `num_experts + 1` u32 on the device, non-decreasing
    ///   from 0 to `total_rows`. They are never read on the host: the call
    ///   does not synchronize, allocates nothing, and can be captured in a
    ///   CUDA graph. Experts with 0 rows are legal and cost almost nothing.
    /// - `max_m` (1..=4): at least the largest expert's row count; it sizes
    ///   the launch. Rows of an expert past `max_m` are not computed, and
    ///   [`Context::synchronize`] reports the first such expert
    ///   ([`Error::ExpertRows`]).
    /// - `y`: `[total_rows, N]`.
    ///
    /// Offsets that break the contract give unspecified results in `y` but
    /// never an access outside `x`, `y` or the weights.
    ///
    /// ```no_run
    /// use half::f16;
    /// use kbit::{Codebook, ScaleMode, Shape, reference};
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = Shape::new(512, 2048)?;
    /// let cb = Codebook::nf(4)?;
    /// let experts = (0..4)
    ///     .map(|e| {
    ///         let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 31 + e * 7) % 97) as f32 / 97.0 - 0.5).collect();
    ///         reference::repack(&reference::quantize(&w, shape, &cb)?, ScaleMode::Strict)
    ///     })
    ///     .collect::<kbit::Result<Vec<_>>>()?;
    /// let experts = ctx.upload_experts(&experts)?;
    /// // Rows per expert: 2, 0, 1, 3 (6 rows in all).
    /// let offsets = ctx.stream().clone_htod(&[0u32, 2, 2, 3, 6])?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.25); 6 * 2048])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(6 * 512)?;
    /// ctx.grouped_gemv(&x, &offsets, 3, &experts, &mut y)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for f32 activations, an `x` whose length is not a
    /// multiple of K, or more rows than `max_m × num_experts`;
    /// [`Error::Rows`] for `max_m` outside 1..=4; [`Error::Length`] for
    /// `expert_offsets` or `y` of the wrong length; [`Error::Alignment`] if
    /// `x` is not 16-byte aligned; [`Error::TooLarge`] for a grid past the
    /// launch limits; [`Error::SharedMemory`] on a device with too little
    /// shared memory.
    pub fn grouped_gemv<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        max_m: usize,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let dtype = gemv_dtype("grouped_gemv: activation dtype", T::DTYPE)?;
        check_rows(max_m)?;
        let shape = experts.shape();
        let num_experts = experts.num_experts();
        let total_rows = crate::experts::check_grouped(experts, expert_offsets.len(), max_m, x.len(), y.len())?;
        if total_rows == 0 {
            return Ok(());
        }
        let xp = dptr(x, self);
        if xp % 16 != 0 {
            return Err(Error::Alignment { what: "grouped_gemv: activations x", align: 16 });
        }
        let bits = experts.bits();
        // At most min(experts, rows) experts have rows: they share the GPU,
        // one unit (an expert, or with as many experts as rows a row; see
        // the kernels' `grouped_unit`) per block row of the grid.
        let units = num_experts.min(total_rows);
        let (f, launch) = self.kernels.gemv.launch(true, shape, max_m, bits, dtype, self.info(), units)?;
        let blocks = units as u64 * launch.col_blocks as u64;
        if blocks > i32::MAX as u64 || num_experts >= u32::MAX as usize {
            return Err(Error::TooLarge { n: shape.n, k: shape.k });
        }
        let s = self.stream();
        let (yp, _guard) = y.device_ptr_mut(s);
        let op = dptr(expert_offsets, self);
        let (pp, sp, cp) = (dptr(&experts.packed, self), dptr(&experts.scales, self), dptr(&experts.cb, self));
        let (ne, rows, n, k) = (num_experts as u32, total_rows as u32, shape.n as u32, shape.k as u32);
        let (geom, cbs) = (launch.geom, launch.col_blocks);
        let mut cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.smem_bytes,
        };
        let status = self.status_ptr(STATUS_EXPERT_ROWS);
        let mut a = args![pp, sp, cp, xp, yp, op, ne, rows, status, n, k, geom, cbs];
        let programmatic = self.programmatic_now(&mut cfg, launch.resident);
        unsafe { launch::launch(s, f, cfg, programmatic, &mut a) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(sm_count: u32, max_smem_per_block: usize, max_smem_per_sm: usize) -> DeviceInfo {
        DeviceInfo {
            name: String::new(),
            compute_capability: (0, 0),
            sm_count,
            l2_bytes: 0,
            max_smem_per_block,
            max_smem_per_sm,
            total_mem: 0,
        }
    }

    /// sm_90: 227 KB per block, 228 KB per SM.
    fn h100() -> DeviceInfo {
        device(132, 232448, 233472)
    }

    /// sm_89: 99 KB per block, 100 KB per SM.
    fn rtx4090() -> DeviceInfo {
        device(128, 101376, 102400)
    }

    /// Every plan is a valid launch: a whole number of warps, at most 512
    /// threads, shared memory within an sm_89 or sm_90 block, W fixed by K
    /// alone, at least two ring stages.
    #[test]
    fn plans_are_valid_launches() {
        let ns = [1usize, 7, 129, 512, 2048, 4096, 4100, 5120, 14336, 28672];
        let ks = [32usize, 64, 96, 512, 2048, 4096, 5120, 8192, 14336];
        for &n in &ns {
            for &k in &ks {
                let shape = Shape::new(n, k).unwrap();
                for bits in 2..=5 {
                    for m in 1..=GEMV_MAX_M {
                        for (dev, units) in [(h100(), 1), (rtx4090(), 1), (h100(), 8)] {
                            let (per_block, per_sm) = (dev.max_smem_per_block, dev.max_smem_per_sm);
                            let p = GemvPlan::new(shape, bits, m, 512, &dev, units, Call::Teamed).unwrap();
                            let geo = p.geometry;
                            assert_eq!(geo.warps(), g::warps(k), "{n}x{k}");
                            assert!(geo.threads() <= 512, "{geo:?}");
                            assert!((2..=g::MAX_STAGES).contains(&geo.stages()), "{geo:?}");
                            // Two blocks (or one of two teams) per SM whenever there
                            // is work for them (sm_90 always has the room; sm_89 not
                            // for every shape).
                            // (Pair sums excepted: their tables of 2 KiB per tile
                            // take one block per SM where the least chunk needs it.)
                            if p.col_blocks as usize * units > dev.sm_count as usize
                                && per_sm > 200_000
                                && geo.teams() == 1
                                && !g::sums(bits, m as u32)
                            {
                                assert!(2 * (p.smem_bytes as usize + 1024) <= per_sm, "{n}x{k} k={bits} m={m}");
                            }
                            assert_eq!(p.col_blocks as usize, n.div_ceil(32));
                            assert!(
                                p.smem_bytes as usize <= per_block,
                                "{n}x{k} k={bits} m={m}: {} bytes",
                                p.smem_bytes
                            );
                            assert_eq!(Geometry::unpack(geo.pack()), geo);
                        }
                    }
                }
            }
        }
        // An instance that cannot hold W warps is refused, not launched smaller.
        assert!(GemvPlan::new(Shape::new(4096, 8192).unwrap(), 4, 1, 256, &h100(), 1, Call::Teamed).is_err());
        // Short K gets every tile of a warp in flight at once.
        let short = GemvPlan::new(Shape::new(5120, 2048).unwrap(), 4, 1, 512, &h100(), 1, Call::Dense).unwrap();
        assert!(short.geometry.stages() >= 3, "{short:?}");
    }

    /// Two-team plans: only for dense calls of instances that allow 64·W
    /// threads and matrices of enough column blocks per SM; then one
    /// block per SM with all of K staged, at least two stages, within the
    /// block's shared memory.
    #[test]
    fn teamed_plans() {
        for &(n, k) in &[(28672usize, 8192usize), (14336, 4096), (8192, 8192), (4096, 8192), (10240, 2048)] {
            for bits in 2..=5 {
                for m in 1..=GEMV_MAX_M {
                    for dev in [h100(), rtx4090()] {
                        let shape = Shape::new(n, k).unwrap();
                        let p = GemvPlan::new(shape, bits, m, 1024, &dev, 1, Call::Teamed).unwrap();
                        let geo = p.geometry;
                        assert_eq!(geo.warps(), g::warps(k));
                        assert!(p.smem_bytes as usize <= dev.max_smem_per_block, "{n}x{k} k={bits} m={m}");
                        assert_eq!(Geometry::unpack(geo.pack()), geo);
                        if geo.teams() > 1 {
                            let min = if g::sums(bits, m as u32) { 2 } else { TEAMED_MIN_COL_BLOCKS_PER_SM };
                            assert!(n.div_ceil(32) >= min * dev.sm_count as usize, "{n}x{k}");
                            assert!(geo.threads() <= 1024 && geo.stages() >= 2, "{geo:?}");
                            let n_iter = kbit_format::tile::k_tiles(k).div_ceil(geo.warps() as usize) as u32;
                            if !g::sums(bits, m as u32) {
                                assert!(geo.chunk() >= n_iter, "{geo:?}: activations must be staged once");
                            }
                            assert!(p.smem_bytes as usize + 1024 <= dev.max_smem_per_sm);
                        }
                        // Grouped calls and register-bound instances keep one team.
                        let grouped = GemvPlan::new(shape, bits, m, 1024, &dev, 1, Call::Grouped).unwrap();
                        assert_eq!(grouped.geometry.teams(), 1);
                        let narrow = GemvPlan::new(shape, bits, m, 512, &dev, 1, Call::Teamed).unwrap();
                        assert_eq!(narrow.geometry.teams(), 1);
                    }
                }
            }
        }
        // The Llama-3-70B gate/up matrix at M = 1 on sm_90 is teamed, and so
        // are the shapes of the GPU test `gemv_two_teams_match_the_cpu_model`
        // (N = 4·SMs·32 + 7) at M = 1 and 2 for the instances that fit 1024
        // threads.
        let big = GemvPlan::new(Shape::new(28672, 8192).unwrap(), 4, 1, 1024, &h100(), 1, Call::Teamed).unwrap();
        assert_eq!(big.geometry.teams(), 2, "{big:?}");
        for k in [2080usize, 8192] {
            for m in 1..=TEAMS_MAX_M {
                for bits in 2..=5 {
                    let shape = Shape::new(4 * 132 * 32 + 7, k).unwrap();
                    let p = GemvPlan::new(shape, bits, m, 1024, &h100(), 1, Call::Teamed).unwrap();
                    assert_eq!(p.geometry.teams(), 2, "{k} m={m} k={bits}: {p:?}");
                }
            }
        }
    }

    /// Every column-slot plan is a valid launch: a whole number of warps, at most 512
    /// threads, shared memory within 66 KB, S fixed by the shape alone.
    #[test]
    fn slot_plans_are_valid_launches() {
        let ns = [1usize, 7, 129, 512, 2048, 4096, 4100, 5120, 14336, 28672];
        let ks = [32usize, 64, 96, 512, 2048, 4096, 5120, 8192, 14336];
        for &n in &ns {
            for &k in &ks {
                let shape = Shape::new(n, k).unwrap();
                for bits in 2..=5 {
                    for m in 1..=GEMV_MAX_M {
                        for (sms, units) in [(132, 1), (128, 1), (1, 1), (132, 8), (132, 64)] {
                            for max_threads in [1024, 512, 256] {
                                let p = SlotPlan::new(shape, bits, m, sms, units, max_threads);
                                let geo = p.geometry;
                                assert_eq!(geo.slots(), gs::slots(n, k), "{n}x{k}");
                                assert!(geo.threads() >= 32 && geo.threads() % 32 == 0, "{geo:?}");
                                assert!(geo.threads() <= max_threads.min(512), "{geo:?}");
                                assert_eq!(p.col_blocks as usize, n.div_ceil(geo.span() as usize));
                                // Two column groups only for grouped calls whose
                                // slots own one K tile each (the pair path).
                                if geo.reps() > 1 {
                                    assert!(units > 1 && geo.slots() as usize >= kbit_format::tile::k_tiles(k));
                                    assert_eq!(geo.reps(), 2);
                                }
                                // At most a 32 KiB table and 34 KiB of staged
                                // activations (128 tile-rows at M ≤ 2).
                                assert!(p.smem_bytes <= 67584, "{n}x{k} k={bits} m={m}: {} bytes", p.smem_bytes);
                                assert_eq!(SlotGeometry::unpack(geo.pack()), geo);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The design's shapes fill an H100 (132 SMs) with at least 7/8 of a
    /// block per SM and keep whole warps on one K slot where N allows it.
    #[test]
    fn slot_plans_fill_the_gpu() {
        for (n, k) in
            [(5120, 2048), (2048, 5120), (4096, 2048), (512, 2048), (2048, 4096), (14336, 4096), (28672, 8192)]
        {
            let p = SlotPlan::new(Shape::new(n, k).unwrap(), 4, 1, 132, 1, 1024);
            assert!(p.col_blocks >= 116, "{n}x{k}: {p:?}");
        }
        let wide = SlotPlan::new(Shape::new(14336, 4096).unwrap(), 4, 1, 132, 1, 1024);
        assert!(wide.geometry.cols() >= 32, "{wide:?}");
    }

    /// The MoE shapes over 8 or 64 experts take two column groups per
    /// block, which brings 8 experts to one block per SM (two for `moe_dn`
    /// at four rows, k ≤ 4: [`grouped_plans_halve_wide_blocks`]);
    /// dense calls and a single expert never do.
    #[test]
    fn grouped_slot_plans_pair_columns() {
        for (n, k) in [(512, 2048), (2048, 512)] {
            let shape = Shape::new(n, k).unwrap();
            for m in 1..=GEMV_MAX_M {
                let p = SlotPlan::new(shape, 4, m, 132, 8, 512);
                assert_eq!(p.geometry.reps(), 2, "{n}x{k} m={m}: {p:?}");
                let per_sm = if n == 2048 && m == 4 { 2 } else { 1 };
                assert!(8 * p.col_blocks <= per_sm * 132, "{n}x{k} m={m}: {p:?}");
                assert_eq!(SlotPlan::new(shape, 4, m, 132, 64, 512).geometry.reps(), 2);
                assert_eq!(SlotPlan::new(shape, 4, m, 132, 1, 512).geometry.reps(), 1);
            }
        }
        // Slots that own two K tiles (q: 2048x4096, 16 slots of 32 tiles) keep one group.
        assert_eq!(SlotPlan::new(Shape::new(4096, 2048).unwrap(), 4, 1, 132, 8, 512).geometry.reps(), 1);
    }

    /// Four rows at k ≤ 4 on `moe_dn` (64 columns of 8 slots) take blocks
    /// of half the columns, and so does one row where the wide blocks
    /// crowd the SMs (64 experts); other row counts, k = 5 and `moe_gu`
    /// (16 columns) keep the widest, and a dense call one column group.
    #[test]
    fn grouped_plans_halve_wide_blocks() {
        let (dn, gu) = (Shape::new(2048, 512).unwrap(), Shape::new(512, 2048).unwrap());
        for bits in 2..=5 {
            for m in 1..=GEMV_MAX_M {
                let p = SlotPlan::new(dn, bits, m, 132, 8, 512);
                let cols = if m == 4 && bits <= 4 { 32 } else { 64 };
                assert_eq!((p.geometry.cols(), p.geometry.reps()), (cols, 2), "k={bits} m={m}: {p:?}");
                assert_eq!(p.col_blocks as usize, 2048 / (2 * cols as usize));
                assert_eq!(SlotPlan::new(gu, bits, m, 132, 8, 512).geometry.cols(), 16, "k={bits} m={m}");
                assert_eq!(SlotPlan::new(dn, bits, m, 132, 1, 512).geometry.reps(), 1);
                // 64 experts: one row narrows too (1024 wide blocks), two
                // and three rows do not.
                let p = SlotPlan::new(dn, bits, m, 132, 64, 512);
                let cols = if (m == 4 && bits <= 4) || m == 1 { 32 } else { 64 };
                assert_eq!((p.geometry.cols(), p.geometry.reps()), (cols, 2), "64 experts, k={bits} m={m}: {p:?}");
                assert_eq!(SlotPlan::new(gu, bits, m, 132, 64, 512).geometry.cols(), 16, "k={bits} m={m}");
            }
        }
    }

    #[test]
    fn kernel_table_slots_are_dense() {
        let mut seen = std::collections::HashSet::new();
        for slots in [false, true] {
            for grouped in [false, true] {
                for m in 1..=GEMV_MAX_M {
                    for bits in 2..=5 {
                        for d in GEMV_DTYPES {
                            assert!(seen.insert(slot(slots, grouped, m, bits, d)));
                        }
                    }
                }
            }
        }
        for m in 1..=TEAMS_MAX_M {
            for bits in 2..=5 {
                for d in GEMV_DTYPES {
                    assert!(seen.insert(teams_slot(m, bits, d)));
                }
            }
        }
        for m in 1..=GEMV_MAX_M {
            for bits in 2..=5 {
                for d in GEMV_DTYPES {
                    assert!(seen.insert(pairs_slot(m, bits, d)));
                }
            }
        }
        for d in GEMV_DTYPES {
            assert!(seen.insert(half_slot(d)));
        }
        assert_eq!(seen.len(), names::all_gemv().len());
        assert!(seen.iter().all(|&s| s < seen.len()));
        // The table order of `names::all_gemv` matches `slot`.
        let all = names::all_gemv();
        assert_eq!(all[slot(false, true, 3, 4, Dtype::Bf16)], names::gemv(true, false, 3, 4, Dtype::Bf16));
        assert_eq!(all[slot(true, true, 2, 5, Dtype::F16)], names::gemv(true, true, 2, 5, Dtype::F16));
        assert_eq!(all[slot(false, false, 1, 2, Dtype::F16)], "kbit_gemv_m1_k2_f16");
        assert_eq!(all[slot(true, false, 1, 2, Dtype::F16)], "kbit_gemv_slots_m1_k2_f16");
        assert_eq!(all[teams_slot(2, 3, Dtype::Bf16)], "kbit_gemv_teams_m2_k3_bf16");
        assert_eq!(all[pairs_slot(3, 5, Dtype::F16)], "kbit_grouped_gemv_pairs_m3_k5_f16");
        assert_eq!(all[half_slot(Dtype::F16)], "kbit_gemv_half_m2_k2_f16");
        assert_eq!(all[half_slot(Dtype::Bf16)], *all.last().unwrap());
    }
}
