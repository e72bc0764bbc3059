use crate::{Error, FlatWeight, Result, ScaleMode, TiledWeight};
use kbit_format::{e4m4, tile};
use rayon::prelude::*;

/// Repacks a flat weight into the runtime layout: planes moved to their tile
/// positions, absmax encoded to E4M4 (nearest, ties to even, with carry).
///
/// ```
/// let shape = kbit::Shape::new(3, 96)?;
/// let w: Vec<f32> = (0..288).map(|i| (i as f32).cos()).collect();
/// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(3)?)?;
/// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
/// assert_eq!(tiled.scales().len(), 2 * 3 * 2); // 2 K tiles × 3 columns × 2 halves
/// # Ok::<(), kbit::Error>(())
/// ```
///
/// # Errors
/// [`Error::ScaleRange`] for the first block whose absmax is NaN, negative,
/// or above 31 with [`ScaleMode::Strict`].
pub fn repack(flat: &FlatWeight, mode: ScaleMode) -> Result<TiledWeight> {
    let shape = flat.shape();
    let bits = flat.codebook().bits() as usize;
    let saturate = mode == ScaleMode::Saturate;
    let absmax = &flat.absmax()[..shape.num_blocks()];
    if let Some(block) = absmax.par_iter().position_first(|&a| e4m4::encode(a, saturate).is_err()) {
        return Err(Error::ScaleRange { block, value: Some(absmax[block]) });
    }
    let kblocks = shape.k / 32;
    let mut packed = vec![0u32; shape.tiled_words(bits as u32)];
    let mut scales = vec![0u8; shape.tiled_scales()];
    // One K tile (all N columns, 2 halves each) is one contiguous chunk.
    packed
        .par_chunks_mut(shape.n * tile::BLOCKS_PER_TILE * bits)
        .zip(scales.par_chunks_mut(shape.n * tile::BLOCKS_PER_TILE))
        .enumerate()
        .for_each(|(kt, (words, sc))| {
            let base_w = tile::word_index(shape.n as u64, 0, 2 * kt as u64, bits as u64) as usize;
            let base_s = tile::scale_index(shape.n as u64, 0, 2 * kt as u64) as usize;
            for n in 0..shape.n {
                for kb in 2 * kt..(2 * kt + 2).min(kblocks) {
                    let b = n * kblocks + kb;
                    let w = tile::word_index(shape.n as u64, n as u64, kb as u64, bits as u64) as usize - base_w;
                    words[w..w + bits].copy_from_slice(&flat.packed()[b * bits..(b + 1) * bits]);
                    let s = tile::scale_index(shape.n as u64, n as u64, kb as u64) as usize - base_s;
                    sc[s] = e4m4::encode(absmax[b], saturate).unwrap_or(0xFF);
                }
            }
        });
    TiledWeight::from_parts(shape, flat.codebook().clone(), packed, scales)
}
