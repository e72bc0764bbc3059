//! Tile and split-K planning for the warpgroup tensor-core GEMM (sm_90,
//! kernel 2 at large M): a pure function of the shape and of the blocks
//! the GPU holds at once by cluster size ([`Slots`]), tested without a GPU.
//!
//! The output is cut into `tiles = row_tiles · col_tiles` tiles of 128 or
//! 256 activation rows (256 decode each weight once for twice the MMAs;
//! chosen by [`cost`] beyond M = 128) × 128 weight columns, each a block of
//! one SM (the pipeline takes most of the shared memory). A grid of one
//! block per
//! tile leaves SMs idle where the tiles are few (Qwen3 `down` at M = 128:
//! 16 tiles of 80 K tiles each on 132 SMs) or end in a thin last wave. The
//! plan keeps `full` tiles whole (whole waves, a multiple of the split
//! count) and cuts each later tile into `splits` K ranges
//! ([`kbit_format::wgmma::work`]); a split tile's blocks run as one
//! thread-block cluster and add their partials in shared memory, so the
//! plan needs no workspace.
//!
//! ```
//! use kbit::splitk::Splits;
//! use kbit::wgmma_plan::{Slots, plan};
//! // 128 rows of Qwen3 `down` (5120 → 2048) on an H100: 16 tiles of 80 K
//! // tiles, each cut in 6 (96 blocks; clusters of 6 hold 102 at once).
//! let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
//! let p = plan(128, 2048, 5120, &h100, Splits::Auto, None)?;
//! assert_eq!((p.tiles(), p.full, p.splits, p.blocks), (16, 0, 6, 96));
//! # Ok::<(), kbit::Error>(())
//! ```

use crate::splitk::{Splits, normalize_splits};
use crate::{Error, Result};
use kbit_format::wgmma::{self as geo, Work};
use std::ops::Range;

/// How many blocks of one launch can be resident at once, by cluster size
/// (index s = 1..=[`geo::MAX_SPLITS`]): a cluster's blocks must share a GPC,
/// so on an H100 (132 SMs, one block each) clusters of 3, 4, …, 8 hold
/// 117, 120, 110, 102, 105 and 120 blocks. The context asks the driver
/// (`cuOccupancyMaxActiveClusters`).
///
/// ```
/// use kbit::wgmma_plan::Slots;
/// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
/// // Clusters of 4 place 120 blocks where 132 SMs would hold 132 alone.
/// assert!(h100.get(4) < Slots::uniform(132).get(4));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots(pub [u32; geo::MAX_SPLITS as usize + 1]);

impl Slots {
    /// `sm_count` SMs of one block each, clusters placed anywhere: the
    /// largest multiple of the cluster size (planning for another GPU).
    ///
    /// ```
    /// use kbit::wgmma_plan::Slots;
    /// let s = Slots::uniform(132);
    /// assert_eq!((s.get(1), s.get(4), s.get(5), s.get(8)), (132, 132, 130, 128));
    /// ```
    pub fn uniform(sm_count: u32) -> Slots {
        Slots(core::array::from_fn(|s| {
            let s = (s as u32).max(1);
            sm_count / s * s
        }))
    }

    /// Resident blocks with clusters of `splits` blocks (at least one
    /// cluster).
    ///
    /// ```
    /// use kbit::wgmma_plan::Slots;
    /// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
    /// assert_eq!((h100.get(0), h100.get(6), h100.get(20)), (132, 102, 120));
    /// assert_eq!(Slots::uniform(2).get(8), 8); // one cluster at least
    /// ```
    pub fn get(&self, splits: u32) -> u32 {
        let s = splits.clamp(1, geo::MAX_SPLITS);
        self.0[s as usize].max(s)
    }
}

/// A launch plan of the warpgroup GEMM.
///
/// ```
/// use kbit::splitk::Splits;
/// use kbit::wgmma_plan::{Slots, plan};
/// // Llama-3-70B gate/up at M = 512: 224 column tiles of 128 K tiles.
/// let p = plan(512, 28672, 8192, &Slots::uniform(132), Splits::Auto, None)?;
/// assert_eq!((p.col_tiles, p.k_tiles, p.row_tiles * p.halves), (224, 128, 4));
/// // Whole tiles first, then the rest cut into `splits` K ranges each.
/// assert_eq!(p.blocks, p.full + (p.tiles() - p.full) * p.splits);
/// let whole = plan(512, 28672, 8192, &Slots::uniform(132), Splits::Fixed(1), None)?;
/// assert_eq!((whole.splits, whole.full, whole.blocks), (1, whole.tiles(), whole.tiles()));
/// # Ok::<(), kbit::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaPlan {
    /// Rows M.
    pub m: u32,
    /// Out features N.
    pub n: u32,
    /// In features K.
    pub k: u32,
    /// Row halves per tile: 1 (128 activation rows per block) or 2 (256).
    pub halves: u32,
    /// `ceil(M / (128 · halves))`.
    pub row_tiles: u32,
    /// `ceil(N / 128)`.
    pub col_tiles: u32,
    /// `ceil(K / 64)`.
    pub k_tiles: u32,
    /// Tiles computed whole, by blocks `0..full`.
    pub full: u32,
    /// K splits of each later tile (1: every tile whole, `full = tiles`).
    pub splits: u32,
    /// K tiles per split (the last split may have fewer, never 0).
    pub tiles_per_split: u32,
    /// Blocks of the launch: `full + (tiles − full) · splits`.
    pub blocks: u32,
}

impl WgmmaPlan {
    /// Output tiles.
    ///
    /// ```
    /// use kbit::splitk::Splits;
    /// use kbit::wgmma_plan::{Slots, plan};
    /// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
    /// let p = plan(128, 2048, 5120, &h100, Splits::Auto, None)?;
    /// assert_eq!((p.row_tiles, p.col_tiles, p.tiles()), (1, 16, 16));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tiles(&self) -> u32 {
        self.row_tiles * self.col_tiles
    }

    /// Tiles cut along K.
    ///
    /// ```
    /// use kbit::splitk::Splits;
    /// use kbit::wgmma_plan::{Slots, plan};
    /// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
    /// let p = plan(128, 2048, 5120, &h100, Splits::Auto, None)?;
    /// assert_eq!((p.full, p.splits, p.split_tiles()), (0, 6, 16));
    /// assert_eq!(plan(128, 2048, 5120, &h100, Splits::Fixed(1), None)?.split_tiles(), 0);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn split_tiles(&self) -> u32 {
        if self.splits > 1 { self.tiles() - self.full } else { 0 }
    }

    /// What block `b` computes, as the kernel decodes it.
    ///
    /// ```
    /// use kbit::splitk::Splits;
    /// use kbit::wgmma_plan::{Slots, plan};
    /// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
    /// let p = plan(128, 2048, 5120, &h100, Splits::Auto, None)?;
    /// let w = p.work(7); // 80 K tiles in 6 splits of 14: split 1 of tile 1
    /// assert_eq!((w.tile, w.split, w.splits, w.kt0, w.kt1), (1, 1, 6, 14, 28));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn work(&self, b: u32) -> Work {
        geo::work(b, self.full, self.splits, self.tiles_per_split, self.k_tiles)
    }

    /// Activation rows of tile `t`.
    ///
    /// ```
    /// use kbit::splitk::Splits;
    /// use kbit::wgmma_plan::{Slots, plan};
    /// // 300 rows in tiles of 128 (3 row tiles) × 2 column tiles, in row order.
    /// let p = plan(300, 256, 1024, &Slots::uniform(132), Splits::Fixed(1), Some(128))?;
    /// assert_eq!((p.tile_rows(0), p.tile_rows(2), p.tile_rows(3)), (0..128, 256..300, 0..128));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tile_rows(&self, t: u32) -> Range<u32> {
        let rows = geo::tile_m(self.halves);
        let start = (t % self.row_tiles) * rows;
        start..(start + rows).min(self.m)
    }

    /// Weight columns (outputs) of tile `t`.
    ///
    /// ```
    /// use kbit::splitk::Splits;
    /// use kbit::wgmma_plan::{Slots, plan};
    /// // 300 rows in tiles of 128 (3 row tiles) × 2 column tiles, in row order.
    /// let p = plan(300, 256, 1024, &Slots::uniform(132), Splits::Fixed(1), Some(128))?;
    /// assert_eq!((p.tile_columns(2), p.tile_columns(3), p.tile_columns(5)), (0..128, 128..256, 128..256));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tile_columns(&self, t: u32) -> Range<u32> {
        let start = (t / self.row_tiles) * geo::TILE_N;
        start..(start + geo::TILE_N).min(self.n)
    }
}

/// Cost of starting a wave of blocks, in K-tile times (one K tile ≈
/// 0.4 µs on an H100 at k = 4 for a block alone, ≈ 0.6 µs with every SM
/// busy): the decode table, the pipeline's first copies, the epilogue.
const BLOCK_COST: f64 = 2.0;
/// Extra cost of a split block, in K-tile times, by row halves: parking
/// its partial (64 KiB per half), two cluster barriers, reading its share
/// of the partials through distributed shared memory. From sweeps of
/// forced split counts on the H100 (k = 4): Qwen3 `kv` at M = 128 (4 tiles
/// of 32 K tiles, 128 rows) 17.9 / 12.4 / 9.2 / 7.7 µs at 1 / 2 / 4 / 8
/// splits, i.e. ≈ 0.4 µs per K tile and ≈ 2 µs per split block; with 256
/// rows `q` at M = 512 (64 tiles, 2 splits of 16 K tiles) 21.7 µs and
/// `down` (32 tiles, 3 splits of 27) 28.2 µs, i.e. ≈ 0.6 µs per K tile and
/// ≈ 9 µs per split block beyond a whole tile's.
const SPLIT_BLOCK_COST: [f64; 2] = [4.0, 16.0];
/// Least gain (as a factor of the whole-tile plan's [`cost`]) for which
/// [`Splits::Auto`] splits: the costs are estimates, and a tail wave split
/// into many clusters only pays where it is clearly shorter.
const SPLIT_MARGIN: f64 = 0.95;

/// K-tile time of a 256-row block (`halves = 2`) in those of a 128-row
/// one: twice the MMAs per decoded weight. H100, k = 4, Llama-3-70B
/// gate/up at M = 512 with every SM busy: ≈ 0.75 µs against ≈ 0.64 µs.
const HALVES_2_TILE: f64 = 1.25;

/// Estimated duration (K-tile times of a 128-row block) of `tiles` tiles
/// of `k_tiles` K tiles and `halves` row halves, `full` of them whole and
/// the rest in `splits` splits, with `slots` resident blocks: waves of
/// whole tiles, then waves of split blocks (the whole tiles run in
/// clusters of `splits` as well); a split block parks and reads a partial
/// of `halves` × 64 KiB.
///
/// ```
/// use kbit::wgmma_plan::{Slots, cost};
/// let h100 = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);
/// // 16 tiles of 80 K tiles: whole (82 K-tile times) or in 6 splits of 14 (20).
/// assert_eq!(cost(16, 80, 16, 1, 1, &h100), 82.0);
/// assert_eq!(cost(16, 80, 0, 6, 1, &h100), 20.0);
/// ```
pub fn cost(tiles: u32, k_tiles: u32, full: u32, splits: u32, halves: u32, slots: &Slots) -> f64 {
    let (splits, tps) = normalize_splits(k_tiles, splits);
    let at_once = slots.get(splits) as u64;
    let tile = if halves == 2 { HALVES_2_TILE } else { 1.0 };
    let whole_tile = k_tiles as f64 * tile + BLOCK_COST;
    if splits == 1 {
        return (tiles as u64).div_ceil(at_once) as f64 * whole_tile;
    }
    let whole = (full as u64).div_ceil(at_once) as f64 * whole_tile;
    let waves = ((tiles - full) as u64 * splits as u64).div_ceil(at_once) as f64;
    let split = SPLIT_BLOCK_COST[(halves == 2) as usize];
    whole + waves * (tps as f64 * tile + BLOCK_COST + split)
}

/// Plans `y[m, n] = x[m, k] · Wᵀ` for a GPU with these resident `slots`,
/// with `tile_rows` (128 or 256) activation rows per block, or the ones of
/// lower [`cost`] (256 only for M > 128).
///
/// [`Splits::Auto`] picks the whole waves and the split count of least
/// [`cost`]; `Fixed(s)` and `Max` cut every tile (`Max`: as many splits as
/// the K tiles and a cluster allow, [`geo::MAX_SPLITS`]).
///
/// # Errors
/// [`Error::Rows`] for M outside `1..2^31` or a grid over 2^31 − 1
/// blocks, [`Error::OutFeatures`] / [`Error::InFeatures`] for bad N / K,
/// [`Error::SplitK`] for no resident block, `Fixed(0)`, `Fixed(s)` with `s`
/// over [`geo::MAX_SPLITS`], stream-K (not a policy of this kernel), or
/// `tile_rows` other than 128 and 256.
///
/// ```
/// use kbit::splitk::Splits;
/// use kbit::wgmma_plan::{Slots, plan};
/// let p = plan(512, 4096, 4096, &Slots::uniform(132), Splits::Fixed(2), Some(256))?;
/// assert_eq!((p.halves, p.tiles(), p.splits, p.tiles_per_split, p.blocks), (2, 64, 2, 32, 128));
/// assert!(plan(512, 4096, 4096, &Slots::uniform(132), Splits::Stream, None).is_err());
/// # Ok::<(), kbit::Error>(())
/// ```
pub fn plan(m: usize, n: usize, k: usize, slots: &Slots, splits: Splits, tile_rows: Option<u32>) -> Result<WgmmaPlan> {
    let grid_max = i32::MAX as u64;
    if m == 0 || m > grid_max as usize {
        return Err(Error::Rows { m, max: grid_max as usize });
    }
    if n == 0 {
        return Err(Error::OutFeatures);
    }
    if k == 0 || k % 32 != 0 || k > u32::MAX as usize || n > u32::MAX as usize {
        return Err(Error::InFeatures(k));
    }
    let bad = |what: &'static str, value: usize, reason: String| Err(Error::SplitK { what, value, reason });
    if slots.0[1] == 0 {
        return bad("sm_count", 0, "at least one SM is needed".into());
    }
    match splits {
        Splits::Fixed(0) => return bad("splits", 0, "at least one split is needed".into()),
        Splits::Stream => return bad("splits", 0, "the warpgroup GEMM has no stream-K schedule".into()),
        Splits::Fixed(r) if r > geo::MAX_SPLITS => {
            let reason = format!("a split tile is one cluster of at most {} blocks", geo::MAX_SPLITS);
            return bad("splits", r as usize, reason);
        }
        _ => {}
    }
    // Row halves to consider; a slice, not a vector: this runs on every call.
    let halves: &[u32] = match tile_rows {
        Some(128) => &[1],
        Some(256) => &[2],
        Some(r) => return bad("tile_rows", r as usize, "the warpgroup GEMM has blocks of 128 or 256 rows".into()),
        None if m > geo::HALF_M as usize => &[1, 2],
        None => &[1],
    };
    let (m, n, k) = (m as u32, n as u32, k as u32);
    let mut best: Option<(f64, WgmmaPlan)> = None;
    for &h in halves {
        let (c, p) = plan_rows(m, n, k, slots, splits, h)?;
        if best.as_ref().is_none_or(|(bc, _)| c < *bc) {
            best = Some((c, p));
        }
    }
    Ok(best.expect("one row count at least").1)
}

/// [`plan`] for `halves` row halves per tile, with the [`Splits::Auto`]
/// plan's cost (the row counts are compared under automatic splitting).
fn plan_rows(m: u32, n: u32, k: u32, slots: &Slots, splits: Splits, halves: u32) -> Result<(f64, WgmmaPlan)> {
    let grid_max = i32::MAX as u64;
    let rows = geo::tile_m(halves);
    let (row_tiles, col_tiles, k_tiles) = (m.div_ceil(rows), n.div_ceil(geo::TILE_N), k.div_ceil(64));
    // Split blocks need room in the grid as well: up to MAX_SPLITS per tile.
    let tiles = row_tiles as u64 * col_tiles as u64;
    if tiles * geo::MAX_SPLITS as u64 > grid_max {
        let max = (grid_max / geo::MAX_SPLITS as u64 / col_tiles as u64 * rows as u64) as usize;
        return Err(Error::Rows { m: m as usize, max });
    }
    let tiles = tiles as u32;
    // A split must win by SPLIT_MARGIN; ties go to the plan found first:
    // fewer splits, then more whole waves.
    let whole = cost(tiles, k_tiles, tiles, 1, halves, slots);
    let mut auto = (whole * SPLIT_MARGIN, tiles, 1);
    for r in 2..=geo::MAX_SPLITS.min(k_tiles) {
        let (s, _) = normalize_splits(k_tiles, r);
        let at_once = slots.get(s);
        for waves in (0..=tiles / at_once).rev() {
            // Whole tiles fill whole clusters.
            let full = (waves * at_once).min(tiles) / s * s;
            if s < 2 || full == tiles {
                continue;
            }
            let c = cost(tiles, k_tiles, full, s, halves, slots);
            if c < auto.0 {
                auto = (c, full, s);
            }
        }
    }
    let auto_cost = if auto.2 == 1 { whole } else { auto.0 };
    let (full, s) = match splits {
        Splits::Fixed(r) => (0, r),
        Splits::Max => (0, geo::MAX_SPLITS),
        _ => (auto.1, auto.2),
    };
    let (splits, tps) = normalize_splits(k_tiles, s);
    let full = if splits == 1 { tiles } else { full };
    let blocks = full + (tiles - full) * splits;
    let plan = WgmmaPlan { m, n, k, halves, row_tiles, col_tiles, k_tiles, full, splits, tiles_per_split: tps, blocks };
    Ok((auto_cost, plan))
}
