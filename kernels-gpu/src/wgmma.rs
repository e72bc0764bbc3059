//! Kernel 2 at large M on sm_90a: the warpgroup tensor-core dequant GEMM
//! `y[M, N] = x[M, K] · Wᵀ`, computed as `yᵀ = W · xᵀ` so that the
//! dequantized weights are the register operand A of `wgmma.m64n128k16`
//! and never pass through shared memory.
//!
//! # Block tile and thread maps (`kbit_format::wgmma`)
//!
//! 256 threads = two warpgroups; block (bx, by) computes activation rows
//! `128·bx ..` (rows past M zero-filled, never stored) × weight columns
//! `128·by ..`. Warpgroup j owns columns `64j .. 64j + 63` of the tile, warp
//! w (0..4 in the warpgroup) 16 of them, and lane (g = l / 4, t = l % 4)
//! holds, per k16 step, the A registers of columns `16w + g` (a0, a2) and
//! `16w + g + 8` (a1, a3), elements `2t, 2t + 1` (a0, a1) and `2t + 8, 2t +
//! 9` (a2, a3): exactly the B fragments that [`fragment::dequant`] produces
//! for those two columns, so the table lookups, the scale and the numerics
//! (`T(T(cb)·T(amax))`) are those of the `mma.sync` kernel. The 64 f32
//! accumulators of a lane are the `m64n128` D fragment: column `16w + g (+8)`,
//! activation rows `8j + 2t (+1)`.
//!
//! # Pipeline
//!
//! [`STAGES`](geo::STAGES) stages of one K tile each, filled by `cp.async`
//! from all 256 threads: the tile's 128 × 64 activations in the no-swizzle
//! K-major layout of the B descriptor ([`geo::a_offset`]), the contiguous
//! span of the 128 columns' planes and their scale bytes (both fetched from
//! the 16-byte boundary below their start; bytes past the arrays
//! zero-filled). Per K tile: wait for the stage and the next
//! one (`cp.async.wait_group S − 3`), hand them to the async proxy
//! (`fence.proxy.async`), barrier, issue the copies of the stage S − 1
//! tiles ahead, then issue the tile's four `wgmma`s with the A registers
//! decoded during the previous tile, decode the next tile's A registers
//! from its stage while they run, and wait for them (the next barrier then
//! frees their stage for the copies).

use crate::fragment::{self, MmaElem};
use crate::ptx;
use crate::ptx90a;
use kbit_format::mma::{lane_bytes, rotations, table_copies};
use kbit_format::wgmma as geo;

/// A `wgmma` input type: the `m64n128k16` instructions of its dtype.
pub trait WgmmaElem: MmaElem {
    /// One K tile of MMAs as one group, asynchronous (see [`ptx90a`]).
    fn wgmma_tile(d: &mut [f32; 64], a: &[[u32; 4]; 4], b: [u64; 4]);
}

impl WgmmaElem for crate::elem::F16 {
    #[inline(always)]
    fn wgmma_tile(d: &mut [f32; 64], a: &[[u32; 4]; 4], b: [u64; 4]) {
        ptx90a::wgmma_m64n128k64_f16(d, a, b)
    }
}

impl WgmmaElem for crate::elem::Bf16 {
    #[inline(always)]
    fn wgmma_tile(d: &mut [f32; 64], a: &[[u32; 4]; 4], b: [u64; 4]) {
        ptx90a::wgmma_m64n128k64_bf16(d, a, b)
    }
}

/// Kernel arguments (validated by the host: K % 32 == 0, x 16-aligned,
/// M, N ≥ 1).
pub struct Args {
    pub x: *const u16,
    pub packed: *const u32,
    pub scales: *const u8,
    pub cb: *const f32,
    pub y: *mut u16,
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

/// Global byte offsets of one K tile's plane and scale spans for the
/// block's columns, rounded down to 16 bytes, and the distance of each
/// span's start above its rounded offset.
#[derive(Clone, Copy)]
struct Spans {
    w16: u64,
    w_off: u32,
    s16: u64,
    s_off: u32,
}

impl Spans {
    #[inline(always)]
    fn of<const K: usize>(kt: u32, n: u32, n0: u32) -> Spans {
        let col = kt as u64 * n as u64 + n0 as u64;
        let w = col * 8 * K as u64;
        let s = col * 2;
        Spans { w16: w & !15, w_off: (w & 15) as u32, s16: s & !15, s_off: (s & 15) as u32 }
    }
}

/// Issues the copies of K tile `kt` into the stage at `st`: 4 activation
/// chunks per thread, then the plane and scale chunks spread over the
/// threads (chunk i of the stage's weight part: planes for i <
/// `w_chunks`, scales after). Every copy reads at most the bytes left in
/// its array and zero-fills the rest.
#[inline(always)]
unsafe fn issue<const K: usize>(a: &Args, m0: u32, n0: u32, kt: u32, st: u32, tid: u32) {
    let kb = K as u32;
    for r in 0..(geo::A_CHUNKS / geo::THREADS) {
        let q = tid + geo::THREADS * r;
        let row = m0 + geo::a_chunk_row(q);
        let kc = 64 * kt + 8 * geo::a_chunk_col(q);
        let ok = row < a.m && kc < a.k;
        let at = if ok { row as u64 * a.k as u64 + kc as u64 } else { 0 };
        unsafe { ptx::cp_async_16_zfill(st + 16 * q, a.x.add(at as usize).cast(), if ok { 16 } else { 0 }) };
    }
    let sp = Spans::of::<K>(kt, a.n, n0);
    let k_tiles = a.k.div_ceil(64) as u64;
    let w_total = k_tiles * a.n as u64 * 8 * kb as u64;
    let s_total = k_tiles * a.n as u64 * 2;
    let wc = geo::w_chunks(kb);
    let chunks = wc + geo::S_CHUNKS;
    for r in 0..chunks.div_ceil(geo::THREADS) {
        let i = tid + geo::THREADS * r;
        if i < chunks {
            let (base, total, at): (*const u8, u64, u64) = if i < wc {
                (a.packed.cast(), w_total, sp.w16 + 16 * i as u64)
            } else {
                (a.scales, s_total, sp.s16 + 16 * (i - wc) as u64)
            };
            let left = total.saturating_sub(at).min(16) as u32;
            let at = if left > 0 { at } else { 0 };
            unsafe { ptx::cp_async_16_zfill(st + geo::A_BYTES + 16 * i, base.add(at as usize), left) };
        }
    }
}

/// Per-lane constants of the decode.
struct Lane {
    /// Column (within the block tile) of a0/a2; a1/a3 are 8 columns on.
    col: u32,
    rot: [u32; 8],
    lanes: u32,
}

/// The A registers of the four k16 steps of the K tile in the stage at
/// `st` (`tbl`: the decode table; `sp`: the tile's spans).
#[inline(always)]
unsafe fn decode<const K: usize, T: MmaElem>(st: u32, sp: Spans, tbl: u32, ln: &Lane) -> [[u32; 4]; 4] {
    let kb = K as u32;
    let w = st + geo::A_BYTES + sp.w_off;
    let s = st + geo::A_BYTES + 16 * geo::w_chunks(kb) + sp.s_off;
    let one = |col: u32, h: u32| {
        let planes = unsafe { fragment::load_planes::<K>(w + 4 * (2 * kb * col + kb * h)) };
        let scale = unsafe { ptx::ld_shared_u8(s + 2 * col + h) };
        unsafe { fragment::dequant::<K, 1, T>(&planes, &ln.rot, tbl, ln.lanes, scale) }
    };
    // dequant gives [b0, b1] of k16 step 0 of the quant block, then of
    // step 1; a0/a2 come from column `col`, a1/a3 from `col + 8`.
    let (p0, q0) = (one(ln.col, 0), one(ln.col + 8, 0));
    let (p1, q1) = (one(ln.col, 1), one(ln.col + 8, 1));
    [
        [p0[0], q0[0], p0[1], q0[1]],
        [p0[2], q0[2], p0[3], q0[3]],
        [p1[0], q1[0], p1[1], q1[1]],
        [p1[2], q1[2], p1[3], q1[3]],
    ]
}

/// The kernel body (see the module docs).
///
/// # Safety
/// Launched with [`geo::THREADS`] threads, [`geo::smem_bytes`]`(K)` bytes of
/// dynamic shared memory and a grid of `(ceil(M / 128), ceil(N / 128))`;
/// the pointers hold what [`Args`] says.
#[inline(always)]
pub unsafe fn run<const K: usize, T: WgmmaElem>(a: &Args) {
    let kb = K as u32;
    let tid = ptx::tid();
    let (warp, lane) = (tid / 32, tid % 32);
    let m0 = geo::TILE_M * ptx::bid();
    let n0 = geo::TILE_N * ptx::bid_y();
    let tbl = ptx::smem_base();
    let st0 = tbl + geo::stages_offset(kb);
    let stb = geo::stage_bytes(kb);
    let stage = |kt: u32| st0 + (kt % geo::STAGES) * stb;
    let k_tiles = a.k.div_ceil(64);
    // Step `i` of the block's walk computes K tile `(i + by) mod k_tiles`:
    // the column blocks of a row tile, which read the same activations,
    // start at different K tiles instead of all requesting the same lines.
    let first = ptx::bid_y() % k_tiles.max(1);
    let tile = |i: u32| if i + first >= k_tiles { i + first - k_tiles } else { i + first };

    let table = unsafe { fragment::load_table::<K, 1>(a.cb, tid) };
    unsafe { fragment::store_table::<K, 1, T>(tbl, &table, tid) };
    // Activations and outputs come after the wait.
    ptx::after_producers();
    for kt in 0..geo::STAGES - 1 {
        if kt < k_tiles {
            unsafe { issue::<K>(a, m0, n0, tile(kt), stage(kt), tid) };
        }
        ptx::cp_async_commit();
    }
    let ln = Lane {
        col: geo::a_col(warp, lane, 0),
        rot: rotations(2 * (lane % 4)),
        lanes: lane_bytes(lane, table_copies(kb, 1)),
    };
    let mut acc = [0f32; 64];
    // Tile 0's A registers (its stage and tile 1's have landed).
    ptx::cp_async_wait::<{ geo::STAGES - 3 }>();
    ptx::bar_sync();
    let mut fa = unsafe { decode::<K, T>(stage(0), Spans::of::<K>(tile(0), a.n, n0), tbl, &ln) };
    let mut kt = 0;
    // Unrolled by two with two sets of A registers, `fa` for even tiles
    // and `fb` for odd ones: the decode of tile kt + 1 writes the set that
    // the MMAs in flight do not read, with no copies between the sets.
    macro_rules! step {
        ($cur:ident, $next:ident) => {{
            // Tiles kt and kt + 1 have landed (this thread's copies), are
            // handed to the async proxy, and after the barrier everyone's
            // are visible: tile kt for the MMAs, tile kt + 1 for the
            // decode below. The barrier also frees the stage of tile kt − 1
            // (its MMAs were waited for, its registers decoded) for the
            // copies of tile kt + S − 1.
            ptx::cp_async_wait::<{ geo::STAGES - 3 }>();
            ptx90a::fence_proxy_async_shared();
            ptx::bar_sync();
            let ahead = kt + geo::STAGES - 1;
            if ahead < k_tiles {
                unsafe { issue::<K>(a, m0, n0, tile(ahead), stage(ahead), tid) };
            }
            ptx::cp_async_commit();
            let st = stage(kt);
            T::wgmma_tile(&mut acc, &$cur, [0, 1, 2, 3].map(|s| geo::b_descriptor(st, s)));
            kt += 1;
            if kt == k_tiles {
                ptx90a::wgmma_wait_all(&mut acc, &$cur);
                break;
            }
            // The next tile's A registers while these MMAs run.
            $next = unsafe { decode::<K, T>(stage(kt), Spans::of::<K>(tile(kt), a.n, n0), tbl, &ln) };
            ptx90a::wgmma_wait_all(&mut acc, &$cur);
        }};
    }
    let mut fb;
    loop {
        step!(fa, fb);
        step!(fb, fa);
    }

    // Epilogue: accumulator i is (activation row d_row, weight column
    // d_col). Constant indices keep the accumulators in registers.
    macro_rules! each_acc {
        ($($i:literal)*) => {$({
            let row = m0 + geo::d_row(lane, $i);
            let col = n0 + geo::d_col(warp, lane, $i);
            if row < a.m && col < a.n {
                unsafe { *a.y.add(row as usize * a.n as usize + col as usize) = T::from_f32(acc[$i]) };
            }
        })*};
    }
    each_acc!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);
}
