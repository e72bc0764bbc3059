//! Helpers shared by the test binaries: GPU discovery that skips loudly,
//! fresh random data, and error measures.
#![allow(dead_code)]

use kbit::{Context, Element, Error, Shape, reference};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

/// The GPU context, or `None` after printing a visible skip line. With
/// `KBIT_REQUIRE_GPU=1` a missing GPU fails the test instead.
pub fn gpu(test: &str) -> Option<Context> {
    match Context::new(0) {
        Ok(ctx) => Some(ctx),
        Err(Error::NoDevice(why)) => {
            if std::env::var("KBIT_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("KBIT_REQUIRE_GPU=1 but no GPU: {why}");
            }
            // Straight to the stderr handle: libtest captures eprintln! of
            // passing tests, and a skip must be visible.
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no GPU): {test}: {why}");
            None
        }
        Err(e) => panic!("{test}: opening the GPU failed: {e}"),
    }
}

/// Serializes the GPU tests of one binary that take it: they share the
/// process's primary CUDA context, and a graph capture was once seen
/// invalidated while another test thread was setting up (module load,
/// cuBLAS handle); the large-matrix tests also each hold ≈ 12 GB.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A generator seeded from the clock and the test name (fresh data every
/// run); the seed is printed so a failure can be replayed with KBIT_SEED.
pub fn rng(test: &str) -> SmallRng {
    let seed = std::env::var("KBIT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        t ^ test.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    });
    eprintln!("{test}: KBIT_SEED={seed}");
    SmallRng::seed_from_u64(seed)
}

/// `len` Gaussian values with per-row scale variation (as real weights
/// have), converted to `T`.
pub fn gaussian<T: Element>(rng: &mut SmallRng, len: usize, scale: f32) -> Vec<T> {
    (0..len)
        .map(|_| {
            let v: f32 = StandardNormal.sample(rng);
            T::from_f32_rne(v * scale)
        })
        .collect()
}

/// Uniform values in [-1, 1) as `T`.
pub fn uniform<T: Element>(rng: &mut SmallRng, len: usize) -> Vec<T> {
    (0..len).map(|_| T::from_f32_rne(rng.random_range(-1.0f32..1.0))).collect()
}

/// Bit patterns of a slice of elements, for exact comparisons that also
/// treat NaN (an unwritten, poisoned output) as a mismatch.
pub fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

/// Asserts bit-identical element slices, naming the first mismatch.
pub fn assert_bits_eq<T: Element>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) =
        (0..got.len()).find(|&i| got[i].to_f32().to_bits() != want[i].to_f32().to_bits() || got[i].to_f32().is_nan())
    {
        panic!("{what}: first mismatch at {i}: got {} want {}", got[i].to_f32(), want[i].to_f32());
    }
}

/// Σ (got − want)² and max |got − want| / max(|want|, floor), or `None`
/// where `got` holds a NaN or an infinity.
fn diff_measures(got: &[f32], want: &[f64], floor: f64) -> Option<(f64, f64)> {
    assert_eq!(got.len(), want.len());
    let (mut num, mut worst) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            return None;
        }
        let d = g as f64 - w;
        num += d * d;
        worst = worst.max(d.abs() / w.abs().max(floor));
    }
    Some((num, worst))
}

/// ‖got − want‖ / ‖want‖ and max |got − want| / max(|want|, floor); NaN in
/// `got` makes both infinite.
pub fn errors(got: &[f32], want: &[f64], floor: f64) -> (f64, f64) {
    let Some((num, worst)) = diff_measures(got, want, floor) else { return (f64::INFINITY, f64::INFINITY) };
    let den: f64 = want.iter().map(|w| w * w).sum();
    ((num / den.max(1e-300)).sqrt(), worst)
}

/// Errors of `got` against `want` = x·Wᵀ (`m` rows, f64) on the scale of
/// the products: ‖got − want‖ / ‖s‖ and max |got − want| / max(|want|,
/// rms(s)), where s² = Σ_k (x·w)² per output, which is what E[want²] is for
/// zero-mean random x and W. Rounding errors (of the weights to f16/bf16,
/// of partial sums) scale with s, not with the outputs: where only a few
/// outputs exist (N = 1) and they happen to cancel, ‖want‖ can be many
/// times smaller than ‖s‖ and the plain relative error ([`errors`]) grows
/// by that factor with no error in the kernel. NaN in `got` makes both
/// infinite.
pub fn product_errors<X: Element>(got: &[f32], want: &[f64], x: &[X], m: usize, w: &[f32], shape: Shape) -> (f64, f64) {
    let x2: Vec<f32> = x.iter().map(|v| v.to_f32() * v.to_f32()).collect();
    let w2: Vec<f32> = w.iter().map(|v| v * v).collect();
    let s2 = reference::matmul_f64(&x2, m, &w2, shape).unwrap();
    let norm2: f64 = s2.iter().sum();
    let floor = (norm2 / s2.len().max(1) as f64).sqrt();
    let Some((num, worst)) = diff_measures(got, want, floor) else { return (f64::INFINITY, f64::INFINITY) };
    ((num / norm2.max(1e-300)).sqrt(), worst)
}

/// The design's shapes (K, N), DESIGN §1, plus names.
pub const SHAPES: [(&str, usize, usize); 7] = [
    ("gateup", 2048, 5120),
    ("down", 5120, 2048),
    ("q", 2048, 4096),
    ("kv", 2048, 512),
    ("o", 4096, 2048),
    ("moe_gu", 2048, 512),
    ("moe_dn", 512, 2048),
];

/// Awkward shapes (K, N) on top of the design's.
pub const AWKWARD: [(&str, usize, usize); 5] =
    [("k32", 32, 64), ("k96", 96, 128), ("n1", 256, 1), ("n129", 128, 129), ("n4100", 64, 4100)];
