//! Element types of dense matrices: activations, outputs, dequantized weights.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

/// The dtype of a dense matrix, for kernel selection and messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
}

impl Dtype {
    /// Suffix of kernel entry names (`f16`, `bf16`, `f32`).
    ///
    /// ```
    /// assert_eq!(kbit::Dtype::Bf16.name(), "bf16");
    /// assert_eq!(<half::f16 as kbit::Element>::DTYPE.name(), "f16");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
        }
    }

    /// Position in per-dtype kernel tables.
    pub(crate) fn slot(self) -> usize {
        self as usize
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
}

/// An element type kbit reads and writes: [`struct@f16`], [`bf16`] or `f32`.
///
/// Conversions from f32 round to nearest even, as the kernels do.
///
/// ```
/// use kbit::Element;
/// assert_eq!(half::f16::from_f32_rne(1.0009766).to_f32(), 1.0009766);
/// assert_eq!(<f32 as Element>::DTYPE, kbit::Dtype::F32);
/// ```
pub trait Element: sealed::Sealed + Copy + Send + Sync + DeviceRepr + ValidAsZeroBits + Unpin + 'static {
    /// The dtype tag.
    const DTYPE: Dtype;
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// Round to nearest even from f32.
    fn from_f32_rne(x: f32) -> Self;
    /// A NaN, to poison outputs in tests.
    fn nan() -> Self;
}

impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32_rne(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn nan() -> Self {
        f16::NAN
    }
}

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32_rne(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn nan() -> Self {
        bf16::NAN
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32_rne(x: f32) -> Self {
        x
    }
    fn nan() -> Self {
        f32::NAN
    }
}
