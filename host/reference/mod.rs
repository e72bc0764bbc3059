//! The CPU reference (rayon): quantize, repack, dequantize and matmul.
//!
//! It defines the format's numerics; the GPU kernels are tested against it
//! (bit-exact where the math is exact). It shares every index and rounding
//! rule with the kernels through `kbit_format`.

mod dequant;
mod matmul;
mod quantize;
mod repack;

pub use dequant::{dequantize_flat, dequantize_tiled};
pub use matmul::matmul_f64;
pub use quantize::quantize;
pub use repack::repack;
