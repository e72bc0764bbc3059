//! The kbit weight format, shared by the host runtime and the GPU kernels.
//!
//! Everything here is `no_std` and compiled for both x86-64 and
//! `nvptx64-nvidia-cuda`, so the CPU reference and the kernels compute
//! block indices, bit planes, codebook choices and E4M4 scales with the
//! same code and cannot disagree about the format.
//!
//! ```
//! use kbit_format::{e4m4, planes};
//! // 1.0 encodes to 0xB0 and back.
//! assert_eq!(e4m4::encode(1.0, false), Ok(0xB0));
//! assert_eq!(e4m4::decode(0xB0), 1.0);
//! // Four 3-bit indices packed into bit planes and read back.
//! let mut idx = [0u8; 32];
//! idx[..4].copy_from_slice(&[5, 0, 7, 2]);
//! let words = planes::pack::<3>(&idx);
//! assert_eq!(planes::index(&words, 2), 7);
//! ```
#![no_std]

#[cfg(feature = "std")]
extern crate std;

pub mod e4m4;
pub mod gemv;
pub mod gemv_slots;
pub mod mma;
pub mod mma_direct;
pub mod mma_kslots;
#[cfg(feature = "std")]
pub mod nf;
pub mod planes;
pub mod quant;
pub mod tile;
pub mod wgmma;

/// Values per quantization block (along K).
pub const BLOCK: usize = 32;
/// Smallest supported bit width k.
pub const MIN_BITS: u32 = 2;
/// Largest supported bit width k.
pub const MAX_BITS: u32 = 5;
/// Largest codebook (2^MAX_BITS entries).
pub const MAX_CODEBOOK: usize = 1 << MAX_BITS;
