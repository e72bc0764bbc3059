//! Which form of the tensor-core GEMM runs a dense call at M = 5..8, the
//! K-slot variant or the pipelined kernel: a table of their measured time
//! ratios on the K × N grid of [`crate::small_m`], interpolated between
//! its points (and linearly in M between the two rows measured).
//!
//! Neither form wins by a line in (K, N). The K-slot variant gives each
//! block all of K for 8 to 32 columns and no split-K round trip, which
//! wins on short K: 0.54 of the pipelined kernel's time on 1024×512
//! (K × N) at M = 5, k = 2. Each of its blocks reads all of the
//! activations, and on long K the pipelined kernel's split-K grid spreads
//! the work better: 1.6 times the pipelined kernel's time on 8192×512 at
//! k = 2 (Llama-3-70B's k / v projections, 8192×1024, 1.3–1.6 times at
//! every k). The table holds `100 · ln(t_kslots / t_pipelined)` per (M, k,
//! K, N) from one run of `examples/mma_plan_sweep.rs --pair` on an H200
//! (132 SMs), commit 8a911e8, f16, cold L2, M = 5 and 8
//! (`bench-results/nvidia-h200-2026-11-28-kslots-grid.txt`). Points over
//! 2^25 weights, where the planner never takes the K-slot plan, hold the
//! last measured value of their row, so that shapes just below 2^25
//! interpolate toward measured values. Both forms are bound by latency
//! and instruction issue more than by the memory on matrices this small
//! (at most 2^25 weights), so the H100, with the same SMs and clocks,
//! uses the same table (not measured there).

use crate::Shape;
use crate::small_m::interpolate;

/// Fewest rows the table covers.
pub const M_MIN: usize = 5;
/// Most rows the table covers.
pub const M_MAX: usize = 8;

/// `100 · ln(t_kslots / t_pipelined)`, rounded (negative: the K-slot
/// variant is faster), indexed `[M = 5, 8][k − 2][K point][N point]`.
#[rustfmt::skip]
const RATIO: [[[[i8; 12]; 7]; 4]; 2] = [
    // M = 5
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-61, -33, -42, -46, -16, 19, -17, 21, -21, 9, 4, 34],
            [-52, -39, -49, -36, -44, -21, -15, 16, -19, 14, 0, 0],
            [-32, -28, -32, -30, -12, -20, 9, 8, -17, 2, 2, 2],
            [-14, -11, -16, -15, -14, -17, 3, 10, -4, -4, -4, -4],
            [10, 9, -5, -1, 5, -2, 16, 7, 7, 7, 7, 7],
            [36, 30, 14, 7, 25, -1, -1, -1, -1, -1, -1, -1],
            [48, 44, 22, 14, 34, 4, 4, 4, 4, 4, 4, 4],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -54, -46, -56, -47, -38, -30, -7, -41, 1, -14, 15],
            [-56, -34, -50, -41, -49, -39, -31, -8, -34, 0, -12, -12],
            [-36, -31, -35, -35, -31, -20, -31, -8, -31, -2, -2, -2],
            [-13, -12, -19, -20, -11, -23, -1, -6, -5, -5, -5, -5],
            [2, 5, -9, -3, 1, -17, 7, -4, -4, -4, -4, -4],
            [32, 23, 10, 1, 22, -10, -10, -10, -10, -10, -10, -10],
            [50, 35, 18, 8, 33, -7, -7, -7, -7, -7, -7, -7],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-64, -54, -43, -39, -5, -21, -8, 23, 8, 16, 11, 38],
            [-52, -36, -46, -37, -38, -24, -20, 22, 1, 10, -25, -25],
            [-35, -27, -27, -24, 2, -15, -23, 20, -9, 12, 12, 12],
            [-15, -14, -12, -15, -2, -3, -17, 14, 3, 3, 3, 3],
            [0, 2, -5, -1, 3, -10, -17, 12, 12, 12, 12, 12],
            [26, 20, 12, 4, 19, -5, -5, -5, -5, -5, -5, -5],
            [44, 34, 20, 11, 27, -4, -4, -4, -4, -4, -4, -4],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-58, -51, -46, -49, -44, -31, -21, 20, -12, 3, -11, 18],
            [-56, -35, -47, -40, -36, -25, -25, 13, -7, 0, -26, -26],
            [-21, -27, -33, -32, -27, -14, -28, 9, -14, 0, 0, 0],
            [-13, -8, -15, -17, -15, -17, -29, 7, 1, 1, 1, 1],
            [3, 2, -6, -6, -3, -14, -20, 5, 5, 5, 5, 5],
            [27, 17, 10, 0, 12, -10, -10, -10, -10, -10, -10, -10],
            [46, 25, 17, 5, 19, -8, -8, -8, -8, -8, -8, -8],
        ],
    ],
    // M = 8
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -23, -35, -45, -18, -7, 4, 44, -11, 18, 13, 28],
            [-51, -37, -43, -34, -6, -11, 11, 21, -26, 16, 1, 1],
            [-31, -28, -31, -28, -12, -2, -2, 12, -12, 18, 18, 18],
            [-14, -10, -12, -13, -13, -15, 8, 13, -1, -1, -1, -1],
            [10, 10, -4, -1, 7, 10, 20, 26, 26, 26, 26, 26],
            [36, 30, 14, 11, 29, 2, 2, 2, 2, 2, 2, 2],
            [48, 44, 23, 14, 36, 11, 11, 11, 11, 11, 11, 11],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-59, -49, -52, -56, -47, -41, -30, -7, -41, 2, -12, 16],
            [-49, -18, -50, -41, -49, -39, -31, -8, -34, 0, -12, -12],
            [-35, -11, -34, -35, -30, -20, -24, -8, -31, -1, -1, -1],
            [-13, -1, -19, -20, -11, -23, -1, -6, -5, -5, -5, -5],
            [2, 5, -8, -3, 1, -17, 7, -4, -4, -4, -4, -4],
            [32, 24, 10, 1, 22, -10, -10, -10, -10, -10, -10, -10],
            [50, 37, 18, 8, 33, -6, -6, -6, -6, -6, -6, -6],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-63, -51, -30, -31, 1, -20, -6, 31, 12, 22, 12, 40],
            [-52, -34, -44, -34, -18, -17, -13, 29, 2, 18, -24, -24],
            [-34, -27, -22, -18, -9, 0, 10, 23, -8, 14, 14, 14],
            [-15, -13, -13, -16, 0, -2, -19, 25, 4, 4, 4, 4],
            [0, 3, -6, 0, 12, 10, -12, 20, 20, 20, 20, 20],
            [26, 21, 12, 5, 26, -4, -4, -4, -4, -4, -4, -4],
            [44, 34, 20, 10, 28, 9, 9, 9, 9, 9, 9, 9],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-50, -34, -47, -49, -41, -31, -20, 20, -12, 3, -11, 17],
            [-59, -33, -46, -40, -37, -25, -25, 13, -6, 1, -26, -26],
            [-26, -9, -32, -32, -27, -14, -29, 10, -14, 0, 0, 0],
            [-13, -8, -14, -17, -15, -17, -30, 6, 1, 1, 1, 1],
            [3, 3, -6, -6, -3, -14, -20, 4, 4, 4, 4, 4],
            [27, 20, 11, 0, 12, -10, -10, -10, -10, -10, -10, -10],
            [47, 27, 17, 5, 18, -9, -9, -9, -9, -9, -9, -9],
        ],
    ],
];

/// `100 · ln(t_kslots / t_pipelined)` interpolated for `m` rows of a
/// dense `shape` weight of `bits` bits, or `None` outside M = 5..8,
/// k = 2..5.
///
/// ```
/// use kbit::{Shape, mid_m::log_ratio};
/// // Grid points at M = 5 and 8 return their measurement; M = 6, 7 lie
/// // on the line between them. Llama-3-70B's k / v projection (8192×1024):
/// let kv = Shape::new(1024, 8192)?;
/// assert_eq!(log_ratio(5, kv, 4), Some(34.0));
/// assert_eq!(log_ratio(8, kv, 4), Some(34.0));
/// assert_eq!(log_ratio(4, kv, 4), None);
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn log_ratio(m: usize, shape: Shape, bits: u32) -> Option<f32> {
    if !(M_MIN..=M_MAX).contains(&m) || !(2..=5).contains(&bits) {
        return None;
    }
    let at = |row: usize| interpolate(&RATIO[row][(bits - 2) as usize], shape);
    let f = (m - M_MIN) as f32 / (M_MAX - M_MIN) as f32;
    Some(at(0) * (1.0 - f) + at(1) * f)
}

/// Whether a dense call of `m` rows (5..8) on a `shape` weight of `bits`
/// bits runs the K-slot variant: where [`log_ratio`] says it is faster
/// than the pipelined kernel.
///
/// ```
/// use kbit::{Shape, mid_m::prefers_kslots};
/// assert!(prefers_kslots(8, Shape::new(512, 2048)?, 4)); // Qwen3 k / v: 2048 → 512
/// assert!(!prefers_kslots(8, Shape::new(1024, 8192)?, 4)); // Llama-3-70B k / v
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn prefers_kslots(m: usize, shape: Shape, bits: u32) -> bool {
    log_ratio(m, shape, bits).is_some_and(|r| r < 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(k: usize, n: usize) -> Shape {
        Shape::new(n, k).unwrap()
    }

    #[test]
    fn rows_interpolate_in_m() {
        // 8192×512 at k = 2: 48 at M = 5 and 8; 1024×512 at k = 5: −58 and −50.
        for m in 5..=8 {
            assert_eq!(log_ratio(m, shape(8192, 512), 2), Some(48.0));
        }
        let want = |m: usize| -58.0 + 8.0 * (m - 5) as f32 / 3.0;
        for m in 5..=8 {
            assert!((log_ratio(m, shape(1024, 512), 5).unwrap() - want(m)).abs() < 1e-4);
        }
        assert_eq!(log_ratio(9, shape(1024, 512), 5), None);
        assert_eq!(log_ratio(5, shape(1024, 512), 6), None);
    }

    #[test]
    fn measured_winners() {
        // (K, N, M, k, K-slot variant faster), from the grid run (µs, K-slot
        // against pipelined).
        let cases = [
            (1024, 512, 5, 2, true),   // 1.69 against 3.12
            (2048, 512, 8, 4, true),   // Qwen3 k / v: 2.52 against 3.55
            (8192, 1024, 5, 4, false), // Llama-3-70B k / v: 8.86 against 6.30
            (8192, 512, 5, 2, false),  // 8.59 against 5.31
            (2048, 10240, 5, 5, true), // GLM shared
            (4096, 8192, 8, 2, false),
        ];
        for (k, n, m, bits, kslots) in cases {
            assert_eq!(prefers_kslots(m, shape(k, n), bits), kslots, "{k}x{n} M={m} k={bits}");
        }
    }
}
