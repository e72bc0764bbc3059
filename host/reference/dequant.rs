use crate::{Element, FlatWeight, TiledWeight};
use kbit_format::{BLOCK, e4m4, planes, quant, tile};
use rayon::prelude::*;

/// Dequantizes a flat weight to a dense row-major `[N, K]` matrix:
/// `T(f32(cb[idx] · absmax))`, rounded to nearest even.
///
/// ```
/// let shape = kbit::Shape::new(1, 32)?;
/// let w: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
/// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(5)?)?;
/// let back: Vec<f32> = kbit::reference::dequantize_flat(&flat);
/// assert_eq!(back[0], -16.0); // the absmax element is exact (codebook endpoint −1)
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn dequantize_flat<T: Element>(w: &FlatWeight) -> Vec<T> {
    let bits = w.codebook().bits() as usize;
    let cb = w.codebook().values();
    let mut out = vec![T::from_f32_rne(0.0); w.shape().numel()];
    out.par_chunks_mut(BLOCK).enumerate().for_each(|(b, o)| {
        let p = &w.packed()[b * bits..(b + 1) * bits];
        let amax = w.absmax()[b];
        for (i, v) in o.iter_mut().enumerate() {
            *v = T::from_f32_rne(quant::dequant(cb[planes::index(p, i) as usize], amax));
        }
    });
    out
}

/// Dequantizes a runtime-layout weight to a dense row-major `[N, K]` matrix,
/// with the E4M4-decoded scales.
///
/// ```
/// let shape = kbit::Shape::new(1, 32)?;
/// let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
/// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
/// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
/// let back: Vec<f32> = kbit::reference::dequantize_tiled(&tiled);
/// assert_eq!(back, kbit::reference::dequantize_flat::<f32>(&flat)); // absmax 2.0 is exact in E4M4
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn dequantize_tiled<T: Element>(w: &TiledWeight) -> Vec<T> {
    let shape = w.shape();
    let bits = w.codebook().bits() as usize;
    let cb = w.codebook().values();
    let mut out = vec![T::from_f32_rne(0.0); shape.numel()];
    out.par_chunks_mut(shape.k).enumerate().for_each(|(n, row)| {
        for (kb, o) in row.chunks_mut(BLOCK).enumerate() {
            let wi = tile::word_index(shape.n as u64, n as u64, kb as u64, bits as u64) as usize;
            let amax = e4m4::decode(w.scales()[tile::scale_index(shape.n as u64, n as u64, kb as u64) as usize]);
            let p = &w.packed()[wi..wi + bits];
            for (i, v) in o.iter_mut().enumerate() {
                *v = T::from_f32_rne(quant::dequant(cb[planes::index(p, i) as usize], amax));
            }
        }
    });
    out
}
