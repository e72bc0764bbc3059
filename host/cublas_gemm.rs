//! The one cuBLAS call kbit makes: row-major `y[M, N] = x[M, K] · W[N, K]ᵀ`
//! in f16 or bf16 with f32 accumulation, optionally batched.
//!
//! Row-major y is column-major yᵀ[N, M] = W·xᵀ. Column-major, W is
//! A = [K, N] (lda = K) used transposed, x is B = [K, M] (ldb = K) used as
//! is, and yᵀ is C = [N, M] (ldc = N). beta = 0, so cuBLAS never reads y
//! (it may hold NaN).

use crate::{Dtype, Result};
use cudarc::cublas::{result as cublas, sys};
use std::ffi::c_void;

fn cuda_type(dtype: Dtype) -> sys::cudaDataType {
    match dtype {
        Dtype::F16 => sys::cudaDataType::CUDA_R_16F,
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
    }
}

/// Device addresses and sizes of one (batched) row-major linear GEMM:
/// matrix `b` of the batch is `w + b·N·K`, `x + b·M·K`, `y + b·M·N`.
pub(crate) struct RowMajorGemm {
    pub dtype: Dtype,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub w: u64,
    pub x: u64,
    pub y: u64,
}

impl RowMajorGemm {
    /// Enqueues the GEMM on the stream bound to `handle`.
    ///
    /// # Safety
    /// The addresses are live device buffers of `dtype` holding the batch's
    /// elements; every dimension and stride fits an i32/i64; the handle's
    /// context is current on this thread.
    pub unsafe fn run(&self, handle: sys::cublasHandle_t) -> Result<()> {
        let t = cuda_type(self.dtype);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (n, m, k) = (self.n as i32, self.m as i32, self.k as i32);
        let (op_t, op_n) = (sys::cublasOperation_t::CUBLAS_OP_T, sys::cublasOperation_t::CUBLAS_OP_N);
        let (a, b, c) = (self.w as *const c_void, self.x as *const c_void, self.y as *mut c_void);
        let (alpha, beta) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
        let (compute, algo) =
            (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT);
        unsafe {
            if self.batch == 1 {
                cublas::gemm_ex(handle, op_t, op_n, n, m, k, alpha, a, t, k, b, t, k, beta, c, t, n, compute, algo)?;
            } else {
                let (sa, sb, sc) = ((self.n * self.k) as i64, (self.m * self.k) as i64, (self.m * self.n) as i64);
                cublas::gemm_strided_batched_ex(
                    handle,
                    op_t,
                    op_n,
                    n,
                    m,
                    k,
                    alpha,
                    a,
                    t,
                    k,
                    sa,
                    b,
                    t,
                    k,
                    sb,
                    beta,
                    c,
                    t,
                    n,
                    sc,
                    self.batch as i32,
                    compute,
                    algo,
                )?;
            }
        }
        Ok(())
    }
}
