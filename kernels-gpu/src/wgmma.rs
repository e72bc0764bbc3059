//! Kernel 2 at large M on sm_90a: the warpgroup tensor-core dequant GEMM
//! `y[M, N] = x[M, K] · Wᵀ`, computed as `yᵀ = W · xᵀ` so that the
//! dequantized weights are the register operand A of `wgmma.m64n128k16`
//! and never pass through shared memory.
//!
//! # Block tile and thread maps (`kbit_format::wgmma`)
//!
//! A block computes one output tile, or one K split of it
//! ([`geo::work`]): activation rows `128·H·bx ..` (rows past M
//! zero-filled, never stored; H = 1 or 2 row halves, the const parameter)
//! × weight columns `128·by ..` with two
//! consumer warpgroups (threads 0..256). Warpgroup j owns columns `64j .. 64j + 63` of the tile, warp
//! w (0..4 in the warpgroup) 16 of them, and lane (g = l / 4, t = l % 4)
//! holds, per k16 step, the A registers of columns `16w + g` (a0, a2) and
//! `16w + g + 8` (a1, a3), elements `2t, 2t + 1` (a0, a1) and `2t + 8, 2t +
//! 9` (a2, a3): exactly the B fragments that [`fragment::dequant`] produces
//! for those two columns, so the table lookups, the scale and the numerics
//! (`T(T(cb)·T(amax))`) are those of the `mma.sync` kernel. The 64 f32
//! accumulators of a lane are the `m64n128` D fragment: column `16w + g (+8)`,
//! activation rows `8j + 2t (+1)`. With two halves every k16 step issues a
//! second MMA with the same A registers on rows 128.. of the stage, into a
//! second set of 64 accumulators: a weight is decoded once per 256 rows.
//! Those 128 accumulators need more registers than 384 threads have at
//! 168 each (the entries' `.maxntid 384`): the producer warpgroup gives
//! its registers back (`setmaxnreg.dec` to 40) and the consumers take them
//! (`setmaxnreg.inc` to 232).
//!
//! # Pipeline
//!
//! 384 threads: the two consumer warpgroups above and a producer warpgroup
//! (warps 8..12). [`geo::stages`] stages of one K tile each, with a
//! "full" and an "empty" `mbarrier` per stage. The producers fill a stage
//! as soon as it is empty. The tile's 128·H × 64 activations come in one
//! tensor copy (TMA) that the first producer thread issues: the host's
//! tensor map of `x` gives the box, the 128-byte swizzle of the B
//! descriptor ([`geo::a_offset`]) and zeros past M and K; its bytes count
//! down the full barrier's transaction count. The contiguous span of the
//! 128 columns' planes and their scale bytes (both fetched from the
//! 16-byte boundary below their start; bytes past the arrays zero-filled)
//! is spread over the producers as `cp.async` copies, each producer's
//! arriving on the full barrier when they land. Per K tile kt a consumer
//! warp issues its four `wgmma`s (A registers decoded during the previous
//! tile) behind those of tile kt − 1, retires kt − 1's (`wgmma.wait_group
//! 1`) and marks that stage empty, waits for tile kt + 1's stage to be
//! full and decodes it into the register set kt − 1 used, while kt's MMAs
//! run. The activations are written by the tensor copy and read by the
//! MMAs, both in the async proxy, and the weights are written by
//! `cp.async` and read by the decode, both in the generic one, so no proxy
//! fence is needed. The copy issue never sits between a consumer's MMAs,
//! and the two consumer warpgroups never wait for each other.
//!
//! # Split-K
//!
//! The blocks of a split tile are one thread-block cluster, cluster rank
//! = split. Each leaves its f32 partial in its own shared memory (over the
//! stages, which no one reads any more), 16-byte chunks in thread order
//! (chunk c of consumer thread t at `16·(256·c + t)`: accumulators `4c ..
//! 4c + 3`); a cluster barrier publishes them; split s then adds chunks s,
//! s + splits, … of every block's partial through distributed shared
//! memory in split order 0, 1, … (the same sums whichever block finishes
//! first) and writes its share of y; a second cluster barrier keeps every
//! block's shared memory alive until all reads are done. No global
//! workspace, no counters, no fences.
//!
//! # Output
//!
//! y leaves through a staging tile in shared memory
//! ([`geo::out_offset`]): `stmatrix … .trans` turns each 8 × 8 block of
//! the accumulator fragments (pairs along activation rows) into 16-byte
//! chunks of output rows, and the consumers then store whole 256-byte row
//! segments, 16 bytes a thread. A whole tile stages over the stages; a
//! split block stages its share after its partial. Where `n` is not a
//! multiple of 8, y is not 16-aligned or a chunk crosses `n`, that chunk
//! goes out value by value.

use crate::fragment::{self, MmaElem, PAIRS};
use crate::ptx;
use crate::ptx90a;
use kbit_format::mma::{lane_bytes, rotations};
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

/// A tensor map (`CUtensorMap`) as a kernel parameter: 128 opaque bytes
/// made by the host (`cuTensorMapEncodeTiled`). Kernel parameters are at
/// most 16-aligned here; the entry places it where it is 64-aligned.
#[repr(C, align(16))]
pub struct TensorMap(pub [u64; 16]);

/// Kernel arguments (validated by the host: K % 32 == 0, x 16-aligned,
/// M, N ≥ 1, M < 2^31; the split plan of [`geo::work`], launched with
/// clusters of `splits` blocks and `full` a multiple of `splits`).
pub struct Args {
    /// Generic address of the tensor map of `x` (`[M, K]` 16-bit values,
    /// boxes of 64 × the block's rows with the 128-byte swizzle): a kernel
    /// parameter.
    pub map: u64,
    pub packed: *const u32,
    pub scales: *const u8,
    pub cb: *const f32,
    pub y: *mut u16,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Whole tiles, then splits per tile and K tiles per split.
    pub full: u32,
    pub splits: u32,
    pub tps: u32,
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

/// Per-launch constants of the weight copies.
struct Copier {
    /// Bytes of the plane and scale arrays.
    w_total: u64,
    s_total: u64,
}

impl Copier {
    #[inline(always)]
    fn new<const K: usize>(a: &Args) -> Copier {
        let k_tiles = a.k.div_ceil(64) as u64;
        Copier { w_total: k_tiles * a.n as u64 * 8 * K as u64, s_total: k_tiles * a.n as u64 * 2 }
    }

    /// Issues producer thread `p`'s copies of K tile `kt`'s weights into
    /// the stage at `st`: the plane and scale chunks spread over the
    /// producers (chunk i of the stage's weight part: planes for i <
    /// `w_chunks`, scales after). A span that reaches the end of its array
    /// (the last tile of the last column block) is copied chunk by chunk
    /// with the bytes left, the rest zero-filled.
    #[inline(always)]
    unsafe fn issue<const K: usize, const H: u32>(&self, a: &Args, n0: u32, kt: u32, st: u32, p: u32) {
        let sp = Spans::of::<K>(kt, a.n, n0);
        let wc = geo::w_chunks(K as u32);
        let chunks = wc + geo::S_CHUNKS;
        let dst = st + geo::a_bytes(H);
        let inside = sp.w16 + 16 * wc as u64 <= self.w_total && sp.s16 + 16 * geo::S_CHUNKS as u64 <= self.s_total;
        let packed: *const u8 = a.packed.cast();
        // Chunk i's array, its size and its offset in it.
        let chunk = |i: u32| {
            if i < wc {
                (packed, self.w_total, sp.w16 + 16 * i as u64)
            } else {
                (a.scales, self.s_total, sp.s16 + 16 * (i - wc) as u64)
            }
        };
        // A block-uniform branch: plain copies inside the arrays.
        if inside {
            for r in 0..chunks.div_ceil(geo::PRODUCERS) {
                let i = p + geo::PRODUCERS * r;
                if i < chunks {
                    let (base, _, at) = chunk(i);
                    unsafe { ptx::cp_async_16(dst + 16 * i, base.add(at as usize)) };
                }
            }
        } else {
            for r in 0..chunks.div_ceil(geo::PRODUCERS) {
                let i = p + geo::PRODUCERS * r;
                if i < chunks {
                    let (base, total, at) = chunk(i);
                    let left = total.saturating_sub(at).min(16) as u32;
                    let at = if left > 0 { at } else { 0 };
                    unsafe { ptx::cp_async_16_zfill(dst + 16 * i, base.add(at as usize), left) };
                }
            }
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
unsafe fn decode<const K: usize, const H: u32, T: MmaElem>(st: u32, sp: Spans, tbl: u32, ln: &Lane) -> [[u32; 4]; 4] {
    let kb = K as u32;
    let w = st + geo::a_bytes(H) + sp.w_off;
    let s = st + geo::a_bytes(H) + 16 * geo::w_chunks(kb) + sp.s_off;
    let one = |col: u32, h: u32| {
        let planes = unsafe { fragment::load_planes::<K>(w + 4 * (2 * kb * col + kb * h)) };
        let scale = unsafe { ptx::ld_shared_u8(s + 2 * col + h) };
        unsafe { fragment::dequant::<K, PAIRS, T>(&planes, &ln.rot, tbl, ln.lanes, T::scale_x2(scale)) }
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
/// Launched with [`geo::THREADS`] threads, [`geo::smem_bytes`]`(K, H)`
/// bytes of dynamic shared memory, a grid of `full + (tiles − full)·splits`
/// blocks (tiles = `ceil(M / 128H)·ceil(N / 128)`) in clusters of `splits`
/// blocks; the pointers hold what [`Args`] says (the tensor map's box
/// `tile_m(H)` rows).
#[inline(always)]
pub unsafe fn run<const K: usize, T: WgmmaElem, const H: u32>(a: &Args) {
    let kb = K as u32;
    let tid = ptx::tid();
    let k_tiles = a.k.div_ceil(64);
    let wk = geo::work(ptx::bid(), a.full, a.splits, a.tps, k_tiles);
    let rows = a.m.div_ceil(geo::tile_m(H)).max(1);
    let (bx, by) = (wk.tile % rows, wk.tile / rows);
    let m0 = geo::tile_m(H) * bx;
    let n0 = geo::TILE_N * by;
    let tbl = ptx::smem_base();
    // Stages start on a swizzle atom (the tensor copy and the descriptor
    // apply the swizzle to absolute shared addresses).
    let st0 = (tbl + geo::table_end(kb)).next_multiple_of(geo::ALIGN);
    let (stb, stages) = (geo::stage_bytes(kb, H), geo::stages(H));
    let stage = |kt: u32| st0 + (kt % stages) * stb;
    let bars = st0 + geo::barriers_offset(kb, H);
    // Tile kt's stage is full once its copies have landed, and empty once
    // both consumer warpgroups are done with it; use u = kt / stages of a
    // stage is phase u of its two barriers.
    let full = |kt: u32| bars + 8 * (kt % stages);
    let empty = |kt: u32| bars + 8 * (stages + kt % stages);
    let phase = |kt: u32| (kt / stages) & 1;
    // Step `i` of the block's walk over its `len` K tiles computes K tile
    // `kt0 + (i + by) mod len`: the column blocks of a row tile, which
    // read the same activations, start at different K tiles instead of all
    // requesting the same lines.
    let len = wk.kt1 - wk.kt0;
    let first = by % len.max(1);
    let tile = |i: u32| wk.kt0 + if i + first >= len { i + first - len } else { i + first };

    if tid < geo::CONSUMERS {
        let table = unsafe { fragment::load_table::<K, PAIRS>(a.cb, tid) };
        unsafe { fragment::store_table::<K, PAIRS, T>(tbl, &table, tid) };
    } else if tid == geo::CONSUMERS {
        ptx90a::prefetch_tensormap(a.map);
        // Full: every producer's copies, and the activations' tensor copy
        // (one arrival that expects its bytes).
        for s in 0..stages {
            unsafe { ptx90a::mbarrier_init(full(s), geo::PRODUCERS + 1) };
            unsafe { ptx90a::mbarrier_init(empty(s), geo::CONSUMERS / 32) };
        }
    }
    // Activations and outputs come after the wait.
    ptx::after_producers();
    // Publishes the table and the barrier objects.
    ptx::bar_sync();

    if tid >= geo::CONSUMERS {
        ptx90a::setmaxnreg_dec::<40>();
        // The producer warpgroup: each tile's copies as soon as its stage
        // is empty (the first `stages` tiles at once), each thread's copies
        // counted on the stage's full barrier when they land.
        let p = tid - geo::CONSUMERS;
        let cp = Copier::new::<K>(a);
        for kt in 0..len {
            if kt >= stages {
                unsafe { ptx90a::mbarrier_wait(empty(kt), phase(kt) ^ 1) };
            }
            if p == 0 {
                unsafe { ptx90a::mbarrier_arrive_expect_tx(full(kt), geo::a_bytes(H)) };
                let (k0, row0) = ((64 * tile(kt)) as i32, m0 as i32);
                unsafe { ptx90a::tma_load_2d(stage(kt), a.map, k0, row0, full(kt)) };
            }
            unsafe { cp.issue::<K, H>(a, n0, tile(kt), stage(kt), p) };
            unsafe { ptx90a::cp_async_mbarrier_arrive(full(kt)) };
        }
        ptx::cp_async_wait::<0>();
        // The consumers' two cluster barriers of a split tile.
        if wk.splits > 1 {
            ptx90a::cluster_sync();
            ptx90a::cluster_sync();
        }
        return;
    }

    ptx90a::setmaxnreg_inc::<232>();
    let (warp, lane) = (tid / 32, tid % 32);
    let ln = Lane {
        col: geo::a_col(warp, lane, 0),
        rot: rotations(2 * (lane % 4)),
        lanes: lane_bytes(lane, kb, PAIRS as u32),
    };
    let wait_full = |kt: u32| unsafe { ptx90a::mbarrier_wait(full(kt), phase(kt)) };
    let mut acc = [0f32; 64];
    let mut acc1 = [0f32; 64];
    wait_full(0);
    let mut fa = unsafe { decode::<K, H, T>(stage(0), Spans::of::<K>(tile(0), a.n, n0), tbl, &ln) };
    let mut fb = [[0u32; 4]; 4];
    let mut kt = 0;
    // Unrolled by two with two sets of A registers, `fa` for even tiles
    // and `fb` for odd ones. At the top of a step the MMAs of tile kt − 1
    // (set `$prev`) may still run; the step issues tile kt's behind them,
    // retires kt − 1's, and decodes tile kt + 1 into `$prev` while kt's run,
    // so the tensor cores always have the next group queued.
    macro_rules! step {
        ($cur:ident, $prev:ident) => {{
            let st = stage(kt);
            T::wgmma_tile(&mut acc, &$cur, [0, 1, 2, 3].map(|s| geo::b_descriptor(st, s)));
            if H == 2 {
                let st1 = st + geo::a_bytes(1);
                T::wgmma_tile(&mut acc1, &$cur, [0, 1, 2, 3].map(|s| geo::b_descriptor(st1, s)));
            }
            // Tile kt − 1's MMAs are done (at kt = 0 there are none and
            // `fb` is zeros; a tile is H groups, and the wait leaves tile
            // kt's H queued): `$prev` is free, and so is the stage of tile
            // kt − 1 (decoded a step ago). The warp-collective wait has
            // every lane past its MMAs, so one arrival speaks for the warp.
            ptx90a::wgmma_wait::<H>(&mut acc, &$prev);
            if H == 2 {
                ptx90a::wgmma_wait::<H>(&mut acc1, &$prev);
            }
            if kt > 0 && lane == 0 {
                unsafe { ptx90a::mbarrier_arrive(empty(kt - 1)) };
            }
            kt += 1;
            if kt == len {
                ptx90a::wgmma_wait::<0>(&mut acc, &$cur);
                if H == 2 {
                    ptx90a::wgmma_wait::<0>(&mut acc1, &$cur);
                }
                break;
            }
            wait_full(kt);
            $prev = unsafe { decode::<K, H, T>(stage(kt), Spans::of::<K>(tile(kt), a.n, n0), tbl, &ln) };
        }};
    }
    loop {
        step!(fa, fb);
        step!(fb, fa);
    }

    // Epilogue: y goes out through a staging tile in shared memory
    // (`geo::out_offset`), written by `stmatrix` from the accumulator
    // fragments and read back as 16-byte chunks of rows, so that a warp
    // stores two whole 256-byte row segments instead of 2-byte values.
    // Staged row `srow` holds 8 outputs of tile row `trow(srow)` per chunk.
    let write_rows = |base: u32, rows: u32, trow: &dyn Fn(u32) -> u32| {
        // Thread t: chunk t % 16 of staged rows t / 16, t / 16 + 16, …
        let chunk = tid % 16;
        let col = n0 + 8 * chunk;
        let vector = a.n % 8 == 0 && (a.y as usize) % 16 == 0 && col + 8 <= a.n;
        let mut srow = tid / 16;
        while srow < rows {
            let row = m0 + trow(srow);
            if row < a.m {
                let v = unsafe { ptx::ld_shared_v4(base + geo::out_offset(srow, chunk)) };
                let at = row as usize * a.n as usize + col as usize;
                if vector {
                    unsafe { ptx::st_v4(a.y.add(at).cast(), v) };
                } else {
                    for e in 0..8u32 {
                        if col + e < a.n {
                            unsafe { *a.y.add(at + e as usize) = (v[(e / 2) as usize] >> (16 * (e % 2))) as u16 };
                        }
                    }
                }
            }
            srow += geo::CONSUMERS / 16;
        }
    };
    // A warp's `stmatrix` matrix q (lanes 8q .. 8q + 8 give its 8 stored
    // rows): weight columns 8·(q % 2) .. + 8 of the warp's 16, i.e. chunk
    // `chunk_q` of a staged row.
    let (q, r) = (lane / 8, lane % 8);
    let chunk_q = geo::d_col(warp, 0, 2 * (q % 2)) / 8;
    // Both consumer warpgroups' MMAs are done reading the stages before
    // anything overwrites them.
    ptx::bar_sync_named(1, geo::CONSUMERS);
    if wk.splits > 1 {
        // Split-K (see the module docs): park the f32 partial, 16-byte
        // chunks in thread order (chunk c of thread t: accumulators 4c ..
        // 4c + 3, activation rows 8·(c % 16) + 2t (+1) of half c / 16,
        // weight columns g and g + 8).
        let chunk = |c: u32| st0 + 16 * (geo::CONSUMERS * c + tid);
        // Constant chunk indices keep the accumulators in registers.
        macro_rules! park {
            ($acc:ident, $off:literal; $($c:literal)*) => {$(unsafe {
                let v = [$acc[4 * $c], $acc[4 * $c + 1], $acc[4 * $c + 2], $acc[4 * $c + 3]];
                ptx::st_shared_v4(chunk($c + $off), v.map(f32::to_bits))
            };)*};
        }
        park!(acc, 0; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        if H == 2 {
            park!(acc1, 16; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        }
        ptx90a::cluster_sync();
        // Split s sums chunks s, s + splits, … over the ranks in order and
        // stages chunk number i as staged rows 8i .. 8i + 8, after the
        // partials (which the other ranks are still reading).
        let out = st0 + 16 * geo::CONSUMERS * 16 * H;
        let mut c = wk.split;
        let mut i = 0;
        while c < 16 * H {
            let mut sum = unsafe { ptx90a::ld_cluster_v4(ptx90a::mapa(chunk(c), 0)) }.map(f32::from_bits);
            for rank in 1..wk.splits {
                let v = unsafe { ptx90a::ld_cluster_v4(ptx90a::mapa(chunk(c), rank)) };
                sum = [0, 1, 2, 3].map(|e| sum[e] + f32::from_bits(v[e]));
            }
            let v = [T::pack(sum[0], sum[1]), T::pack(sum[2], sum[3])];
            unsafe { ptx90a::stmatrix_x2_trans(out + geo::out_offset(8 * i + r, chunk_q), v) };
            c += wk.splits;
            i += 1;
        }
        ptx::bar_sync_named(1, geo::CONSUMERS);
        let (split, splits) = (wk.split, wk.splits);
        write_rows(out, 8 * i, &|srow| {
            let c = split + splits * (srow / 8);
            geo::HALF_M * (c / 16) + 8 * (c % 16) + srow % 8
        });
        ptx90a::cluster_sync();
        return;
    }

    // A whole tile: stmatrix p of a half stores activation rows 8·(2p +
    // q / 2) .. + 8 (accumulators 8p .. 8p + 8, two per register).
    let row_of = |p: u32, half: u32| geo::HALF_M * half + 8 * (2 * p + q / 2) + r;
    macro_rules! stage_out {
        ($acc:ident, $half:literal; $($p:literal)*) => {$(unsafe {
            let v = [0, 1, 2, 3].map(|j| T::pack($acc[8 * $p + 2 * j], $acc[8 * $p + 2 * j + 1]));
            ptx90a::stmatrix_x4_trans(st0 + geo::out_offset(row_of($p, $half), chunk_q), v)
        };)*};
    }
    stage_out!(acc, 0; 0 1 2 3 4 5 6 7);
    if H == 2 {
        stage_out!(acc1, 1; 0 1 2 3 4 5 6 7);
    }
    ptx::bar_sync_named(1, geo::CONSUMERS);
    write_rows(st0, geo::tile_m(H), &|srow| srow);
}
