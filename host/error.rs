//! The one error type of the public API.

use crate::Kernel;
use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// Everything that can go wrong in a kbit call. Each variant names the bad
/// argument and its value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bit width k is not in 2..=5.
    #[error("bit width k must be in 2..=5, got {0}")]
    Bits(u32),
    /// A codebook whose length is not 2^k for k in 2..=5.
    #[error("codebook must have 4, 8, 16 or 32 entries (2^k, k = 2..5), got {0}")]
    CodebookLen(usize),
    /// A codebook entry that is NaN or infinite.
    #[error("codebook entry {index} is not finite ({value})")]
    CodebookValue {
        /// Position of the entry.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// K (in features) is zero or not a multiple of 32.
    #[error("K (in features) must be a positive multiple of 32, got {0}")]
    InFeatures(usize),
    /// N (out features) is zero.
    #[error("N (out features) must be at least 1, got 0")]
    OutFeatures,
    /// A matrix too large for the kernels' index types.
    #[error("matrix [{n}, {k}] has more than 2^32 - 2 quant blocks")]
    TooLarge {
        /// N.
        n: usize,
        /// K.
        k: usize,
    },
    /// A buffer whose length does not match the shape.
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Length the shape requires.
        expected: usize,
        /// Length passed.
        got: usize,
    },
    /// Two arguments that must agree (bit width, shape, codebook) do not.
    #[error("{what}: {left} vs {right}")]
    Mismatch {
        /// What disagrees.
        what: &'static str,
        /// One side.
        left: String,
        /// The other side.
        right: String,
    },
    /// NaN or ±inf in the weights to quantize.
    #[error("weights contain NaN or inf in quant block {block}{}", position.map_or(String::new(), |(r, c)| format!(" (row {r}, columns {c}..{})", c + 32)))]
    NonFinite {
        /// Index of the first offending block (`row·K/32 + col/32`).
        block: usize,
        /// (row, first column) of the block, when the shape is known.
        position: Option<(usize, usize)>,
    },
    /// A block absmax that the E4M4 scale byte cannot represent.
    #[error("absmax of quant block {block} ({}) is outside the E4M4 range 0..=31; rescale the weights or repack with ScaleMode::Saturate", value.map_or("NaN, negative or > 31".to_string(), |v| v.to_string()))]
    ScaleRange {
        /// Index of the first offending block.
        block: usize,
        /// Its absmax, when known on the host.
        value: Option<f32>,
    },
    /// A device buffer not aligned as the kernel's vector accesses need.
    #[error("{what} must be {align}-byte aligned on the device")]
    Alignment {
        /// Which buffer.
        what: &'static str,
        /// Required alignment in bytes.
        align: usize,
    },
    /// M (rows of the activations) is zero or beyond what the call supports.
    #[error("M (rows of the activations) must be in 1..={max}, got {m}")]
    Rows {
        /// M passed.
        m: usize,
        /// Largest M the call supports.
        max: usize,
    },
    /// A kernel that cannot serve the call: not in this build, not for this
    /// M, shape or layer kind (when forced with `Context::force_kernel`), or
    /// a setup step that a graph capture does not allow.
    #[error("kernel {kernel} not applicable: {why}")]
    NotApplicable {
        /// The kernel asked for.
        kernel: Kernel,
        /// Why it cannot run.
        why: String,
    },
    /// A split-K request or launch geometry that cannot be planned.
    #[error("split-K: {what} = {value}: {reason}")]
    SplitK {
        /// The argument.
        what: &'static str,
        /// Its value.
        value: usize,
        /// Why it cannot be used.
        reason: String,
    },
    /// A kernel configuration whose shared memory does not fit the device.
    #[error("{kernel} does not fit this device's shared memory ({available} bytes per block)")]
    SharedMemory {
        /// The kernel.
        kernel: String,
        /// Shared memory per block the device offers.
        available: usize,
    },
    /// An expert had more rows than the `max_m` passed to `expert_linear`
    /// (found on the device; its rows past `max_m` were not computed).
    #[error("expert {expert} has more rows than the max_m given to expert_linear")]
    ExpertRows {
        /// The first such expert.
        expert: usize,
    },
    /// No usable CUDA device or driver.
    #[error("no CUDA device available: {0}")]
    NoDevice(String),
    /// The embedded PTX lacks a kernel (a build problem).
    #[error("kernel {0} is missing from the embedded PTX")]
    MissingKernel(String),
    /// A CUDA driver error.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// A cuBLAS error.
    #[error("cuBLAS: {0}")]
    Cublas(#[from] CublasError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
