//! Tile primitives shared by the kernels: loading a block's bit planes and
//! staging the codebook in shared memory.

use crate::ptx;
use kbit_format::planes;

/// Loads the `K` plane words of one quant block with as few load
/// instructions as alignment allows. A block's planes start at a multiple of
/// `K` words in both layouts, so k = 2 is 8-aligned and k = 4 16-aligned;
/// for odd k the start is even or odd, and `ceil(K/2)` 8-byte loads from
/// the even word at or below it cover the block (one word past it at most,
/// which is the next block's first plane or a padding word), followed by a
/// parity select. Every load asks the L2 for the whole 256-byte span on a
/// miss ([`ptx::ld_nc_v2_l2_256`]): in the runtime layout a warp reading
/// along K touches a few 8·k-byte column tiles far apart, whose neighbours
/// other warps read next, and DRAM serves them in one burst.
///
/// # Safety
/// `p` points at `K` readable words followed, for odd K at an even word, by
/// one more readable word (true of both layouts: the tiled layout has both
/// halves of every tile, the flat layout `K` padding words), in an array
/// that is 8-aligned (16-aligned for K = 4).
#[inline(always)]
pub unsafe fn load_planes<const K: usize>(p: *const u32) -> [u32; K] {
    unsafe { PlaneWords::<K>::load(p) }.planes()
}

/// The words [`load_planes`] loads, before the odd-k parity select: a
/// block loaded ahead of its use holds these, so that nothing waits on the
/// loads until [`PlaneWords::planes`] is called.
#[derive(Clone, Copy)]
pub struct PlaneWords<const K: usize> {
    /// The loaded words: the planes (K = 2, 4), or the `ceil(K/2)` pairs
    /// from the even word at or below the block (K = 3, 5).
    words: [u32; 6],
    /// The block starts at an odd word (K = 3, 5).
    odd: bool,
}

impl<const K: usize> PlaneWords<K> {
    /// All-zero planes.
    pub const ZERO: Self = Self { words: [0; 6], odd: false };

    /// Issues the loads of the block at `p` (see [`load_planes`]).
    ///
    /// # Safety
    /// As [`load_planes`].
    #[inline(always)]
    pub unsafe fn load(p: *const u32) -> Self {
        let mut odd = false;
        let words = unsafe {
            match K {
                2 => {
                    let a = ptx::ld_nc_v2_l2_256(p);
                    [a[0], a[1], 0, 0, 0, 0]
                }
                4 => {
                    let a = ptx::ld_nc_v4_l2_256(p);
                    [a[0], a[1], a[2], a[3], 0, 0]
                }
                3 | 5 => {
                    // The even word at or below p.
                    odd = p as usize & 4 != 0;
                    let base = p.map_addr(|a| a & !7);
                    let a = ptx::ld_nc_v2_l2_256(base);
                    let b = ptx::ld_nc_v2_l2_256(base.add(2));
                    let c = if K == 5 { ptx::ld_nc_v2_l2_256(base.add(4)) } else { [0, 0] };
                    [a[0], a[1], b[0], b[1], c[0], c[1]]
                }
                _ => core::array::from_fn(|j| if j < K { ptx::ld_nc_u32(p.add(j)) } else { 0 }),
            }
        };
        Self { words, odd }
    }

    /// The block's `K` plane words.
    #[inline(always)]
    pub fn planes(&self) -> [u32; K] {
        let w = self.words;
        if !matches!(K, 3 | 5) {
            return core::array::from_fn(|j| w[j]);
        }
        // Word j or j + 1 by a funnel shift of the pair, not a select:
        // LLVM turns a select between neighbours into a runtime array index,
        // which puts the words in local memory.
        let s = 32 * self.odd as u32;
        core::array::from_fn(|j| ((((w[j + 1] as u64) << 32) | w[j] as u64) >> s) as u32)
    }

    /// Byte offsets into a codebook staged by [`stage_codebook`] (`4·index`)
    /// of the eight elements `8q .. 8q+7` of the block: byte `e` of
    /// `lo | hi << 32` for element `e` (see [`octet_offset`]).
    ///
    /// Byte `q` of plane `j` becomes row `j + 2` of the bit matrix that
    /// `kbit_format::planes::octet` transposes (rows 0, 1 and those past
    /// the planes zero), so each transposed byte holds the index already
    /// shifted left by 2. The rows are gathered by byte permutes: lo =
    /// `[·, ·, p0.q, p1.q]`, hi = `[p2.q, p3.q, p4.q, 0]`.
    #[inline(always)]
    pub fn octet_offsets(&self, q: u32) -> [u32; 2] {
        const { assert!(K >= 2 && K <= 5) };
        let p = self.planes();
        // Selector nibble i picks output byte i: q is byte q of the first
        // word, q + 4 byte q of the second, 4 with a zero second word is 0.
        let pair = q | (q + 4) << 4;
        let lo = ptx::prmt(p[0], p[1], pair << 8) & 0xFFFF_0000;
        let hi = match K {
            3 => ptx::prmt(p[2], 0, 0x4440 | q),
            4 => ptx::prmt(p[2], p[3], pair) & 0xFFFF,
            5 => ptx::prmt(p[2], p[3], pair) & 0xFFFF | ptx::prmt(p[4], 0, 0x4044 | q << 8),
            _ => 0,
        };
        let x = planes::transpose8(lo as u64 | (hi as u64) << 32);
        [x as u32, (x >> 32) as u32]
    }
}

/// Offset of element `e` (0..8) from [`PlaneWords::octet_offsets`]: one
/// byte permute (zero-extended byte `e % 4` of the word).
#[inline(always)]
pub fn octet_offset(offsets: &[u32; 2], e: usize) -> u32 {
    ptx::prmt(offsets[e / 4], 0, 0x4440 | (e % 4) as u32)
}

/// Copies the `2^K`-entry codebook to the start of dynamic shared memory and
/// returns its shared address. Ends with a block barrier.
///
/// # Safety
/// `cb` holds `2^K` floats; the launch has ≥ 128 bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn stage_codebook<const K: usize>(cb: *const f32) -> u32 {
    let base = ptx::smem_base();
    let t = ptx::tid();
    if (t as usize) < (1 << K) {
        unsafe { ptx::st_shared_f32(base + 4 * t, *cb.add(t as usize)) };
    }
    ptx::bar_sync();
    base
}

/// Codebook entry `idx` from a table staged by [`stage_codebook`].
///
/// # Safety
/// `idx < 2^K` of the staged table.
#[inline(always)]
pub unsafe fn codebook_at(base: u32, idx: u32) -> f32 {
    unsafe { codebook_at_offset(base, 4 * idx) }
}

/// Codebook entry at byte offset `offset` (`4·index`, as
/// [`octet_offset`] gives it) of a table staged by [`stage_codebook`].
///
/// # Safety
/// `offset < 4·2^K`, a multiple of 4.
#[inline(always)]
pub unsafe fn codebook_at_offset(base: u32, offset: u32) -> f32 {
    unsafe { ptx::ld_shared_f32(base + offset) }
}
