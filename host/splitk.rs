//! Split-K and persistent-grid planning for the tensor-core GEMM (kernel 2).
//!
//! A pure function of the shape, the tile configuration and the SM count,
//! so that it is tested without a GPU (for 132 and 128 SMs among others).
//!
//! The output is cut into `n_tiles = ceil(N / TILE_N)` column tiles (all M
//! rows in one tile), K into `k_tiles = ceil(K / 64)` tiles. Each column
//! tile is split along K into `splits` ranges of `tiles_per_split` K tiles;
//! the last may be shorter but never empty: a requested split count `s` is
//! normalized to `tiles_per_split = ceil(k_tiles / s)`,
//! `splits = ceil(k_tiles / tiles_per_split)` (the reference's defect was to
//! launch `s` splits, leaving trailing ones empty on GPUs with many SMs).
//! Work item `i` is (n tile `i / splits`, split `i % splits`); a persistent
//! grid of `min(items, SMs × blocks per SM)` blocks takes items `b, b + grid,
//! …`. With `splits > 1` each item writes an f32 partial tile to its own
//! workspace slot (`slot_f32` floats) and one arrival counter per n tile
//! elects the block that reduces.

use crate::{Error, Result};
use kbit_format::mma as geo;
use kbit_format::tile::TILE_K;
use std::ops::Range;

/// How many K splits to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Splits {
    /// Chosen by the cost model ([`plan`]) to fill the GPU.
    #[default]
    Auto,
    /// At most this many (normalized so that none is empty, capped at one K
    /// tile per split); an error if the workspace cannot hold them.
    Fixed(u32),
    /// As many as the K tiles and the workspace allow.
    Max,
}

/// A kernel instance and how it runs on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// m16 blocks per tile (1..=4): the tile covers `16 · m_blocks` rows ≥ M.
    pub m_blocks: u32,
    /// Output columns per tile: 64 or 128.
    pub tile_n: u32,
    /// Pipeline stages (2..=[`geo::MAX_STAGES`]).
    pub stages: u32,
    /// Resident blocks per SM at this configuration's shared memory.
    pub blocks_per_sm: u32,
}

/// Capacity of the split-K workspace that a [`crate::Context`] owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// f32 values of the partial-tile workspace.
    pub workspace_f32: usize,
    /// u32 arrival counters (one per n tile when `splits > 1`).
    pub counters: usize,
}

/// A complete launch plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Rows M.
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K.
    pub k: u32,
    /// The kernel instance and its pipeline.
    pub tile: TileConfig,
    /// `ceil(N / tile_n)`.
    pub n_tiles: u32,
    /// `ceil(K / 64)`.
    pub k_tiles: u32,
    /// K splits per n tile (every one non-empty).
    pub splits: u32,
    /// K tiles per split (the last split may have fewer, never 0).
    pub tiles_per_split: u32,
    /// `n_tiles · splits`.
    pub items: u32,
    /// Persistent grid: `min(items, SMs · blocks_per_sm)`.
    pub grid: u32,
    /// f32 workspace values the launch uses (0 with one split).
    pub workspace_f32: usize,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

impl Plan {
    /// K tiles of split `s`.
    pub fn split_range(&self, s: u32) -> Range<u32> {
        let start = s * self.tiles_per_split;
        start..(start + self.tiles_per_split).min(self.k_tiles)
    }

    /// (n tile, split) of work item `i`, as the kernel decodes it.
    pub fn item(&self, i: u32) -> (u32, u32) {
        (i / self.splits, i % self.splits)
    }

    /// Work items of block `b` of the persistent grid.
    pub fn block_items(&self, b: u32) -> impl Iterator<Item = u32> + use<> {
        (b..self.items).step_by(self.grid.max(1) as usize)
    }

    /// Columns of n tile `t`.
    pub fn tile_columns(&self, t: u32) -> Range<u32> {
        let start = t * self.tile.tile_n;
        start..(start + self.tile.tile_n).min(self.n)
    }
}

/// `(splits, tiles_per_split)` for a requested split count: every split
/// non-empty, at least one.
pub fn normalize_splits(k_tiles: u32, requested: u32) -> (u32, u32) {
    let s = requested.clamp(1, k_tiles.max(1));
    let tps = k_tiles.div_ceil(s).max(1);
    (k_tiles.div_ceil(tps).max(1), tps)
}

/// Estimated duration of a plan in K-tile loads of one SM (cost model of
/// [`Splits::Auto`]): the busiest SM streams `ceil(items / SMs)` items of up
/// to `tiles_per_split` tiles; with split-K every partial is written and read
/// once more through L2 (one slot ≈ `8·m_blocks / (6·bits)` tile loads at
/// L2's ~6× per-SM bandwidth, i.e. `4·m_blocks / (3·bits)`), plus a fixed
/// cost for the fence, counter and reduction latency.
pub fn cost(n_tiles: u32, k_tiles: u32, splits: u32, sm_count: u32, m_blocks: u32, bits: u32) -> f64 {
    let (splits, tps) = normalize_splits(k_tiles, splits);
    let items = n_tiles as u64 * splits as u64;
    let waves = items.div_ceil(sm_count.max(1) as u64);
    let stream = (waves * tps as u64) as f64;
    if splits == 1 {
        return stream;
    }
    let per_split = 4.0 * m_blocks as f64 / (3.0 * bits as f64);
    stream + splits as f64 * per_split + SPLIT_FIXED_COST
}

/// Fixed latency of a split-K reduction, in K-tile loads.
const SPLIT_FIXED_COST: f64 = 2.0;

/// Most splits [`Splits::Auto`] considers.
const AUTO_MAX_SPLITS: u32 = 64;

/// Plans `y[m, n] = x[m, k] · Wᵀ` with `bits`-bit weights on `sm_count` SMs.
///
/// # Errors
/// [`Error::Rows`] for M outside `1..=16·m_blocks` (or `m_blocks` outside
/// 1..=4), [`Error::OutFeatures`] / [`Error::InFeatures`] for bad N / K,
/// [`Error::SplitK`] for a zero SM count, `Fixed(0)`, a bad tile
/// configuration, or a fixed split count the workspace cannot hold.
#[allow(clippy::too_many_arguments)] // the problem's dimensions, spelled out
pub fn plan(
    m: usize,
    n: usize,
    k: usize,
    bits: u32,
    sm_count: u32,
    tile: TileConfig,
    splits: Splits,
    limits: Limits,
) -> Result<Plan> {
    let max_m = 16 * tile.m_blocks as usize;
    if !(1..=4).contains(&tile.m_blocks) || m == 0 || m > max_m {
        return Err(Error::Rows { m, max: max_m.min(geo::MAX_M as usize) });
    }
    if n == 0 {
        return Err(Error::OutFeatures);
    }
    if k == 0 || k % 32 != 0 || k > u32::MAX as usize || n > u32::MAX as usize {
        return Err(Error::InFeatures(k));
    }
    let bad =
        |what: &'static str, value: usize, reason: &str| Err(Error::SplitK { what, value, reason: reason.into() });
    if sm_count == 0 {
        return bad("sm_count", 0, "at least one SM is needed");
    }
    if tile.tile_n != 64 && tile.tile_n != 128 {
        return bad("tile_n", tile.tile_n as usize, "the kernels exist for 64 and 128");
    }
    if !(geo::MIN_STAGES..=geo::MAX_STAGES).contains(&tile.stages) || tile.blocks_per_sm == 0 {
        return bad("stages", tile.stages as usize, "outside the kernel's range, or no resident block");
    }
    let n_tiles = n.div_ceil(tile.tile_n as usize) as u32;
    let k_tiles = k.div_ceil(TILE_K) as u32;
    let slot = geo::slot_f32(tile.m_blocks, tile.tile_n / 32) as usize;
    // Most splits the workspace (and the counters) can hold for this shape.
    let ws_max = if n_tiles as usize > limits.counters {
        1
    } else {
        (limits.workspace_f32 / (n_tiles as usize * slot)).clamp(1, u32::MAX as usize) as u32
    };
    let fits = |s: u32| s == 1 || s <= ws_max;
    let (s, tps) = match splits {
        Splits::Fixed(0) => return bad("splits", 0, "at least one split is needed"),
        Splits::Fixed(r) => {
            let (s, tps) = normalize_splits(k_tiles, r);
            if !fits(s) {
                return Err(Error::SplitK {
                    what: "splits",
                    value: r as usize,
                    reason: format!(
                        "{s} splits of {n_tiles} tiles need {} f32 of workspace, the context has {} (and {} counters)",
                        s as usize * n_tiles as usize * slot,
                        limits.workspace_f32,
                        limits.counters
                    ),
                });
            }
            (s, tps)
        }
        Splits::Max => normalize_splits(k_tiles, ws_max),
        Splits::Auto => {
            let mut best = (f64::INFINITY, 1, k_tiles);
            for r in 1..=k_tiles.min(AUTO_MAX_SPLITS).min(ws_max) {
                let (s, tps) = normalize_splits(k_tiles, r);
                if s != r {
                    continue; // same plan as a smaller request
                }
                let c = cost(n_tiles, k_tiles, s, sm_count, tile.m_blocks, bits);
                if c < best.0 {
                    best = (c, s, tps);
                }
            }
            (best.1, best.2)
        }
    };
    let items = n_tiles as u64 * s as u64;
    if items > u32::MAX as u64 / 2 {
        return bad("n", n, "too many column tiles for one launch");
    }
    let items = items as u32;
    let slots = sm_count as u64 * tile.blocks_per_sm as u64;
    Ok(Plan {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        tile,
        n_tiles,
        k_tiles,
        splits: s,
        tiles_per_split: tps,
        items,
        grid: slots.min(items as u64) as u32,
        workspace_f32: if s > 1 { items as usize * slot } else { 0 },
        smem_bytes: geo::smem_bytes(tile.m_blocks, tile.tile_n / 32, bits, tile.stages),
    })
}

/// Chooses `(stages, blocks per SM)` for a kernel instance from the device's
/// shared memory: two resident blocks per SM when that leaves at least 4
/// stages each (more warps to hide lookup and mma latency, 6+ tiles in
/// flight per SM), else one block with as many stages as fit (at least 2);
/// `None` if even 2 stages do not fit. `reserved` is the driver's per-block
/// reservation (1 KiB on sm_80+).
pub fn stages_for(
    bits: u32,
    m_blocks: u32,
    tile_n: u32,
    smem_per_block: usize,
    smem_per_sm: usize,
    reserved: usize,
) -> Option<(u32, u32)> {
    let nf = tile_n / 32;
    let fixed = geo::stages_offset(m_blocks, nf, bits) as usize;
    let stage = geo::stage_bytes(m_blocks, nf, bits) as usize;
    for (blocks, min_stages) in [(2usize, 4usize), (1, geo::MIN_STAGES as usize)] {
        let budget = smem_per_block.min((smem_per_sm / blocks).saturating_sub(reserved));
        let stages = budget.saturating_sub(fixed) / stage;
        if budget >= fixed && stages >= min_stages {
            return Some((stages.min(geo::MAX_STAGES as usize) as u32, blocks as u32));
        }
    }
    None
}
