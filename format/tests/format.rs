//! Exactness tests of the shared format code.
#[cfg(feature = "std")]
use kbit_format::nf;
use kbit_format::{e4m4, planes, tile};

/// Positive halves of the NF codebooks (FORMAT.md), ascending.
#[cfg(feature = "std")]
const NF_POS: [&[u32]; 4] = [
    &[0x3e8dd21a, 0x3f800000],
    &[0x3dd20129, 0x3ea32005, 0x3f1409f5, 0x3f800000],
    &[0x3d2c6c36, 0x3e0265ad, 0x3e5d2107, 0x3e9f2ee8, 0x3ed56949, 0x3f0ace38, 0x3f35233b, 0x3f800000],
    &[
        0x3c950060, 0x3d5ff631, 0x3dbb691d, 0x3e04052d, 0x3e2b36ba, 0x3e539bdb, 0x3e7d9849, 0x3e94d4a9, 0x3eac39a3,
        0x3ec56bf3, 0x3ee10f82, 0x3f001198, 0x3f122cf2, 0x3f288359, 0x3f4731dc, 0x3f800000,
    ],
];

#[cfg(feature = "std")]
#[test]
fn nf_codebooks_match_reference_bit_patterns() {
    for bits in 2..=5u32 {
        let cb = nf::codebook(bits);
        let n = cb.len();
        let half = NF_POS[bits as usize - 2];
        assert_eq!(n, 1 << bits);
        for (i, &pat) in half.iter().enumerate() {
            let hi = cb[n / 2 + i];
            let lo = cb[n / 2 - 1 - i];
            assert_eq!(hi.to_bits(), pat, "k={bits} +entry {i}: {hi}");
            assert_eq!(lo.to_bits(), pat | 0x8000_0000, "k={bits} -entry {i}: {lo}");
        }
    }
}

#[cfg(feature = "std")]
#[test]
fn inv_normal_cdf_known_values() {
    // Φ⁻¹(0.975) = 1.959963984540054; Φ⁻¹(1/64) (tail branch).
    assert!((nf::inv_normal_cdf(0.975) - 1.959_963_984_540_054).abs() < 1e-14);
    assert!((nf::inv_normal_cdf(0.5)).abs() < 1e-300);
    let t = nf::inv_normal_cdf(1.0 / 64.0);
    assert!((t + 2.153_874_694_061_456).abs() < 1e-12, "{t}");
}

/// Decoding by the literal formula of FORMAT.md, in f64.
fn decode_by_formula(b: u8) -> f64 {
    let e = (b >> 4) as i32;
    let m = (b & 15) as f64;
    if b == 0 {
        0.0
    } else if e == 0 {
        m * 2f64.powi(-14)
    } else {
        2f64.powi(e - 11) * (1.0 + m / 16.0)
    }
}

#[test]
fn e4m4_decode_all_bytes() {
    let mut prev = -1.0f32;
    for b in 0..=255u8 {
        let v = e4m4::decode(b);
        assert_eq!(v as f64, decode_by_formula(b), "byte {b:#04x}");
        assert!(v > prev, "decode must be increasing at {b:#04x}");
        prev = v;
        // Every representable value round-trips.
        assert_eq!(e4m4::encode(v, false), Ok(b), "round trip {b:#04x}");
    }
    assert_eq!(e4m4::decode(0xB0), 1.0);
    assert_eq!(e4m4::decode(0xFF), 31.0);
}

#[test]
fn e4m4_encode_is_nearest_ties_even_with_carry() {
    // Exhaustive over a dense grid: the chosen byte is a nearest one, and on
    // a tie the even mantissa wins.
    let mut x = 0.0f32;
    while x <= 31.0 {
        let b = e4m4::encode(x, false).unwrap();
        let d = (e4m4::decode(b) - x).abs() as f64;
        for c in 0..=255u8 {
            let dc = (e4m4::decode(c) - x).abs() as f64;
            assert!(d <= dc, "x={x}: {b:#04x} (d={d}) vs {c:#04x} (d={dc})");
            if dc == d && c != b {
                assert_eq!(b & 1, 0, "tie at x={x} must pick the even mantissa");
            }
        }
        x = if x < 0.01 { x + 1.3e-6 } else { x * 1.0007 + 1e-7 };
    }
    // Carry: 1.99 rounds to 2.0 = 0xC0 (not clamped to 0xBF).
    assert_eq!(e4m4::encode(1.99, false), Ok(0xC0));
    assert_eq!(e4m4::encode(1.95, false), Ok(0xBF));
    // Midpoint between 1.0 (0xB0, even) and 1.0625 (0xB1): to even.
    assert_eq!(e4m4::encode(1.03125, false), Ok(0xB0));
    // Midpoint between 0xB1 and 0xB2: to 0xB2.
    assert_eq!(e4m4::encode(1.09375, false), Ok(0xB2));
    // Subnormal/normal boundary and the underflow rule.
    assert_eq!(e4m4::encode(2f32.powi(-10), false), Ok(0x10));
    assert_eq!(e4m4::encode(2f32.powi(-15), false), Ok(0));
    assert_eq!(e4m4::encode(2f32.powi(-15) * 1.01, false), Ok(1));
    assert_eq!(e4m4::encode(0.0, false), Ok(0));
    // Range.
    assert_eq!(e4m4::encode(31.0, false), Ok(0xFF));
    assert_eq!(e4m4::encode(31.01, false), Err(e4m4::EncodeError::TooLarge));
    assert_eq!(e4m4::encode(32.0, false), Err(e4m4::EncodeError::TooLarge));
    assert_eq!(e4m4::encode(32.0, true), Ok(0xFF));
    assert_eq!(e4m4::encode(f32::INFINITY, true), Ok(0xFF));
    assert_eq!(e4m4::encode(f32::NAN, true), Err(e4m4::EncodeError::Invalid));
    assert_eq!(e4m4::encode(-1.0, true), Err(e4m4::EncodeError::Invalid));
}

#[test]
fn planes_round_trip_all_bit_widths() {
    fn check<const K: usize>(seed: u32) {
        let mut s = seed;
        let mut idx = [0u8; 32];
        for q in idx.iter_mut() {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *q = ((s >> 16) % (1 << K)) as u8;
        }
        let w = planes::pack::<K>(&idx);
        for (i, &q) in idx.iter().enumerate() {
            assert_eq!(planes::index(&w, i), q as u32);
        }
        for o in 0..4 {
            let oct = planes::octet::<K>(&w, o);
            for e in 0..8 {
                assert_eq!(oct[e], idx[8 * o as usize + e] as u32);
            }
        }
    }
    for seed in 0..50 {
        check::<2>(seed);
        check::<3>(seed);
        check::<4>(seed);
        check::<5>(seed);
    }
}

#[test]
fn tile_indices_cover_each_slot_once() {
    for &(n_dim, k_dim, bits) in &[(3usize, 96usize, 3usize), (5, 64, 2), (1, 32, 5), (7, 160, 4)] {
        let words = tile::words(n_dim, k_dim, bits);
        let mut seen = vec![0u8; words];
        for n in 0..n_dim {
            for kb in 0..k_dim / 32 {
                let w = tile::word_index(n_dim as u64, n as u64, kb as u64, bits as u64) as usize;
                for j in 0..bits {
                    seen[w + j] += 1;
                }
                let s = tile::scale_index(n_dim as u64, n as u64, kb as u64) as usize;
                assert!(s < tile::scales(n_dim, k_dim));
            }
        }
        let expected_pad = if k_dim % 64 == 32 { n_dim * bits } else { 0 };
        assert!(seen.iter().all(|&c| c <= 1));
        assert_eq!(seen.iter().filter(|&&c| c == 0).count(), expected_pad);
    }
}

/// The last-round split of the dense GEMV takes only partial rounds of at
/// most half the grid, and leaves whole rounds to the grid.
#[test]
fn gemv_last_round_split_is_a_partial_round() {
    use kbit_format::gemv::split_last_round;
    for slots in [1u32, 2, 3, 132, 263, 264, 528] {
        for col_blocks in 0..=5 * slots + 3 {
            match split_last_round(col_blocks, slots) {
                Some(whole) => {
                    let last = col_blocks - whole;
                    assert!(whole >= slots && whole % slots == 0, "{col_blocks} on {slots}");
                    assert!(last > 0 && 2 * last <= slots, "{col_blocks} on {slots}");
                }
                None => {
                    let last = col_blocks % slots;
                    assert!(col_blocks < slots || last == 0 || 2 * last > slots, "{col_blocks} on {slots}");
                }
            }
        }
    }
    assert_eq!(split_last_round(896, 264), Some(792));
}
