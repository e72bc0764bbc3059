//! Which form of the tensor-core GEMM runs a dense call at M = 5..8, the
//! K-slot variant or the pipelined kernel, where their measured times
//! differ clearly: a table of their time ratios on the K × N grid of
//! [`crate::small_m`], interpolated between its points (and linearly in M
//! between the two rows measured).
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
//! (132 SMs), commit e7c7e6c's kernels, the benchmark's values, f16, cold
//! L2, M = 5 and 8 (`bench-results/nvidia-h200-2026-11-28-kslots-grid.txt`;
//! a first run with other values agreed within 1.6 on every point). Points
//! over 2^25 weights, where the planner never takes the K-slot plan, hold
//! the last measured value of their row, so that shapes just below 2^25
//! interpolate toward measured values.
//!
//! At k = 4 the table decides only beyond [`MARGIN_K4`]: there the K-slot
//! variant's time moves by as much from one process to another, most
//! likely with where the weights lie in memory (4096×4096, M = 8: 10.30 µs
//! in the grid run and 8.59 µs in a second process of the same program
//! right after it on the same GPU, the pipelined kernel 9.28 / 9.20; Qwen3
//! gate/up, 2048×5120: 7.07 in the sweep and 6.05 in `kbit-bench`), while
//! at k = 2, 3, 5 the two programs agree within about 1 % on the shapes
//! compared (GLM shared, 8192×1024); within the margin the planner's
//! resident-grid rules choose. Both forms are bound by latency and
//! instruction issue more than by the memory on matrices this small (at
//! most 2^25 weights), so the H100, with the same SMs and clocks, uses the
//! same table (not measured there).

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
            [-61, -33, -43, -46, -18, 19, -17, 20, -21, 10, 5, 34],
            [-51, -39, -49, -36, -44, -21, -15, 16, -19, 14, 0, 0],
            [-32, -29, -33, -30, -9, -20, 9, 8, -19, 2, 2, 2],
            [-14, -11, -16, -15, -14, -16, 3, 10, -4, -4, -4, -4],
            [10, 9, -5, -1, 5, -2, 15, 7, 7, 7, 7, 7],
            [36, 30, 14, 7, 26, -1, -1, -1, -1, -1, -1, -1],
            [48, 43, 23, 14, 34, 4, 4, 4, 4, 4, 4, 4],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -54, -46, -56, -47, -36, -30, -7, -42, 2, -13, 15],
            [-55, -35, -50, -41, -48, -39, -31, -8, -34, 0, -12, -12],
            [-35, -31, -35, -35, -31, -20, -31, -8, -31, -2, -2, -2],
            [-13, -12, -19, -20, -11, -23, -1, -6, -5, -5, -5, -5],
            [2, 5, -9, -3, 1, -17, 7, -4, -4, -4, -4, -4],
            [32, 23, 10, 1, 22, -10, -10, -10, -10, -10, -10, -10],
            [50, 35, 18, 8, 33, -7, -7, -7, -7, -7, -7, -7],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-64, -54, -43, -39, -6, -21, -8, 23, 8, 16, 10, 38],
            [-52, -36, -46, -37, -39, -23, -21, 23, 1, 10, -25, -25],
            [-35, -28, -27, -24, 2, -15, -23, 20, -9, 12, 12, 12],
            [-15, -14, -12, -15, -2, -4, -17, 13, 3, 3, 3, 3],
            [0, 3, -5, 0, 3, -10, -16, 13, 13, 13, 13, 13],
            [26, 20, 12, 5, 19, -5, -5, -5, -5, -5, -5, -5],
            [44, 34, 20, 11, 27, -4, -4, -4, -4, -4, -4, -4],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-58, -51, -46, -49, -44, -30, -20, 21, -12, 4, -11, 17],
            [-56, -35, -47, -40, -36, -25, -25, 13, -6, 0, -26, -26],
            [-21, -27, -33, -32, -27, -14, -29, 9, -14, 0, 0, 0],
            [-13, -9, -15, -17, -14, -16, -29, 7, 1, 1, 1, 1],
            [3, 2, -6, -6, -3, -13, -19, 5, 5, 5, 5, 5],
            [27, 17, 10, 0, 12, -10, -10, -10, -10, -10, -10, -10],
            [46, 26, 17, 6, 19, -8, -8, -8, -8, -8, -8, -8],
        ],
    ],
    // M = 8
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -23, -35, -45, -14, -7, 4, 44, -11, 18, 12, 28],
            [-51, -37, -44, -34, -6, -11, 11, 21, -27, 16, 1, 1],
            [-31, -29, -31, -28, -12, -2, -2, 12, -12, 18, 18, 18],
            [-14, -10, -12, -14, -13, -14, 7, 13, 0, 0, 0, 0],
            [10, 9, -4, -1, 7, 9, 20, 26, 26, 26, 26, 26],
            [36, 30, 14, 11, 29, 2, 2, 2, 2, 2, 2, 2],
            [48, 43, 23, 14, 36, 12, 12, 12, 12, 12, 12, 12],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-58, -50, -50, -56, -46, -42, -30, -8, -42, 2, -12, 16],
            [-49, -18, -50, -41, -49, -39, -31, -8, -34, 0, -12, -12],
            [-35, -11, -34, -35, -30, -20, -25, -8, -31, -1, -1, -1],
            [-13, -2, -19, -20, -11, -23, -1, -6, -5, -5, -5, -5],
            [2, 5, -8, -3, 1, -17, 7, -4, -4, -4, -4, -4],
            [32, 24, 10, 1, 22, -10, -10, -10, -10, -10, -10, -10],
            [50, 37, 18, 8, 33, -7, -7, -7, -7, -7, -7, -7],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-63, -51, -31, -31, 0, -20, -6, 30, 11, 22, 12, 40],
            [-51, -34, -44, -34, -17, -17, -13, 29, 2, 17, -24, -24],
            [-34, -27, -22, -19, -9, 0, 10, 23, -8, 14, 14, 14],
            [-15, -13, -13, -15, -1, -2, -19, 24, 4, 4, 4, 4],
            [0, 3, -5, 0, 12, 10, -12, 20, 20, 20, 20, 20],
            [26, 21, 12, 5, 26, -4, -4, -4, -4, -4, -4, -4],
            [44, 34, 20, 10, 28, 9, 9, 9, 9, 9, 9, 9],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-51, -34, -46, -48, -41, -30, -20, 20, -12, 4, -11, 17],
            [-59, -33, -46, -39, -36, -25, -25, 13, -6, 1, -26, -26],
            [-26, -9, -32, -32, -27, -14, -29, 9, -14, 0, 0, 0],
            [-12, -8, -14, -17, -15, -17, -30, 7, 1, 1, 1, 1],
            [3, 3, -6, -6, -3, -14, -20, 5, 5, 5, 5, 5],
            [27, 20, 10, 0, 12, -10, -10, -10, -10, -10, -10, -10],
            [46, 27, 17, 5, 18, -8, -8, -8, -8, -8, -8, -8],
        ],
    ],
];

/// Smallest `|100 · ln(t_kslots / t_pipelined)|` the table decides on at
/// k = 4 (about 10 % either way); at k = 2, 3, 5 any difference decides.
pub const MARGIN_K4: f32 = 10.0;

/// `100 · ln(t_kslots / t_pipelined)` interpolated for `m` rows of a
/// dense `shape` weight of `bits` bits, or `None` outside M = 5..8,
/// k = 2..5.
///
/// ```
/// use kbit::{Shape, mid_m::log_ratio};
/// // Llama-3-70B's k / v projection (8192×1024) at k = 4: the pipelined
/// // kernel is ≈ 1.4 times faster at M = 5 and at M = 8.
/// let kv = Shape::new(1024, 8192)?;
/// assert!(log_ratio(5, kv, 4).unwrap() > 30.0 && log_ratio(8, kv, 4).unwrap() > 30.0);
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

/// For a dense call of `m` rows (5..8) on a `shape` weight of `bits` bits:
/// `Some(true)` where [`log_ratio`] says the K-slot variant is faster (at
/// k = 4 by more than [`MARGIN_K4`]), `Some(false)` where the pipelined
/// kernel is, `None` in between and outside the table.
///
/// ```
/// use kbit::{Shape, mid_m::verdict};
/// assert_eq!(verdict(8, Shape::new(512, 2048)?, 4), Some(true)); // Qwen3 k / v: 2048 → 512
/// assert_eq!(verdict(8, Shape::new(1024, 8192)?, 4), Some(false)); // Llama-3-70B k / v
/// assert_eq!(verdict(8, Shape::new(5120, 2048)?, 4), None); // Qwen3 gate/up: within the margin
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn verdict(m: usize, shape: Shape, bits: u32) -> Option<bool> {
    let margin = if bits == 4 { MARGIN_K4 } else { 0.0 };
    match log_ratio(m, shape, bits)? {
        r if r < -margin => Some(true),
        r if r > margin => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(k: usize, n: usize) -> Shape {
        Shape::new(n, k).unwrap()
    }

    #[test]
    fn rows_interpolate_in_m() {
        for bits in 2..=5u32 {
            for (k, n) in [(1024, 512), (8192, 512), (2048, 10240)] {
                let (a, b) = (log_ratio(5, shape(k, n), bits).unwrap(), log_ratio(8, shape(k, n), bits).unwrap());
                for m in 6..=7 {
                    let want = a + (b - a) * (m - 5) as f32 / 3.0;
                    assert!((log_ratio(m, shape(k, n), bits).unwrap() - want).abs() < 1e-3);
                }
            }
        }
        assert_eq!(log_ratio(9, shape(1024, 512), 5), None);
        assert_eq!(log_ratio(5, shape(1024, 512), 6), None);
    }

    #[test]
    fn measured_winners() {
        // (K, N, M, k, verdict), from the grid run (µs, K-slot against
        // pipelined).
        let cases = [
            (1024, 512, 5, 2, Some(true)),   // 1.71 against 3.13
            (2048, 512, 8, 4, Some(true)),   // Qwen3 k / v
            (8192, 1024, 5, 4, Some(false)), // Llama-3-70B k / v
            (8192, 512, 5, 2, Some(false)),
            (2048, 10240, 5, 5, Some(true)), // GLM shared
            (4096, 8192, 8, 2, Some(false)),
            (4096, 2048, 8, 4, None), // within the margin
        ];
        for (k, n, m, bits, v) in cases {
            assert_eq!(verdict(m, shape(k, n), bits), v, "{k}x{n} M={m} k={bits}");
        }
    }
}
