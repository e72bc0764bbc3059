//! MoE experts in the runtime layout, concatenated on the device.

use crate::weight::check_len;
use crate::{Codebook, Context, Error, Result, Shape, TiledWeight};
use cudarc::driver::CudaSlice;

/// The weights of `num_experts` MoE experts on the device: equal shapes
/// `[N, K]`, one codebook, each expert in the runtime layout, concatenated in
/// expert order (expert `e`'s plane words start at `e · shape.tiled_words(k)`,
/// its scale bytes at `e · shape.tiled_scales()`). What the grouped kernels
/// ([`Context::grouped_gemv`]) read.
pub struct KbitExperts {
    pub(crate) num_experts: usize,
    pub(crate) shape: Shape,
    pub(crate) codebook: Codebook,
    pub(crate) cb: CudaSlice<f32>,
    pub(crate) packed: CudaSlice<u32>,
    pub(crate) scales: CudaSlice<u8>,
}

/// Checks the arguments every grouped (MoE) matmul shares and returns the
/// total rows of `x`: `expert_offsets` holds `num_experts + 1` entries, `x`
/// is whole rows of K, `y` the same rows of N, and the rows fit
/// `max_m × num_experts`.
pub(crate) fn check_grouped(
    experts: &KbitExperts,
    offsets_len: usize,
    max_m: usize,
    x_len: usize,
    y_len: usize,
) -> Result<usize> {
    let (shape, e) = (experts.shape(), experts.num_experts());
    check_len("expert_offsets (experts + 1)", e + 1, offsets_len)?;
    if !x_len.is_multiple_of(shape.k) {
        return Err(Error::Mismatch {
            what: "grouped activations: length must be a multiple of K",
            left: x_len.to_string(),
            right: format!("K = {}", shape.k),
        });
    }
    let rows = x_len / shape.k;
    check_len("grouped outputs y (rows·N)", rows * shape.n, y_len)?;
    if rows > max_m.saturating_mul(e) {
        return Err(Error::Mismatch {
            what: "grouped activations: rows exceed max_m × experts",
            left: format!("{rows} rows"),
            right: format!("max_m {max_m} × {e} experts"),
        });
    }
    Ok(rows)
}

impl KbitExperts {
    /// Number of experts.
    ///
    /// ```no_run
    /// # use kbit::{Codebook, ScaleMode, Shape, reference};
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = Shape::new(64, 128)?;
    /// # let flat = reference::quantize(&vec![0.5f32; shape.numel()], shape, &Codebook::nf(4)?)?;
    /// # let w = reference::repack(&flat, ScaleMode::Strict)?;
    /// let experts = ctx.upload_experts(&vec![w; 8])?;
    /// assert_eq!(experts.num_experts(), 8);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }
    /// The shape of one expert.
    ///
    /// ```no_run
    /// # use kbit::{Codebook, ScaleMode, Shape, reference};
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = Shape::new(64, 128)?;
    /// # let flat = reference::quantize(&vec![0.5f32; shape.numel()], shape, &Codebook::nf(4)?)?;
    /// # let w = reference::repack(&flat, ScaleMode::Strict)?;
    /// let experts = ctx.upload_experts(&vec![w; 8])?;
    /// assert_eq!(experts.shape(), Shape::new(64, 128)?); // [N, K] of each expert
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// The shared codebook (and so the bit width).
    ///
    /// ```no_run
    /// # use kbit::{Codebook, ScaleMode, Shape, reference};
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = Shape::new(64, 128)?;
    /// # let flat = reference::quantize(&vec![0.5f32; shape.numel()], shape, &Codebook::nf(4)?)?;
    /// # let w = reference::repack(&flat, ScaleMode::Strict)?;
    /// let experts = ctx.upload_experts(&vec![w.clone(); 8])?;
    /// assert_eq!(experts.codebook(), w.codebook());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// The bit width k.
    ///
    /// ```no_run
    /// # use kbit::{Codebook, ScaleMode, Shape, reference};
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = Shape::new(64, 128)?;
    /// # let flat = reference::quantize(&vec![0.5f32; shape.numel()], shape, &Codebook::nf(4)?)?;
    /// # let w = reference::repack(&flat, ScaleMode::Strict)?;
    /// let experts = ctx.upload_experts(&vec![w; 8])?;
    /// assert_eq!(experts.bits(), 4);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn bits(&self) -> u32 {
        self.codebook.bits()
    }
    /// Bytes of one expert's weight stream (plane words + scale bytes).
    ///
    /// ```no_run
    /// # use kbit::{Codebook, ScaleMode, Shape, reference};
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = Shape::new(64, 128)?;
    /// # let flat = reference::quantize(&vec![0.5f32; shape.numel()], shape, &Codebook::nf(4)?)?;
    /// # let w = reference::repack(&flat, ScaleMode::Strict)?;
    /// let experts = ctx.upload_experts(&vec![w; 8])?;
    /// // 4 bits a value and one scale byte a block of 32, per expert.
    /// assert_eq!(experts.expert_bytes(), shape.numel() / 2 + shape.num_blocks());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn expert_bytes(&self) -> usize {
        self.shape.tiled_bytes(self.bits())
    }
}

impl Context {
    /// Copies MoE experts to the device (asynchronously), concatenated in
    /// the order given. All experts must have the same shape and codebook.
    ///
    /// ```no_run
    /// use kbit::{Codebook, ScaleMode, Shape, reference};
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = Shape::new(512, 2048)?;
    /// let cb = Codebook::nf(4)?;
    /// let experts = (0..8)
    ///     .map(|e| {
    ///         let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 31 + e * 7) % 97) as f32 / 97.0 - 0.5).collect();
    ///         reference::repack(&reference::quantize(&w, shape, &cb)?, ScaleMode::Strict)
    ///     })
    ///     .collect::<kbit::Result<Vec<_>>>()?;
    /// let on_gpu = ctx.upload_experts(&experts)?;
    /// assert_eq!(on_gpu.num_experts(), 8);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for an empty list or experts whose shapes or
    /// codebooks differ (naming the first expert that differs from expert 0).
    pub fn upload_experts(&self, experts: &[TiledWeight]) -> Result<KbitExperts> {
        let Some(first) = experts.first() else {
            return Err(Error::Mismatch {
                what: "upload_experts: number of experts",
                left: "0".into(),
                right: "at least 1".into(),
            });
        };
        for (e, w) in experts.iter().enumerate().skip(1) {
            if w.shape() != first.shape() {
                return Err(Error::Mismatch {
                    what: "upload_experts: expert shapes",
                    left: format!("expert 0 is {:?}", first.shape()),
                    right: format!("expert {e} is {:?}", w.shape()),
                });
            }
            if w.codebook() != first.codebook() {
                return Err(Error::Mismatch {
                    what: "upload_experts: expert codebooks",
                    left: format!("expert 0 has {:?}", first.codebook().values()),
                    right: format!("expert {e} has {:?}", w.codebook().values()),
                });
            }
        }
        let packed: Vec<u32> = experts.iter().flat_map(|w| w.packed().iter().copied()).collect();
        let scales: Vec<u8> = experts.iter().flat_map(|w| w.scales().iter().copied()).collect();
        let s = self.stream();
        self.weights_written();
        Ok(KbitExperts {
            num_experts: experts.len(),
            shape: first.shape(),
            codebook: first.codebook().clone(),
            cb: s.clone_htod(first.codebook().values())?,
            packed: s.clone_htod(&packed)?,
            scales: s.clone_htod(&scales)?,
        })
    }
}
