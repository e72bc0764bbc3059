//! Kernel 2 at large M on sm_90 (H100, H200): the warpgroup tensor-core
//! dequant GEMM `y[M, N] = x[M, K] · Wᵀ` of the sm_90a module
//! (`kernels-gpu/src/wgmma.rs`). Weights are dequantized in registers into
//! the A operand of `wgmma.m64n128k16`; blocks of 128 or 256 activation
//! rows × 128 output columns, with split-K where the tiles are too few for
//! the SMs
//! ([`crate::wgmma_plan`]: a split tile's blocks are one cluster and add
//! their partials in distributed shared memory). The activations reach
//! shared memory by tensor copies (TMA) through a tensor map of `x` that
//! each call encodes on the host and passes by value.

use crate::launch::{self, args};
use crate::linear::Kernel;
use crate::wgmma_plan::{self, Slots, WgmmaPlan};
use crate::{Context, Dtype, Element, Error, KbitWeight, MmaOptions, Result};
use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};
use cudarc::driver::{DevicePtr, DevicePtrMut, DriverError, LaunchConfig};
use kbit_format::wgmma as geo;

/// The tensor map of `x` (`m` rows of `k` 16-bit values at device address
/// `x`, 16-aligned, `k` a multiple of 32) that the kernel's tensor copies
/// read: boxes of 64 values × `rows` rows (the block's), the 128-byte swizzle
/// of [`geo::a_offset`], zeros outside the matrix. Encoding is host work
/// only (no device call, no allocation).
fn x_map(x: u64, m: usize, k: usize, rows: u32) -> std::result::Result<CUtensorMap, DriverError> {
    let mut map = CUtensorMap { opaque: [0; 16] };
    let dims = [k as u64, m as u64];
    let strides = [2 * k as u64];
    let boxes = [64u32, rows];
    let steps = [1u32, 1];
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            2,
            x as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
    }
    Ok(map)
}

/// The `kbit_wgmma_*` table slot of (bits, dtype, row halves), as
/// [`crate::module::names::all_wgmma`] orders them.
fn slot(bits: u32, dtype: Dtype, halves: u32) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    (halves - 1) as usize * 8 + (bits - 2) as usize * 2 + d
}

impl Context {
    /// Whether this device runs [`Context::wgmma_gemm`]: sm_90 (the
    /// warpgroup MMA instructions exist on no other architecture).
    ///
    /// ```no_run
    /// let ctx = kbit::Context::new(0)?;
    /// assert_eq!(ctx.has_wgmma(), ctx.info().compute_capability == (9, 0));
    /// if ctx.has_wgmma() {
    ///     println!("{}: the warpgroup GEMM serves large M", ctx.info().name);
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn has_wgmma(&self) -> bool {
        !self.kernels.wgmma.is_empty()
    }

    /// The warpgroup GEMM's resident blocks by cluster size on this device
    /// for `bits`-bit weights and `dtype` activations (what
    /// [`wgmma_plan::plan`] plans split tiles with), or `None` off sm_90 or
    /// for an instance that does not exist.
    ///
    /// ```no_run
    /// let ctx = kbit::Context::new(0)?;
    /// if let Some(slots) = ctx.wgmma_slots(4, kbit::Dtype::F16) {
    ///     println!("clusters of 4: {} blocks at once", slots.get(4));
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn wgmma_slots(&self, bits: u32, dtype: Dtype) -> Option<Slots> {
        if !self.has_wgmma() || !(2..=5).contains(&bits) || dtype == Dtype::F32 {
            return None;
        }
        Some(self.kernels.wgmma[slot(bits, dtype, 1)].2)
    }

    /// `y[m, N] = x[m, K] · Wᵀ` on sm_90's warpgroup tensor cores for any
    /// `m ≥ 1`, f16 or bf16 `x` and `y` (row-major, contiguous). The weight
    /// is dequantized once per 128 or 256 rows of `x`, in registers, with the
    /// numerics of [`Context::mma_gemm`] (`T(T(cb)·T(amax))` weights, f32
    /// accumulation), and K is split where the output tiles are too few
    /// for the SMs. Asynchronous; allocates nothing.
    ///
    /// ```no_run
    /// use half::f16;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(4096, 2048)?;
    /// let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.upload(&kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?)?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 512 * 2048])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(512 * 4096)?;
    /// if ctx.has_wgmma() {
    ///     ctx.wgmma_gemm(&x, 512, &weight, &mut y)?;
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NotApplicable`] on a device other than sm_90,
    /// [`Error::Mismatch`] for f32 data, [`Error::Rows`] for `m = 0` or
    /// `m ≥ 2^31`, [`Error::Length`] for `x` or `y`
    /// lengths other than `m·K` and `m·N`, [`Error::Alignment`] if `x` is
    /// not 16-byte aligned.
    pub fn wgmma_gemm<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.wgmma_gemm_with(x, m, w, y, MmaOptions::default()).map(|_| ())
    }

    /// [`Context::wgmma_gemm`] with an explicit split-K policy, SM count
    /// and block rows (`opts.splits`, `opts.sm_count_override`,
    /// `opts.tile_rows`; see [`wgmma_plan::plan`]); returns the plan it
    /// launched.
    ///
    /// ```no_run
    /// use kbit::{MmaOptions, Splits};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(4096, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let weight = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 512 * shape.k])?;
    /// # let mut y = ctx.stream().alloc_zeros::<f16>(512 * shape.n)?;
    /// let opts = MmaOptions { splits: Splits::Fixed(2), tile_rows: Some(128), ..MmaOptions::default() };
    /// if ctx.has_wgmma() {
    ///     let plan = ctx.wgmma_gemm_with(&x, 512, &weight, &mut y, opts)?;
    ///     assert_eq!(plan.halves, 1); // 128 activation rows per block
    ///     println!("{} blocks, {} of {} tiles split", plan.blocks, plan.split_tiles(), plan.tiles());
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Context::wgmma_gemm`], plus [`Error::SplitK`] for `Fixed(0)`,
    /// more than 8 fixed splits, stream-K, an SM count of 0, `tile_rows`
    /// other than 128 and 256, or `opts.stage_tiles` (this kernel's stages
    /// are fixed).
    pub fn wgmma_gemm_with<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
        opts: MmaOptions,
    ) -> Result<WgmmaPlan> {
        if !self.has_wgmma() {
            let why = "the warpgroup GEMM needs an sm_90 GPU";
            return Err(Error::NotApplicable { kernel: Kernel::Mma, why: why.into() });
        }
        if T::DTYPE == Dtype::F32 {
            return Err(Error::Mismatch { what: "wgmma_gemm dtype", left: "f32".into(), right: "f16 or bf16".into() });
        }
        if let Some(kt) = opts.stage_tiles {
            let reason = "the warpgroup GEMM's stages hold one K tile each".into();
            return Err(Error::SplitK { what: "stage_tiles", value: kt as usize, reason });
        }
        let shape = w.shape();
        let slots = self.kernels.wgmma[slot(w.bits(), T::DTYPE, 1)].2;
        let slots = opts.sm_count_override.map_or(slots, Slots::uniform);
        let plan = wgmma_plan::plan(m, shape.n, shape.k, &slots, opts.splits, opts.tile_rows)?;
        let (f, per_sm, _) = &self.kernels.wgmma[slot(w.bits(), T::DTYPE, plan.halves)];
        let (xp, [packed, scales, cb]) = self.gemm_operands(x, m, w, y.len())?;
        let (yp, _guard) = y.device_ptr_mut(self.stream());
        let smem = geo::smem_bytes(w.bits(), plan.halves);
        let mut cfg =
            LaunchConfig { grid_dim: (plan.blocks, 1, 1), block_dim: (geo::THREADS, 1, 1), shared_mem_bytes: smem };
        let programmatic = self.programmatic_now(&mut cfg, *per_sm);
        let map = x_map(xp, m, shape.k, geo::tile_m(plan.halves))?;
        let p = plan;
        let mut a = args![packed, scales, cb, yp, p.m, p.n, p.k, p.tiles_per_split, map, p.full, p.splits];
        unsafe { launch::launch_clustered(self.stream(), f, cfg, programmatic, p.splits, &mut a) }?;
        Ok(plan)
    }
}
