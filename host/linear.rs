//! `linear`: `y[M, N] = x[M, K] · Wᵀ` for a k-bit weight, and the dispatch
//! over the kernels that can compute it.
//!
//! Dispatch is an ordered chain of paths, fastest first for the call's M;
//! a path that does not apply falls through to the next one:
//!
//! ```text
//! 1. scalar GEMV        M ≤ 4 where `small_m`'s table says it beats the
//!                       MMA kernel's direct-load variant (mostly M = 1,
//!                       k = 5)  kernel 1 (gemv.rs)
//! 2. MMA dequant GEMM   M ≤ 32 (its direct-load variant at M ≤ 4 and
//!                       on most shapes at M = 5..8; ≤ 48
//!                       / 64 on matrices of 2^21 / 2^22 weights and
//!                       more; on sm_90 up to M = 512 / 768 / 2048 from
//!                       2^22 / 2^23 / 2^24)  kernel 2 (mma.rs,
//!                       split-K over the SMs; on sm_90 wgmma.rs beyond
//!                       M = 64, at M = 49..64 on 8192 columns and more,
//!                       at M = 33..48 from 2^27 weights)
//! 3. dequant + cuBLAS   any M          dequantize W into a scratch buffer, one GemmEx
//! ```
//!
//! [`Context::force_kernel`] pins one path (for A/B checks and benchmarks);
//! a pinned path that cannot serve a call returns [`Error::NotApplicable`]
//! instead of falling through. The kernel that ran is returned and recorded
//! ([`Context::last_kernel`]).
//!
//! The dequant + cuBLAS path owns, inside the [`Context`], a cuBLAS handle
//! bound to the context's stream, a 32 MiB cuBLAS workspace (so that cuBLAS
//! allocates nothing inside a CUDA graph capture) and a scratch buffer for
//! the dequantized weight that only grows. Steady-state calls allocate
//! nothing and never wait for the GPU, so they can be captured in a graph —
//! after one eager call (or [`Context::prepare_linear`]) has set these up.

use crate::cublas_gemm::RowMajorGemm;
use crate::{Context, Dtype, Element, Error, KbitWeight, Result, Shape};
use cudarc::cublas::{CudaBlas, sys as cublas_sys};
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The kbit kernels a matmul can run on (DESIGN §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// 1. Scalar GEMV (M = 1..4, dense layers).
    Scalar,
    /// 2. Tensor-core dequant GEMM: M ≤ 64, and any M on sm_90 (the
    ///    warpgroup GEMM); automatic dispatch takes it for M = 5..32, at
    ///    M ≤ 4 where [`crate::small_m`] prefers its direct-load variant, up
    ///    to M = 48 / 64 from 2^21 / 2^22 weights, and on sm_90 up to
    ///    M = 512 / 768 / 2048 from 2^22 / 2^23 / 2^24 weights.
    Mma,
    /// 3. Dequantize to f16/bf16, then a cuBLAS GEMM (any M).
    DequantCublas,
    /// 4. Grouped scalar GEMV over MoE experts.
    GroupedScalar,
    /// 5. Grouped tensor-core GEMM over MoE experts.
    GroupedMma,
}

impl Kernel {
    /// Every kernel, in DESIGN order.
    pub const ALL: [Kernel; 5] =
        [Kernel::Scalar, Kernel::Mma, Kernel::DequantCublas, Kernel::GroupedScalar, Kernel::GroupedMma];

    /// The kernel's name: `scalar`, `mma`, `dequant_cublas`,
    /// `grouped_scalar`, `grouped_mma` (also its [`fmt::Display`]).
    ///
    /// ```
    /// use kbit::Kernel;
    /// assert_eq!(Kernel::Mma.name(), "mma");
    /// assert_eq!(Kernel::DequantCublas.to_string(), Kernel::DequantCublas.name());
    /// // Every name reads back as its kernel.
    /// assert!(Kernel::ALL.into_iter().all(|k| Kernel::from_name(k.name()) == Some(k)));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Mma => "mma",
            Kernel::DequantCublas => "dequant_cublas",
            Kernel::GroupedScalar => "grouped_scalar",
            Kernel::GroupedMma => "grouped_mma",
        }
    }

    /// The kernel named `name` (as [`Kernel::name`] spells it).
    ///
    /// ```
    /// use kbit::Kernel;
    /// assert_eq!(Kernel::from_name("dequant_cublas"), Some(Kernel::DequantCublas));
    /// assert_eq!(Kernel::GroupedMma.to_string(), "grouped_mma");
    /// assert_eq!(Kernel::from_name("fp16"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this build of the library contains the kernel.
    ///
    /// ```
    /// use kbit::Kernel;
    /// // Only an available kernel can be pinned with `Context::force_kernel`.
    /// let built: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.is_available()).collect();
    /// assert!(built.contains(&Kernel::Scalar));
    /// ```
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar | Kernel::Mma | Kernel::DequantCublas | Kernel::GroupedScalar | Kernel::GroupedMma => true,
        }
    }

    fn code(kernel: Option<Kernel>) -> u8 {
        kernel.map_or(0, |k| k as u8 + 1)
    }

    fn decode(code: u8) -> Option<Kernel> {
        code.checked_sub(1).map(|i| Kernel::ALL[i as usize])
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The order in which `linear` tries its paths when no kernel is forced.
const LINEAR_CHAIN: [Kernel; 3] = [Kernel::Scalar, Kernel::Mma, Kernel::DequantCublas];

/// Bytes of the workspace given to cuBLAS (NVIDIA recommends 32 MiB on
/// Hopper). With a workspace set, cuBLAS allocates nothing per call, which
/// graph capture requires.
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// Dispatch state of a [`Context`]: the forced and the last kernel, and the
/// resources of the dequant + cuBLAS path.
#[derive(Default)]
pub(crate) struct LinearState {
    forced: AtomicU8,
    last: AtomicU8,
    dense: Mutex<DensePath>,
}

#[derive(Default)]
struct DensePath {
    blas: Option<Blas>,
    /// Dequantized weights (2-byte elements), grown to the largest weight seen.
    scratch: Option<CudaSlice<u8>>,
}

struct Blas {
    handle: CudaBlas,
    /// Must outlive its use by `handle`; dropped after it (field order).
    _workspace: CudaSlice<u8>,
}

fn not_applicable(kernel: Kernel, why: impl Into<String>) -> Error {
    Error::NotApplicable { kernel, why: why.into() }
}

/// Largest M the MMA kernel serves.
const MMA_MAX_M: usize = kbit_format::mma::MAX_M as usize;

/// Largest M for which automatic dispatch prefers the MMA kernel over
/// dequant + cuBLAS on every matrix (H100, 1506f81: the `mma.sync` form
/// was the fastest of the three paths on all 204 rows at M = 16, 24 and
/// 32 of `…-1506f81-m16-64-*.json`).
const MMA_AUTO_MAX_M: usize = 32;

/// Whether automatic dispatch prefers one of the MMA kernel's forms over
/// dequant + cuBLAS at MMA_AUTO_MAX_M < M ≤ 64: from 2^21 weights at
/// M ≤ 48, from 2^22 beyond. Which form: [`wgmma_preferred`].
///
/// From one run of the three paths on an H100 at 1506f81 (f16, cold L2,
/// k = 2 and 4; `bench-results/nvidia-h100-80gb-hbm3-2026-11-27-1506f81-m16-64-{sync,wgmma}.json`):
/// the grid of [`wgmma_preferred`]'s large-M bands and six shapes off it
/// at M ∈ {40, 48, 56, 64}, 272 rows. These bands take 1.4–3.4 % longer
/// per M than the fastest path would (the bands before them, on K ≥ 4096
/// or 2^24 weights: 5.1–7.7 %, up to 1.9× on a row: Qwen3 `q` at M = 48
/// went to dequant + cuBLAS, 30 % slower than `mma.sync`).
fn mma_preferred_at_large_m(m: usize, shape: Shape) -> bool {
    let weights = (shape.n as u64) * (shape.k as u64);
    weights >= if m <= 48 { 1 << 21 } else { 1 << 22 }
}

/// Whether the tensor-core path on sm_90 prefers the warpgroup GEMM: at
/// M = 33..48 on matrices of 2^27 weights and more and at M = 49..64 on
/// those of 8192 columns and more (over the `mma.sync` form, which
/// [`mma_preferred_at_large_m`] chose over dequant + cuBLAS); beyond that
/// over dequant + cuBLAS at M = 65..512 from 2^22 weights, at M = 513..768
/// from 2^23 and at M = 769..2048 from 2^24; beyond M = 2048 (not
/// measured) dequant + cuBLAS, whose dequantize the GEMM amortizes there.
///
/// At M ≤ 64 the warpgroup GEMM's 128-row blocks are half empty or more,
/// so it wins only where its tiles fill the SMs better: Llama-3-70B at
/// M = 48 (k = 4, 0.88 of `mma.sync`'s time), and at M = 56, 64 the
/// matrices of 8192 columns and more (0.64–0.82 from 8960 columns on; at
/// 8192, 0.79–1.33 by K; narrower ones split both ways). Beyond M = 64,
/// from one run of both kernels on an H100 at a7b997b (f16, cold L2;
/// `bench-results/nvidia-h100-80gb-hbm3-2026-11-27-a7b997b-large-m-*.json`):
/// a grid of K ∈ {1024, 2048, 4096, 8192} × N ∈ {512, …, 28672} and seven
/// shapes off it (Qwen3 gate/up and down, GLM shared and four others) at
/// M ∈ {96, 128, 192, 256, 384, 512, 768, 1024}, k = 2..5, and six shapes
/// at M = 2048, k = 2 and 4: 1132 rows. Both kernels' times step with
/// their tiles' waves, so the ratio is jagged in M and N (Qwen3 gate/up,
/// 2^23.3 weights, k = 4: the warpgroup GEMM takes 24 % less time at
/// M = 768 and 25 % more at M = 1024), and a threshold on the weight
/// count does better than a table of the ratios interpolated in (log2 K,
/// log2 N): on the rows off the grid 1.3 % above the faster kernel in
/// all, against 3.0 %. Over all rows these bands sum to 0.1–1.0 % above
/// the faster kernel at each M; the bands they replace, 0.5–16 %.
fn wgmma_preferred(m: usize, shape: Shape) -> bool {
    let weights = (shape.n as u64) * (shape.k as u64);
    match m {
        33..=48 => weights >= 1 << 27,
        49..=64 => shape.n >= 8192 && weights >= 1 << 22,
        65..=512 => weights >= 1 << 22,
        513..=768 => weights >= 1 << 23,
        769..=2048 => weights >= 1 << 24,
        _ => false,
    }
}

/// Whether the MMA kernel runs in its warpgroup form for `m` rows of a
/// `shape` weight (`wgmma`: the device has it, sm_90): always beyond
/// M = 64, where only that form serves, else where [`wgmma_preferred`].
fn mma_runs_wgmma(m: usize, shape: Shape, wgmma: bool) -> bool {
    m > MMA_MAX_M || (wgmma && wgmma_preferred(m, shape))
}

/// Why `kernel` cannot compute `linear` with `m` rows of a `shape` weight
/// of `bits` bits, or `None` if it can. `auto` applies the dispatch
/// preferences on top of the hard limits; `wgmma`: the device has the
/// warpgroup GEMM for these bits and activations (sm_90).
fn linear_unfit(kernel: Kernel, m: usize, shape: Shape, bits: u32, auto: bool, wgmma: bool) -> Option<&'static str> {
    if !kernel.is_available() {
        return Some("the kernel is not part of this build yet");
    }
    match kernel {
        Kernel::GroupedScalar | Kernel::GroupedMma => Some("grouped kernels serve MoE experts, not linear"),
        Kernel::Scalar if m > crate::GEMV_MAX_M => Some("the scalar GEMV serves M ≤ 4"),
        Kernel::Scalar if auto && crate::small_m::prefers_mma(m, shape, bits) => {
            Some("the MMA kernel is faster at this M on this matrix")
        }
        Kernel::Mma if m > MMA_MAX_M && !wgmma => Some("the MMA kernel serves M ≤ 64 (any M on sm_90)"),
        Kernel::Mma if auto && m > MMA_MAX_M && !(wgmma && wgmma_preferred(m, shape)) => {
            Some("dequant + cuBLAS is faster at this M on this matrix")
        }
        Kernel::Mma if auto && (MMA_AUTO_MAX_M + 1..=MMA_MAX_M).contains(&m) && !mma_preferred_at_large_m(m, shape) => {
            Some("dequant + cuBLAS is faster at this M on this matrix")
        }
        Kernel::Scalar | Kernel::Mma | Kernel::DequantCublas => None,
    }
}

/// Checks the arguments every path shares.
fn check_linear(dtype: Dtype, m: usize, shape: Shape, x_len: usize, y_len: usize) -> Result<()> {
    if dtype == Dtype::F32 {
        return Err(Error::Mismatch {
            what: "linear element type (activations and outputs)",
            left: "f32".into(),
            right: "f16 or bf16".into(),
        });
    }
    // cuBLAS takes dimensions as i32.
    if m == 0 || m > i32::MAX as usize {
        return Err(Error::Rows { m, max: i32::MAX as usize });
    }
    if shape.n > i32::MAX as usize || shape.k > i32::MAX as usize {
        return Err(Error::TooLarge { n: shape.n, k: shape.k });
    }
    let xm = m.checked_mul(shape.k).ok_or(Error::TooLarge { n: m, k: shape.k })?;
    let ym = m.checked_mul(shape.n).ok_or(Error::TooLarge { n: m, k: shape.n })?;
    crate::weight::check_len("linear activations x [M, K]", xm, x_len)?;
    crate::weight::check_len("linear outputs y [M, N]", ym, y_len)
}

impl Context {
    /// `y[M, N] = x[M, K] · Wᵀ` with `W[N, K]` the k-bit weight `w`;
    /// `x` and `y` row-major (contiguous), f16 or bf16. Returns the kernel
    /// that ran (also kept as [`Context::last_kernel`]).
    ///
    /// Asynchronous on [`Context::stream`]: no host synchronization, and no
    /// device allocation once the first call for the largest weight has
    /// grown the scratch buffer (see [`Context::prepare_linear`]), so calls
    /// can be captured in a CUDA graph.
    ///
    /// ```no_run
    /// use half::f16;
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(5120, 2048)?;
    /// let w16: Vec<f16> = (0..shape.numel()).map(|i| f16::from_f32((i as f32 * 0.37).sin() * 0.05)).collect();
    /// let flat = ctx.quantize(&ctx.stream().clone_htod(&w16)?, shape, &kbit::Codebook::nf(4)?)?;
    /// let w = ctx.repack(&flat, kbit::ScaleMode::Strict)?;
    /// let m = 32;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); m * shape.k])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(m * shape.n)?;
    /// let kernel = ctx.linear(&x, m, &w, &mut y)?;
    /// println!("ran {kernel}");
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for f32 activations; [`Error::Rows`] for M = 0;
    /// [`Error::Length`] when `x` is not `M·K` or `y` not `M·N` elements;
    /// [`Error::NotApplicable`] when a forced kernel cannot serve the call,
    /// or when a call inside a graph capture would need to allocate (make
    /// one eager call first); driver and cuBLAS errors.
    pub fn linear<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<Kernel> {
        check_linear(T::DTYPE, m, w.shape(), x.len(), y.len())?;
        let kernel = match self.forced_kernel() {
            Some(kernel) => {
                if let Some(why) = self.hard_unfit::<T>(kernel, m, w) {
                    return Err(not_applicable(
                        kernel,
                        format!("{why} (linear, M = {m}, W [{}, {}])", w.shape().n, w.shape().k),
                    ));
                }
                self.run_linear(kernel, x, m, w, y)?;
                kernel
            }
            None => self.dispatch_linear(x, m, w, y)?,
        };
        self.record_kernel(kernel);
        Ok(kernel)
    }

    /// [`linear_unfit`] with the hard limits only (a forced kernel).
    fn hard_unfit<T: Element>(&self, kernel: Kernel, m: usize, w: &KbitWeight) -> Option<&'static str> {
        linear_unfit(kernel, m, w.shape(), w.bits(), false, self.wgmma_slots(w.bits(), T::DTYPE).is_some())
    }

    /// Walks [`LINEAR_CHAIN`]: the first path that applies runs.
    fn dispatch_linear<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<Kernel> {
        let wgmma = self.wgmma_slots(w.bits(), T::DTYPE).is_some();
        for kernel in LINEAR_CHAIN {
            if linear_unfit(kernel, m, w.shape(), w.bits(), true, wgmma).is_none() {
                self.run_linear(kernel, x, m, w, y)?;
                return Ok(kernel);
            }
        }
        // Dequant + cuBLAS serves every M; only a build without it gets here.
        Err(not_applicable(Kernel::DequantCublas, "no linear kernel in this build"))
    }

    /// Runs one path that [`linear_unfit`] accepted.
    fn run_linear<T: Element>(
        &self,
        kernel: Kernel,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        match kernel {
            Kernel::DequantCublas => self.dequant_cublas(x, m, w, y),
            Kernel::Scalar => self.gemv(x, m, w, y),
            Kernel::Mma if mma_runs_wgmma(m, w.shape(), self.wgmma_slots(w.bits(), T::DTYPE).is_some()) => {
                self.wgmma_gemm(x, m, w, y)
            }
            Kernel::Mma => self.mma_gemm(x, m, w, y),
            Kernel::GroupedScalar | Kernel::GroupedMma => {
                Err(not_applicable(kernel, self.hard_unfit::<T>(kernel, m, w).unwrap_or("not a linear kernel")))
            }
        }
    }

    /// Pins the kernel `linear` (and the expert dispatch) uses, or restores
    /// automatic dispatch with `None`. While pinned, a call the kernel cannot
    /// serve returns [`Error::NotApplicable`] instead of falling back.
    ///
    /// ```no_run
    /// use kbit::{Context, Kernel};
    /// let ctx = Context::new(0)?;
    /// ctx.force_kernel(Some(Kernel::DequantCublas))?;
    /// assert_eq!(ctx.forced_kernel(), Some(Kernel::DequantCublas));
    /// ctx.force_kernel(None)?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NotApplicable`] for a kernel this build does not contain
    /// (see [`Kernel::is_available`]); the setting is then unchanged.
    pub fn force_kernel(&self, kernel: Option<Kernel>) -> Result<()> {
        if let Some(k) = kernel.filter(|k| !k.is_available()) {
            return Err(not_applicable(k, "the kernel is not part of this build yet"));
        }
        self.linear.forced.store(Kernel::code(kernel), Ordering::Relaxed);
        Ok(())
    }

    /// The kernel pinned by [`Context::force_kernel`], if any.
    ///
    /// ```no_run
    /// use kbit::{Context, Kernel};
    /// let ctx = Context::new(0)?;
    /// assert_eq!(ctx.forced_kernel(), None); // automatic dispatch
    /// ctx.force_kernel(Some(Kernel::Mma))?;
    /// assert_eq!(ctx.forced_kernel(), Some(Kernel::Mma));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn forced_kernel(&self) -> Option<Kernel> {
        Kernel::decode(self.linear.forced.load(Ordering::Relaxed))
    }

    /// The kernel the most recent successful matmul call ran, if any.
    ///
    /// ```no_run
    /// use half::f16;
    /// use kbit::{Context, Kernel};
    /// let ctx = Context::new(0)?;
    /// # let shape = kbit::Shape::new(4096, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let w = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 16 * shape.k])?;
    /// # let mut y = ctx.stream().alloc_zeros::<f16>(16 * shape.n)?;
    /// assert_eq!(ctx.last_kernel(), None);
    /// ctx.force_kernel(Some(Kernel::Mma))?;
    /// ctx.linear(&x, 16, &w, &mut y)?;
    /// assert_eq!(ctx.last_kernel(), Some(Kernel::Mma));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn last_kernel(&self) -> Option<Kernel> {
        Kernel::decode(self.linear.last.load(Ordering::Relaxed))
    }

    /// Records the kernel a matmul call ran.
    pub(crate) fn record_kernel(&self, kernel: Kernel) {
        self.linear.last.store(Kernel::code(Some(kernel)), Ordering::Relaxed);
    }

    /// Sets up the dequant + cuBLAS path ahead of time: creates the cuBLAS
    /// handle and its workspace and grows the scratch buffer to hold the
    /// largest weight `largest` (2-byte elements). Call it before capturing
    /// `linear` calls in a CUDA graph (an eager call does the same). One
    /// eager call per shape before capturing is the safest warm-up: cuBLAS
    /// may load the GEMM kernel it picks at its first use.
    ///
    /// ```no_run
    /// use kbit::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    /// # use half::f16;
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(4096, 2048)?;
    /// # let w = ctx.stream().alloc_zeros::<f16>(shape.numel())?;
    /// # let w = ctx.repack(&ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?, kbit::ScaleMode::Strict)?;
    /// # let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); 256 * shape.k])?;
    /// # let mut y = ctx.stream().alloc_zeros::<f16>(256 * shape.n)?;
    /// ctx.prepare_linear(shape)?; // cuBLAS handle, workspace and scratch for `shape`
    /// ctx.linear(&x, 256, &w, &mut y)?; // one eager call per shape
    /// let s = ctx.stream();
    /// s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    /// ctx.linear(&x, 256, &w, &mut y)?;
    /// let graph = s.end_capture(CUgraphInstantiate_flags(0))?.expect("a captured graph");
    /// graph.launch()?;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn prepare_linear(&self, largest: Shape) -> Result<()> {
        let mut dense = self.dense_path();
        self.ensure_blas(&mut dense)?;
        self.ensure_scratch(&mut dense, largest.numel() * 2)?;
        Ok(())
    }

    fn dense_path(&self) -> MutexGuard<'_, DensePath> {
        // A panic while holding the lock leaves no half-updated state that
        // matters (buffers are replaced whole), so a poisoned lock is usable.
        self.linear.dense.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses to allocate while the stream is being captured: an
    /// allocation inside a capture would belong to the graph, not to us.
    fn check_not_capturing(&self, what: &str) -> Result<()> {
        match self.stream().capture_status()? {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
            _ => Err(not_applicable(
                Kernel::DequantCublas,
                format!(
                    "{what} during a CUDA graph capture; make one eager call (or Context::prepare_linear) before capturing"
                ),
            )),
        }
    }

    /// Runs `f` with the cuBLAS handle and the scratch buffer grown to at
    /// least `bytes` (its device address), holding the lock for the call so
    /// that no other matmul reuses the scratch before `f` has enqueued its
    /// work. Used by the MoE dequant + cuBLAS path.
    pub(crate) fn with_blas_scratch<R>(
        &self,
        bytes: usize,
        f: impl FnOnce(cublas_sys::cublasHandle_t, u64) -> Result<R>,
    ) -> Result<R> {
        let mut guard = self.dense_path();
        self.ensure_blas(&mut guard)?;
        self.ensure_scratch(&mut guard, bytes)?;
        let DensePath { blas: Some(blas), scratch: Some(scratch) } = &mut *guard else {
            return Err(not_applicable(Kernel::DequantCublas, "cuBLAS or the scratch buffer is missing"));
        };
        let (base, _record) = scratch.device_ptr_mut(self.stream());
        self.cuda().bind_to_thread()?;
        f(*blas.handle.handle(), base)
    }

    fn ensure_blas(&self, dense: &mut DensePath) -> Result<()> {
        if dense.blas.is_some() {
            return Ok(());
        }
        self.check_not_capturing("creating the cuBLAS handle")?;
        // cudarc's loader panics when the library is absent: ask first.
        if !unsafe { cublas_sys::is_culib_present() } {
            return Err(not_applicable(Kernel::DequantCublas, "the cuBLAS library (libcublas.so) is not installed"));
        }
        let handle = CudaBlas::new(self.stream().clone())?;
        let mut workspace = self.stream().alloc_zeros::<u8>(CUBLAS_WORKSPACE)?;
        let (wp, record) = workspace.device_ptr_mut(self.stream());
        // After cublasSetStream (done by CudaBlas::new), which resets the workspace.
        unsafe { cublas_sys::cublasSetWorkspace_v2(*handle.handle(), wp as *mut c_void, CUBLAS_WORKSPACE) }.result()?;
        drop(record);
        dense.blas = Some(Blas { handle, _workspace: workspace });
        Ok(())
    }

    fn ensure_scratch(&self, dense: &mut DensePath, bytes: usize) -> Result<()> {
        if dense.scratch.as_ref().is_some_and(|s| s.len() >= bytes) {
            return Ok(());
        }
        self.check_not_capturing("growing the dequantization scratch buffer")?;
        // Free the old buffer first (stream-ordered) so peak memory stays one buffer.
        dense.scratch = None;
        dense.scratch = Some(unsafe { self.stream().alloc::<u8>(bytes) }?);
        Ok(())
    }

    /// Kernel 3: dequantize `w` into the scratch buffer, then one cuBLAS
    /// GemmEx with f32 accumulation.
    fn dequant_cublas<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        m: usize,
        w: &KbitWeight,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let shape = w.shape();
        let s = self.stream();
        // Held for the whole call: the scratch is reused by the next call,
        // which the stream orders after this GEMM.
        let mut guard = self.dense_path();
        self.ensure_blas(&mut guard)?;
        self.ensure_scratch(&mut guard, shape.numel() * std::mem::size_of::<T>())?;
        let DensePath { blas: Some(blas), scratch: Some(scratch) } = &mut *guard else {
            return Err(not_applicable(Kernel::DequantCublas, "cuBLAS or the scratch buffer is missing"));
        };
        // T is f16 or bf16 (2 bytes, any bit pattern valid), and the scratch
        // holds at least numel·2 bytes.
        let mut wt = unsafe { scratch.transmute_mut::<T>(shape.numel()) }
            .ok_or_else(|| not_applicable(Kernel::DequantCublas, "scratch buffer too small"))?;
        self.dequantize(w, &mut wt)?;

        let (wp, _gw) = wt.device_ptr(s);
        let (xp, _gx) = x.device_ptr(s);
        let (yp, _gy) = y.device_ptr_mut(s);
        let gemm = RowMajorGemm { dtype: T::DTYPE, batch: 1, m, n: shape.n, k: shape.k, w: wp, x: xp, y: yp };
        self.cuda().bind_to_thread()?;
        // Dimensions were checked to fit i32 by `check_linear`.
        unsafe { gemm.run(*blas.handle.handle()) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path automatic dispatch takes for `m` rows of an N × K weight
    /// (k = 4): the first of [`LINEAR_CHAIN`] that applies, and for the MMA
    /// kernel which form `run_linear` launches; `sm90`: a device with the
    /// warpgroup GEMM.
    fn path(m: usize, n: usize, k: usize, sm90: bool) -> &'static str {
        let shape = Shape::new(n, k).unwrap();
        let kernel = LINEAR_CHAIN.into_iter().find(|&c| linear_unfit(c, m, shape, 4, true, sm90).is_none());
        match kernel.unwrap() {
            Kernel::Mma if mma_runs_wgmma(m, shape, sm90) => "wgmma",
            Kernel::Mma => "mma.sync",
            Kernel::DequantCublas => "cublas",
            other => panic!("{other} at M = {m}"),
        }
    }

    #[test]
    fn bands_at_their_edges() {
        // (M, N, K, path on sm_90, path without the warpgroup GEMM): 2^20 /
        // 2^21 weights at M = 32 / 33 / 48, 2^21 / 2^22 at M = 49 / 64, 2^27
        // at M = 48, 8192 columns at M = 49..64; beyond M = 64 the warpgroup
        // GEMM's bands, and dequant + cuBLAS without it.
        let cases = [
            (32, 512, 2048, "mma.sync", "mma.sync"),
            (33, 512, 2048, "cublas", "cublas"),
            (33, 1024, 2048, "mma.sync", "mma.sync"),
            (48, 8192, 8192, "mma.sync", "mma.sync"),
            (48, 16384, 8192, "wgmma", "mma.sync"),
            (49, 1024, 2048, "cublas", "cublas"),
            (49, 2048, 2048, "mma.sync", "mma.sync"),
            (49, 8192, 256, "cublas", "cublas"),
            (49, 8192, 512, "wgmma", "mma.sync"),
            (64, 4096, 8192, "mma.sync", "mma.sync"),
            (64, 28672, 8192, "wgmma", "mma.sync"),
            (65, 1024, 2048, "cublas", "cublas"),
            (65, 2048, 2048, "wgmma", "cublas"),
            (512, 2048, 2048, "wgmma", "cublas"),
            (513, 2048, 2048, "cublas", "cublas"),
            (513, 4096, 2048, "wgmma", "cublas"),
            (768, 4096, 2048, "wgmma", "cublas"),
            (769, 4096, 2048, "cublas", "cublas"),
            (769, 8192, 2048, "wgmma", "cublas"),
            (2048, 8192, 2048, "wgmma", "cublas"),
            (2049, 28672, 8192, "cublas", "cublas"),
        ];
        for (m, n, k, sm90, other) in cases {
            let got = (path(m, n, k, true), path(m, n, k, false));
            assert_eq!(got, (sm90, other), "M = {m}, N = {n}, K = {k} (sm_90, other)");
        }
    }
}
