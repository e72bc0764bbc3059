//! Activation staging shared by both scalar GEMV variants: a block copies
//! `x` for a run of K tiles into shared memory as f32, 8 values (one
//! 16-byte load) per thread and unit, in the variant's own layout.
//!
//! Unit `u` of a run of `tiles` tiles is octet `o = u % 8` (activations
//! `8o .. 8o + 8` of the tile) of row `r = (u / 8) % M` of tile
//! `tc = u / (8·M)`: consecutive threads read consecutive 16-byte pieces of
//! one row, so a warp's loads cover whole 128-byte lines of `x`.

use crate::elem::Elem;
use crate::ptx;

/// Stages `x` for tiles `first_tile .. first_tile + tiles`: unit
/// `(tc, r, o)` goes to the shared address `dst(tc, r, o)` (16-aligned, 32
/// bytes). Rows `≥ rows` and columns `≥ k_dim` are written as zeros without
/// reading `x`.
///
/// Each thread first issues the loads of its first `LEAD` units (0, 1 or
/// 2), then runs `between` (work that overlaps their latency: the prologue
/// builds the decode table there), then stores them; the rest go one unit
/// per round (fewer registers).
///
/// # Safety
/// `x` holds `rows` rows of `k_dim` values and is 16-aligned; every `dst`
/// of a unit below `tiles·M·8` lies inside the dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn stage<const M: usize, T: Elem<Raw = u16>, const LEAD: u32>(
    x: *const u16,
    k_dim: u32,
    rows: u32,
    first_tile: u32,
    tiles: u32,
    dst: impl Fn(u32, u32, u32) -> u32,
    between: impl FnOnce(),
) {
    let units = tiles * M as u32 * 8;
    let nt = ptx::block_dim();
    // Unit u: its raw load (zeros when outside x or past the run) and its
    // shared address.
    let load = |u: u32| {
        let o = u & 7;
        let rest = u >> 3;
        let r = rest % M as u32;
        let tc = rest / M as u32;
        let pos = (first_tile + tc) as u64 * 64 + 8 * o as u64;
        let raw = if u < units && r < rows && pos < k_dim as u64 {
            unsafe { ptx::ld_nc_v4(x.add((r as u64 * k_dim as u64 + pos) as usize) as *const u32) }
        } else {
            [0; 4]
        };
        (raw, dst(tc, r, o))
    };
    let store = |u: u32, (raw, at): ([u32; 4], u32)| {
        if u < units {
            let v: [u32; 8] = core::array::from_fn(|i| T::to_f32((raw[i / 2] >> (16 * (i % 2))) as u16).to_bits());
            unsafe {
                ptx::st_shared_v4(at, [v[0], v[1], v[2], v[3]]);
                ptx::st_shared_v4(at + 16, [v[4], v[5], v[6], v[7]]);
            }
        }
    };
    let mut u = ptx::tid();
    if LEAD == 2 {
        let (a, b) = (load(u), load(u + nt));
        between();
        store(u, a);
        store(u + nt, b);
        u += 2 * nt;
    } else if LEAD == 1 {
        let a = load(u);
        between();
        store(u, a);
        u += nt;
    } else {
        between();
    }
    while u < units {
        let a = load(u);
        store(u, a);
        u += nt;
    }
}
