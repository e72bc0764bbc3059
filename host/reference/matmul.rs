use crate::{Element, Error, Result, Shape, weight::check_len};
use rayon::prelude::*;

/// `y[M, N] = x[M, K] · W[N, K]ᵀ` in f64, from dense weights of any element
/// type (typically the dequantized f32 weights), row-major throughout.
///
/// ```
/// let shape = kbit::Shape::new(2, 32)?;
/// let w = vec![1.0f32; 64];
/// let x = vec![half::f16::from_f32(0.5); 32];
/// let y = kbit::reference::matmul_f64(&x, 1, &w, shape)?;
/// assert_eq!(y, vec![16.0, 16.0]);
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn matmul_f64<X: Element, W: Element>(x: &[X], m: usize, w: &[W], shape: Shape) -> Result<Vec<f64>> {
    check_len("activations", m.checked_mul(shape.k).ok_or(Error::TooLarge { n: m, k: shape.k })?, x.len())?;
    check_len("weights", shape.numel(), w.len())?;
    let xf: Vec<f64> = x.iter().map(|v| v.to_f32() as f64).collect();
    let mut y = vec![0f64; m * shape.n];
    // Parallel over weight rows: each row is read once for all M.
    let cols: Vec<Vec<f64>> = w
        .par_chunks(shape.k)
        .map(|row| {
            (0..m)
                .map(|r| row.iter().zip(&xf[r * shape.k..(r + 1) * shape.k]).map(|(a, b)| a.to_f32() as f64 * b).sum())
                .collect()
        })
        .collect();
    for (n, col) in cols.iter().enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * shape.n + n] = *v;
        }
    }
    Ok(y)
}
