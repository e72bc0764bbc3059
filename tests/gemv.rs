//! Scalar GEMV (kernel 1) and grouped scalar GEMV (kernel 4) against the
//! CPU: an f64 reference of the dequantized weights, a bit-exact model of
//! the documented summation order, determinism, grouped = dense bit for
//! bit, and argument validation. GPU tests skip visibly without a GPU.
//!
//! Tolerance. The reference is `reference::matmul_f64` of
//! `reference::dequantize_tiled::<f32>` (the exact f32 weights
//! `f32(cb · scale)`; some kernel paths apply each block's scale once to
//! its dot products instead), so the only differences are the f32
//! accumulation (relative ~1e-6 here) and the final rounding to T (half an
//! ulp of T). With `R = max |ref|` over one output matrix and `p` the
//! mantissa bits of T (10 for f16, 7 for bf16), we assert
//!
//! ```text
//! max |y − ref| ≤ 2 · 2^-p · 2^floor(log2 R)      (two ulps of T at the output's scale)
//! ```
//!
//! and report `max |y − ref| / max(|ref|, 1)` per case.

mod common;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use kbit::{Codebook, Context, Dtype, Element, Error, KbitWeight, Shape, TiledWeight, reference};
use kbit_format::{e4m4, gemv as g, gemv_slots as gs, planes, tile};
use rand::Rng;
use rand::rngs::SmallRng;
use rayon::prelude::*;

// ---------------------------------------------------------------------------
// Data

/// A random codebook (NF or arbitrary finite values, unordered) for `bits`.
fn random_codebook(rng: &mut SmallRng, bits: u32) -> Codebook {
    if rng.random_bool(0.5) {
        Codebook::nf(bits).unwrap()
    } else {
        Codebook::new((0..1 << bits).map(|_| rng.random_range(-1.0f32..1.0)).collect()).unwrap()
    }
}

/// A random runtime-layout weight: uniformly random planes (every index
/// equally likely) and E4M4 scales in 2^-5 .. 2, one in eight instead
/// among the 32 smallest codes (0, exponent 0: the subnormal `m · 2^-14`,
/// which the decodes reach through an f32 subnormal or a subtraction, and
/// exponent 1); the half tile past K of `K % 64 == 32` is zero, as the
/// format requires.
fn random_tiled(rng: &mut SmallRng, shape: Shape, cb: &Codebook) -> TiledWeight {
    let bits = cb.bits() as usize;
    let mut packed: Vec<u32> = (0..shape.tiled_words(cb.bits())).map(|_| rng.random()).collect();
    let scale = |rng: &mut SmallRng| {
        if rng.random_ratio(1, 8) { rng.random_range(0x00u8..0x20) } else { rng.random_range(0x60u8..0xC0) }
    };
    let mut scales: Vec<u8> = (0..shape.tiled_scales()).map(|_| scale(rng)).collect();
    if shape.k % 64 == 32 {
        let kb = (shape.k / 32) as u64; // the missing block of the last tile
        for n in 0..shape.n as u64 {
            let w = tile::word_index(shape.n as u64, n, kb, bits as u64) as usize;
            packed[w..w + bits].fill(0);
            scales[tile::scale_index(shape.n as u64, n, kb) as usize] = 0;
        }
    }
    TiledWeight::from_parts(shape, cb.clone(), packed, scales).unwrap()
}

fn poisoned<T: Element>(ctx: &Context, len: usize) -> CudaSlice<T> {
    // One element at least: a zero-byte allocation is not portable.
    ctx.stream().clone_htod(&vec![T::nan(); len.max(1)]).unwrap()
}

fn mantissa_bits<T: Element>() -> i32 {
    if T::DTYPE == Dtype::F16 { 10 } else { 7 }
}

/// Two ulps of T at the scale of the largest |ref| (module docs).
fn tolerance<T: Element>(want: &[f64]) -> f64 {
    let r = want.iter().fold(0.0f64, |a, v| a.max(v.abs())).max(f64::MIN_POSITIVE);
    2.0 * 2f64.powi(-mantissa_bits::<T>()) * 2f64.powi(r.log2().floor() as i32)
}

/// Checks `got` against the f64 reference, returning the reported measure
/// `max |y − ref| / max(|ref|, 1)`.
fn check_close<T: Element>(got: &[T], want: &[f64], what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance::<T>(want);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let d = (g - w).abs();
        assert!(d <= tol, "{what}: y[{i}] = {g}, reference {w}: |diff| {d:.3e} > tolerance {tol:.3e}");
        worst = worst.max(d / w.abs().max(1.0));
    }
    worst
}

// ---------------------------------------------------------------------------
// The bit-exact CPU model of the kernels' arithmetic (kbit_format::gemv docs)

/// `y[m, N]` exactly as the kernels compute it: the variant the shape
/// takes (`kbit_format::gemv::uses_slots`), then its summation order.
fn model<T: Element>(x: &[T], m: usize, w: &TiledWeight) -> Vec<T> {
    let shape = w.shape();
    if g::uses_slots(shape.n, shape.k) { model_slots(x, m, w) } else { model_blocks(x, m, w) }
}

/// The block variant (`kbit_format::gemv`): per column and row, warp slot
/// `w` of `W = warps(K)` walks tiles `w, w + W, …`; per tile and half a
/// block dot product `d` (one f32 FMA chain over the 32 elements in order;
/// at k = 2 and M = 1 the sum of the 16 pair sums
/// `fma(cb_1, x_1, cb_0 · x_0)` in order) is folded into the half's
/// accumulator as `fma(d, scale, a_h)`; the slot partial is `a_0 + a_1`,
/// and the partials are added in slot order.
fn model_blocks<T: Element>(x: &[T], m: usize, w: &TiledWeight) -> Vec<T> {
    let shape = w.shape();
    let (n_dim, k_dim) = (shape.n, shape.k);
    let bits = w.codebook().bits() as u64;
    let cb = w.codebook().values();
    let slots = g::warps(k_dim) as usize;
    let k_tiles = tile::k_tiles(k_dim);
    let cols: Vec<Vec<T>> = (0..n_dim)
        .into_par_iter()
        .map(|n| {
            (0..m)
                .map(|r| {
                    let mut total = 0.0f32;
                    for slot in 0..slots {
                        let mut acc = [0.0f32; 2];
                        let mut kt = slot;
                        while kt < k_tiles {
                            for (h, a) in acc.iter_mut().enumerate() {
                                let kb = (2 * kt + h) as u64;
                                let wi = tile::word_index(n_dim as u64, n as u64, kb, bits) as usize;
                                let sc =
                                    e4m4::decode(w.scales()[tile::scale_index(n_dim as u64, n as u64, kb) as usize]);
                                let term = |e: usize| {
                                    let idx = planes::index(&w.packed()[wi..wi + bits as usize], e);
                                    let pos = kt * 64 + 32 * h + e;
                                    let xv = if pos < k_dim { x[r * k_dim + pos].to_f32() } else { 0.0 };
                                    (cb[idx as usize], xv)
                                };
                                let mut d = 0.0f32;
                                if g::sums(bits as u32, m as u32) {
                                    for j in 0..16 {
                                        let ((c0, x0), (c1, x1)) = (term(2 * j), term(2 * j + 1));
                                        let s = c1.mul_add(x1, c0 * x0);
                                        d = if j == 0 { s } else { d + s };
                                    }
                                } else {
                                    for e in 0..32 {
                                        let (c, xv) = term(e);
                                        d = c.mul_add(xv, d);
                                    }
                                }
                                *a = d.mul_add(sc, *a);
                            }
                            kt += slots;
                        }
                        let p = acc[0] + acc[1];
                        total = if slot == 0 { p } else { total + p };
                    }
                    T::from_f32_rne(total)
                })
                .collect()
        })
        .collect();
    let mut y = vec![T::from_f32_rne(0.0); m * n_dim];
    for (n, col) in cols.iter().enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n_dim + n] = *v;
        }
    }
    y
}

/// The column-slot variant (`kbit_format::gemv_slots`): slot `s` of
/// `S = slots(N, K)` walks tiles `s, s + S, …` and keeps two f32
/// accumulators (even and odd elements). Where `gs::folds` (k = 2; k = 4
/// with one row) each block's two chains of `cb · x` from 0 are folded in
/// as `fma(d, scale, acc)` (k = 2: each chain into its accumulator; k = 4:
/// both into the first); otherwise every element adds
/// `f32(cb · scale) · x` to its accumulator. The
/// slot's partial is the sum of its accumulators, and the partials are
/// added in slot order.
fn model_slots<T: Element>(x: &[T], m: usize, w: &TiledWeight) -> Vec<T> {
    let shape = w.shape();
    let (n_dim, k_dim) = (shape.n, shape.k);
    let bits = w.codebook().bits() as u64;
    let cb = w.codebook().values();
    let s = gs::slots(n_dim, k_dim) as usize;
    let k_tiles = tile::k_tiles(k_dim);
    let cols: Vec<Vec<T>> = (0..n_dim)
        .into_par_iter()
        .map(|n| {
            (0..m)
                .map(|r| {
                    let mut total = 0.0f32;
                    for slot in 0..s {
                        let mut acc = [0.0f32; 2];
                        let mut kt = slot;
                        while kt < k_tiles {
                            for h in 0..2 {
                                let kb = (2 * kt + h) as u64;
                                let wi = tile::word_index(n_dim as u64, n as u64, kb, bits) as usize;
                                let sc =
                                    e4m4::decode(w.scales()[tile::scale_index(n_dim as u64, n as u64, kb) as usize]);
                                let mut d = [0.0f32; 2];
                                for e in 0..32 {
                                    let idx = planes::index(&w.packed()[wi..wi + bits as usize], e);
                                    let pos = kt * 64 + 32 * h + e;
                                    let xv = if pos < k_dim { x[r * k_dim + pos].to_f32() } else { 0.0 };
                                    if gs::folds(bits as u32, m as u32) {
                                        d[e % 2] = cb[idx as usize].mul_add(xv, d[e % 2]);
                                    } else {
                                        acc[e % 2] = (cb[idx as usize] * sc).mul_add(xv, acc[e % 2]);
                                    }
                                }
                                if bits == 2 {
                                    for t in 0..2 {
                                        acc[t] = d[t].mul_add(sc, acc[t]);
                                    }
                                } else if gs::folds(bits as u32, m as u32) {
                                    acc[0] = d[1].mul_add(sc, d[0].mul_add(sc, acc[0]));
                                }
                            }
                            kt += s;
                        }
                        let p = acc[0] + acc[1];
                        total = if slot == 0 { p } else { total + p };
                    }
                    T::from_f32_rne(total)
                })
                .collect()
        })
        .collect();
    let mut y = vec![T::from_f32_rne(0.0); m * n_dim];
    for (n, col) in cols.iter().enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n_dim + n] = *v;
        }
    }
    y
}

// ---------------------------------------------------------------------------
// CPU-only tests

/// `prmt.b32 d, a, b, sel` (default mode): result byte `i` is byte
/// `sel[i] & 7` of `b:a`, or its sign replicated when `sel[i] & 8`.
fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = (b as u64) << 32 | a as u64;
    (0..4).fold(0, |d, i| {
        let s = (sel >> (4 * i)) & 0xF;
        let v = ((bytes >> (8 * (s & 7))) & 0xFF) as u32;
        let v = if s & 8 != 0 { if v & 0x80 != 0 { 0xFF } else { 0 } } else { v };
        d | v << (8 * i)
    })
}

/// The plane reshuffles the kernels decode with give every element's index.
#[test]
fn decode_fields_reproduce_plane_indices() {
    fn check<const K: usize>(rng: &mut SmallRng) {
        for _ in 0..2000 {
            let p: [u32; K] = std::array::from_fn(|_| rng.random());
            if K == 2 {
                // Quads: word 0 holds elements 8m + {0, 1, 4, 5}, word 1 8m + {2, 3, 6, 7}.
                let w = g::quad_words::<K>(&p);
                for m in 0..4 {
                    for (word, first) in [(w[0], 0usize), (w[1], 2)] {
                        let f = (word >> (8 * m)) & 0xFF;
                        for (t, off) in [0usize, 1, 4, 5].into_iter().enumerate() {
                            let e = 8 * m + first + off;
                            assert_eq!(g::quad_index(f, t as u32), planes::index(&p, e), "k=2 quad element {e}");
                        }
                    }
                }
            }
            if K <= 4 {
                let w = g::pair_words::<K>(&p);
                for m in 0..4 {
                    for (q, &wq) in w.iter().enumerate() {
                        let f = (wq >> (8 * m)) & 0xFF;
                        assert!(f < g::table_fields(K as u32), "k={K}: field {f:#x} past the table");
                        for t in 0..2 {
                            let e = 8 * m + 2 * q + t as usize;
                            assert_eq!(g::pair_index(f, t, K as u32), planes::index(&p, e), "k={K} element {e}");
                        }
                    }
                }
            } else {
                let w = g::wide_words::<K>(&p);
                for m in 0..4 {
                    for (c, &wc) in w.iter().enumerate() {
                        let at = (wc >> (8 * m)) & 0xFF;
                        assert!(at % 4 == 0 && at < g::table_bytes(5, 1), "k={K}: offset {at:#x} off the table");
                        let e = 8 * m + c;
                        assert_eq!(at / 4, planes::index(&p, e), "k={K} element {e}");
                    }
                }
            }
            // Table addresses (row layout, M = 1): every lookup's `prmt`
            // lands on its field's entry in the thread's copy, inside the
            // table. The field layout (M ≥ 2) puts field f at 128·f.
            if K <= 4 {
                let (rows, bits) = (g::rows(1), K as u32);
                assert!(rows && !g::rows(2));
                let t = rng.random_range(0..1024u32);
                let copy = g::copy_byte(bits, rows, t);
                let lane_at = copy & 0xFF;
                assert!(lane_at + g::entry_bytes(bits) <= g::field_bytes(bits, rows), "k={K} copy {lane_at}");
                let (fields, row, col) = if K == 2 {
                    let a = g::quad_addresses::<K>(&p, copy);
                    (g::quad_words::<K>(&p).to_vec(), a.row.to_vec(), a.col.to_vec())
                } else {
                    let a = g::pair_addresses::<K>(&p, copy);
                    (g::pair_words::<K>(&p).to_vec(), a.row.to_vec(), a.col.to_vec())
                };
                for q in 0..fields.len() {
                    for m in 0..4u32 {
                        let f = (fields[q] >> (8 * m)) & 0xFF;
                        let at = prmt(col[q], row[q], g::address_select(m));
                        assert_eq!(
                            at,
                            g::field_offset(bits, rows, f) + lane_at,
                            "k={K} word {q} byte {m} field {f:#x}"
                        );
                        assert!(at + g::entry_bytes(bits) <= g::table_bytes(bits, 1), "k={K}: {at} off the table");
                        let old = g::field_offset(bits, false, f) + (g::copy_byte(bits, false, t) & 0xFF);
                        assert!(old + g::entry_bytes(bits) <= g::table_bytes(bits, 2), "k={K}: {old} off the table");
                    }
                }
            }
        }
    }
    let mut rng = common::rng("decode_fields_reproduce_plane_indices");
    check::<2>(&mut rng);
    check::<3>(&mut rng);
    check::<4>(&mut rng);
    check::<5>(&mut rng);
}

/// Pair sums (k = 2, M = 1): the address a lane forms with one `prmt` from
/// its plane words and the tile's base is the entry of its pair's two
/// indices (`sum_offset`, `sum_indices`), and at one pair the 32 lanes of
/// a warp (16 columns × 2 halves) read 32 different banks whatever their
/// indices.
#[test]
fn pair_sum_addresses_reproduce_plane_indices() {
    let mut rng = common::rng("pair_sum_addresses_reproduce_plane_indices");
    for _ in 0..2000 {
        let base = 256 * rng.random_range(0..512u32);
        let lanes: Vec<[u32; 2]> = (0..32).map(|_| [rng.random(), rng.random()]).collect();
        for j in 0..16u32 {
            let mut banks = std::collections::HashMap::new();
            for (l, p) in lanes.iter().enumerate() {
                let h = l as u32 % 2;
                let w = g::sum_words::<2>(p, h);
                let at = prmt(w[(j % 4) as usize], base, g::sum_select(j)) + g::sum_row(j);
                let (e0, e1) = (2 * j as usize, 2 * j as usize + 1);
                let n = (at - base - g::sum_offset(j, h, 0)) / 4;
                assert!(n < 16, "pair {j} lane {l}: offset {:#x}", at - base);
                assert_eq!(at, base + g::sum_offset(j, h, n), "pair {j} lane {l}");
                assert_eq!(g::sum_indices(n), (planes::index(p, e0), planes::index(p, e1)), "pair {j} lane {l}");
                let bank = (at / 4) % 32;
                if let Some(&other) = banks.get(&bank) {
                    assert_eq!(other, at, "pair {j}: lanes read different words of bank {bank}");
                }
                banks.insert(bank, at);
            }
        }
    }
    // A tile's table: 16 pairs × 2 halves × 16 sums, each once.
    let mut seen = vec![false; (g::SUMS_TILE_BYTES / 4) as usize];
    for j in 0..16 {
        for h in 0..2 {
            for n in 0..16 {
                let at = g::sum_offset(j, h, n);
                assert!(!std::mem::replace(&mut seen[(at / 4) as usize], true), "{j} {h} {n}");
            }
        }
    }
}

/// The K split depends on K only, is a power of two in 1..=16 and never
/// more than the K tiles need.
#[test]
fn warps_depend_on_k_only() {
    for k in [32usize, 64, 96, 512, 2048, 5120, 8192, 28672] {
        let w = g::warps(k);
        assert!(w.is_power_of_two() && (1..=16).contains(&w), "K={k}: {w}");
        assert!(w as usize <= tile::k_tiles(k).next_power_of_two(), "K={k}: {w}");
    }
    assert_eq!(g::warps(32), 1);
    assert_eq!(g::warps(96), 2);
    assert_eq!(g::warps(512), 8);
    assert_eq!(g::warps(2048), 16);
    assert_eq!(g::warps(8192), 16);
}

/// The K split depends on the shape only, is a power of two in 1..=32 and
/// never more than the K tiles need.
#[test]
fn column_slots_depend_on_the_shape_only() {
    for n in [1usize, 7, 129, 512, 2048, 4096, 4100, 5120, 14336, 28672, 1 << 20] {
        for k in [32usize, 64, 96, 512, 2048, 5120, 8192, 28672] {
            let s = gs::slots(n, k);
            assert!(s.is_power_of_two() && (1..=32).contains(&s), "{n}x{k}: {s}");
            assert!(s as usize <= tile::k_tiles(k).next_power_of_two(), "{n}x{k}: {s}");
            assert_eq!(s, gs::slots(n, k));
        }
    }
    assert_eq!(gs::slots(512, 2048), 32);
    assert_eq!(gs::slots(4096, 2048), 16);
    assert_eq!(gs::slots(5120, 2048), 16);
    assert_eq!(gs::slots(10240, 2048), 8);
    assert_eq!(gs::slots(14336, 4096), 4);
    assert_eq!(gs::slots(4096, 32), 1);
}

/// Both bit-exact models are themselves within the tolerance of the f64
/// reference (so the GPU, which must match them bit for bit, is too).
#[test]
fn cpu_model_matches_f64_reference() {
    let mut rng = common::rng("cpu_model_matches_f64_reference");
    for &(k, n) in &[(96usize, 129usize), (2048, 64), (160, 33)] {
        let shape = Shape::new(n, k).unwrap();
        for bits in 2..=5 {
            let cb = random_codebook(&mut rng, bits);
            let w = random_tiled(&mut rng, shape, &cb);
            let wd: Vec<f32> = reference::dequantize_tiled(&w);
            // M = 1 and 3: the models' summation orders differ by M.
            for m in [1, 3] {
                let x: Vec<f16> = common::gaussian(&mut rng, m * k, 1.0);
                let want = reference::matmul_f64(&x, m, &wd, shape).unwrap();
                check_close(&model_slots(&x, m, &w), &want, &format!("slot model f16 {n}x{k} k={bits} M={m}"));
                check_close(&model_blocks(&x, m, &w), &want, &format!("block model f16 {n}x{k} k={bits} M={m}"));
                let xb: Vec<bf16> = common::gaussian(&mut rng, m * k, 1.0);
                let want = reference::matmul_f64(&xb, m, &wd, shape).unwrap();
                check_close(&model_slots(&xb, m, &w), &want, &format!("slot model bf16 {n}x{k} k={bits} M={m}"));
                check_close(&model_blocks(&xb, m, &w), &want, &format!("block model bf16 {n}x{k} k={bits} M={m}"));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Dense GEMV on the GPU

/// Runs `gemv` for M = 1..=4 on one weight (`x` holds 4 rows; M uses the
/// first M) into NaN-poisoned outputs and checks each against `want`
/// (the f64 reference of all 4 rows). Returns the worst reported measure.
fn run_dense<T: Element>(ctx: &Context, w: &KbitWeight, x: &[T], want: &[f64], what: &str) -> f64 {
    let shape = w.shape();
    let dx = ctx.stream().clone_htod(x).unwrap();
    let mut worst = 0.0f64;
    for m in 1..=4 {
        let mut dy = poisoned::<T>(ctx, m * shape.n);
        ctx.gemv(&dx.slice(0..m * shape.k), m, w, &mut dy).unwrap_or_else(|e| panic!("{what} M={m}: {e}"));
        let got = ctx.stream().clone_dtoh(&dy).unwrap();
        worst = worst.max(check_close(&got, &want[..m * shape.n], &format!("{what} M={m}")));
    }
    worst
}

/// Every (shape, k, dtype, M) of `shapes` against the f64 reference.
fn dense_sweep(test: &str, shapes: &[(usize, usize)]) {
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    for &(k, n) in shapes {
        let shape = Shape::new(n, k).unwrap();
        for bits in 2..=5 {
            let cb = random_codebook(&mut rng, bits);
            let tw = random_tiled(&mut rng, shape, &cb);
            let w = ctx.upload(&tw).unwrap();
            let wd: Vec<f32> = reference::dequantize_tiled(&tw);
            let x16: Vec<f16> = common::gaussian(&mut rng, 4 * k, 1.0);
            let want = reference::matmul_f64(&x16, 4, &wd, shape).unwrap();
            let e16 = run_dense(&ctx, &w, &x16, &want, &format!("f16 {n}x{k} k={bits}"));
            let xb: Vec<bf16> = common::gaussian(&mut rng, 4 * k, 1.0);
            let want = reference::matmul_f64(&xb, 4, &wd, shape).unwrap();
            let eb = run_dense(&ctx, &w, &xb, &want, &format!("bf16 {n}x{k} k={bits}"));
            eprintln!(
                "{test}: N={n} K={k} k={bits}: max|y-ref|/max(|ref|,1) over M=1..4: f16 {e16:.2e}, bf16 {eb:.2e}"
            );
        }
    }
}

/// The design's shapes (DESIGN §1), M = 1..4, k = 2..5, f16 and bf16.
#[test]
fn gemv_design_shapes() {
    let shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    dense_sweep("gemv_design_shapes", &shapes);
}

/// Awkward shapes: N in {1, 7, 129, 4100} × K in {32, 96, 8192} (odd N
/// tails, K % 64 == 32, one K tile, many K tiles).
#[test]
fn gemv_awkward_shapes() {
    let mut shapes = Vec::new();
    for k in [32, 96, 8192] {
        for n in [1, 7, 129, 4100] {
            shapes.push((k, n));
        }
    }
    dense_sweep("gemv_awkward_shapes", &shapes);
}

/// GEMV of fresh activations against `w` for M = 1..=`max_m` (the first M
/// rows of one random `[max_m, K]` input), NaN-poisoned output, bit-exact
/// against the CPU model of the summation order.
fn matches_model<T: Element>(
    ctx: &Context,
    rng: &mut SmallRng,
    w: &KbitWeight,
    tw: &TiledWeight,
    max_m: usize,
    what: &str,
) {
    let shape = w.shape();
    let x: Vec<T> = common::gaussian(rng, max_m * shape.k, 1.0);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    for m in 1..=max_m {
        let mut dy = poisoned::<T>(ctx, m * shape.n);
        ctx.gemv(&dx.slice(0..m * shape.k), m, w, &mut dy).unwrap();
        let got = ctx.stream().clone_dtoh(&dy).unwrap();
        common::assert_bits_eq(&got, &model(&x[..m * shape.k], m, tw), &format!("{what} {:?} M={m}", T::DTYPE));
    }
}

/// [`matches_model`] for a fresh random weight of `shape` at every k, with
/// f16 and bf16 activations.
fn shape_matches_model(ctx: &Context, rng: &mut SmallRng, shape: Shape, max_m: usize) {
    for bits in 2..=5 {
        let cb = random_codebook(rng, bits);
        let tw = random_tiled(rng, shape, &cb);
        let w = ctx.upload(&tw).unwrap();
        let what = format!("{}x{} k={bits}", shape.n, shape.k);
        matches_model::<f16>(ctx, rng, &w, &tw, max_m, &what);
        matches_model::<bf16>(ctx, rng, &w, &tw, max_m, &what);
    }
}

/// The GPU result is bit-identical to the documented summation order.
#[test]
fn gemv_matches_the_cpu_model_bit_for_bit() {
    let test = "gemv_matches_the_cpu_model_bit_for_bit";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    // The last shape (2^25 weights and more, N not a multiple of 32) takes
    // the block variant; the others the column-slot variant.
    let shapes = [(2048usize, 512usize), (96, 129), (8192, 7), (160, 4100), (32, 64), (512, 2048), (8192, 4100)];
    assert!(g::uses_slots(512, 2048) && !g::uses_slots(4100, 8192));
    for &(k, n) in &shapes {
        let shape = Shape::new(n, k).unwrap();
        shape_matches_model(&ctx, &mut rng, shape, 4);
    }
}

/// Matrices of at least four column blocks per SM run, at M = 1 and 2,
/// with two teams of warps per block (one block per SM); the result is
/// still bit-identical to the documented summation order. N is derived
/// from this GPU's SM count so that the shape qualifies on any GPU, with a
/// column tail (N % 32 = 7 or 23), and K = 2080 has a zero half tile.
/// Both N leave a partial last round of column blocks (1, and half the
/// SMs plus one), which at k = 2, M = 2 runs as 16-column groups on a second
/// launch (`g::split_last_round`): one group with 7 columns, and groups
/// past N.
#[test]
fn gemv_two_teams_match_the_cpu_model() {
    let test = "gemv_two_teams_match_the_cpu_model";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let sms = ctx.info().sm_count as usize;
    let (n1, n2) = (4 * sms * 32 + 7, (4 * sms + sms / 2) * 32 + 23);
    for &n in &[n1, n2] {
        let whole = g::split_last_round(n.div_ceil(32) as u32, 2 * sms as u32);
        assert_eq!(whole, Some(4 * sms as u32), "{n}");
    }
    for (k, n) in [(2080usize, n1), (2080, n2), (8192, n1)] {
        let shape = Shape::new(n, k).unwrap();
        assert!(!g::uses_slots(n, k));
        shape_matches_model(&ctx, &mut rng, shape, 2);
    }
}

/// Same inputs, same bits, every run.
#[test]
fn gemv_is_deterministic() {
    let test = "gemv_is_deterministic";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    for &(k, n) in &[(2048usize, 5120usize), (5120, 2048), (2048, 512)] {
        let shape = Shape::new(n, k).unwrap();
        let tw = random_tiled(&mut rng, shape, &Codebook::nf(4).unwrap());
        let w = ctx.upload(&tw).unwrap();
        let x: Vec<bf16> = common::gaussian(&mut rng, 4 * k, 1.0);
        let dx = ctx.stream().clone_htod(&x).unwrap();
        let mut first: Option<Vec<bf16>> = None;
        for run in 0..3 {
            let mut dy = poisoned::<bf16>(&ctx, 4 * n);
            ctx.gemv(&dx, 4, &w, &mut dy).unwrap();
            let got = ctx.stream().clone_dtoh(&dy).unwrap();
            match &first {
                None => first = Some(got),
                Some(f) => common::assert_bits_eq(&got, f, &format!("{n}x{k} run {run}")),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Grouped GEMV on the GPU

/// One grouped call: experts `tws` with `rows[e]` rows each (all ≤
/// `max_m`), NaN-poisoned output. Every expert's rows must be bit-identical
/// to `gemv` on that expert alone and within tolerance of the f64 reference.
fn run_grouped<T: Element>(
    ctx: &Context,
    rng: &mut SmallRng,
    tws: &[TiledWeight],
    experts: &kbit::KbitExperts,
    rows: &[usize],
    max_m: usize,
    what: &str,
) -> f64 {
    let shape = experts.shape();
    let (k, n) = (shape.k, shape.n);
    let mut offsets = vec![0u32];
    for &r in rows {
        offsets.push(offsets.last().unwrap() + r as u32);
    }
    let total = *offsets.last().unwrap() as usize;
    let x: Vec<T> = common::gaussian(rng, total * k, 1.0);
    let dx = ctx.stream().clone_htod(&if x.is_empty() { vec![T::from_f32_rne(0.0)] } else { x.clone() }).unwrap();
    let doff = ctx.stream().clone_htod(&offsets).unwrap();
    let mut dy = poisoned::<T>(ctx, total * n);
    ctx.grouped_gemv(&dx.slice(0..total * k), &doff, max_m, experts, &mut dy.slice_mut(0..total * n))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = ctx.stream().clone_dtoh(&dy).unwrap();
    let mut worst = 0.0f64;
    for (e, &r) in rows.iter().enumerate() {
        if r == 0 {
            continue;
        }
        let start = offsets[e] as usize;
        let got_e = &got[start * n..(start + r) * n];
        // The dense kernel on this expert alone.
        let w = ctx.upload(&tws[e]).unwrap();
        let mut dd = poisoned::<T>(ctx, r * n);
        ctx.gemv(&dx.slice(start * k..(start + r) * k), r, &w, &mut dd).unwrap();
        let dense = ctx.stream().clone_dtoh(&dd).unwrap();
        common::assert_bits_eq(got_e, &dense, &format!("{what}: expert {e} ({r} rows) vs dense"));
        let wd: Vec<f32> = reference::dequantize_tiled(&tws[e]);
        let want = reference::matmul_f64(&x[start * k..(start + r) * k], r, &wd, shape).unwrap();
        worst = worst.max(check_close(got_e, &want, &format!("{what}: expert {e}")));
    }
    worst
}

fn random_experts(rng: &mut SmallRng, count: usize, shape: Shape, bits: u32) -> Vec<TiledWeight> {
    let cb = random_codebook(rng, bits);
    (0..count).map(|_| random_tiled(rng, shape, &cb)).collect()
}

/// 8 experts with rows [1, 3, 0, 2, 4, 1, 0, 4] (clamped to max_m), max_m =
/// 1..4, k = 2..5, f16 and bf16, on the MoE shapes and two awkward ones
/// (1056×1000: K % 64 = 32 and a ragged N, with two column groups per
/// block). From max_m = 3 also rows [2, 0, 1, 1, 0, 3, 1, 0]: as many rows
/// as experts, so blocks guess expert = row before the grid-dependency
/// wait, and rows 4 and 7 guess wrong.
#[test]
fn grouped_gemv_eight_experts() {
    let test = "grouped_gemv_eight_experts";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    const PATTERN: [usize; 8] = [1, 3, 0, 2, 4, 1, 0, 4];
    const UNEVEN: [usize; 8] = [2, 0, 1, 1, 0, 3, 1, 0];
    for &(k, n) in &[(2048usize, 512usize), (512, 2048), (96, 129), (1056, 1000)] {
        let shape = Shape::new(n, k).unwrap();
        for bits in 2..=5 {
            let tws = random_experts(&mut rng, 8, shape, bits);
            let experts = ctx.upload_experts(&tws).unwrap();
            let mut worst = 0.0f64;
            for max_m in 1..=4 {
                let rows: Vec<usize> = PATTERN.iter().map(|&r| r.min(max_m)).collect();
                let what = format!("{n}x{k} k={bits} max_m={max_m}");
                worst = worst.max(run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &rows, max_m, &what));
                worst = worst.max(run_grouped::<bf16>(&ctx, &mut rng, &tws, &experts, &rows, max_m, &what));
                if max_m >= 3 {
                    let what = format!("{what} uneven");
                    worst = worst.max(run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &UNEVEN, max_m, &what));
                    worst = worst.max(run_grouped::<bf16>(&ctx, &mut rng, &tws, &experts, &UNEVEN, max_m, &what));
                }
            }
            eprintln!("{test}: N={n} K={k} k={bits}: max|y-ref|/max(|ref|,1) {worst:.2e}");
        }
    }
}

/// 64 experts with one row each (top-k routing of one token over many
/// experts), and a max_m larger than any expert needs.
#[test]
fn grouped_gemv_sixty_four_single_rows() {
    let test = "grouped_gemv_sixty_four_single_rows";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(512, 2048).unwrap();
    let tws = random_experts(&mut rng, 64, shape, 4);
    let experts = ctx.upload_experts(&tws).unwrap();
    let rows = vec![1usize; 64];
    run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &rows, 1, "64 experts f16 max_m=1");
    run_grouped::<bf16>(&ctx, &mut rng, &tws, &experts, &rows, 4, "64 experts bf16 max_m=4");
    // Most experts empty, the rest full.
    let sparse: Vec<usize> = (0..64).map(|e| if e % 9 == 4 { 3 } else { 0 }).collect();
    run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &sparse, 3, "64 experts sparse f16");
}

/// Experts large enough for the block variant (2^25 weights each, N not a
/// multiple of 32): rows [2, 0, 1, 4], max_m = 4, every expert equal to the
/// dense kernel alone.
#[test]
fn grouped_gemv_block_variant() {
    let test = "grouped_gemv_block_variant";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(4100, 8192).unwrap();
    assert!(!g::uses_slots(shape.n, shape.k));
    for bits in [2, 5] {
        let tws = random_experts(&mut rng, 4, shape, bits);
        let experts = ctx.upload_experts(&tws).unwrap();
        let what = format!("block variant k={bits}");
        let worst = run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &[2, 0, 1, 4], 4, &what);
        let worst = worst.max(run_grouped::<bf16>(&ctx, &mut rng, &tws, &experts, &[2, 0, 1, 4], 4, &what));
        eprintln!("{test}: k={bits}: max|y-ref|/max(|ref|,1) {worst:.2e}");
    }
}

/// A single expert holding all rows; the grouped call is then exactly the
/// dense one.
#[test]
fn grouped_gemv_one_expert() {
    let test = "grouped_gemv_one_expert";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    for &(k, n) in &[(2048usize, 512usize), (8192, 7)] {
        let shape = Shape::new(n, k).unwrap();
        for bits in [2, 5] {
            let tws = random_experts(&mut rng, 1, shape, bits);
            let experts = ctx.upload_experts(&tws).unwrap();
            for rows in 1..=4 {
                let what = format!("one expert {n}x{k} k={bits} rows={rows}");
                run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &[rows], rows, &what);
                run_grouped::<bf16>(&ctx, &mut rng, &tws, &experts, &[rows], 4, &what);
            }
        }
    }
}

/// Every expert empty: zero rows, nothing to compute, the call succeeds.
#[test]
fn grouped_gemv_all_experts_empty() {
    let test = "grouped_gemv_all_experts_empty";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(512, 2048).unwrap();
    let tws = random_experts(&mut rng, 8, shape, 3);
    let experts = ctx.upload_experts(&tws).unwrap();
    for max_m in 1..=4 {
        run_grouped::<f16>(&ctx, &mut rng, &tws, &experts, &[0; 8], max_m, "all empty");
    }
    ctx.synchronize().unwrap();
}

/// Same routing, same bits, every run.
#[test]
fn grouped_gemv_is_deterministic() {
    let test = "grouped_gemv_is_deterministic";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(2048, 512).unwrap();
    let tws = random_experts(&mut rng, 8, shape, 4);
    let experts = ctx.upload_experts(&tws).unwrap();
    let offsets = ctx.stream().clone_htod(&[0u32, 4, 5, 5, 8, 9, 12, 12, 16]).unwrap();
    let x: Vec<f16> = common::gaussian(&mut rng, 16 * 512, 1.0);
    let dx = ctx.stream().clone_htod(&x).unwrap();
    let mut first: Option<Vec<f16>> = None;
    for run in 0..3 {
        let mut dy = poisoned::<f16>(&ctx, 16 * 2048);
        ctx.grouped_gemv(&dx, &offsets, 4, &experts, &mut dy).unwrap();
        let got = ctx.stream().clone_dtoh(&dy).unwrap();
        match &first {
            None => first = Some(got),
            Some(f) => common::assert_bits_eq(&got, f, &format!("run {run}")),
        }
    }
}

// ---------------------------------------------------------------------------
// Argument validation (needs a Context, so it skips without a GPU)

#[test]
fn gemv_rejects_bad_arguments() {
    let test = "gemv_rejects_bad_arguments";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(64, 128).unwrap();
    let w = ctx.upload(&random_tiled(&mut rng, shape, &Codebook::nf(4).unwrap())).unwrap();
    let s = ctx.stream();
    let x = s.clone_htod(&vec![f16::ONE; 8 * 128]).unwrap();
    let mut y = s.alloc_zeros::<f16>(8 * 64).unwrap();
    for m in [0, 5, 8] {
        let e = ctx.gemv(&x.slice(0..m * 128), m, &w, &mut y.slice_mut(0..m * 64)).unwrap_err();
        assert!(matches!(e, Error::Rows { m: got, max: 4 } if got == m), "M={m}: {e}");
    }
    let e = ctx.gemv(&x.slice(0..2 * 128), 1, &w, &mut y.slice_mut(0..64)).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 128, got: 256, .. }), "{e}");
    let e = ctx.gemv(&x.slice(0..128), 1, &w, &mut y.slice_mut(0..65)).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 64, got: 65, .. }), "{e}");
    let e = ctx.gemv(&x.slice(1..129), 1, &w, &mut y.slice_mut(0..64)).unwrap_err();
    assert!(matches!(e, Error::Alignment { align: 16, .. }), "{e}");
    let xf = s.clone_htod(&vec![1.0f32; 128]).unwrap();
    let mut yf = s.alloc_zeros::<f32>(64).unwrap();
    let e = ctx.gemv(&xf, 1, &w, &mut yf).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    // The valid call still works after the rejected ones.
    ctx.gemv(&x.slice(0..128), 1, &w, &mut y.slice_mut(0..64)).unwrap();
    ctx.synchronize().unwrap();
}

#[test]
fn grouped_gemv_rejects_bad_arguments() {
    let test = "grouped_gemv_rejects_bad_arguments";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(64, 128).unwrap();
    let tws = random_experts(&mut rng, 3, shape, 2);
    let experts = ctx.upload_experts(&tws).unwrap();
    let s = ctx.stream();
    let x = s.clone_htod(&vec![bf16::ONE; 16 * 128]).unwrap();
    let mut y = s.alloc_zeros::<bf16>(16 * 64).unwrap();
    let off = s.clone_htod(&[0u32, 1, 3, 4]).unwrap();
    // Four rows: experts of 1, 2 and 1 rows.
    let (xl, yl) = (4 * 128, 4 * 64);
    for max_m in [0, 5] {
        let e = ctx.grouped_gemv(&x.slice(0..xl), &off, max_m, &experts, &mut y.slice_mut(0..yl)).unwrap_err();
        assert!(matches!(e, Error::Rows { .. }), "max_m={max_m}: {e}");
    }
    let e = ctx.grouped_gemv(&x.slice(0..xl), &off.slice(0..3), 2, &experts, &mut y.slice_mut(0..yl)).unwrap_err();
    assert!(matches!(e, Error::Length { expected: 4, got: 3, .. }), "{e}");
    let e = ctx.grouped_gemv(&x.slice(0..xl + 32), &off, 2, &experts, &mut y.slice_mut(0..yl)).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    let e = ctx.grouped_gemv(&x.slice(0..xl), &off, 2, &experts, &mut y.slice_mut(0..yl + 1)).unwrap_err();
    assert!(matches!(e, Error::Length { .. }), "{e}");
    // 7 rows cannot fit 3 experts of at most 2 rows.
    let e = ctx.grouped_gemv(&x.slice(0..7 * 128), &off, 2, &experts, &mut y.slice_mut(0..7 * 64)).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    let e = ctx.grouped_gemv(&x.slice(1..xl + 1), &off, 2, &experts, &mut y.slice_mut(0..yl)).unwrap_err();
    assert!(matches!(e, Error::Alignment { .. }), "{e}");
    let xf = s.clone_htod(&vec![1.0f32; 4 * 128]).unwrap();
    let mut yf = s.alloc_zeros::<f32>(4 * 64).unwrap();
    let e = ctx.grouped_gemv(&xf, &off, 2, &experts, &mut yf).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    // The valid call still works.
    ctx.grouped_gemv(&x.slice(0..xl), &off, 2, &experts, &mut y.slice_mut(0..yl)).unwrap();
    ctx.synchronize().unwrap();
}

#[test]
fn upload_experts_rejects_mismatched_experts() {
    let test = "upload_experts_rejects_mismatched_experts";
    let Some(ctx) = common::gpu(test) else { return };
    let mut rng = common::rng(test);
    let shape = Shape::new(64, 128).unwrap();
    let cb = Codebook::nf(3).unwrap();
    let a = random_tiled(&mut rng, shape, &cb);
    let other_shape = random_tiled(&mut rng, Shape::new(64, 96).unwrap(), &cb);
    let other_cb = random_tiled(&mut rng, shape, &Codebook::new((0..8).map(|i| i as f32 / 8.0).collect()).unwrap());
    assert!(matches!(ctx.upload_experts(&[]), Err(Error::Mismatch { .. })));
    let e = ctx.upload_experts(&[a.clone(), other_shape]).err().unwrap();
    assert!(matches!(e, Error::Mismatch { what, .. } if what.contains("shapes")), "{e}");
    let e = ctx.upload_experts(&[a.clone(), a.clone(), other_cb]).err().unwrap();
    assert!(matches!(e, Error::Mismatch { what, .. } if what.contains("codebooks")), "{e}");
    let ok = ctx.upload_experts(&[a.clone(), a]).unwrap();
    assert_eq!(ok.num_experts(), 2);
    assert_eq!(ok.expert_bytes(), shape.tiled_bytes(3));
    assert_eq!(ok.shape(), shape);
    assert_eq!(ok.bits(), 3);
}
