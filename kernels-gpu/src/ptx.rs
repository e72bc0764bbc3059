//! One `#[inline(always)]` wrapper per PTX instruction the kernels use.
//!
//! Each wrapper says why it exists and the lowest SM it needs. Shared-memory
//! addresses are 32-bit shared-window addresses (see [`smem_base`]).
#![allow(dead_code)]

use core::arch::asm;
use core::arch::nvptx::*;

// The block's dynamic shared memory: one symbol, sized at launch. Aligned
// to 256 bytes: the GEMV's pair-sum lookups put a table offset into the low
// byte of a tile's base address with one `prmt`.
core::arch::global_asm!(".extern .shared .align 256 .b8 kbit_smem[];");

/// Thread index in the block (x). Any SM.
#[inline(always)]
pub fn tid() -> u32 {
    unsafe { _thread_idx_x() as u32 }
}
/// [`tid`] read where it is used: the compilers neither hoist nor share it
/// across a loop, so values derived from it are recomputed there instead of
/// occupying registers for the whole loop. Any SM.
#[inline(always)]
pub fn tid_here() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {r}, %tid.x;", r = out(reg32) r) }
    r
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
/// Block index in the grid (y): the expert of grouped launches. Any SM.
#[inline(always)]
pub fn bid_y() -> u32 {
    unsafe { _block_idx_y() as u32 }
}
/// Blocks in the grid (x). Any SM.
#[inline(always)]
pub fn grid_dim() -> u32 {
    unsafe { _grid_dim_x() as u32 }
}
/// `%nsmid`: one more than the largest SM id (at least the SM count;
/// ids need not be contiguous). Any SM.
#[inline(always)]
pub fn sm_id_bound() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {r}, %nsmid;", r = out(reg32) r) }
    r
}
/// `bar.warp.sync`: all lanes of the warp meet; memory they wrote before
/// is visible to the others after. sm_70.
#[inline(always)]
pub fn syncwarp() {
    unsafe { asm!("bar.warp.sync 0xffffffff;") }
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

/// `bar.sync id, threads`: named barrier among `threads` threads (whole
/// warps) of the block, for groups of warps that synchronize on their own
/// while others work on. Any SM.
#[inline(always)]
pub fn bar_sync_named(id: u32, threads: u32) {
    unsafe { asm!("bar.sync {id}, {n};", id = in(reg32) id, n = in(reg32) threads) }
}

/// Programmatic dependent launch, consumer side (`griddepcontrol.wait`,
/// sm_90): blocks until every grid this one depends on has completed and its
/// memory is visible. Code before it may only read data no earlier kernel
/// writes (weights, codebooks); activations, outputs, workspaces and
/// counters come after it, on every path of every block (a kernel that
/// exits without waiting could complete before its own producers, and a
/// later kernel that waits only on it would then race them).
///
/// The module is built for sm_89, which has no such instruction, so this
/// emits a marker comment; the host rewrites the markers into the
/// instructions when it loads the module for sm_90 or newer
/// (`kbit::module::ptx_for`). On sm_89 launches are never programmatic and
/// the comment is all there is.
#[inline(always)]
pub fn grid_dependency_wait() {
    unsafe { asm!("// kbit:griddepcontrol.wait") }
}

/// Programmatic dependent launch, producer side
/// (`griddepcontrol.launch_dependents`, sm_90): the next programmatic launch
/// on the stream may start its blocks (which run up to their own
/// [`grid_dependency_wait`]). Issued right after this kernel's own wait, so a
/// kernel two launches later never starts before this one's producers have
/// completed. A marker comment, as [`grid_dependency_wait`].
#[inline(always)]
pub fn launch_dependents() {
    unsafe { asm!("// kbit:griddepcontrol.launch_dependents") }
}

/// [`grid_dependency_wait`], then [`launch_dependents`]: the point after
/// which a kernel may touch data that earlier kernels produce or consume.
#[inline(always)]
pub fn after_producers() {
    grid_dependency_wait();
    launch_dependents();
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

// `redux.sync.{add,min,max}.u32` over the whole warp: every lane gets the
// sum, minimum or maximum of all lanes' `v` in one instruction. sm_80.
macro_rules! warp_redux {
    ($($name:ident $op:literal;)*) => {$(
        #[doc = concat!("`redux.sync.", $op, ".u32`: the warp-wide result of all 32 lanes' `v`, in every lane. sm_80.")]
        #[inline(always)]
        pub fn $name(v: u32) -> u32 {
            let r: u32;
            unsafe {
                asm!(concat!("redux.sync.", $op, ".u32 {r}, {v}, 0xffffffff;"),
                     r = out(reg32) r, v = in(reg32) v)
            }
            r
        }
    )*};
}
warp_redux! {
    warp_sum_u32 "add";
    warp_min_u32 "min";
    warp_max_u32 "max";
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

/// `ld.global.nc.L2::256B.v2.b32`: 8-byte read-only load whose L2 miss
/// fetches the whole aligned 256-byte span from DRAM. For a stream whose neighbouring
/// bytes other warps read soon after (the runtime layout read along K: a
/// column's tile is 8·k bytes, its neighbours the next columns'), one DRAM
/// burst then serves them all. sm_75.
///
/// # Safety
/// As [`ld_nc_u32`], 8-aligned.
#[inline(always)]
pub unsafe fn ld_nc_v2_l2_256(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ld.global.nc.L2::256B.v2.b32 {{{a}, {b}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, p = in(reg64) p)
    }
    [a, b]
}

/// `ld.global.nc.L2::256B.v4.b32`: [`ld_nc_v4`] with the 256-byte L2 fetch
/// of [`ld_nc_v2_l2_256`]. sm_75.
///
/// # Safety
/// As [`ld_nc_v4`].
#[inline(always)]
pub unsafe fn ld_nc_v4_l2_256(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.L2::256B.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
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

/// Generates predicated forms of the read-only loads, `@p ld.global.nc…`:
/// without `p` nothing is read and no branch is taken. `inout` forms load
/// into the registers of `old`, which come back unchanged without `p`;
/// `out` forms leave their registers' previous contents, i.e. bits the
/// caller must accept as arbitrary (plane words, where every bit pattern
/// is a valid block). A kernel that loads the next step's weights while
/// the current ones compute keeps a finite block in place of one past N
/// or K this way, with no zeroing and no copy.
macro_rules! ld_nc_if {
    ($(#[$doc:meta])* $name:ident, $ptr:ty, $op:literal, inout, $($r:ident),+) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// When `pred`: `p` is a valid global pointer, aligned to the load's
        /// width, not written during the kernel.
        #[inline(always)]
        pub unsafe fn $name(p: *const $ptr, pred: bool, old: [u32; ld_nc_if!(@count $($r)+)]) -> [u32; ld_nc_if!(@count $($r)+)] {
            let [$(mut $r),+] = old;
            unsafe {
                asm!(ld_nc_if!(@asm $op, $($r)+), $($r = inout(reg32) $r,)+ c = in(reg32) pred as u32, p = in(reg64) p)
            }
            [$($r),+]
        }
    };
    ($(#[$doc:meta])* $name:ident, $ptr:ty, $op:literal, out, $($r:ident),+) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// When `pred`: `p` is a valid global pointer, aligned to the load's
        /// width, not written during the kernel.
        #[inline(always)]
        pub unsafe fn $name(p: *const $ptr, pred: bool) -> [u32; ld_nc_if!(@count $($r)+)] {
            $(let $r: u32;)+
            unsafe {
                asm!(ld_nc_if!(@asm $op, $($r)+), $($r = out(reg32) $r,)+ c = in(reg32) pred as u32, p = in(reg64) p)
            }
            [$($r),+]
        }
    };
    (@asm $op:literal, $($r:ident)+) => {
        concat!("{{ .reg .pred p; setp.ne.b32 p, {c}, 0; @p ", $op, " {{", ld_nc_if!(@list $($r)+), "}}, [{p}]; }}")
    };
    (@count $a:ident) => { 1 };
    (@count $a:ident $b:ident) => { 2 };
    (@count $a:ident $b:ident $c:ident $d:ident) => { 4 };
    (@list $a:ident) => { "{a}" };
    (@list $a:ident $b:ident) => { "{a}, {b}" };
    (@list $a:ident $b:ident $c:ident $d:ident) => { "{a}, {b}, {c2}, {d}" };
}

ld_nc_if!(
    /// `@p ld.global.nc.u8` into 32 bits (zero-extended) over `old`: one
    /// E4M4 scale byte. sm_35.
    ld_nc_u8_if,
    u8,
    "ld.global.nc.u8",
    inout,
    a
);
ld_nc_if!(
    /// `@p ld.global.nc.b32`: arbitrary bits without `p`. sm_35.
    ld_nc_u32_if,
    u32,
    "ld.global.nc.b32",
    out,
    a
);
ld_nc_if!(
    /// `@p ld.global.nc.L2::256B.v2.b32` (see [`ld_nc_v2_l2_256`]):
    /// arbitrary bits without `p`. sm_75.
    ld_nc_v2_l2_256_if,
    u32,
    "ld.global.nc.L2::256B.v2.b32",
    out,
    a,
    b
);
ld_nc_if!(
    /// `@p ld.global.nc.v4.b32`: arbitrary bits without `p`. sm_35.
    ld_nc_v4_if,
    u32,
    "ld.global.nc.v4.b32",
    out,
    a,
    b,
    c2,
    d
);

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

/// `cvt.rn.f16x2.f32`: two f32 → one f16 pair (`lo` in bits 0..16), each
/// rounded to nearest even: one conversion for two values. sm_80.
#[inline(always)]
pub fn f32x2_to_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe { asm!("cvt.rn.f16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo) }
    r
}

/// `cvt.rn.bf16x2.f32`: two f32 → one bf16 pair (`lo` in bits 0..16), each
/// rounded to nearest even. sm_80.
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe { asm!("cvt.rn.bf16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo) }
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

/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`: two 8×8 b16 matrices, rows
/// addressed by lanes 0-7 and 8-15. sm_75.
///
/// # Safety
/// The `addr` of lanes 0-15 is a 16-aligned shared address of an 8-element row.
#[inline(always)]
pub unsafe fn ldmatrix_x2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{a}, {b}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr)
    }
    [a, b]
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

// ---- Wrappers used by the tensor-core GEMM (mma.rs) -------------------------

/// `prefetch.global.L2`: brings the 128-byte line holding `p` into L2
/// without waiting for it or tying up a register or a `cp.async` group.
/// Any SM.
///
/// # Safety
/// `p` points into a global allocation.
#[inline(always)]
pub unsafe fn prefetch_l2(p: *const u8) {
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p) }
}

/// `cp.async.cg.shared.global` 16 bytes of which only `src_size` (0..=16)
/// are read; the rest of the 16 shared bytes are zero-filled. Masks rows past
/// M, columns past K and columns past N without branches around the copy. sm_80.
///
/// # Safety
/// `dst` is a 16-aligned shared address; `src` is a 16-aligned global
/// pointer valid for `src_size` bytes.
#[inline(always)]
pub unsafe fn cp_async_16_zfill(dst: u32, src: *const u8, src_size: u32) {
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_size)
    }
}

/// [`cp_async_16`] under a guard predicate (copies only when `copy`, a
/// predicated `cp.async` with no branch around it) that writes 16 zero
/// bytes instead of reading `src` when `zero` (`cp.async`'s ignore-src
/// predicate: no src-size operand, no address arithmetic). sm_80, PTX 7.5.
///
/// # Safety
/// When `copy`: `dst` is a 16-aligned shared address; `src` is a 16-aligned
/// global pointer, readable unless `zero`.
#[inline(always)]
pub unsafe fn cp_async_16_if_or_zero(dst: u32, src: *const u8, copy: bool, zero: bool) {
    unsafe {
        asm!("{{ .reg .pred p, z; setp.ne.b32 p, {c}, 0; setp.ne.b32 z, {z}, 0; @p cp.async.cg.shared.global [{d}], [{s}], 16, z; }}",
             d = in(reg32) dst, s = in(reg64) src, c = in(reg32) copy as u32, z = in(reg32) zero as u32)
    }
}

/// `createpolicy.fractional.L2::evict_first.b64`: an L2 policy that marks
/// every line it touches as first to evict (streamed weights). sm_80.
#[inline(always)]
pub fn policy_evict_first() -> u64 {
    let r: u64;
    unsafe { asm!("createpolicy.fractional.L2::evict_first.b64 {r}, 1.0;", r = out(reg64) r) }
    r
}

/// `cp.async.wait_group n` for a block-uniform run-time `n` (the pipeline
/// depth is chosen by the host, up to 12 stages); `n` past 10 waits for
/// everything. sm_80.
#[inline(always)]
pub fn cp_async_wait_dyn(n: u32) {
    match n {
        0 => cp_async_wait::<0>(),
        1 => cp_async_wait::<1>(),
        2 => cp_async_wait::<2>(),
        3 => cp_async_wait::<3>(),
        4 => cp_async_wait::<4>(),
        5 => cp_async_wait::<5>(),
        6 => cp_async_wait::<6>(),
        7 => cp_async_wait::<7>(),
        8 => cp_async_wait::<8>(),
        9 => cp_async_wait::<9>(),
        10 => cp_async_wait::<10>(),
        _ => cp_async_wait::<0>(),
    }
}

/// `ld.shared.b32`: codebook-table lookups and plane words. Any SM.
///
/// # Safety
/// `addr` is a 4-aligned shared address inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let r: u32;
    unsafe { asm!("ld.shared.b32 {r}, [{a}];", r = out(reg32) r, a = in(reg32) addr) }
    r
}

/// `ld.shared.v2.b32`: the 2 plane words of a 2-bit block, or an 8-byte
/// entry of a split decode table, in one access. Any SM.
///
/// # Safety
/// `addr` is an 8-aligned shared address inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe { asm!("ld.shared.v2.b32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr) }
    [a, b]
}

/// `ld.shared.v2.b32` of a value that stays put while it is read (a
/// block's parked constants): a pure read, so the compilers may merge
/// repeated loads between two writes to memory, or drop unused ones. Any SM.
///
/// # Safety
/// As [`ld_shared_v2`]; nothing writes the 8 bytes while the kernel reads them.
#[inline(always)]
pub unsafe fn ld_shared_v2_const(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ld.shared.v2.b32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr,
             options(pure, readonly, nostack))
    }
    [a, b]
}

/// `ld.shared.b32` of a value that stays put while it is read; see
/// [`ld_shared_v2_const`]. Any SM.
///
/// # Safety
/// As [`ld_shared_u32`]; nothing writes the 4 bytes while the kernel reads them.
#[inline(always)]
pub unsafe fn ld_shared_u32_const(addr: u32) -> u32 {
    let r: u32;
    unsafe { asm!("ld.shared.b32 {r}, [{a}];", r = out(reg32) r, a = in(reg32) addr, options(pure, readonly, nostack)) }
    r
}

/// `ld.shared.u8`: one E4M4 scale byte. Any SM.
///
/// # Safety
/// `addr` is a shared address inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_shared_u8(addr: u32) -> u32 {
    let r: u32;
    unsafe { asm!("ld.shared.u8 {r}, [{a}];", r = out(reg32) r, a = in(reg32) addr) }
    r
}

/// `st.shared.b32`: the split-K flag. Any SM.
///
/// # Safety
/// `addr` is a 4-aligned shared address inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    unsafe { asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v) }
}

/// `st.shared.v4.b32`: 16 bytes (table replication, epilogue exchange). Any SM.
///
/// # Safety
/// `addr` is a 16-aligned shared address inside the dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    unsafe {
        asm!("st.shared.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3])
    }
}

/// `ld.global.cg.v4.b32`: 16 bytes through L2 only, never a stale L1 line;
/// reads split-K partials that other blocks wrote during this kernel. Any SM.
///
/// # Safety
/// `p` is a valid, 16-aligned global pointer.
#[inline(always)]
pub unsafe fn ld_cg_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.cg.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p)
    }
    [a, b, c, d]
}

/// `st.global.cg.v4.b32`: a split-K partial, cached in L2 only (another
/// block reads it). Any SM.
///
/// # Safety
/// `p` is a valid, 16-aligned global pointer.
#[inline(always)]
pub unsafe fn st_cg_v4(p: *mut u32, v: [u32; 4]) {
    unsafe {
        asm!("st.global.cg.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3])
    }
}

/// `fence.acq_rel.gpu`: orders this thread's earlier memory operations
/// before its later ones for every thread of the GPU (publishing split-K
/// partials before the arrival count, and reading them after it). sm_70.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    unsafe { asm!("fence.acq_rel.gpu;") }
}

/// `atom.acq_rel.gpu.global.add.u32`: the split-K arrival counter; returns
/// the previous count. Release publishes this block's partial (after a
/// fence and a barrier), acquire makes the others' visible to the last one. sm_70.
///
/// # Safety
/// `p` is a valid, 4-aligned global pointer.
#[inline(always)]
pub unsafe fn atom_add_acq_rel_gpu(p: *mut u32, v: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {r}, [{p}], {v};", r = out(reg32) r, p = in(reg64) p, v = in(reg32) v)
    }
    r
}

/// `st.relaxed.gpu.global.u32`: resets a split-K counter (a strong store, so
/// no other block can still observe the old count through a stale line). sm_70.
///
/// # Safety
/// `p` is a valid, 4-aligned global pointer.
#[inline(always)]
pub unsafe fn st_relaxed_gpu_u32(p: *mut u32, v: u32) {
    unsafe { asm!("st.relaxed.gpu.global.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v) }
}

/// `mul.rn.f16x2`: two f16 products, each rounded once to nearest even
/// (codebook value × block scale, exactly `T(T(cb)·T(amax))`). sm_53.
#[inline(always)]
pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    let r: u32;
    unsafe { asm!("mul.rn.f16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b) }
    r
}

/// `fma.rn.bf16x2`: two bf16 `a·b + c`, each rounded once; with `c = −0`
/// it is the correctly rounded product (`mul.bf16x2` needs sm_90). sm_80.
#[inline(always)]
pub fn fma_bf16x2(a: u32, b: u32, c: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("fma.rn.bf16x2 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c)
    }
    r
}

// ---- Wrappers used by the scalar GEMV (gemv.rs) ------------------------------

/// `ld.global.nc.L1::evict_first.L2::cache_hint.v4.b32`: 16 bytes of weight
/// planes, read once: evict-first in L1 and, with the policy from
/// [`policy_evict_first`], in L2. sm_80.
///
/// # Safety
/// `p` is a valid, 16-aligned global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_stream_v4(p: *const u32, policy: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.L1::evict_first.L2::cache_hint.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}], {q};",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p, q = in(reg64) policy)
    }
    [a, b, c, d]
}

/// As [`ld_stream_v4`], 8 bytes (3- and 5-bit planes are only 8-aligned). sm_80.
///
/// # Safety
/// `p` is a valid, 8-aligned global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_stream_v2(p: *const u32, policy: u64) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ld.global.nc.L1::evict_first.L2::cache_hint.v2.b32 {{{a}, {b}}}, [{p}], {q};",
             a = out(reg32) a, b = out(reg32) b, p = in(reg64) p, q = in(reg64) policy)
    }
    [a, b]
}

/// As [`ld_stream_v4`], 1 byte: the E4M4 scale byte of a lane's quant block. sm_80.
///
/// # Safety
/// `p` is a valid global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_stream_u8(p: *const u8, policy: u64) -> u32 {
    let r: u16;
    unsafe {
        asm!("ld.global.nc.L1::evict_first.L2::cache_hint.u8 {r}, [{p}], {q};",
             r = out(reg16) r, p = in(reg64) p, q = in(reg64) policy)
    }
    r as u32
}

/// As [`ld_stream_v4`], 2 bytes: the two E4M4 scale bytes of a column's K tile. sm_80.
///
/// # Safety
/// `p` is a valid, 2-aligned global pointer not written during the kernel.
#[inline(always)]
pub unsafe fn ld_stream_u16(p: *const u16, policy: u64) -> u16 {
    let r: u16;
    unsafe {
        asm!("ld.global.nc.L1::evict_first.L2::cache_hint.b16 {r}, [{p}], {q};",
             r = out(reg16) r, p = in(reg64) p, q = in(reg64) policy)
    }
    r
}

/// `prmt.b32`: byte permute; with `b = 0` and selector `0x444m` it extracts
/// byte `m` of `a` zero-extended, one instruction per decode-table field. Any SM.
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("prmt.b32 {r}, {a}, {b}, {s};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, s = in(reg32) sel,
             options(pure, nomem, nostack))
    }
    r
}

/// `mul.rn.f32`: a product rounded once, never contracted into an FMA by
/// ptxas (the GEMV's dequantized weight `f32(cb · scale)`). Any SM.
#[inline(always)]
pub fn mul_rn_f32(a: f32, b: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("mul.rn.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    }
    r
}

/// `add.rn.f32`: a sum rounded once (fixed-order reductions). Any SM.
#[inline(always)]
pub fn add_rn_f32(a: f32, b: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("add.rn.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    }
    r
}

/// `fma.rn.f32`: `a·b + c` rounded once (the GEMV's accumulation). Any SM.
#[inline(always)]
pub fn fma_rn_f32(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(pure, nomem, nostack))
    }
    r
}
