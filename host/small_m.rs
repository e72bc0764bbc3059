//! Which kernel `linear` runs at M = 2..4, the scalar GEMV or the MMA
//! kernel: a table of their measured time ratios on a grid of shapes,
//! interpolated between its points.
//!
//! The two kernels' plans change by shape in steps (the GEMV's column-slot
//! and block variants, the MMA kernel's K-slot, split-K and stream-K
//! plans), so the crossover is no single line in (K, N): the MMA kernel
//! takes 0.50 of the GEMV's time on 1024×512 (K × N) at M = 4, k = 2 and
//! 1.24 times it on 4096×8192 at M = 2, k = 2. The table holds
//! `100 · ln(t_mma / t_gemv)` per (M, k, K, N) from one run of
//! `kbit-bench` on an H200 (132 SMs), commit a9ede6d, f16, cold L2:
//! K ∈ {1024, 1536, 2048, 3072, 4096, 6144, 8192} × N ∈ {512, 1024, 1536,
//! 2048, 3072, 4096, 6144, 8192, 10240, 14336, 20480, 28672}
//! (`bench-results/nvidia-h200-2026-11-28-a9ede6d-grid.{md,json}`),
//! and the same ratios for two design shapes off the grid. The points at
//! N = 10240 whose MMA plan became the K-slot one when that plan was
//! allowed 5/4 of a wave (k = 5 on K ≤ 3072, k = 4 on K = 2048) were
//! measured again after that change, in one run with both kernels
//! (`…-2026-11-28-41d866c-small-m-points.md`). Another shape
//! between grid points takes the bilinear interpolation in (log2 K,
//! log2 N); outside the grid, the nearest edge. On twelve shapes off the
//! grid measured in the same machine session (`…-a9ede6d-offgrid.json`),
//! 144 rows, the picks took 0.44 % longer in all than the faster kernel
//! everywhere would have (the table before it, from an H100 run of
//! 34ce96d's kernels, 1.38 % on the same rows). Both kernels are bound
//! mostly by instruction issue and latency at M = 2..4, less by the
//! memory, so their ratio carries over roughly between the H100 and the
//! H200, which have the same SMs and clocks; other GPUs use the same
//! table.

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
            [-22, 12, -44, -3, -19, -11, -12, 8, -21, -9, -6, -27],
            [-5, 15, -22, 0, -21, -5, -11, 9, -28, -15, -12, -18],
            [21, 4, -2, 0, -10, 1, -13, 15, -26, -15, -17, -21],
            [23, 11, 7, 8, 1, 6, -12, 12, -27, -2, -20, -24],
            [34, 19, 17, 18, 8, 12, -10, 22, -19, -10, -23, -25],
            [35, 16, 17, 17, 7, 10, -23, 16, -32, -28, -34, -38],
            [42, 21, 22, 23, 10, 16, -26, 18, -33, -30, -36, -36],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-29, 0, -27, -2, -8, -3, -2, 16, -19, 2, 7, -14],
            [-11, 13, -16, 4, -20, 0, -6, 15, -24, -4, -4, -7],
            [17, 4, 2, 3, -7, 6, -9, 14, -20, -4, -6, -10],
            [17, 9, 10, 11, 2, 10, -9, 14, -16, 6, -6, -10],
            [31, 19, 22, 23, 9, 14, -9, 21, 0, -3, -8, -10],
            [32, 16, 21, 22, 9, 11, -13, 31, -12, -14, -10, -12],
            [38, 21, 27, 28, 12, 13, -15, 34, -15, -17, -12, -12],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-22, 4, -34, 4, -8, 4, -1, 18, 20, -2, 5, -19],
            [-11, 13, -16, 7, -16, 4, -6, 17, 12, -11, 22, -3],
            [16, 6, 6, 7, -5, 8, -9, 15, 9, -15, -1, -8],
            [15, 10, 10, 13, 0, 9, -13, 8, -5, 5, -6, -10],
            [28, 18, 21, 22, 7, 11, -15, 24, 14, -5, -7, -10],
            [28, 13, 19, 20, 2, 3, 9, 21, 0, -21, -9, -13],
            [33, 16, 25, 24, 2, 10, 2, 23, 1, -25, -12, -13],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-18, 11, -17, 6, 6, 11, 14, 28, 31, 22, 39, 25],
            [-4, 16, -14, -8, -6, 4, 6, 30, 22, 18, 38, 7],
            [19, 25, -4, -4, -2, 10, 5, 31, 22, 15, 9, 7],
            [17, 22, -3, -1, -3, 11, 1, 26, 20, 10, 9, 6],
            [31, 27, 8, 9, 3, 14, 1, 34, 25, 10, 8, 6],
            [29, 28, 6, 8, 4, 10, 15, 33, 14, -4, 7, 5],
            [34, 31, 9, 12, 7, 10, 8, 32, 13, -6, 5, 4],
        ],
    ],
    // M = 3
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-52, -11, -66, -22, -34, -28, -32, -18, -24, -28, -28, -66],
            [-34, -10, -43, -17, -30, -35, -21, -22, -53, -40, -36, -26],
            [-1, -11, -18, -18, -37, -29, -42, -16, -51, -44, -26, -31],
            [-8, -16, -20, -21, -28, -26, -41, -21, -51, -31, -50, -57],
            [6, -11, -13, -14, -26, -24, -41, 3, -31, -31, -43, -45],
            [8, -11, -11, -12, -24, -24, -46, -6, -54, -51, -64, -65],
            [8, -12, -10, -12, -23, -4, -47, -1, -53, -52, -65, -64],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-60, -25, -53, -18, -29, -17, -25, -3, -38, -19, -14, -38],
            [-42, -8, -40, -12, -50, -27, -33, -12, -47, -28, -26, -26],
            [-8, -10, -11, -11, -31, -19, -36, -13, -44, -31, -17, -24],
            [-17, -19, -16, -16, -24, -18, -38, -15, -39, -37, -41, -49],
            [1, -10, -6, -6, -23, -19, -40, 0, -27, -29, -27, -31],
            [4, -11, -5, -5, -22, -21, -50, -6, -52, -53, -47, -52],
            [2, -12, -5, -5, -22, -5, -51, -3, -53, -54, -49, -51],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-45, -9, -50, -4, -23, -8, -18, 3, 3, -19, -14, -38],
            [-32, -3, -35, -9, -27, -16, -27, -6, -6, -30, 4, -33],
            [-1, -7, -8, -6, -27, -11, -32, -6, -12, -35, -29, -38],
            [-7, -12, -10, -8, -24, -16, -35, -12, -21, -21, -42, -46],
            [6, -8, -5, -1, -22, -16, -39, 3, -16, -33, -47, -48],
            [8, -12, -5, -4, -22, -24, -11, 3, -27, -42, -54, -56],
            [7, -13, -5, -4, -25, -3, -20, 1, -28, -46, -59, -59],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-50, -14, -43, -11, -11, -1, -5, 13, 15, 3, 20, 6],
            [-37, -6, -35, -27, -30, -16, -15, 7, 4, -5, 18, 10],
            [-5, 5, -25, -19, -23, -11, -18, 4, 3, -7, 15, 8],
            [-16, -8, -30, -21, -20, -12, -20, 1, 1, -7, -18, -16],
            [1, 5, -17, -11, -17, -14, -22, 23, 12, -2, 6, 2],
            [1, 2, -15, -10, -14, -16, 1, 20, 0, -16, -23, -11],
            [0, 0, -16, -8, -14, 6, -5, 22, 1, -16, -15, -11],
        ],
    ],
    // M = 4
    [
        // k = 2: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-70, -27, -81, -23, -20, -36, -48, -5, -37, -43, -46, -81],
            [-48, -20, -57, -26, -45, -38, -29, -27, -68, -55, -53, -43],
            [-29, -22, -30, -27, -31, -40, -56, -29, -66, -59, -41, -47],
            [-35, -30, -33, -33, -43, -39, -56, -36, -66, -47, -66, -72],
            [-27, -22, -25, -25, -40, -37, -57, -11, -56, -55, -70, -73],
            [-27, -24, -23, -24, -38, -38, -59, -20, -70, -65, -79, -81],
            [-27, -24, -22, -24, -38, -17, -67, -21, -73, -72, -84, -83],
        ],
        // k = 3: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-68, -27, -63, -19, -38, -29, -34, -21, -51, -30, -28, -45],
            [-47, -7, -49, -23, -58, -39, -43, -28, -59, -40, -41, -31],
            [-30, -19, -24, -25, -44, -35, -49, -29, -57, -45, -24, -33],
            [-33, -25, -26, -28, -37, -34, -50, -31, -53, -45, -48, -57],
            [-24, -18, -18, -21, -34, -33, -52, -24, -51, -53, -51, -56],
            [-25, -20, -16, -19, -33, -35, -61, -18, -62, -63, -57, -62],
            [-25, -20, -15, -18, -32, -10, -65, -18, -67, -68, -62, -64],
        ],
        // k = 4: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-61, -23, -64, -11, -17, -25, -31, -18, -11, -33, -30, -67],
            [-45, -11, -48, -20, -41, -29, -37, -25, -24, -43, -12, -49],
            [-31, -18, -21, -21, -34, -32, -45, -28, -27, -52, -45, -55],
            [-36, -24, -23, -26, -38, -35, -49, -33, -35, -37, -58, -63],
            [-29, -19, -18, -20, -35, -34, -54, -12, -29, -49, -63, -65],
            [-31, -25, -17, -21, -36, -38, -28, -14, -41, -57, -70, -72],
            [-31, -25, -17, -21, -35, -13, -36, -14, -43, -62, -75, -75],
        ],
        // k = 5: K = 1024, 1536, 2048, 3072, 4096, 6144, 8192
        [
            [-58, -15, -51, -12, -20, -9, -12, -1, 5, -5, 9, -29],
            [-42, -5, -45, -18, -37, -22, -22, -4, -4, -12, 6, -12],
            [-27, -15, -17, -20, -30, -21, -31, -4, -4, -21, -3, -9],
            [-33, -22, -16, -22, -28, -21, -34, -8, -7, -27, -24, -30],
            [-25, -16, -9, -15, -24, -21, -37, -5, -18, -31, -25, -29],
            [-28, -22, -6, -12, -23, -23, -24, -4, -27, -37, -29, -33],
            [-28, -23, -5, -9, -22, -2, -33, -5, -29, -41, -33, -34],
        ],
    ],
];

/// Shapes measured off the grid, which take their own ratios: `(K, N,
/// [M − 2][k − 2])`, same run. Qwen3 gate/up and down lie between grid
/// points where the GEMV's plan changes step (gate/up's 16 K slots per
/// column against 8 at N = 6144).
#[rustfmt::skip]
const MEASURED: [(usize, usize, [[i8; 4]; 3]); 2] = [
    (2048, 5120, [[7, -1, 7, 17], [-21, -23, -16, -4], [-34, -38, -31, -13]]), // Qwen3 gate/up
    (5120, 2048, [[13, 17, 15, 4], [-16, -11, -7, -12], [-28, -23, -23, -15]]), // Qwen3 down
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
/// assert_eq!(log_ratio(4, Shape::new(512, 2048)?, 4), Some(-31.0));
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
    Some(interpolate(&RATIO[m - 2][(bits - 2) as usize], shape))
}

/// The value of table `t` (one entry per point of this module's K × N
/// grid) at `shape`: bilinear in (log2 K, log2 N) between grid points,
/// the nearest edge beyond them.
pub(crate) fn interpolate(t: &[[i8; 12]; 7], shape: Shape) -> f32 {
    let (ki, kf) = locate(&LOG_K, (shape.k.max(1) as f32).log2());
    let (ni, nf) = locate(&LOG_N, (shape.n.max(1) as f32).log2());
    let row = |i: usize| f32::from(t[i][ni]) * (1.0 - nf) + f32::from(t[i][ni + 1]) * nf;
    row(ki) * (1.0 - kf) + row(ki + 1) * kf
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
        // M = 2, k = 2: the mean of −3 and −19.
        let mid = log_ratio(2, shape(1024, 2508), 2).unwrap();
        assert!((mid + 11.0).abs() < 0.1, "{mid}");
        // Beyond the grid: the nearest edge.
        assert_eq!(log_ratio(3, shape(64, 7), 4), log_ratio(3, shape(1024, 512), 4));
        assert_eq!(log_ratio(3, shape(65536, 1 << 20), 5), log_ratio(3, shape(8192, 28672), 5));
        assert_eq!(log_ratio(5, shape(1024, 512), 4), None);
        assert_eq!(log_ratio(2, shape(1024, 512), 6), None);
    }

    #[test]
    fn measured_winners() {
        // (K, N, M, k, MMA kernel faster), from the H200 grid run (µs, the
        // faster kernel first).
        let cases = [
            (2048, 512, 4, 4, true),    // kv: 2.51 against 3.43
            (2048, 512, 2, 2, false),   // kv: 2.05 against 2.53
            (2048, 4096, 2, 4, false),  // Qwen3 q: 4.31 against 4.67
            (2048, 5120, 2, 4, false),  // Qwen3 gate/up: 5.53 against 5.94
            (2048, 5120, 3, 4, true),   // 5.93 against 6.96
            (2048, 10240, 2, 4, false), // GLM shared: 9.56 against 11.42
            (2048, 10240, 3, 4, true),  // 11.39 against 11.84
            (2048, 10240, 3, 3, true),  // 7.40 against 11.51
            (5120, 2048, 2, 4, false),  // Qwen3 down: 5.84 against 6.81
            (5120, 2048, 3, 4, true),   // 6.82 against 7.32
            (8192, 28672, 2, 4, true),  // Llama-3-70B: 56.8 against 64.9
            (8192, 28672, 2, 5, false), // 88.3 against 92.1
            (4096, 8192, 3, 4, false),  // 13.9 against 14.3
            (1024, 512, 4, 2, true),    // 1.71 against 3.42
        ];
        for (k, n, m, bits, mma) in cases {
            assert_eq!(prefers_mma(m, shape(k, n), bits), mma, "{k}x{n} M={m} k={bits}");
        }
    }
}
