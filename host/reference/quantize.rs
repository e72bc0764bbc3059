use crate::{Codebook, Element, Error, FlatWeight, Result, Shape, weight::check_len};
use kbit_format::{BLOCK, planes, quant};
use rayon::prelude::*;

/// Quantizes a row-major `W[N, K]` to the flat layout (FORMAT.md "Choosing
/// indices"): per 32-value block, f32 absmax, then the nearest codebook entry
/// to `x / max(absmax, 1e-8)`, ties to the lowest index.
///
/// ```
/// let shape = kbit::Shape::new(2, 64)?;
/// let w: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
/// let q = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
/// assert_eq!(q.packed().len(), (4 + 1) * 4); // 4 blocks × 4 planes + padding
/// # Ok::<(), kbit::Error>(())
/// ```
///
/// # Errors
/// [`Error::Length`] if `w.len() != N·K`; [`Error::NonFinite`] naming the
/// first block with a NaN or inf.
pub fn quantize<T: Element>(w: &[T], shape: Shape, codebook: &Codebook) -> Result<FlatWeight> {
    check_len("weights", shape.numel(), w.len())?;
    if let Some(block) = w.par_chunks(BLOCK).position_first(|b| b.iter().any(|x| !x.to_f32().is_finite())) {
        let per_row = shape.k / BLOCK;
        return Err(Error::NonFinite { block, position: Some((block / per_row, block % per_row * BLOCK)) });
    }
    let bits = codebook.bits() as usize;
    let cb = codebook.values();
    let mut packed = vec![0u32; shape.flat_words(codebook.bits())];
    let mut absmax = vec![0f32; shape.flat_absmax()];
    packed[..shape.num_blocks() * bits]
        .par_chunks_mut(bits)
        .zip(absmax[..shape.num_blocks()].par_iter_mut())
        .zip(w.par_chunks(BLOCK))
        .for_each(|((planes_out, amax_out), block)| {
            let x: [f32; BLOCK] = std::array::from_fn(|i| block[i].to_f32());
            let amax = x.iter().fold(0.0, |a, &v| quant::absmax_step(a, v));
            let idx: [u8; BLOCK] =
                std::array::from_fn(|i| quant::nearest(quant::normalize(x[i], amax), cb.len(), |j| cb[j]) as u8);
            planes::pack_into(&idx, planes_out);
            *amax_out = amax;
        });
    FlatWeight::from_parts(shape, codebook.clone(), packed, absmax)
}
