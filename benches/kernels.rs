//! Criterion micro-benchmarks, one per kernel in this build:
//!
//! - `dequantize/gateup_k4_f16`: runtime layout → f16, W [5120, 2048], k = 4
//! - `linear/dequant_cublas_gateup_k4_m64`: `linear` forced to dequant + cuBLAS, M = 64
//!
//! GPU time, not launch rate: each criterion iteration replays a CUDA graph
//! of `calls` back-to-back calls (rotating over weight copies whose total
//! exceeds 2× L2, so weights come from DRAM) between two CUDA events, and
//! reports the elapsed time divided by `calls`. Throughput is the compressed
//! weight bytes per call, so criterion prints GB/s. Without a GPU it prints
//! one line and measures nothing. `kbit-bench` is the full benchmark.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaGraph, CudaSlice};
use half::f16;
use kbit::{Codebook, Context, Error, KbitWeight, Kernel, ScaleMode, Shape};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use std::time::Duration;

// Shared with kbit-bench (only `capture` is used here).
#[allow(dead_code, unused_imports)]
#[path = "../src/bin/kbit-bench/timing.rs"]
mod timing;

/// Fewest calls per graph: enough that a replay lasts well over its launch latency.
const MIN_CALLS: usize = 64;

fn gpu() -> Option<Context> {
    match Context::new(0) {
        Ok(ctx) => Some(ctx),
        Err(Error::NoDevice(why)) => {
            println!("kernels bench: no CUDA GPU found ({why}); nothing to measure");
            None
        }
        Err(e) => panic!("opening the GPU failed: {e}"),
    }
}

/// `copies` copies of a random W [N, K] quantized to k bits on the GPU.
fn weights(ctx: &Context, shape: Shape, bits: u32) -> Vec<KbitWeight> {
    let mut rng = SmallRng::seed_from_u64(0x6b62_6974);
    let host: Vec<f16> = (0..shape.numel()).map(|_| f16::from_f32(rng.random_range(-0.05f32..0.05))).collect();
    let src = ctx.stream().clone_htod(&host).unwrap();
    let flat = ctx.quantize(&src, shape, &Codebook::nf(bits).unwrap()).unwrap();
    let bytes = shape.tiled_bytes(bits);
    let copies = 2 * ctx.info().l2_bytes / bytes + 2;
    let w = (0..copies).map(|_| ctx.repack(&flat, ScaleMode::Strict).unwrap()).collect();
    ctx.synchronize().unwrap();
    w
}

/// Per-call GPU time of `graph` (of `calls` calls) for `iters` replays.
fn replay(ctx: &Context, (graph, calls): &(CudaGraph, usize), iters: u64) -> Duration {
    let s = ctx.stream();
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = s.record_event(timing).unwrap();
    for _ in 0..iters {
        graph.launch().unwrap();
    }
    let end = s.record_event(timing).unwrap();
    let ms = start.elapsed_ms(&end).unwrap() as f64;
    Duration::from_secs_f64(ms * 1e-3 / *calls as f64)
}

/// Warms up every copy eagerly, then captures a whole number of rotations
/// of at least `MIN_CALLS` calls; returns the graph and its call count.
fn graph_of(ctx: &Context, copies: usize, call: &mut dyn FnMut(usize) -> kbit::Result<()>) -> (CudaGraph, usize) {
    for i in 0..copies {
        call(i).unwrap();
    }
    ctx.synchronize().unwrap();
    let calls = MIN_CALLS.div_ceil(copies) * copies;
    let graph = timing::capture(ctx.stream(), calls, copies, call).unwrap();
    graph.upload().unwrap();
    (graph, calls)
}

fn kernels(c: &mut Criterion) {
    let Some(ctx) = gpu() else { return };
    let shape = Shape::new(5120, 2048).unwrap(); // gateup
    let bits = 4;
    let w = weights(&ctx, shape, bits);
    let copies = w.len();
    let mut group = c.benchmark_group("kbit");
    group.throughput(Throughput::Bytes(shape.tiled_bytes(bits) as u64));

    // Dequantize (tiled → f16), one output buffer per copy.
    let mut outs: Vec<CudaSlice<f16>> = (0..copies).map(|_| ctx.stream().alloc_zeros(shape.numel()).unwrap()).collect();
    let graph = graph_of(&ctx, copies, &mut |i| ctx.dequantize(&w[i], &mut outs[i]));
    group.bench_function("dequantize/gateup_k4_f16", |b| b.iter_custom(|iters| replay(&ctx, &graph, iters)));
    drop(graph);
    drop(outs);

    // linear, dequant + cuBLAS, M = 64.
    let m = 64;
    let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.5); m * shape.k]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(m * shape.n).unwrap();
    ctx.force_kernel(Some(Kernel::DequantCublas)).unwrap();
    let graph = graph_of(&ctx, copies, &mut |i| ctx.linear(&x, m, &w[i], &mut y).map(drop));
    group.bench_function("linear/dequant_cublas_gateup_k4_m64", |b| b.iter_custom(|iters| replay(&ctx, &graph, iters)));
    ctx.force_kernel(None).unwrap();
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = kernels
}
criterion_main!(benches);
