//! Wrappers of the sm_90a instructions of the warpgroup tensor-core GEMM
//! (`wgmma`): asynchronous warpgroup MMA and its groups, the tensor copy
//! (TMA) and the `mbarrier` operations of the pipeline.
//!
//! Only entries of the sm_90a module use them (`kbit::module`): the
//! sm_89 module leaves those entries out, so its PTX never contains these
//! instructions.

use core::arch::asm;

/// `asm!` with `templates`, then the operands of a tile's MMAs in this
/// order: the accumulators `d[i]` as `{i}` (read and written), the A
/// registers `a[s][r]` as `{64 + 4s + r}` (read), then `extra`. The MMAs
/// and the wait that retires them name the same registers through it.
macro_rules! tile_asm {
    ($d:ident, $a:ident; $($tmpl:expr),+; $($extra:tt)*) => {
        tile_asm!(@ $d, $a, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]; $($tmpl),+; $($extra)*)
    };
    (@ $d:ident, $a:ident, [$($i:literal)*]; $($tmpl:expr),+; $($extra:tt)*) => {
        asm!(
            $($tmpl),+,
            $(inout(reg32) $d[$i],)*
            in(reg32) $a[0][0], in(reg32) $a[0][1], in(reg32) $a[0][2], in(reg32) $a[0][3],
            in(reg32) $a[1][0], in(reg32) $a[1][1], in(reg32) $a[1][2], in(reg32) $a[1][3],
            in(reg32) $a[2][0], in(reg32) $a[2][1], in(reg32) $a[2][2], in(reg32) $a[2][3],
            in(reg32) $a[3][0], in(reg32) $a[3][1], in(reg32) $a[3][2], in(reg32) $a[3][3],
            $($extra)*
        )
    };
}

/// The operand names `{0}` … `{79}` of [`tile_asm!`] in a PTX comment, so
/// that a wait names every register of the group it retires.
macro_rules! named_operands {
    () => {
        "// {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15} {16} {17} {18} {19} {20} {21} {22} {23} {24} {25} {26} {27} {28} {29} {30} {31} {32} {33} {34} {35} {36} {37} {38} {39} {40} {41} {42} {43} {44} {45} {46} {47} {48} {49} {50} {51} {52} {53} {54} {55} {56} {57} {58} {59} {60} {61} {62} {63} {64} {65} {66} {67} {68} {69} {70} {71} {72} {73} {74} {75} {76} {77} {78} {79}"
    };
}

/// `wgmma.wait_group.sync.aligned N` that names the registers of the group
/// it retires (the oldest pending one when N = 1, every one when N = 0):
/// the accumulators `d` as read and written, that group's A registers `a`
/// as read. To the compilers the MMAs' results then appear here, and their
/// A registers stay live until here, so no instruction reads `d` outside a
/// wait or reuses those A registers while their MMAs run. With N = 1 the
/// group issued last keeps running (it accumulates into the same `d`,
/// which the hardware orders). sm_90a.
#[inline(always)]
pub fn wgmma_wait<const N: u32>(d: &mut [f32; 64], a: &[[u32; 4]; 4]) {
    unsafe {
        tile_asm!(
            d, a;
            "wgmma.wait_group.sync.aligned {n};",
            named_operands!();
            n = const N,
        )
    }
}

/// The accumulator vector `{d0, …, d63}` of a `wgmma` in [`tile_asm!`]'s
/// operand names, with the comma that follows it.
macro_rules! d_operands {
    () => {
        "{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}}},"
    };
}

/// One `wgmma.mma_async.sync.aligned.m64n128k16.f32.<ty>.<ty>` of
/// [`tile_asm!`]'s operands: the accumulators, then `a_and_b` (the step's A
/// registers and its B descriptor), the scale-d predicate `p` and unit
/// scales, no transpose.
macro_rules! k16_step {
    ($ty:literal, $a_and_b:literal) => {
        concat!(
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.",
            $ty,
            ".",
            $ty,
            "\n",
            d_operands!(),
            "\n",
            $a_and_b,
            ", p, 1, 1, 0;"
        )
    };
}

/// One K tile (four k16 steps) of `wgmma.mma_async.sync.aligned.m64n128k16.f32.<T>.<T>`
/// with A in registers, as one group: `wgmma.fence`, D[64×128] += A_s[64×16] ·
/// B_s[16×128] for s = 0..4, `wgmma.commit_group`. f32 accumulators; B_s
/// read from shared memory through the descriptor `b[s]` (K-major, not
/// transposed). One `asm` block, so that no other instruction defines an
/// operand between the MMAs (ptxas would serialize them). Asynchronous: `a`
/// and `d` are not to be touched until [`wgmma_wait_all`]. sm_90a.
macro_rules! wgmma_m64n128k64 {
    ($name:ident, $ty:literal) => {
        #[doc = concat!("Four `wgmma.mma_async.sync.aligned.m64n128k16.f32.", $ty, ".", $ty, "` as one group (see the macro's notes). sm_90a.")]
        #[inline(always)]
        pub fn $name(d: &mut [f32; 64], a: &[[u32; 4]; 4], b: [u64; 4]) {
            unsafe {
                tile_asm!(
                    d, a;
                    "{{ .reg .pred p; setp.ne.b32 p, {84}, 0;",
                    "wgmma.fence.sync.aligned;",
                    k16_step!($ty, "{{{64}, {65}, {66}, {67}}}, {80}"),
                    k16_step!($ty, "{{{68}, {69}, {70}, {71}}}, {81}"),
                    k16_step!($ty, "{{{72}, {73}, {74}, {75}}}, {82}"),
                    k16_step!($ty, "{{{76}, {77}, {78}, {79}}}, {83}"),
                    "wgmma.commit_group.sync.aligned; }}";
                    in(reg64) b[0],
                    in(reg64) b[1],
                    in(reg64) b[2],
                    in(reg64) b[3],
                    in(reg32) 1u32,
                )
            }
        }
    };
}

wgmma_m64n128k64!(wgmma_m64n128k64_f16, "f16");
wgmma_m64n128k64!(wgmma_m64n128k64_bf16, "bf16");

/// `mbarrier.init.shared.b64 [bar], count`: a barrier object at shared
/// address `bar` (8-aligned) whose phases complete after `count` arrivals.
/// Publish it to the block (a block barrier) before anyone else uses it.
/// sm_80.
///
/// # Safety
/// `bar` is 8 bytes of shared memory that no one else uses meanwhile.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    unsafe { asm!("mbarrier.init.shared.b64 [{b}], {n};", b = in(reg32) bar, n = in(reg32) count) }
}

/// `mbarrier.arrive.shared.b64`: one arrival on the barrier at `bar`, with
/// release semantics (this thread's earlier memory accesses happen before
/// the phase completes). sm_80.
///
/// # Safety
/// `bar` is an initialized barrier object.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    unsafe { asm!("{{ .reg .b64 s; mbarrier.arrive.shared.b64 s, [{b}]; }}", b = in(reg32) bar) }
}

/// `cp.async.mbarrier.arrive.noinc.shared.b64`: one arrival on the barrier
/// at `bar` once every `cp.async` this thread issued before has landed
/// (counted in the barrier's arrivals, not added to them). sm_80.
///
/// # Safety
/// `bar` is an initialized barrier object.
#[inline(always)]
pub unsafe fn cp_async_mbarrier_arrive(bar: u32) {
    unsafe { asm!("cp.async.mbarrier.arrive.noinc.shared.b64 [{b}];", b = in(reg32) bar) }
}

/// Waits (`mbarrier.try_wait.parity`, acquire) until the phase of parity
/// `parity` of the barrier at `bar` has completed: phase n of a barrier has
/// parity n % 2, and a wait for a phase returns once it is over. sm_90.
///
/// # Safety
/// `bar` is an initialized barrier object.
#[inline(always)]
pub unsafe fn mbarrier_wait(bar: u32, parity: u32) {
    loop {
        let done: u32;
        unsafe {
            asm!(
                "{{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [{b}], {ph}; selp.u32 {d}, 1, 0, p; }}",
                b = in(reg32) bar, ph = in(reg32) parity, d = out(reg32) done,
            )
        };
        if done != 0 {
            break;
        }
    }
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64`: one arrival on the barrier
/// at `bar` that also makes its current phase wait for `bytes` more bytes
/// of asynchronous copies, which count them down as they land. sm_90.
///
/// # Safety
/// `bar` is an initialized barrier object.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, bytes: u32) {
    unsafe {
        asm!(
            "{{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [{b}], {n}; }}",
            b = in(reg32) bar, n = in(reg32) bytes,
        )
    }
}

/// `prefetch.tensormap`: brings the tensor map at generic address `map`
/// into the cache that tensor copies read it from. sm_90.
#[inline(always)]
pub fn prefetch_tensormap(map: u64) {
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map) }
}

/// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`:
/// copies the box of the 2-D tensor map at generic address `map` whose
/// first element has coordinates (`c0`, `c1`) (innermost first) to shared
/// memory at `dst`, laid out and swizzled as the map says, elements outside
/// the tensor zero-filled; its bytes count down the transaction count of
/// the barrier at `bar`. sm_90.
///
/// # Safety
/// `map` is the address of a valid tensor map in parameter, constant or
/// global memory; `dst` holds the box (aligned as the swizzle needs) and
/// no one else touches it until the barrier's phase completes.
#[inline(always)]
pub unsafe fn tma_load_2d(dst: u32, map: u64, c0: i32, c1: i32, bar: u32) {
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
            d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) bar,
        )
    }
}

/// `barrier.cluster.arrive.release` then `barrier.cluster.wait.acquire`
/// (both `.aligned`): every thread of every block of the cluster arrives,
/// and none goes on before all have; shared-memory writes before it are
/// visible to the cluster's reads after it. All threads of each warp
/// execute it. sm_90.
#[inline(always)]
pub fn cluster_sync() {
    unsafe { asm!("barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;") }
}

/// `mapa.shared::cluster.u32`: the address, in the cluster's shared
/// window, of shared address `addr` of the block with cluster rank `rank`.
/// sm_90.
#[inline(always)]
pub fn mapa(addr: u32, rank: u32) -> u32 {
    let d: u32;
    unsafe {
        asm!("mapa.shared::cluster.u32 {d}, {a}, {r};", d = out(reg32) d, a = in(reg32) addr, r = in(reg32) rank)
    };
    d
}

/// `ld.shared::cluster.v4.u32`: 16 bytes at `addr` of the cluster's shared
/// window ([`mapa`]). sm_90.
///
/// # Safety
/// `addr` is 16-aligned inside a block of the cluster that has not exited.
#[inline(always)]
pub unsafe fn ld_cluster_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared::cluster.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr)
    }
    [a, b, c, d]
}

/// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: four 8 × 8 matrices of
/// 16-bit values, transposed, to shared memory. Register `v[q]` of lane l
/// holds elements (l / 4, 2·(l % 4)) and (l / 4, 2·(l % 4) + 1) of matrix
/// q (an `mma` accumulator fragment); they land in row 2·(l % 4) (and the
/// next) of the stored matrix, at element l / 4. Lane 8q + r gives the
/// address of stored row r of matrix q (16 bytes, 16-aligned). sm_90.
///
/// # Safety
/// Every lane's address is 16 bytes of shared memory that no one else
/// uses meanwhile; all lanes of the warp execute it.
#[inline(always)]
pub unsafe fn stmatrix_x4_trans(addr: u32, v: [u32; 4]) {
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3])
    }
}

/// `stmatrix.sync.aligned.m8n8.x2.trans.shared.b16`: two matrices as in
/// [`stmatrix_x4_trans`]; lanes 0..16 give the row addresses. sm_90.
///
/// # Safety
/// As for [`stmatrix_x4_trans`] (lanes 0..16's addresses).
#[inline(always)]
pub unsafe fn stmatrix_x2_trans(addr: u32, v: [u32; 2]) {
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [{p}], {{{a}, {b}}};",
             p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1])
    }
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: this warpgroup's registers per
/// thread rise to N (waiting until the block's pool has them). All threads
/// of the warpgroup execute it. sm_90a.
#[inline(always)]
pub fn setmaxnreg_inc<const N: u32>() {
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N) }
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: this warpgroup's registers per
/// thread fall to N, returned to the block's pool. All threads of the
/// warpgroup execute it. sm_90a.
#[inline(always)]
pub fn setmaxnreg_dec<const N: u32>() {
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N) }
}
