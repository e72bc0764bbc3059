//! Kernel 2 at large M on sm_90 (H100, H200): the warpgroup tensor-core
//! dequant GEMM `y[M, N] = x[M, K] · Wᵀ` of the sm_90a module
//! (`kernels-gpu/src/wgmma.rs`). Weights are dequantized in registers into
//! the A operand of `wgmma.m64n128k16`; blocks of 128 activation rows × 128
//! output columns, one per (row tile, column tile), no split-K. The
//! activations reach shared memory by tensor copies (TMA) through a tensor
//! map of `x` that each call encodes on the host and passes by value.

use crate::launch::{self, args};
use crate::linear::Kernel;
use crate::{Context, Dtype, Element, Error, KbitWeight, Result};
use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};
use cudarc::driver::{DevicePtr, DevicePtrMut, DriverError, LaunchConfig};
use kbit_format::wgmma as geo;

/// The tensor map of `x` (`m` rows of `k` 16-bit values at device address
/// `x`, 16-aligned, `k` a multiple of 32) that the kernel's tensor copies
/// read: boxes of 64 values × [`geo::TILE_M`] rows, the 128-byte swizzle
/// of [`geo::a_offset`], zeros outside the matrix. Encoding is host work
/// only (no device call, no allocation).
fn x_map(x: u64, m: usize, k: usize) -> std::result::Result<CUtensorMap, DriverError> {
    let mut map = CUtensorMap { opaque: [0; 16] };
    let dims = [k as u64, m as u64];
    let strides = [2 * k as u64];
    let boxes = [64u32, geo::TILE_M];
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

/// The `kbit_wgmma_*` table slot of (bits, dtype), as
/// [`crate::module::names::all_wgmma`] orders them.
fn slot(bits: u32, dtype: Dtype) -> usize {
    let d = (dtype == Dtype::Bf16) as usize;
    (bits - 2) as usize * 2 + d
}

impl Context {
    /// Whether this device runs [`Context::wgmma_gemm`]: sm_90 (the
    /// warpgroup MMA instructions exist on no other architecture).
    pub fn has_wgmma(&self) -> bool {
        !self.kernels.wgmma.is_empty()
    }

    /// `y[m, N] = x[m, K] · Wᵀ` on sm_90's warpgroup tensor cores for any
    /// `m ≥ 1`, f16 or bf16 `x` and `y` (row-major, contiguous). The weight
    /// is dequantized once per 128 rows of `x`, in registers, with the
    /// numerics of [`Context::mma_gemm`] (`T(T(cb)·T(amax))` weights, f32
    /// accumulation). Asynchronous; allocates nothing.
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
        if !self.has_wgmma() {
            let why = "the warpgroup GEMM needs an sm_90 GPU";
            return Err(Error::NotApplicable { kernel: Kernel::Mma, why: why.into() });
        }
        if T::DTYPE == Dtype::F32 {
            return Err(Error::Mismatch { what: "wgmma_gemm dtype", left: "f32".into(), right: "f16 or bf16".into() });
        }
        // The tensor copies address rows with 32-bit signed coordinates.
        let max = i32::MAX as usize;
        if m == 0 || m > max {
            return Err(Error::Rows { m, max });
        }
        let shape = w.shape();
        let (xp, [packed, scales, cb]) = self.gemm_operands(x, m, w, y.len())?;
        let (yp, _guard) = y.device_ptr_mut(self.stream());
        let (mu, n, k) = (m as u32, shape.n as u32, shape.k as u32);
        let grid = (mu.div_ceil(geo::TILE_M), n.div_ceil(geo::TILE_N), 1);
        let (f, per_sm) = &self.kernels.wgmma[slot(w.bits(), T::DTYPE)];
        // Residency is judged on all the launch's blocks.
        let blocks = (grid.0 as u64 * grid.1 as u64).min(u32::MAX as u64) as u32;
        let smem = geo::smem_bytes(w.bits());
        let mut cfg =
            LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (geo::THREADS, 1, 1), shared_mem_bytes: smem };
        let programmatic = self.programmatic_now(&mut cfg, *per_sm);
        cfg.grid_dim = grid;
        let map = x_map(xp, m, shape.k)?;
        let mut a = args![packed, scales, cb, yp, mu, n, k, map];
        unsafe { launch::launch(self.stream(), f, cfg, programmatic, &mut a) }
    }
}
