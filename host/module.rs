//! The embedded PTX and the table of its kernels, resolved once per Context.

use crate::wgmma_plan::Slots;
use crate::{Dtype, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// PTX of every kernel, built from `kernels-gpu` by `build.rs` (rustc
/// nvptx64 backend, `.target sm_89`; the driver JIT-compiles it for newer
/// GPUs), except the sm_90a entries.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kbit.ptx"));

/// The entries that need sm_90a (`kbit_wgmma_*`, warpgroup MMA) or are
/// made for sm_90 alone (`kbit_mma_direct_xreg_*`), cut out of the same
/// build: [`ptx_for`] appends them to [`PTX`] for sm_90.
pub const PTX_SM90A_ENTRIES: &str = include_str!(concat!(env!("OUT_DIR"), "/kbit_sm90a.ptx"));

/// The marker comments `kernels-gpu` emits where a kernel waits for the
/// grids it depends on and lets its dependents start (its `ptx` module), and
/// the sm_90 instructions [`ptx_for`] puts in their place.
pub const GRID_DEPENDENCY_MARKERS: [(&str, &str); 2] = [
    ("// kbit:griddepcontrol.wait", "griddepcontrol.wait;"),
    ("// kbit:griddepcontrol.launch_dependents", "griddepcontrol.launch_dependents;"),
];

/// Whether kernels on a device of compute capability `cc` can be launched
/// as programmatic dependents (sm_90 and newer: the previous kernel's tail
/// overlaps this one's prologue).
///
/// ```
/// use kbit::module::programmatic_launch;
/// assert!(!programmatic_launch((8, 9)));
/// assert!(programmatic_launch((9, 0)) && programmatic_launch((10, 0)));
/// ```
pub fn programmatic_launch(cc: (i32, i32)) -> bool {
    cc.0 >= 9
}

/// Whether a device of compute capability `cc` runs the sm_90a module
/// (warpgroup MMA): exactly sm_90 (H100, H200, H20). Code for sm_90a runs
/// on no other architecture.
///
/// ```
/// use kbit::module::has_wgmma;
/// assert!(has_wgmma((9, 0)));
/// assert!(!has_wgmma((8, 9)) && !has_wgmma((10, 0)));
/// ```
pub fn has_wgmma(cc: (i32, i32)) -> bool {
    cc == (9, 0)
}

/// The PTX to load on a device of compute capability `cc`: [`PTX`] as built
/// (`.target sm_89`) below sm_90; from sm_90 on, the same code with
/// `.target sm_90` and the grid-dependency markers turned into
/// `griddepcontrol` instructions, so that programmatic launches are safe;
/// on sm_90 itself `.target sm_90a` (PTX ISA 8.0) and the
/// [`PTX_SM90A_ENTRIES`] appended.
///
/// ```
/// let ptx = kbit::module::ptx_for((9, 0));
/// assert!(ptx.contains(".target sm_90a") && ptx.contains("griddepcontrol.wait;"));
/// assert!(ptx.contains(".entry kbit_wgmma_k4_f16("));
/// assert!(!kbit::module::ptx_for((8, 9)).contains("griddepcontrol.wait;"));
/// assert!(!kbit::module::ptx_for((8, 9)).contains(".entry kbit_wgmma_"));
/// assert!(!kbit::module::ptx_for((10, 0)).contains(".entry kbit_wgmma_"));
/// ```
pub fn ptx_for(cc: (i32, i32)) -> std::borrow::Cow<'static, str> {
    if !programmatic_launch(cc) {
        return PTX.into();
    }
    let mut s = if has_wgmma(cc) {
        let header = PTX.replacen(".version 7.8", ".version 8.0", 1).replacen(".target sm_89", ".target sm_90a", 1);
        header + PTX_SM90A_ENTRIES
    } else {
        PTX.replacen(".target sm_89", ".target sm_90", 1)
    };
    for (marker, insn) in GRID_DEPENDENCY_MARKERS {
        s = s.replace(marker, insn);
    }
    s.into()
}

/// Bit widths, in table order.
pub(crate) const BITS: [u32; 4] = [2, 3, 4, 5];
/// Dtypes, in table order ([`Dtype::slot`]).
pub(crate) const DTYPES: [Dtype; 3] = [Dtype::F16, Dtype::Bf16, Dtype::F32];

/// m16 blocks per tile of the mma kernels, in table order.
pub(crate) const MMA_M_BLOCKS: [u32; 4] = [1, 2, 3, 4];
/// Tile widths (output columns) of the mma kernels, in table order.
pub(crate) const MMA_TILE_N: [u32; 2] = [64, 128];
/// Dtypes of the mma kernels, in table order.
pub(crate) const MMA_DTYPES: [Dtype; 2] = [Dtype::F16, Dtype::Bf16];

/// (bits, m16 blocks) of the stream-K mma instances, all with 128-column
/// tiles: where Llama-3-70B gate/up (224 such tiles on 132 SMs) measured
/// faster with stream-K than without split-K, and every k at one m block
/// (the wide-stage instances, which the planner gives stream-K on the
/// large matrices; bench-results/NOTES.md).
pub(crate) const MMA_STREAM: [(u32, u32); 6] = [(2, 1), (3, 1), (4, 1), (5, 1), (4, 4), (5, 4)];

/// Tile width of the grouped (MoE) mma instances, one per (bits, m16
/// blocks, dtype).
pub(crate) const MMA_GROUPED_TILE_N: u32 = 64;

/// Position of an mma kernel in [`Kernels`]' table (the grid-stride
/// instances, then the stream-K ones), `None` for an instance that does not
/// exist (f32, m_blocks outside 1..=4, other tile widths, stream-K outside
/// [`MMA_STREAM`]).
pub(crate) fn mma_slot(bits: u32, m_blocks: u32, tile_n: u32, dtype: Dtype, stream: bool) -> Option<usize> {
    let d = MMA_DTYPES.iter().position(|&x| x == dtype)?;
    let classic = BITS.len() * MMA_M_BLOCKS.len() * MMA_TILE_N.len() * MMA_DTYPES.len();
    if stream {
        let i = MMA_STREAM.iter().position(|&x| x == (bits, m_blocks)).filter(|_| tile_n == 128)?;
        return Some(classic + i * MMA_DTYPES.len() + d);
    }
    let b = BITS.iter().position(|&x| x == bits)?;
    let m = MMA_M_BLOCKS.iter().position(|&x| x == m_blocks)?;
    let t = MMA_TILE_N.iter().position(|&x| x == tile_n)?;
    Some(((b * MMA_M_BLOCKS.len() + m) * MMA_TILE_N.len() + t) * MMA_DTYPES.len() + d)
}

/// Position of a grouped (MoE) mma kernel in [`Kernels`]' table: after
/// every instance of [`mma_slot`]. `None` for f32 or m_blocks outside 1..=4.
pub(crate) fn mma_grouped_slot(bits: u32, m_blocks: u32, dtype: Dtype) -> Option<usize> {
    let d = MMA_DTYPES.iter().position(|&x| x == dtype)?;
    let b = BITS.iter().position(|&x| x == bits)?;
    let m = MMA_M_BLOCKS.iter().position(|&x| x == m_blocks)?;
    let before = (BITS.len() * MMA_M_BLOCKS.len() * MMA_TILE_N.len() + MMA_STREAM.len()) * MMA_DTYPES.len();
    Some(before + (b * MMA_M_BLOCKS.len() + m) * MMA_DTYPES.len() + d)
}

/// n8 fragments per block of the K-slot mma instances (8, 16 and 32
/// columns), in table order.
pub(crate) const MMA_KSLOTS_NF: [u32; 3] = kbit_format::mma_kslots::FRAGMENTS;

/// Position of a K-slot mma kernel (dense, or `grouped` over MoE experts)
/// in [`Kernels::mma_kslots`]; `None` for f32 or a fragment count outside
/// [`MMA_KSLOTS_NF`].
pub(crate) fn mma_kslots_slot(bits: u32, nf: u32, dtype: Dtype, grouped: bool) -> Option<usize> {
    let d = MMA_DTYPES.iter().position(|&x| x == dtype)?;
    let b = BITS.iter().position(|&x| x == bits)?;
    let f = MMA_KSLOTS_NF.iter().position(|&x| x == nf)?;
    let per_kind = BITS.len() * MMA_KSLOTS_NF.len() * MMA_DTYPES.len();
    Some(usize::from(grouped) * per_kind + (b * MMA_KSLOTS_NF.len() + f) * MMA_DTYPES.len() + d)
}

/// Staged activation rows of the direct-load mma instances, in table order.
pub(crate) const MMA_DIRECT_ROWS: [u32; 3] = [1, 4, 8];

/// Staged rows of the one-team direct-load instances past
/// [`MMA_DIRECT_ROWS`] (M = 9..16), after the early-decode instances.
pub(crate) const MMA_DIRECT_WIDE_ROWS: [u32; 1] = [16];

/// Bit widths with two-team direct-load instances (k = 5 takes more than
/// the 64 registers of 1024 threads).
pub(crate) const MMA_DIRECT_TEAM_BITS: [u32; 3] = [2, 3, 4];

/// Staged row counts with direct-load instances that decode their first
/// step early (eight rows take more than 64 registers there).
pub(crate) const MMA_DIRECT_EARLY_ROWS: [u32; 2] = [1, 4];

/// Position of a direct-load mma kernel that decodes its first step before
/// the release in [`Kernels::mma_direct`] (after the one- and two-team
/// instances); `None` outside [`MMA_DIRECT_TEAM_BITS`] and
/// [`MMA_DIRECT_EARLY_ROWS`].
pub(crate) fn mma_direct_early_slot(bits: u32, rows: u32, dtype: Dtype) -> Option<usize> {
    let base = (BITS.len() + MMA_DIRECT_TEAM_BITS.len()) * MMA_DIRECT_ROWS.len() * MMA_DTYPES.len();
    Some(base + direct_index(&MMA_DIRECT_TEAM_BITS, &MMA_DIRECT_EARLY_ROWS, bits, rows, dtype)?)
}

/// Position of (`bits`, `rows`, `dtype`) in a run of direct-load instances
/// ordered by bit width in `all_bits`, then row count in `all_rows`, then
/// [`MMA_DTYPES`]; `None` outside them.
fn direct_index(all_bits: &[u32], all_rows: &[u32], bits: u32, rows: u32, dtype: Dtype) -> Option<usize> {
    let d = MMA_DTYPES.iter().position(|&x| x == dtype)?;
    let r = all_rows.iter().position(|&x| x == rows)?;
    let b = all_bits.iter().position(|&x| x == bits)?;
    Some((b * all_rows.len() + r) * MMA_DTYPES.len() + d)
}

/// Bit widths and staged row counts with direct-load instances whose warps
/// load their step's activations into registers (sm_90 only: k = 5 takes
/// more than its 80 registers that way, and one row measured slower).
pub(crate) const MMA_DIRECT_XREG_BITS: [u32; 3] = [2, 3, 4];
/// See [`MMA_DIRECT_XREG_BITS`].
pub(crate) const MMA_DIRECT_XREG_ROWS: [u32; 2] = [4, 8];

/// Position of a direct-load mma kernel whose warps load their step's
/// activations into registers (K ≤ 2048) in [`Kernels::mma_direct_xreg`];
/// `None` for f32 or outside [`MMA_DIRECT_XREG_BITS`] and
/// [`MMA_DIRECT_XREG_ROWS`].
pub(crate) fn mma_direct_xreg_slot(bits: u32, rows: u32, dtype: Dtype) -> Option<usize> {
    direct_index(&MMA_DIRECT_XREG_BITS, &MMA_DIRECT_XREG_ROWS, bits, rows, dtype)
}

/// Position of a direct-load mma kernel with `teams` teams per block in
/// [`Kernels::mma_direct`] (the one-team instances, then the two-team
/// ones; one team with [`MMA_DIRECT_WIDE_ROWS`] after the early-decode
/// ones); `None` for f32, a row count outside [`MMA_DIRECT_ROWS`] and
/// [`MMA_DIRECT_WIDE_ROWS`], or two teams outside [`MMA_DIRECT_TEAM_BITS`]
/// and [`MMA_DIRECT_ROWS`].
pub(crate) fn mma_direct_slot(bits: u32, rows: u32, dtype: Dtype, teams: u32) -> Option<usize> {
    match teams {
        1 if MMA_DIRECT_WIDE_ROWS.contains(&rows) => {
            let teams = (BITS.len() + MMA_DIRECT_TEAM_BITS.len()) * MMA_DIRECT_ROWS.len();
            let early = MMA_DIRECT_TEAM_BITS.len() * MMA_DIRECT_EARLY_ROWS.len();
            let base = (teams + early) * MMA_DTYPES.len();
            Some(base + direct_index(&BITS, &MMA_DIRECT_WIDE_ROWS, bits, rows, dtype)?)
        }
        1 => direct_index(&BITS, &MMA_DIRECT_ROWS, bits, rows, dtype),
        2 => {
            let base = BITS.len() * MMA_DIRECT_ROWS.len() * MMA_DTYPES.len();
            Some(base + direct_index(&MMA_DIRECT_TEAM_BITS, &MMA_DIRECT_ROWS, bits, rows, dtype)?)
        }
        _ => None,
    }
}

/// Layout of a weight a dequantize kernel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayoutKind {
    Flat,
    Tiled,
}

/// Entry-point names, exactly as `kernels-gpu/src/lib.rs` generates them.
pub mod names {
    use crate::Dtype;

    /// `kbit_quantize_k{bits}_{dtype}`.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::quantize(4, Dtype::F16), "kbit_quantize_k4_f16");
    /// ```
    pub fn quantize(bits: u32, dtype: Dtype) -> String {
        format!("kbit_quantize_k{bits}_{}", dtype.name())
    }
    /// `kbit_repack_k{bits}`.
    ///
    /// ```
    /// assert_eq!(kbit::module::names::repack(3), "kbit_repack_k3");
    /// ```
    pub fn repack(bits: u32) -> String {
        format!("kbit_repack_k{bits}")
    }
    /// `kbit_dequant_{flat|tiled}_k{bits}_{dtype}`.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::dequant(true, 4, Dtype::Bf16), "kbit_dequant_tiled_k4_bf16");
    /// assert_eq!(names::dequant(false, 2, Dtype::F32), "kbit_dequant_flat_k2_f32");
    /// ```
    pub fn dequant(tiled: bool, bits: u32, dtype: Dtype) -> String {
        format!("kbit_dequant_{}_k{bits}_{}", if tiled { "tiled" } else { "flat" }, dtype.name())
    }
    /// `kbit_mma_k{bits}_m{m_blocks}_n{tile_n}_{dtype}` (tensor-core GEMM).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma(4, 2, 128, Dtype::F16), "kbit_mma_k4_m2_n128_f16");
    /// ```
    pub fn mma(bits: u32, m_blocks: u32, tile_n: u32, dtype: Dtype) -> String {
        format!("kbit_mma_k{bits}_m{m_blocks}_n{tile_n}_{}", dtype.name())
    }
    /// `kbit_mma_stream_k{bits}_m{m_blocks}_n128_{dtype}` (stream-K).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_stream(4, 1, Dtype::Bf16), "kbit_mma_stream_k4_m1_n128_bf16");
    /// ```
    pub fn mma_stream(bits: u32, m_blocks: u32, dtype: Dtype) -> String {
        format!("kbit_mma_stream_k{bits}_m{m_blocks}_n128_{}", dtype.name())
    }
    /// `kbit_mma_grouped_k{bits}_m{m_blocks}_n64_{dtype}` (grouped over
    /// MoE experts).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_grouped(3, 1, Dtype::F16), "kbit_mma_grouped_k3_m1_n64_f16");
    /// ```
    pub fn mma_grouped(bits: u32, m_blocks: u32, dtype: Dtype) -> String {
        format!("kbit_mma_grouped_k{bits}_m{m_blocks}_n{}_{}", super::MMA_GROUPED_TILE_N, dtype.name())
    }
    /// Every mma entry point, in the kernel table's order: grid-stride,
    /// stream-K, grouped.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// let all = names::all_mma();
    /// // 64 grid-stride, 12 stream-K and 32 grouped instances.
    /// assert_eq!((all.len(), all[0].as_str()), (108, "kbit_mma_k2_m1_n64_f16"));
    /// assert_eq!(all[64], names::mma_stream(2, 1, Dtype::F16));
    /// ```
    pub fn all_mma() -> Vec<String> {
        let mut v = Vec::new();
        for bits in super::BITS {
            for mb in super::MMA_M_BLOCKS {
                for tn in super::MMA_TILE_N {
                    for d in super::MMA_DTYPES {
                        v.push(mma(bits, mb, tn, d));
                    }
                }
            }
        }
        for (bits, mb) in super::MMA_STREAM {
            for d in super::MMA_DTYPES {
                v.push(mma_stream(bits, mb, d));
            }
        }
        for bits in super::BITS {
            for mb in super::MMA_M_BLOCKS {
                for d in super::MMA_DTYPES {
                    v.push(mma_grouped(bits, mb, d));
                }
            }
        }
        v
    }
    /// `kbit_mma_kslots_k{bits}_n{cols}_{dtype}` (tensor-core GEMM, K-slot
    /// variant, `cols` = 8, 16 or 32 columns per block), or with `grouped`
    /// `kbit_mma_kslots_grouped_…` (the same over MoE experts).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_kslots(4, 16, Dtype::F16, false), "kbit_mma_kslots_k4_n16_f16");
    /// assert_eq!(names::mma_kslots(2, 32, Dtype::Bf16, true), "kbit_mma_kslots_grouped_k2_n32_bf16");
    /// ```
    pub fn mma_kslots(bits: u32, cols: u32, dtype: Dtype, grouped: bool) -> String {
        let kind = if grouped { "_grouped" } else { "" };
        format!("kbit_mma_kslots{kind}_k{bits}_n{cols}_{}", dtype.name())
    }
    /// Every K-slot mma entry point, dense then grouped, in the kernel
    /// table's order.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// let all = names::all_mma_kslots();
    /// assert_eq!((all.len(), all[0].as_str()), (48, "kbit_mma_kslots_k2_n8_f16"));
    /// assert_eq!(all[24], names::mma_kslots(2, 8, Dtype::F16, true));
    /// ```
    pub fn all_mma_kslots() -> Vec<String> {
        let mut v = Vec::new();
        for grouped in [false, true] {
            for bits in super::BITS {
                for nf in super::MMA_KSLOTS_NF {
                    for d in super::MMA_DTYPES {
                        v.push(mma_kslots(bits, kbit_format::mma_kslots::block_cols(nf), d, grouped));
                    }
                }
            }
        }
        v
    }
    /// `kbit_mma_direct_k{bits}_r{rows}_{dtype}` (tensor-core GEMM,
    /// direct-load variant, `rows` = 1, 4, 8 or 16 staged activation rows,
    /// one team of 16 warps per block), `kbit_mma_direct_teams_…` with two.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_direct(4, 1, Dtype::F16, 1), "kbit_mma_direct_k4_r1_f16");
    /// assert_eq!(names::mma_direct(2, 8, Dtype::Bf16, 2), "kbit_mma_direct_teams_k2_r8_bf16");
    /// ```
    pub fn mma_direct(bits: u32, rows: u32, dtype: Dtype, teams: u32) -> String {
        let teams = if teams == 2 { "teams_" } else { "" };
        format!("kbit_mma_direct_{teams}k{bits}_r{rows}_{}", dtype.name())
    }
    /// `kbit_mma_direct_early_k{bits}_r{rows}_{dtype}`: the one-team
    /// direct-load kernel whose warps decode half of their first step
    /// before the release (k ≤ 4, one or four staged rows).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_direct_early(4, 1, Dtype::F16), "kbit_mma_direct_early_k4_r1_f16");
    /// ```
    pub fn mma_direct_early(bits: u32, rows: u32, dtype: Dtype) -> String {
        format!("kbit_mma_direct_early_k{bits}_r{rows}_{}", dtype.name())
    }
    /// `kbit_mma_direct_xreg_k{bits}_r{rows}_{dtype}`: the one-team
    /// direct-load kernel whose warps load their one step's activations
    /// into registers instead of staging them (K ≤ 2048; sm_90 module).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::mma_direct_xreg(4, 8, Dtype::Bf16), "kbit_mma_direct_xreg_k4_r8_bf16");
    /// ```
    pub fn mma_direct_xreg(bits: u32, rows: u32, dtype: Dtype) -> String {
        format!("kbit_mma_direct_xreg_k{bits}_r{rows}_{}", dtype.name())
    }
    /// Every direct-load mma entry point of the common module, in the kernel
    /// table's order: one team at every k, then two teams at k ≤ 4, then the
    /// early-decode instances, then one team with sixteen rows.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// let all = names::all_mma_direct();
    /// assert_eq!((all.len(), all[0].as_str()), (62, "kbit_mma_direct_k2_r1_f16"));
    /// assert_eq!(all[42], names::mma_direct_early(2, 1, Dtype::F16));
    /// assert_eq!(all[54], names::mma_direct(2, 16, Dtype::F16, 1));
    /// assert_eq!(all[3], names::mma_direct(2, 4, Dtype::Bf16, 1));
    /// assert_eq!(all[24], names::mma_direct(2, 1, Dtype::F16, 2));
    /// ```
    pub fn all_mma_direct() -> Vec<String> {
        let mut v = direct_run(&super::BITS, &super::MMA_DIRECT_ROWS, |b, r, d| mma_direct(b, r, d, 1));
        v.extend(direct_run(&super::MMA_DIRECT_TEAM_BITS, &super::MMA_DIRECT_ROWS, |b, r, d| mma_direct(b, r, d, 2)));
        v.extend(direct_run(&super::MMA_DIRECT_TEAM_BITS, &super::MMA_DIRECT_EARLY_ROWS, mma_direct_early));
        v.extend(direct_run(&super::BITS, &super::MMA_DIRECT_WIDE_ROWS, |b, r, d| mma_direct(b, r, d, 1)));
        v
    }
    /// The direct-load entry points with the activations in registers (the
    /// sm_90 module's), in their table's order.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// let all = names::all_mma_direct_xreg();
    /// assert_eq!((all.len(), all[3].as_str()), (12, "kbit_mma_direct_xreg_k2_r8_bf16"));
    /// ```
    pub fn all_mma_direct_xreg() -> Vec<String> {
        direct_run(&super::MMA_DIRECT_XREG_BITS, &super::MMA_DIRECT_XREG_ROWS, mma_direct_xreg)
    }
    /// `name` of every (bits, rows, dtype) in `all_bits` × `all_rows` ×
    /// [`MMA_DTYPES`](super::MMA_DTYPES), in that order (the order
    /// `direct_index` gives positions in).
    fn direct_run(all_bits: &[u32], all_rows: &[u32], name: impl Fn(u32, u32, Dtype) -> String) -> Vec<String> {
        let mut v = Vec::new();
        for &bits in all_bits {
            for &r in all_rows {
                for d in super::MMA_DTYPES {
                    v.push(name(bits, r, d));
                }
            }
        }
        v
    }
    /// `kbit_selftest_mma_{f16|bf16}`.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::selftest_mma(Dtype::Bf16), "kbit_selftest_mma_bf16");
    /// ```
    pub fn selftest_mma(dtype: Dtype) -> String {
        format!("kbit_selftest_mma_{}", dtype.name())
    }
    /// `kbit_grouped_dequant_k{bits}_{dtype}` (f16, bf16).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::grouped_dequant(5, Dtype::F16), "kbit_grouped_dequant_k5_f16");
    /// ```
    pub fn grouped_dequant(bits: u32, dtype: Dtype) -> String {
        format!("kbit_grouped_dequant_k{bits}_{}", dtype.name())
    }
    /// `kbit_moe_gather_b16` / `kbit_moe_scatter_b16`.
    ///
    /// ```
    /// use kbit::module::names::moe_rows;
    /// assert_eq!(moe_rows(false), "kbit_moe_gather_b16");
    /// assert_eq!(moe_rows(true), "kbit_moe_scatter_b16");
    /// ```
    pub fn moe_rows(scatter: bool) -> String {
        format!("kbit_moe_{}_b16", if scatter { "scatter" } else { "gather" })
    }
    /// `kbit_gemv_m{m}_k{bits}_{dtype}` (scalar GEMV, block variant),
    /// `kbit_gemv_slots_m…` (column-slot variant), and their MoE forms
    /// `kbit_grouped_gemv_[slots_]m{max_m}_k{bits}_{dtype}`.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::gemv(false, false, 1, 4, Dtype::F16), "kbit_gemv_m1_k4_f16");
    /// assert_eq!(names::gemv(true, true, 3, 2, Dtype::Bf16), "kbit_grouped_gemv_slots_m3_k2_bf16");
    /// ```
    pub fn gemv(grouped: bool, slots: bool, m: usize, bits: u32, dtype: Dtype) -> String {
        format!(
            "kbit_{}gemv_{}m{m}_k{bits}_{}",
            if grouped { "grouped_" } else { "" },
            if slots { "slots_" } else { "" },
            dtype.name()
        )
    }
    /// `kbit_gemv_teams_m{m}_k{bits}_{dtype}`: the block variant with two
    /// teams per block (dense, m ≤ 2).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::gemv_teams(2, 4, Dtype::F16), "kbit_gemv_teams_m2_k4_f16");
    /// ```
    pub fn gemv_teams(m: usize, bits: u32, dtype: Dtype) -> String {
        format!("kbit_gemv_teams_m{m}_k{bits}_{}", dtype.name())
    }
    /// `kbit_grouped_gemv_pairs_m{max_m}_k{bits}_{dtype}`: the grouped
    /// column-slot variant with two column groups per block.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::gemv_pairs(4, 3, Dtype::Bf16), "kbit_grouped_gemv_pairs_m4_k3_bf16");
    /// ```
    pub fn gemv_pairs(m: usize, bits: u32, dtype: Dtype) -> String {
        format!("kbit_grouped_gemv_pairs_m{m}_k{bits}_{}", dtype.name())
    }
    /// `kbit_gemv_half_m{m}_k2_{dtype}`: the block variant on 16-column
    /// groups, which runs the last round of column blocks of a dense k = 2
    /// call of two rows as a second launch, half a column block per block
    /// (`kbit_format::gemv::splits_last_round`).
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::gemv_half(2, Dtype::Bf16), "kbit_gemv_half_m2_k2_bf16");
    /// ```
    pub fn gemv_half(m: usize, dtype: Dtype) -> String {
        format!("kbit_gemv_half_m{m}_k2_{}", dtype.name())
    }
    /// Every GEMV entry point, in the kernel table's order: the four
    /// families of [`gemv`], then the two-team instances, the pairs
    /// instances and the half instances.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// let all = names::all_gemv();
    /// // 4 families × M 1..=4 × 4 widths × 2 dtypes, 16 two-team, 32 pairs
    /// // and 2 half instances.
    /// assert_eq!((all.len(), all[0].as_str()), (178, "kbit_gemv_m1_k2_f16"));
    /// assert_eq!(all[175], names::gemv_pairs(4, 5, Dtype::Bf16));
    /// assert_eq!(all[177], names::gemv_half(2, Dtype::Bf16));
    /// ```
    pub fn all_gemv() -> Vec<String> {
        let mut v = Vec::new();
        for slots in [false, true] {
            for grouped in [false, true] {
                for m in 1..=crate::gemv::GEMV_MAX_M {
                    for bits in super::BITS {
                        for d in crate::gemv::GEMV_DTYPES {
                            v.push(gemv(grouped, slots, m, bits, d));
                        }
                    }
                }
            }
        }
        for m in 1..=crate::gemv::TEAMS_MAX_M {
            for bits in super::BITS {
                for d in crate::gemv::GEMV_DTYPES {
                    v.push(gemv_teams(m, bits, d));
                }
            }
        }
        for m in 1..=crate::gemv::GEMV_MAX_M {
            for bits in super::BITS {
                for d in crate::gemv::GEMV_DTYPES {
                    v.push(gemv_pairs(m, bits, d));
                }
            }
        }
        for d in crate::gemv::GEMV_DTYPES {
            v.push(gemv_half(2, d));
        }
        v
    }
    /// `kbit_wgmma_k{bits}_{dtype}` (128 activation rows per block, `h =
    /// 1`) or `kbit_wgmma_m256_k{bits}_{dtype}` (256, `h = 2`): the
    /// warpgroup tensor-core GEMM of the sm_90a module.
    ///
    /// ```
    /// use kbit::{Dtype, module::names};
    /// assert_eq!(names::wgmma(4, Dtype::F16, 1), "kbit_wgmma_k4_f16");
    /// assert_eq!(names::wgmma(4, Dtype::Bf16, 2), "kbit_wgmma_m256_k4_bf16");
    /// ```
    pub fn wgmma(bits: u32, dtype: Dtype, h: u32) -> String {
        let rows = if h == 2 { "m256_" } else { "" };
        format!("kbit_wgmma_{rows}k{bits}_{}", dtype.name())
    }
    /// Every entry point of [`PTX_SM90A_ENTRIES`](super::PTX_SM90A_ENTRIES),
    /// in the kernel table's order (h, then bits, then dtype).
    ///
    /// ```
    /// use kbit::module::names;
    /// let all = names::all_wgmma();
    /// assert_eq!((all.len(), all[0].as_str(), all[8].as_str()), (16, "kbit_wgmma_k2_f16", "kbit_wgmma_m256_k2_f16"));
    /// ```
    pub fn all_wgmma() -> Vec<String> {
        let mut v = Vec::new();
        for h in [1, 2] {
            for bits in super::BITS {
                for d in super::MMA_DTYPES {
                    v.push(wgmma(bits, d, h));
                }
            }
        }
        v
    }
    /// Every entry point the host expects in [`PTX`](super::PTX).
    ///
    /// ```
    /// use kbit::module::names;
    /// let all = names::all();
    /// assert_eq!((all.len(), all[0].as_str()), (448, "kbit_repack_k2"));
    /// assert_eq!(all.iter().collect::<std::collections::HashSet<_>>().len(), all.len());
    /// assert!(!all.iter().any(|n| n.starts_with("kbit_wgmma_"))); // those are in the sm_90a module
    /// ```
    pub fn all() -> Vec<String> {
        let mut v = Vec::new();
        for bits in super::BITS {
            v.push(repack(bits));
            for d in super::DTYPES {
                v.push(quantize(bits, d));
                v.push(dequant(false, bits, d));
                v.push(dequant(true, bits, d));
            }
        }
        for bits in super::BITS {
            v.push(grouped_dequant(bits, Dtype::F16));
            v.push(grouped_dequant(bits, Dtype::Bf16));
        }
        v.push(moe_rows(false));
        v.push(moe_rows(true));
        v.push(selftest_mma(Dtype::F16));
        v.push(selftest_mma(Dtype::Bf16));
        v.extend(all_mma());
        v.extend(all_mma_kslots());
        v.extend(all_mma_direct());
        v.extend(all_gemv());
        v
    }
}

/// A grid-stride dequantize kernel launched with [`GRID_STRIDE_THREADS`]
/// threads and [`CODEBOOK_SMEM`] bytes of shared memory per block, with the
/// blocks of that launch that fit on one SM (from the driver's occupancy
/// calculator, so register counts are never assumed).
pub(crate) struct Streaming {
    pub f: CudaFunction,
    pub per_sm: u32,
}

/// Threads per block of every grid-stride launch, [`Streaming`] kernels
/// included.
pub(crate) const GRID_STRIDE_THREADS: u32 = 256;
/// Dynamic shared memory of the kernels that stage the codebook
/// (quantize, dequantize): 2^5 f32 at most.
pub(crate) const CODEBOOK_SMEM: u32 = 128;

impl Streaming {
    fn new(f: CudaFunction) -> Result<Self> {
        let per_sm =
            f.occupancy_max_active_blocks_per_multiprocessor(GRID_STRIDE_THREADS, CODEBOOK_SMEM as usize, None)?.max(1);
        Ok(Self { f, per_sm })
    }
}

/// Every kernel function, looked up once so that calls do no string work.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    quantize: Vec<CudaFunction>,
    repack: Vec<CudaFunction>,
    dequant: Vec<Streaming>,
    pub selftest_mma: [CudaFunction; 2],
    /// Expert row gather (0) and scatter (1) for the batched cuBLAS MoE path.
    pub moe_rows: [CudaFunction; 2],
    /// Grouped tiled dequantize, `[bits - 2][f16, bf16]`.
    pub grouped_dequant: [[Streaming; 2]; 4],
    /// Tensor-core GEMM instances, indexed by [`mma_slot`] and
    /// [`mma_grouped_slot`].
    pub mma: Vec<CudaFunction>,
    /// K-slot tensor-core GEMM instances (dense and grouped), indexed by
    /// [`mma_kslots_slot`], with the blocks of each that its registers let
    /// an SM hold.
    pub mma_kslots: Vec<(CudaFunction, u32)>,
    /// Direct-load tensor-core GEMM instances (one and two teams), indexed
    /// by [`mma_direct_slot`], with the blocks of each that its registers
    /// let an SM hold.
    pub mma_direct: Vec<(CudaFunction, u32)>,
    /// Direct-load instances with the activations in registers, indexed by
    /// [`mma_direct_xreg_slot`], with their blocks per SM; empty but on
    /// sm_90 (their entries are in its module only).
    pub mma_direct_xreg: Vec<(CudaFunction, u32)>,
    /// Scalar GEMV instances (dense and grouped).
    pub gemv: crate::gemv::GemvKernels,
    /// Warpgroup tensor-core GEMM instances (sm_90 only), in
    /// [`names::all_wgmma`] order, with the blocks of each that fit an SM
    /// and the blocks of a launch resident at once by cluster size; empty
    /// elsewhere.
    pub wgmma: Vec<(CudaFunction, u32, Slots)>,
}

/// The blocks of `f` (`threads` threads, `smem` bytes of dynamic shared
/// memory) resident at once by cluster size, from the driver; `single`
/// without clusters.
fn cluster_slots(f: &CudaFunction, threads: u32, smem: u32, single: u32) -> Result<Slots> {
    use cudarc::driver::sys;
    let mut slots = [single; kbit_format::wgmma::MAX_SPLITS as usize + 1];
    for (s, slot) in slots.iter_mut().enumerate().skip(2) {
        let mut attr = crate::launch::cluster_attribute(s as u32);
        let config = sys::CUlaunchConfig {
            gridDimX: s as u32,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: std::ptr::null_mut(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut clusters = 0;
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &config) }.result()?;
        *slot = clusters.max(0) as u32 * s as u32;
    }
    Ok(Slots(slots))
}

fn bits_slot(bits: u32) -> usize {
    (bits - 2) as usize
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Self> {
        let module = ctx.load_module(Ptx::from_src(ptx_for(cc)))?;
        let get = |name: String| module.load_function(&name).map_err(|_| Error::MissingKernel(name));
        let mut quantize = Vec::new();
        let mut repack = Vec::new();
        let mut dequant = Vec::new();
        for bits in BITS {
            repack.push(get(names::repack(bits))?);
            for d in DTYPES {
                quantize.push(get(names::quantize(bits, d))?);
            }
            for tiled in [false, true] {
                for d in DTYPES {
                    dequant.push(Streaming::new(get(names::dequant(tiled, bits, d))?)?);
                }
            }
        }
        let selftest_mma = [get(names::selftest_mma(Dtype::F16))?, get(names::selftest_mma(Dtype::Bf16))?];
        let moe_rows = [get(names::moe_rows(false))?, get(names::moe_rows(true))?];
        let gd = |bits| -> Result<[Streaming; 2]> {
            let one = |d| Streaming::new(get(names::grouped_dequant(bits, d))?);
            Ok([one(Dtype::F16)?, one(Dtype::Bf16)?])
        };
        let grouped_dequant = [gd(2)?, gd(3)?, gd(4)?, gd(5)?];
        let mma = names::all_mma().into_iter().map(get).collect::<Result<Vec<_>>>()?;
        use cudarc::driver::sys::CUfunction_attribute as FnAttr;
        let max_smem = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let mut mma_kslots = Vec::new();
        {
            for name in names::all_mma_kslots() {
                let f = get(name)?;
                // Any size up to the device's limit: the ring depth and a
                // programmatic launch decide how much a launch asks for.
                f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_smem)?;
                // Blocks per SM as registers allow; the plan adds shared memory.
                let threads = kbit_format::mma_kslots::THREADS;
                let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
                mma_kslots.push((f, per_sm));
            }
        }
        let (mut mma_direct, mut mma_direct_xreg) = (Vec::new(), Vec::new());
        let xreg = if has_wgmma(cc) { names::all_mma_direct_xreg() } else { Vec::new() };
        for name in names::all_mma_direct().into_iter().chain(xreg) {
            let threads =
                if name.starts_with("kbit_mma_direct_teams_") { 2 } else { 1 } * kbit_format::mma_direct::THREADS;
            let in_registers = name.starts_with("kbit_mma_direct_xreg_");
            let f = get(name)?;
            // The activations staged in shared memory grow with K: any
            // size up to the device's limit.
            f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_smem)?;
            let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
            if in_registers { &mut mma_direct_xreg } else { &mut mma_direct }.push((f, per_sm));
        }
        let gemv = crate::gemv::GemvKernels::load(ctx, &module)?;
        let mut wgmma = Vec::new();
        if has_wgmma(cc) {
            let sms =
                ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let sms = sms.max(1) as u32;
            for (i, name) in names::all_wgmma().into_iter().enumerate() {
                let f = get(name)?;
                let per_h = BITS.len() * MMA_DTYPES.len();
                let (h, bits) = ((i / per_h) as u32 + 1, BITS[i % per_h / MMA_DTYPES.len()]);
                let smem = kbit_format::wgmma::smem_bytes(bits, h);
                // Any size up to the device's limit: a programmatic launch
                // may ask for more than it uses (Context::programmatic_now).
                f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_smem)?;
                let threads = kbit_format::wgmma::THREADS;
                let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)?;
                let slots = cluster_slots(&f, threads, smem, per_sm.max(1) * sms)?;
                wgmma.push((f, per_sm.max(1), slots));
            }
        }
        Ok(Self {
            _module: module,
            quantize,
            repack,
            dequant,
            selftest_mma,
            moe_rows,
            grouped_dequant,
            mma,
            mma_kslots,
            mma_direct,
            mma_direct_xreg,
            gemv,
            wgmma,
        })
    }

    pub fn quantize(&self, bits: u32, dtype: Dtype) -> &CudaFunction {
        &self.quantize[bits_slot(bits) * 3 + dtype.slot()]
    }
    pub fn repack(&self, bits: u32) -> &CudaFunction {
        &self.repack[bits_slot(bits)]
    }
    pub fn dequant(&self, layout: LayoutKind, bits: u32, dtype: Dtype) -> &Streaming {
        let l = (layout == LayoutKind::Tiled) as usize;
        &self.dequant[(bits_slot(bits) * 2 + l) * 3 + dtype.slot()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_slots_follow_the_name_tables() {
        let (all, xreg) = (names::all_mma_direct(), names::all_mma_direct_xreg());
        let (mut found, mut found_xreg) = (0, 0);
        for bits in BITS {
            for rows in MMA_DIRECT_ROWS.into_iter().chain(MMA_DIRECT_WIDE_ROWS) {
                for dtype in DTYPES {
                    for teams in [1, 2] {
                        if let Some(i) = mma_direct_slot(bits, rows, dtype, teams) {
                            assert_eq!(all[i], names::mma_direct(bits, rows, dtype, teams));
                            found += 1;
                        }
                    }
                    if let Some(i) = mma_direct_early_slot(bits, rows, dtype) {
                        assert_eq!(all[i], names::mma_direct_early(bits, rows, dtype));
                        found += 1;
                    }
                    if let Some(i) = mma_direct_xreg_slot(bits, rows, dtype) {
                        assert_eq!(xreg[i], names::mma_direct_xreg(bits, rows, dtype));
                        found_xreg += 1;
                    }
                }
            }
        }
        assert_eq!((found, found_xreg), (all.len(), xreg.len()));
    }
}
