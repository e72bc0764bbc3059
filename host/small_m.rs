//! Which kernel `linear` runs at M = 2..4, the scalar GEMV or the MMA
//! kernel: a table of their measured time ratios on a grid of shapes,
//! interpolated between its points.
//!
//! The two kernels' plans change by shape in steps (the GEMV's column-slot
//! and block variants, the MMA kernel's K-slot, split-K and stream-K
//! plans), so the crossover is no single line in (K, N): the MMA kernel
//! takes 0.50 of the GEMV's time on 1024×512 (K × N) at M = 4, k = 2 and
//! 1.33 times it on 4096×8192 at M = 2, k = 2. The table holds
//! `100 · ln(t_mma / t_gemv)` per (M, k, K, N) from one run of
//! `kbit-bench` on an H100 (132 SMs), commit 34ce96d, f16, cold L2:
//! K ∈ {1024, 1536, 2048, 3072, 4096, 6144, 8192} × N ∈ {512, 1024, 1536,
//! 2048, 3072, 4096, 6144, 8192, 10240, 14336, 20480, 28672}
//! (`bench-results/nvidia-h100-80gb-hbm3-2026-11-28-34ce96d-grid.{md,json}`),
//! and the same ratios for two design shapes off the grid. Another shape
//! between grid points takes the bilinear interpolation in (log2 K,
//! log2 N); outside the grid, the nearest edge. On twelve shapes off the
//! grid measured in the same machine session (`…-34ce96d-offgrid.json`),
//! 144 rows, the picks took 0.73 % longer in all than the faster kernel
//! everywhere would have. Other GPUs use the same table.

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
            [-22, 6, -30, 11, 33, 6, 20, 33, 3, -2, 1, -17],
            [-6, 14, -12, 6, -12, 6, 6, 29, -3, -6, -3, -13],
            [19, 4, 8, 9, 5, 10, -1, 21, -2, -2, -11, -14],
            [23, 11, 18, 21, 19, 18, 0, 23, -1, 7, -12, -12],
            [35, 18, 28, 30, 20, 23, 2, 29, -10, -1, -14, -14],
            [37, 17, 29, 29, 19, 20, -12, 30, -20, -17, -23, -26],
            [45, 23, 35, 35, 22, 22, -15, 33, -21, -18, -23, -22],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-23, 5, -22, 6, 4, 4, 3, 21, 4, 2, 13, -8],
            [-4, 17, -8, 8, -14, 8, 2, 23, -2, 3, 5, -5],
            [25, 12, 10, 12, 7, 15, 2, 25, 4, 4, -4, -9],
            [28, 19, 19, 21, 16, 21, 3, 24, 5, 13, -1, -5],
            [43, 29, 32, 32, 22, 26, 2, 29, 8, 6, -3, -3],
            [45, 28, 32, 32, 21, 21, -2, 43, -4, -5, -3, -4],
            [53, 34, 37, 37, 23, 18, -4, 45, -6, -8, -4, -4],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-25, 0, -23, 17, 33, 17, 16, 24, 23, 5, 12, -9],
            [-11, 11, -6, 14, -8, 11, 0, 26, 20, -2, 34, 3],
            [16, 7, 14, 17, 4, 16, 2, 24, 27, -11, 2, -1],
            [16, 11, 20, 22, 19, 20, -3, 14, 4, 14, -2, -2],
            [29, 19, 31, 32, 17, 20, -7, 36, 26, 6, -2, -2],
            [30, 15, 31, 31, 12, 9, 19, 34, 10, -9, 0, -2],
            [37, 19, 35, 36, 11, 16, 13, 38, 12, -13, -3, -2],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-21, 7, -15, 11, 8, 9, 10, 26, 43, 24, 41, 20],
            [-5, 15, -6, -3, -4, 6, 7, 31, 35, 19, 46, 7],
            [17, 25, 7, 6, 3, 12, 9, 31, 42, 16, 7, 5],
            [17, 24, 5, 7, 1, 15, 5, 22, 23, 12, 8, 6],
            [31, 31, 16, 17, 9, 18, -2, 38, 31, 13, 7, 7],
            [29, 29, 15, 16, 10, 7, 22, 38, 19, -1, 9, 7],
            [36, 29, 17, 20, 12, 11, 14, 39, 16, -6, 7, 7],
        ],
    ],
    // M = 3
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-51, -15, -52, -6, 16, -10, -1, 8, -19, -21, -20, -57],
            [-34, -10, -33, -10, -18, -22, -19, 5, -25, -30, -27, -18],
            [-2, -12, -8, -8, -25, -14, -27, -12, -21, -34, -16, -20],
            [-8, -16, -10, -10, -12, -16, -30, -7, -24, -23, -41, -46],
            [6, -10, -3, -5, -16, -16, -31, 24, -21, -22, -32, -33],
            [8, -10, 0, -2, -14, -17, -36, 9, -42, -40, -52, -52],
            [9, -10, 0, -3, -13, 3, -36, 14, -41, -40, -53, -51],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-53, -10, -47, -10, -16, -10, -19, 5, -14, -19, -9, -32],
            [-33, -3, -31, -8, -42, -18, -25, -3, -24, -20, -17, -19],
            [2, -3, -3, -3, -18, -7, -23, 0, -20, -22, -10, -16],
            [-6, -9, -7, -6, -12, -7, -26, -4, -18, -30, -33, -41],
            [12, 1, 3, 4, -10, -9, -29, 11, -19, -24, -18, -21],
            [16, 1, 4, 4, -13, -16, -40, 4, -45, -44, -39, -43],
            [16, 1, 5, 4, -15, 3, -41, 8, -45, -46, -40, -41],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-46, -11, -38, 10, 12, 5, 6, 10, 10, -12, -6, -28],
            [-31, -6, -24, 3, -23, -1, -19, 3, 2, -20, 16, -24],
            [1, -7, 0, 3, -15, -2, -20, 5, 7, -29, -20, -27],
            [-6, -11, 0, 4, -6, -5, -23, -4, -9, -12, -30, -35],
            [8, -7, 7, 8, -10, -13, -30, 15, -6, -24, -36, -38],
            [9, -10, 7, 8, -18, -22, 0, 17, -15, -30, -43, -45],
            [10, -11, 8, 1, -20, 7, -10, 16, -17, -35, -49, -47],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-52, -9, -40, -7, -9, -3, -8, 11, 26, 5, 22, 1],
            [-37, -6, -27, -21, -28, -16, -14, 11, 14, -3, 27, 12],
            [-5, 5, -14, -10, -20, -10, -14, 9, 22, -5, 16, 10],
            [-15, -7, -22, -14, -16, -8, -15, 1, 5, -4, -16, -19],
            [1, 6, -9, -4, -11, -8, -20, 30, 18, 1, 9, 6],
            [1, 3, -7, -1, -9, -13, 8, 25, 5, -13, -22, -9],
            [2, -1, -6, 0, -9, 11, 2, 29, 5, -14, -24, -8],
        ],
    ],
    // M = 4
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-69, -30, -55, -15, 2, -19, 5, -4, -29, -36, -36, -72],
            [-47, -19, -42, -20, -32, -25, -33, -8, -40, -45, -44, -35],
            [-29, -22, -19, -18, -37, -25, -41, -24, -35, -49, -32, -36],
            [-34, -29, -22, -22, -25, -29, -45, -20, -39, -39, -56, -60],
            [-26, -22, -14, -15, -29, -28, -46, 9, -46, -46, -59, -61],
            [-26, -23, -12, -14, -28, -30, -49, -4, -57, -54, -67, -67],
            [-25, -23, -11, -14, -27, -6, -55, -5, -61, -59, -72, -69],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-62, -12, -55, -11, -24, -23, -27, -15, -29, -29, -22, -39],
            [-39, -4, -41, -18, -46, -31, -35, -20, -36, -32, -31, -24],
            [-20, -10, -15, -17, -33, -26, -38, -21, -32, -36, -17, -24],
            [-21, -15, -18, -20, -27, -25, -39, -23, -31, -39, -40, -48],
            [-12, -8, -10, -13, -24, -25, -41, -13, -43, -46, -43, -47],
            [-12, -8, -8, -11, -23, -27, -51, -8, -55, -55, -50, -53],
            [-10, -8, -6, -11, -22, 0, -56, -8, -60, -59, -54, -57],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-63, -25, -42, -1, 0, -12, 4, -14, -6, -25, -21, -59],
            [-43, -14, -33, -13, -30, -17, -31, -17, -13, -33, 0, -40],
            [-29, -17, -12, -14, -33, -20, -37, -18, -7, -44, -36, -44],
            [-34, -22, -15, -17, -23, -25, -40, -24, -24, -28, -47, -52],
            [-27, -19, -9, -11, -26, -26, -43, 1, -18, -39, -53, -54],
            [-29, -22, -8, -12, -27, -31, -17, 2, -28, -47, -60, -62],
            [-27, -23, -6, -13, -26, -2, -24, -2, -32, -51, -65, -66],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-59, -10, -48, -6, -18, -11, -15, -2, 17, -3, 12, -31],
            [-42, -5, -36, -13, -34, -23, -20, -3, 3, -10, 15, -9],
            [-28, -15, -5, -11, -26, -21, -26, -3, 12, -21, -1, -7],
            [-32, -20, -7, -15, -23, -18, -29, -7, -6, -25, -23, -28],
            [-25, -16, 1, -9, -17, -18, -31, -1, -13, -29, -23, -26],
            [-27, -21, 3, -4, -16, -20, -19, 0, -24, -36, -27, -30],
            [-26, -22, 5, -2, -16, 5, -28, 1, -26, -39, -31, -36],
        ],
    ],
];

/// Shapes measured off the grid, which take their own ratios: `(K, N,
/// [M − 2][k − 2])`, same run. Qwen3 gate/up and down lie between grid
/// points where the GEMV's plan changes step (gate/up's 16 K slots per
/// column against 8 at N = 6144).
#[rustfmt::skip]
const MEASURED: [(usize, usize, [[i8; 4]; 3]); 2] = [
    (2048, 5120, [[10, 10, 17, 22], [-17, -11, -4, 3], [-31, -29, -19, -7]]), // Qwen3 gate/up
    (5120, 2048, [[25, 27, 26, 12], [-6, -1, 6, -5], [-18, -15, -14, -9]]), // Qwen3 down
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
/// assert_eq!(log_ratio(4, Shape::new(512, 2048)?, 4), Some(-29.0));
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
        // M = 2, k = 2: the mean of 11 and 33.
        let mid = log_ratio(2, shape(1024, 2508), 2).unwrap();
        assert!((mid - 22.0).abs() < 0.1, "{mid}");
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
            (2048, 512, 4, 4, true),    // kv: 2.50 against 3.35
            (2048, 512, 2, 2, false),   // kv: 2.05 against 2.48
            (2048, 4096, 2, 4, false),  // Qwen3 q: 4.16 against 4.87
            (2048, 5120, 2, 4, false),  // Qwen3 gate/up: 5.43 against 6.44
            (2048, 5120, 3, 4, true),   // 6.44 against 6.67
            (2048, 10240, 2, 4, false), // GLM shared: 9.26 against 12.10
            (2048, 10240, 3, 4, false), // 11.23 against 12.10
            (2048, 10240, 3, 3, true),  // 9.05 against 11.00
            (5120, 2048, 2, 4, false),  // Qwen3 down: 5.61 against 7.31
            (5120, 2048, 3, 4, false),  // 6.87 against 7.27
            (8192, 28672, 2, 4, true),  // Llama-3-70B: 60.9 against 62.2
            (8192, 28672, 2, 5, false), // 85.8 against 91.6
            (4096, 8192, 3, 4, false),  // 13.4 against 15.6
            (1024, 512, 4, 2, true),    // 1.70 against 3.39
        ];
        for (k, n, m, bits, mma) in cases {
            assert_eq!(prefers_mma(m, shape(k, n), bits), mma, "{k}x{n} M={m} k={bits}");
        }
    }
}
