//! GPU time per call from CUDA-graph replay, and the device's copy bandwidth.
//!
//! Eager launches of a 2-10 µs kernel measure the CPU's launch rate, not the
//! GPU. So `calls` back-to-back calls are captured into one CUDA graph
//! (call `j` uses weight copy `j % copies`), the graph is replayed with
//! events recorded around each replay, and a replay's time divided by
//! `calls` is one sample; the median of `repeats` samples is reported.
//! Self-contained (cudarc + kbit only) so that `benches/kernels.rs` shares it.

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode, cudaError_enum};
use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, DriverError};
use std::sync::Arc;

/// How hard to measure.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Timed replays; the median is reported.
    pub repeats: usize,
    /// Untimed replays before the timed ones.
    pub warmup: usize,
    /// Shortest replay (ms): the number of calls per graph grows until a
    /// replay lasts this long, so launch latency and event resolution
    /// (≈ 0.5 µs) stay below 1 %.
    pub min_replay_ms: f64,
    /// Fewest calls per graph.
    pub min_calls: usize,
    /// Most calls per graph (bounds capture and instantiation time).
    pub max_calls: usize,
}

impl Settings {
    /// The full measurement.
    pub const FULL: Settings = Settings { repeats: 7, warmup: 2, min_replay_ms: 2.0, min_calls: 32, max_calls: 4096 };
    /// `--quick`.
    pub const QUICK: Settings = Settings { repeats: 3, warmup: 1, min_replay_ms: 0.5, min_calls: 16, max_calls: 2048 };

    /// One line for report headers.
    pub fn describe(&self) -> String {
        format!(
            "per-call GPU time from CUDA-graph replay: R back-to-back calls captured into one graph \
             (call j uses weight copy j mod C; R a multiple of C, at least {}, grown until one replay lasts \
             ≥ {} ms, at most ≈{}), {} untimed replay(s), then {} timed replays with CUDA events around each; \
             time = median replay time / R",
            self.min_calls, self.min_replay_ms, self.max_calls, self.warmup, self.repeats
        )
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Median GPU time per call, µs.
    pub us: f64,
    /// Calls per graph replay.
    pub calls: usize,
    /// (max − min) / median of the per-call samples.
    pub spread: f64,
}

/// Times enqueued work on one stream with reusable events.
pub struct Timer {
    stream: Arc<CudaStream>,
    events: Vec<(CudaEvent, CudaEvent)>,
    /// The settings in force.
    pub settings: Settings,
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

impl Timer {
    /// Events for `settings.repeats` timed replays (plus a pilot).
    pub fn new(stream: &Arc<CudaStream>, settings: Settings) -> Result<Self, DriverError> {
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let ctx = stream.context();
        let events = (0..settings.repeats.max(1))
            .map(|_| Ok((ctx.new_event(timing)?, ctx.new_event(timing)?)))
            .collect::<Result<Vec<_>, DriverError>>()?;
        Ok(Self { stream: stream.clone(), events, settings })
    }

    /// Median GPU time of one `call(i)` (which enqueues work using weight
    /// copy `i`, `0 ≤ i < copies`) on the timer's stream.
    ///
    /// Every copy is first called once eagerly (warm-up: lazy set-up,
    /// module loading, and the place where an inapplicable kernel reports
    /// itself: its error is returned as is). Nothing may allocate or
    /// synchronize inside `call` once warmed up, since it is then captured.
    pub fn per_call(&self, copies: usize, call: &mut dyn FnMut(usize) -> kbit::Result<()>) -> kbit::Result<Measured> {
        let copies = copies.max(1);
        for i in 0..copies {
            call(i)?;
        }
        self.stream.synchronize()?;

        let s = &self.settings;
        let mut calls = round_up(s.min_calls.max(copies), copies);
        let mut graph = self.capture(calls, copies, call)?;
        graph.upload()?;
        graph.launch()?;
        // Pilot: grow the graph until one replay lasts min_replay_ms.
        let pilot_ms = self.time_replay(&graph)?;
        if pilot_ms < s.min_replay_ms && calls < s.max_calls {
            let want = (calls as f64 * s.min_replay_ms / pilot_ms.max(1e-4)).ceil() as usize;
            let grown = round_up(want.min(s.max_calls).max(calls), copies);
            if grown > calls {
                calls = grown;
                drop(graph);
                graph = self.capture(calls, copies, call)?;
                graph.upload()?;
            }
        }
        for _ in 0..s.warmup {
            graph.launch()?;
        }
        let timed = &self.events[..s.repeats.max(1)];
        for (start, end) in timed {
            start.record(&self.stream)?;
            graph.launch()?;
            end.record(&self.stream)?;
        }
        self.stream.synchronize()?;
        let mut per_call = timed
            .iter()
            .map(|(a, b)| Ok(a.elapsed_ms(b)? as f64 * 1e3 / calls as f64))
            .collect::<Result<Vec<f64>, DriverError>>()?;
        let med = median(&mut per_call);
        let spread = (per_call[per_call.len() - 1] - per_call[0]) / med.max(1e-9);
        Ok(Measured { us: med, calls, spread })
    }

    /// One timed replay, ms.
    fn time_replay(&self, graph: &CudaGraph) -> Result<f64, DriverError> {
        let (start, end) = &self.events[0];
        start.record(&self.stream)?;
        graph.launch()?;
        end.record(&self.stream)?;
        Ok(start.elapsed_ms(end)? as f64)
    }

    fn capture(
        &self,
        calls: usize,
        copies: usize,
        call: &mut dyn FnMut(usize) -> kbit::Result<()>,
    ) -> kbit::Result<CudaGraph> {
        capture(&self.stream, calls, copies, call)
    }
}

/// Captures `calls` calls (call `j` gets copy `j % copies`) on `stream`
/// into an instantiated graph. Whatever happens, the capture is ended so
/// the stream stays usable.
pub fn capture(
    stream: &Arc<CudaStream>,
    calls: usize,
    copies: usize,
    call: &mut dyn FnMut(usize) -> kbit::Result<()>,
) -> kbit::Result<CudaGraph> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut status = Ok(());
    for j in 0..calls {
        status = call(j % copies.max(1));
        if status.is_err() {
            break;
        }
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    status?;
    graph?.ok_or(kbit::Error::Driver(DriverError(cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)))
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written per
/// second), from `cuMemcpyDtoDAsync` of `bytes` bytes: median of `repeats`
/// copies timed with events, after 2 untimed ones.
pub fn copy_bandwidth(stream: &Arc<CudaStream>, bytes: usize, repeats: usize) -> Result<f64, DriverError> {
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    for _ in 0..2 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    let ctx = stream.context();
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let events = (0..repeats.max(1))
        .map(|_| Ok((ctx.new_event(timing)?, ctx.new_event(timing)?)))
        .collect::<Result<Vec<_>, DriverError>>()?;
    for (start, end) in &events {
        start.record(stream)?;
        stream.memcpy_dtod(&src, &mut dst)?;
        end.record(stream)?;
    }
    stream.synchronize()?;
    let mut ms = events.iter().map(|(a, b)| Ok(a.elapsed_ms(b)? as f64)).collect::<Result<Vec<f64>, DriverError>>()?;
    let med = median(&mut ms);
    Ok(2.0 * bytes as f64 / (med * 1e-3) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_median() {
        assert_eq!(round_up(32, 341), 341);
        assert_eq!(round_up(700, 341), 1023);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
