//! Which kernel `linear` runs at M = 2..4, the scalar GEMV or the MMA
//! kernel: a table of their measured time ratios on a grid of shapes,
//! interpolated between its points.
//!
//! The two kernels' plans change by shape in steps (the GEMV's column-slot
//! and block variants, the MMA kernel's K-slot, split-K and stream-K
//! plans), so the crossover is no single line in (K, N): on the grid below
//! the MMA kernel takes 0.57 of the GEMV's time on 1024×512 (K × N) at
//! M = 2, k = 4 and 1.48 times it on 8192×8192. The table holds `100 · ln(t_mma / t_gemv)`
//! per (M, k, K, N) from one run of `kbit-bench` on an H100 (132 SMs),
//! commit b802aec: K ∈ {1024, 2048, 4096, 8192} × N ∈ {512, 1024, 2048,
//! 4096, 8192, 14336, 28672}, f16, cold L2
//! (`bench-results/nvidia-h100-80gb-hbm3-2026-11-27-b802aec-grid.{md,json}`,
//! and the Llama-3-70B rows of `…-b802aec.*` for 8192×28672), and the
//! same ratios for three design shapes off the grid. Another shape
//! between grid points takes the bilinear interpolation in (log2 K,
//! log2 N); outside the grid, the nearest edge. Other GPUs use the same
//! table.

use crate::Shape;

/// log2 of the K grid points.
const LOG_K: [f32; 4] = [10.0, 11.0, 12.0, 13.0];

/// log2 of the N grid points: 512 … 8192, 14336, 28672.
const LOG_N: [f32; 7] = [9.0, 10.0, 11.0, 12.0, 13.0, 13.807_355, 14.807_355];

/// `100 · ln(t_mma / t_gemv)`, rounded (negative: the MMA kernel is
/// faster), indexed `[M − 2][k − 2][K point][N point]`.
#[rustfmt::skip]
const RATIO: [[[[i8; 7]; 4]; 4]; 3] = [
    // M = 2
    [
        // k = 2: K = 1024, 2048, 4096, 8192
        [
            [-50, -13, -4, 32, 14, -2, -20],
            [8, -6, 6, 7, 19, -5, 2],
            [24, 6, 19, 17, 29, -1, -2],
            [33, 12, 25, 22, 33, -18, -29],
        ],
        // k = 3: K = 1024, 2048, 4096, 8192
        [
            [-31, 3, 2, 6, 22, 0, -9],
            [20, 8, 10, 13, 23, 3, -10],
            [38, 21, 21, 19, 28, 6, -4],
            [46, 26, 22, 18, 46, -7, -4],
        ],
        // k = 4: K = 1024, 2048, 4096, 8192
        [
            [-57, -22, -2, 27, 7, -3, -33],
            [2, -4, 5, -2, 8, -19, -2],
            [14, 6, 10, 4, 36, 6, -2],
            [21, 7, 16, 16, 39, -13, -2],
        ],
        // k = 5: K = 1024, 2048, 4096, 8192
        [
            [-21, 7, 8, 6, 27, 23, -8],
            [14, 21, 4, 10, 30, 13, 5],
            [26, 24, 15, 14, 38, 14, 7],
            [27, 20, 18, 11, 40, -5, 7],
        ],
    ],
    // M = 3
    [
        // k = 2: K = 1024, 2048, 4096, 8192
        [
            [-74, -34, -13, 19, -7, -22, -57],
            [-17, -19, -6, -19, -8, -36, -20],
            [-3, -14, -3, -14, 11, -27, -30],
            [3, -12, -2, 2, -1, -54, -50],
        ],
        // k = 3: K = 1024, 2048, 4096, 8192
        [
            [-58, -20, -12, -10, -3, -18, -30],
            [-2, -6, -6, -15, -8, -25, -17],
            [11, 0, -3, -12, 11, -21, -22],
            [17, 2, 0, 4, 7, -46, -42],
        ],
        // k = 4: K = 1024, 2048, 4096, 8192
        [
            [-65, -29, 2, 19, -3, -16, -44],
            [-7, -13, -3, -16, -7, -35, -27],
            [3, -10, -4, -13, 15, -23, -38],
            [6, -12, 0, 6, 16, -35, -47],
        ],
        // k = 5: K = 1024, 2048, 4096, 8192
        [
            [-44, -8, -2, -4, 16, 8, -22],
            [0, 7, -9, -7, 9, -4, 8],
            [8, 11, -1, -7, 28, 0, 4],
            [7, 5, 2, 7, 29, -17, -13],
        ],
    ],
    // M = 4
    [
        // k = 2: K = 1024, 2048, 4096, 8192
        [
            [-88, -46, -18, 9, 18, -38, -73],
            [-37, -30, -16, -31, -17, -52, -36],
            [-31, -26, -15, -28, 8, -45, -61],
            [-28, -25, -13, -7, -6, -59, -70],
        ],
        // k = 3: K = 1024, 2048, 4096, 8192
        [
            [-69, -30, -17, -19, -16, -32, -43],
            [-26, -16, -16, -27, -21, -38, -24],
            [-17, -12, -14, -25, -14, -45, -47],
            [-12, -10, -11, 0, -8, -59, -54],
        ],
        // k = 4: K = 1024, 2048, 4096, 8192
        [
            [-81, -41, -7, 9, -15, -31, -59],
            [-37, -25, -14, -28, -21, -49, -45],
            [-32, -24, -15, -26, 1, -39, -55],
            [-31, -26, -13, -2, -2, -51, -66],
        ],
        // k = 5: K = 1024, 2048, 4096, 8192
        [
            [-65, -25, -14, -13, -4, -7, -32],
            [-33, -19, -11, -23, -5, -24, -9],
            [-28, -20, -12, -20, -3, -30, -28],
            [-29, -24, -4, 3, 0, -40, -33],
        ],
    ],
];

/// Shapes measured off the grid, which take their own ratios: `(K, N,
/// [M − 2][k − 2])` from the tables of b802aec (`…-b802aec.*`). Qwen3
/// gate/up and down and GLM shared lie between grid points where the
/// GEMV's plan changes step (GLM shared's 8 K slots per column against 4
/// at N = 14336): interpolated, GLM shared at M = 2, k = 4 would run the
/// MMA kernel, 22 % slower.
#[rustfmt::skip]
const MEASURED: [(usize, usize, [[i8; 4]; 3]); 3] = [
    (2048, 5120, [[1, 5, 7, 18], [-22, -16, -8, 2], [-36, -29, -23, -20]]), // Qwen3 gate/up
    (5120, 2048, [[18, 22, 12, 15], [-5, -4, -2, -1], [-18, -15, -15, -10]]), // Qwen3 down
    (2048, 10240, [[-6, 1, 20, 40], [-31, -21, 6, 22], [-43, -39, -11, 7]]), // GLM-4.7 shared
];

/// The segment of `points` that holds `x` and the fraction of the way
/// along it (clamped to the ends).
fn locate(points: &[f32], x: f32) -> (usize, f32) {
    let last = points.len() - 2;
    let i = points.windows(2).position(|w| x < w[1]).unwrap_or(last);
    let f = (x - points[i]) / (points[i + 1] - points[i]);
    (i, f.clamp(0.0, 1.0))
}

/// `100 · ln(t_mma / t_gemv)` interpolated for `m` rows of a `shape`
/// weight of `bits` bits, or `None` outside M = 2..4, k = 2..5.
///
/// ```
/// use kbit::{Shape, small_m::log_ratio};
/// // Grid points return their measurement: 2048×512 (K × N) at M = 2, k = 4.
/// assert_eq!(log_ratio(2, Shape::new(512, 2048)?, 4), Some(2.0));
/// assert_eq!(log_ratio(1, Shape::new(512, 2048)?, 4), None);
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn log_ratio(m: usize, shape: Shape, bits: u32) -> Option<f32> {
    if !(2..=4).contains(&m) || !(2..=5).contains(&bits) {
        return None;
    }
    if let Some((_, _, r)) = MEASURED.iter().find(|&&(k, n, _)| (k, n) == (shape.k, shape.n)) {
        return Some(f32::from(r[m - 2][(bits - 2) as usize]));
    }
    let t = &RATIO[m - 2][(bits - 2) as usize];
    let (ki, kf) = locate(&LOG_K, (shape.k.max(1) as f32).log2());
    let (ni, nf) = locate(&LOG_N, (shape.n.max(1) as f32).log2());
    let row = |i: usize| f32::from(t[i][ni]) * (1.0 - nf) + f32::from(t[i][ni + 1]) * nf;
    Some(row(ki) * (1.0 - kf) + row(ki + 1) * kf)
}

/// Whether `linear` runs the MMA kernel rather than the scalar GEMV for
/// `m` rows of a `shape` weight of `bits` bits: where [`log_ratio`] says it
/// is faster. Never at M = 1 (the GEMV is ahead on every shape measured)
/// or M > 4 (the GEMV serves M ≤ 4).
///
/// ```
/// use kbit::{Shape, small_m::prefers_mma};
/// let kv = Shape::new(512, 2048)?; // N = 512, K = 2048
/// assert!(!prefers_mma(1, kv, 4));
/// assert!(prefers_mma(4, kv, 4));
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn prefers_mma(m: usize, shape: Shape, bits: u32) -> bool {
    log_ratio(m, shape, bits).is_some_and(|r| r < 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(k: usize, n: usize) -> Shape {
        Shape::new(n, k).unwrap()
    }

    #[test]
    fn grid_points_return_their_measurement() {
        let ks = [1024, 2048, 4096, 8192];
        let ns = [512, 1024, 2048, 4096, 8192, 14336, 28672];
        for m in 2..=4 {
            for bits in 2..=5u32 {
                for (ki, &k) in ks.iter().enumerate() {
                    for (ni, &n) in ns.iter().enumerate() {
                        let want = f32::from(RATIO[m - 2][(bits - 2) as usize][ki][ni]);
                        let got = log_ratio(m, shape(k, n), bits).unwrap();
                        assert!((got - want).abs() < 0.01, "M={m} k={bits} {k}x{n}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn between_and_beyond_the_grid() {
        // Halfway (in log2 N) between 2048 and 4096 columns at K = 1024,
        // M = 2, k = 2: the mean of −4 and 32.
        let mid = log_ratio(2, shape(1024, 2896), 2).unwrap();
        assert!((mid - 14.0).abs() < 0.1, "{mid}");
        // Beyond the grid: the nearest edge.
        assert_eq!(log_ratio(3, shape(64, 7), 4), log_ratio(3, shape(1024, 512), 4));
        assert_eq!(log_ratio(3, shape(65536, 1 << 20), 5), log_ratio(3, shape(8192, 28672), 5));
        assert_eq!(log_ratio(5, shape(1024, 512), 4), None);
        assert_eq!(log_ratio(2, shape(1024, 512), 6), None);
    }

    #[test]
    fn measured_winners() {
        // (K, N, M, k, MMA kernel faster), from the H100 tables (µs, the
        // faster kernel first).
        let cases = [
            (2048, 512, 4, 4, true),    // kv
            (2048, 512, 2, 2, false),   // kv
            (2048, 5120, 2, 4, false),  // Qwen3 gate/up: 5.94 against 6.37 µs
            (2048, 10240, 2, 4, false), // GLM shared: 9.90 against 12.08
            (2048, 10240, 3, 4, false), // 11.38 against 12.14
            (2048, 10240, 3, 3, true),  // 9.07 against 11.2
            (2048, 5120, 3, 4, true),   // 6.39 against 6.95
            (5120, 2048, 2, 4, false),  // down
            (8192, 28672, 2, 4, true),  // Llama-3-70B
            (8192, 28672, 2, 5, false), // 84.5 against 91.5
            (4096, 8192, 3, 4, false),  // 13.4 against 15.5
            (1024, 512, 4, 2, true),    // 1.71 against 4.11
        ];
        for (k, n, m, bits, mma) in cases {
            assert_eq!(prefers_mma(m, shape(k, n), bits), mma, "{k}x{n} M={m} k={bits}");
        }
    }
}
