//! kbit-bench: per-M tables of kbit kernel times against cuBLAS fp16 on the
//! DESIGN shapes, cold L2, from CUDA-graph replay; or (`--dequant`) the
//! dequantize bandwidth and the dequant + GEMM path against fp16 GEMM.
//! Prints Markdown and writes JSON + Markdown under `bench-results/`.
//! `kbit-bench --help` lists the options; exit status 3 means no GPU.

mod cli;
mod data;
mod gemm;
mod report;
mod timing;
mod values;

use cli::{BenchShape, Options};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use kbit::{Context, Dtype, Element, Error, Kernel, Shape};
use report::{Json, Table, opt_us, ratio, us};
use std::process::exit;
use std::time::Instant;
use timing::{Measured, Settings, Timer};

/// Exit status when there is no GPU to measure (scripts/bench.sh relies on it).
const EXIT_NO_GPU: i32 = 3;

/// Standard deviation of the random weights (typical of LLM weights).
const WEIGHT_SIGMA: f32 = 0.02;

fn main() {
    let opts = match cli::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("kbit-bench: {msg}\n\n{}", cli::USAGE);
            exit(2);
        }
    };
    if opts.help {
        println!("{}", cli::USAGE);
        return;
    }
    // Loading the module is silent and, the first time on a machine, slow:
    // say so where there is a GPU to load it on.
    if Context::device_count().is_ok_and(|n| n > 0) {
        eprintln!(
            "kbit-bench: loading the kernels (the first run on a machine can take a minute: \
             the driver compiles the PTX for this GPU and caches the result)"
        );
    }
    let mut ctx = match Context::new(0) {
        Ok(ctx) => ctx,
        Err(Error::NoDevice(why)) => {
            println!("kbit-bench: no CUDA GPU found ({why}); nothing to measure");
            exit(EXIT_NO_GPU);
        }
        Err(e) => {
            eprintln!("kbit-bench: opening the GPU failed: {e}");
            exit(1);
        }
    };
    if opts.serial_launch {
        ctx.set_programmatic_launch(false);
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        eprintln!("kbit-bench: cuBLAS (libcublas.so) not found on the library path; it is needed for the baseline");
        exit(1);
    }
    let result = match opts.dtype {
        Dtype::Bf16 => run::<bf16>(&ctx, &opts),
        _ => run::<f16>(&ctx, &opts),
    };
    if let Err(e) = result {
        eprintln!("kbit-bench: {e}");
        exit(1);
    }
}

/// Compressed bytes one call streams: all experts, planes + scale bytes.
fn kbit_bytes(shape: &BenchShape, bits: u32) -> usize {
    shape.experts * Shape::new(shape.n, shape.k).map_or(0, |s| s.tiled_bytes(bits))
}

/// Bytes of the dense (2-byte) weights of one call.
fn dense_bytes(shape: &BenchShape) -> usize {
    shape.experts * shape.n * shape.k * 2
}

fn ideal(bits: u32) -> f64 {
    16.0 / (bits as f64 + 0.25)
}

fn label(shape: &BenchShape) -> String {
    if shape.experts > 1 { format!("{} ×{}", shape.name, shape.experts) } else { shape.name.clone() }
}

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

struct Bench<'a> {
    ctx: &'a Context,
    opts: &'a Options,
    gemm: gemm::DenseGemm,
    timer: Timer,
    copy_gbs: f64,
    rows: Vec<Json>,
    /// Name of the dense baseline column (fp16 or bf16).
    base: &'static str,
}

/// One JSON result row; `gbs` is `bytes / time` unless `moved` says otherwise.
fn json_row(
    m: Option<usize>,
    shape: &BenchShape,
    bits: u32,
    kernel: &str,
    t: &Measured,
    bytes: usize,
    moved: usize,
) -> Json {
    let us = t.us;
    let gbs = moved as f64 / us / 1e3;
    Json::Obj(vec![
        ("m", m.map_or(Json::Null, |m| Json::Int(m as i64))),
        ("shape", Json::str(&shape.name)),
        ("K", Json::Int(shape.k as i64)),
        ("N", Json::Int(shape.n as i64)),
        ("experts", Json::Int(shape.experts as i64)),
        ("k", Json::Int(bits as i64)),
        ("kernel", Json::str(kernel)),
        ("us", Json::Num(us)),
        ("weight_bytes", Json::Int(bytes as i64)),
        ("gbs", Json::Num(gbs)),
        ("calls_per_graph", Json::Int(t.calls as i64)),
        ("spread", Json::Num(t.spread)),
    ])
}

fn run<T: Element>(ctx: &Context, opts: &Options) -> kbit::Result<()> {
    let started = Instant::now();
    let settings = if opts.quick { Settings::QUICK } else { Settings::FULL };
    let info = ctx.info().clone();
    let (date, stamp) = report::now_utc();
    let commit = report::commit();
    let base = if T::DTYPE == Dtype::Bf16 { "bf16" } else { "fp16" };

    eprintln!("kbit-bench: {} — measuring the copy bandwidth", info.name);
    let copy_bytes = (1usize << 30).min(info.total_mem / 16);
    let copy_gbs = timing::copy_bandwidth(ctx.stream(), copy_bytes, 10)?;
    let method = format!(
        "{}. Cold L2: C distinct copies of each weight, C = 2·L2/bytes + 2 (1 when one call reads > 2× L2), \
         so the other copies stream > 2× L2 between two uses of one copy; the {base} baseline rotates its \
         weight copies the same way. Baseline: cuBLAS GemmEx ({} in/out, f32 compute); MoE rows (E experts \
         × M rows): kbit = E linear calls (grouped kernels when present), baseline = the faster of E GEMMs \
         and one strided-batched GEMM. Weights: random (σ = {WEIGHT_SIGMA}), NF-k codebook, quantized and \
         repacked on the GPU. Order: all weights are prepared first, then the tables are measured M by M \
         (all shapes and kernels of one M back to back), so small-M rows never follow large-M GEMMs, which \
         heat the GPU and lower its clock. Launches: {}. GB/s = compressed weight bytes / time (dequantize \
         rows: compressed bytes read + 2-byte elements written).",
        settings.describe(),
        T::DTYPE.name(),
        if ctx.programmatic_launch() {
            "GEMV and tensor-core GEMM kernels as programmatic dependents (a call's launch and prologue, \
             i.e. decode-table build and, for the GEMV, its first weight loads, overlap the previous call's \
             tail; it waits for that call before it reads activations; a launch whose blocks could crowd \
             an SM asks for shared memory that caps them at the even share), every other kernel after the \
             previous one completed"
        } else {
            "every kernel after the previous one completed (no programmatic dependent launch)"
        }
    );
    let list = |v: &[String]| v.join(",");
    let ks: Vec<String> = opts.bits.iter().map(|b| b.to_string()).collect();
    let ms: Vec<String> = opts.ms.iter().map(|m| m.to_string()).collect();
    let run_line = if opts.dequant {
        format!(
            "--dequant, k = {}, GEMM M = {}{}",
            list(&ks),
            opts.dequant_m,
            if opts.quick { ", --quick" } else { "" }
        )
    } else {
        format!(
            "M = {}, k = {}, {} experts per MoE row{}",
            list(&ms),
            list(&ks),
            list(&opts.experts.iter().map(|e| e.to_string()).collect::<Vec<_>>()),
            if opts.quick { ", --quick" } else { "" }
        )
    };
    let mut md = format!(
        "# kbit-bench — {}\n\n\
         - GPU: {}, sm_{}{}, {} SMs, L2 {:.1} MiB, {:.1} GiB\n\
         - commit {commit}, {stamp}\n\
         - copy bandwidth: **{copy_gbs:.0} GB/s** (cuMemcpyDtoD of {} MiB, (read + write bytes) / time, median of 10)\n\
         - activations and outputs: {}; weights: k-bit NF codes + one E4M4 scale byte per 32 (k + 0.25 bits per weight)\n\
         - method: {method}\n         - run: {run_line}\n",
        if opts.dequant { "dequantize" } else { "kernel tables" },
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.l2_bytes as f64 / (1 << 20) as f64,
        info.total_mem as f64 / (1u64 << 30) as f64,
        copy_bytes >> 20,
        T::DTYPE.name(),
    );
    print!("{md}");

    let stream = ctx.stream();
    let mut bench = Bench {
        ctx,
        opts,
        gemm: gemm::DenseGemm::new(stream)?,
        timer: Timer::new(stream, settings)?,
        copy_gbs,
        rows: Vec::new(),
        base,
    };
    let body = if opts.dequant { bench.dequant_mode::<T>()? } else { bench.tables::<T>()? };
    print!("\n{body}");
    md.push('\n');
    md.push_str(&body);

    let doc = Json::Obj(vec![
        ("gpu", Json::str(&info.name)),
        ("compute_capability", Json::str(format!("{}.{}", info.compute_capability.0, info.compute_capability.1))),
        ("sm_count", Json::Int(info.sm_count as i64)),
        ("commit", Json::str(&commit)),
        ("date", Json::str(&date)),
        ("time_utc", Json::str(&stamp)),
        ("copy_gbs", Json::Num(copy_gbs)),
        ("l2_bytes", Json::Int(info.l2_bytes as i64)),
        ("cold_l2", Json::Bool(true)),
        ("method", Json::str(&method)),
        ("mode", Json::str(if opts.dequant { "dequant" } else { "tables" })),
        ("dtype", Json::str(T::DTYPE.name())),
        ("quick", Json::Bool(opts.quick)),
        ("programmatic_launch", Json::Bool(ctx.programmatic_launch())),
        ("ms", Json::Arr(opts.ms.iter().map(|&m| Json::Int(m as i64)).collect())),
        ("ks", Json::Arr(opts.bits.iter().map(|&b| Json::Int(b as i64)).collect())),
        ("experts", Json::Int(opts.experts[0] as i64)),
        ("expert_counts", Json::Arr(opts.experts.iter().map(|&e| Json::Int(e as i64)).collect())),
        ("dequant_m", Json::Int(opts.dequant_m as i64)),
        ("rows", Json::Arr(std::mem::take(&mut bench.rows))),
    ]);
    let mut json = String::new();
    doc.write(&mut json);
    json.push('\n');
    let base_name = format!("{}-{}{}", report::slug(&info.name), date, if opts.dequant { "-dequant" } else { "" });
    let write = || -> std::io::Result<(std::path::PathBuf, std::path::PathBuf)> {
        std::fs::create_dir_all(&opts.out)?;
        let (j, m) = report::free_names(&opts.out, &base_name);
        std::fs::write(&j, &json)?;
        std::fs::write(&m, &md)?;
        Ok((j, m))
    };
    match write() {
        Ok((j, m)) => eprintln!(
            "kbit-bench: wrote {} and {} ({:.0} s)",
            j.display(),
            m.display(),
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            eprintln!("kbit-bench: writing results to {} failed: {e}", opts.out.display());
            exit(1);
        }
    }
    Ok(())
}

impl Bench<'_> {
    /// Per-call time of the dense baseline: one GEMM, or for MoE rows the
    /// faster of `experts` GEMMs and one strided-batched GEMM. `weights` are
    /// device pointers of the rotated copies.
    fn time_dense<T: Element>(
        &self,
        shape: &BenchShape,
        m: usize,
        weights: &[u64],
        x: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
    ) -> kbit::Result<(Measured, &'static str)> {
        let s = self.ctx.stream();
        let (k, n, e, dt) = (shape.k, shape.n, shape.experts, T::DTYPE);
        let xp = x.device_ptr(s).0;
        let yp = y.device_ptr_mut(s).0;
        let es = std::mem::size_of::<T>() as u64;
        let g = &self.gemm;
        // Safety (all calls): the copies hold e·n·k elements, x ≥ e·m·k, y ≥ e·m·n.
        let separate = self.timer.per_call(weights.len(), &mut |i| {
            for ex in 0..e as u64 {
                let (w, xe, ye) = (
                    weights[i] + ex * (n * k) as u64 * es,
                    xp + ex * (m * k) as u64 * es,
                    yp + ex * (m * n) as u64 * es,
                );
                unsafe { g.gemm(dt, m, n, k, w, xe, ye) }?;
            }
            Ok(())
        })?;
        if e == 1 {
            return Ok((separate, "gemm"));
        }
        let batched = self
            .timer
            .per_call(weights.len(), &mut |i| unsafe { g.gemm_batched(dt, e, m, n, k, weights[i], xp, yp) })?;
        Ok(if batched.us < separate.us { (batched, "batched") } else { (separate, "separate") })
    }

    /// Per-call time of one kbit kernel, or `None` where it does not exist
    /// or apply (detected through [`Context::force_kernel`] and
    /// [`Error::NotApplicable`]).
    fn time_kbit<T: Element>(
        &self,
        kernel: Kernel,
        shape: &BenchShape,
        m: usize,
        copies: &data::KbitCopies,
        x: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
    ) -> kbit::Result<Option<Measured>> {
        let ctx = self.ctx;
        // MoE rows: the grouped kernels, and dequant + cuBLAS, run as one
        // expert_linear call (the latter batched over the experts).
        let grouped = matches!(kernel, Kernel::GroupedScalar | Kernel::GroupedMma)
            || (kernel == Kernel::DequantCublas && shape.experts > 1);
        if grouped && shape.experts == 1 {
            return Ok(None); // grouped kernels serve MoE experts only
        }
        if !self.opts.kernels.contains(&kernel) {
            return Ok(None);
        }
        match ctx.force_kernel(Some(kernel)) {
            Ok(()) => {}
            Err(Error::NotApplicable { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
        let (k, n) = (shape.k, shape.n);
        let result = if grouped {
            // One expert-dispatch call over the experts, m rows each.
            let offsets = self.expert_offsets(shape, m)?;
            let rows = shape.experts * m;
            let (xv, mut yv) = (x.slice(0..rows * k), y.slice_mut(0..rows * n));
            self.timer.per_call(copies.experts.len(), &mut |i| {
                ctx.expert_linear(&xv, &offsets, m, &copies.experts[i], &mut yv)?;
                Ok(())
            })
        } else {
            self.timer.per_call(copies.copies.len(), &mut |i| {
                for (ex, w) in copies.copies[i].iter().enumerate() {
                    let xv = x.slice(ex * m * k..(ex + 1) * m * k);
                    let mut yv = y.slice_mut(ex * m * n..(ex + 1) * m * n);
                    ctx.linear(&xv, m, w, &mut yv)?;
                }
                Ok(())
            })
        };
        ctx.force_kernel(None)?;
        match result {
            Ok(t) => Ok(Some(t)),
            Err(Error::NotApplicable { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Device expert offsets for `shape.experts` experts of `m` rows each.
    fn expert_offsets(&self, shape: &BenchShape, m: usize) -> kbit::Result<CudaSlice<u32>> {
        let offsets: Vec<u32> = (0..=shape.experts as u32).map(|e| e * m as u32).collect();
        Ok(self.ctx.stream().clone_htod(&offsets)?)
    }

    /// The kernel automatic dispatch runs for this row (`linear`, or
    /// `expert_linear` for MoE rows), from one untimed call; `None` if the
    /// call fails.
    fn auto_kernel<T: Element>(
        &self,
        shape: &BenchShape,
        m: usize,
        copies: &data::KbitCopies,
        x: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
    ) -> Option<Kernel> {
        let ctx = self.ctx;
        ctx.force_kernel(None).ok()?;
        let (k, n) = (shape.k, shape.n);
        if shape.experts > 1 {
            let offsets = self.expert_offsets(shape, m).ok()?;
            let rows = shape.experts * m;
            let (xv, mut yv) = (x.slice(0..rows * k), y.slice_mut(0..rows * n));
            ctx.expert_linear(&xv, &offsets, m, copies.experts.first()?, &mut yv).ok()?;
        } else {
            let (xv, mut yv) = (x.slice(0..m * k), y.slice_mut(0..m * n));
            ctx.linear(&xv, m, copies.copies.first()?.first()?, &mut yv).ok()?;
        }
        ctx.last_kernel()
    }

    /// The per-M tables (the default mode).
    fn tables<T: Element>(&mut self) -> kbit::Result<String> {
        let opts = self.opts;
        let ctx = self.ctx;
        let s = ctx.stream();
        let shapes = opts.shapes();
        let (ms, bits) = (&opts.ms, &opts.bits);
        let max_m = *ms.iter().max().unwrap_or(&1);
        let (ns, nb, nm) = (shapes.len(), bits.len(), ms.len());
        // kbit[(si·nb + bi)·nm + mi][kernel], dense[si·nm + mi]
        let mut kbit = vec![[None::<f64>; 5]; ns * nb * nm];
        // The kernel automatic dispatch picks, same index.
        let mut auto = vec![None::<Kernel>; ns * nb * nm];
        let mut dense = vec![None::<f64>; ns * nm];
        // Everything is prepared first (weights, their rotation copies,
        // activations), then measured M by M: the rows of one M table are
        // taken back to back, so a small-M row never follows minutes of
        // large-M GEMMs. Those heat the GPU and lower its clock, which slows
        // instruction-bound kernels (the scalar GEMV) far more than the
        // bandwidth-bound fp16 baseline.
        struct Prepared<T> {
            x: CudaSlice<T>,
            y: CudaSlice<T>,
            dense: Vec<CudaSlice<T>>,
            kbit: Vec<data::KbitCopies>,
        }
        let mut prepared = Vec::with_capacity(ns);
        for (si, shape) in shapes.iter().enumerate() {
            let t0 = Instant::now();
            let e = shape.experts;
            let numel = shape.n * shape.k;
            let src = s.clone_htod(&values::random::<T>(e * numel, seed_of(&shape.name), WEIGHT_SIGMA))?;
            let x = s.clone_htod(&values::random::<T>(max_m * e * shape.k, seed_of(&shape.name) ^ 1, 1.0))?;
            let y = s.alloc_zeros::<T>(max_m * e * shape.n)?;
            let ncopies = data::copies_for(dense_bytes(shape), ctx.info().l2_bytes);
            let mut dense = data::dense_copies(s, &src, ncopies)?;
            let kbit =
                bits.iter().map(|&b| data::kbit_copies(ctx, &src, shape, b, 0)).collect::<Result<Vec<_>, _>>()?;
            dense.insert(0, src);
            eprintln!(
                "[prepare {:>2}/{ns}] {:<14} fp16 {} copies × {:.1} MB, {} ({:.1} s)",
                si + 1,
                label(shape),
                dense.len(),
                dense_bytes(shape) as f64 / 1e6,
                bits.iter()
                    .zip(&kbit)
                    .map(|(b, c)| format!("k={b} {} × {:.2} MB", c.copies.len(), c.bytes_per_call as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(", "),
                t0.elapsed().as_secs_f64()
            );
            prepared.push(Prepared { x, y, dense, kbit });
        }

        for (mi, &m) in ms.iter().enumerate() {
            let t0 = Instant::now();
            for (si, shape) in shapes.iter().enumerate() {
                let p = &mut prepared[si];
                let ptrs: Vec<u64> = p.dense.iter().map(|c| c.device_ptr(s).0).collect();
                let (t, variant) = self.time_dense(shape, m, &ptrs, &p.x, &mut p.y)?;
                dense[si * nm + mi] = Some(t.us);
                let db = dense_bytes(shape);
                let mut row = json_row(Some(m), shape, 16, "fp16", &t, db, db);
                if let Json::Obj(f) = &mut row {
                    f.push(("variant", Json::str(variant)));
                    f.push(("dtype", Json::str(T::DTYPE.name())));
                }
                self.rows.push(row);
                for (bi, &b) in bits.iter().enumerate() {
                    let copies = &p.kbit[bi];
                    let picked = self.auto_kernel(shape, m, copies, &p.x, &mut p.y);
                    auto[(si * nb + bi) * nm + mi] = picked;
                    for (ki, &kernel) in Kernel::ALL.iter().enumerate() {
                        let t = self.time_kbit(kernel, shape, m, copies, &p.x, &mut p.y)?;
                        kbit[(si * nb + bi) * nm + mi][ki] = t.map(|t| t.us);
                        if let Some(t) = t {
                            let bytes = copies.bytes_per_call;
                            let mut row = json_row(Some(m), shape, b, kernel.name(), &t, bytes, bytes);
                            if let Json::Obj(f) = &mut row {
                                f.push(("auto", Json::Bool(picked == Some(kernel))));
                            }
                            self.rows.push(row);
                        }
                    }
                }
            }
            eprintln!("[M {:>2}/{nm}] M = {m}: {ns} shapes measured ({:.1} s)", mi + 1, t0.elapsed().as_secs_f64());
        }

        let results = Results {
            shapes: &shapes,
            ms,
            bits,
            kbit: &kbit,
            auto: &auto,
            dense: &dense,
            base: self.base,
            copy_gbs: self.copy_gbs,
        };
        Ok(results.render())
    }

    /// `--dequant`: dequantize bandwidth, and dequant + GEMM vs fp16 GEMM.
    fn dequant_mode<T: Element>(&mut self) -> kbit::Result<String> {
        let opts = self.opts;
        let ctx = self.ctx;
        let s = ctx.stream();
        let dm = opts.dequant_m;
        let mut shapes: Vec<BenchShape> = cli::design_shapes(1)
            .into_iter()
            .filter(|sh| opts.only.as_ref().is_none_or(|o| o.contains(&sh.name)))
            .collect();
        for extra in
            std::iter::once(cli::extra_shape("llama70b").expect("known shape")).chain(opts.extra.iter().cloned())
        {
            if !shapes.iter().any(|sh| sh.k == extra.k && sh.n == extra.n) {
                shapes.push(extra);
            }
        }
        let mut table = Table::new(
            &[
                "shape",
                "K×N",
                "k",
                "dequant µs",
                "GB/s",
                "% copy",
                &format!("{} GEMM µs", self.base),
                "dequant+GEMM µs",
                &format!("{}/total", self.base),
                "linear µs",
                &format!("{}/linear", self.base),
            ],
            2,
        );
        let total_steps = shapes.len() * (opts.bits.len() + 1);
        let mut step = 0;
        for shape in &shapes {
            let t0 = Instant::now();
            let numel = shape.n * shape.k;
            let src = s.clone_htod(&values::random::<T>(numel, seed_of(&shape.name), WEIGHT_SIGMA))?;
            let x = s.clone_htod(&values::random::<T>(dm * shape.k, seed_of(&shape.name) ^ 1, 1.0))?;
            let mut y = s.alloc_zeros::<T>(dm * shape.n)?;
            let ncopies = data::copies_for(dense_bytes(shape), ctx.info().l2_bytes);
            let extra = data::dense_copies(s, &src, ncopies)?;
            let ptrs: Vec<u64> = std::iter::once(&src).chain(&extra).map(|c| c.device_ptr(s).0).collect();
            let (gemm, _) = self.time_dense(shape, dm, &ptrs, &x, &mut y)?;
            let gemm_us = gemm.us;
            drop(extra);
            let db = dense_bytes(shape);
            self.rows.push(json_row(Some(dm), shape, 16, "fp16", &gemm, db, db));
            step += 1;
            eprintln!(
                "[{step:>3}/{total_steps}] {:<14} {} GEMM M={dm} ({:.1} s)",
                shape.name,
                self.base,
                t0.elapsed().as_secs_f64()
            );

            for &b in &opts.bits {
                let t0 = Instant::now();
                let out_bytes = numel * std::mem::size_of::<T>();
                let copies = data::kbit_copies(ctx, &src, shape, b, out_bytes)?;
                let mut outs =
                    (0..copies.copies.len()).map(|_| s.alloc_zeros::<T>(numel)).collect::<Result<Vec<_>, _>>()?;
                let dq = self
                    .timer
                    .per_call(copies.copies.len(), &mut |i| ctx.dequantize(&copies.copies[i][0], &mut outs[i]))?;
                drop(outs);
                let moved = copies.bytes_per_call + out_bytes;
                let dq_gbs = moved as f64 / dq.us / 1e3;
                self.rows.push(json_row(None, shape, b, "dequant", &dq, copies.bytes_per_call, moved));

                ctx.force_kernel(Some(Kernel::DequantCublas))?;
                let lin = self
                    .timer
                    .per_call(copies.copies.len(), &mut |i| ctx.linear(&x, dm, &copies.copies[i][0], &mut y).map(drop));
                ctx.force_kernel(None)?;
                let lin = lin?;
                let kb = copies.bytes_per_call;
                self.rows.push(json_row(Some(dm), shape, b, Kernel::DequantCublas.name(), &lin, kb, kb));

                let total = dq.us + gemm_us;
                table.row(vec![
                    shape.name.clone(),
                    format!("{}×{}", shape.k, shape.n),
                    b.to_string(),
                    us(dq.us),
                    format!("{dq_gbs:.0}"),
                    format!("{:.0}%", 100.0 * dq_gbs / self.copy_gbs),
                    us(gemm_us),
                    us(total),
                    ratio(gemm_us / total),
                    us(lin.us),
                    ratio(gemm_us / lin.us),
                ]);
                step += 1;
                eprintln!(
                    "[{step:>3}/{total_steps}] {:<14} k={b}: {} copies ({:.1} s)",
                    shape.name,
                    copies.copies.len(),
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        Ok(format!(
            "## Dequantize (runtime layout → {dt}) and dequant + GEMM at M = {dm}\n\n\
             dequant GB/s counts compressed bytes read + {dt} bytes written; dequant+GEMM = dequant µs + {base} GEMM µs; \
             linear = `linear` forced to dequant_cublas, measured (its GEMM reads the dequantized weight partly from L2). \
             moe shapes as one matrix.\n\n{}",
            table.render(),
            dt = T::DTYPE.name(),
            base = self.base,
        ))
    }
}

/// Times of the table mode, indexed `kbit[(si·nb + bi)·nm + mi][kernel]` and
/// `dense[si·nm + mi]` (shape si, bit width bi, M index mi), with the kernel
/// automatic dispatch picks (`auto`, indexed as `kbit`), as Markdown: one
/// table per M, then a summary of the TOTAL rows.
struct Results<'a> {
    shapes: &'a [BenchShape],
    ms: &'a [usize],
    bits: &'a [u32],
    kbit: &'a [[Option<f64>; 5]],
    auto: &'a [Option<Kernel>],
    dense: &'a [Option<f64>],
    base: &'a str,
    copy_gbs: f64,
}

impl Results<'_> {
    fn render(&self) -> String {
        let Results { shapes, ms, bits, kbit, auto, dense, base, copy_gbs } = *self;
        let (ns, nb, nm, nk) = (shapes.len(), bits.len(), ms.len(), Kernel::ALL.len());
        let mut out = String::new();
        let vs_base = format!("vs {}", base);
        let mut header: Vec<&str> = vec!["shape", "K×N", "k"];
        header.extend(Kernel::ALL.iter().map(|k| k.name()));
        header.extend([base, "Best", "best kernel", vs_base.as_str(), "ideal", "GB/s", "% copy", "auto"]);
        let mut summary: Vec<Vec<String>> = Vec::new();
        for (mi, &m) in ms.iter().enumerate() {
            let mut table = Table::new(&header, 2).left(header.iter().position(|h| *h == "best kernel").unwrap_or(0));
            let mut summary_row = vec![m.to_string()];
            for (bi, &b) in bits.iter().enumerate() {
                let cells = |si: usize| &kbit[(si * nb + bi) * nm + mi];
                let best = |si: usize| {
                    cells(si)
                        .iter()
                        .enumerate()
                        .filter_map(|(ki, t)| t.map(|t| (t, Kernel::ALL[ki])))
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                };
                // Automatic dispatch: its kernel and that kernel's time.
                let picked = |si: usize| auto[(si * nb + bi) * nm + mi];
                let picked_us = |si: usize| {
                    let k = picked(si)?;
                    cells(si)[Kernel::ALL.iter().position(|&x| x == k)?]
                };
                let auto_cell = |si: usize| match (picked(si), picked_us(si), best(si)) {
                    (Some(k), Some(t), Some((bt, _))) if t > 1.03 * bt => {
                        format!("{} (+{:.0}%)", k.name(), 100.0 * (t / bt - 1.0))
                    }
                    (Some(k), _, _) => k.name().to_string(),
                    _ => "-".into(),
                };
                let mut line = |name: String,
                                kxn: String,
                                times: Vec<Option<f64>>,
                                base: Option<f64>,
                                best: Option<(f64, String)>,
                                bytes: usize,
                                auto: String| {
                    let mut row = vec![name, kxn, b.to_string()];
                    row.extend(times.iter().map(|t| opt_us(*t)));
                    row.push(opt_us(base));
                    row.push(best.as_ref().map_or("-".into(), |b| us(b.0)));
                    row.push(best.as_ref().map_or("-".into(), |b| b.1.clone()));
                    let vs = best.as_ref().zip(base).map(|(b, f)| f / b.0);
                    row.push(vs.map_or("-".into(), ratio));
                    row.push(ratio(ideal(b)));
                    let gbs = best.as_ref().map(|b| bytes as f64 / b.0 / 1e3);
                    row.push(gbs.map_or("-".into(), |g| format!("{g:.0}")));
                    row.push(gbs.map_or("-".into(), |g| format!("{:.0}%", 100.0 * g / copy_gbs)));
                    row.push(auto);
                    table.row(row);
                    vs
                };
                let design: Vec<usize> = (0..ns).filter(|&si| shapes[si].design).collect();
                for &si in &design {
                    let sh = &shapes[si];
                    let best = best(si).map(|(t, k)| (t, k.name().to_string()));
                    line(
                        label(sh),
                        format!("{}×{}", sh.k, sh.n),
                        cells(si).to_vec(),
                        dense[si * nm + mi],
                        best,
                        kbit_bytes(sh, b),
                        auto_cell(si),
                    );
                }
                if !design.is_empty() {
                    // TOTAL: one transformer block (the design shapes), sums of times.
                    let sum = |f: &dyn Fn(usize) -> Option<f64>| design.iter().map(|&si| f(si)).sum::<Option<f64>>();
                    let times: Vec<Option<f64>> = (0..nk).map(|ki| sum(&|si| cells(si)[ki])).collect();
                    let base = sum(&|si| dense[si * nm + mi]);
                    let best_total = sum(&|si| best(si).map(|b| b.0));
                    let bytes = design.iter().map(|&si| kbit_bytes(&shapes[si], b)).sum();
                    let name = if design.len() == 7 {
                        "**TOTAL** (block)".to_string()
                    } else {
                        format!("**TOTAL** ({} shapes)", design.len())
                    };
                    // The block as automatic dispatch runs it.
                    let auto_total = sum(&picked_us).map_or("-".into(), |t| format!("Σ {}", us(t)));
                    let best_total_cell = best_total.map(|t| (t, "sum of best".into()));
                    let vs = line(name, String::new(), times, base, best_total_cell, bytes, auto_total);
                    summary_row.push(match (vs, best_total, base) {
                        (Some(v), Some(bt), Some(f)) => format!("{} ({} / {} µs)", ratio(v), us(bt), us(f)),
                        _ => "-".into(),
                    });
                }
                for si in (0..ns).filter(|&si| !shapes[si].design) {
                    let sh = &shapes[si];
                    let best = best(si).map(|(t, k)| (t, k.name().to_string()));
                    line(
                        label(sh),
                        format!("{}×{}", sh.k, sh.n),
                        cells(si).to_vec(),
                        dense[si * nm + mi],
                        best,
                        kbit_bytes(sh, b),
                        auto_cell(si),
                    );
                }
            }
            summary.push(summary_row);
            out.push_str(&format!(
                "## M = {m}\n\nµs per call{}; `-`: kernel not in this build or not applicable. auto: the kernel \
                 automatic dispatch (`linear`; MoE rows `expert_linear`) runs, with how much slower than Best it is \
                 when that is over 3 %; on the TOTAL row the block's time with it.\n\n{}\n",
                if shapes.iter().any(|s| s.experts > 1) { " (moe rows: all experts, M rows each)" } else { "" },
                table.render()
            ));
        }
        if shapes.iter().any(|s| s.design) {
            let mut head: Vec<String> = vec!["M".into()];
            head.extend(bits.iter().map(|b| format!("k={b}: vs {} (Best / {} µs)", base, base)));
            let head_refs: Vec<&str> = head.iter().map(|s| s.as_str()).collect();
            let mut t = Table::new(&head_refs, 0);
            for r in summary {
                t.row(r);
            }
            out.push_str(&format!(
                "## Summary: TOTAL of the design shapes (one transformer block) per M\n\nIdeal: {}.\n\n{}",
                bits.iter().map(|&b| format!("k={b} {}", ratio(ideal(b)))).collect::<Vec<_>>().join(", "),
                t.render()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trimmed cells of the table rows in `text` whose first cell is `name`.
    fn rows<'a>(text: &'a str, name: &str) -> Vec<Vec<&'a str>> {
        text.lines()
            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
            .filter(|c| c.len() > 2 && c[1] == name)
            .map(|c| c[1..c.len() - 1].to_vec())
            .collect()
    }

    #[test]
    fn tables_render_with_totals_and_dashes() {
        let mut shapes = cli::design_shapes(8);
        shapes.push(cli::extra_shape("llama8b").unwrap());
        let (ms, bits) = (vec![1, 16], vec![2, 4]);
        let (ns, nb, nm) = (shapes.len(), bits.len(), ms.len());
        // dequant_cublas everywhere at 10 µs, mma only for M = 16 at 5 µs.
        let mut kbit = vec![[None; 5]; ns * nb * nm];
        for (i, cell) in kbit.iter_mut().enumerate() {
            cell[2] = Some(10.0);
            if i % nm == 1 {
                cell[1] = Some(5.0);
            }
        }
        let dense = vec![Some(20.0); ns * nm];
        // Automatic dispatch picks dequant_cublas everywhere, except on the
        // extra shape, where it reports nothing.
        let mut auto = vec![Some(Kernel::DequantCublas); ns * nb * nm];
        for a in &mut auto[(ns - 1) * nb * nm..] {
            *a = None;
        }
        let results = Results {
            shapes: &shapes,
            ms: &ms,
            bits: &bits,
            kbit: &kbit,
            auto: &auto,
            dense: &dense,
            base: "fp16",
            copy_gbs: 3000.0,
        };
        let out = results.render();
        let (m1, rest) = out.split_once("## M = 16").unwrap();
        let (m16, summary) = rest.split_once("## Summary").unwrap();
        assert!(m1.starts_with("## M = 1\n"), "{out}");

        // shape | K×N | k | scalar | mma | dequant_cublas | grouped_scalar | grouped_mma | fp16 | Best | best kernel | vs | ideal | GB/s | % | auto
        let gateup = rows(m1, "gateup");
        assert_eq!(gateup.len(), 2); // k = 2 and k = 4
        let gbs = format!("{:.0}", kbit_bytes(&shapes[0], 2) as f64 / 10.0 / 1e3);
        let pct = format!("{:.0}%", kbit_bytes(&shapes[0], 2) as f64 / 10.0 / 1e3 / 3000.0 * 100.0);
        let want = [
            "gateup",
            "2048×5120",
            "2",
            "-",
            "-",
            "10.0",
            "-",
            "-",
            "20.0",
            "10.0",
            "dequant_cublas",
            "2.00×",
            "7.11×",
        ];
        assert_eq!(gateup[0][..13], want);
        assert_eq!((gateup[0][13], gateup[0][14]), (gbs.as_str(), pct.as_str()));
        assert_eq!(gateup[0][15], "dequant_cublas");
        assert_eq!(rows(m1, "moe_gu ×8").len(), 2);

        // TOTAL of the 7 design shapes: 70 µs vs 140 µs; the extra shape follows it.
        let totals = rows(m1, "**TOTAL** (block)");
        assert_eq!(totals.len(), 2);
        assert_eq!(totals[0][5..13], ["70.0", "-", "-", "140.0", "70.0", "sum of best", "2.00×", "7.11×"]);
        let lines: Vec<&str> = m1.lines().collect();
        let at = lines.iter().position(|l| l.contains("**TOTAL**")).unwrap();
        assert!(lines[at + 1].starts_with("| llama8b "), "{m1}");
        assert_eq!(totals[0][15], "Σ 70.0");
        assert_eq!(rows(m1, "llama8b")[0][15], "-");

        // M = 16: mma wins at 5 µs.
        let kv = rows(m16, "kv");
        assert_eq!(kv[0][4..12], ["5.00", "10.0", "-", "-", "20.0", "5.00", "mma", "4.00×"]);
        // Automatic dispatch 100 % over the best there, in every row and in
        // the block's sum.
        assert_eq!(kv[0][15], "dequant_cublas (+100%)");
        assert_eq!(rows(m16, "**TOTAL** (block)")[0][15], "Σ 70.0");

        // The summary: one row per M, one column per k.
        assert_eq!(rows(summary, "1"), [["1", "2.00× (70.0 / 140.0 µs)", "2.00× (70.0 / 140.0 µs)"]]);
        assert_eq!(rows(summary, "16"), [["16", "4.00× (35.0 / 140.0 µs)", "4.00× (35.0 / 140.0 µs)"]]);
    }
}
