//! Quantize, repack and dequantize on the device.

use crate::context::{STATUS_NONFINITE, STATUS_SCALE};
use crate::device::dptr;
use crate::module::{CODEBOOK_SMEM, LayoutKind};
use crate::weight::check_len;
use crate::{Codebook, Context, DeviceFlatWeight, Dtype, Element, Error, KbitWeight, Result, ScaleMode, Shape};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

impl Context {
    /// Quantizes a row-major `W[N, K]` on the device to the flat layout,
    /// bit-identical to [`crate::reference::quantize`]. Asynchronous: a NaN
    /// or inf in `w` is reported as [`Error::NonFinite`] by the next
    /// [`Context::synchronize`] or download.
    ///
    /// ```no_run
    /// use cudarc::driver::DevicePtr;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(4096, 2048)?;
    /// let host: Vec<half::f16> = (0..shape.numel()).map(|i| half::f16::from_f32((i as f32).sin())).collect();
    /// let w = ctx.stream().clone_htod(&host)?;
    /// let flat = ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = ctx.repack(&flat, kbit::ScaleMode::Strict)?;
    /// ctx.synchronize()?; // reports NaN/inf or scale-range errors, if any
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn quantize<T: Element>(
        &self,
        w: &impl DevicePtr<T>,
        shape: Shape,
        codebook: &Codebook,
    ) -> Result<DeviceFlatWeight> {
        check_len("weights", shape.numel(), w.len())?;
        let s = self.stream();
        let bits = codebook.bits();
        let out = DeviceFlatWeight {
            shape,
            codebook: codebook.clone(),
            cb: s.clone_htod(codebook.values())?,
            packed: s.alloc_zeros::<u32>(shape.flat_words(bits))?,
            absmax: s.alloc_zeros::<f32>(shape.flat_absmax())?,
        };
        let blocks = shape.num_blocks() as u64;
        let cfg = self.grid_stride(blocks * 32, CODEBOOK_SMEM);
        let (wp, cbp, pp, ap) = (dptr(w, self), dptr(&out.cb, self), dptr(&out.packed, self), dptr(&out.absmax, self));
        let status = self.status_ptr(STATUS_NONFINITE);
        let f = self.kernels.quantize(bits, T::DTYPE);
        unsafe { s.launch_builder(f).arg(&wp).arg(&cbp).arg(&pp).arg(&ap).arg(&status).arg(&blocks).launch(cfg) }?;
        Ok(out)
    }

    /// Repacks a flat weight into the runtime layout on the device,
    /// bit-identical to [`crate::reference::repack`]. Asynchronous: an
    /// absmax out of E4M4 range is reported as [`Error::ScaleRange`] by the
    /// next [`Context::synchronize`] or download.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let w: Vec<f32> = (0..shape.numel()).map(|i| (i as f32).sin()).collect();
    /// # let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let on_gpu = ctx.upload_flat(&flat)?;
    /// let weight = ctx.repack(&on_gpu, kbit::ScaleMode::Strict)?;
    /// ctx.synchronize()?; // reports an absmax out of E4M4 range, if any
    /// assert_eq!(ctx.download(&weight)?, kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn repack(&self, flat: &DeviceFlatWeight, mode: ScaleMode) -> Result<KbitWeight> {
        let s = self.stream();
        let shape = flat.shape;
        let bits = flat.bits();
        let out = KbitWeight {
            shape,
            codebook: flat.codebook.clone(),
            cb: s.clone_dtod(&flat.cb)?,
            packed: s.alloc_zeros::<u32>(shape.tiled_words(bits))?,
            scales: s.alloc_zeros::<u8>(shape.tiled_scales())?,
        };
        let cfg = self.grid_stride(shape.num_blocks() as u64, 0);
        let (fp, fa, tp, ts) =
            (dptr(&flat.packed, self), dptr(&flat.absmax, self), dptr(&out.packed, self), dptr(&out.scales, self));
        let status = self.status_ptr(STATUS_SCALE);
        let (n, k, sat) = (shape.n as u32, shape.k as u32, (mode == ScaleMode::Saturate) as u32);
        let f = self.kernels.repack(bits);
        unsafe {
            s.launch_builder(f).arg(&fp).arg(&fa).arg(&tp).arg(&ts).arg(&status).arg(&n).arg(&k).arg(&sat).launch(cfg)
        }?;
        self.weights_written();
        Ok(out)
    }

    /// Dequantizes a flat weight into `out` (`N·K` elements, row-major,
    /// 16-byte aligned), bit-identical to [`crate::reference::dequantize_flat`].
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let w: Vec<f32> = (0..shape.numel()).map(|i| (i as f32).sin()).collect();
    /// # let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let on_gpu = ctx.upload_flat(&flat)?;
    /// let mut dense = ctx.stream().alloc_zeros::<f32>(shape.numel())?;
    /// ctx.dequantize_flat(&on_gpu, &mut dense)?;
    /// let back: Vec<f32> = ctx.stream().clone_dtoh(&dense)?;
    /// assert_eq!(back, kbit::reference::dequantize_flat::<f32>(&flat));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn dequantize_flat<T: Element>(&self, w: &DeviceFlatWeight, out: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.dequant_launch::<T, f32>(LayoutKind::Flat, w.shape, w.bits(), &w.packed, &w.absmax, &w.cb, out)
    }

    /// Dequantizes a runtime-layout weight into `out` (`N·K` elements,
    /// row-major, 16-byte aligned), bit-identical to
    /// [`crate::reference::dequantize_tiled`]. Allocates nothing.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let w: Vec<f32> = (0..64 * 64).map(|i| (i as f32).sin()).collect();
    /// # let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.upload(&kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?)?;
    /// let mut dense = ctx.stream().alloc_zeros::<half::f16>(shape.numel())?;
    /// ctx.dequantize(&weight, &mut dense)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn dequantize<T: Element>(&self, w: &KbitWeight, out: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.dequant_launch::<T, u8>(LayoutKind::Tiled, w.shape, w.bits(), &w.packed, &w.scales, &w.cb, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn dequant_launch<T: Element, S>(
        &self,
        layout: LayoutKind,
        shape: Shape,
        bits: u32,
        packed: &CudaSlice<u32>,
        scales: &CudaSlice<S>,
        cb: &CudaSlice<f32>,
        out: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        check_len("dequantize output", shape.numel(), out.len())?;
        let s = self.stream();
        let (op, _guard) = out.device_ptr_mut(s);
        if op % 16 != 0 {
            return Err(Error::Alignment { what: "dequantize output", align: 16 });
        }
        // One thread per octet (four per quant block).
        let kernel = self.kernels.dequant(layout, bits, T::DTYPE);
        let cfg = self.grid_resident(shape.num_blocks() as u64 * 4, kernel, 1);
        let (pp, sp, cp) = (dptr(packed, self), dptr(scales, self), dptr(cb, self));
        let (n, k) = (shape.n as u32, shape.k as u32);
        unsafe { s.launch_builder(&kernel.f).arg(&pp).arg(&sp).arg(&cp).arg(&op).arg(&n).arg(&k).launch(cfg) }?;
        Ok(())
    }

    /// Runs the tensor-core self-test kernel: `C[16, 8] = A[16, 16] · W[8, 16]ᵀ`
    /// through `cp.async`, `ldmatrix` and `mma.m16n8k16` on one warp, with
    /// f16 or bf16 inputs (as raw bits) and f32 output. Synchronizes. It
    /// checks the fragment layouts the GEMM kernels build on.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// let bits = |x: f32| half::f16::from_f32(x).to_bits();
    /// let a: [u16; 256] = std::array::from_fn(|i| bits(if i / 16 == i % 16 { 1.0 } else { 0.0 })); // A = I
    /// let w: [u16; 128] = std::array::from_fn(|i| bits(i as f32)); // W[j][k] = 16j + k
    /// let c = ctx.mma_selftest(kbit::Dtype::F16, &a, &w)?; // C[16, 8], row-major
    /// assert!((0..128).all(|i| c[i] == (i % 8 * 16 + i / 8) as f32)); // C[i][j] = W[j][i]
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn mma_selftest(&self, dtype: Dtype, a: &[u16; 256], w: &[u16; 128]) -> Result<Vec<f32>> {
        let f = match dtype {
            Dtype::F16 => &self.kernels.selftest_mma[0],
            Dtype::Bf16 => &self.kernels.selftest_mma[1],
            Dtype::F32 => {
                return Err(Error::Mismatch { what: "mma dtype", left: "f32".into(), right: "f16 or bf16".into() });
            }
        };
        let s = self.stream();
        let (da, dw) = (s.clone_htod(a)?, s.clone_htod(w)?);
        let mut dc = s.alloc_zeros::<f32>(128)?;
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 512 };
        unsafe { s.launch_builder(f).arg(&da).arg(&dw).arg(&mut dc).launch(cfg) }?;
        let c = s.clone_dtoh(&dc)?;
        self.synchronize()?;
        Ok(c)
    }
}
