//! Kernel 2, direct-load variant: the tensor-core dequant GEMM for M ≤ 4
//! on large matrices. Each lane loads the plane words and scale bytes of
//! two whole quant blocks straight into registers (one 16-byte load each
//! at k = 4), a step ahead of the step it multiplies; nothing of the
//! weights passes through shared memory but the pair-table lookups. The
//! layout of a step, the lane map and shared memory are in
//! `kbit_format::mma_direct`.
//!
//! Per lane and step (64 weights): 32 pair lookups and 32 scale products
//! (`fragment::dequant`, as in the other tensor-core kernels), 8 mmas with
//! the weights as A (16 columns) and the activation rows as B, 4 shared
//! loads of staged activations, 2 weight loads.
//!
//! # Work mapping
//!
//! The grid is persistent: block b walks groups `b, b + grid, …` of 16
//! columns; warp w takes the steps `w, w + 16, …` of each and accumulates
//! them in one set of f32 registers. After a group each warp stores its
//! accumulators to a reduction buffer, one block barrier, and one thread
//! per output adds the 16 warps' values in warp order and rounds once to
//! T (the order depends on nothing but the shape: the same bits on every
//! call). Groups alternate between two buffers, so the next group's
//! stores never meet this group's reads without the barrier between.
//!
//! # Numerics
//!
//! Each weight is `T(T(cb) · T(amax))` and the products are summed in f32
//! on the tensor cores, as in the other tensor-core kernels.

use crate::elem::Elem;
use crate::fragment::{self, MmaElem, PAIRS};
use crate::mma::unrolled;
use crate::ptx;
use kbit_format::mma as geo;
use kbit_format::mma_direct as dg;

/// Kernel arguments (all validated by the host).
#[derive(Clone, Copy)]
pub struct Args {
    /// Activations `[M, K]`, 16-byte aligned.
    pub x: *const u16,
    /// The weight in the runtime layout: plane words, E4M4 scale bytes,
    /// and the codebook (`2^k` f32).
    pub packed: *const u32,
    /// See `packed`.
    pub scales: *const u8,
    /// See `packed`.
    pub cb: *const f32,
    /// Output `[M, N]`.
    pub y: *mut u16,
    /// Rows of x and y (1..=4; 1 with R = 1).
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K (a multiple of 32).
    pub k: u32,
}

/// A lane's weights of one step: the plane words and scale bytes of its
/// quant block in columns g (`[0]`) and g + 8 (`[1]`); zero where the
/// column is past N or the block past K, which makes every weight ±0.
#[derive(Clone, Copy)]
struct Blocks<const K: usize> {
    planes: [[u32; K]; 2],
    scales: [u32; 2],
}

impl<const K: usize> Blocks<K> {
    const ZERO: Self = Self { planes: [[0; K]; 2], scales: [0; 2] };

    /// Loads the blocks of lane quarter `t`, columns `col` and `col + 8`,
    /// step `s`; zero if `live` is false.
    ///
    /// # Safety
    /// The host validated the weight for `a.n`, `a.k`.
    #[inline(always)]
    unsafe fn load(a: &Args, live: bool, col: u32, s: u32, t: u32) -> Self {
        let mut b = Self::ZERO;
        let qb = 4 * s + t;
        if !live || 32 * qb >= a.k {
            return b;
        }
        let kt = qb >> 1;
        unrolled!(2, j => {
            let c = col + 8 * j as u32;
            if c < a.n {
                // Runtime layout: block (c, qb) is slot (kt·N + c)·2 + h,
                // its K words from word slot·K (slots fit 32 bits).
                let slot = (kt * a.n + c) * 2 + (qb & 1);
                let p = a.packed.wrapping_add(slot as usize * K);
                b.planes[j] = unsafe { load_planes::<K>(p) };
                b.scales[j] = unsafe { ptx::ld_nc_u8(a.scales.wrapping_add(slot as usize)) } as u32;
            }
        });
        b
    }
}

/// One quant block's `K` plane words from global memory, as wide as the
/// block's alignment allows (k = 2: 8 bytes, k = 4: 16 bytes).
///
/// # Safety
/// `p` points at `K` words of the weight, aligned to `4·K` when K is 2 or 4.
#[inline(always)]
unsafe fn load_planes<const K: usize>(p: *const u32) -> [u32; K] {
    let mut w = [0u32; K];
    unsafe {
        match K {
            2 => {
                let [a, b] = ptx::ld_nc_v2_l2_256(p);
                w[0] = a;
                w[1] = b;
            }
            4 => w.copy_from_slice(&ptx::ld_nc_v4(p)),
            _ => {
                for (j, wj) in w.iter_mut().enumerate() {
                    *wj = ptx::ld_nc_u32(p.add(j));
                }
            }
        }
    }
    w
}

/// Multiplies one step: `blk` (this lane's blocks), the staged activations
/// of the step at `xs` (this lane's quarter and row already added), into
/// `acc`.
#[inline(always)]
unsafe fn step_mma<const K: usize, const R: u32, T: MmaElem>(
    blk: &Blocks<K>,
    xs: u32,
    tbl: u32,
    lanes: u32,
    acc: &mut [f32; 4],
) {
    // B of mmas 2·i2 and 2·i2 + 1 (chunk i2 of the lane's quarter).
    let xb: [[u32; 4]; 4] = core::array::from_fn(|i2| unsafe { ptx::ld_shared_v4(xs + 64 * R * i2 as u32) });
    unrolled!(2, odd => {
        let [t0, t2] = dg::two_t(odd as u32);
        let (r0, r2) = (&geo::rotations(t0), &geo::rotations(t2));
        let w = |j: usize, rot: &[u32; 8]| unsafe {
            let (planes, scale) = (&blk.planes[j], blk.scales[j]);
            if K == 5 {
                fragment::dequant::<K, 1, T>(planes, rot, tbl, lanes, scale)
            } else {
                fragment::dequant::<K, PAIRS, T>(planes, rot, tbl, lanes, scale)
            }
        };
        // Pairs 8q + two_t: a0 (row g) / a1 (row g + 8) at two_t = 4·odd,
        // a2 / a3 at 4·odd + 2, for mma 2q + odd.
        let (a0, a1, a2, a3) = (w(0, r0), w(1, r0), w(0, r2), w(1, r2));
        unrolled!(4, q => {
            let i = 2 * q + odd;
            let x = &xb[i / 2];
            let b = if i % 2 == 0 { [x[0], x[1]] } else { [x[2], x[3]] };
            *acc = T::mma([a0[q], a1[q], a2[q], a3[q]], b, *acc);
        });
    });
}

/// Stages the activations in the step order of `kbit_format::mma_direct`
/// (rows ≥ M and elements past K as zeros): 16-byte loads and stores (the
/// same copies by `cp.async` made every call ≈ 2.7 µs slower, measured).
/// The caller's block barrier publishes them.
///
/// # Safety
/// `x` holds `m` rows of `k` values, 16-byte aligned; the block has
/// [`dg::THREADS`] threads.
#[inline(always)]
unsafe fn stage_x<const R: u32>(xbase: u32, x: *const u16, m: u32, k: u32, tid: u32) {
    let chunks = dg::steps(k) * (dg::STEP_K / 8);
    for r in 0..R {
        let mut c = tid;
        while c < chunks {
            let e = 8 * c;
            let v = if r < m && e < k {
                unsafe { ptx::ld_nc_v4(x.wrapping_add((r * k + e) as usize) as *const u32) }
            } else {
                [0; 4]
            };
            let (s, i2, t, _) = dg::x_place(e);
            unsafe { ptx::st_shared_v4(xbase + dg::x_offset(R, s, i2, t, r), v) };
            c += dg::THREADS;
        }
    }
}

/// Body of the `kbit_mma_direct_k{K}_r{R}_{T}` kernels.
///
/// # Safety
/// The host validated every pointer and size in `a` (M ≤ R, or M = 1 with
/// R = 1); the launch has [`dg::THREADS`] threads and
/// `mma_direct::smem_bytes(K, R, k)` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run<const K: usize, const R: u32, T: MmaElem>(a: &Args) {
    const { assert!(K >= 2 && K <= 5 && (R == 1 || R == 4)) };
    let tid = ptx::tid();
    let (lane, w) = (tid & 31, tid >> 5);
    let (g, t) = (lane >> 2, lane & 3);
    let smem = ptx::smem_base();
    let tbl = smem;
    let xbase = smem + dg::x_base(K as u32);
    let (groups, k_steps) = (dg::groups(a.n), dg::steps(a.k));
    let (grid, bid) = (ptx::grid_dim(), ptx::bid());

    // Codebook and the first step's weights before the wait (neither is
    // written by a kernel this launch may overlap), then the activations.
    let table = tid < geo::THREADS;
    let share = match (table, K == 5) {
        (false, _) => fragment::TableShare::ZERO,
        (true, true) => unsafe { fragment::load_table::<K, 1>(a.cb, tid) },
        (true, false) => unsafe { fragment::load_table::<K, PAIRS>(a.cb, tid) },
    };
    let col_of = |group: u32| dg::GROUP_COLS * group + g;
    // The warp's step after (group, s): in this group, else the first of
    // the block's next group.
    let after = |group: u32, s: u32| if s + dg::WARPS < k_steps { (group, s + dg::WARPS) } else { (group + grid, w) };
    let live = |group: u32, s: u32| group < groups && s < k_steps;
    let mut next = unsafe { Blocks::<K>::load(a, live(bid, w), col_of(bid), w, t) };
    if table && K == 5 {
        unsafe { fragment::store_table::<K, 1, T>(tbl, &share, tid) };
    } else if table {
        unsafe { fragment::store_table::<K, PAIRS, T>(tbl, &share, tid) };
    }
    ptx::after_producers();
    unsafe { stage_x::<R>(xbase, a.x, a.m, a.k, tid) };
    ptx::bar_sync();

    let lanes = geo::lane_bytes(lane, K as u32, dg::table_mb(K as u32));
    // This lane's quarter and activation row within a step's chunk.
    let x_lane = xbase + dg::x_offset(R, 0, 0, t, g % R);
    let step_bytes = dg::x_offset(R, 1, 0, 0, 0);
    let mut parity = 0;
    let mut group = bid;
    while group < groups {
        let mut acc = [0f32; 4];
        let mut s = w;
        while s < k_steps {
            let cur = next;
            // The next step's weights into registers while this one computes.
            let (ng, ns) = after(group, s);
            next = unsafe { Blocks::<K>::load(a, ng < groups, col_of(ng), ns, t) };
            unsafe { step_mma::<K, R, T>(&cur, x_lane + s * step_bytes, tbl, lanes, &mut acc) };
            s += dg::WARPS;
        }
        let red = smem + dg::red_base(K as u32, R, a.k, parity);
        unsafe { ptx::st_shared_v4(red + 16 * tid, acc.map(f32::to_bits)) };
        ptx::bar_sync();
        // One thread per output (x row, group column), warps added in order.
        let outs = a.m * dg::GROUP_COLS;
        if tid < outs {
            let (row, col) = (tid / dg::GROUP_COLS, tid % dg::GROUP_COLS);
            let n = dg::GROUP_COLS * group + col;
            if n < a.n {
                let (src_lane, i) = dg::c_source(row, col);
                let at = red + 16 * src_lane + 4 * i;
                let mut v = unsafe { ptx::ld_shared_f32(at) };
                for ww in 1..dg::WARPS {
                    v = ptx::add_rn_f32(v, unsafe { ptx::ld_shared_f32(at + 512 * ww) });
                }
                unsafe { *a.y.add(row as usize * a.n as usize + n as usize) = T::from_f32(v) };
            }
        }
        parity ^= 1;
        group += grid;
    }
}
