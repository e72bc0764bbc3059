//! The [`Context`]: one device, one stream, the loaded kernels, device facts.

use crate::module::{CODEBOOK_SMEM, GRID_STRIDE_THREADS, Kernels, Streaming};
use crate::{Error, Result};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Facts about the device that launch geometry and tuning are chosen from.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// L2 cache bytes.
    pub l2_bytes: usize,
    /// Shared memory per block with opt-in, bytes.
    pub max_smem_per_block: usize,
    /// Shared memory per SM, bytes (how many blocks of a size fit at once).
    pub max_smem_per_sm: usize,
    /// Device memory bytes.
    pub total_mem: usize,
}

/// Shared memory the hardware sets aside per resident block (sm_80 on).
pub(crate) const SMEM_RESERVED_PER_BLOCK: usize = 1024;

/// Most loop iterations per thread of a [`Streaming`] launch
/// ([`Context::grid_resident`]).
const STREAMING_MAX_TRIPS: u64 = 16;

/// Status words the kernels report data errors through (first offending
/// block, `u32::MAX` = none), read back by [`Context::synchronize`].
pub(crate) const STATUS_NONFINITE: usize = 0;
pub(crate) const STATUS_SCALE: usize = 1;
pub(crate) const STATUS_EXPERT_ROWS: usize = 2;
const STATUS_WORDS: usize = 3;

/// Owns a CUDA context and stream, the kbit kernels loaded from the
/// embedded PTX, and the device facts. Every operation is enqueued on
/// [`Context::stream`] and returns without waiting for the GPU, except those
/// documented to synchronize (downloads and [`Context::synchronize`]).
///
/// ```no_run
/// let ctx = kbit::Context::new(0)?;
/// println!("{} with {} SMs", ctx.info().name, ctx.info().sm_count);
/// # Ok::<(), kbit::Error>(())
/// ```
pub struct Context {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub(crate) kernels: Kernels,
    status: CudaSlice<u32>,
    info: DeviceInfo,
    pub(crate) linear: crate::linear::LinearState,
    /// Tensor-core GEMM launch table and split-K workspace (host/mma.rs).
    pub(crate) mma: crate::mma::MmaState,
    /// GEMV and tensor-core GEMM launches are programmatic dependents
    /// (host/launch.rs): the device has sm_90 and the user did not opt out.
    programmatic: bool,
    /// A weight was written on the stream since the last GEMV or GEMM
    /// launch: the next one is launched plainly, because those kernels read
    /// weights before their grid-dependency wait.
    weights_written: AtomicBool,
}

impl Context {
    /// Opens device `ordinal` with a new stream and loads the kernels.
    ///
    /// The kernels are PTX, which the driver compiles for the GPU when they
    /// are loaded: the first time on a machine that takes about a minute on
    /// an H100 (the sm_90 module with the warpgroup kernels); the driver keeps
    /// the result in its compute cache (`~/.nv/ComputeCache`, see
    /// `CUDA_CACHE_PATH`), and later loads take about a second.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when the CUDA driver library is not installed or
    /// the device does not exist; driver errors otherwise.
    ///
    /// ```no_run
    /// match kbit::Context::new(0) {
    ///     Ok(ctx) => println!("running on {}", ctx.info().name),
    ///     Err(kbit::Error::NoDevice(why)) => eprintln!("no GPU: {why}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = Self::device_count()?;
        if ordinal >= count {
            return Err(Error::NoDevice(format!("device {ordinal} requested, {count} present")));
        }
        let ctx = CudaContext::new(ordinal)?;
        // Everything kbit does is ordered on one stream; cudarc's per-buffer
        // event tracking would add event records to every launch and get in
        // the way of graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        Self::with_stream(stream)
    }

    /// The number of CUDA devices, without opening any (nothing is loaded).
    ///
    /// # Errors
    /// [`Error::NoDevice`] when the CUDA driver library is not installed or
    /// the driver cannot count its devices.
    ///
    /// ```
    /// match kbit::Context::device_count() {
    ///     Ok(n) => println!("{n} CUDA device(s)"),
    ///     Err(e) => println!("no CUDA driver here: {e}"),
    /// }
    /// ```
    pub fn device_count() -> Result<usize> {
        // cudarc's dynamic loader panics if libcuda is absent: ask first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDevice("the CUDA driver library (libcuda.so) is not installed".into()));
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoDevice(e.to_string()))?;
        Ok(count.max(0) as usize)
    }

    /// Uses an existing stream (e.g. one shared with candle or another
    /// engine). Work is enqueued on it in call order.
    ///
    /// ```no_run
    /// use kbit::cudarc::driver::CudaContext;
    /// let stream = CudaContext::new(0)?.new_stream()?; // e.g. the stream another engine uses
    /// let ctx = kbit::Context::with_stream(stream.clone())?;
    /// assert!(std::sync::Arc::ptr_eq(ctx.stream(), &stream));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
        let attr = |a| ctx.attribute(a);
        let info = DeviceInfo {
            name: ctx.name()?,
            compute_capability: ctx.compute_capability()?,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            max_smem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize,
            max_smem_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as usize,
            total_mem: ctx.total_mem()?,
        };
        let kernels = Kernels::load(&ctx, info.compute_capability)?;
        let status = stream.clone_htod(&[u32::MAX; STATUS_WORDS])?;
        let mma = crate::mma::MmaState::new(&stream, &kernels, &info)?;
        let programmatic = crate::module::programmatic_launch(info.compute_capability);
        Ok(Self {
            ctx,
            stream,
            kernels,
            status,
            info,
            linear: Default::default(),
            mma,
            programmatic,
            weights_written: AtomicBool::new(false),
        })
    }

    /// Whether the GEMV and tensor-core GEMM kernels are launched as
    /// programmatic dependents of the work before them on the stream. On
    /// from sm_90 (off below, where the hardware lacks it): a kernel's launch
    /// and prologue (decode table; the GEMV's first weight copies) then overlap the
    /// previous kernel's tail, and the kernel waits for that kernel to
    /// complete before it reads activations or writes anything. Results are
    /// the same either way; CUDA-graph capture keeps the overlap.
    ///
    /// ```no_run
    /// let mut ctx = kbit::Context::new(0)?;
    /// let on = ctx.programmatic_launch();
    /// ctx.set_programmatic_launch(false); // every launch waits for the one before
    /// assert!(!ctx.programmatic_launch());
    /// # let _ = on;
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// Turns programmatic launches on or off (see
    /// [`Context::programmatic_launch`]); returns the setting in effect,
    /// which stays off on GPUs before sm_90.
    ///
    /// ```no_run
    /// let mut ctx = kbit::Context::new(0)?;
    /// let on = ctx.set_programmatic_launch(true);
    /// assert_eq!(on, ctx.info().compute_capability >= (9, 0)); // stays off before sm_90
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn set_programmatic_launch(&mut self, on: bool) -> bool {
        self.programmatic = on && crate::module::programmatic_launch(self.info.compute_capability);
        self.programmatic
    }

    /// Whether the GEMV or GEMM launch `cfg` being enqueued now, of which
    /// `per_sm` blocks fit on one SM, is programmatic (clears the
    /// weight-written mark); may raise its dynamic shared memory.
    ///
    /// A programmatic launch's blocks are placed while the previous kernel
    /// still holds part of the GPU, wherever there is room, so an SM could
    /// get more of them than the `ceil(grid / SMs)` a launch onto an idle
    /// GPU gives it: Llama-3-8B gate/up at k = 2 in the tensor-core kernel
    /// (224 blocks, 3 per SM fit) ran 32 % slower that way
    /// (bench-results/NOTES.md). Where that could happen (more blocks than
    /// SMs, more resident per SM than the share), the launch asks for
    /// enough shared memory that no more than the share fit (the kernels
    /// take their layout from their arguments, never from the size); where
    /// that is more than a block may have, it stays plain.
    pub(crate) fn programmatic_now(&self, cfg: &mut LaunchConfig, per_sm: u32) -> bool {
        let written = self.weights_written.swap(false, Ordering::Relaxed);
        if !self.programmatic || written {
            return false;
        }
        let (grid, sms) = (cfg.grid_dim.0, self.info.sm_count.max(1));
        let share = grid.div_ceil(sms);
        if grid <= sms || per_sm <= share {
            return true;
        }
        // (share + 1)·(bytes + reserved) must exceed the SM's shared memory.
        let bytes = (self.info.max_smem_per_sm / (share as usize + 1) + 1).saturating_sub(SMEM_RESERVED_PER_BLOCK);
        let bytes = bytes.next_multiple_of(128).max(cfg.shared_mem_bytes as usize);
        if bytes > self.info.max_smem_per_block {
            return false;
        }
        cfg.shared_mem_bytes = bytes as u32;
        true
    }

    /// Marks that a weight was written on the stream (see `weights_written`).
    pub(crate) fn weights_written(&self) {
        self.weights_written.store(true, Ordering::Relaxed);
    }

    /// The device facts.
    ///
    /// ```no_run
    /// let ctx = kbit::Context::new(0)?;
    /// let (major, minor) = ctx.info().compute_capability;
    /// println!("{} (sm_{major}{minor}, {} SMs)", ctx.info().name, ctx.info().sm_count);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The stream all work is enqueued on.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// // Buffers made on this stream are ordered with the kbit work enqueued on it.
    /// let x = ctx.stream().clone_htod(&vec![half::f16::ONE; 4096])?;
    /// let mut y = ctx.stream().alloc_zeros::<half::f16>(4096)?;
    /// # let _ = (x, &mut y);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// let (free, total) = ctx.cuda().mem_get_info()?;
    /// println!("{} of {} MiB free", free >> 20, total >> 20);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Waits for all enqueued work, then reports (and clears) data errors
    /// that kernels found since the last check: [`Error::NonFinite`] from a
    /// quantize, [`Error::ScaleRange`] from a repack, [`Error::ExpertRows`]
    /// from an `expert_linear`, `grouped_gemv` or `grouped_mma` whose `max_m`
    /// was too small.
    ///
    /// ```no_run
    /// # let ctx = kbit::Context::new(0)?;
    /// # let shape = kbit::Shape::new(64, 64)?;
    /// let mut w = vec![half::f16::ONE; shape.numel()];
    /// w[100] = half::f16::NAN;
    /// let w = ctx.stream().clone_htod(&w)?;
    /// let _flat = ctx.quantize(&w, shape, &kbit::Codebook::nf(4)?)?; // Ok: only enqueued
    /// assert!(matches!(ctx.synchronize(), Err(kbit::Error::NonFinite { .. })));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        self.check_status()
    }

    /// Reads the status words (the stream must be idle) and resets them.
    fn check_status(&self) -> Result<()> {
        let s = self.stream.clone_dtoh(&self.status)?;
        if s.iter().all(|&w| w == u32::MAX) {
            return Ok(());
        }
        // Reset to "no error" (all bytes 0xFF).
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.status_ptr(0),
                0xFF,
                4 * STATUS_WORDS,
                self.stream.cu_stream(),
            )?;
        }
        self.stream.synchronize()?;
        let bad = s[STATUS_NONFINITE];
        if bad != u32::MAX {
            return Err(Error::NonFinite { block: bad as usize, position: None });
        }
        let bad = s[STATUS_SCALE];
        if bad != u32::MAX {
            return Err(Error::ScaleRange { block: bad as usize, value: None });
        }
        Err(Error::ExpertRows { expert: s[STATUS_EXPERT_ROWS] as usize })
    }

    pub(crate) fn status_ptr(&self, word: usize) -> u64 {
        let (p, _) = cudarc::driver::DevicePtr::device_ptr(&self.status, &self.stream);
        p + 4 * word as u64
    }

    /// A grid-stride launch of `threads` threads in blocks of 256, capped at
    /// 32 blocks per SM (8 resident 256-thread blocks × 4 waves), with
    /// `smem` bytes of dynamic shared memory.
    pub(crate) fn grid_stride(&self, threads: u64, smem: u32) -> LaunchConfig {
        let t = GRID_STRIDE_THREADS;
        let blocks = threads.div_ceil(t as u64).clamp(1, self.info.sm_count as u64 * 32) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (t, 1, 1), shared_mem_bytes: smem }
    }

    /// The launch of `threads` threads of a [`Streaming`] kernel when
    /// `share` launches of that size (the experts of a grouped call, along
    /// `gridDim.y`) run side by side: their share of one round of resident
    /// blocks, so that every thread is resident from the start and its loop
    /// (which keeps the next iteration's loads in flight), not a second
    /// wave of blocks, takes the rest; but at most [`STREAMING_MAX_TRIPS`]
    /// iterations per thread, past which more blocks are launched, in
    /// waves. On the H100 the dequantize of 8192×28672 at odd k ran 4 %
    /// slower with one round (≈ 110 iterations per thread) than in waves,
    /// with or without the loads in flight.
    pub(crate) fn grid_resident(&self, threads: u64, k: &Streaming, share: u64) -> LaunchConfig {
        let blocks = threads.div_ceil(GRID_STRIDE_THREADS as u64);
        let round = (self.info.sm_count as u64 * k.per_sm as u64 / share.max(1)).max(1);
        let blocks = blocks.clamp(1, round.max(blocks.div_ceil(STREAMING_MAX_TRIPS))).min(u32::MAX as u64) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GRID_STRIDE_THREADS, 1, 1),
            shared_mem_bytes: CODEBOOK_SMEM,
        }
    }
}
