//! Tile primitives shared by the kernels: loading a block's bit planes and
//! staging the codebook in shared memory.

use crate::ptx;

/// Loads the `K` plane words of one quant block with as few load
/// instructions as alignment allows. A block's planes start at a multiple of
/// `K` words in both layouts, so k = 2 is 8-aligned and k = 4 16-aligned;
/// for odd k the start is even or odd, and `ceil(K/2)` 8-byte loads from
/// the even word at or below it cover the block (one word past it at most,
/// which is the next block's first plane or a padding word), followed by a
/// parity select.
///
/// # Safety
/// `p` points at `K` readable words followed, for odd K at an even word, by
/// one more readable word (true of both layouts: the tiled layout has both
/// halves of every tile, the flat layout `K` padding words); aligned to
/// `4·K` bytes for K = 2, 4.
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
                    let a = ptx::ld_nc_v2(p);
                    [a[0], a[1], 0, 0, 0, 0]
                }
                4 => {
                    let a = ptx::ld_nc_v4(p);
                    [a[0], a[1], a[2], a[3], 0, 0]
                }
                3 | 5 => {
                    odd = (p as usize / 4) & 1 == 1;
                    let base = p.sub(odd as usize);
                    let a = ptx::ld_nc_v2(base);
                    let b = ptx::ld_nc_v2(base.add(2));
                    let c = if K == 5 { ptx::ld_nc_v2(base.add(4)) } else { [0, 0] };
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
    unsafe { ptx::ld_shared_f32(base + 4 * idx) }
}
