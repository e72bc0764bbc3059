//! Times the tensor-core GEMM's automatic plan against forced ones: the
//! K-slot variant, the pipelined kernel, and (unless `--lite`) split
//! counts, stage lengths and stream-K. Values, cold L2 (rotating weight
//! copies) and CUDA-graph replay as `kbit-bench --quick`. Prints, per
//! (shape, k, M), the fastest distinct plans with their time against the
//! automatic one.
//!
//! ```text
//! cargo run --release --example mma_plan_sweep -- SHAPES BITS MS [--lite | --pair] [--past-wave]
//!   SHAPES       KxN or KxNxE (E experts, grouped launch), comma-separated
//!   BITS, MS     comma-separated lists (k = 2..5, M = 1..64)
//!   --lite       only auto, K-slot and pipelined plans
//!   --pair       only the K-slot and pipelined plans (dense shapes), one
//!                line per case: `pair K N k M t_kslots t_pipe` (µs; `-`
//!                where a plan cannot run)
//!   --past-wave  only cases whose automatic plan is a K-slot grid larger
//!                than the blocks resident at once
//! ```
//! e.g. `-- 2048x10240,512x2048x8 4,5 5,8`

mod common;

#[allow(dead_code)]
#[path = "../src/bin/kbit-bench/timing.rs"]
mod timing;

// The benchmark's values: weights of σ = 0.02, activations of σ = 1.
#[path = "../src/bin/kbit-bench/values.rs"]
mod values;

use half::f16;
use kbit::{Codebook, Context, Dtype, KbitWeight, MmaOptions, Plan, ScaleMode, Shape, Splits};
use std::collections::HashSet;

struct Args {
    shapes: Vec<(usize, usize, usize)>,
    bits: Vec<u32>,
    ms: Vec<usize>,
    lite: bool,
    pair: bool,
    past_wave: bool,
}

fn parse() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let flags: Vec<&str> = a.iter().filter(|s| s.starts_with("--")).map(String::as_str).collect();
    let pos: Vec<&str> = a.iter().filter(|s| !s.starts_with("--")).map(String::as_str).collect();
    if pos.len() != 3 || flags.iter().any(|f| !["--lite", "--pair", "--past-wave"].contains(f)) {
        return Err("usage: mma_plan_sweep SHAPES BITS MS [--lite | --pair] [--past-wave]".into());
    }
    let nums = |s: &str| -> Result<Vec<usize>, String> {
        s.split(',').map(|v| v.parse().map_err(|e| format!("{v:?}: {e}"))).collect()
    };
    let shapes: Vec<(usize, usize, usize)> = pos[0]
        .split(',')
        .map(|s| {
            let v: Vec<usize> =
                s.split('x').map(|t| t.parse().map_err(|e| format!("{s:?}: {e}"))).collect::<Result<_, _>>()?;
            match v[..] {
                [k, n] => Ok((k, n, 1)),
                [k, n, e] if e > 0 => Ok((k, n, e)),
                _ => Err(format!("{s:?}: KxN or KxNxE")),
            }
        })
        .collect::<Result<_, String>>()?;
    if flags.contains(&"--pair") && shapes.iter().any(|&(_, _, e)| e > 1) {
        return Err("--pair times dense shapes (KxN) only".into());
    }
    let bits = nums(pos[1])?.into_iter().map(|b| b as u32).collect();
    Ok(Args {
        shapes,
        bits,
        ms: nums(pos[2])?,
        lite: flags.contains(&"--lite"),
        pair: flags.contains(&"--pair"),
        past_wave: flags.contains(&"--past-wave"),
    })
}

/// The options tried for one case, named.
fn candidates(lite: bool) -> Vec<(String, MmaOptions)> {
    let base = MmaOptions::default();
    let mut v = vec![
        ("auto".to_string(), base),
        ("kslots".into(), MmaOptions { k_slots: Some(true), ..base }),
        ("pipe".into(), MmaOptions { k_slots: Some(false), ..base }),
    ];
    if lite {
        return v;
    }
    for splits in [Splits::Auto, Splits::Stream] {
        for kt in [1, 2, 4] {
            v.push((
                format!("{splits:?} kt{kt}"),
                MmaOptions { k_slots: Some(false), splits, stage_tiles: Some(kt), ..base },
            ));
        }
    }
    for r in [1, 2, 3, 4, 6, 8, 12, 16] {
        for kt in [None, Some(1), Some(2), Some(4)] {
            let o = MmaOptions { k_slots: Some(false), splits: Splits::Fixed(r), stage_tiles: kt, ..base };
            v.push((format!("F{r} kt{}", kt.map_or("-".into(), |t| t.to_string())), o));
        }
    }
    v
}

fn describe(p: &Plan) -> String {
    format!(
        "n{} bps{} s{} tps{} grid{} st{}x{}{}{}",
        p.tile.tile_n,
        p.tile.blocks_per_sm,
        p.splits,
        p.tiles_per_split,
        p.grid,
        p.stages,
        p.stage_tiles,
        if p.k_slots { " kslots" } else { "" },
        if p.stream { " stream" } else { "" }
    )
}

/// Whether `p` is a K-slot grid larger than the blocks resident at once.
fn past_wave(ctx: &Context, p: &Plan) -> bool {
    p.k_slots && p.grid > ctx.info().sm_count * p.tile.blocks_per_sm
}

fn main() -> kbit::Result<()> {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let ctx = common::context_or_exit("mma_plan_sweep")?;
    let stream = ctx.stream().clone();
    let timer = timing::Timer::new(&stream, timing::Settings::QUICK)?;
    for &(k, n, e) in &args.shapes {
        let shape = Shape::new(n, k)?;
        let seed = (k as u64) << 32 | n as u64;
        let dw = stream.clone_htod(&values::random::<f16>(shape.numel(), seed, 0.02))?;
        for &bits in &args.bits {
            let flat = ctx.quantize(&dw, shape, &Codebook::nf(bits)?)?;
            let first = ctx.repack(&flat, ScaleMode::Strict)?;
            if args.past_wave && e == 1 {
                let plans: Vec<Plan> = args
                    .ms
                    .iter()
                    .map(|&m| ctx.mma_plan(Dtype::F16, m, &first, MmaOptions::default()))
                    .collect::<kbit::Result<_>>()?;
                if !plans.iter().any(|p| past_wave(&ctx, p)) {
                    continue;
                }
            }
            let bytes = shape.tiled_bytes(bits) * e;
            let l2 = ctx.info().l2_bytes;
            let copies = if bytes > 2 * l2 { 1 } else { 2 * l2 / bytes + 2 };
            let mut ws: Vec<KbitWeight> = vec![first];
            for _ in 1..copies {
                ws.push(ctx.repack(&flat, ScaleMode::Strict)?);
            }
            let experts = if e > 1 {
                ws.iter().map(|one| ctx.concat_experts(&vec![one; e])).collect::<kbit::Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            ctx.synchronize()?;
            for &m in &args.ms {
                if args.past_wave
                    && (e > 1 || !past_wave(&ctx, &ctx.mma_plan(Dtype::F16, m, &ws[0], MmaOptions::default())?))
                {
                    continue;
                }
                let rows = m * e;
                let dx = stream.clone_htod(&values::random::<f16>(rows * k, seed ^ 1, 1.0))?;
                let mut dy = stream.alloc_zeros::<f16>(rows * n)?;
                let offsets: Vec<u32> = (0..=e as u32).map(|i| i * m as u32).collect();
                let doff = stream.clone_htod(&offsets)?;
                if args.pair {
                    let base = MmaOptions::default();
                    let mut t = |k_slots: bool| {
                        let o = MmaOptions { k_slots: Some(k_slots), ..base };
                        let r =
                            timer.per_call(copies, &mut |i| ctx.mma_gemm_with(&dx, m, &ws[i], &mut dy, o).map(|_| ()));
                        r.map_or("-".to_string(), |t| format!("{:.3}", t.us))
                    };
                    println!("pair {k} {n} {bits} {m} {} {}", t(true), t(false));
                    continue;
                }
                let mut res = Vec::new();
                for (name, o) in candidates(args.lite) {
                    let mut plan = String::new();
                    let t = timer.per_call(copies, &mut |i| {
                        plan = if e > 1 {
                            let gp = ctx.grouped_mma_with(&dx, &doff, m, &experts[i], &mut dy, o)?;
                            gp.map_or("no rows".into(), |g| format!("u{} {}", g.units, describe(&g.plan)))
                        } else {
                            describe(&ctx.mma_gemm_with(&dx, m, &ws[i], &mut dy, o)?)
                        };
                        Ok(())
                    });
                    // Options a shape cannot take (too many splits, ...) are skipped.
                    if let Ok(t) = t {
                        res.push((t.us, name, plan));
                    }
                }
                let Some(&(auto, _, _)) = res.first() else { continue };
                res.sort_by(|a, b| a.0.total_cmp(&b.0));
                println!(
                    "== {k}x{n}{} k={bits} M={m}: auto {auto:.2} µs",
                    if e > 1 { format!("x{e}") } else { String::new() }
                );
                let mut seen = HashSet::new();
                let show = if args.lite { 3 } else { 8 };
                for (us, name, plan) in res.iter().filter(|r| seen.insert(r.2.clone())).take(show) {
                    println!("  {us:7.2} {:+6.1} %  {name:14} {plan}", 100.0 * (us / auto - 1.0));
                }
            }
        }
    }
    Ok(())
}
