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
/// `K` planes: byte `q` of each plane holds one bit of each of the 8.
/// Returned packed as 8 nibble-or-wider fields in a `[u32; 8]`.
#[inline(always)]
pub fn octet<const K: usize>(planes: &[u32; K], q: u32) -> [u32; 8] {
    let mut bytes = [0u32; K];
    for j in 0..K {
        bytes[j] = (planes[j] >> (8 * q)) & 0xff;
    }
    let mut out = [0u32; 8];
    for (e, o) in out.iter_mut().enumerate() {
        let mut v = 0;
        for (j, b) in bytes.iter().enumerate() {
            v |= ((b >> e) & 1) << j;
        }
        *o = v;
    }
    out
}
