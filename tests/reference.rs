//! CPU reference: quantize against a second, deliberately simple
//! implementation; error bounds; layouts; argument errors.

mod common;

use half::{bf16, f16};
use kbit::{Codebook, Element, Error, ScaleMode, Shape, reference};
use kbit_format::e4m4;

/// The quantization rule written out the slow, obvious way, independent of
/// `kbit_format`: per block, the max of |x| over non-NaN values; every
/// distance in f32; the first minimum wins; bit j of index i goes to bit i
/// of word j.
fn simple_quantize(w: &[f32], cb: &[f32], bits: usize) -> (Vec<u32>, Vec<f32>) {
    let blocks = w.len() / 32;
    let mut packed = vec![0u32; (blocks + 1) * bits];
    let mut absmax = vec![0f32; blocks + 1];
    for b in 0..blocks {
        let x = &w[b * 32..b * 32 + 32];
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        absmax[b] = amax;
        let div = if amax > 1e-8 { amax } else { 1e-8 };
        for (i, &v) in x.iter().enumerate() {
            let r = v / div;
            let dists: Vec<f32> = cb.iter().map(|&c| (r - c).abs()).collect();
            let mut best = 0;
            for (j, &d) in dists.iter().enumerate() {
                if d < dists[best] {
                    best = j;
                }
            }
            for j in 0..bits {
                if best >> j & 1 == 1 {
                    packed[b * bits + j] |= 1 << i;
                }
            }
        }
    }
    (packed, absmax)
}

fn check_against_simple<T: Element>(rng: &mut rand::rngs::SmallRng, n: usize, k: usize, bits: u32) {
    let shape = Shape::new(n, k).unwrap();
    let cb = Codebook::nf(bits).unwrap();
    let w: Vec<T> = common::gaussian(rng, shape.numel(), 0.02);
    let q = reference::quantize(&w, shape, &cb).unwrap();
    let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
    let (packed, absmax) = simple_quantize(&wf, cb.values(), bits as usize);
    assert_eq!(q.packed(), &packed[..], "{:?} [{n},{k}] k={bits}: planes", T::DTYPE);
    assert_eq!(q.absmax(), &absmax[..], "{:?} [{n},{k}] k={bits}: absmax", T::DTYPE);
}

#[test]
fn quantize_matches_simple_implementation() {
    let mut rng = common::rng("quantize_matches_simple_implementation");
    for bits in 2..=5 {
        for &(n, k) in &[(1, 32), (3, 96), (17, 64), (64, 256)] {
            check_against_simple::<f32>(&mut rng, n, k, bits);
            check_against_simple::<f16>(&mut rng, n, k, bits);
            check_against_simple::<bf16>(&mut rng, n, k, bits);
        }
    }
}

#[test]
fn quantize_custom_codebook_ties_go_to_lowest_index() {
    // Entries 0 and 1 are equally far from 0: index 0 must win; an unordered
    // codebook works too.
    let cb = Codebook::new(vec![-0.5, 0.5, 1.0, -1.0]).unwrap();
    let shape = Shape::new(1, 32).unwrap();
    let mut w = vec![0.0f32; 32];
    w[0] = 1.0; // absmax 1
    w[1] = -1.0;
    let q = reference::quantize(&w, shape, &cb).unwrap();
    let idx = |i| kbit_format::planes::index(&q.packed()[..2], i);
    assert_eq!(idx(0), 2);
    assert_eq!(idx(1), 3);
    assert_eq!(idx(2), 0, "tie between -0.5 and 0.5 goes to the lower index");
}

#[test]
fn zero_block_maps_to_entry_nearest_zero() {
    for bits in 2..=5u32 {
        let shape = Shape::new(1, 32).unwrap();
        let q = reference::quantize(&[0.0f32; 32], shape, &Codebook::nf(bits).unwrap()).unwrap();
        let b = bits as usize;
        for i in 0..32 {
            assert_eq!(kbit_format::planes::index(&q.packed()[..b], i), (1 << (bits - 1)) - 1);
        }
        let back: Vec<f32> = reference::dequantize_flat(&q);
        assert!(back.iter().all(|v| *v == 0.0 && v.is_sign_negative()), "decodes to -0.0");
        // Padding is zero.
        assert!(q.packed()[b..].iter().all(|&w| w == 0));
        assert_eq!(q.absmax()[1], 0.0);
    }
}

#[test]
fn per_block_round_trip_error_is_bounded() {
    let mut rng = common::rng("per_block_round_trip_error_is_bounded");
    let shape = Shape::new(64, 512).unwrap();
    for bits in 2..=5 {
        let cb = Codebook::nf(bits).unwrap();
        let w: Vec<f32> = common::gaussian(&mut rng, shape.numel(), 1.0);
        let flat = reference::quantize(&w, shape, &cb).unwrap();
        let tiled = reference::repack(&flat, ScaleMode::Strict).unwrap();
        let back_flat: Vec<f32> = reference::dequantize_flat(&flat);
        let back_tiled: Vec<f32> = reference::dequantize_tiled(&tiled);
        let half_gap = cb.max_gap() / 2.0;
        for b in 0..shape.num_blocks() {
            let amax = flat.absmax()[b];
            for i in b * 32..b * 32 + 32 {
                let e = (w[i] - back_flat[i]).abs();
                assert!(e <= half_gap * amax * (1.0 + 1e-6) + 1e-7, "flat k={bits} block {b}: {e}");
                let e = (w[i] - back_tiled[i]).abs();
                let bound = (half_gap + 1.0 / 16.0) * amax + 1e-6;
                assert!(e <= bound, "tiled k={bits} block {b}: {e} > {bound}");
            }
        }
    }
}

#[test]
fn nmse_on_gaussian_weights_decreases_with_k() {
    let mut rng = common::rng("nmse_on_gaussian_weights_decreases_with_k");
    let shape = Shape::new(256, 1024).unwrap();
    let w: Vec<f32> = common::gaussian(&mut rng, shape.numel(), 0.05);
    let power: f64 = w.iter().map(|&v| (v as f64).powi(2)).sum();
    let mut last = f64::INFINITY;
    for bits in 2..=5 {
        let flat = reference::quantize(&w, shape, &Codebook::nf(bits).unwrap()).unwrap();
        let back: Vec<f32> = reference::dequantize_tiled(&reference::repack(&flat, ScaleMode::Strict).unwrap());
        let err: f64 = w.iter().zip(&back).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let nmse = err / power;
        eprintln!("k={bits}: NMSE {nmse:.5}");
        assert!(nmse < last * 0.6, "k={bits}: NMSE {nmse} not well below k-1's {last}");
        assert!(nmse < [0.2, 0.04, 0.01, 0.0035][bits as usize - 2], "k={bits}: NMSE {nmse}");
        last = nmse;
    }
}

#[test]
fn tiled_equals_flat_when_scales_are_exact_in_e4m4() {
    // Scale each block so its absmax is a power of two (exact in E4M4): the
    // two layouts must then dequantize to the same bits.
    let mut rng = common::rng("tiled_equals_flat_when_scales_are_exact_in_e4m4");
    for &(n, k) in &[(5, 96), (7, 64), (2, 32), (129, 160)] {
        let shape = Shape::new(n, k).unwrap();
        let mut w: Vec<f32> = common::uniform(&mut rng, shape.numel());
        for (b, blk) in w.chunks_mut(32).enumerate() {
            let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let target = 2f32.powi((b % 9) as i32 - 5);
            blk.iter_mut().for_each(|v| *v = (*v * (target / amax)).clamp(-target, target));
            // The largest element lands on ±target exactly.
            let i = (0..32).max_by(|&a, &c| blk[a].abs().total_cmp(&blk[c].abs())).unwrap();
            blk[i] = target.copysign(blk[i]);
        }
        for bits in 2..=5 {
            let flat = reference::quantize(&w, shape, &Codebook::nf(bits).unwrap()).unwrap();
            let tiled = reference::repack(&flat, ScaleMode::Strict).unwrap();
            let a: Vec<f32> = reference::dequantize_flat(&flat);
            let b: Vec<f32> = reference::dequantize_tiled(&tiled);
            common::assert_bits_eq(&b, &a, &format!("[{n},{k}] k={bits}"));
            let ah: Vec<f16> = reference::dequantize_flat(&flat);
            let bh: Vec<f16> = reference::dequantize_tiled(&tiled);
            common::assert_bits_eq(&bh, &ah, "f16");
        }
    }
}

#[test]
fn repack_places_every_block_at_its_tile_index() {
    let mut rng = common::rng("repack_places_every_block_at_its_tile_index");
    let shape = Shape::new(9, 160).unwrap(); // K % 64 == 32: a zero half tile
    let w: Vec<f32> = common::uniform(&mut rng, shape.numel());
    for bits in 2..=5u32 {
        let flat = reference::quantize(&w, shape, &Codebook::nf(bits).unwrap()).unwrap();
        let tiled = reference::repack(&flat, ScaleMode::Strict).unwrap();
        let b = bits as usize;
        let mut covered = vec![false; tiled.packed().len()];
        for n in 0..9 {
            for kb in 0..5 {
                let blk = n * 5 + kb;
                let wi = kbit_format::tile::word_index(9, n as u64, kb as u64, b as u64) as usize;
                assert_eq!(&tiled.packed()[wi..wi + b], &flat.packed()[blk * b..blk * b + b]);
                covered[wi..wi + b].iter_mut().for_each(|c| *c = true);
                let si = kbit_format::tile::scale_index(9, n as u64, kb as u64) as usize;
                assert_eq!(Ok(tiled.scales()[si]), e4m4::encode(flat.absmax()[blk], false));
            }
        }
        // Everything not covered is the zero half tile.
        for (i, c) in covered.iter().enumerate() {
            if !c {
                assert_eq!(tiled.packed()[i], 0);
            }
        }
        assert_eq!(covered.iter().filter(|c| !**c).count(), 9 * b);
    }
}

#[test]
fn argument_errors_name_the_problem() {
    assert!(matches!(Codebook::nf(1), Err(Error::Bits(1))));
    assert!(matches!(Codebook::nf(6), Err(Error::Bits(6))));
    assert!(matches!(Codebook::new(vec![0.0; 5]), Err(Error::CodebookLen(5))));
    assert!(matches!(Codebook::new(vec![0.0, 1.0, f32::NAN, 2.0]), Err(Error::CodebookValue { index: 2, .. })));
    assert!(matches!(Shape::new(4, 48), Err(Error::InFeatures(48))));
    assert!(matches!(Shape::new(4, 0), Err(Error::InFeatures(0))));
    assert!(matches!(Shape::new(0, 32), Err(Error::OutFeatures)));
    assert!(matches!(Shape::new(1 << 20, 1 << 20), Err(Error::TooLarge { .. })));
    // K = 96: 3 quant blocks per row, 4 storage slots (the zero half tile).
    assert!(Shape::new(1_000_000_000, 96).is_ok());
    assert!(matches!(Shape::new(1_200_000_000, 96), Err(Error::TooLarge { .. })));
    let shape = Shape::new(2, 64).unwrap();
    let cb = Codebook::nf(3).unwrap();
    let e = reference::quantize(&[0.0f32; 100], shape, &cb).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 128, got: 100, .. }), "{e}");
    let mut w = vec![0.5f32; 128];
    w[70] = f32::NAN;
    let e = reference::quantize(&w, shape, &cb).unwrap_err();
    assert!(matches!(e, Error::NonFinite { block: 2, position: Some((1, 0)) }), "{e}");
    assert!(e.to_string().contains("row 1"), "{e}");
    w[70] = f32::INFINITY;
    assert!(matches!(reference::quantize(&w, shape, &cb), Err(Error::NonFinite { block: 2, .. })));
    // absmax out of E4M4 range.
    let mut w = vec![0.5f32; 128];
    w[40] = 40.0;
    let flat = reference::quantize(&w, shape, &cb).unwrap();
    let e = reference::repack(&flat, ScaleMode::Strict).unwrap_err();
    assert!(matches!(e, Error::ScaleRange { block: 1, value: Some(v) } if v == 40.0), "{e}");
    let sat = reference::repack(&flat, ScaleMode::Saturate).unwrap();
    assert_eq!(sat.scales()[kbit_format::tile::scale_index(2, 0, 1) as usize], 0xFF);
    // from_parts length checks.
    assert!(matches!(
        kbit::FlatWeight::from_parts(shape, cb.clone(), vec![0; 12], vec![0.0; 5]),
        Err(Error::Length { what: "packed words", expected: 15, got: 12 })
    ));
    assert!(kbit::TiledWeight::from_parts(shape, cb, vec![0; 12], vec![0; 3]).is_err());
}

#[test]
fn matmul_reference_matches_direct_sum() {
    let mut rng = common::rng("matmul_reference_matches_direct_sum");
    let shape = Shape::new(7, 64).unwrap();
    let w: Vec<f32> = common::uniform(&mut rng, shape.numel());
    let x: Vec<bf16> = common::uniform(&mut rng, 3 * 64);
    let y = reference::matmul_f64(&x, 3, &w, shape).unwrap();
    for m in 0..3 {
        for n in 0..7 {
            let want: f64 = (0..64).map(|k| x[m * 64 + k].to_f64() * w[n * 64 + k] as f64).sum();
            assert!((y[m * 7 + n] - want).abs() < 1e-12);
        }
    }
    assert!(reference::matmul_f64(&x, 4, &w, shape).is_err());
}
