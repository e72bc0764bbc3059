//! Element types of activations and outputs, as raw bits on the device.

use crate::ptx;

/// An activation/output element type: f16, bf16 or f32.
pub trait Elem {
    /// Storage type (u16 bits for f16/bf16, f32 for f32).
    type Raw: Copy;
    /// Exact widening to f32.
    fn to_f32(x: Self::Raw) -> f32;
    /// Round to nearest even from f32.
    fn from_f32(x: f32) -> Self::Raw;
    /// Writes 8 consecutive values (16 or 32 bytes) at `p` (aligned to that size).
    ///
    /// # Safety
    /// `p` is valid for 8 elements and aligned to their total size.
    unsafe fn store8(p: *mut Self::Raw, v: [f32; 8]);
}

/// IEEE half precision.
pub struct F16;
/// bfloat16.
pub struct Bf16;
/// IEEE single precision.
pub struct F32;

/// Eight values as four pairs through a two-value conversion (`lo` in the
/// low half of each word).
#[inline(always)]
fn pairs(v: [f32; 8], cvt: impl Fn(f32, f32) -> u32) -> [u32; 4] {
    [cvt(v[0], v[1]), cvt(v[2], v[3]), cvt(v[4], v[5]), cvt(v[6], v[7])]
}

impl Elem for F16 {
    type Raw = u16;
    #[inline(always)]
    fn to_f32(x: u16) -> f32 {
        ptx::f16_to_f32(x)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> u16 {
        ptx::f32_to_f16(x)
    }
    #[inline(always)]
    unsafe fn store8(p: *mut u16, v: [f32; 8]) {
        unsafe { ptx::st_v4(p as *mut u32, pairs(v, ptx::f32x2_to_f16x2)) }
    }
}

impl Elem for Bf16 {
    type Raw = u16;
    #[inline(always)]
    fn to_f32(x: u16) -> f32 {
        f32::from_bits((x as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> u16 {
        ptx::f32_to_bf16(x)
    }
    #[inline(always)]
    unsafe fn store8(p: *mut u16, v: [f32; 8]) {
        unsafe { ptx::st_v4(p as *mut u32, pairs(v, ptx::f32x2_to_bf16x2)) }
    }
}

impl Elem for F32 {
    type Raw = f32;
    #[inline(always)]
    fn to_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn store8(p: *mut f32, v: [f32; 8]) {
        let b = v.map(f32::to_bits);
        unsafe {
            ptx::st_v4(p as *mut u32, [b[0], b[1], b[2], b[3]]);
            ptx::st_v4((p as *mut u32).add(4), [b[4], b[5], b[6], b[7]]);
        }
    }
}
