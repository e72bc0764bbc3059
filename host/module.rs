//! The embedded PTX and the table of its kernels, resolved once per Context.

use crate::{Dtype, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// PTX of every kernel, built from `kernels-gpu` by `build.rs` (rustc
/// nvptx64 backend, `.target sm_89`; the driver JIT-compiles it for newer GPUs).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kbit.ptx"));

/// Bit widths, in table order.
pub(crate) const BITS: [u32; 4] = [2, 3, 4, 5];
/// Dtypes, in table order ([`Dtype::slot`]).
pub(crate) const DTYPES: [Dtype; 3] = [Dtype::F16, Dtype::Bf16, Dtype::F32];

/// Layout of a weight a dequantize kernel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayoutKind {
    Flat,
    Tiled,
}

/// Entry-point names, exactly as `kernels-gpu/src/lib.rs` generates them.
pub mod names {
    use crate::Dtype;

    /// `kbit_quantize_k{bits}_{dtype}`.
    pub fn quantize(bits: u32, dtype: Dtype) -> String {
        format!("kbit_quantize_k{bits}_{}", dtype.name())
    }
    /// `kbit_repack_k{bits}`.
    pub fn repack(bits: u32) -> String {
        format!("kbit_repack_k{bits}")
    }
    /// `kbit_dequant_{flat|tiled}_k{bits}_{dtype}`.
    pub fn dequant(tiled: bool, bits: u32, dtype: Dtype) -> String {
        format!("kbit_dequant_{}_k{bits}_{}", if tiled { "tiled" } else { "flat" }, dtype.name())
    }
    /// `kbit_selftest_mma_{f16|bf16}`.
    pub fn selftest_mma(dtype: Dtype) -> String {
        format!("kbit_selftest_mma_{}", dtype.name())
    }
    /// `kbit_moe_gather_b16` / `kbit_moe_scatter_b16`.
    pub fn moe_rows(scatter: bool) -> String {
        format!("kbit_moe_{}_b16", if scatter { "scatter" } else { "gather" })
    }
    /// Every entry point the host expects in the PTX.
    pub fn all() -> Vec<String> {
        let mut v = Vec::new();
        for bits in super::BITS {
            v.push(repack(bits));
            for d in super::DTYPES {
                v.push(quantize(bits, d));
                v.push(dequant(false, bits, d));
                v.push(dequant(true, bits, d));
            }
        }
        v.push(moe_rows(false));
        v.push(moe_rows(true));
        v.push(selftest_mma(Dtype::F16));
        v.push(selftest_mma(Dtype::Bf16));
        v
    }
}

/// Every kernel function, looked up once so that calls do no string work.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    quantize: Vec<CudaFunction>,
    repack: Vec<CudaFunction>,
    dequant: Vec<CudaFunction>,
    pub selftest_mma: [CudaFunction; 2],
    /// Expert row gather (0) and scatter (1) for the batched cuBLAS MoE path.
    pub moe_rows: [CudaFunction; 2],
}

fn bits_slot(bits: u32) -> usize {
    (bits - 2) as usize
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let module = ctx.load_module(Ptx::from_src(PTX))?;
        let get = |name: String| module.load_function(&name).map_err(|_| Error::MissingKernel(name));
        let mut quantize = Vec::new();
        let mut repack = Vec::new();
        let mut dequant = Vec::new();
        for bits in BITS {
            repack.push(get(names::repack(bits))?);
            for d in DTYPES {
                quantize.push(get(names::quantize(bits, d))?);
            }
            for tiled in [false, true] {
                for d in DTYPES {
                    dequant.push(get(names::dequant(tiled, bits, d))?);
                }
            }
        }
        let selftest_mma = [get(names::selftest_mma(Dtype::F16))?, get(names::selftest_mma(Dtype::Bf16))?];
        let moe_rows = [get(names::moe_rows(false))?, get(names::moe_rows(true))?];
        Ok(Self { _module: module, quantize, repack, dequant, selftest_mma, moe_rows })
    }

    pub fn quantize(&self, bits: u32, dtype: Dtype) -> &CudaFunction {
        &self.quantize[bits_slot(bits) * 3 + dtype.slot()]
    }
    pub fn repack(&self, bits: u32) -> &CudaFunction {
        &self.repack[bits_slot(bits)]
    }
    pub fn dequant(&self, layout: LayoutKind, bits: u32, dtype: Dtype) -> &CudaFunction {
        let l = (layout == LayoutKind::Tiled) as usize;
        &self.dequant[(bits_slot(bits) * 2 + l) * 3 + dtype.slot()]
    }
}
