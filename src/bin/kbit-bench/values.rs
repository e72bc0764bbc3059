//! Reproducible pseudo-random benchmark values (weights and activations),
//! shared by `kbit-bench` and the plan sweep example.

use kbit::Element;
use rayon::prelude::*;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` pseudo-random values with mean 0 and standard deviation `sigma`
/// (sum of four uniforms, bounded by ±3.46σ), in parallel, reproducible
/// from `seed`.
pub fn random<T: Element>(len: usize, seed: u64, sigma: f32) -> Vec<T> {
    let mut out = vec![T::from_f32_rne(0.0); len];
    // The sum of four U(0, 1) has variance 4/12: scale by sqrt(3) for unit variance.
    let scale = sigma * 3f32.sqrt() / 65_536.0;
    out.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        let mut state = splitmix(seed ^ (c as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        for v in chunk {
            state = splitmix(state);
            let u = (state & 0xFFFF) + ((state >> 16) & 0xFFFF) + ((state >> 32) & 0xFFFF) + (state >> 48);
            // u: sum of four 16-bit uniforms, mean 4 · 65535/2.
            *v = T::from_f32_rne((u as f32 - 131_070.0) * scale);
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_values_have_the_asked_spread() {
        let v: Vec<f32> = random(1 << 20, 7, 0.5);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{}", var.sqrt());
        assert!(v.iter().all(|x| x.abs() <= 0.5 * 3.47));
        assert_eq!(random::<f32>(1000, 7, 0.5), random::<f32>(1000, 7, 0.5));
        assert_ne!(random::<f32>(1000, 7, 0.5), random::<f32>(1000, 8, 0.5));
    }
}
