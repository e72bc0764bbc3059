//! The default "normal float" NF-k codebooks.
//!
//! `q_i = (i + 0.5) / 2^k`, `v_i = f32(Φ⁻¹(q_i))` evaluated in f64, and
//! `cb_i = f32(v_i / max_j |v_j|)`: ascending, symmetric, endpoints ±1.
//! Φ⁻¹ is Wichura's algorithm AS 241 (PPND16, relative error about 1e-16),
//! far more accurate than the f32 rounding that follows.

use std::vec::Vec;

fn poly(c: &[f64], x: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &ci| acc * x + ci)
}

/// Inverse of the standard normal CDF, for `0 < p < 1`.
// The coefficients are quoted as published (20 digits), more than f64 holds.
#[allow(clippy::excessive_precision)]
pub fn inv_normal_cdf(p: f64) -> f64 {
    const A: [f64; 8] = [
        3.387_132_872_796_366_608e0,
        1.331_416_678_917_843_774_5e2,
        1.971_590_950_306_551_442_7e3,
        1.373_169_376_550_946_112_5e4,
        4.592_195_393_154_987_145_7e4,
        6.726_577_092_700_870_085_3e4,
        3.343_057_558_358_812_810_5e4,
        2.509_080_928_730_122_672_7e3,
    ];
    const B: [f64; 8] = [
        1.0,
        4.231_333_070_160_091_125_2e1,
        6.871_870_074_920_579_083e2,
        5.394_196_021_424_751_107_7e3,
        2.121_379_430_158_659_586_7e4,
        3.930_789_580_009_271_061e4,
        2.872_908_573_572_194_267_4e4,
        5.226_495_278_852_854_561e3,
    ];
    const C: [f64; 8] = [
        1.423_437_110_749_683_577_34e0,
        4.630_337_846_156_545_295_9e0,
        5.769_497_221_460_691_405_5e0,
        3.647_848_324_763_204_605_04e0,
        1.270_458_252_452_368_382_58e0,
        2.417_807_251_774_506_117_7e-1,
        2.272_384_498_926_918_458_33e-2,
        7.745_450_142_783_414_076_4e-4,
    ];
    const D: [f64; 8] = [
        1.0,
        2.053_191_626_637_758_821_87e0,
        1.676_384_830_183_803_849_4e0,
        6.897_673_349_851_000_045_5e-1,
        1.481_039_764_274_800_745_9e-1,
        1.519_866_656_361_645_719_66e-2,
        5.475_938_084_995_344_946e-4,
        1.050_750_071_644_416_843_24e-9,
    ];
    const E: [f64; 8] = [
        6.657_904_643_501_103_777_2e0,
        5.463_784_911_164_114_369_9e0,
        1.784_826_539_917_291_335_8e0,
        2.965_605_718_285_048_912_3e-1,
        2.653_218_952_657_612_309_3e-2,
        1.242_660_947_388_078_438_6e-3,
        2.711_555_568_743_487_578_15e-5,
        2.010_334_399_292_288_132_65e-7,
    ];
    const F: [f64; 8] = [
        1.0,
        5.998_322_065_558_879_376_9e-1,
        1.369_298_809_227_358_053_1e-1,
        1.487_536_129_085_061_485_25e-2,
        7.868_691_311_456_132_591e-4,
        1.846_318_317_510_054_681_8e-5,
        1.421_511_758_316_445_888_7e-7,
        2.044_263_103_389_939_785_64e-15,
    ];
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        return q * poly(&A, r) / poly(&B, r);
    }
    let r = if q < 0.0 { p } else { 1.0 - p };
    let r = (-r.ln()).sqrt();
    let v = if r <= 5.0 {
        let r = r - 1.6;
        poly(&C, r) / poly(&D, r)
    } else {
        let r = r - 5.0;
        poly(&E, r) / poly(&F, r)
    };
    if q < 0.0 { -v } else { v }
}

/// The NF-`bits` codebook (`2^bits` ascending f32 values, endpoints ±1).
///
/// `bits` must be in 2..=5 (checked by callers; other values still produce a
/// codebook of `2^bits` entries).
pub fn codebook(bits: u32) -> Vec<f32> {
    let n = 1usize << bits;
    let v: Vec<f32> = (0..n).map(|i| inv_normal_cdf((i as f64 + 0.5) / n as f64) as f32).collect();
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    v.iter().map(|&x| (x as f64 / max as f64) as f32).collect()
}
