//! `expert_linear`: the MoE matmul over all active experts in one call, and
//! its dispatch.
//!
//! ```text
//! max_m = 1, or max_m = 2..4 (4: k ≥ 3) with < 32 experts with rows
//!                  grouped scalar GEMV (kernel 4): one launch over all experts
//!                  (max_m = 3, 4, and 2 at k ≤ 4, with K ≥ 512 where kernel 5
//!                  runs its K-slot plan: kernel 5)
//! max_m ≤ 64       grouped tensor-core GEMM (kernel 5): one launch over all experts
//! max_m > 64       dequant + cuBLAS: grouped dequantize of the active experts
//!                  → gather x into [E, max_m, K] (zero rows past each expert's
//!                  count) → one strided-batched GEMM → scatter back to y
//! ```
//!
//! The crossovers are measured (H100, 8 to 64 experts of 2048×512 and
//! 512×2048, `bench-results/NOTES.md`): the tensor-core kernel's K-slot
//! plan (one K tile per slot of a block, 2048×512) is ahead of the GEMV
//! from max_m = 2 (k ≤ 4); without it (512×2048) the GEMV is, up to
//! max_m = 4 (there from k = 3). At max_m = 1 the GEMV always is, and at
//! max_m = 2..4 while fewer than 32 experts can have rows
//! (`min(experts, total rows)`: the GEMV's time grows with the experts it
//! reads, the tensor-core kernel's, latency-bound at 8 experts, much less);
//! the tensor-core kernel beats dequant + cuBLAS up to 64 rows.
//! Activations that are not 16-byte aligned, which the grouped kernels
//! cannot read, take the cuBLAS path.
//!
//! Neither path reads `expert_offsets` on the host: row counts stay on the
//! device and `max_m` (≥ every expert's rows) sizes the launches, so a call
//! never waits for the GPU and can be captured in a CUDA graph. An expert
//! with more rows than `max_m` is reported by [`Context::synchronize`]
//! ([`Error::ExpertRows`]) on every path.

use crate::context::STATUS_EXPERT_ROWS;
use crate::cublas_gemm::RowMajorGemm;
use crate::device::dptr;
use crate::{Context, Dtype, Element, Error, KbitExperts, Kernel, MmaOptions, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

/// Largest `max_m` the grouped scalar GEMV serves.
const GROUPED_SCALAR_MAX_M: usize = 4;
/// Whether the dispatch gives `max_m` rows per expert of `bits` bits to the
/// grouped scalar GEMV, for fewer than [`GROUPED_MMA_AUTO_MIN_UNITS`]
/// experts with rows and where the tensor-core kernel has no K-slot plan
/// (which goes first at max_m = 3, 4, and 2 at k ≤ 4). H100, 8 experts of
/// 512×2048 (K × N, `moe_dn`, which has no K-slot plan; µs, GEMV against
/// the tensor-core kernel, medians of two rounds at 952ab85,
/// `bench-results/nvidia-h100-80gb-hbm3-2026-12-07-952ab85-ab.md`):
/// - max_m = 2: every k (k = 2 / 3 / 4 / 5: 3.49 / 3.58 / 3.82 / 4.38
///   against 4.34 / 4.99 / 5.43 / 6.59);
/// - max_m = 3: every k (4.24 / 4.05 / 4.50 / 4.96 against 4.33 / 4.98 /
///   5.41 / 6.56);
/// - max_m = 4 at k ≥ 3 (4.75 / 4.97 / 5.79 against 4.98 / 5.41 / 6.56,
///   with the half-width blocks of `SlotPlan::new`); k = 2 4.47 against 4.33.
fn grouped_gemv_preferred(max_m: usize, bits: u32) -> bool {
    match max_m {
        1..=3 => true,
        4 => bits >= 3,
        _ => false,
    }
}
/// Experts with rows (`min(experts, total rows)`) from which the dispatch
/// gives max_m = 2, 3 to the grouped tensor-core GEMM (H100, both MoE
/// matrices, `bench-results/…-b0e9c90*`: 64 experts × 2 rows, k = 2 / 4,
/// 68.5 / 59.5 µs GEMV against 52.4 / 51.4; 8 experts 9.0 / 9.0 against
/// 10.8 / 12.8). max_m = 1 stays with the GEMV at any count (64 experts ×
/// 1 row, k = 2 / 4: 40.7 / 47.4 against 53.1 / 52.2).
const GROUPED_MMA_AUTO_MIN_UNITS: usize = 32;
/// Smallest K for which `max_m = 3, 4` (and 2 at k ≤ 4) go to the grouped
/// tensor-core GEMM where it runs its K-slot plan: 8 K tiles, one for each
/// of a block's K slots. Measured on 8 experts of 2048×512 (H100,
/// `…-bdf07a1.md`, max_m = 3, k = 2 / 3 / 4 / 5): 4.69 / 5.00 / 5.33 /
/// 5.98 µs against 5.74 / 5.36 / 6.99 / 5.96 for the GEMV; since 8bdc9ff
/// (32-column blocks, tables of 8bdc9ff to 0391271) max_m = 3 and 4 at
/// 4.51–4.58 / 4.57–4.61 / 4.88–4.92 / 5.41–5.47 against 5.70–6.41 for
/// the GEMV.
const KSLOTS_MIN_K: usize = 512;
/// Whether `max_m = 2` also goes to the grouped K-slot plan at `bits` bits
/// (same K bound): k = 2..4. 8 experts of 2048×512 (H200, tables of
/// a9ede6d, whose M ≤ 8 loops swap the mma operands; µs, tensor-core kernel
/// against the GEMV): k = 2 / 3 / 4 3.74 / 4.09 / 4.24 against 4.81 / 4.76
/// / 4.93, k = 5 5.40 against 5.46 (even; before the swap the GEMV was
/// ahead at k = 4, 5 on the H100: 4.63–4.72 against 4.85–4.92 at k = 4).
/// k = 5 on the H100 in the M = 1..4 tables of 045020d, 4f25715, d9176e7
/// and ec3d03e (`bench-results/…-2026-12-07-*-m1-4.json`): 5.17 / 5.20 /
/// 5.24 / 5.08 against 5.19 / 5.20 / 5.25 / 5.29, even in three runs of
/// four, so k = 5 stays with the GEMV.
const fn kslots_two_rows(bits: u32) -> bool {
    bits <= 4
}
/// Largest `max_m` the grouped tensor-core GEMM serves.
const GROUPED_MMA_MAX_M: usize = kbit_format::mma::MAX_M as usize;

fn not_applicable(kernel: Kernel, why: impl Into<String>) -> Error {
    Error::NotApplicable { kernel, why: why.into() }
}

/// Rounds a byte offset up to 256 (cuBLAS and vector accesses like aligned
/// operands).
fn align256(b: usize) -> usize {
    b.div_ceil(256) * 256
}

impl Context {
    /// The MoE matmul: for every expert `e`, `y[r] = x[r] · W_eᵀ` for its rows
    /// `r` in `expert_offsets[e] .. expert_offsets[e + 1]`. `x` is
    /// `[total_rows, K]` and `y` `[total_rows, N]`, row-major, f16 or bf16;
    /// `expert_offsets` (u32, `num_experts + 1`, non-decreasing from 0) stays
    /// on the device; `max_m` must be ≥ every expert's row count and sizes
    /// the launch. Returns the kernel that ran. Asynchronous, no host sync.
    /// Offsets that break their contract (decreasing, past the rows) give
    /// unspecified rows of `y` but never an access outside `x`, `y` or the
    /// weights, on every path.
    ///
    /// ```no_run
    /// use half::f16;
    /// use kbit::{Codebook, ScaleMode, Shape, reference};
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = Shape::new(512, 2048)?;
    /// let cb = Codebook::nf(4)?;
    /// let experts: Vec<_> = (0..8)
    ///     .map(|e| {
    ///         let w: Vec<f32> = (0..shape.numel()).map(|i| ((i + e) as f32 * 0.1).sin()).collect();
    ///         reference::repack(&reference::quantize(&w, shape, &cb)?, ScaleMode::Strict)
    ///     })
    ///     .collect::<kbit::Result<_>>()?;
    /// let experts = ctx.upload_experts(&experts)?;
    /// // 5 rows routed to experts 0, 0, 2, 5, 5: at most 2 per expert.
    /// let offsets = ctx.stream().clone_htod(&[0u32, 2, 2, 3, 3, 3, 5, 5, 5])?;
    /// let x = ctx.stream().clone_htod(&vec![f16::from_f32(0.1); 5 * shape.k])?;
    /// let mut y = ctx.stream().alloc_zeros::<f16>(5 * shape.n)?;
    /// let kernel = ctx.expert_linear(&x, &offsets, 2, &experts, &mut y)?;
    /// // One of the grouped kernels: at max_m = 2 and k = 4 on K = 2048 the
    /// // tensor-core kernel's K-slot plan where it fits, else the GEMV.
    /// assert!(matches!(kernel, kbit::Kernel::GroupedMma | kbit::Kernel::GroupedScalar));
    /// assert_eq!(ctx.last_kernel(), Some(kernel));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for f32 activations, an `x` length not a multiple
    /// of K, or more rows than `max_m × num_experts`; [`Error::Rows`] for
    /// `max_m = 0`; [`Error::Length`] for `expert_offsets` or `y`;
    /// [`Error::NotApplicable`] when a forced kernel cannot serve the call.
    pub fn expert_linear<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        max_m: usize,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<Kernel> {
        let kernel = match self.forced_kernel() {
            Some(k @ Kernel::GroupedScalar) if max_m > GROUPED_SCALAR_MAX_M => {
                return Err(not_applicable(k, format!("max_m = {max_m} > {GROUPED_SCALAR_MAX_M}")));
            }
            Some(k @ Kernel::GroupedMma) if max_m > GROUPED_MMA_MAX_M => {
                return Err(not_applicable(k, format!("max_m = {max_m} > {GROUPED_MMA_MAX_M}")));
            }
            Some(k @ (Kernel::GroupedScalar | Kernel::GroupedMma | Kernel::DequantCublas)) => k,
            Some(k) => {
                return Err(not_applicable(k, "expert_linear runs grouped_scalar, grouped_mma or dequant_cublas"));
            }
            None => {
                let units = experts.num_experts().min(x.len() / experts.shape().k.max(1));
                let aligned = dptr(x, self) % 16 == 0;
                // Both grouped kernels read 16-byte aligned activations only.
                let few = units < GROUPED_MMA_AUTO_MIN_UNITS;
                // At max_m = 3, 4, and at max_m = 2 for k ≤ 4, a grouped
                // K-slot plan puts the tensor-core kernel ahead of the GEMV;
                // it runs as planned here.
                let kslots_first = matches!(max_m, 3 | 4) || (max_m == 2 && kslots_two_rows(experts.bits()));
                if aligned && kslots_first && experts.shape().k >= KSLOTS_MIN_K {
                    // A plan that cannot be made leaves the choice below.
                    let rows = crate::experts::check_grouped(experts, expert_offsets.len(), max_m, x.len(), y.len())?;
                    if let Ok(gp) = self.grouped_mma_plan(T::DTYPE, max_m, experts, rows, MmaOptions::default())
                        && gp.plan.k_slots
                        && rows > 0
                    {
                        self.grouped_mma_launch(x, expert_offsets, experts, y, rows, gp)?;
                        self.record_kernel(Kernel::GroupedMma);
                        return Ok(Kernel::GroupedMma);
                    }
                }
                if aligned && (max_m == 1 || (few && grouped_gemv_preferred(max_m, experts.bits()))) {
                    Kernel::GroupedScalar
                } else if max_m <= GROUPED_MMA_MAX_M && aligned {
                    Kernel::GroupedMma
                } else {
                    Kernel::DequantCublas
                }
            }
        };
        match kernel {
            Kernel::GroupedScalar => self.grouped_gemv(x, expert_offsets, max_m, experts, y)?,
            Kernel::GroupedMma => self.grouped_mma(x, expert_offsets, max_m, experts, y)?,
            _ => self.experts_dequant_cublas(x, expert_offsets, max_m, experts, y)?,
        }
        self.record_kernel(kernel);
        Ok(kernel)
    }

    /// The batched dequant + cuBLAS path over experts (any `max_m`).
    fn experts_dequant_cublas<T: Element>(
        &self,
        x: &impl DevicePtr<T>,
        expert_offsets: &impl DevicePtr<u32>,
        max_m: usize,
        experts: &KbitExperts,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let shape = experts.shape();
        let e = experts.num_experts();
        if T::DTYPE == Dtype::F32 {
            return Err(Error::Mismatch {
                what: "expert_linear: activation dtype",
                left: "f32".into(),
                right: "f16 or bf16".into(),
            });
        }
        if max_m == 0 || max_m > i32::MAX as usize {
            return Err(Error::Rows { m: max_m, max: i32::MAX as usize });
        }
        let rows = crate::experts::check_grouped(experts, expert_offsets.len(), max_m, x.len(), y.len())?;
        if rows == 0 {
            return Ok(());
        }
        let padded = e.checked_mul(max_m).filter(|p| p * shape.k.max(shape.n) < u32::MAX as usize);
        let Some(padded) = padded else { return Err(Error::TooLarge { n: e * max_m, k: shape.k }) };
        // Scratch: [E, N, K] weights | [E, max_m, K] x | [E, max_m, N] y.
        let w_bytes = align256(e * shape.numel() * 2);
        let x_bytes = align256(padded * shape.k * 2);
        let y_bytes = padded * shape.n * 2;
        let s = self.stream();
        let xp = dptr(x, self);
        let op = dptr(expert_offsets, self);
        let (yp, _gy) = y.device_ptr_mut(s);
        let slot = (T::DTYPE == Dtype::Bf16) as usize;
        let (n, k, ne, mm, total) = (shape.n as u32, shape.k as u32, e as u32, max_m as u32, rows as u32);
        self.with_blas_scratch(w_bytes + x_bytes + y_bytes, |handle, base| {
            let (ws, xs, ys) = (base, base + w_bytes as u64, base + (w_bytes + x_bytes) as u64);
            // 1. Dequantize the experts that have rows (blockIdx.y = expert),
            //    one thread per octet; the experts share one round of
            //    resident blocks.
            let f = &self.kernels.grouped_dequant[(experts.bits() - 2) as usize][slot];
            let mut cfg = self.grid_resident(shape.num_blocks() as u64 * 4, f, e as u64);
            cfg.grid_dim.1 = ne;
            let (pp, sp, cp) = (dptr(&experts.packed, self), dptr(&experts.scales, self), dptr(&experts.cb, self));
            unsafe { s.launch_builder(&f.f).arg(&pp).arg(&sp).arg(&cp).arg(&ws).arg(&op).arg(&n).arg(&k).launch(cfg) }?;
            // 2. Gather x rows into the padded per-expert batch.
            let status = self.status_ptr(STATUS_EXPERT_ROWS);
            let cfg = self.rows_launch(padded, shape.k);
            let g = &self.kernels.moe_rows[0];
            unsafe {
                s.launch_builder(g)
                    .arg(&xp)
                    .arg(&op)
                    .arg(&xs)
                    .arg(&status)
                    .arg(&ne)
                    .arg(&mm)
                    .arg(&k)
                    .arg(&total)
                    .launch(cfg)
            }?;
            // 3. One strided-batched GEMM over the experts, max_m rows each.
            let gemm =
                RowMajorGemm { dtype: T::DTYPE, batch: e, m: max_m, n: shape.n, k: shape.k, w: ws, x: xs, y: ys };
            // Sizes were checked to fit i32 above (padded rows × K, N < 2^32).
            unsafe { gemm.run(handle) }?;
            // 4. Scatter each expert's real rows to y.
            let cfg = self.rows_launch(padded, shape.n);
            let sc = &self.kernels.moe_rows[1];
            unsafe {
                s.launch_builder(sc).arg(&ys).arg(&op).arg(&yp).arg(&ne).arg(&mm).arg(&n).arg(&total).launch(cfg)
            }?;
            Ok(())
        })
    }
}

impl Context {
    /// The launch of a row gather/scatter over `rows` padded rows of `cols`
    /// elements: a block per row (rows past 16 blocks per SM are taken in
    /// a grid-stride loop), as many threads as the row has 16-byte chunks
    /// (32 to 256).
    fn rows_launch(&self, rows: usize, cols: usize) -> LaunchConfig {
        let pieces = if cols % 8 == 0 { cols / 8 } else { cols };
        let threads = pieces.next_power_of_two().clamp(32, 256) as u32;
        let blocks = rows.clamp(1, self.info().sm_count as usize * 16) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
    }

    /// Concatenates device weights of equal shape and codebook into
    /// [`KbitExperts`] with device-to-device copies (asynchronous), e.g.
    /// after quantizing each expert on the GPU.
    ///
    /// ```no_run
    /// let ctx = kbit::Context::new(0)?;
    /// let shape = kbit::Shape::new(512, 2048)?;
    /// let w = ctx.stream().alloc_zeros::<half::f16>(shape.numel())?;
    /// let cb = kbit::Codebook::nf(4)?;
    /// let one = ctx.repack(&ctx.quantize(&w, shape, &cb)?, kbit::ScaleMode::Strict)?;
    /// let experts = ctx.concat_experts(&[&one, &one])?;
    /// assert_eq!(experts.num_experts(), 2);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] for an empty list or differing shapes/codebooks.
    pub fn concat_experts(&self, experts: &[&crate::KbitWeight]) -> Result<KbitExperts> {
        let Some(first) = experts.first() else {
            return Err(Error::Mismatch {
                what: "concat_experts: number of experts",
                left: "0".into(),
                right: "at least 1".into(),
            });
        };
        for (e, w) in experts.iter().enumerate() {
            if w.shape() != first.shape() || w.codebook() != first.codebook() {
                return Err(Error::Mismatch {
                    what: "concat_experts: expert shapes and codebooks",
                    left: format!("expert 0: {:?}, k = {}", first.shape(), first.bits()),
                    right: format!("expert {e}: {:?}, k = {}", w.shape(), w.bits()),
                });
            }
        }
        let s = self.stream();
        let (words, scales) = (first.packed.len(), first.scales.len());
        let mut packed = s.alloc_zeros::<u32>(words * experts.len())?;
        let mut sc = s.alloc_zeros::<u8>(scales * experts.len())?;
        for (e, w) in experts.iter().enumerate() {
            s.memcpy_dtod(&w.packed, &mut packed.slice_mut(e * words..(e + 1) * words))?;
            s.memcpy_dtod(&w.scales, &mut sc.slice_mut(e * scales..(e + 1) * scales))?;
        }
        Ok(KbitExperts {
            num_experts: experts.len(),
            shape: first.shape(),
            codebook: first.codebook().clone(),
            cb: s.clone_dtod(&first.cb)?,
            packed,
            scales: sc,
        })
    }
}
