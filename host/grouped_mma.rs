//! Kernel 5, the grouped tensor-core GEMM: kernel 2 over the experts of a
//! MoE layer in one launch, for `max_m` up to 64 rows per expert.
//!
//! The grid is `(per-expert grid, units)`: `units = min(experts, rows)`
//! block rows, each of which finds its expert on the device (the grouped
//! GEMV's units, see [`Context::grouped_gemv`]) and runs the tensor-core
//! GEMM on that expert's rows with one plan shared by all experts. The
//! plan is the dense planner's ([`crate::splitk::plan`]) for `max_m` rows
//! of one expert on the SMs that expert gets when the active experts share
//! the GPU: at least `ceil(rows / max_m)` experts have rows, so each gets
//! at most `SMs / that` of them. Every unit owns its share of the split-K
//! workspace and counters, so nothing is read back on the host and the
//! call can be captured in a CUDA graph.
//!
//! Where the dense planner would take the K-slot variant for all the
//! launch's blocks (`units` × the per-expert grid), the launch runs its
//! grouped form instead (`kbit_mma_kslots_grouped_*`: no split-K, the
//! whole GPU shared by the units' blocks in one wave; `Plan::k_slots`).

use crate::context::STATUS_EXPERT_ROWS;
use crate::device::dptr;
use crate::launch::args;
use crate::mma::{KslotsCall, MmaParams};
use crate::module::{MMA_GROUPED_TILE_N, mma_grouped_slot, names};
use crate::splitk::{self, Limits, Plan, Splits};
use crate::{Context, Dtype, Element, Error, KbitExperts, MmaOptions, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use kbit_format::mma as geo;

/// Most grouped units (block rows) one launch can have: the grid's y limit.
const MAX_UNITS: usize = 65_535;

/// A grouped launch: the per-expert plan and the number of units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedPlan {
    /// What every unit runs on its expert (`plan.m` = max_m).
    pub plan: Plan,
    /// Block rows of the grid: `min(experts, rows)`.
    pub units: u32,
    /// SMs each expert was planned for.
    pub sms_per_expert: u32,
}

impl Context {
    /// The MoE matmul on the tensor cores (kernel 5): for every expert `e`,
    /// `y[r] = x[r] · W_eᵀ` for its rows `r` in `expert_offsets[e] ..
    /// expert_offsets[e + 1]`, with `max_m` in 1..=64 (≥ every expert's row
    /// count; rows past it are not computed, and [`Context::synchronize`]
    /// reports the expert as [`Error::ExpertRows`]). Arguments as
    /// [`Context::expert_linear`]. Asynchronous, no host sync, allocates
    /// nothing.
    ///
    /// ```no_run
    /// use half::f16;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(512, 2048)?;
    /// // Eight experts quantized on the GPU (all zero here).
    /// let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// let one = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// let experts = ctx.concat_experts(&[&one; 8])?;
    /// // 40 rows: 16 for expert 1, 24 for expert 6.
    /// let offsets = ctx.stream().clone_htod(&[0u32, 0, 16, 16, 16, 16, 16, 40, 40])?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.1); 40 * shape.k])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(40 * shape.n)?;
    /// ctx.grouped_mma(&x, &offsets, 24, &experts, &mut y)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Context::expert_linear`], plus [`Error::Rows`] for `max_m`
    /// outside 1..=64, [`Error::Alignment`] if `x` is not 16-byte aligned
    /// and [`Error::TooLarge`] for more than 65535 units.
    pub fn grouped_mma<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        max_m: usize,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.grouped_mma_with(x, expert_offsets, max_m, experts, y, MmaOptions::default()).map(|_| ())
    }

    /// [`Context::grouped_mma`] with an explicit split-K policy (not
    /// stream-K), SM count and K tiles per stage for the per-expert plan;
    /// returns the launch it made (`None` when there are no rows).
    ///
    /// ```no_run
    /// use kbit::{MmaOptions, Splits};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(512, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let one = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let experts = ctx.concat_experts(&[&one; 8])?;
    /// # let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.1); 40 * shape.k])?;
    /// # let mut y = ctx.stream().alloc_zeros::<f16>(40 * shape.n)?;
    /// // 40 rows over 8 experts: 16 for expert 1, 24 for expert 6.
    /// let offsets = ctx.stream().clone_htod(&[0u32, 0, 16, 16, 16, 16, 16, 40, 40])?;
    /// let opts = MmaOptions { splits: Splits::Fixed(2), ..MmaOptions::default() };
    /// if let Some(gp) = ctx.grouped_mma_with(&x, &offsets, 24, &experts, &mut y, opts)? {
    ///     println!("{} units of {} blocks, {} K splits", gp.units, gp.plan.grid, gp.plan.splits);
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Context::grouped_mma`], plus [`Error::SplitK`] as
    /// [`Context::mma_gemm_with`] (stream-K included).
    pub fn grouped_mma_with<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        max_m: usize,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
        opts: MmaOptions,
    ) -> Result<Option<GroupedPlan>> {
        let total_rows = crate::experts::check_grouped(experts, expert_offsets.len(), max_m, x.len(), y.len())?;
        let gp = self.grouped_mma_plan(T::DTYPE, max_m, experts, total_rows, opts)?;
        self.grouped_mma_launch(x, expert_offsets, experts, y, total_rows, gp)
    }

    /// Launches `gp` (from [`Context::grouped_mma_plan`] for these
    /// arguments, `total_rows` from their check) unless there are no rows.
    pub(crate) fn grouped_mma_launch<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
        total_rows: usize,
        gp: GroupedPlan,
    ) -> Result<Option<GroupedPlan>> {
        if total_rows == 0 {
            return Ok(None);
        }
        let xp = dptr(x, self);
        if xp % 16 != 0 {
            return Err(Error::Alignment { what: "grouped_mma: activations x", align: 16 });
        }
        let (yp, _guard) = y.device_ptr_mut(self.stream());
        let weight = [dptr(&experts.packed, self), dptr(&experts.scales, self), dptr(&experts.cb, self)];
        let (op, ne, rows) = (dptr(expert_offsets, self), experts.num_experts() as u32, total_rows as u32);
        let status = self.status_ptr(STATUS_EXPERT_ROWS);
        let plan = &gp.plan;
        if plan.k_slots {
            let [pp, sp, cp] = weight;
            let (m, n, k, depth) = (plan.m, plan.n, plan.k, plan.stages);
            let mut a = args![xp, pp, sp, cp, yp, m, n, k, depth, op, ne, rows, status];
            unsafe { self.launch_kslots(experts.bits(), T::DTYPE, plan, Some(gp.units), &mut a) }?;
            return Ok(Some(gp));
        }
        let slot = mma_grouped_slot(experts.bits(), plan.tile.m_blocks, T::DTYPE).expect("planned instance exists");
        let params = MmaParams::new(self, plan, xp, weight, yp);
        unsafe { self.launch_mma(slot, plan, gp.units, &params, &args![op, ne, rows, status]) }?;
        Ok(Some(gp))
    }

    /// The launch [`Context::grouped_mma_with`] would make for `total_rows`
    /// rows of `dtype` activations over `experts` (no GPU work).
    ///
    /// ```no_run
    /// use kbit::{Dtype, MmaOptions};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(512, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let one = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let experts = ctx.concat_experts(&[&one; 8])?;
    /// // 40 rows over the 8 experts, at most 24 for any one.
    /// let gp = ctx.grouped_mma_plan(Dtype::F16, 24, &experts, 40, MmaOptions::default())?;
    /// assert_eq!(gp.units, 8); // min(experts, rows)
    /// println!("{} SMs per expert, {} K splits", gp.sms_per_expert, gp.plan.splits);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Context::grouped_mma_with`].
    pub fn grouped_mma_plan(
        &self,
        dtype: Dtype,
        max_m: usize,
        experts: &KbitExperts,
        total_rows: usize,
        opts: MmaOptions,
    ) -> Result<GroupedPlan> {
        if dtype == Dtype::F32 {
            return Err(Error::Mismatch {
                what: "grouped_mma: activation dtype",
                left: "f32".into(),
                right: "f16 or bf16".into(),
            });
        }
        if max_m == 0 || max_m > geo::MAX_M as usize {
            return Err(Error::Rows { m: max_m, max: geo::MAX_M as usize });
        }
        if opts.splits == Splits::Stream {
            return Err(Error::SplitK {
                what: "splits",
                value: 0,
                reason: "the grouped kernel has no stream-K instances".into(),
            });
        }
        let (shape, bits) = (experts.shape(), experts.bits());
        let units = experts.num_experts().min(total_rows).max(1);
        if units > MAX_UNITS {
            return Err(Error::TooLarge { n: shape.n, k: shape.k });
        }
        let sms = opts.sm_count_override.unwrap_or(self.info().sm_count);
        let active = total_rows.div_ceil(max_m).clamp(1, units);
        let sms_per_expert = (sms as usize / active).max(1) as u32;
        // The K-slot variant, where the dense planner's rule takes it for
        // all the launch's blocks (every unit's) on the whole GPU.
        let call = KslotsCall { dtype, m: max_m, shape, bits, sms, grouped: Some(units as u32) };
        if let Some(plan) = self.kslots_choice(call, opts)? {
            return Ok(GroupedPlan { plan, units: units as u32, sms_per_expert });
        }
        let mb = max_m.div_ceil(16) as u32;
        let slot = mma_grouped_slot(bits, mb, dtype).expect("grouped mma instance exists");
        let Some(tile) = self.mma.tile(slot, mb, MMA_GROUPED_TILE_N) else {
            return Err(Error::SharedMemory {
                kernel: names::mma_grouped(bits, mb, dtype),
                available: self.info().max_smem_per_block,
            });
        };
        let all = self.mma.limits();
        let limits = Limits { workspace_f32: all.workspace_f32 / units, counters: all.counters / units };
        let plan = splitk::plan(max_m, shape.n, shape.k, bits, sms_per_expert, tile, opts.splits, limits)?;
        let plan = match opts.stage_tiles {
            Some(kt) => plan.with_stage_tiles(kt, bits)?,
            None => plan,
        };
        Ok(GroupedPlan { plan, units: units as u32, sms_per_expert })
    }
}
