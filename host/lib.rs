//! # kbit — k-bit quantized weights for LLM inference on NVIDIA GPUs
//!
//! Weights `W[N, K]` are cut along K into blocks of 32 values; each block
//! keeps its absmax and each value the k-bit (k = 2..5) index of the nearest
//! entry of a 2^k-entry codebook (NF-k by default) to `w / absmax`.
//! Activations and outputs stay f16 or bf16. Decoding is bound by reading
//! weights, so reading `(k + 0.25) / 16` of the bytes of fp16 weights is the
//! speed-up to chase.
//!
//! Two layouts hold the same bits. The **flat** layout is the interchange
//! format (what [`reference::quantize`] and [`Context::quantize`] produce):
//! block after block, k bit-plane words each, f32 absmax. The **runtime**
//! layout ([`KbitWeight`] on the device) is what kernels read: K in tiles of
//! 64, all N columns of a tile contiguous, E4M4 scale bytes:
//!
//! ```text
//! flat:    [b0: p0 .. pk-1][b1: p0 .. pk-1] ...            absmax f32 [b0][b1] ...
//! runtime: kt=0 [n=0: h0 p0..pk-1, h1 p0..pk-1][n=1: ...] ... kt=1 [...]
//!          scales u8 (E4M4)  kt=0 [n=0: h0 h1][n=1: h0 h1] ...
//! ```
//!
//! The kernels are Rust (`kernels-gpu/`, compiled by rustc's nvptx64
//! backend to PTX embedded in this crate); the host side is a thin typed
//! layer over `cudarc`. A [`Context`] owns the stream and the loaded
//! kernels; every call is enqueued asynchronously, validates its arguments
//! and returns [`Result`]. A CPU reference ([`mod@reference`]) defines the
//! numerics, and the tests compare every GPU path against it.
//!
//! ```
//! use kbit::{Codebook, Shape, ScaleMode, reference};
//! let shape = Shape::new(128, 256)?;
//! let w: Vec<f32> = (0..shape.numel()).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
//! let codebook = Codebook::nf(4)?;
//! let flat = reference::quantize(&w, shape, &codebook)?;
//! let tiled = reference::repack(&flat, ScaleMode::Strict)?;
//! let back: Vec<f32> = reference::dequantize_tiled(&tiled);
//! let err = w.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
//! // Half the largest codebook gap, plus the E4M4 scale rounding, times absmax (≤ 1).
//! assert!(err <= codebook.max_gap() / 2.0 + 1.0 / 16.0);
//! # Ok::<(), kbit::Error>(())
//! ```
#![warn(missing_docs)]

mod codebook;
mod context;
mod cublas_gemm;
mod device;
mod dtype;
mod error;
mod experts;
mod gemv;
mod grouped_mma;
mod launch;
mod linear;
pub mod mid_m;
mod mma;
pub mod module;
mod moe;
mod ops;
pub mod reference;
pub mod small_m;
pub mod splitk;
mod weight;
mod wgmma;
pub mod wgmma_plan;

pub use codebook::Codebook;
pub use context::{Context, DeviceInfo};
pub use device::{DeviceFlatWeight, KbitWeight};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use experts::KbitExperts;
pub use gemv::GEMV_MAX_M;
pub use grouped_mma::GroupedPlan;
pub use linear::Kernel;
pub use mma::{MmaOptions, SPLITK_COUNTERS, SPLITK_WORKSPACE_F32};
pub use splitk::{Plan, Splits};
pub use weight::{FlatWeight, ScaleMode, Shape, TiledWeight};
pub use wgmma_plan::WgmmaPlan;

pub use cudarc;
pub use half;

/// The README's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
