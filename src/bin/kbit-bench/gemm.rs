//! The dense baseline: cuBLAS GemmEx on f16/bf16 weights (f32 compute),
//! with the same argument order as kbit's dequant + cuBLAS path.

use cudarc::cublas::{CudaBlas, result as cublas, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use kbit::Dtype;
use std::ffi::c_void;
use std::sync::Arc;

/// A cuBLAS handle on the benchmark's stream, with its own workspace so
/// that calls can be captured in a CUDA graph.
pub struct DenseGemm {
    blas: CudaBlas,
    _workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

const WORKSPACE: usize = 32 << 20;

fn data_type(dtype: Dtype) -> sys::cudaDataType {
    match dtype {
        Dtype::F16 => sys::cudaDataType::CUDA_R_16F,
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
    }
}

impl DenseGemm {
    pub fn new(stream: &Arc<CudaStream>) -> kbit::Result<Self> {
        let blas = CudaBlas::new(stream.clone())?;
        let mut workspace = stream.alloc_zeros::<u8>(WORKSPACE)?;
        let (wp, record) = workspace.device_ptr_mut(stream);
        unsafe { sys::cublasSetWorkspace_v2(*blas.handle(), wp as *mut c_void, WORKSPACE) }.result()?;
        drop(record);
        Ok(Self { blas, _workspace: workspace, stream: stream.clone() })
    }

    /// Row-major `y[m, n] = x[m, k] · w[n, k]ᵀ` (column-major: C[n, m] =
    /// Aᵀ·B with A = w as [k, n], B = x as [k, m]).
    ///
    /// # Safety
    /// `w`, `x`, `y` are live device pointers of `dtype` elements holding at
    /// least `n·k`, `m·k` and `m·n` elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(&self, dtype: Dtype, m: usize, n: usize, k: usize, w: u64, x: u64, y: u64) -> kbit::Result<()> {
        let t = data_type(dtype);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // cuBLAS works in the thread's current context.
        self.stream.context().bind_to_thread()?;
        unsafe {
            cublas::gemm_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                t,
                k as i32,
                x as *const c_void,
                t,
                k as i32,
                (&beta as *const f32).cast(),
                y as *mut c_void,
                t,
                n as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }

    /// `batch` independent [`DenseGemm::gemm`]s in one strided-batched
    /// call: matrix `b` is `w + b·n·k`, `x + b·m·k`, `y + b·m·n`.
    ///
    /// # Safety
    /// As for [`DenseGemm::gemm`], times `batch`, contiguous.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_batched(
        &self,
        dtype: Dtype,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        w: u64,
        x: u64,
        y: u64,
    ) -> kbit::Result<()> {
        let t = data_type(dtype);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // cuBLAS works in the thread's current context.
        self.stream.context().bind_to_thread()?;
        unsafe {
            cublas::gemm_strided_batched_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                t,
                k as i32,
                (n * k) as i64,
                x as *const c_void,
                t,
                k as i32,
                (m * k) as i64,
                (&beta as *const f32).cast(),
                y as *mut c_void,
                t,
                n as i32,
                (m * n) as i64,
                batch as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }
}
