//! Quantized weights on the device, and moving them to and from the host.

use crate::weight::check_len;
use crate::{Codebook, Context, FlatWeight, Result, Shape, TiledWeight};
use cudarc::driver::{CudaSlice, DevicePtr};

/// A flat-layout weight on the device (what [`Context::quantize`] produces
/// and [`Context::repack`] consumes). Padding words/entry included.
pub struct DeviceFlatWeight {
    pub(crate) shape: Shape,
    pub(crate) codebook: Codebook,
    pub(crate) cb: CudaSlice<f32>,
    pub(crate) packed: CudaSlice<u32>,
    pub(crate) absmax: CudaSlice<f32>,
}

/// A weight in the runtime layout on the device: what every kbit kernel
/// reads. Carries its codebook.
pub struct KbitWeight {
    pub(crate) shape: Shape,
    pub(crate) codebook: Codebook,
    pub(crate) cb: CudaSlice<f32>,
    pub(crate) packed: CudaSlice<u32>,
    pub(crate) scales: CudaSlice<u8>,
}

macro_rules! weight_accessors {
    ($t:ty) => {
        impl $t {
            /// The shape.
            ///
            /// ```no_run
            /// # let ctx = kbit::Context::new(0)?;
            /// # let shape = kbit::Shape::new(64, 64)?;
            /// # let flat = kbit::reference::quantize(&vec![0.5f32; shape.numel()], shape, &kbit::Codebook::nf(4)?)?;
            /// let on_gpu = ctx.upload_flat(&flat)?;
            /// let weight = ctx.repack(&on_gpu, kbit::ScaleMode::Strict)?;
            /// assert_eq!(on_gpu.shape(), flat.shape());
            /// assert_eq!(weight.shape(), kbit::Shape::new(64, 64)?);
            /// # Ok::<(), kbit::Error>(())
            /// ```
            pub fn shape(&self) -> Shape {
                self.shape
            }
            /// The codebook (and so the bit width).
            ///
            /// ```no_run
            /// # let ctx = kbit::Context::new(0)?;
            /// # let shape = kbit::Shape::new(64, 64)?;
            /// # let flat = kbit::reference::quantize(&vec![0.5f32; shape.numel()], shape, &kbit::Codebook::nf(4)?)?;
            /// let on_gpu = ctx.upload_flat(&flat)?;
            /// let weight = ctx.repack(&on_gpu, kbit::ScaleMode::Strict)?;
            /// assert_eq!(on_gpu.codebook(), flat.codebook());
            /// assert_eq!(weight.codebook(), &kbit::Codebook::nf(4)?);
            /// # Ok::<(), kbit::Error>(())
            /// ```
            pub fn codebook(&self) -> &Codebook {
                &self.codebook
            }
            /// The bit width k.
            ///
            /// ```no_run
            /// # let ctx = kbit::Context::new(0)?;
            /// # let shape = kbit::Shape::new(64, 64)?;
            /// # let flat = kbit::reference::quantize(&vec![0.5f32; shape.numel()], shape, &kbit::Codebook::nf(4)?)?;
            /// let on_gpu = ctx.upload_flat(&flat)?;
            /// let weight = ctx.repack(&on_gpu, kbit::ScaleMode::Strict)?;
            /// assert_eq!((on_gpu.bits(), weight.bits()), (4, 4));
            /// # Ok::<(), kbit::Error>(())
            /// ```
            pub fn bits(&self) -> u32 {
                self.codebook.bits()
            }
        }
    };
}
weight_accessors!(DeviceFlatWeight);
weight_accessors!(KbitWeight);

impl KbitWeight {
    /// Bytes of the weight stream (plane words + scale bytes).
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let flat = kbit::reference::quantize(&vec![0.5f32; shape.numel()], shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.upload(&kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?)?;
    /// // 4 bits a value and one scale byte a block of 32: (4 + 0.25) / 16 of fp16.
    /// assert_eq!(weight.bytes(), shape.numel() / 2 + shape.num_blocks());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn bytes(&self) -> usize {
        self.shape.tiled_bytes(self.bits())
    }
}

pub(crate) fn dptr<T>(s: &impl DevicePtr<T>, ctx: &Context) -> u64 {
    // With event tracking off (our own Context) the guard is a no-op; for a
    // caller's stream with tracking on, the stream is the one we launch on.
    s.device_ptr(ctx.stream()).0
}

impl Context {
    /// Copies a flat weight to the device (asynchronously).
    ///
    /// ```no_run
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(64, 64)?;
    /// let w: Vec<f32> = (0..64 * 64).map(|i| (i as f32).sin()).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let on_gpu = ctx.upload_flat(&flat)?;
    /// assert_eq!(ctx.download_flat(&on_gpu)?, flat);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn upload_flat(&self, w: &FlatWeight) -> Result<DeviceFlatWeight> {
        let s = self.stream();
        Ok(DeviceFlatWeight {
            shape: w.shape(),
            codebook: w.codebook().clone(),
            cb: s.clone_htod(w.codebook().values())?,
            packed: s.clone_htod(w.packed())?,
            absmax: s.clone_htod(w.absmax())?,
        })
    }

    /// Copies a runtime-layout weight to the device (asynchronously).
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let flat = kbit::reference::quantize(&vec![0.5f32; shape.numel()], shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
    /// let weight = ctx.upload(&tiled)?;
    /// assert_eq!(ctx.download(&weight)?, tiled);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn upload(&self, w: &TiledWeight) -> Result<KbitWeight> {
        let s = self.stream();
        self.weights_written();
        Ok(KbitWeight {
            shape: w.shape(),
            codebook: w.codebook().clone(),
            cb: s.clone_htod(w.codebook().values())?,
            packed: s.clone_htod(w.packed())?,
            scales: s.clone_htod(w.scales())?,
        })
    }

    /// Copies a flat weight back to the host. Synchronizes the stream and
    /// reports data errors like [`Context::synchronize`].
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// let w: Vec<f32> = (0..shape.numel()).map(|i| (i as f32).sin()).collect();
    /// let cb = kbit::Codebook::nf(4)?;
    /// let flat = ctx.quantize(&ctx.stream().clone_htod(&w)?, shape, &cb)?;
    /// // Waits for the quantize, then reports NaN/inf found in `w`, if any.
    /// assert_eq!(ctx.download_flat(&flat)?, kbit::reference::quantize(&w, shape, &cb)?);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn download_flat(&self, w: &DeviceFlatWeight) -> Result<FlatWeight> {
        let s = self.stream();
        let packed = s.clone_dtoh(&w.packed)?;
        let absmax = s.clone_dtoh(&w.absmax)?;
        self.synchronize()?;
        check_len("packed words", w.shape.flat_words(w.bits()), packed.len())?;
        FlatWeight::from_parts(w.shape, w.codebook.clone(), packed, absmax)
    }

    /// Copies a runtime-layout weight back to the host. Synchronizes the
    /// stream and reports data errors like [`Context::synchronize`].
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// # let w: Vec<f32> = (0..shape.numel()).map(|i| (i as f32).sin()).collect();
    /// # let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let weight = ctx.repack(&ctx.upload_flat(&flat)?, kbit::ScaleMode::Strict)?;
    /// let tiled = ctx.download(&weight)?; // waits, then reports scale-range errors
    /// assert_eq!(tiled, kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn download(&self, w: &KbitWeight) -> Result<TiledWeight> {
        let s = self.stream();
        let packed = s.clone_dtoh(&w.packed)?;
        let scales = s.clone_dtoh(&w.scales)?;
        self.synchronize()?;
        TiledWeight::from_parts(w.shape, w.codebook.clone(), packed, scales)
    }
}
