//! Index math of the runtime (tiled) layout.
//!
//! K is cut into tiles of `TILE_K = 64` values (two quant blocks). For each
//! K tile `kt`, all N output columns follow in order; each column holds its
//! 2 blocks (`h = 0, 1`) × k planes contiguously (2k words) and 2 E4M4 bytes:
//!
//! ```text
//! words:  [kt=0: n=0 (h0: p0..pk-1, h1: p0..pk-1), n=1 (...), ... n=N-1]
//!         [kt=1: n=0 ..., ...]
//! word  (kt, n, h, j) = ((kt·N + n)·2 + h)·k + j
//! scale (kt, n, h)    =  (kt·N + n)·2 + h
//! ```
//!
//! Any run of TILE_N consecutive columns of one K tile is therefore one
//! contiguous span. When `K % 64 == 32` the last tile's `h = 1` half is zero
//! words and a zero scale (it decodes to zeros). Products are formed in `u64`
//! so that matrices past 2^31 elements index correctly.

/// Values of K per tile.
pub const TILE_K: usize = 64;
/// Quant blocks per tile.
pub const BLOCKS_PER_TILE: usize = TILE_K / crate::BLOCK;

/// Number of K tiles: `ceil(K / 64)`.
#[inline(always)]
pub const fn k_tiles(k_dim: usize) -> usize {
    k_dim.div_ceil(TILE_K)
}

/// Index of the scale byte of quant block (n, kb).
#[inline(always)]
pub const fn scale_index(n_dim: u64, n: u64, kb: u64) -> u64 {
    let kt = kb / 2;
    let h = kb % 2;
    (kt * n_dim + n) * 2 + h
}

/// Index of word 0 (plane 0) of quant block (n, kb); plane j is `+ j`.
#[inline(always)]
pub const fn word_index(n_dim: u64, n: u64, kb: u64, bits: u64) -> u64 {
    scale_index(n_dim, n, kb) * bits
}

/// Words of one matrix (one expert) in the runtime layout.
#[inline(always)]
pub const fn words(n_dim: usize, k_dim: usize, bits: usize) -> usize {
    k_tiles(k_dim) * n_dim * BLOCKS_PER_TILE * bits
}

/// Scale bytes of one matrix (one expert) in the runtime layout.
#[inline(always)]
pub const fn scales(n_dim: usize, k_dim: usize) -> usize {
    k_tiles(k_dim) * n_dim * BLOCKS_PER_TILE
}
