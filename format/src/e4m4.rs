//! The E4M4 scale byte of the runtime layout.
//!
//! `e = byte >> 4`, `m = byte & 15`; byte 0 is 0.0; `e == 0` is the
//! subnormal `m · 2^−14`; otherwise `2^(e−11) · (1 + m/16)`. The range is
//! 2^−14 … 31.0, and the code is monotonic in the value, so
//! `code = round(v / step)` where step is `2^−14` below `2^−10` and
//! `2^(e−15)` in binade e. A mantissa that rounds up to 16 carries into the
//! exponent (1.99 → 2.0 = 0xC0), which the linear code does by itself.

/// Why a value has no E4M4 encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// NaN or negative.
    Invalid,
    /// Larger than 31.0 (the largest E4M4 value) without saturation.
    TooLarge,
}

/// Largest representable value, byte 0xFF.
pub const MAX: f32 = 31.0;

/// Decodes a scale byte exactly.
///
/// A shift and a multiply, no branch or select: the byte shifted into the top
/// of an f32 (bits 19..27) is exponent field `e` and mantissa `m/16`, i.e.
/// `2^(e−127) · (1 + m/16)` for `e ≥ 1` and the subnormal `m · 2^−130` for
/// `e = 0`; one multiply by `2^116` (exact: a power of two, the result
/// normal or 0) gives `2^(e−11) · (1 + m/16)` and `m · 2^−14`. Subnormal
/// inputs are kept by IEEE multiplication (`mul.rn.f32`; the kernels are
/// built without flush-to-zero).
///
/// ```
/// use kbit_format::e4m4::decode;
/// assert_eq!((decode(0x00), decode(0x01), decode(0xB0), decode(0xFF)), (0.0, 2f32.powi(-14), 1.0, 31.0));
/// ```
#[inline(always)]
pub fn decode(byte: u8) -> f32 {
    f32::from_bits((byte as u32) << 19) * f32::from_bits((116 + 127) << 23)
}

/// [`decode`] without a subnormal operand (a test of the exponent, a
/// biased add and a subtract under it): the shifted byte biased by 116 is
/// `2^(e−11) · (1 + m/16)`, the value for `e ≥ 1`; for `e = 0` the bias is
/// 117, giving `2^−10 + m · 2^−14`, and subtracting `2^−10` leaves
/// `m · 2^−14` exactly (Sterbenz). The same values as [`decode`]; the
/// dequantize kernels and the GEMV instances other than the one-row block
/// ones use it because their register allocation was tuned with it (with
/// [`decode`] ptxas moves several GEMV instances across the 64-register
/// line).
///
/// ```
/// use kbit_format::e4m4::{decode, decode_biased};
/// assert!((0..=255u8).all(|b| decode_biased(b).to_bits() == decode(b).to_bits()));
/// ```
#[inline(always)]
pub fn decode_biased(byte: u8) -> f32 {
    let sub = byte < 16;
    let v = f32::from_bits(((byte as u32) << 19) + ((116 + sub as u32) << 23));
    if sub { v - f32::from_bits(117 << 23) } else { v }
}

/// Round half to even of `q` in `[0, 32)`; exact because `q` has at most 24
/// significant bits and its integer part fits in 5.
#[inline(always)]
fn round_half_even(q: f32) -> u32 {
    let fl = q as u32;
    let frac = q - fl as f32;
    if frac > 0.5 || (frac == 0.5 && fl & 1 == 1) { fl + 1 } else { fl }
}

/// Encodes `v` to the nearest E4M4 byte, ties to even mantissa, with carry.
///
/// Values below 2^−15 encode to 0. Values above 31 are an error unless
/// `saturate` is set, in which case they (and +inf) encode to 0xFF.
#[inline(always)]
pub fn encode(v: f32, saturate: bool) -> Result<u8, EncodeError> {
    if v.is_nan() || v < 0.0 {
        return Err(EncodeError::Invalid);
    }
    if v > MAX {
        return if saturate { Ok(0xFF) } else { Err(EncodeError::TooLarge) };
    }
    // 2^-10: the smallest normal E4M4 value.
    if v < f32::from_bits((127 - 10) << 23) {
        // Subnormal range, step 2^-14: q = v · 2^14 in [0, 16]; 16 is 0x10.
        return Ok(round_half_even(v * f32::from_bits((127 + 14) << 23)) as u8);
    }
    // v is a normal f32 in [2^-10, 31]: binade exponent ex in [-10, 4].
    let ex = ((v.to_bits() >> 23) & 0xff) as i32 - 127;
    let e = (ex + 11) as u32;
    // q = v / 2^(ex-4) in [16, 32): 16 + mantissa in steps of one.
    let q = v * f32::from_bits(((127 + 4 - ex) as u32) << 23);
    Ok((e * 16 + round_half_even(q) - 16) as u8)
}
