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
            pub fn shape(&self) -> Shape {
                self.shape
            }
            /// The codebook (and so the bit width).
            pub fn codebook(&self) -> &Codebook {
                &self.codebook
            }
            /// The bit width k.
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
    pub fn download(&self, w: &KbitWeight) -> Result<TiledWeight> {
        let s = self.stream();
        let packed = s.clone_dtoh(&w.packed)?;
        let scales = s.clone_dtoh(&w.scales)?;
        self.synchronize()?;
        TiledWeight::from_parts(w.shape, w.codebook.clone(), packed, scales)
    }
}
