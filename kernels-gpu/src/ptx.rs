//! One `#[inline(always)]` wrapper per PTX instruction the kernels use.
//!
//! Each wrapper says why it exists and the lowest SM it needs. Shared-memory
//! addresses are 32-bit shared-window addresses (see [`smem_base`]).
#![allow(dead_code)]

use core::arch::asm;
use core::arch::nvptx::*;

// The block's dynamic shared memory: one symbol, sized at launch.
core::arch::global_asm!(".extern .shared .align 16 .b8 kbit_smem[];");

/// Thread index in the block (x). Any SM.
#[inline(always)]
pub fn tid() -> u32 {
    unsafe { _thread_idx_x() as u32 }
}
/// Block index in the grid (x). Any SM.
#[inline(always)]
pub fn bid() -> u32 {
    unsafe { _block_idx_x() as u32 }
}
/// Threads per block (x). Any SM.
#[inline(always)]
pub fn block_dim() -> u32 {
    unsafe { _block_dim_x() as u32 }
}
/// Blocks in the grid (x). Any SM.
#[inline(always)]
pub fn grid_dim() -> u32 {
    unsafe { _grid_dim_x() as u32 }
}
/// Lane of this thread in its warp.
#[inline(always)]
pub fn lane() -> u32 {
    tid() & 31
}
/// Global thread index, 64-bit so grids over > 2^32 elements index safely.
#[inline(always)]
pub fn global_tid() -> u64 {
    bid() as u64 * block_dim() as u64 + tid() as u64
}
/// Threads in the grid, the stride of grid-stride loops.
#[inline(always)]
pub fn grid_threads() -> u64 {
    grid_dim() as u64 * block_dim() as u64
}

/// `bar.sync 0`: block-wide barrier (shared-memory producer/consumer). Any SM.
#[inline(always)]
pub fn bar_sync() {
    unsafe { asm!("bar.sync 0;") }
}

/// `shfl.sync.bfly`: butterfly exchange for warp reductions. sm_30 (.sync: PTX 6.0).
#[inline(always)]
pub fn shfl_bfly(v: u32, mask: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) mask)
    }
    r
}

/// `shfl.sync.idx`: broadcast a lane's value to the warp. sm_30 (.sync: PTX 6.0).
#[inline(always)]
pub fn shfl_idx(v: u32, src: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src)
    }
    r
}

/// `vote.sync.ballot`: one bit per lane; builds a bit plane in one step. sm_30.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
             r = out(reg32) r, x = in(reg32) pred as u32)
    }
    r
}

/// Shared-window address of the dynamic shared memory. Any SM.
#[inline(always)]
pub fn smem_base() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {r}, kbit_smem;", r = out(reg32) r) }
    r
}

/// `ld.shared.f32`: codebook lookups with a data-dependent index. Any SM.
///
/// # Safety
/// `addr` is a 4-aligned shared address inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_shared_f32(addr: u32) -> f32 {
    let r: f32;
    unsafe { asm!("ld.shared.f32 {r}, [{a}];", r = out(reg32) r, a = in(reg32) addr) }
    r
}

/// `st.shared.f32`. Any SM.
///
/// # Safety
/// As [`ld_shared_f32`].
#[inline(always)]
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    unsafe { asm!("st.shared.f32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v) }
}

/// `ld.shared.v4.b32`: 16 bytes at once. Any SM.
///
/// # Safety
/// `addr` is 16-aligned and inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr)
    }
    [a, b, c, d]
}

/// `ld.global.nc.b32`: read-only data through the non-coherent path. sm_35.
///
/// # Safety
/// `p` is a valid, 4-aligned global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_u32(p: *const u32) -> u32 {
    let r: u32;
    unsafe { asm!("ld.global.nc.b32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) p) }
    r
}

/// `ld.global.nc.v2.b32`: 8-byte read-only load (2-bit planes). sm_35.
///
/// # Safety
/// As [`ld_nc_u32`], 8-aligned.
#[inline(always)]
pub unsafe fn ld_nc_v2(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ld.global.nc.v2.b32 {{{a}, {b}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, p = in(reg64) p)
    }
    [a, b]
}

/// `ld.global.nc.v4.b32`: 16-byte read-only load (4-bit planes). sm_35.
///
/// # Safety
/// As [`ld_nc_u32`], 16-aligned.
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p)
    }
    [a, b, c, d]
}

/// `ld.global.nc.u8`: one E4M4 scale byte. sm_35.
///
/// # Safety
/// `p` is a valid global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_u8(p: *const u8) -> u8 {
    let r: u16;
    unsafe { asm!("ld.global.nc.u8 {r}, [{p}];", r = out(reg16) r, p = in(reg64) p) }
    r as u8
}

/// `st.global.v4.b32`: 16-byte store, so a warp writes whole 128-byte lines. Any SM.
///
/// # Safety
/// `p` is a valid, 16-aligned global pointer.
#[inline(always)]
pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3])
    }
}

/// `red.global.min.u32`: record the first offending block without a return value. sm_32.
///
/// # Safety
/// `p` is a valid, 4-aligned global pointer.
#[inline(always)]
pub unsafe fn red_min_u32(p: *mut u32, v: u32) {
    unsafe { asm!("red.global.min.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v) }
}

/// `cvt.rn.f16.f32`: f32 → f16 bits, round to nearest even. sm_20.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let r: u16;
    unsafe { asm!("cvt.rn.f16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x) }
    r
}

/// `cvt.rn.bf16.f32`: f32 → bf16 bits, round to nearest even. sm_80.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let r: u16;
    unsafe { asm!("cvt.rn.bf16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x) }
    r
}

/// `cvt.f32.f16`: exact widening of f16 bits. sm_20.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    unsafe { asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h) }
    r
}

/// `cp.async.cg.shared.global` 16 bytes: global → shared without registers,
/// bypassing L1 (streamed tiles). sm_80.
///
/// # Safety
/// `dst` is a 16-aligned shared address, `src` a 16-aligned global pointer.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8) {
    unsafe { asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst, s = in(reg64) src) }
}

/// `cp.async.commit_group`: close the current group of async copies. sm_80.
#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;") }
}

/// `cp.async.wait_group N`: wait until at most `N` groups are in flight. sm_80.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    unsafe { asm!("cp.async.wait_group {n};", n = const N) }
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8×8 b16 matrices from
/// shared memory straight into mma A-fragment order. sm_75.
///
/// Lane `l` supplies the address of row `l % 8` of matrix `l / 8`.
///
/// # Safety
/// Every lane's `addr` is a 16-aligned shared address of an 8-element row.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr)
    }
    [a, b, c, d]
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: D = A·B + C on the
/// tensor cores, f16 inputs, f32 accumulators. sm_80.
#[inline(always)]
pub fn mma_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
             d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1],
             c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3])
    }
    [d0, d1, d2, d3]
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: as [`mma_f16`] for bf16. sm_80.
#[inline(always)]
pub fn mma_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
             d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1],
             c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3])
    }
    [d0, d1, d2, d3]
}
