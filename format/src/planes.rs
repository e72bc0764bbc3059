//! Bit-plane packing of one 32-value block.
//!
//! A block of 32 k-bit indices is stored as k u32 words ("planes"):
//! bit `i` (LSB = 0) of plane `j` is bit `j` of the index of element `i`.
//! So element `i`'s index is `Σ_j ((plane[j] >> i) & 1) << j`.

use crate::BLOCK;

/// Packs 32 indices (each `< 2^K`) into `K` bit planes.
#[inline(always)]
pub fn pack<const K: usize>(indices: &[u8; BLOCK]) -> [u32; K] {
    let mut words = [0u32; K];
    pack_into(indices, &mut words);
    words
}

/// Packs 32 indices into `planes.len()` bit planes (k known at run time).
#[inline(always)]
pub fn pack_into(indices: &[u8; BLOCK], planes: &mut [u32]) {
    planes.fill(0);
    for (i, &q) in indices.iter().enumerate() {
        for (j, w) in planes.iter_mut().enumerate() {
            *w |= ((q as u32 >> j) & 1) << i;
        }
    }
}

/// Index of element `i` (0..32) of a block given its planes (any k).
#[inline(always)]
pub fn index(planes: &[u32], i: usize) -> u32 {
    let mut q = 0;
    for (j, &w) in planes.iter().enumerate() {
        q |= ((w >> i) & 1) << j;
    }
    q
}

/// Indices of 8 consecutive elements `8·q .. 8·q+7` of a block, from its
/// `K` planes (K ≤ 8).
///
/// Byte `q` of plane `j` holds bit `j` of those 8 indices. Stack the bytes as
/// the rows of an 8×8 bit matrix (row `j` = byte `j` of a u64, column `e` =
/// bit `e`); its transpose ([`transpose8`]) has, in byte `e`, bit `j` = bit
/// `e` of row `j`: the index of element `8q + e`.
#[inline(always)]
pub fn octet<const K: usize>(planes: &[u32; K], q: u32) -> [u32; 8] {
    let mut x = 0u64;
    for (j, &p) in planes.iter().enumerate() {
        x |= (((p >> (8 * q)) & 0xff) as u64) << (8 * j);
    }
    let x = transpose8(x);
    core::array::from_fn(|e| ((x >> (8 * e)) & 0xff) as u32)
}

/// Transposes the 8×8 bit matrix whose row `r` is byte `r` of `x` and whose
/// column `c` is bit `c` of a row (bit `8r + c` of `x` moves to `8c + r`).
/// Three delta swaps (2×2, 4×4, 8×8 blocks), ~40 ALU operations, against
/// 2 per bit when the bits are moved one by one.
#[inline(always)]
pub fn transpose8(mut x: u64) -> u64 {
    // Swap bit (r, c) with (r + 1, c − 1) for even r, odd c; then 2×2 blocks
    // of 4×4 blocks; then 4×4 blocks of the 8×8 matrix.
    let t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x ^= t ^ (t << 7);
    let t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x ^= t ^ (t << 14);
    let t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^= t ^ (t << 28);
    x
}
