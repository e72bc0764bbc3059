//! Kernel launches, plain or as programmatic dependents.
//!
//! A programmatic dependent launch (sm_90) lets a kernel's blocks start
//! while the previous kernel on the stream is still running: its prologue
//! (launch, decode-table build, the first weight copies) overlaps the
//! other's tail, and its `griddepcontrol.wait` holds it back before it
//! touches activations, outputs or workspaces (`kernels-gpu/src/ptx.rs`,
//! `after_producers`). Only the GEMV and tensor-core GEMM kernels wait like
//! that; every other kernel is launched plainly.

use crate::Result;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use std::ffi::c_void;

/// Pointers to a launch's argument values, in parameter order:
/// `args![a, b, c]` for locals `a`, `b`, `c` that outlive the launch.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        [$(std::ptr::from_ref(&$a).cast_mut().cast::<std::ffi::c_void>()),*]
    };
}
pub(crate) use args;

/// Enqueues `f` on `stream`; with `programmatic`, as a programmatic
/// dependent of the work before it (`cuLaunchKernelEx`; the caller checked
/// that the device has sm_90 and that `f` reads nothing before its
/// grid-dependency wait that the previous kernel may write), otherwise as a
/// plain `cuLaunchKernel`.
///
/// # Safety
/// `args` points at values of exactly `f`'s parameter types, in order, and
/// the kernel's accesses through them stay inside their buffers.
pub(crate) unsafe fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    programmatic: bool,
    args: &mut [*mut c_void],
) -> Result<()> {
    unsafe { launch_clustered(stream, f, cfg, programmatic, 1, args) }
}

/// [`launch`] with the blocks grouped in clusters of `cluster` blocks along
/// x (sm_90; 1: no clusters), which the hardware schedules together.
///
/// # Safety
/// As [`launch`]; `cluster` divides the grid's x extent and is at most 8.
pub(crate) unsafe fn launch_clustered(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    programmatic: bool,
    cluster: u32,
    args: &mut [*mut c_void],
) -> Result<()> {
    stream.context().bind_to_thread()?;
    if !programmatic && cluster <= 1 {
        let (grid, block) = (cfg.grid_dim, cfg.block_dim);
        let (smem, cu) = (cfg.shared_mem_bytes, stream.cu_stream());
        unsafe { cudarc::driver::result::launch_kernel(f.cu_function(), grid, block, smem, cu, args) }?;
        return Ok(());
    }
    let mut serial = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: unsafe { std::mem::zeroed() },
    };
    serial.value.programmaticStreamSerializationAllowed = programmatic as i32;
    let mut attrs = [serial, cluster_attribute(cluster)];
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: if cluster > 1 { 2 } else { 1 },
    };
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }.result()?;
    Ok(())
}

/// The launch attribute that groups blocks in clusters of `x` blocks along
/// x (at least 1).
pub(crate) fn cluster_attribute(x: u32) -> sys::CUlaunchAttribute {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: unsafe { std::mem::zeroed() },
    };
    attr.value.clusterDim.x = x.max(1);
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}
