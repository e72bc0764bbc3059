//! B fragments of `mma.m16n8k16` dequantized in registers: bit planes →
//! codebook lookup (a per-lane table in shared memory) → × E4M4 block scale.
//!
//! Numerics: every weight is `T(T(cb[i]) · T(amax))`: the table holds the
//! codebook entries rounded to T, the scale byte decodes exactly to T, and
//! the product is one IEEE multiply in T rounded to nearest even
//! (`mul.rn.f16x2`, or `fma.rn.bf16x2` with a −0 addend for bf16).
//!
//! Plane view. Lane `l` (t = l % 4) of a warp holds, for its column and
//! quant block, elements `8q + 2t + e` (q = 0..4, e = 0, 1): byte q of the
//! block's 32-bit plane words, bits 2t and 2t+1. Byte q = 2s + r feeds
//! register `b_r` of k16 step s of the block (mma B map: b0 = k 2t, 2t+1;
//! b1 = k 2t+8, 2t+9), e = 0 the low half. k rotates and masks per
//! fragment gather, for every byte q, the 2k-bit index of the pair
//! (`a0 b0 a1 b1 …`, LSB first) into two words, so that one `prmt` per
//! lookup yields the pair's table byte address (`kbit_format::mma::pair_words`).
//!
//! Table: entry e holds `T(cb[a]) | T(cb[b]) << 16` for the pair (a, b) of
//! interleaved index e, in C copies (`kbit_format::mma::table_copies(K,
//! MB)`, so the functions here take the instance's m blocks `MB`): word
//! `e·C + c`, and lane l reads copy `l % C`. With C = 32 (k <= 4: 2, 8, 32 KiB) 32
//! lanes with arbitrary indices hit 32 distinct banks; k = 5 has C = 4 from
//! two m blocks on and C = 8 in the K-slot and warpgroup kernels
//! ([`PAIRS`]). k = 5 at one m block of the pipelined kernel splits off the low index bit
//! (`kbit_format::mma::splits_low_bit`): entry e, addressed by the upper
//! four bits of a and b, is 8 bytes, `T(cb[2a']) | T(cb[2b']) << 16` then
//! `T(cb[2a' + 1]) | T(cb[2b' + 1]) << 16`, in 16 copies (copy c at byte
//! `128·e + 8c`, lane l reads copy `l % 16`), and a `prmt` by the low bits
//! picks the pair's two values out of the 8 bytes.

use crate::elem::{Bf16, Elem, F16};
use crate::ptx;
use kbit_format::mma::{
    THREADS, deinterleave, entry_bytes, entry_select, entry_words, low_bit_selects, splits_low_bit, table_copies,
    table_entries,
};

/// The `MB` of the table functions for the K-slot and warpgroup kernels:
/// the one-m-block pair table (`kbit_format::mma::PAIRS`).
pub const PAIRS: usize = kbit_format::mma::PAIRS as usize;

/// Whether a loop over at most 8 activation rows (`x2`: rows 0-7 staged,
/// read with `ldmatrix.x2`) with `nf` fragments per warp swaps the mma
/// operands ([`mma_swapped`]): it needs a pair of fragments.
pub const fn swapped(x2: bool, nf: usize) -> bool {
    x2 && nf >= 2
}

/// The two k16 steps of one quant block for fragments 2p and 2p + 1 with
/// the operands swapped (`kbit_format::mma::swapped_c_pos`): the weights
/// `w0`, `w1` ([`dequant`] of the two fragments) are A, the activation
/// registers `x[s]` of step s (`ldmatrix.x2` of rows 0-7) are B, so that
/// each mma covers 16 columns and 8 rows.
#[inline(always)]
pub fn mma_swapped<T: MmaElem>(w0: &[u32; 4], w1: &[u32; 4], x: &[[u32; 2]; 2], acc: [f32; 4]) -> [f32; 4] {
    let acc = T::mma([w0[0], w1[0], w0[1], w1[1]], x[0], acc);
    T::mma([w0[2], w1[2], w0[3], w1[3]], x[1], acc)
}

/// An mma input type: f16 or bf16.
pub trait MmaElem: Elem<Raw = u16> {
    /// `T(lo) | T(hi) << 16`, both rounded to nearest even.
    fn pack(lo: f32, hi: f32) -> u32;
    /// An E4M4 scale byte decoded exactly to T, in both halves.
    fn scale_x2(byte: u32) -> u32;
    /// Two products, each rounded once to T.
    fn mul_x2(a: u32, b: u32) -> u32;
    /// `D = A·B + C`, m16n8k16, f32 accumulators.
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
}

impl MmaElem for F16 {
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        ptx::f32_to_f16(lo) as u32 | (ptx::f32_to_f16(hi) as u32) << 16
    }
    /// `byte << 6` in f16 is the E4M4 value × 2^−4 exactly (same mantissa
    /// bits, exponent bias 15 instead of 11, subnormals included), so one
    /// exact multiply by 16 finishes the decode.
    #[inline(always)]
    fn scale_x2(byte: u32) -> u32 {
        ptx::mul_f16x2(byte * 0x0040_0040, 0x4C00_4C00)
    }
    #[inline(always)]
    fn mul_x2(a: u32, b: u32) -> u32 {
        ptx::mul_f16x2(a, b)
    }
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        ptx::mma_f16(a, b, c)
    }
}

/// −0 in both bf16 halves: the addend that turns `fma` into a rounded multiply.
const BF16_NEG_ZERO_X2: u32 = 0x8000_8000;

impl MmaElem for Bf16 {
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        ptx::f32_to_bf16(lo) as u32 | (ptx::f32_to_bf16(hi) as u32) << 16
    }
    /// `byte << 3` in bf16 is the E4M4 value × 2^−116 exactly (bias 127
    /// instead of 11, subnormals included); × 2^116 (0x7980) is exact.
    #[inline(always)]
    fn scale_x2(byte: u32) -> u32 {
        ptx::fma_bf16x2(byte * 0x0008_0008, 0x7980_7980, BF16_NEG_ZERO_X2)
    }
    #[inline(always)]
    fn mul_x2(a: u32, b: u32) -> u32 {
        ptx::fma_bf16x2(a, b, BF16_NEG_ZERO_X2)
    }
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        ptx::mma_bf16(a, b, c)
    }
}

/// 16-byte stores per table entry: its C copies, 16 bytes per store.
const fn entry_vecs(bits: u32, mb: u32) -> u32 {
    table_copies(bits, mb) * entry_bytes(bits, mb) / 16
}

/// 16-byte table stores each thread makes: `ceil(entries · C/4 / THREADS)`
/// (k = 2: 1, half the threads; k = 3: 2; k = 4: 8; k = 5: 8 or 4).
const fn table_rounds(bits: u32, mb: u32) -> usize {
    (table_entries(bits, mb) * entry_vecs(bits, mb)).div_ceil(THREADS) as usize
}

/// Runs `$body` for `$r` = 0 .. `table_rounds(K, MB)` as straight-line
/// code (constant indices keep the share in registers).
macro_rules! each_round {
    ($k:expr, $mb:expr, $r:ident => $body:block) => {{
        macro_rules! one {
            ($i:literal) => {
                if $i < table_rounds($k as u32, $mb as u32) {
                    let $r: usize = $i;
                    $body
                }
            };
        }
        one!(0);
        one!(1);
        one!(2);
        one!(3);
        one!(4);
        one!(5);
        one!(6);
        one!(7);
    }};
}

/// The codebook values behind one thread's share of the table (see
/// [`load_table`]), still in f32: `[lo, hi]` per 16-byte store.
#[derive(Clone, Copy)]
pub struct TableShare<const K: usize> {
    v: [[f32; 2]; 8],
}

impl<const K: usize> TableShare<K> {
    /// No values: the share of a thread that stores no part of the table.
    pub const ZERO: Self = Self { v: [[0.0; 2]; 8] };
}

/// Loads the codebook values of this thread's table stores (store `r` is
/// 16-byte vector `tid + r·THREADS` of the table, entry `vector / (C/4)`).
/// In a split table (`splits_low_bit`: 256 entries, one per thread) the
/// thread's stores are all of entry `tid`, whose four values are `v[0]`
/// (low bits 0) and `v[1]` (low bits 1).
/// Nothing waits on the loads here, so a kernel issues them before its
/// first pipeline copies and [`store_table`] after: the codebook's latency
/// hides behind the copy issue, and its loads do not queue behind them.
///
/// # Safety
/// `cb` holds `2^K` floats.
#[inline(always)]
pub unsafe fn load_table<const K: usize, const MB: usize>(cb: *const f32, tid: u32) -> TableShare<K> {
    const { assert!(table_rounds(K as u32, MB as u32) <= 8) };
    const { assert!(!splits_low_bit(K as u32, MB as u32) || table_entries(K as u32, MB as u32) == THREADS) };
    let mut v = [[0f32; 2]; 8];
    if splits_low_bit(K as u32, MB as u32) {
        let (a, b) = (2 * deinterleave(tid, 0, K as u32 - 1), 2 * deinterleave(tid, 1, K as u32 - 1));
        let (a, b) = (a as usize, b as usize);
        v[0] = unsafe { [*cb.add(a), *cb.add(b)] };
        v[1] = unsafe { [*cb.add(a + 1), *cb.add(b + 1)] };
        return TableShare { v };
    }
    let per_entry = entry_vecs(K as u32, MB as u32);
    let vecs = table_entries(K as u32, MB as u32) * per_entry;
    each_round!(K, MB, r => {
        let i = tid + THREADS * r as u32;
        if i < vecs {
            let e = i / per_entry;
            let bits = K as u32;
            v[r] = unsafe { [*cb.add(deinterleave(e, 0, bits) as usize), *cb.add(deinterleave(e, 1, bits) as usize)] };
        }
    });
    TableShare { v }
}

/// Fills the lookup table at shared address `tbl` (see the module docs)
/// from the values [`load_table`] gave this thread. Every entry is C
/// identical words, written as C/4 16-byte stores. A split table's thread
/// writes the 8 stores of its entry (two copies each), store r at chunk
/// `(r + tid) % 8` of the entry's 128 bytes, so that the 32 stores of a
/// warp spread over the 8 chunk positions: 4 wavefronts, not 32. The
/// caller's next block barrier publishes it.
///
/// # Safety
/// `tbl` has `table_bytes(K, MB)` bytes of shared memory; every thread of
/// the block calls this with its own share.
#[inline(always)]
pub unsafe fn store_table<const K: usize, const MB: usize, T: MmaElem>(tbl: u32, share: &TableShare<K>, tid: u32) {
    if splits_low_bit(K as u32, MB as u32) {
        let words = [T::pack(share.v[0][0], share.v[0][1]), T::pack(share.v[1][0], share.v[1][1])];
        let entry = tbl + 128 * tid;
        for r in 0..8u32 {
            let at = entry + 16 * ((r + tid) & 7);
            unsafe { ptx::st_shared_v4(at, [words[0], words[1], words[0], words[1]]) };
        }
        return;
    }
    let vecs = table_entries(K as u32, MB as u32) * entry_vecs(K as u32, MB as u32);
    each_round!(K, MB, r => {
        let i = tid + THREADS * r as u32;
        if i < vecs {
            let [lo, hi] = share.v[r];
            unsafe { ptx::st_shared_v4(tbl + 16 * i, [T::pack(lo, hi); 4]) };
        }
    });
}

/// The `K` plane words of one quant block from shared memory, as wide as
/// alignment allows (k = 2: 8 bytes, k = 4: 16 bytes; odd k: 4-aligned).
///
/// # Safety
/// `addr` is a shared address of `K` words, aligned to 8 (K = 2) or 16 (K = 4).
#[inline(always)]
pub unsafe fn load_planes<const K: usize>(addr: u32) -> [u32; K] {
    let mut w = [0u32; K];
    unsafe {
        match K {
            2 => {
                let v = ptx::ld_shared_v2(addr);
                w[0] = v[0];
                w[1] = v[1];
            }
            4 => {
                let v = ptx::ld_shared_v4(addr);
                w[0] = v[0];
                w[1] = v[1];
                w[2] = v[2];
                w[3] = v[3];
            }
            _ => {
                for (j, wj) in w.iter_mut().enumerate() {
                    *wj = ptx::ld_shared_u32(addr + 4 * j as u32);
                }
            }
        }
    }
    w
}

/// Dequantizes one thread's 8 weights of a (column, quant block): returns
/// the scaled b registers `[b0, b1]` of k16 step 0 then of step 1 of the
/// block (see the module docs for the map).
///
/// `rot` = [`rotations`](kbit_format::mma::rotations)`(2·(lane % 4))`;
/// `tbl` the table's shared address; `lanes` =
/// [`lane_bytes`](kbit_format::mma::lane_bytes) of the lane for the
/// table's copies; `s2` the block's E4M4 scale decoded by
/// [`MmaElem::scale_x2`] (both halves). The planes are rotated and masked
/// once per fragment into two words ([`pair_words`]); every table address
/// is then one `prmt` of those words, and the table base is added last so
/// that it folds into the load's address operand.
///
/// # Safety
/// The table at `tbl` was built by [`store_table`] for `K`, `MB`, `T`.
#[inline(always)]
pub unsafe fn dequant<const K: usize, const MB: usize, T: MmaElem>(
    planes: &[u32; K],
    rot: &[u32; 8],
    tbl: u32,
    lanes: u32,
    s2: u32,
) -> [u32; 4] {
    let (lo, hi) = entry_words(planes, rot, lanes, MB as u32);
    if splits_low_bit(K as u32, MB as u32) {
        // rot[2] = two_t. Selectors of q = 2, 3 sit in the high halves.
        let [s02, s13] = low_bit_selects(planes[0], rot[2]);
        let pick = |q: u32, sel: u32| {
            let [w0, w1] = unsafe { ptx::ld_shared_v2(tbl + ptx::prmt(lo, hi, entry_select(q))) };
            T::mul_x2(ptx::prmt(w0, w1, sel), s2)
        };
        return [pick(0, s02), pick(1, s13), pick(2, s02 >> 16), pick(3, s13 >> 16)];
    }
    unsafe { lookups::<T>(lo, hi, tbl, s2) }
}

/// The four scaled pairs of index words `(lo, hi)` of a table of 4-byte
/// entries: one `prmt` per address ([`entry_select`]), one lookup and one
/// multiply by `s2` each.
///
/// # Safety
/// `(lo, hi)` address the table at `tbl` (`kbit_format::mma::pair_words`
/// or its merged form).
#[inline(always)]
pub unsafe fn lookups<T: MmaElem>(lo: u32, hi: u32, tbl: u32, s2: u32) -> [u32; 4] {
    core::array::from_fn(|q| {
        let at = ptx::prmt(lo, hi, entry_select(q as u32));
        T::mul_x2(unsafe { ptx::ld_shared_u32(tbl + at) }, s2)
    })
}
