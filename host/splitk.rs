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
//!
//! Stream-K ([`Splits::Stream`]): the T = n_tiles × k_tiles (n tile, K
//! tile) iterations, in that order, are cut into `grid` contiguous ranges
//! of `P = tiles_per_split` (the last shorter), one per block, so that no
//! SM gets more than its share when the n tiles do not divide evenly over
//! the resident blocks. A block's range falls into one or more n tiles;
//! the piece of block b in n tile t writes slot `t + b` (unique, in (t, b)
//! order: `items = n_tiles + grid` slots), and the blocks of tile t
//! ([`Plan::tile_blocks`]) add up in block order.
//!
//! Pipeline shape: an instance owns `tile_slots` K-tile slots of shared
//! memory per block ([`slots_for`]); each launch splits them into `stages`
//! stages of `stage_tiles` (KT) K tiles ([`stage_shape`]): KT·TILE_N = 256
//! (64 weights per thread between barriers) when that leaves at least 3
//! stages and an item has that many tiles, else smaller; 512 in at least
//! 2 stages for the instances with wide stages ([`geo::wide_stages`]). An item's last
//! stage may be partial (`tiles_per_split` need not be a multiple of KT).

use crate::{Error, Result};
use kbit_format::mma as geo;
use kbit_format::tile::TILE_K;
use std::ops::Range;

/// How many K splits to use.
///
/// ```
/// use kbit::splitk::{Limits, Splits, TileConfig, plan};
/// let tile = TileConfig { m_blocks: 1, tile_n: 128, tile_slots: 16, blocks_per_sm: 1 };
/// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
/// // 16 × 4096 at M = 16 on 132 SMs: 32 n tiles of 64 K tiles each.
/// let one = plan(16, 4096, 4096, 4, 132, tile, Splits::Fixed(1), limits)?;
/// let most = plan(16, 4096, 4096, 4, 132, tile, Splits::Max, limits)?;
/// assert_eq!((one.splits, one.items), (1, 32));
/// assert!(most.splits > 1 && most.splits <= 64 && most.tiles_per_split * most.splits >= 64);
/// # Ok::<(), kbit::Error>(())
/// ```
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
    /// Stream-K: every block an equal contiguous share of all (n tile, K
    /// tile) iterations; an error if the workspace cannot hold a slot per
    /// n tile and block.
    Stream,
}

/// A kernel instance and how it runs on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// m16 blocks per tile (1..=4): the tile covers `16 · m_blocks` rows ≥ M.
    pub m_blocks: u32,
    /// Output columns per tile: 64 or 128.
    pub tile_n: u32,
    /// K-tile slots of pipeline stages that fit the instance's shared memory
    /// (2..=[`geo::MAX_TILE_SLOTS`]): a launch uses `stages · stage_tiles`
    /// of them at most.
    pub tile_slots: u32,
    /// Resident blocks per SM at this configuration's shared memory.
    pub blocks_per_sm: u32,
}

impl TileConfig {
    /// Whether this instance runs wide stages ([`geo::wide_stages`]).
    ///
    /// ```
    /// use kbit::splitk::TileConfig;
    /// let tile = TileConfig { m_blocks: 1, tile_n: 128, tile_slots: 11, blocks_per_sm: 2 };
    /// assert!(tile.wide_stages());
    /// assert!(!TileConfig { tile_n: 64, ..tile }.wide_stages() && !TileConfig { m_blocks: 3, ..tile }.wide_stages());
    /// ```
    pub fn wide_stages(&self) -> bool {
        geo::wide_stages(self.m_blocks, self.tile_n / 32)
    }
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
///
/// ```
/// use kbit::splitk::{Limits, Splits, TileConfig, plan};
/// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 2 };
/// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
/// let p = plan(5, 2048, 5120, 4, 132, tile, Splits::Auto, limits)?;
/// assert_eq!((p.n_tiles, p.k_tiles), (32, 80)); // 2048 / 64 columns, 5120 / 64
/// assert_eq!(p.items, p.n_tiles * p.splits); // (not stream-K here)
/// assert!(!p.stream && p.grid >= 1);
/// # Ok::<(), kbit::Error>(())
/// ```
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
    /// K splits per n tile (every one non-empty; 1 with stream-K).
    pub splits: u32,
    /// K tiles per split (the last split may have fewer, never 0); with
    /// stream-K the iterations per block, P.
    pub tiles_per_split: u32,
    /// `n_tiles · splits`; with stream-K `n_tiles + grid` (workspace slots).
    pub items: u32,
    /// Stream-K (see the module docs).
    pub stream: bool,
    /// The K-slot variant (`kbit_mma_kslots_*`): blocks of `tile.tile_n` =
    /// 8, 16 or 32 columns and all of K, split over their 8 warps, one block
    /// per n tile; no split-K, no pipeline stages, no workspace.
    pub k_slots: bool,
    /// The direct-load variant (`kbit_mma_direct_*`, M ≤ 8): blocks of 16
    /// warps walk groups of `tile.tile_n` = 16 columns (`n_tiles` of them,
    /// `grid` blocks) and split every group's K over their warps; each
    /// lane loads its weights straight into registers one 128-wide step
    /// ahead (`stages` = 1, `stage_tiles` = 2). No split-K, no workspace.
    pub direct: bool,
    /// Teams of 16 warps per block of the direct-load variant: 2 where two
    /// teams share one block's table and staged activations, else 1 (and 1
    /// in every other plan).
    pub teams: u32,
    /// Direct-load variant, one team: the warps decode half of their first
    /// step before the grid-dependency wait (`kbit_mma_direct_early_*`).
    pub early_decode: bool,
    /// Direct-load variant, one team, K ≤ 2048 (sm_90, k ≤ 4, M = 2..8):
    /// each warp loads its one step's activations into registers after the
    /// grid-dependency wait instead of the block staging them
    /// (`kbit_mma_direct_xreg_*`).
    pub x_registers: bool,
    /// Persistent grid: `min(items, SMs · blocks_per_sm)`.
    pub grid: u32,
    /// Pipeline stages (2..=[`geo::MAX_STAGES`]).
    pub stages: u32,
    /// K tiles per stage, KT (1..=[`geo::MAX_STAGE_TILES`]).
    pub stage_tiles: u32,
    /// f32 workspace values the launch uses (0 with one split).
    pub workspace_f32: usize,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

impl Plan {
    /// K tiles of split `s`.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// assert_eq!((p.split_range(0), p.split_range(2)), (0..11, 22..33));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn split_range(&self, s: u32) -> Range<u32> {
        let start = s * self.tiles_per_split;
        start..(start + self.tiles_per_split).min(self.k_tiles)
    }

    /// (n tile, split) of work item `i`, as the kernel decodes it.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// assert_eq!((p.item(0), p.item(7), p.item(11)), ((0, 0), (2, 1), (3, 2)));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn item(&self, i: u32) -> (u32, u32) {
        (i / self.splits, i % self.splits)
    }

    /// Work items of block `b` of the persistent grid.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// assert_eq!((p.items, p.grid), (12, 4));
    /// assert_eq!(p.block_items(1).collect::<Vec<_>>(), [1, 5, 9]);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn block_items(&self, b: u32) -> impl Iterator<Item = u32> + use<> {
        (b..self.items).step_by(self.grid.max(1) as usize)
    }

    /// Stream-K: the blocks whose ranges cover part of n tile `t` (its
    /// pieces, in reduction order).
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 192, 640, 4, 4, tile, Splits::Stream, limits)?; // 3 × 10 tiles in 8, 8, 8, 6
    /// assert_eq!((p.tile_blocks(0), p.tile_blocks(1), p.tile_blocks(2)), (0..=1, 1..=2, 2..=3));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tile_blocks(&self, t: u32) -> std::ops::RangeInclusive<u32> {
        let p = self.tiles_per_split.max(1);
        (t * self.k_tiles / p)..=(((t + 1) * self.k_tiles - 1) / p)
    }

    /// Stream-K: block `b`'s pieces, as (n tile, K-tile range), in order.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 192, 640, 4, 4, tile, Splits::Stream, limits)?; // 3 × 10 tiles in 8, 8, 8, 6
    /// assert_eq!(p.block_pieces(0), [(0, 0..8)]);
    /// assert_eq!(p.block_pieces(1), [(0, 8..10), (1, 0..6)]);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn block_pieces(&self, b: u32) -> Vec<(u32, Range<u32>)> {
        let total = self.n_tiles * self.k_tiles;
        let (mut g, end) = (b * self.tiles_per_split, ((b + 1) * self.tiles_per_split).min(total));
        let mut v = Vec::new();
        while g < end {
            let (t, kt) = (g / self.k_tiles, g % self.k_tiles);
            let kt_end = (kt + (end - g)).min(self.k_tiles);
            v.push((t, kt..kt_end));
            g = t * self.k_tiles + kt_end;
        }
        v
    }

    /// Columns of n tile `t`.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// assert_eq!((p.tile_columns(0), p.tile_columns(3)), (0..64, 192..200));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tile_columns(&self, t: u32) -> Range<u32> {
        let start = t * self.tile.tile_n;
        start..(start + self.tile.tile_n).min(self.n)
    }

    /// K-tile ranges of the pipeline stages of split `s`, in order, as the
    /// kernel's cursors walk them: `min(KT, end − kt)` tiles each.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// assert_eq!(p.stage_tiles, 4);
    /// assert_eq!(p.split_stages(2).collect::<Vec<_>>(), [22..26, 26..30, 30..33]);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn split_stages(&self, s: u32) -> impl Iterator<Item = Range<u32>> + use<> {
        let r = self.split_range(s);
        let kt = self.stage_tiles.max(1);
        (r.start..r.end).step_by(kt as usize).map(move |a| a..(a + kt).min(r.end))
    }

    /// This plan for a grid that leaves every block alone on its SM, with
    /// `tile_slots` K-tile slots (the SM's shared memory) cut into stages as
    /// [`stage_shape`] does; splits, items and grid unchanged.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 4, blocks_per_sm: 2 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 132, tile, Splits::Fixed(3), limits)?;
    /// let a = p.alone(16, 4);
    /// assert_eq!((p.stage_tiles, a.stage_tiles, a.stages, a.tile.blocks_per_sm, a.grid), (1, 4, 4, 1, p.grid));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn alone(mut self, tile_slots: u32, bits: u32) -> Plan {
        self.tile.tile_slots = tile_slots;
        self.tile.blocks_per_sm = 1;
        (self.stage_tiles, self.stages) =
            stage_shape(tile_slots, self.tile.tile_n, self.tile.wide_stages(), self.tiles_per_split);
        self.smem_bytes =
            geo::smem_bytes(self.tile.m_blocks, self.tile.tile_n / 32, bits, self.stages, self.stage_tiles);
        self
    }

    /// This plan with `stage_tiles` K tiles per stage (and as many stages as
    /// then fit, at most [`geo::MAX_STAGES`]) instead of the chosen shape.
    ///
    /// # Errors
    /// [`Error::SplitK`] if `stage_tiles` is outside
    /// 1..=[`geo::MAX_STAGE_TILES`] or two such stages do not fit.
    ///
    /// ```
    /// use kbit::splitk::{Limits, Splits, TileConfig, plan};
    /// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
    /// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
    /// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
    /// let q = p.with_stage_tiles(2, 4)?; // from 4 stages of 4 K tiles
    /// assert!((q.stage_tiles, q.stages) == (2, 8) && p.with_stage_tiles(5, 4).is_err());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn with_stage_tiles(mut self, stage_tiles: u32, bits: u32) -> Result<Plan> {
        let stages = self.tile.tile_slots / stage_tiles.max(1);
        if !(geo::MIN_STAGE_TILES..=geo::MAX_STAGE_TILES).contains(&stage_tiles) || stages < geo::MIN_STAGES {
            return Err(Error::SplitK {
                what: "stage_tiles",
                value: stage_tiles as usize,
                reason: format!("1..={} tiles, two stages in {} slots", geo::MAX_STAGE_TILES, self.tile.tile_slots),
            });
        }
        self.stage_tiles = stage_tiles;
        self.stages = stages.min(geo::MAX_STAGES);
        self.smem_bytes = geo::smem_bytes(self.tile.m_blocks, self.tile.tile_n / 32, bits, self.stages, stage_tiles);
        Ok(self)
    }
}

/// K tiles × columns of a stage the pipeline aims for: 256, i.e. 64 weights
/// per thread between barriers (a K tile gives each of the 256 threads
/// `TILE_N / 4` weights); 512 for the instances with
/// [`geo::wide_stages`].
const STAGE_TILE_COLUMNS: u32 = 256;
/// Fewest stages [`stage_shape`] accepts before it lowers KT (2 for the
/// instances with [`geo::wide_stages`]).
const PREFERRED_STAGES: u32 = 3;

/// `(stage_tiles, stages)` for an instance with `tile_slots` K-tile slots,
/// `tile_n` columns and wide stages or not ([`geo::wide_stages`]), for
/// items of `tiles_per_split` K tiles: KT starts at `256 / tile_n` (wide:
/// 4), capped at [`geo::MAX_STAGE_TILES`], and is halved while half of it
/// still holds a whole item or it leaves fewer than 3 stages (wide: 2); the
/// stages are as many as fit (at most [`geo::MAX_STAGES`]). With
/// `tile_slots ≥ 2` the result always has at least 2 stages.
///
/// An item of 3 K tiles thus runs as one partial stage of KT = 4, not as
/// stages of 2 and 1: one barrier and one wait less per item, which the
/// short items of small matrices feel (2048×512 at M = 5, 11 splits of 3
/// tiles, k = 5: 4.93 µs in stages of 2, 4.62 µs in one stage of 4).
///
/// ```
/// use kbit::splitk::stage_shape;
/// // 34 slots of 64 columns: stages of 4 K tiles; an item of 3 tiles is one partial stage.
/// assert_eq!(stage_shape(34, 64, false, 3), (4, 8));
/// assert_eq!(stage_shape(34, 64, false, 2), (2, 12));
/// // Wide stages: 4 tiles of 128 columns while two such stages fit.
/// assert_eq!(stage_shape(11, 128, true, 32), (4, 2));
/// ```
pub fn stage_shape(tile_slots: u32, tile_n: u32, wide: bool, tiles_per_split: u32) -> (u32, u32) {
    let (columns, fewest) =
        if wide { (2 * STAGE_TILE_COLUMNS, geo::MIN_STAGES) } else { (STAGE_TILE_COLUMNS, PREFERRED_STAGES) };
    let mut kt = (columns / tile_n.max(1)).clamp(geo::MIN_STAGE_TILES, geo::MAX_STAGE_TILES);
    while kt > 1 && (kt / 2 >= tiles_per_split || tile_slots / kt < fewest) {
        kt /= 2;
    }
    (kt, (tile_slots / kt).min(geo::MAX_STAGES))
}

/// `(splits, tiles_per_split)` for a requested split count: every split
/// non-empty, at least one.
///
/// ```
/// use kbit::splitk::normalize_splits;
/// // 33 splits of 100 K tiles would leave the last one empty: 25 splits of 4.
/// assert_eq!(normalize_splits(100, 33), (25, 4));
/// assert_eq!(normalize_splits(128, 132), (128, 1));
/// assert_eq!(normalize_splits(1, 0), (1, 1));
/// ```
pub fn normalize_splits(k_tiles: u32, requested: u32) -> (u32, u32) {
    let s = requested.clamp(1, k_tiles.max(1));
    let tps = k_tiles.div_ceil(s).max(1);
    (k_tiles.div_ceil(tps).max(1), tps)
}

/// Estimated duration of a plan in K-tile loads of one SM (cost model of
/// [`Splits::Auto`]): the busiest SM streams `ceil(items / SMs)` items of up
/// to `tiles_per_split` tiles when the items fit one round of resident
/// blocks, else `blocks_per_sm · ceil(items / (SMs · blocks_per_sm))` (two
/// blocks of one SM may both hold the larger share). Short items
/// (≤ [`LATENCY_BOUND_TILES`] K tiles) of one m block, two to an SM, are
/// latency-bound: the second block overlaps the first and costs half an
/// item (a third does not, nor wider tiles: see [`LATENCY_BOUND_TILES`]).
/// A short item whose last stage is partial costs [`PARTIAL_STAGE_COST`]
/// more.
/// With split-K each item also pays its
/// publication (partial tile stores, a GPU-scope fence, the arrival
/// counter, two barriers: ≈ `SPLIT_ITEM_COST` tile loads, which favors
/// fewer, larger items), and every partial is read once more through L2
/// (one slot ≈ `8·m_blocks / (6·bits)` tile loads at L2's ~6× per-SM
/// bandwidth, i.e. `4·m_blocks / (3·bits)`), plus a fixed cost for the
/// reduction's latency.
///
/// ```
/// use kbit::splitk::{TileConfig, cost};
/// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 2 };
/// // 160 items of 32 K tiles on 132 SMs: the busiest SM streams two.
/// assert_eq!(cost(160, 32, 1, 132, tile, 4), 64.0);
/// // 6 K tiles end in a partial stage (KT = 4) and cost one tile more.
/// assert_eq!(cost(1, 6, 1, 132, tile, 4), 7.0);
/// ```
pub fn cost(n_tiles: u32, k_tiles: u32, splits: u32, sm_count: u32, tile: TileConfig, bits: u32) -> f64 {
    let m_blocks = tile.m_blocks;
    let (splits, tps) = normalize_splits(k_tiles, splits);
    let items = n_tiles as u64 * splits as u64;
    // Items go to blocks round-robin, so a block runs ceil(items / grid) of
    // them; the hardware may place two such blocks on one SM (seen: SMs
    // with 8 items where the average was 6.8), so a full grid costs
    // blocks-per-SM times that. A grid that is not full spreads over the
    // SMs one block per SM first.
    let (sms, bps) = (sm_count.max(1) as u64, tile.blocks_per_sm.max(1) as u64);
    let grid = sms * bps;
    let waves = if items > grid {
        (items.div_ceil(grid) * bps) as f64
    } else {
        let per_sm = items.div_ceil(sms);
        if per_sm == 2 && tile.m_blocks == 1 && tps <= LATENCY_BOUND_TILES { 1.5 } else { per_sm as f64 }
    };
    // A short item that ends in a partial stage runs that stage through
    // the kernel's predicated tile loop instead of a straight-line one.
    let (kt, _) = stage_shape(tile.tile_slots, tile.tile_n, tile.wide_stages(), tps);
    let partial = tps % kt != 0 && tps <= LATENCY_BOUND_TILES;
    let item = tps as f64 + if partial { PARTIAL_STAGE_COST } else { 0.0 };
    if splits == 1 {
        return waves * item;
    }
    let stream = waves * (item + SPLIT_ITEM_COST);
    let per_split = 4.0 * m_blocks as f64 / (3.0 * bits as f64);
    stream + splits as f64 * per_split + SPLIT_FIXED_COST
}

/// Estimated duration of a stream-K plan in the units of [`cost`]: each of
/// an SM's blocks streams its P iterations and publishes up to two partial
/// pieces (its first and last n tiles), plus the reduction's latency.
///
/// ```
/// use kbit::splitk::{Limits, Splits, TileConfig, plan, stream_cost};
/// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
/// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
/// let p = plan(8, 192, 640, 4, 4, tile, Splits::Stream, limits)?; // 3 × 10 tiles in 8, 8, 8, 6
/// assert_eq!(stream_cost(&p), 14.0); // 8 iterations, 2 pieces of 2, a reduction of 2
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn stream_cost(plan: &Plan) -> f64 {
    let bps = plan.tile.blocks_per_sm.max(1) as f64;
    bps * (plan.tiles_per_split as f64 + 2.0 * SPLIT_ITEM_COST) + SPLIT_FIXED_COST
}

/// Longest item (K tiles) that [`cost`] treats as latency-bound. From a
/// sweep of forced split counts on the H100 (M = 5..16, k = 3..5, the
/// Qwen3 dense shapes): 2048×4096 at M = 5..8 ran 6–10 % faster as 4 splits
/// of 8 tiles on 256 blocks (two on most SMs) than as 2 splits of 16 on 128
/// (k = 4, M = 5: 6.44 against 6.88 µs), and 4096×2048 as fast as 8 splits of
/// 8 as 4 of 16; with longer items the second block cost a full item. At
/// k = 5 the same held once the decode table was built before the
/// programmatic-launch wait (same shapes, M = 5: 2048×4096 7.17 µs as 4
/// splits of 8 against 7.82 as 2 of 16, 4096×2048 7.44 as 8 of 8 against
/// 7.78 as 4 of 16; before, the second block cost a full item at k = 5
/// as well). Three short items
/// to an SM did not overlap as well: 2048×10240 at k = 2 took 10.9 µs as 4
/// splits of 8 tiles on 320 blocks of 128 columns against 9.5 µs as 2
/// splits of 16 on 320 blocks of 64; nor did two items of 32 or 64 rows
/// (8 MoE experts of 2048×512 at 32 rows, k = 2: 7.9 µs as 2 splits per
/// expert, 9.0 µs as 4).
pub const LATENCY_BOUND_TILES: u32 = 8;

/// Fixed latency of a split-K reduction, in K-tile loads.
const SPLIT_FIXED_COST: f64 = 2.0;

/// Extra cost of a short item (≤ [`LATENCY_BOUND_TILES`] K tiles) whose
/// last stage holds fewer than KT tiles, in K-tile loads. From a sweep of
/// forced split counts on the H100 (2048×512, M = 4..16, k = 3..5, one
/// round of blocks): 11 splits of 3 tiles and 6 splits of 6 (stages of
/// 4 + 2) each took ≈ 0.3 µs, about one K tile's share, more than a fit
/// through the whole-stage plans (2, 4 and 8 splits) gives them; at k = 5,
/// 11 splits ran 4.35 µs against 4.01 µs for 8 splits of 4. Charged on
/// longer items as well, it sent 2048×5120 at k = 2..4 from 3 splits of
/// 11 tiles (6.3 µs at M = 5, k = 2) to one split on 80 blocks (7.5 µs):
/// there the model's error is larger than the charge.
pub const PARTIAL_STAGE_COST: f64 = 1.0;

/// Per-item cost of publishing a split-K partial, in K-tile loads.
const SPLIT_ITEM_COST: f64 = 2.0;

/// Most splits [`Splits::Auto`] considers.
const AUTO_MAX_SPLITS: u32 = 64;

/// Plans `y[m, n] = x[m, k] · Wᵀ` with `bits`-bit weights on `sm_count` SMs.
///
/// # Errors
/// [`Error::Rows`] for M outside `1..=16·m_blocks` (or `m_blocks` outside
/// 1..=4), [`Error::OutFeatures`] / [`Error::InFeatures`] for bad N / K,
/// [`Error::SplitK`] for a zero SM count, `Fixed(0)`, a bad tile
/// configuration, or a fixed split count the workspace cannot hold.
///
/// ```
/// use kbit::splitk::{Limits, Splits, TileConfig, plan};
/// let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 1 };
/// let limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };
/// let p = plan(8, 200, 2080, 4, 4, tile, Splits::Fixed(3), limits)?; // 4 × 33 tiles, 3 splits of 11
/// let covered: usize = (0..p.items).map(|i| p.split_range(p.item(i).1).len()).sum();
/// assert_eq!((p.splits, p.items, covered), (3, 12, (p.n_tiles * p.k_tiles) as usize)); // every tile once
/// # Ok::<(), kbit::Error>(())
/// ```
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
    if !(geo::MIN_STAGES..=geo::MAX_TILE_SLOTS).contains(&tile.tile_slots) || tile.blocks_per_sm == 0 {
        return bad("tile_slots", tile.tile_slots as usize, "outside the kernel's range, or no resident block");
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
    let slots = sm_count as u64 * tile.blocks_per_sm as u64;
    // (splits, K tiles per split or P, stream-K grid)
    let (s, tps, stream_grid) = match splits {
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
            (s, tps, None)
        }
        Splits::Max => {
            let (s, tps) = normalize_splits(k_tiles, ws_max);
            (s, tps, None)
        }
        Splits::Stream => {
            let total = n_tiles as u64 * k_tiles as u64;
            if total > u32::MAX as u64 / 2 {
                return bad("n", n, "too many (column tile, K tile) iterations for one launch");
            }
            let per_block = total.div_ceil(slots).max(1) as u32;
            let grid = total.div_ceil(per_block as u64) as u32;
            let need = (n_tiles + grid) as usize * slot;
            if need > limits.workspace_f32 || n_tiles as usize > limits.counters {
                return Err(Error::SplitK {
                    what: "splits",
                    value: grid as usize,
                    reason: format!(
                        "stream-K over {grid} blocks needs {need} f32 of workspace, the context has {}",
                        limits.workspace_f32
                    ),
                });
            }
            (1, per_block, Some(grid))
        }
        Splits::Auto => {
            let mut best = (f64::INFINITY, 1, k_tiles);
            for r in 1..=k_tiles.min(AUTO_MAX_SPLITS).min(ws_max) {
                let (s, tps) = normalize_splits(k_tiles, r);
                if s != r {
                    continue; // same plan as a smaller request
                }
                let c = cost(n_tiles, k_tiles, s, sm_count, tile, bits);
                if c < best.0 {
                    best = (c, s, tps);
                }
            }
            (best.1, best.2, None)
        }
    };
    let (items, grid) = match stream_grid {
        Some(grid) => (n_tiles + grid, grid),
        None => {
            let items = n_tiles as u64 * s as u64;
            if items > u32::MAX as u64 / 2 {
                return bad("n", n, "too many column tiles for one launch");
            }
            (items as u32, slots.min(items) as u32)
        }
    };
    let (stage_tiles, stages) = stage_shape(tile.tile_slots, tile.tile_n, tile.wide_stages(), tps.min(k_tiles));
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
        stream: stream_grid.is_some(),
        k_slots: false,
        direct: false,
        teams: 1,
        early_decode: false,
        x_registers: false,
        grid,
        stages,
        stage_tiles,
        workspace_f32: if s > 1 || stream_grid.is_some() { items as usize * slot } else { 0 },
        smem_bytes: geo::smem_bytes(tile.m_blocks, tile.tile_n / 32, bits, stages, stage_tiles),
    })
}

/// Chooses `(tile_slots, blocks per SM)` for a kernel instance from the
/// device's shared memory: the most resident blocks per SM, up to
/// `max_blocks`, that leave each block enough K-tile slots (more warps hide
/// more lookup and mma latency): 3 blocks need 12 slots (KT = 4 in 3
/// stages; with fewer, shorter stages cost more than the warps gain: 70B
/// gate/up at M = 16, k = 4 with 9 slots, 2 K tiles per stage, took 30 %
/// more instructions), 2 blocks need 4, and one block takes as many as fit
/// (at least 2, at most [`geo::MAX_TILE_SLOTS`]); `None` if even 2 do not fit.
/// `reserved` is the driver's per-block reservation (1 KiB on sm_80+).
/// [`stage_shape`] later cuts the slots into stages per launch.
///
/// ```
/// use kbit::splitk::slots_for;
/// // An H100 (227 KiB per block, 228 KiB per SM), k = 4, 1 m block, 128 columns:
/// assert_eq!(slots_for(4, 1, 128, 232_448, 233_472, 1024, 2), Some((11, 2)));
/// assert_eq!(slots_for(4, 1, 128, 232_448, 233_472, 1024, 1), Some((29, 1)));
/// assert_eq!(slots_for(4, 1, 64, 4096, 4096, 1024, 3), None);
/// ```
pub fn slots_for(
    bits: u32,
    m_blocks: u32,
    tile_n: u32,
    smem_per_block: usize,
    smem_per_sm: usize,
    reserved: usize,
    max_blocks: u32,
) -> Option<(u32, u32)> {
    let nf = tile_n / 32;
    let fixed = geo::stages_offset(m_blocks, nf, bits) as usize;
    let slot = geo::tile_bytes(m_blocks, nf, bits) as usize;
    for blocks in (1..=max_blocks.max(1) as usize).rev() {
        let min_slots = match blocks {
            1 => geo::MIN_STAGES as usize,
            2 => 4,
            _ => (geo::MAX_STAGE_TILES * PREFERRED_STAGES) as usize,
        };
        let budget = smem_per_block.min((smem_per_sm / blocks).saturating_sub(reserved));
        let slots = budget.saturating_sub(fixed) / slot;
        if budget >= fixed && slots >= min_slots {
            return Some((slots.min(geo::MAX_TILE_SLOTS as usize) as u32, blocks as u32));
        }
    }
    None
}
