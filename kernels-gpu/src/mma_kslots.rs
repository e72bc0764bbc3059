//! Kernel 2, K-slot variant: the tensor-core dequant GEMM for M ≤ 16 where
//! narrow column blocks alone fill the GPU. No block-wide pipeline and no
//! split-K workspace: each warp streams its own K tiles through its own
//! `cp.async` ring and dequantizes them into `mma.m16n8k16` B fragments
//! ([`crate::fragment`]), as the K slots of the column-slot GEMV
//! ([`crate::gemv_slots`]) do with scalar FMAs.
//!
//! # Work mapping (`kbit_format::mma_kslots`)
//!
//! A block owns `8·NF` consecutive columns and all of K. Warp `w` is K slot
//! `w`: it takes the K tiles `kt = w, w + 8, …`; for each tile and fragment
//! `f` lane l (g = l / 4, t = l % 4) reads the `2k` plane words and the
//! scale byte of column `8f + g` from the warp's ring (the four lanes of a
//! column read the same bytes) and holds B of that column exactly as the
//! pipelined kernel's warps do. A goes through the same ring (8 rows for
//! M ≤ 8, 16 otherwise, swizzled as in the pipelined kernel) and comes out
//! with `ldmatrix` (`.x4` above 8 rows; `.x2` of rows 0-7 at M ≤ 8, where
//! blocks of two fragments or more swap the operands: the weights of
//! fragments 2p, 2p + 1 are A and the 8 rows B, one mma per pair and k16
//! step, `kbit_format::mma::swapped_c_pos`; one-fragment blocks keep A =
//! rows 0-7 with a1 = a3 = 0). Rows ≥ M and columns past K are
//! zero-filled by the copies, so `K % 64 == 32` reads nothing past K.
//!
//! # Pipeline
//!
//! A slot's ring has `depth` stages (4, or 3 where that keeps the grid in
//! one wave or two blocks per SM; chosen by the host, layout in
//! `kbit_format::mma_kslots`), walked by a cursor that wraps at the ring's
//! end. The copies of tile i + depth − 1 go to the stage tile i − 1 used
//! (one commit group per tile, committed even when there is no tile, so
//! group counting holds) before tile i is computed, and only the warp's
//! own barrier (`bar.warp.sync`) orders a stage's reads before its refill:
//! warps never wait for each other until the reduction. The weights of the
//! first depth − 1 tiles of every slot are requested before the
//! grid-dependency wait, with the codebook reads of the table build, so
//! that their latency passes while the previous launch finishes (their
//! activations follow the wait). Nothing is written before the wait but
//! the block's own shared memory.
//!
//! # Reduction
//!
//! Each warp stores its f32 accumulators (`red[slot][f][i][lane]`, f a
//! fragment or with swapped operands a pair, conflict-free), one barrier,
//! then one thread per output adds the eight slot partials in slot order
//! and rounds once to T. The order depends on
//! nothing but the shape, so results are the same bits on every call.
//!
//! # Grouped (MoE experts)
//!
//! [`run_grouped`] runs the same body over the experts of a MoE layer in
//! one launch: grid row `u = blockIdx.y` is grouped unit `u`
//! (`crate::gemv::grouped_unit`: an expert when there are fewer experts
//! than rows, else the unit of an expert's first row), whose block `b`
//! computes columns `8·NF·b ..` of that expert's rows. When units are
//! experts the expert's first weights go out before the wait as in the
//! dense kernel; otherwise the unit's expert is known only from the
//! offsets, which earlier kernels write, so its weights follow the wait.
//! An expert's result is bit-identical to the dense kernel's on it alone.

use crate::fragment::{self, MmaElem, PAIRS};
use crate::mma::unrolled;
use crate::ptx;
use core::num::NonZeroU32;
use kbit_format::mma as geo;
use kbit_format::mma_kslots as ks;

/// Kernel arguments (all validated by the host).
#[derive(Clone, Copy)]
pub struct Args {
    /// Rows of x and y (1..=16).
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K (a multiple of 32).
    pub k: u32,
    /// Stages of each slot's ring (`MIN_DEPTH..=MAX_DEPTH`), matching the
    /// launch's shared memory.
    pub depth: u32,
    /// Activations `[M, K]`, 16-byte aligned, and the output `[M, N]`.
    pub x: *const u16,
    /// See `x`.
    pub y: *mut u16,
    /// The weight in the runtime layout: plane words, E4M4 scale bytes,
    /// and the codebook (`2^k` f32).
    pub packed: *const u32,
    /// See `packed`.
    pub scales: *const u8,
    /// See `packed`.
    pub cb: *const f32,
}

/// The MoE arguments of a grouped launch ([`run_grouped`]): `x`, `y` of
/// [`Args`] hold `total_rows` rows, `packed` and `scales` `num_experts`
/// matrices back to back, and `m` is max_m.
#[derive(Clone, Copy)]
pub struct Experts {
    /// `num_experts + 1` row offsets (expert `e` owns rows `offsets[e] ..
    /// offsets[e + 1]`).
    pub offsets: *const u32,
    /// Experts in `packed` / `scales`.
    pub num_experts: u32,
    /// Rows of x and y.
    pub total_rows: u32,
    /// Global word that records the lowest expert with more than max_m rows.
    pub status: *mut u32,
}

/// The warp's copies of the activations of K tile `kt`: `rows` rows
/// (8 or 16) × 8 chunks of 16 bytes into the stage's A part at `dst`
/// (`mma::a_offset` swizzle); rows ≥ M and columns past K are zero-filled
/// without being read. Lane l copies chunks l, l + 32, ….
///
/// # Safety
/// `x` holds `m` rows of `k_dim` values, 16-aligned.
#[inline(always)]
unsafe fn copy_a(dst: u32, x: *const u16, m: u32, k_dim: u32, kt: u32, rows: u32, lane: u32) {
    let mut c = lane;
    while c < 8 * rows {
        let (r, ch) = (c >> 3, c & 7);
        let col = 64 * kt + 8 * ch;
        // K is a multiple of 32: a chunk of 8 columns is inside K or past it.
        let ok = r < m && col < k_dim;
        let src = if ok { x.wrapping_add(r as usize * k_dim as usize + col as usize) } else { x };
        unsafe { ptx::cp_async_16_zfill(dst + geo::a_offset(r, ch), src as *const u8, if ok { 16 } else { 0 }) };
        c += 32;
    }
}

/// The warp's copies of one window (`chunks` 16-byte chunks from byte `at`
/// of `base`, valid up to byte `end`, zero-filled past it) into shared
/// memory at `dst`; lane l copies chunks l, l + 32, ….
///
/// # Safety
/// `[at, end)` lies inside the array at `base`; `dst` has `16·chunks` bytes.
#[inline(always)]
unsafe fn copy_window(dst: u32, base: *const u8, at: u64, end: u64, chunks: u32, lane: u32) {
    let mut c = lane;
    while c < chunks {
        let from = at + 16 * c as u64;
        let bytes = end.saturating_sub(from).min(16) as u32;
        let src = if bytes > 0 { base.wrapping_add(from as usize) } else { base };
        unsafe { ptx::cp_async_16_zfill(dst + 16 * c, src, bytes) };
        c += 32;
    }
}

/// The activation fragments of the four k16 steps of the tile staged at
/// `a`: with `X2` (M ≤ 8) `ldmatrix.x2` of rows 0-7 (a0, a2; a1 = a3 = 0,
/// or the B operand of [`fragment::mma_swapped`]), else `ldmatrix.x4` of
/// 16 rows.
#[inline(always)]
unsafe fn load_a<const X2: bool>(a: u32, lane: u32) -> [[u32; 4]; 4] {
    core::array::from_fn(|s| {
        let s = s as u32;
        if X2 {
            let at = a + geo::a_offset(geo::ldmatrix_x2_row(lane), geo::ldmatrix_x2_chunk(s, lane));
            let [lo, hi] = unsafe { ptx::ldmatrix_x2(at) };
            [lo, 0, hi, 0]
        } else {
            unsafe { ptx::ldmatrix_x4(a + geo::a_offset(geo::ldmatrix_row(0, lane), geo::ldmatrix_chunk(s, lane))) }
        }
    })
}

/// Multiplies one K tile, staged at `stage` (plane window from byte
/// `off_w`, scale window from `off_s`), into the accumulators.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_mma<const K: usize, const NF: usize, T: MmaElem, const X2: bool>(
    stage: u32,
    off_w: u32,
    off_s: u32,
    lane: u32,
    rot: &[u32; 8],
    tbl: u32,
    lanes: u32,
    acc: &mut [[f32; 4]; NF],
) {
    let (kb, g) = (K as u32, lane >> 2);
    let a = unsafe { load_a::<X2>(stage + ks::a_offset_in_stage(kb, NF as u32), lane) };
    let w = stage + off_w + 8 * kb * g;
    let sc = stage + 16 * ks::w_chunks(kb, NF as u32) + off_s + 2 * g;
    let weights = |f: usize, h: u32| {
        let planes = unsafe { fragment::load_planes::<K>(w + 64 * kb * f as u32 + 4 * kb * h) };
        let scale = unsafe { ptx::ld_shared_u8(sc + 16 * f as u32 + h) };
        unsafe { fragment::dequant::<K, PAIRS, T>(&planes, rot, tbl, lanes, T::scale_x2(scale)) }
    };
    if fragment::swapped(X2, NF) {
        // Fragment pair p accumulates in acc[p] (swapped C map).
        unrolled!(NF / 2, p => {
            unrolled!(2, h => {
                let (w0, w1) = (weights(2 * p, h as u32), weights(2 * p + 1, h as u32));
                // a0, a2 of the x2 load of k16 steps 2h and 2h + 1.
                let x = [[a[2 * h][0], a[2 * h][2]], [a[2 * h + 1][0], a[2 * h + 1][2]]];
                acc[p] = fragment::mma_swapped::<T>(&w0, &w1, &x, acc[p]);
            });
        });
        return;
    }
    unrolled!(NF, f => {
        for h in 0..2u32 {
            let b = weights(f, h);
            let h = h as usize;
            acc[f] = T::mma(a[2 * h], [b[0], b[1]], acc[f]);
            acc[f] = T::mma(a[2 * h + 1], [b[2], b[3]], acc[f]);
        }
    });
}

/// Body of the `kbit_mma_kslots_k{K}_n{8·NF}_{T}` kernels.
///
/// # Safety
/// The host validated every pointer and size in `a`; the launch has 256
/// threads, `ceil(N / 8·NF)` blocks and `mma_kslots::smem_bytes(K, NF)`
/// bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run<const K: usize, const NF: usize, T: MmaElem>(a: &Args) {
    if a.m <= 8 { unsafe { body::<K, NF, T, true>(a, None) } } else { unsafe { body::<K, NF, T, false>(a, None) } }
}

/// Body of the `kbit_mma_kslots_grouped_k{K}_n{8·NF}_{T}` kernels: [`run`]
/// over MoE experts (module docs, "Grouped"). Grid `(ceil(N / 8·NF),
/// units)`; units without rows return after the wait.
///
/// # Safety
/// As [`run`] with `a.m` = max_m (1..=16), plus: `packed` / `scales` hold
/// `num_experts` matrices `[N, K]` back to back (`tile::words` /
/// `tile::scales` apart); `offsets` holds `num_experts + 1` values (if they
/// are not non-decreasing from 0 with `offsets[E] = total_rows`, results
/// are unspecified but every access stays inside `total_rows` rows);
/// `status` is a global word.
#[inline(always)]
pub unsafe fn run_grouped<const K: usize, const NF: usize, T: MmaElem>(a: &Args, e: &Experts) {
    if a.m <= 8 {
        unsafe { body::<K, NF, T, true>(a, Some(e)) }
    } else {
        unsafe { body::<K, NF, T, false>(a, Some(e)) }
    }
}

/// `a` with its weight pointers moved to expert `e`'s matrix.
#[inline(always)]
fn expert_weights<const K: usize>(a: &Args, e: u32) -> Args {
    let words = kbit_format::tile::words(a.n as usize, a.k as usize, K);
    let scale_bytes = kbit_format::tile::scales(a.n as usize, a.k as usize);
    Args {
        packed: a.packed.wrapping_add(e as usize * words),
        scales: a.scales.wrapping_add(e as usize * scale_bytes),
        ..*a
    }
}

/// [`run`] (`grouped` = `None`) or [`run_grouped`] for M ≤ 8 (`X2`: 8
/// staged activation rows) or M ≤ 16.
#[inline(always)]
unsafe fn body<const K: usize, const NF: usize, T: MmaElem, const X2: bool>(a: &Args, grouped: Option<&Experts>) {
    const { assert!(K >= 2 && K <= 5 && (NF == 1 || NF == 2 || NF == 4)) };
    let (kb, nfu) = (K as u32, NF as u32);
    let tid = ptx::tid();
    let lane = tid & 31;
    let slot = tid >> 5;
    let smem = ptx::smem_base();
    let tbl = smem;
    let rows = if X2 { 8 } else { 16 };
    // The host passes 3 or 4; a zero would have no stage to use, so such a
    // launch only waits and exits.
    let Some(depth) = NonZeroU32::new(a.depth) else { return ptx::after_producers() };
    let depth_n = depth.get();
    let ring = smem + ks::ring_offset(kb, nfu, rows, depth_n, slot);
    let red = smem + ks::red_base(kb);
    let stage_bytes = ks::stage_bytes(kb, nfu, rows);
    let cols = ks::block_cols(nfu);
    let n0 = ptx::bid() * cols;
    let n_valid = a.n.saturating_sub(n0).min(cols) as u64;
    let n_dim = a.n as u64;
    let k_tiles = a.k.div_ceil(64);
    let n_iter = ks::slot_tiles(k_tiles, slot);
    // Stage addresses walk the ring without a division: `next` wraps.
    let ring_end = ring + depth_n * stage_bytes;
    let next = |at: u32| if at + stage_bytes == ring_end { ring } else { at + stage_bytes };
    let kt_of = |i: u32| slot + ks::SLOTS * i;
    let a_part = ks::a_offset_in_stage(kb, nfu);

    // The weight copies of slot tile i into its stage at `dst` (planes, scales).
    let issue_w = |a: &Args, i: u32, dst: u32| {
        if i < n_iter {
            let kt = kt_of(i) as u64;
            let (w0, _, w_end) = geo::w_window(n_dim, kt, n0 as u64, n_valid, K as u64);
            let (s0, _, s_end) = geo::s_window(n_dim, kt, n0 as u64, n_valid);
            unsafe {
                copy_window(dst, a.packed as *const u8, w0, w_end, ks::w_chunks(kb, nfu), lane);
                copy_window(dst + 16 * ks::w_chunks(kb, nfu), a.scales, s0, s_end, ks::s_chunks(nfu), lane);
            }
        }
    };
    let issue_a = |a: &Args, i: u32, dst: u32| {
        if i < n_iter {
            unsafe { copy_a(dst + a_part, a.x, a.m, a.k, kt_of(i), rows, lane) };
        }
    };

    // The weights are known before the wait in a dense call, and in a
    // grouped one whose units are experts (`grouped_unit`).
    let unit = ptx::bid_y();
    let early = grouped.is_none_or(|g| g.num_experts < g.total_rows);
    let mut a = if early && grouped.is_some() { expert_weights::<K>(a, unit) } else { *a };
    // Codebook reads and, when known, the weights of the first depth − 1
    // tiles go out before anything waits; weights and codebook are never
    // written by a kernel this launch may overlap. Their activations follow
    // the wait, each tile's in its weights' commit group (group i = tile i).
    let share = unsafe { fragment::load_table::<K, PAIRS>(a.cb, tid) };
    if early {
        let (mut i, mut at) = (0, ring);
        while i + 1 < depth_n {
            issue_w(&a, i, at);
            (i, at) = (i + 1, next(at));
        }
    }
    unsafe { fragment::store_table::<K, PAIRS, T>(tbl, &share, tid) };
    ptx::after_producers();
    if let Some(g) = grouped {
        // The unit's expert and rows (block-uniform): none, and the block
        // only lets its copies land before it leaves. (An expert with more
        // rows than max_m is recorded in `status`.)
        let Some((e, row, rows)) =
            (unsafe { crate::gemv::grouped_unit(g.offsets, g.num_experts, g.total_rows, g.status, a.m, unit) })
        else {
            return ptx::cp_async_wait::<0>();
        };
        if !early {
            a = expert_weights::<K>(&a, e);
        }
        a.x = a.x.wrapping_add(row as usize * a.k as usize);
        a.y = a.y.wrapping_add(row as usize * a.n as usize);
        a.m = rows;
    }
    let (a, m) = (a, a.m);
    let (mut i, mut at) = (0, ring);
    while i + 1 < depth_n {
        if !early {
            issue_w(&a, i, at);
        }
        issue_a(&a, i, at);
        ptx::cp_async_commit();
        (i, at) = (i + 1, next(at));
    }
    ptx::bar_sync();
    let rot = geo::rotations(2 * (lane & 3));
    let lanes = geo::lane_bytes(lane, kb, geo::PAIRS);
    let mut acc = [[0f32; 4]; NF];
    // `cur`: the stage of tile i; `fill`: the stage tile i + depth − 1
    // goes to, the one tile i − 1 used (every lane has read it: the warp
    // barrier at the end of each iteration).
    let (mut i, mut cur, mut fill) = (0, ring, ring_end - stage_bytes);
    while i < n_iter {
        issue_w(&a, i + depth_n - 1, fill);
        issue_a(&a, i + depth_n - 1, fill);
        ptx::cp_async_commit();
        ptx::cp_async_wait_dyn(depth_n - 1);
        ptx::syncwarp();
        let (off_w, off_s) = geo::window_offsets(a.n, kt_of(i), n0, kb);
        unsafe { tile_mma::<K, NF, T, X2>(cur, off_w, off_s, lane, &rot, tbl, lanes, &mut acc) };
        ptx::syncwarp();
        (i, fill, cur) = (i + 1, cur, next(cur));
    }

    // The reduction buffer lies over the rings: every warp is past its loop
    // (and its last copies) first.
    // With swapped operands only the first NF / 2 accumulator sets hold
    // values (fragment pairs, `swapped_c_pos`).
    let sw = fragment::swapped(X2, NF);
    let sets = if sw { nfu / 2 } else { nfu };
    ptx::bar_sync();
    unrolled!(NF, f => {
        if (f as u32) < sets {
            for (r, v) in acc[f].iter().enumerate() {
                unsafe { ptx::st_shared_f32(red + ks::red_offset(nfu, slot, f as u32, r as u32, lane), *v) };
            }
        }
    });
    ptx::bar_sync();
    // One thread per (set, register, lane): the same index as a red word
    // of slot 0, so consecutive threads read consecutive words.
    let outputs = sets * 4 * 32;
    let mut q = tid;
    while q < outputs {
        let (f, r, l) = (q >> 7, (q >> 5) & 3, q & 31);
        let (row, col) = if sw { geo::swapped_c_pos(f, l, r) } else { ks::c_pos(f, r, l) };
        let n = n0 + col;
        if row < m && n < a.n {
            let slot_stride = ks::red_offset(nfu, 1, 0, 0, 0);
            let at = red + ks::red_offset(nfu, 0, f, r, l);
            let mut v = unsafe { ptx::ld_shared_f32(at) };
            for s in 1..ks::SLOTS {
                v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(at + s * slot_stride) });
            }
            unsafe { *a.y.add(row as usize * a.n as usize + n as usize) = T::from_f32(v) };
        }
        q += ks::THREADS;
    }
}
