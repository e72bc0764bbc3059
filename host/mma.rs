//! Kernel 2, the tensor-core dequant GEMM: `y[M, N] = x[M, K] · Wᵀ` for
//! M = 1..=64 with f16 or bf16 activations, reading the runtime layout.
//!
//! Each call picks an instance (`ceil(M / 16)` m16 blocks, a 64- or
//! 128-column tile by the split-K cost model), plans the persistent grid,
//! the K splits and the pipeline shape (stages × K tiles per stage, within
//! the instance's shared memory; [`crate::splitk`]) for the device's SM
//! count, and launches once on the context's stream. On matrices of up to
//! 2^25 weights it runs the K-slot variant instead
//! (`kernels-gpu/src/mma_kslots.rs`: a block owns 8, 16 or 32 columns and
//! all of K, split over its 8 warps) where it is measured faster: dense
//! calls at M = 5..8 by the table of [`crate::mid_m`] where it decides, and
//! otherwise by the rules of `kslots_first` (at M ≤ 8 on grids resident in
//! one wave, or 5/4 of one at k ≥ 4, and at M = 9..16 on some);
//! [`MmaOptions::k_slots`] forces either form. At M ≤ 4, at M = 5..8
//! on all but small shapes, and at M = 9..16 on shapes of two 16-column
//! groups per SM or more with K of 2048..3072 (to 4096 at k ≥ 4)
//! (`direct_preferred`), it runs the
//! direct-load variant (`kernels-gpu/src/mma_direct.rs`: each lane loads
//! two whole quant blocks into registers a step ahead; teams of 16 warps
//! walk 16-column groups and split K over their warps, one team per
//! block or, where that measured faster (`direct_teams`), two sharing a
//! block's table and staged activations), wherever its shared memory
//! (table, staged activations) fits;
//! [`MmaOptions::direct`] forces it on or off. The split-K
//! workspace and counters belong to the [`Context`] (allocated at
//! creation); the kernel leaves the counters at zero, so calls need no memset, no allocation and no host
//! synchronization, and can be captured in a CUDA graph.
//!
//! Numerics: each weight is `T(T(cb) · T(amax))` (codebook entry and E4M4
//! scale converted to T, one product rounded to T), products and sums in
//! f32 on the tensor cores, split partials added in f32 in split order (the
//! result is bit-identical from call to call), one rounding to T at the end.

use crate::context::SMEM_RESERVED_PER_BLOCK;
use crate::device::dptr;
use crate::launch;
use crate::mid_m;
use crate::module::{
    MMA_GROUPED_TILE_N, MMA_M_BLOCKS, MMA_STREAM, MMA_TILE_N, mma_direct_early_slot, mma_direct_slot,
    mma_direct_xreg_slot, mma_grouped_slot, mma_kslots_slot, mma_slot, names,
};
use crate::splitk::{self, Limits, Plan, Splits, TileConfig};
use crate::weight::check_len;
use crate::{Context, DeviceInfo, Dtype, Element, Error, KbitWeight, Result, Shape};
use cudarc::driver::sys::CUfunction_attribute as FnAttr;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use kbit_format::mma as geo;
use kbit_format::mma_direct as direct;
use kbit_format::mma_kslots as kslots;
use std::ffi::c_void;
use std::sync::Arc;

/// f32 values of the split-K workspace a context allocates (16 MiB): room
/// for e.g. 512 partial tiles of 16 × 128 or 128 of 64 × 128.
pub const SPLITK_WORKSPACE_F32: usize = 1 << 22;
/// Split-K arrival counters a context allocates.
pub const SPLITK_COUNTERS: usize = 1 << 14;
/// Most resident blocks per SM an instance is sized for (see
/// [`splitk::slots_for`]: a third block only where it still gets a
/// full-depth pipeline).
const MAX_BLOCKS_PER_SM: u32 = 3;

/// Options of [`Context::mma_gemm_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmaOptions {
    /// Split-K policy.
    pub splits: Splits,
    /// Plan for this many SMs instead of the device's (tests of other GPUs'
    /// split choices; any count gives correct results).
    pub sm_count_override: Option<u32>,
    /// K tiles per pipeline stage (1..=4) instead of the planner's choice
    /// (tests of partial stages; any value that fits gives correct results).
    pub stage_tiles: Option<u32>,
    /// Warpgroup GEMM (sm_90) only: activation rows per block, 128 or 256,
    /// instead of the planner's choice.
    pub tile_rows: Option<u32>,
    /// `Some(true)`: the K-slot variant (M ≤ 16, automatic splits and
    /// stages only); `Some(false)`: the pipelined kernel; `None`: the
    /// planner's choice ([`Context::mma_plan`]).
    pub k_slots: Option<bool>,
    /// `Some(true)`: the direct-load variant (M ≤ 16, automatic splits and
    /// stages only); `Some(false)`: never it; `None`: the planner's choice.
    /// A forced `k_slots` rules it out.
    pub direct: Option<bool>,
    /// Direct-load variant only: `Some(true)`: two teams of 16 warps per
    /// block (k ≤ 4); `Some(false)`: one; `None`: the planner's choice
    /// (two where one team per block crowds an SM and that measured faster).
    pub teams: Option<bool>,
    /// Direct-load variant only: `Some(true)`: one team whose warps decode
    /// half of their first step before the grid-dependency wait (k ≤ 4,
    /// M ≤ 4); `Some(false)`: never; `None`: the planner's choice (where the
    /// next call's blocks can wait resident beside this call's).
    pub early_decode: Option<bool>,
    /// Direct-load variant only: `Some(true)`: one team whose warps load
    /// their one step's activations into registers instead of staging them
    /// (sm_90, k ≤ 4, M = 2..8, K ≤ 2048, not with two teams or early
    /// decode); `Some(false)`: never; `None`: the planner's choice.
    pub x_registers: Option<bool>,
}

/// How one kernel instance runs on this device.
#[derive(Clone, Copy, Debug)]
struct Instance {
    /// K-tile slots of pipeline stages per block, `blocks_per_sm` resident.
    tile_slots: u32,
    blocks_per_sm: u32,
    /// K-tile slots of one block alone on an SM (its whole shared memory):
    /// what a launch whose grid gives no SM a second block uses.
    lone_slots: u32,
}

/// The context's tensor-core GEMM state: per-instance launch configuration
/// and the split-K workspace and counters.
pub(crate) struct MmaState {
    instances: Vec<Option<Instance>>,
    pub(crate) workspace: CudaSlice<f32>,
    pub(crate) counters: CudaSlice<u32>,
}

impl MmaState {
    /// Chooses every instance's shared memory (K-tile slots of pipeline
    /// stages) from the device's, opts it into that much dynamic shared
    /// memory, asks the driver how many blocks stay resident (one block per
    /// SM when registers allow only one: then it takes all the slots that
    /// fit), and allocates the zeroed workspace.
    pub(crate) fn new(stream: &Arc<CudaStream>, kernels: &crate::module::Kernels, info: &DeviceInfo) -> Result<Self> {
        let mut keys = Vec::with_capacity(kernels.mma.len());
        for bits in crate::module::BITS {
            for mb in MMA_M_BLOCKS {
                for tn in MMA_TILE_N {
                    for d in [Dtype::F16, Dtype::Bf16] {
                        keys.push((bits, mb, tn, d, false));
                    }
                }
            }
        }
        for (bits, mb) in MMA_STREAM {
            for d in [Dtype::F16, Dtype::Bf16] {
                keys.push((bits, mb, 128, d, true));
            }
        }
        let mut instances = Vec::with_capacity(kernels.mma.len());
        for (bits, mb, tn, d, sk) in keys {
            let slot = mma_slot(bits, mb, tn, d, sk).expect("mma table order");
            debug_assert_eq!(instances.len(), slot);
            instances.push(Self::instance(&kernels.mma[slot], bits, mb, tn, info)?);
        }
        for bits in crate::module::BITS {
            for mb in MMA_M_BLOCKS {
                for d in [Dtype::F16, Dtype::Bf16] {
                    let slot = mma_grouped_slot(bits, mb, d).expect("mma table order");
                    debug_assert_eq!(instances.len(), slot);
                    instances.push(Self::instance(&kernels.mma[slot], bits, mb, MMA_GROUPED_TILE_N, info)?);
                }
            }
        }
        Ok(Self {
            instances,
            workspace: stream.alloc_zeros::<f32>(SPLITK_WORKSPACE_F32)?,
            counters: stream.alloc_zeros::<u32>(SPLITK_COUNTERS)?,
        })
    }

    /// One instance's launch configuration (see [`MmaState::new`]); `None`
    /// if no block of it fits an SM.
    fn instance(f: &CudaFunction, bits: u32, mb: u32, tn: u32, info: &DeviceInfo) -> Result<Option<Instance>> {
        let pick = |max_blocks| {
            splitk::slots_for(
                bits,
                mb,
                tn,
                info.max_smem_per_block,
                info.max_smem_per_sm,
                SMEM_RESERVED_PER_BLOCK,
                max_blocks,
            )
        };
        let resident = |slots: u32| -> Result<u32> {
            let smem = geo::smem_bytes(mb, tn / 32, bits, 1, slots);
            f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
            Ok(f.occupancy_max_active_blocks_per_multiprocessor(geo::THREADS, smem as usize, None)?)
        };
        for want in (1..=MAX_BLOCKS_PER_SM).rev() {
            let Some((slots, blocks)) = pick(want) else { continue };
            if blocks < want {
                continue;
            }
            let r = resident(slots)?;
            if r >= blocks {
                let lone_slots = pick(1).map_or(slots, |(lone, _)| lone.max(slots));
                // Any size up to the device's limit: a programmatic launch
                // may ask for more than it uses (Context::programmatic_now).
                f.set_attribute(
                    FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    info.max_smem_per_block as i32,
                )?;
                return Ok(Some(Instance { tile_slots: slots, blocks_per_sm: r.min(blocks), lone_slots }));
            }
        }
        Ok(None)
    }

    /// The tile configuration of kernel-table entry `slot` on this device
    /// (`None` if no block of it fits an SM).
    pub(crate) fn tile(&self, slot: usize, m_blocks: u32, tile_n: u32) -> Option<TileConfig> {
        let inst = self.instances.get(slot).copied().flatten()?;
        Some(TileConfig { m_blocks, tile_n, tile_slots: inst.tile_slots, blocks_per_sm: inst.blocks_per_sm })
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits { workspace_f32: self.workspace.len(), counters: self.counters.len() }
    }
}

/// The parameters every tensor-core GEMM entry takes first, in order
/// (`kernels-gpu/src/mma.rs`, `Args::load`): x, planes, scales, codebook,
/// y, workspace and counters, then M, N, K, K tiles, splits, K tiles per
/// split, items, stages, K tiles per stage and the paired-store flag. The
/// grouped entries take their own four after them.
pub(crate) struct MmaParams {
    pointers: [u64; 7],
    values: [u32; 10],
}

/// Most parameters of a tensor-core GEMM entry (the grouped ones).
const MMA_MAX_PARAMS: usize = 21;

impl MmaParams {
    /// The parameters of `plan` for activations at `x`, weight buffers
    /// `[planes, scales, codebook]` and output at `y`, with the context's
    /// split-K workspace and counters. Outputs are stored in pairs when N
    /// is even and `y` 4-byte aligned.
    pub(crate) fn new(ctx: &Context, plan: &Plan, x: u64, weight: [u64; 3], y: u64) -> Self {
        let (ws, ct) = (dptr(&ctx.mma.workspace, ctx), dptr(&ctx.mma.counters, ctx));
        let pairs = (plan.n % 2 == 0 && y % 4 == 0) as u32;
        let p = plan;
        Self {
            pointers: [x, weight[0], weight[1], weight[2], y, ws, ct],
            values: [p.m, p.n, p.k, p.k_tiles, p.splits, p.tiles_per_split, p.items, p.stages, p.stage_tiles, pairs],
        }
    }
}

impl Context {
    /// Launches kernel-table entry `slot` with `plan` on `units` block rows
    /// (`units` × `plan.grid` blocks), `params` followed by `extra`;
    /// programmatic when [`Context::programmatic_now`] allows it for all
    /// the launch's blocks.
    ///
    /// # Safety
    /// `extra` points at values of the entry's parameter types after the
    /// shared ones, and every pointer in `params` and `extra` covers what
    /// `plan` makes the kernel touch.
    pub(crate) unsafe fn launch_mma(
        &self,
        slot: usize,
        plan: &Plan,
        units: u32,
        params: &MmaParams,
        extra: &[*mut c_void],
    ) -> Result<()> {
        let shared = params.pointers.len() + params.values.len();
        let mut a = [std::ptr::null_mut::<c_void>(); MMA_MAX_PARAMS];
        let slots = a.iter_mut();
        let values = params.pointers.iter().map(|p| std::ptr::from_ref(p).cast::<c_void>());
        let values = values.chain(params.values.iter().map(|v| std::ptr::from_ref(v).cast::<c_void>()));
        for (slot, v) in slots.zip(values) {
            *slot = v.cast_mut();
        }
        a[shared..shared + extra.len()].copy_from_slice(extra);
        let f = &self.kernels.mma[slot];
        unsafe { self.launch_units(f, plan, units, geo::THREADS, &mut a[..shared + extra.len()]) }
    }

    /// Launches `f` with `plan`'s grid and shared memory over `units` block
    /// rows of `threads`-thread blocks (programmatic where
    /// [`Context::programmatic_now`] allows).
    ///
    /// # Safety
    /// `args` matches `f`'s parameters and the plan's sizes.
    unsafe fn launch_units(
        &self,
        f: &CudaFunction,
        plan: &Plan,
        units: u32,
        threads: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // Residency is judged on all the launch's blocks (every unit's).
        let mut cfg = LaunchConfig {
            grid_dim: (plan.grid * units, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: plan.smem_bytes,
        };
        let programmatic = self.programmatic_now(&mut cfg, plan.tile.blocks_per_sm);
        cfg.grid_dim = (plan.grid, units, 1);
        unsafe { launch::launch(self.stream(), f, cfg, programmatic, args) }
    }
}

/// What a K-slot plan is made for: `m` rows of `dtype` activations on a
/// `bits`-bit weight of `shape` on `sms` SMs, once per block row of a
/// grouped launch (`grouped`: its units) or alone (`None`).
#[derive(Clone, Copy)]
pub(crate) struct KslotsCall {
    pub dtype: Dtype,
    pub m: usize,
    pub shape: Shape,
    pub bits: u32,
    pub sms: u32,
    pub grouped: Option<u32>,
}

/// Whether `blocks` blocks are one per SM on at least 9/10 of the `sms`
/// SMs (the K-slot plans' rule for 32-column blocks).
fn one_per_sm(blocks: u64, sms: u32) -> bool {
    blocks <= sms as u64 && 10 * blocks >= 9 * sms as u64
}

/// Whether `resident` blocks per SM leave room for the next call's share
/// of a grid of `blocks` beside this call's: a programmatic launch then
/// starts its blocks (table build, first weight copies) while this one
/// runs.
fn room_for_next(resident: u32, blocks: u32, sms: u32) -> bool {
    resident >= 2 * blocks.div_ceil(sms.max(1))
}

/// Whether the planner takes K-slot plan `p` for a `bits`-bit weight on
/// `sms` SMs. Each block reads all of x (M·K·2 bytes against
/// `8·NF·K·(k + 1/4)/8` of weights), so its activation traffic grows with
/// M where the pipelined kernel shares a tile's activations over 64 or 128
/// columns. Measured on an H100 (k = 2..5, `bench-results/NOTES.md`):
/// - the whole grid must be resident at once (a second wave: Llama-3 gate/up
///   +15 to +50 %, Qwen3 `gate/up` at M = 12, 16, k = 4 +53 %), and the
///   matrix at most 2^25 weights (Llama-3-8B gate/up, 2^25.8, at k = 2:
///   +17 to +31 % even in one wave). A dense call at M = 5..8 follows the
///   measured table of [`crate::mid_m`] where it decides (one form faster
///   by more than its margin; H200: the one-wave rule below ran the variant
///   on long K where the pipelined kernel is up to 1.6 times faster,
///   Llama-3-70B's k / v projection among them), the rules below
///   elsewhere. Where the table does not decide, a dense grid at M ≤ 8 may
///   hold up to 5/4 of the resident blocks at k = 5, and at k = 4 on K =
///   2048..2560, where that was measured faster (H200, M = 2..8, against the pipelined
///   kernel; 280 or 320 blocks of 32 columns on 264 slots): k = 5 on K =
///   1024 / 1536 / 2048 / 2560 / 3072 −11 / −6 / −13 / −8 / +1 %, k = 4 on
///   K = 2048 / 2560 −8 / −6 %; not taken: k = 4 on K = 1024, 1536, 3072
///   (+0 to +17 %, +3 to +4.5 %), k = 2, 3 (448 blocks on 396 slots: up to
///   +28 % at M = 8), and 512 blocks on 264 or 396 slots (+2 to +28 %);
/// - M ≤ 8 (dense calls at M ≤ 4, grouped launches at M ≤ 8; the H100
///   runs of the variant, before the table): every Qwen3 dense shape. `q`,
///   `gate/up` and GLM shared −8 to
///   −21 %; `kv` (32 blocks) −20 to −26 %, where the pipelined kernel
///   splits K 8 ways; `o` −1 to −7 %; `down` −5 to −7 % at k = 3, 5,
///   between −1 and +4 % at k = 2, 4;
/// - M = 9..16, where a stage holds 16 activation rows (2 KiB against
///   256..656 bytes of planes): grids on at most half the SMs (`kv`: −17 to
///   −23 % at every k); at odd k, plans whose activations are at most 6×
///   the stage's planes with room on every SM for a second grid's share of
///   blocks (k = 3, 4-stage rings: `q` −17 %, `o` −6 to −8 %, `down` −5 %;
///   k = 5, 3-stage rings: `o` −5 %, `down` −3 %); and 32-column blocks,
///   one per SM on at least 9/10 of the SMs (`q` at M = 16, k = 2 / 3 / 4
///   / 5: −23 / −20 / −3 / −13 %). The other rows lose up to 17 % (k = 2:
///   the activations dominate the traffic; k = 4: `down` +16 % at M = 16
///   with the same rings as k = 5, unexplained, see the even-k rows of the
///   notes), and up to 25 % with 32-column blocks that leave half the SMs
///   idle (`o`, `down`).
///
/// A grouped launch (`units` block rows of `p.grid` blocks, one matrix
/// each) is judged by all its blocks.
fn kslots_first(p: &Plan, bits: u32, sms: u32, units: u32) -> bool {
    let weights = p.n as u64 * p.k as u64;
    let grid = p.grid.saturating_mul(units);
    let resident = sms * p.tile.blocks_per_sm;
    if weights > 1 << 25 {
        return false;
    }
    if units == 1
        && let Ok(shape) = Shape::new(p.n as usize, p.k as usize)
        && let Some(kslots) = mid_m::verdict(p.m as usize, shape, bits)
    {
        return kslots;
    }
    let past_wave = bits == 5 || (bits == 4 && (32..=40).contains(&p.k_tiles));
    if p.m <= 8 && units == 1 && past_wave && 4 * grid as u64 <= 5 * resident as u64 {
        return true;
    }
    if grid > resident {
        return false;
    }
    if p.m <= 8 {
        return true;
    }
    let nf = p.tile.tile_n / 8;
    let a_bytes = kslots::a_rows(p.m) * 128;
    let w_bytes = 16 * kslots::w_chunks(bits, nf);
    let room = room_for_next(p.tile.blocks_per_sm, grid, sms);
    2 * grid <= sms || (nf == 4 && one_per_sm(grid as u64, sms)) || (bits % 2 == 1 && a_bytes <= 6 * w_bytes && room)
}

/// Whether automatic plans take the direct-load variant for `m` rows of
/// `shape`: always at M ≤ 4 (against the GEMV, `crate::small_m` decides
/// first); at M = 5..8 (eight staged rows, the same per-step work as four)
/// where K ≥ 2048 and N ≥ 2048, or N ≥ 1024 with K ≤ 4096. Measured on
/// an H200 (`bench-results/NOTES.md`) against the K-slot and pipelined
/// plans over K = 1024..8192 × N = 512..28672 at M = 5 and 8: inside the
/// region it is up to 40 % faster on all but a few points (k = 3, 5 at
/// K = 2048, up to 7 % slower); outside it up to 60 % slower (K = 1024 or
/// N = 512: too few steps or groups to fill the GPU; N = 1024 at K = 8192:
/// 64 groups, each one block's worth of 128 KiB staged rows).
///
/// At M = 9..16 (sixteen staged rows, one block per SM by shared memory)
/// where there are at least two groups per SM of `sms` and K is 2048 to
/// 3072, or up to 4096 at k ≥ 4 (`bits`). Measured on an H200 against the
/// plans it replaces (K-slot or pipelined; A/B in one run,
/// `bench-results/nvidia-h200-2026-11-29-r16-ab.md`): 2048×6144 −19 to
/// −31 %, GLM shared −11 to −28 %, 2048×8448 −3 to −19 %, 3072×8192 −6 to
/// −21 %, Qwen3 `gateup` −0.3 to −14 %, at k = 4 Llama-3-8B −5 to −8 % and
/// 4096×11008 −15 to −19 % (k = 5: −6 to +1 %). Not taken where it lost or
/// was mixed: 256 groups or fewer (`q` +1 to +10 %, `o` and `down` −7 to
/// +12 %, `kv` +14 to +27 %, 4096×4096 −7 to +1 %), K = 1024 (+24 to
/// +59 %), K = 5120 (5120×13824 +2 to +13 %), K = 4096 at k = 2, 3
/// (4096×11008 +5 to +14 %, though Llama-3-8B gained 2 to 7 %).
fn direct_preferred(m: usize, shape: Shape, bits: u32, sms: u32) -> bool {
    let (n, k) = (shape.n, shape.k);
    let groups = direct::groups(n as u32) as u64;
    let sixteen_k = (2048..=3072).contains(&k) || (bits >= 4 && (2048..=4096).contains(&k));
    m <= 4
        || (m <= 8 && k >= 2048 && (n >= 2048 || (n >= 1024 && k <= 4096)))
        || (m <= 16 && sixteen_k && groups >= 2 * sms.max(1) as u64)
}

/// Whether automatic plans take the direct-load variant for a narrow
/// weight outside [`direct_preferred`]'s region: M = 5..8, N = 512..1023
/// (32 to 63 groups) and K of one step per warp (1921..2048, so the plan
/// can keep the activations in registers), at k ≤ 4. The caller takes it
/// only where the plan does keep them in registers (sm_90): with staged
/// rows such shapes lost to the K-slot plans on an H200 (the region of
/// [`direct_preferred`], measured before the register plans). Measured on an
/// H100 on `kv` (2048×512, 32 groups; A/B in one run against the K-slot
/// plan of 8-column blocks, medians of three, µs, M = 5 / 8): k = 2 2.54 /
/// 2.48 → 1.87 / 2.04, k = 3 2.52 / 2.46 → 1.94 / 2.11, k = 4 2.51 / 2.45
/// → 1.91 / 2.10 (−14 to −27 %; M = 4 runs 1.77–1.93). k = 5 (no register
/// instance, staged) lost 6 to 9 %.
fn direct_narrow(m: usize, shape: Shape, bits: u32) -> bool {
    let one_step = direct::steps(shape.k as u32) == direct::WARPS;
    (5..=8).contains(&m) && bits <= 4 && (512..1024).contains(&shape.n) && one_step
}

/// Whether a direct-load plan takes two teams of 16 warps per block (one
/// table and one copy of the staged activations per SM instead of one per
/// block): where one team per block would crowd an SM (`crowded`: two
/// blocks on some SM, or one only because of shared memory with more
/// groups than SMs), the staged rows of a block are at least 32 KiB, and
/// either eight rows are staged or k = 4, except k = 2 where one team's
/// shared memory already holds an SM to one block (`resident1`).
/// Measured on an H200 (A/B in one run,
/// `bench-results/nvidia-h200-2026-11-29-direct-teams-ab.md`):
/// Llama-3-70B M = 2..4 k = 4 49.2–49.7 → 45.0–45.4 µs, M = 5..8 k = 3 /
/// 4 −5 to −9 %; Llama-3-8B M = 5..8 −3 to −10 %, M = 2..4 k = 4 −0.5 to
/// −2 %; GLM shared (K = 2048) at M = 5..8 −9 to −12 %; Qwen3 `gateup` at
/// M = 5..8 −1 to −4 %. Not taken where it lost: one staged row (the SM
/// is held until both teams end, so the next call's blocks cannot start
/// on a half that one team would have freed: `gateup` and `q` at M = 1
/// +5 to +12 %), four rows at k = 2, 3 (−0.3 to +6 %), Llama-3-70B k = 2
/// at every M (+2 to +5 %), and four rows at K = 2048, where `gateup`
/// lost 2 to 6 % and GLM shared gained 5 to 9 %.
fn direct_teams(bits: u32, rows: u32, k: u32, crowded: bool, resident1: u32) -> bool {
    let staged_big = direct::x_bytes(rows, k) >= 32 << 10;
    let form = rows == 8 || bits == 4;
    crowded && staged_big && form && !(bits == 2 && resident1 == 1)
}

/// Whether a one-team direct-load plan decodes half of each warp's first
/// step before the grid-dependency wait (`rows` staged rows, `groups`
/// groups on `grid` blocks, K = `k`, `resident` blocks per SM): (a) at
/// four staged rows where every block has one group and its SM room for
/// the next call's block; (b) where every warp has one step per group
/// (K of 16 steps) and every block two groups or more. Either way the next
/// call's blocks wait resident while this call's end, and spend that
/// time on the decode. Measured on an H200 (A/B in one run,
/// `bench-results/nvidia-h200-2026-11-29-early-decode-ab.md` §3): (a)
/// `kv` M = 2, 4 −7 to −12 %, `o` −5 to −11 % at k = 3, 4, `down` −2 to
/// −4 %; (b) GLM shared −7 to −14 % at M = 1..4, 2048×8448 −1 to −6 %,
/// `q` at M = 2, 4 and k = 3, 4 −2 to −7 % (k = 2 +2 to +3 %). Not taken: one
/// staged row with one group per block (`o`, `down`, `kv` at M = 1: +1 to
/// +4 %), fewer than 16 steps (1024×16384 up to +3 %), eight staged rows
/// (no instance: 65 registers).
fn direct_early(rows: u32, groups: u32, grid: u32, k: u32, sms: u32, resident: u32) -> bool {
    let one_group_each = rows == 4 && grid == groups && grid <= sms && resident >= 2;
    let one_step_groups = direct::steps(k) == direct::WARPS && groups >= 2 * grid;
    one_group_each || one_step_groups
}

/// Whether a direct-load plan for `m` rows and `groups` groups, where an
/// instance with the activations in registers exists (sm_90, k ≤ 4,
/// K ≤ 2048, four or eight staged rows), takes it: at M = 2 (64 groups or
/// more), at M = 3 on 64 to 528 groups and at M = 5..8 on up to 528 groups. Each warp then loads its one
/// step's activations (64 bytes a lane) right after the grid-dependency
/// wait, and no block barrier follows: the staging round trip and barrier
/// leave the path of the first step. Measured on an H200 (A/B in one run,
/// `bench-results/nvidia-h200-2026-11-29-x-registers-ab.md` §4, §5): M = 2
/// `gateup`, `q`, 2048×8448, 1024×16384 −4 to −12 % (GLM shared 0 to
/// −5 %); M = 5 −10 to −23 %; M = 8 −2 to −15 %; M = 3 (§6) −4 to −8 % on
/// 144 to 528 groups (`gateup` k = 4 +0.7 %). Not taken where it lost or was
/// mixed: one row (no instance: `q` +3 %, `gateup` −1 to +1 %, GLM shared
/// +7 to +9 % against its early decode), M = 4 (`gateup` +4 %, `kv` +15 %, GLM
/// shared +5 to +8 %, `q` and 1024×16384 −2 to −4 %), `kv` at M = 3 (32
/// groups, +3 to +9 %), past 528 groups at M = 3 (GLM shared +1 to +5 %,
/// though 768 and 1024 groups at K = 1536, 1024 gained 4 to 10 %) and at
/// M = 5..8 (GLM shared, 640: −3 to −8 % at M = 5, 6 but −3 to +2 % at
/// M = 7, 8, against two teams).
fn direct_x_registers(m: usize, groups: u32) -> bool {
    (m == 2 && groups >= 64) || (m == 3 && (64..=528).contains(&groups)) || ((5..=8).contains(&m) && groups <= 528)
}

/// The grid of a direct-load plan: `groups` 16-column groups for `m` rows
/// on `sms` SMs that hold `resident` blocks each. One block per group
/// while they fit at once; past that, the persistent grid of all resident
/// blocks. At M ≥ 2, where one wave would fill every slot, the groups are
/// instead spread evenly over half the slots when that still puts a block
/// on at least 9/10 of the SMs: every SM then keeps room for the next
/// call's blocks (a programmatic launch's table build and first weight
/// loads run beside this call). At M ≥ 5 (eight staged rows) the groups
/// are spread even where that leaves SMs idle. Measured on an H200,
/// M = 2 / 4 / 8, k = 2: 256 groups (`q`, 4096×4096, 8192×4096)
/// −10 / −9 / −14 %, −10 / −12 / −21 %, −12 / −14 % (M = 8 there runs one
/// block per SM anyway); k = 3, 4 from +0.1 to −15 %; at M = 8, 144 and
/// 192 groups (72 and 96 blocks) −4 to −11 %. Not taken: at M = 1 (`q`
/// k = 2 +2 to +7 %, k = 4 +4 %), and at M = 2..4 where SMs would idle
/// (144 groups: k = 3, 4 +6 to +9 %; 192: +2 to +5 %). Nor does a grid of
/// two groups per block on half the slots pay past one wave (320 groups
/// on 160 blocks: +18 to +31 % at M = 1..8).
fn direct_grid(groups: u32, m: usize, sms: u32, resident: u32) -> u32 {
    let (sms, resident) = (sms.max(1), resident.max(1));
    let full = groups.min(sms * resident);
    let half = sms * (resident / 2);
    // The rule follows the instance: one, four or eight staged rows.
    let rows = direct::rows(m.min(direct::MAX_M as usize) as u32);
    if rows == 1 || half == 0 || groups <= half || groups > sms * resident {
        return full;
    }
    let spread = groups.div_ceil(groups.div_ceil(half));
    if rows == 8 || one_per_sm(spread as u64, half) { spread } else { full }
}

/// The grid of a direct-load plan with the activations in registers for
/// `m` rows and `groups` groups of a `bits`-bit weight: at M = 5..8 with
/// more groups than SMs and at most three per SM, the groups spread
/// evenly over at most one block per SM (each block two or three groups
/// in turn), at k = 4 always and at k = 2, 3 where that still puts a
/// block on 9/10 of the SMs; elsewhere [`direct_grid`]. Measured on an
/// H200 (A/B in one run,
/// `bench-results/nvidia-h200-2026-11-29-split-grid-ab.md` §3) against
/// the full wave of two blocks per SM that `direct_grid` gives there:
/// Qwen3 `gateup` (320 groups on 107 blocks) at k = 4, M = 5 / 6 / 7 / 8
/// −2.0 / −4.1 / −5.8 / −7.2 %; 2048×6144 (384 on 128) −6 to −12 % at
/// k = 4, −15 to −18 % at k = 2, −8 to −11 % at k = 3. Not taken where it
/// lost or was mixed: k = 2, 3 with a fifth of the SMs idle (`gateup`
/// k = 3 +8 to +11 %, k = 2 +4.5 to −1.5 %), and four groups per block
/// (448 and 528 groups: −1 to +4 % at k = 4, up to +13 % at k = 3).
fn direct_xreg_grid(bits: u32, groups: u32, m: usize, sms: u32, resident: u32) -> u32 {
    let sms = sms.max(1);
    let spread = groups.div_ceil(groups.div_ceil(sms));
    let covers = 10 * spread >= 9 * sms;
    if (5..=8).contains(&m) && groups > sms && groups <= 3 * sms && (bits == 4 || covers) {
        spread
    } else {
        direct_grid(groups, m, sms, resident)
    }
}

/// A plan whose blocks each own whole columns and all of K (the K-slot and
/// direct-load variants): `n_tiles` column blocks or groups of `tile`'s
/// width, one block each, no split-K, no workspace, one stage of one K
/// tile; the caller names the variant and adjusts grid and stages.
fn whole_k_plan(m: usize, shape: Shape, tile: TileConfig, n_tiles: u32, smem_bytes: u32) -> Plan {
    let k_tiles = shape.k.div_ceil(64) as u32;
    Plan {
        m: m as u32,
        n: shape.n as u32,
        k: shape.k as u32,
        tile,
        n_tiles,
        k_tiles,
        splits: 1,
        tiles_per_split: k_tiles,
        items: n_tiles,
        stream: false,
        k_slots: false,
        direct: false,
        teams: 1,
        early_decode: false,
        x_registers: false,
        grid: n_tiles,
        stages: 1,
        stage_tiles: 1,
        workspace_f32: 0,
        smem_bytes,
    }
}

impl Context {
    /// The plan of the K-slot variant: 32-column blocks where they give
    /// every SM two, or past 8 rows or in a grouped launch one to at least
    /// 9/10 of the SMs,
    /// 8-column blocks where they are at most one per SM, 16-column blocks
    /// otherwise; rings of 4 stages, or 3 where that leaves room on every
    /// SM for a second grid's share of blocks beside this one's, keeps the
    /// grid in one wave, or keeps two blocks per SM (`Plan::stages`). A
    /// grouped launch (`grouped`: its units) has that many matrices of
    /// `shape`, each with the plan's grid, and is judged by all its blocks.
    fn kslots_plan(&self, call: KslotsCall, opts: MmaOptions) -> Result<Plan> {
        let KslotsCall { dtype, m, shape, bits, sms, grouped } = call;
        if m > kslots::MAX_M as usize {
            return Err(Error::Rows { m, max: kslots::MAX_M as usize });
        }
        if opts.splits != Splits::Auto || opts.stage_tiles.is_some() {
            let reason = "the K-slot variant splits K over the warps of a block only".into();
            return Err(Error::SplitK { what: "k_slots", value: 1, reason });
        }
        let units = grouped.unwrap_or(1) as usize;
        // 32-column blocks where they give every SM two, or, past 8 rows
        // (16 activation rows a stage, which a 32-column block shares over
        // twice the columns) and in grouped launches, where one per SM
        // covers at least 9/10 of them. Measured on an H100 at M = 3..8:
        // `moe_gu` ×8 (128 blocks of 32 columns against 256 of 16) −3 /
        // −8 / −8 / −14 % at k = 2 / 3 / 4 / 5, where dense `q` with the
        // same blocks loses 1–6 % at k = 2..4. 8-column blocks where even
        // they are at most one per SM (`kv`: twice the blocks of 16 columns
        // on an otherwise idle GPU).
        let n32 = shape.n.div_ceil(32) * units;
        let nf = if n32 >= 2 * sms as usize || ((m > 8 || grouped.is_some()) && one_per_sm(n32 as u64, sms)) {
            4
        } else if shape.n.div_ceil(8) * units <= sms as usize {
            1
        } else {
            2
        };
        let idx = mma_kslots_slot(bits, nf, dtype, grouped.is_some()).expect("K-slot instance exists");
        let info = self.info();
        let cols = kslots::block_cols(nf);
        let n_tiles = shape.n.div_ceil(cols as usize) as u32;
        let all_blocks = n_tiles.saturating_mul(units as u32);
        let per_block = |depth| kslots::smem_bytes(bits, nf, m as u32, depth) as usize + SMEM_RESERVED_PER_BLOCK;
        let fits = |depth| per_block(depth) - SMEM_RESERVED_PER_BLOCK <= info.max_smem_per_block;
        let resident = |depth| self.kernels.mma_kslots[idx].1.min((info.max_smem_per_sm / per_block(depth)) as u32);
        // The deepest ring that leaves room beside the grid for the next
        // call's blocks, else the deepest that keeps the grid in one wave,
        // else the deepest that keeps two blocks per SM, else the deepest
        // that fits. With room, a programmatic launch's next call starts its
        // blocks (table build, first weight copies) while this one runs:
        // one block per SM of 32 columns at M = 16, k = 4 (`q`, `moe_gu` ×8)
        // ran 3 and 12 % faster with 3-stage rings (two blocks per SM) than
        // with 4 (one), measured on an H100.
        let depths = (kslots::MIN_DEPTH..=kslots::MAX_DEPTH).rev().filter(|&d| fits(d));
        let room = depths.clone().find(|&d| room_for_next(resident(d), all_blocks, sms));
        let one_wave = || depths.clone().find(|&d| all_blocks <= sms * resident(d));
        let Some(depth) =
            room.or_else(one_wave).or_else(|| depths.clone().find(|&d| resident(d) >= 2)).or(depths.clone().next())
        else {
            return Err(Error::SharedMemory {
                kernel: names::mma_kslots(bits, kslots::block_cols(nf), dtype, grouped.is_some()),
                available: info.max_smem_per_block,
            });
        };
        let smem = kslots::smem_bytes(bits, nf, m as u32, depth);
        let blocks_per_sm = resident(depth);
        let tile = TileConfig { m_blocks: 1, tile_n: cols, tile_slots: depth, blocks_per_sm };
        Ok(Plan { k_slots: true, stages: depth, ..whole_k_plan(m, shape, tile, n_tiles, smem) })
    }

    /// The plan of the direct-load variant for `m` rows (≤ 8) of `dtype`
    /// activations on a `bits`-bit weight of `shape` on `sms` SMs: a
    /// persistent grid of at most the blocks resident at once (registers
    /// and the shared memory of table, staged activations and reduction
    /// buffers) and at most one per 16-column group ([`direct_grid`]).
    fn direct_plan(&self, dtype: Dtype, m: usize, shape: Shape, bits: u32, sms: u32, opts: MmaOptions) -> Result<Plan> {
        if m > direct::MAX_M as usize {
            return Err(Error::Rows { m, max: direct::MAX_M as usize });
        }
        if opts.splits != Splits::Auto || opts.stage_tiles.is_some() || opts.k_slots == Some(true) {
            let reason = "the direct-load variant splits K over the warps of a block only".into();
            return Err(Error::SplitK { what: "direct", value: 1, reason });
        }
        let rows = direct::rows(m as u32);
        let k = shape.k as u32;
        let info = self.info();
        // Resident blocks of the instance with `teams` teams, if it exists
        // and its shared memory fits a block.
        let resident = |teams: u32| -> Option<(u32, u32)> {
            let idx = mma_direct_slot(bits, rows, dtype, teams)?;
            let smem = direct::smem_bytes(bits, rows, k, teams);
            let per_block = smem as usize + SMEM_RESERVED_PER_BLOCK;
            let r = self.kernels.mma_direct[idx].1.min((info.max_smem_per_sm / per_block) as u32);
            (smem as usize <= info.max_smem_per_block && r > 0).then_some((r, smem))
        };
        let Some((resident1, smem1)) = resident(1) else {
            return Err(Error::SharedMemory {
                kernel: names::mma_direct(bits, rows, dtype, 1),
                available: info.max_smem_per_block,
            });
        };
        let n_tiles = direct::groups(shape.n as u32);
        let grid1 = direct_grid(n_tiles, m, sms, resident1);
        let crowded = grid1 > sms || (resident1 == 1 && n_tiles > sms);
        let teams = match opts.teams {
            Some(true) => Some(resident(2).ok_or_else(|| Error::SplitK {
                what: "teams",
                value: 2,
                reason: "two teams per block run at k ≤ 4 and M ≤ 8, within the block's shared memory, only".into(),
            })?),
            Some(false) => None,
            None if direct_teams(bits, rows, k, crowded, resident1) => resident(2),
            None => None,
        };
        let (teams, resident, smem, grid) = match teams {
            Some((r, smem)) => (2, r, smem, n_tiles.div_ceil(2).min(sms * r)),
            None => (1, resident1, smem1, grid1),
        };
        let early_exists = mma_direct_early_slot(bits, rows, dtype).is_some();
        let early_decode = match opts.early_decode {
            Some(true) if teams == 1 && early_exists => true,
            Some(true) => {
                return Err(Error::SplitK {
                    what: "early_decode",
                    value: 1,
                    reason: "early decode runs with one team, k ≤ 4 and M ≤ 4 only".into(),
                });
            }
            Some(false) => false,
            None => teams == 1 && early_exists && direct_early(rows, n_tiles, grid, k, sms, resident),
        };
        // Activations in registers: one team, no early decode, its own
        // residency (same shared memory as one team).
        let xreg_resident = mma_direct_xreg_slot(bits, rows, dtype)
            .filter(|_| direct::steps(k) <= direct::WARPS)
            .and_then(|idx| self.kernels.mma_direct_xreg.get(idx))
            .map(|f| f.1.min((info.max_smem_per_sm / (smem1 as usize + SMEM_RESERVED_PER_BLOCK)) as u32))
            .filter(|&r| r > 0);
        let x_registers = match (opts.x_registers, xreg_resident) {
            (Some(true), Some(_)) if opts.teams != Some(true) && opts.early_decode != Some(true) => true,
            (Some(true), _) => {
                return Err(Error::SplitK {
                    what: "x_registers",
                    value: 1,
                    reason: "activations in registers run on sm_90 at k ≤ 4, M = 2..8 and K ≤ 2048, with one team and no early decode only".into(),
                });
            }
            (Some(false), _) | (None, None) => false,
            (None, Some(_)) => opts.teams.is_none() && opts.early_decode.is_none() && direct_x_registers(m, n_tiles),
        };
        let (teams, early_decode, resident, smem, grid) = match xreg_resident {
            Some(r) if x_registers => (1, false, r, smem1, direct_xreg_grid(bits, n_tiles, m, sms, r)),
            _ => (teams, early_decode, resident, smem, grid),
        };
        let tile = TileConfig { m_blocks: 1, tile_n: direct::GROUP_COLS, tile_slots: 1, blocks_per_sm: resident };
        Ok(Plan {
            direct: true,
            teams,
            early_decode,
            x_registers,
            grid,
            stage_tiles: 2,
            ..whole_k_plan(m, shape, tile, n_tiles, smem)
        })
    }

    /// The direct-load plan a call runs, if any: forced by `opts.direct`
    /// (errors if it cannot run), or under automatic splits and stages
    /// where [`direct_preferred`] says so and its shared memory fits.
    fn direct_choice(
        &self,
        dtype: Dtype,
        m: usize,
        shape: Shape,
        bits: u32,
        sms: u32,
        opts: MmaOptions,
    ) -> Result<Option<Plan>> {
        let plan = || self.direct_plan(dtype, m, shape, bits, sms, opts);
        let auto = opts.k_slots.is_none() && opts.splits == Splits::Auto && opts.stage_tiles.is_none();
        Ok(match opts.direct {
            Some(true) => Some(plan()?),
            None if auto && direct_preferred(m, shape, bits, sms) => plan().ok(),
            None if auto && direct_narrow(m, shape, bits) => plan().ok().filter(|p| p.x_registers),
            _ => None,
        })
    }

    /// The K-slot plan `call` runs, if any: forced by `opts.k_slots`
    /// (errors if it cannot run), or where [`kslots_first`] takes it under
    /// automatic splits and stages; `None` for the pipelined kernel.
    pub(crate) fn kslots_choice(&self, call: KslotsCall, opts: MmaOptions) -> Result<Option<Plan>> {
        let KslotsCall { bits, sms, grouped, .. } = call;
        let plan = || self.kslots_plan(call, opts);
        Ok(match opts.k_slots {
            Some(true) => Some(plan()?),
            None if opts.splits == Splits::Auto && opts.stage_tiles.is_none() && sms > 0 => {
                plan().ok().filter(|p| kslots_first(p, bits, sms, grouped.unwrap_or(1)))
            }
            _ => None,
        })
    }

    /// The checks the tensor-core GEMMs share: `x` holds `m·K` elements and
    /// starts on 16 bytes, `y` holds `m·N`. Returns the activation pointer
    /// and the weight's (planes, scales, codebook) pointers.
    pub(crate) fn gemm_operands<T>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y_len: usize,
    ) -> Result<(u64, [u64; 3])> {
        let shape = w.shape();
        check_len("activations", m * shape.k, x.len())?;
        check_len("output", m * shape.n, y_len)?;
        let xp = dptr(x, self);
        if xp % 16 != 0 {
            return Err(Error::Alignment { what: "activations", align: 16 });
        }
        Ok((xp, [dptr(&w.packed, self), dptr(&w.scales, self), dptr(&w.cb, self)]))
    }

    /// `y[m, N] = x[m, K] · Wᵀ` on the tensor cores (kernel 2), for
    /// `m` in 1..=64, f16 or bf16 `x` and `y` (row-major, contiguous), with
    /// split-K chosen for this GPU. Asynchronous; allocates nothing.
    ///
    /// ```no_run
    /// use half::f16;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(4096, 2048)?;
    /// let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.upload(&kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?)?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 8 * 2048])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(8 * 4096)?;
    /// ctx.mma_gemm(&x, 8, &weight, &mut y)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for f32 data, [`Error::Rows`] for `m` outside
    /// 1..=64, [`Error::Length`] for `x` or `y` lengths other than `m·K` and
    /// `m·N`, [`Error::Alignment`] if `x` is not 16-byte aligned,
    /// [`Error::SharedMemory`] if the instance does not fit the device.
    pub fn mma_gemm<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.mma_gemm_with(x, m, w, y, MmaOptions::default()).map(|_| ())
    }

    /// [`Context::mma_gemm`] with an explicit split-K policy and SM count;
    /// returns the plan it launched.
    ///
    /// ```no_run
    /// use kbit::{MmaOptions, Splits};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(4096, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let weight = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 8 * shape.k])?;
    /// # let mut y = ctx.stream().alloc_zeros::<f16>(8 * shape.n)?;
    /// let opts = MmaOptions { splits: Splits::Fixed(4), ..MmaOptions::default() };
    /// let plan = ctx.mma_gemm_with(&x, 8, &weight, &mut y, opts)?;
    /// assert!(plan.splits <= 4);
    /// println!("{} blocks, {} K splits of {} tiles", plan.grid, plan.splits, plan.tiles_per_split);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Context::mma_gemm`], plus [`Error::SplitK`] for `Fixed(0)`, an
    /// SM count of 0, a fixed split count the workspace cannot hold, or a
    /// `stage_tiles` outside 1..=4 or too large for the shared memory.
    pub fn mma_gemm_with<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
        opts: MmaOptions,
    ) -> Result<Plan> {
        let plan = self.mma_plan(T::DTYPE, m, w, opts)?;
        self.mma_launch(x, m, w, y, plan)
    }

    /// Launches `plan` (from [`Context::mma_plan`] for these `m`, `w` and
    /// T) on `x` and `y`; returns it.
    pub(crate) fn mma_launch<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
        plan: Plan,
    ) -> Result<Plan> {
        let (xp, weight) = self.gemm_operands(x, m, w, y.len())?;
        let (yp, _guard) = y.device_ptr_mut(self.stream());
        if plan.direct {
            let [pp, sp, cp] = weight;
            let (m, n, k) = (plan.m, plan.n, plan.k);
            let mut args = launch::args![xp, pp, sp, cp, yp, m, n, k];
            let rows = direct::rows(m);
            let idx = if plan.x_registers {
                mma_direct_xreg_slot(w.bits(), rows, T::DTYPE)
            } else if plan.early_decode {
                mma_direct_early_slot(w.bits(), rows, T::DTYPE)
            } else {
                mma_direct_slot(w.bits(), rows, T::DTYPE, plan.teams)
            };
            let idx = idx.expect("planned instance exists");
            let table = if plan.x_registers { &self.kernels.mma_direct_xreg } else { &self.kernels.mma_direct };
            let f = &table[idx].0;
            unsafe { self.launch_units(f, &plan, 1, plan.teams * direct::THREADS, &mut args) }?;
            return Ok(plan);
        }
        if plan.k_slots {
            let [pp, sp, cp] = weight;
            let (m, n, k, depth) = (plan.m, plan.n, plan.k, plan.stages);
            let mut args = launch::args![xp, pp, sp, cp, yp, m, n, k, depth];
            unsafe { self.launch_kslots(w.bits(), T::DTYPE, &plan, None, &mut args) }?;
            return Ok(plan);
        }
        let slot = mma_slot(w.bits(), plan.tile.m_blocks, plan.tile.tile_n, T::DTYPE, plan.stream)
            .expect("planned instance exists");
        let params = MmaParams::new(self, &plan, xp, weight, yp);
        unsafe { self.launch_mma(slot, &plan, 1, &params, &[]) }?;
        Ok(plan)
    }

    /// Launches K-slot plan `plan` for a `bits`-bit weight and `dtype`
    /// activations: the dense instance, or with `grouped` (its units) the
    /// grouped one over that many block rows, with kernel arguments `args`.
    ///
    /// # Safety
    /// `args` matches the instance's parameters and the plan's sizes.
    pub(crate) unsafe fn launch_kslots(
        &self,
        bits: u32,
        dtype: Dtype,
        plan: &Plan,
        grouped: Option<u32>,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let idx =
            mma_kslots_slot(bits, plan.tile.tile_n / 8, dtype, grouped.is_some()).expect("planned instance exists");
        let f = &self.kernels.mma_kslots[idx].0;
        unsafe { self.launch_units(f, plan, grouped.unwrap_or(1), kslots::THREADS, args) }
    }

    /// The plan [`Context::mma_gemm_with`] would launch for `m` rows of
    /// `dtype` activations and weight `w` (no GPU work).
    ///
    /// The tile width is the one with the lower estimated cost
    /// ([`splitk::cost`] × tile width) under automatic splitting; the split
    /// policy of `opts` is then applied to it.
    ///
    /// ```no_run
    /// use kbit::{Dtype, MmaOptions};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(4096, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let weight = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// for m in [1, 16, 64] {
    ///     let plan = ctx.mma_plan(Dtype::F16, m, &weight, MmaOptions::default())?;
    ///     println!("M = {m}: tiles of {} columns, {} K splits, {} blocks", plan.tile.tile_n, plan.splits, plan.grid);
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn mma_plan(&self, dtype: Dtype, m: usize, w: &KbitWeight, opts: MmaOptions) -> Result<Plan> {
        if dtype == Dtype::F32 {
            return Err(Error::Mismatch { what: "mma_gemm dtype", left: "f32".into(), right: "f16 or bf16".into() });
        }
        if m == 0 || m > geo::MAX_M as usize {
            return Err(Error::Rows { m, max: geo::MAX_M as usize });
        }
        if let Some(rows) = opts.tile_rows {
            let reason = "tile_rows chooses the warpgroup GEMM's blocks; this kernel's follow M".into();
            return Err(Error::SplitK { what: "tile_rows", value: rows as usize, reason });
        }
        let sms = opts.sm_count_override.unwrap_or(self.info().sm_count);
        let shape = w.shape();
        let bits = w.bits();
        if let Some(p) = self.direct_choice(dtype, m, shape, bits, sms, opts)? {
            return Ok(p);
        }
        if let Some(p) = self.kslots_choice(KslotsCall { dtype, m, shape, bits, sms, grouped: None }, opts)? {
            return Ok(p);
        }
        let mb = m.div_ceil(16) as u32;
        let limits = self.mma.limits();
        let mut best: Option<(f64, u32, TileConfig, u32)> = None;
        for tn in [128, 64] {
            // Stream-K instances exist for 128-column tiles only.
            if opts.splits == Splits::Stream && tn != 128 {
                continue;
            }
            let slot = mma_slot(bits, mb, tn, dtype, false).expect("mma instance exists");
            let Some(inst) = self.mma.instances[slot] else { continue };
            let tile =
                TileConfig { m_blocks: mb, tile_n: tn, tile_slots: inst.tile_slots, blocks_per_sm: inst.blocks_per_sm };
            let auto = splitk::plan(m, shape.n, shape.k, bits, sms, tile, Splits::Auto, limits)?;
            let c = splitk::cost(auto.n_tiles, auto.k_tiles, auto.splits, sms, tile, bits) * tn as f64;
            // On a tie at one m block, the plan with more blocks: more warps
            // hide more latency (Llama-3-8B gate/up at M = 16: 112 blocks of
            // 128 columns 34 µs, 224 of 64 columns 26 µs, at equal cost).
            // From two m blocks on, a 64-column tile reads as many activation
            // bytes as weight bytes and the wider tile stays ahead (same
            // shape at M = 32: 32 µs against 36 µs).
            let more_blocks = mb == 1 && auto.grid > best.map_or(0, |b| b.1);
            if best.is_none_or(|(bc, _, _, _)| c < bc || (c == bc && more_blocks)) {
                best = Some((c, auto.grid, tile, inst.lone_slots));
            }
            // At one m block and k ≥ 3, 128-column tiles that give every SM
            // a block without split-K win whatever the cost model says: the
            // activation tile is about 40 % of the kernel's shared-memory
            // traffic (its copies and `ldmatrix`), the wider tile halves it
            // per weight, and there is no split-K publication (Llama-3-70B
            // gate/up, M = 16, k = 4: 224 blocks of 128 columns ≈ 87 µs
            // against ≈ 91 µs for 4 splits of 64 columns, whose busiest SM
            // does 12 % less work). Not at k = 2, where the two came out even.
            if tn == 128 && mb == 1 && bits >= 3 && auto.splits == 1 && auto.grid >= sms {
                break;
            }
        }
        let Some((_, _, tile, lone_slots)) = best else {
            return Err(Error::SharedMemory {
                kernel: names::mma(bits, mb, 64, dtype),
                available: self.info().max_smem_per_block,
            });
        };
        // The stream-K instance of this tile, if there is one (its own
        // registers, so its own residency).
        let stream_of = |tn: u32| mma_slot(bits, mb, tn, dtype, true).and_then(|i| self.mma.tile(i, mb, tn));
        let stream_tile = stream_of(tile.tile_n);
        let mut plan = match (opts.splits, stream_tile) {
            (Splits::Stream, None) => {
                return Err(Error::SplitK {
                    what: "splits",
                    value: 0,
                    reason: format!("no stream-K instance for k = {bits}, {mb} m16 blocks, {} columns", tile.tile_n),
                });
            }
            (Splits::Stream, Some(st)) => splitk::plan(m, shape.n, shape.k, bits, sms, st, Splits::Stream, limits)?,
            _ => splitk::plan(m, shape.n, shape.k, bits, sms, tile, opts.splits, limits)?,
        };
        // Stream-K where a plan without split-K leaves the SMs unevenly
        // loaded (Llama-3-70B gate/up at M ≤ 16: 224 tiles of 128 columns
        // on 132 SMs give 92 SMs two tiles and 40 one) and an equal share
        // per block is estimated at least 8 % shorter.
        if opts.splits == Splits::Auto
            && plan.splits == 1
            && plan.n_tiles >= sms
            && let Some(st) = stream_tile
            && let Ok(sk) = splitk::plan(m, shape.n, shape.k, bits, sms, st, Splits::Stream, limits)
            && splitk::stream_cost(&sk) < 0.92 * splitk::cost(plan.n_tiles, plan.k_tiles, 1, sms, tile, bits)
        {
            plan = sk;
        }
        // Stream-K on the wide-stage instance (one m block, 128 columns)
        // wherever it has at least 3/4 of an SM's worth of n tiles and each
        // block at least 16 K tiles (4 wide stages), whichever tile the cost
        // model chose: its units do not see that a wide stage costs half the
        // overhead per tile. Llama-3-8B gate/up (112 tiles on 132 SMs, 27
        // iterations per block) at M = 4..16: −6 to −12 % at k = 2..5
        // against 224 tiles of 64 columns; GLM shared (80 tiles, 9.7 per
        // block) came out even (k = 4 −3 %, k = 3 +4 to +6 %), Qwen3 gate/up
        // (40 tiles, 4.8 per block) +50 %.
        if opts.splits == Splits::Auto
            && !plan.stream
            && geo::wide_stages(mb, 4)
            && 4 * shape.n.div_ceil(128) >= 3 * sms as usize
            && let Some(st) = stream_of(128)
            && let Ok(sk) = splitk::plan(m, shape.n, shape.k, bits, sms, st, Splits::Stream, limits)
            && sk.tiles_per_split >= 4 * geo::MAX_STAGE_TILES
        {
            plan = sk;
        }
        // A grid with at most one block per SM: each block may take its
        // SM's whole shared memory. Taken where that allows longer stages
        // (more K tiles between barriers), which the 48- and 64-row tiles
        // and the 64-column, 32-row tiles lack when the SM is shared
        // (Llama-3-8B gate/up at M = 64, k = 5: 112 blocks of 128 columns,
        // 1 → 2 K tiles per stage, 78.7 → 69.1 µs). A deeper pipeline of
        // the same stages measured no better: 8B at M = 32 (2 m blocks,
        // 3 → 10 stages of 2 tiles) 4-7 % slower.
        if plan.grid <= sms && lone_slots > plan.tile.tile_slots {
            let alone = plan.alone(lone_slots, bits);
            if alone.stage_tiles > plan.stage_tiles {
                plan = alone;
            }
        }
        match opts.stage_tiles {
            Some(kt) => plan.with_stage_tiles(kt, bits),
            None => Ok(plan),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups spread over half the slots only at M ≥ 2, only where a full
    /// wave would fill them, and below M = 5 only where the SMs stay busy.
    #[test]
    fn direct_grid_leaves_room_for_the_next_call() {
        // `q` (256 groups) on 132 SMs of two blocks: two groups per block.
        assert_eq!(direct_grid(256, 4, 132, 2), 128);
        assert_eq!(direct_grid(256, 8, 132, 2), 128);
        assert_eq!(direct_grid(257, 2, 132, 2), 129);
        assert_eq!(direct_grid(237, 2, 132, 2), 119);
        // M = 1, or an even spread that would leave SMs idle.
        assert_eq!(direct_grid(256, 1, 132, 2), 256);
        assert_eq!(direct_grid(192, 4, 132, 2), 192);
        assert_eq!(direct_grid(144, 2, 132, 2), 144);
        // From eight staged rows on, even where SMs idle.
        assert_eq!(direct_grid(144, 8, 132, 2), 72);
        assert_eq!(direct_grid(192, 5, 132, 2), 96);
        assert_eq!(direct_grid(236, 2, 132, 2), 236);
        // Room already (`o`, `kv`), more than a wave (Llama-3-70B), or one
        // block per SM (k = 5): unchanged.
        assert_eq!(direct_grid(128, 4, 132, 2), 128);
        assert_eq!(direct_grid(32, 4, 132, 2), 32);
        assert_eq!(direct_grid(1792, 4, 132, 2), 264);
        assert_eq!(direct_grid(320, 4, 132, 2), 264);
        assert_eq!(direct_grid(256, 4, 132, 1), 132);
        assert_eq!(direct_grid(0, 4, 0, 0), 0);
    }

    /// k = 4, M = 5..8, more groups than SMs and at most three per SM:
    /// one block per SM at most; otherwise `direct_grid`'s.
    #[test]
    fn direct_xreg_grid_spreads_where_measured_faster() {
        // Qwen3 gate/up (320 groups): three groups on each of 107 blocks.
        for m in 5..=8 {
            assert_eq!(direct_xreg_grid(4, 320, m, 132, 2), 107, "M = {m}");
            assert_eq!(direct_xreg_grid(4, 384, m, 132, 2), 128, "M = {m}");
        }
        // 2048×6144 (384 groups on 128 blocks, 97 % of the SMs) at every k.
        for bits in [2, 3] {
            assert_eq!(direct_xreg_grid(bits, 384, 6, 132, 2), 128, "k = {bits}");
        }
        // k = 2, 3 where 107 blocks leave a fifth of the SMs idle, fewer
        // rows, four groups per SM, or no more groups than SMs.
        assert_eq!(direct_xreg_grid(3, 320, 8, 132, 2), 264);
        assert_eq!(direct_xreg_grid(2, 320, 8, 132, 2), 264);
        assert_eq!(direct_xreg_grid(3, 448, 8, 132, 2), 264);
        assert_eq!(direct_xreg_grid(4, 320, 4, 132, 2), 264);
        assert_eq!(direct_xreg_grid(4, 320, 3, 132, 2), 264);
        assert_eq!(direct_xreg_grid(4, 528, 8, 132, 2), 264);
        assert_eq!(direct_xreg_grid(4, 256, 8, 132, 2), 128);
        assert_eq!(direct_xreg_grid(4, 32, 8, 132, 2), 32);
    }

    #[test]
    fn direct_x_registers_where_measured_faster() {
        // gateup 320, q 256, 2048×8448 528, 1024×16384 1024, GLM shared 640, kv 32 groups.
        for groups in [256, 320, 528, 1024, 640] {
            assert!(direct_x_registers(2, groups), "M = 2, {groups} groups");
        }
        for m in 5..=8 {
            assert!([256, 320, 528].iter().all(|&g| direct_x_registers(m, g)), "M = {m}");
            assert!(!direct_x_registers(m, 640), "GLM shared at M = {m}");
        }
        for groups in [144, 192, 256, 320, 528] {
            assert!(direct_x_registers(3, groups), "M = 3, {groups} groups");
        }
        assert!(!direct_x_registers(3, 640) && !direct_x_registers(3, 32), "GLM shared, kv at M = 3");
        for m in [1, 4] {
            assert!(!direct_x_registers(m, 320), "M = {m}");
        }
        assert!(!direct_x_registers(2, 32), "kv at M = 2");
    }

    #[test]
    fn direct_early_where_measured_faster() {
        // (a) Four staged rows, one group per block, two blocks per SM fit:
        // `o` / `kv` at M = 2..4 on 132 SMs; not at one row, not crowded.
        assert!(direct_early(4, 128, 128, 4096, 132, 2));
        assert!(direct_early(4, 32, 32, 2048, 132, 2));
        assert!(!direct_early(1, 128, 128, 4096, 132, 2));
        assert!(!direct_early(4, 128, 128, 4096, 132, 1));
        assert!(!direct_early(4, 320, 264, 2048, 132, 2));
        // (b) K = 2048 (16 steps) with two groups or more per block: GLM
        // shared, `q` at M = 2..4; not at 1024 (8 steps) or 4096 (32).
        assert!(direct_early(1, 640, 264, 2048, 132, 2));
        assert!(direct_early(4, 256, 128, 2048, 132, 2));
        assert!(direct_early(1, 640, 264, 1921, 132, 2));
        assert!(!direct_early(1, 1024, 264, 1024, 132, 2));
        assert!(!direct_early(1, 896, 264, 4096, 132, 2));
        assert!(!direct_early(1, 320, 264, 2048, 132, 2));
    }

    #[test]
    fn direct_teams_where_measured_faster() {
        // Llama-3-70B (K = 8192): k = 4 from four rows, k = 3 at eight,
        // k = 2 not (one team already runs one block per SM at eight).
        assert!(direct_teams(4, 4, 8192, true, 2));
        assert!(direct_teams(4, 8, 8192, true, 1));
        assert!(direct_teams(3, 8, 8192, true, 1));
        assert!(!direct_teams(3, 4, 8192, true, 2));
        assert!(!direct_teams(2, 4, 8192, true, 2));
        assert!(!direct_teams(2, 8, 8192, true, 1));
        // Llama-3-8B (K = 4096): every k at eight rows, k = 4 at four.
        assert!(direct_teams(2, 8, 4096, true, 2));
        assert!(direct_teams(4, 4, 4096, true, 2));
        assert!(!direct_teams(3, 4, 4096, true, 2));
        // K = 2048: eight rows only (32 KiB); never one row.
        assert!(direct_teams(2, 8, 2048, true, 2));
        assert!(!direct_teams(4, 4, 2048, true, 2));
        assert!(!direct_teams(4, 1, 8192, true, 2));
        // Not where one team per block leaves room on every SM.
        assert!(!direct_teams(4, 8, 8192, false, 2));
    }

    /// The narrow region beside `direct_preferred`'s: `kv`-like weights at M = 5..8, k ≤ 4,
    /// K of one step per warp.
    #[test]
    fn direct_narrow_takes_kv_at_m5_to_8() {
        let s = |n, k| Shape::new(n, k).unwrap();
        for m in 5..=8 {
            for bits in 2..=4 {
                assert!(direct_narrow(m, s(512, 2048), bits), "kv M {m} k={bits}");
                assert!(direct_narrow(m, s(1000, 2048), bits) && direct_narrow(m, s(512, 1952), bits));
            }
            assert!(!direct_narrow(m, s(512, 2048), 5), "no register instance at k = 5");
            // Wider (`direct_preferred`'s), narrower, or more than one step per warp.
            for (n, k) in [(1024, 2048), (256, 2048), (512, 4096), (512, 1024), (512, 1920)] {
                assert!(!direct_narrow(m, s(n, k), 4), "N {n} K {k}");
            }
        }
        for m in [1, 4, 9, 16] {
            assert!(!direct_narrow(m, s(512, 2048), 4), "M {m}");
        }
    }

    /// The direct-load variant's region at M = 5..16, on the design shapes
    /// (`Shape::new(N, K)`) and the edges of the rule, for 132 SMs.
    #[test]
    fn direct_preferred_covers_the_measured_region() {
        let s = |n, k| Shape::new(n, k).unwrap();
        for m in 1..=4 {
            assert!(direct_preferred(m, s(512, 1024), 4, 132), "M ≤ 4 always");
        }
        for m in 5..=8 {
            // gateup, down, q, o; Llama-3-8B and -70B.
            for (n, k) in [(5120, 2048), (2048, 5120), (4096, 2048), (2048, 4096), (14336, 4096), (28672, 8192)] {
                assert!(direct_preferred(m, s(n, k), 4, 132), "M {m} N {n} K {k}");
            }
            // kv (and moe_gu), moe_dn, K = 1024, N = 1024 on K = 8192.
            for (n, k) in [(512, 2048), (2048, 512), (8192, 1024), (1024, 8192)] {
                assert!(!direct_preferred(m, s(n, k), 4, 132), "M {m} N {n} K {k}");
            }
            assert!(direct_preferred(m, s(1024, 4096), 2, 132) && !direct_preferred(m, s(1024, 6144), 2, 132));
        }
        for m in 9..=16 {
            // gateup, GLM shared, 3072×8192 at every k; Llama-3-8B at k ≥ 4.
            for bits in 2..=5 {
                for (n, k) in [(5120, 2048), (10240, 2048), (8192, 3072)] {
                    assert!(direct_preferred(m, s(n, k), bits, 132), "M {m} N {n} K {k} k={bits}");
                }
                let llama8b = direct_preferred(m, s(14336, 4096), bits, 132);
                assert_eq!(llama8b, bits >= 4, "M {m} Llama-3-8B k={bits}");
            }
            // q (256 groups), o, down, kv; K = 1024 and 5120.
            for (n, k) in [(4096, 2048), (2048, 4096), (2048, 5120), (512, 2048), (16384, 1024), (13824, 5120)] {
                assert!(!direct_preferred(m, s(n, k), 4, 132), "M {m} N {n} K {k}");
            }
            // `q` on a GPU of 64 SMs has two groups per SM.
            assert!(direct_preferred(m, s(4096, 2048), 4, 64));
        }
        assert!(!direct_preferred(17, s(10240, 2048), 4, 132), "the variant stops at M = 16");
    }
}
