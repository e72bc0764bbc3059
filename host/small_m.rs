//! Which kernel `linear` runs at M = 2..4, the scalar GEMV or the MMA
//! kernel: a table of their measured time ratios on a grid of shapes,
//! interpolated between its points.
//!
//! The two kernels' plans change by shape in steps (the GEMV's column-slot
//! and block variants, the MMA kernel's K-slot, split-K and stream-K
//! plans), so the crossover is no single line in (K, N): the MMA kernel
//! takes 0.41 of the GEMV's time on 1024×512 (K × N) at M = 4, k = 2 and
//! 1.35 times it on 4096×8192 at M = 2, k = 2. The table holds
//! `100 · ln(t_mma / t_gemv)` per (M, k, K, N) from one run of
//! `kbit-bench` on an H100 (132 SMs), commit ab6f129, f16, cold L2:
//! K ∈ {1024, 1536, 2048, 3072, 4096, 6144, 8192} × N ∈ {512, 1024, 1536,
//! 2048, 3072, 4096, 6144, 8192, 10240, 14336, 20480, 28672}
//! (`bench-results/nvidia-h100-80gb-hbm3-2026-11-27-ab6f129-grid.{md,json}`),
//! and the same ratios for two design shapes off the grid. Another shape
//! between grid points takes the bilinear interpolation in (log2 K,
//! log2 N); outside the grid, the nearest edge. On twelve shapes off the
//! grid measured in the same run (`…-ab6f129-offgrid.json`), 144 rows,
//! the picks took 0.85 % longer in all than the faster kernel everywhere
//! would have. Other GPUs use the same table.

use crate::Shape;

/// log2 of the K grid points: 1024, 1536, 2048, 3072, 4096, 6144, 8192.
const LOG_K: [f32; 7] = [10.0, 10.584_962, 11.0, 11.584_962, 12.0, 12.584_962, 13.0];

/// log2 of the N grid points: 512, 1024, 1536, 2048, 3072, 4096, 6144,
/// 8192, 10240, 14336, 20480, 28672.
const LOG_N: [f32; 12] =
    [9.0, 10.0, 10.584_962, 11.0, 11.584_962, 12.0, 12.584_962, 13.0, 13.321_928, 13.807_355, 14.321_928, 14.807_355];

/// `100 · ln(t_mma / t_gemv)`, rounded (negative: the MMA kernel is
/// faster), indexed `[M − 2][k − 2][K point][N point]`.
#[rustfmt::skip]
const RATIO: [[[[i8; 12]; 7]; 4]; 3] = [
    // M = 2
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-52, -15, -37, 1, 29, 3, 15, 30, -7, -1, -4, -20],
            [-26, 3, -20, 1, -18, -1, 4, 26, -10, -7, -7, 1],
            [8, -7, 3, 5, -1, 7, -5, 18, -6, -5, 1, 2],
            [7, 2, 14, 15, 16, 15, -2, 22, -5, 6, -7, -10],
            [22, 12, 24, 25, 17, 20, 0, 30, 1, -2, -13, -2],
            [28, 13, 26, 26, 17, 18, -13, 29, -19, -18, -31, -31],
            [36, 18, 31, 32, 20, 23, -15, 33, -18, -18, -31, -29],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-32, 1, -24, 2, 2, 2, 2, 21, -3, 0, 9, -9],
            [-7, 14, -8, 6, -14, 6, 2, 23, -5, 2, 3, -5],
            [20, 7, 7, 10, 2, 13, 0, 23, 1, 3, -4, -10],
            [25, 14, 16, 18, 13, 19, 1, 23, 2, 13, -2, -5],
            [32, 26, 28, 29, 20, 24, 1, 28, 7, 5, -4, -4],
            [43, 26, 29, 30, 20, 21, -2, 43, -4, -4, -3, -5],
            [49, 31, 35, 36, 22, 19, -4, 45, -6, -7, -5, -4],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-58, -24, -33, 4, 21, 5, 2, 6, 14, -2, 4, -33],
            [-32, -2, -19, 2, -22, -7, -8, 10, 12, -10, 30, 2],
            [0, -4, 6, 5, -7, -1, -7, 8, 20, -19, 1, -2],
            [-3, -1, 9, 5, 11, 4, -10, 4, -1, 13, -2, -2],
            [10, 10, 21, 14, 9, 6, -13, 36, 26, 5, -2, -2],
            [17, 9, 23, 17, 7, 0, 19, 34, 10, -10, 0, -3],
            [22, 13, 28, 19, 7, 18, 13, 38, 12, -13, -4, -4],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-22, 6, -14, 7, 8, 7, 10, 25, 39, 22, 38, -7],
            [-6, 13, -7, -6, -5, 4, 8, 32, 32, 17, 44, 8],
            [13, 21, 6, 4, 2, 11, 8, 30, 40, 13, 7, 5],
            [14, 20, 4, 6, 1, 16, 3, 21, 21, 11, 8, 7],
            [26, 19, 14, 15, 9, 18, -2, 38, 31, 13, 7, 7],
            [28, 28, 16, 16, 8, 6, 22, 37, 17, 1, 8, 6],
            [33, 28, 15, 19, 11, 11, 14, 41, 17, -5, 4, 5],
        ],
    ],
    // M = 3
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-74, -33, -59, -11, 11, -9, -6, 9, -25, -22, -26, -57],
            [-49, -24, -41, -10, -23, -21, -22, 5, -29, -32, -31, -22],
            [-17, -19, -7, -6, -24, -13, -28, -12, -26, -36, -14, -21],
            [-22, -23, -10, -10, -11, -15, -32, -8, -29, -41, -43, -51],
            [-4, -15, -2, -3, -17, -15, -34, 11, -30, -31, -23, -29],
            [3, -13, 0, -2, -16, -16, -51, -5, -55, -53, -48, -53],
            [3, -13, -1, -2, -15, 3, -52, -2, -55, -55, -49, -51],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -11, -48, -13, -17, -13, -18, -3, -21, -19, -12, -30],
            [-37, -5, -33, -10, -40, -23, -21, -7, -28, -20, -19, -20],
            [-2, -6, -4, -6, -23, -15, -26, -8, -22, -25, -11, -17],
            [-7, -11, -9, -11, -14, -12, -27, -11, -19, -31, -34, -41],
            [11, -1, 0, -3, -12, -12, -30, 11, -20, -22, -18, -22],
            [17, 1, 3, 0, -12, -14, -40, 4, -45, -45, -39, -43],
            [16, 1, 4, -1, -12, 2, -42, 7, -46, -46, -40, -42],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-68, -28, -45, 4, 4, -3, -1, -4, 2, -16, -9, -44],
            [-43, -13, -33, -3, -29, -13, -21, -6, -1, -22, 15, -24],
            [-9, -14, -2, -4, -22, -10, -23, -6, 6, -35, -20, -27],
            [-13, -15, -4, -7, -9, -14, -27, -10, -11, -13, -30, -35],
            [3, -11, 2, -3, -14, -15, -33, 15, -6, -25, -37, -38],
            [6, -11, 5, -1, -14, -18, -1, 17, -15, -30, -43, -45],
            [6, -12, 5, -2, -16, 7, -10, 16, -17, -36, -50, -47],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-46, -2, -34, -2, -6, -4, -4, 14, 25, 7, 22, -21],
            [-31, -1, -25, -20, -21, -11, -10, 13, 12, 1, 25, 11],
            [0, 7, -11, -9, -15, -7, -10, 10, 22, -3, 1, 8],
            [-6, -1, -17, -10, -11, -5, -11, 3, 5, -5, -17, -20],
            [8, 11, -5, -1, -6, -6, -16, 28, 17, -2, 7, 3],
            [7, 8, -5, 1, -5, -12, 6, 24, 3, -14, -24, -12],
            [7, 5, -2, 2, -4, 6, 0, 28, 4, -18, -28, -12],
        ],
    ],
    // M = 4
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-89, -46, -60, -18, -6, -18, 2, -3, -37, -38, -42, -73],
            [-62, -31, -49, -19, -30, -24, -37, -8, -45, -48, -47, -36],
            [-37, -30, -19, -17, -37, -25, -42, -24, -40, -52, -33, -36],
            [-41, -35, -22, -22, -26, -29, -47, -21, -43, -40, -57, -61],
            [-32, -28, -14, -15, -31, -29, -49, -1, -46, -46, -59, -62],
            [-29, -25, -12, -13, -30, -30, -50, -5, -58, -55, -67, -68],
            [-29, -26, -14, -14, -30, -6, -55, -6, -61, -59, -72, -69],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-69, -21, -60, -17, -28, -23, -30, -15, -33, -32, -25, -43],
            [-44, -9, -45, -18, -49, -32, -34, -19, -38, -32, -33, -24],
            [-27, -17, -15, -16, -34, -27, -39, -20, -35, -38, -17, -24],
            [-28, -21, -20, -21, -28, -25, -40, -23, -33, -39, -40, -48],
            [-18, -13, -11, -14, -25, -25, -44, -13, -44, -47, -43, -48],
            [-15, -11, -8, -11, -24, -27, -52, -8, -55, -55, -50, -54],
            [-13, -10, -8, -11, -25, -1, -56, -8, -60, -60, -54, -58],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-83, -41, -51, -7, -8, -13, -3, -16, -13, -31, -25, -59],
            [-57, -21, -42, -13, -35, -20, -36, -19, -16, -38, -3, -41],
            [-38, -25, -14, -14, -35, -22, -39, -20, -10, -49, -37, -45],
            [-42, -30, -18, -20, -24, -27, -42, -25, -26, -30, -48, -54],
            [-30, -25, -11, -14, -28, -29, -48, 0, -19, -40, -54, -55],
            [-32, -25, -8, -13, -29, -31, -18, -1, -29, -48, -61, -62],
            [-31, -26, -8, -14, -30, -1, -25, -2, -33, -52, -66, -67],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-67, -17, -53, -14, -20, -13, -19, -5, 11, -7, 11, -32],
            [-48, -11, -40, -15, -38, -25, -21, -3, 5, -15, 14, -10],
            [-33, -19, -6, -12, -29, -23, -28, -5, 7, -23, -3, -9],
            [-39, -27, -12, -17, -24, -19, -31, -9, -10, -27, -25, -30],
            [-30, -21, -3, -9, -19, -19, -35, -2, -15, -30, -24, -28],
            [-29, -24, 2, -4, -20, -23, -21, -1, -26, -37, -29, -32],
            [-29, -25, 3, -4, -21, 3, -30, 0, -27, -41, -37, -36],
        ],
    ],
];

/// Shapes measured off the grid, which take their own ratios: `(K, N,
/// [M − 2][k − 2])`, same run. Qwen3 gate/up and down lie between grid
/// points where the GEMV's plan changes step (gate/up's 16 K slots per
/// column against 8 at N = 6144).
#[rustfmt::skip]
const MEASURED: [(usize, usize, [[i8; 4]; 3]); 2] = [
    (2048, 5120, [[0, 2, 6, 17], [-22, -17, -9, 2], [-37, -29, -23, -20]]), // Qwen3 gate/up
    (5120, 2048, [[21, 24, 14, 10], [-5, -4, -2, -1], [-18, -16, -16, -10]]), // Qwen3 down
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
/// // Grid points return their measurement: 2048×512 (K × N) at M = 4, k = 4.
/// assert_eq!(log_ratio(4, Shape::new(512, 2048)?, 4), Some(-38.0));
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
        let ks = [1024, 1536, 2048, 3072, 4096, 6144, 8192];
        let ns = [512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240, 14336, 20480, 28672];
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
        // Halfway (in log2 N) between 2048 and 3072 columns at K = 1024,
        // M = 2, k = 2: the mean of 1 and 29.
        let mid = log_ratio(2, shape(1024, 2508), 2).unwrap();
        assert!((mid - 15.0).abs() < 0.1, "{mid}");
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
            (2048, 512, 4, 4, true),    // kv: 2.49 against 3.65
            (2048, 512, 2, 2, false),   // kv: 2.31 against 2.49
            (2048, 5120, 2, 4, false),  // Qwen3 gate/up: 6.10 against 6.45
            (2048, 5120, 3, 4, true),   // 6.40 against 6.99
            (2048, 10240, 2, 4, false), // GLM shared: 9.94 against 12.13
            (2048, 10240, 3, 4, false), // 11.45 against 12.18
            (2048, 10240, 3, 3, true),  // 9.13 against 11.33
            (5120, 2048, 2, 4, false),  // Qwen3 down: 6.35 against 7.30
            (8192, 28672, 2, 4, true),  // Llama-3-70B: 62.2 against 64.5
            (8192, 28672, 2, 5, false), // 92.5 against 97.0
            (4096, 8192, 3, 4, false),  // 13.5 against 15.7
            (1024, 512, 4, 2, true),    // 1.70 against 4.13
        ];
        for (k, n, m, bits, mma) in cases {
            assert_eq!(prefers_mma(m, shape(k, n), bits), mma, "{k}x{n} M={m} k={bits}");
        }
    }
}
