//! Geometry of the K-slot variant of the tensor-core GEMM (kernel 2 for
//! M ≤ 16 on matrices wide enough to fill the GPU with narrow column
//! blocks), shared by the host (grid, shared memory) and the device.
//!
//! A block has [`THREADS`] = 256 threads (8 warps) and owns `8·NF` output
//! columns (`NF` n8 fragments, [`FRAGMENTS`]) and all of K. Warp `w` is
//! K slot `w`: it takes the 64-wide K tiles `w, w + 8, w + 16, …` for
//! every column of the block, so no K split ever leaves the block and
//! there is no workspace. Shared memory:
//!
//! ```text
//! [ table | ring of slot 0 | … | ring of slot 7 ]      (main loop)
//! [ table | reduction ]                                (after it)
//! table:     the pair table of the tensor-core GEMM at one m block
//!            (`mma::table_bytes(k, 1)`)
//! ring:      `depth` stages (chosen by the host, MIN_DEPTH..=MAX_DEPTH),
//!            one K tile each: [ W window | S window | A ]: the block's
//!            plane words and scale bytes of that tile from the 16-byte
//!            boundary below their start (`mma::w_window`, `mma::s_window`),
//!            in whole 16-byte chunks, and the tile's activations, 8 rows
//!            (M ≤ 8) or 16, 128 bytes each, XOR-swizzled as in the
//!            pipelined kernel (`mma::a_offset`)
//! reduction: red[slot][f][i][lane] f32 (slot 0..8, fragment f, accumulator
//!            register i 0..4, lane): each warp's accumulators, which one
//!            thread per output adds in slot order; it reuses the rings
//! ```

use crate::mma;

/// Threads per block (8 warps).
pub const THREADS: u32 = 256;
/// K slots per block: one per warp.
pub const SLOTS: u32 = THREADS / 32;
/// Largest M: one m16 block.
pub const MAX_M: u32 = 16;
/// n8 fragments per block the kernel is built for: 8, 16 or 32 columns.
pub const FRAGMENTS: [u32; 3] = [1, 2, 4];

/// Fewest stages of a slot's ring (K tiles in flight or ready).
pub const MIN_DEPTH: u32 = 3;
/// Most stages of a slot's ring.
pub const MAX_DEPTH: u32 = 4;

/// 16-byte chunks of a stage's plane window: `8·nf` columns of `8·bits`
/// bytes, plus 8 bytes for the window's start below the first column
/// (odd k only: with even k every column starts on 16 bytes).
#[inline(always)]
pub const fn w_chunks(bits: u32, nf: u32) -> u32 {
    (64 * nf * bits + if bits % 2 == 1 { 8 } else { 0 }).div_ceil(16)
}

/// 16-byte chunks of a stage's scale window: `16·nf` bytes from up to 14
/// bytes past a 16-byte boundary.
#[inline(always)]
pub const fn s_chunks(nf: u32) -> u32 {
    (16 * nf + 14).div_ceil(16)
}

/// Activation rows a stage holds for `m` rows: 8 (read with
/// `ldmatrix.x2`) or 16.
#[inline(always)]
pub const fn a_rows(m: u32) -> u32 {
    if m <= 8 { 8 } else { 16 }
}

/// Byte offset of the activations inside a stage.
#[inline(always)]
pub const fn a_offset_in_stage(bits: u32, nf: u32) -> u32 {
    16 * (w_chunks(bits, nf) + s_chunks(nf))
}

/// Bytes of one ring stage for `m` rows.
#[inline(always)]
pub const fn stage_bytes(bits: u32, nf: u32, m: u32) -> u32 {
    a_offset_in_stage(bits, nf) + mma::A_ROW_BYTES * a_rows(m)
}

/// Byte offset of slot `slot`'s ring.
#[inline(always)]
pub const fn ring_offset(bits: u32, nf: u32, m: u32, depth: u32, slot: u32) -> u32 {
    mma::table_bytes(bits, mma::PAIRS) + slot * depth * stage_bytes(bits, nf, m)
}

/// Byte offset of the reduction buffer (over the rings).
#[inline(always)]
pub const fn red_base(bits: u32) -> u32 {
    mma::table_bytes(bits, mma::PAIRS)
}

/// Output columns of a block with `nf` fragments.
#[inline(always)]
pub const fn block_cols(nf: u32) -> u32 {
    8 * nf
}

/// Bytes of the reduction buffer: 8 slots × `nf` fragments × 4 registers
/// × 32 lanes of f32.
#[inline(always)]
pub const fn red_bytes(nf: u32) -> u32 {
    SLOTS * nf * 4 * 32 * 4
}

/// Dynamic shared memory of a block with `depth`-stage rings for `m`
/// rows: table, then the rings or the reduction buffer, whichever is larger.
#[inline(always)]
pub const fn smem_bytes(bits: u32, nf: u32, m: u32, depth: u32) -> u32 {
    let rings = ring_offset(bits, nf, m, depth, SLOTS);
    let red = red_base(bits) + red_bytes(nf);
    if rings > red { rings } else { red }
}

/// Byte offset of the reduction word of (slot, fragment f, register i, lane).
#[inline(always)]
pub const fn red_offset(nf: u32, slot: u32, f: u32, i: u32, lane: u32) -> u32 {
    (((slot * nf + f) * 4 + i) * 32 + lane) * 4
}

/// K tiles slot `slot` owns when the matrix has `k_tiles`: `kt = slot + 8i`
/// for `i` below this.
#[inline(always)]
pub const fn slot_tiles(k_tiles: u32, slot: u32) -> u32 {
    (k_tiles + SLOTS - 1 - slot) / SLOTS
}

/// Output (row, column within the block) of accumulator register `i` of
/// fragment `f` in lane `lane` (the mma C map: rows `g`, `g + 8`, columns
/// `8f + 2t + i % 2`).
#[inline(always)]
pub const fn c_pos(f: u32, i: u32, lane: u32) -> (u32, u32) {
    (lane / 4 + 8 * (i / 2), 8 * f + 2 * (lane % 4) + i % 2)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn windows_fit_their_chunks() {
        for bits in 2..=5u32 {
            for nf in FRAGMENTS {
                for n_dim in [8u64, 72, 4100, 5120, 28672] {
                    for kt in 0..5 {
                        let mut n0 = 0;
                        while n0 < n_dim {
                            let valid = (n_dim - n0).min(block_cols(nf) as u64);
                            let (w0, _, wend) = mma::w_window(n_dim, kt, n0, valid, bits as u64);
                            let (s0, _, send) = mma::s_window(n_dim, kt, n0, valid);
                            assert!(wend - w0 <= 16 * w_chunks(bits, nf) as u64, "k={bits} nf={nf} N={n_dim}");
                            assert!(send - s0 <= 16 * s_chunks(nf) as u64);
                            n0 += block_cols(nf) as u64;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_tile_has_one_slot() {
        for k_tiles in 0..40 {
            let mut seen = [0u32; 40];
            for s in 0..SLOTS {
                for i in 0..slot_tiles(k_tiles, s) {
                    seen[(s + SLOTS * i) as usize] += 1;
                }
            }
            assert!(seen[..k_tiles as usize].iter().all(|&c| c == 1), "k_tiles {k_tiles}");
            assert!(seen[k_tiles as usize..].iter().all(|&c| c == 0));
        }
    }

    #[test]
    fn every_output_has_one_register() {
        for nf in FRAGMENTS {
            let mut seen = [[0u32; 32]; 16];
            for f in 0..nf {
                for i in 0..4 {
                    for lane in 0..32 {
                        let (r, c) = c_pos(f, i, lane);
                        seen[r as usize][c as usize] += 1;
                    }
                }
            }
            for row in seen {
                assert!(row[..block_cols(nf) as usize].iter().all(|&c| c == 1));
            }
        }
    }

    #[test]
    fn reduction_words_are_distinct_and_in_bounds() {
        for nf in FRAGMENTS {
            let mut offs = std::vec::Vec::new();
            for s in 0..SLOTS {
                for f in 0..nf {
                    for i in 0..4 {
                        for l in 0..32 {
                            offs.push(red_offset(nf, s, f, i, l));
                        }
                    }
                }
            }
            offs.sort_unstable();
            offs.dedup();
            assert_eq!(offs.len() as u32 * 4, red_bytes(nf));
            assert_eq!(*offs.last().unwrap() + 4, red_bytes(nf));
        }
    }
}
