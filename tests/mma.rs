//! Kernel 2, the tensor-core dequant GEMM.
//!
//! CPU tests (always run): every thread → (row, column) map of the kernel
//! (`kbit_format::mma`) against the PTX definitions of `ldmatrix` and
//! `mma.m16n8k16` fragments, the pair/single index math against the format's
//! bit planes, the staged windows against the tile layout, the shared-memory
//! budgets and pipeline shapes of sm_89 and sm_90, the split-K planner for
//! 132, 128 and other SM counts (every output tile covered exactly once, no
//! empty split), and a model of the kernel's loader and compute cursors
//! (every K tile of every split computed exactly once, from the stage slot
//! the loader filled, partial stages included).
//!
//! GPU tests (skip visibly without a GPU) compare `Context::mma_gemm_with`
//! with two f64 references on fresh random data, outputs poisoned with NaN:
//! - `ref_t`: the kernel's exact weights `T(T(cb)·T(amax))` (a codebook
//!   rounded to T, then the reference dequantizer rounding to T), so only
//!   f32 accumulation and the final rounding differ. Asserted per element:
//!   `|y − ref_t| ≤ 1 ulp_T(|ref_t|) + K·2^-25·rms(ref_t)` (the second term
//!   bounds one f32 rounding of a partial sum per k16 step), and
//!   ‖y − ref_t‖/‖ref_t‖ < 2^-10 (f16) / 2^-7 (bf16).
//! - `ref_32`: `reference::dequantize_tiled::<f32>` weights `f32(cb·amax)`
//!   (the FORMAT reference), which differ from the kernel's by the rounding
//!   of cb and of the product to T: ‖y − ref_32‖/‖ref_32‖ < 2e-3 (f16) /
//!   1.2e-2 (bf16) — far inside FORMAT's rtol 0.2, atol 0.15·mean|ref|.

mod common;

use half::{bf16, f16};
use kbit::splitk::{self, Limits, Splits, TileConfig};
use kbit::wgmma_plan::Slots;
use kbit::{Codebook, Context, Element, Error, MmaOptions, ScaleMode, Shape, TiledWeight, reference};
use kbit_format::mma as geo;
use kbit_format::wgmma as geo_wg;
use kbit_format::{planes, tile};
use rand::Rng;
use rand::rngs::SmallRng;

// ---------------------------------------------------------------- CPU: maps

/// PTX `mma.m16n8k16` A fragment: register `i` of lane `l` holds
/// A[row][k], A[row][k+1] of the 16×16 tile.
fn mma_a(lane: u32, i: u32) -> (u32, u32) {
    let (g, t) = (lane / 4, lane % 4);
    (g + 8 * (i & 1), 2 * t + 8 * (i >> 1))
}

#[test]
fn ldmatrix_addresses_through_the_swizzle_yield_the_mma_a_fragment() {
    for mb in 0..4 {
        for kstep in 0..4 {
            // ldmatrix.x4: matrix i row j comes from lane 8i + j's address;
            // lane l receives row l/4, elements 2(l%4), +1 of each matrix.
            let row_addr = |lane: u32| geo::a_offset(geo::ldmatrix_row(mb, lane), geo::ldmatrix_chunk(kstep, lane));
            for lane in 0..32 {
                for i in 0..4 {
                    let addr = row_addr(8 * i + lane / 4) + 4 * (lane % 4);
                    // Decode the swizzled address back to (row, column).
                    let row = addr / geo::A_ROW_BYTES;
                    let chunk = ((addr % geo::A_ROW_BYTES) >> 4) ^ (row & 7);
                    let col = 8 * chunk + (addr % 16) / 2;
                    let (r, c) = mma_a(lane, i);
                    assert_eq!((row, col), (16 * mb + r, 16 * kstep + c), "mb {mb} kstep {kstep} lane {lane} a{i}");
                }
            }
            // Each 8-lane phase reads 8 rows in 8 distinct 16-byte bank groups.
            for i in 0..4 {
                let mut groups: Vec<u32> = (0..8).map(|j| (row_addr(8 * i + j) / 16) % 8).collect();
                groups.sort();
                groups.dedup();
                assert_eq!(groups.len(), 8, "ldmatrix phase {i} of mb {mb} kstep {kstep} has bank conflicts");
            }
        }
    }
}

#[test]
fn ldmatrix_x2_addresses_yield_the_upper_free_a_fragment() {
    for kstep in 0..4 {
        // ldmatrix.x2: matrix i row j comes from lane 8i + j's address; they
        // are A registers a0 and a2 (rows 0-7), and a1 = a3 = 0.
        let row_addr = |lane: u32| geo::a_offset(geo::ldmatrix_x2_row(lane), geo::ldmatrix_x2_chunk(kstep, lane));
        for lane in 0..32 {
            for (i, reg) in [(0, 0), (1, 2)] {
                let addr = row_addr(8 * i + lane / 4) + 4 * (lane % 4);
                let row = addr / geo::A_ROW_BYTES;
                let chunk = ((addr % geo::A_ROW_BYTES) >> 4) ^ (row & 7);
                let col = 8 * chunk + (addr % 16) / 2;
                let (r, c) = mma_a(lane, reg);
                assert_eq!((row, col), (r, 16 * kstep + c), "kstep {kstep} lane {lane} a{reg}");
            }
        }
        for i in 0..2 {
            let mut groups: Vec<u32> = (0..8).map(|j| (row_addr(8 * i + j) / 16) % 8).collect();
            groups.sort();
            groups.dedup();
            assert_eq!(groups.len(), 8, "ldmatrix.x2 phase {i} of kstep {kstep} has bank conflicts");
        }
    }
}

#[test]
fn b_fragments_cover_the_k_tile_once_in_mma_b_order() {
    for nf in [2u32, 4] {
        let tn = geo::tile_n(nf);
        let mut seen = vec![0u32; (tn * 64) as usize];
        for warp in 0..8 {
            let (kh, cg) = (geo::warp_k_half(warp), geo::warp_col_group(warp));
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                for f in 0..nf {
                    let col = geo::b_col(nf, cg, f, lane);
                    assert_eq!(col, cg * 8 * nf + 8 * f + g);
                    for q in 0..4 {
                        for e in 0..2 {
                            let k = 32 * kh + geo::b_elem(lane, q, e);
                            // PTX B map: b_r of k16 step s holds k rows 2t+e+8r, column g.
                            let (s2, r) = (q / 2, q % 2);
                            assert_eq!(k, 16 * (2 * kh + s2) + 8 * r + 2 * t + e);
                            seen[(col * 64 + k) as usize] += 1;
                        }
                    }
                }
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "tile_n {tn}: every (column, k) exactly once");
    }
}

#[test]
fn c_fragments_cover_the_output_tile_once_per_k_half() {
    for nf in [2u32, 4] {
        for mbs in 1..=4u32 {
            let tn = geo::tile_n(nf);
            let mut seen = vec![0u32; (16 * mbs * tn) as usize];
            for warp in 0..4 {
                let cg = geo::warp_col_group(warp);
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    for mb in 0..mbs {
                        for f in 0..nf {
                            for i in 0..4 {
                                let (r, c) = (geo::c_row(mb, lane, i), geo::c_col(nf, cg, f, lane, i));
                                assert_eq!((r, c), (16 * mb + g + 8 * (i / 2), cg * 8 * nf + 8 * f + 2 * t + i % 2));
                                seen[(r * tn + c) as usize] += 1;
                            }
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1));
            // Fragment order (epilogue buffer, workspace slot) is a bijection.
            assert_eq!(geo::slot_f32(mbs, nf), 16 * mbs * tn);
        }
    }
}

/// The M ≤ 8 operand swap on the CPU: one k16 step of two fragments
/// (16 weight columns) times 8 activation rows through the PTX register
/// maps of `mma.m16n8k16` (A: [`mma_a`]; B: b_r = k rows 2t + 8r, +1 of
/// column g; C: c_i = row g + 8(i / 2), column 2t + i % 2), with the
/// weights in the registers the B-fragment decode gives each lane and the
/// activations in those `ldmatrix.x2` gives (a0, a2 of the unswapped A
/// map). Every output lands where `swapped_c_pos` says, and
/// `swapped_source` finds every value of the unswapped C map.
#[test]
fn swapped_operands_put_every_output_where_the_maps_say() {
    let mut rng = common::rng("swapped_operands_put_every_output_where_the_maps_say");
    let w: Vec<[i64; 16]> = (0..16).map(|_| std::array::from_fn(|_| rng.random_range(-9..10))).collect();
    let x: Vec<[i64; 16]> = (0..8).map(|_| std::array::from_fn(|_| rng.random_range(-9..10))).collect();
    // Lane values as (low, high) element pairs.
    let b_frag = |f: u32, lane: u32, r: u32| {
        let (col, k) = ((8 * f + lane / 4) as usize, (2 * (lane % 4) + 8 * r) as usize);
        (w[col][k], w[col][k + 1])
    };
    let x_frag = |lane: u32, reg: u32| {
        let (row, k) = mma_a(lane, reg);
        (x[row as usize][k as usize], x[row as usize][k as usize + 1])
    };
    // Swapped registers of each lane: A from the two fragments, B from the x2 load.
    let a_regs = |lane: u32| [b_frag(0, lane, 0), b_frag(1, lane, 0), b_frag(0, lane, 1), b_frag(1, lane, 1)];
    let b_regs = |lane: u32| [x_frag(lane, 0), x_frag(lane, 2)];
    // The mma: gather A (16×16) and B (16×8) through the PTX maps.
    let mut a = [[0i64; 16]; 16];
    let mut b = [[0i64; 8]; 16];
    for lane in 0..32 {
        for (i, v) in a_regs(lane).into_iter().enumerate() {
            let (row, k) = mma_a(lane, i as u32);
            (a[row as usize][k as usize], a[row as usize][k as usize + 1]) = v;
        }
        for (r, v) in b_regs(lane).into_iter().enumerate() {
            let (k, col) = ((2 * (lane % 4) + 8 * r as u32) as usize, (lane / 4) as usize);
            (b[k][col], b[k + 1][col]) = v;
        }
    }
    let mut c = [[0i64; 4]; 32];
    for (lane, cl) in c.iter_mut().enumerate() {
        for (i, v) in cl.iter_mut().enumerate() {
            let (row, col) = (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2);
            *v = (0..16).map(|k| a[row][k] * b[k][col]).sum();
        }
    }
    let dot = |row: u32, col: u32| (0..16).map(|k| x[row as usize][k] * w[col as usize][k]).sum::<i64>();
    let mut seen = [[0u32; 16]; 8];
    for lane in 0..32u32 {
        for i in 0..4u32 {
            let (row, col) = geo::swapped_c_pos(0, lane, i);
            assert_eq!(c[lane as usize][i as usize], dot(row, col), "lane {lane} c{i} at ({row}, {col})");
            seen[row as usize][col as usize] += 1;
        }
        assert_eq!(geo::swapped_c_pos(3, lane, 1).1, geo::swapped_c_pos(0, lane, 1).1 + 48);
    }
    assert!(seen.iter().flatten().all(|&s| s == 1), "every (row, column) exactly once");
    for lane in 0..32u32 {
        for f in 0..4u32 {
            for e in 0..2u32 {
                let (src, reg) = geo::swapped_source(f, lane, e);
                let at = geo::swapped_c_pos(f / 2, src, reg);
                assert_eq!(at, (geo::c_row(0, lane, e), geo::c_col(4, 0, f, lane, e)), "lane {lane} f {f} e {e}");
            }
        }
    }
}

fn index_math_case<const K: usize>(rng: &mut SmallRng, mb: u32) {
    let words: [u32; K] = std::array::from_fn(|_| rng.random());
    let bits = K as u32;
    let (copies, entry) = (geo::table_copies(bits, mb), geo::entry_bytes(bits, mb));
    let index_bits = geo::table_index_bits(bits, mb);
    let split = geo::splits_low_bit(bits, mb);
    for lane in 0..32u32 {
        let two_t = 2 * (lane % 4);
        let rot = geo::rotations(two_t);
        let (lo, hi) = geo::entry_words(&words, &rot, geo::lane_bytes(lane, bits, mb), mb);
        let sel = geo::low_bit_selects(words[0], two_t);
        for q in 0..4u32 {
            let ia = planes::index(&words, (8 * q + two_t) as usize);
            let ib = planes::index(&words, (8 * q + two_t + 1) as usize);
            let at = geo::prmt(lo, hi, geo::entry_select(q));
            // Copy `lane % C` of entry `e` of a table of `table_bytes` bytes.
            assert_eq!(at % (entry * copies), entry * (lane % copies), "k={K} mb={mb} lane={lane} q={q}");
            assert!(at + entry <= geo::table_bytes(bits, mb), "k={K} mb={mb} address {at}");
            let pair = at / (entry * copies);
            let (ea, eb) = (geo::deinterleave(pair, 0, index_bits), geo::deinterleave(pair, 1, index_bits));
            if split {
                // The entry's two words with each value standing for its index.
                let w = [(2 * ea) | ((2 * eb) << 16), (2 * ea + 1) | ((2 * eb + 1) << 16)];
                let v = geo::prmt(w[0], w[1], sel[q as usize % 2] >> (16 * (q / 2)));
                assert_eq!((v & 0xFFFF, v >> 16), (ia, ib), "k={K} mb={mb} lane={lane} q={q}");
            } else {
                assert_eq!((ea, eb), (ia, ib));
            }
        }
    }
}

/// The merged form of the index words (the direct-load variant's) equals
/// the per-plane form for every lane, pair offset and random planes.
fn merged_words_case<const K: usize>(rng: &mut SmallRng) {
    let words: [u32; K] = std::array::from_fn(|_| rng.random());
    let pre = geo::prerotate(&words);
    for lane in 0..32u32 {
        let lanes = geo::lane_bytes(lane, K as u32, geo::PAIRS);
        for h in 0..4u32 {
            let want = geo::entry_words(&words, &geo::rotations(2 * h), lanes, geo::PAIRS);
            assert_eq!(geo::merged_pair_words(&pre, h, lanes), want, "k={K} lane={lane} h={h} {words:08x?}");
        }
    }
}

#[test]
fn merged_index_words_match_the_per_plane_form() {
    let mut rng = common::rng("merged_index_words_match_the_per_plane_form");
    for _ in 0..2000 {
        merged_words_case::<2>(&mut rng);
        merged_words_case::<3>(&mut rng);
        merged_words_case::<4>(&mut rng);
    }
}

#[test]
fn prmt_model_matches_the_ptx_definition() {
    // Plain byte picks, then sign replication (selector bit 3).
    assert_eq!(geo::prmt(0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
    assert_eq!(geo::prmt(0x4433_2211, 0x8877_6655, 0x0123), 0x1122_3344);
    assert_eq!(geo::prmt(0x4433_2211, 0x8877_6655, 0xF8F8), 0xFF00_FF00);
}

#[test]
fn pair_indices_match_the_bit_planes() {
    let mut rng = common::rng("pair_indices_match_the_bit_planes");
    for _ in 0..1000 {
        for mb in 0..=4 {
            // (0: the layout of the K-slot and warpgroup kernels, `PAIRS`.)
            index_math_case::<2>(&mut rng, mb);
            index_math_case::<3>(&mut rng, mb);
            index_math_case::<4>(&mut rng, mb);
            index_math_case::<5>(&mut rng, mb);
        }
    }
}

#[test]
fn staged_windows_locate_every_plane_word_and_scale() {
    for bits in 2..=5u64 {
        for n in [1u64, 7, 8, 72, 129, 4100] {
            for kt in 0..5u64 {
                for n0 in (0..n).step_by(64) {
                    let nv = (n - n0).min(64);
                    let (w0, woff, wend) = geo::w_window(n, kt, n0, nv, bits);
                    let (s0, soff, send) = geo::s_window(n, kt, n0, nv);
                    assert_eq!((w0 % 16, s0 % 16), (0, 0));
                    let (lo_w, lo_s) = geo::window_offsets(n as u32, kt as u32, n0 as u32, bits as u32);
                    assert_eq!((lo_w, lo_s), (woff, soff));
                    assert!(woff == 0 || (bits % 2 == 1 && woff == 8), "k={bits} offset {woff}");
                    // The staged span fits the chunks the stage reserves.
                    let nf = 2;
                    assert!(wend - w0 <= 16 * geo::w_chunks(nf, bits as u32) as u64);
                    assert!(send - s0 <= 16 * geo::s_chunks(nf) as u64);
                    for c in 0..nv {
                        for h in 0..2 {
                            let kb = 2 * kt + h;
                            let at = w0 + woff as u64 + (2 * bits * c + bits * h) * 4;
                            assert_eq!(at / 4, tile::word_index(n, n0 + c, kb, bits));
                            assert_eq!(s0 + soff as u64 + 2 * c + h, tile::scale_index(n, n0 + c, kb));
                        }
                    }
                }
            }
        }
    }
}

/// (name, per-block opt-in max, per-SM) shared memory of the GPUs we tune for.
const GPUS: [(&str, usize, usize); 2] = [("sm_89", 101_376, 102_400), ("sm_90", 232_448, 233_472)];

#[test]
fn every_instance_fits_sm89_and_sm90_with_a_deep_enough_pipeline() {
    for (gpu, per_block, per_sm) in GPUS {
        let mut table = String::new();
        for bits in 2..=5 {
            for mb in 1..=4 {
                for tn in [64, 128] {
                    for max_blocks in [3, 2, 1] {
                        let (slots, blocks) = splitk::slots_for(bits, mb, tn, per_block, per_sm, 1024, max_blocks)
                            .unwrap_or_else(|| panic!("{gpu}: k{bits} m{mb} n{tn} does not fit"));
                        assert!(blocks <= max_blocks);
                        let most = geo::smem_bytes(mb, tn / 32, bits, 1, slots) as usize;
                        assert!(most <= per_block && blocks as usize * (most + 1024) <= per_sm);
                        assert!((geo::MIN_STAGES..=geo::MAX_TILE_SLOTS).contains(&slots));
                        if gpu == "sm_90" {
                            assert!(slots >= 4, "{gpu}: k{bits} m{mb} n{tn} only {slots} slots");
                        }
                        // Every item length gets a shape within the slots.
                        let wide = geo::wide_stages(mb, tn / 32);
                        for tps in [1, 2, 3, 5, 16, 128] {
                            let (kt, stages) = splitk::stage_shape(slots, tn, wide, tps);
                            assert!((1..=geo::MAX_STAGE_TILES).contains(&kt) && kt < 2 * tps.max(1));
                            assert!((geo::MIN_STAGES..=geo::MAX_STAGES).contains(&stages), "{gpu} {slots} {tps}");
                            assert!(geo::smem_bytes(mb, tn / 32, bits, stages, kt) as usize <= most);
                        }
                        if blocks == 3 {
                            // A third block only with 12 slots: full-width stages
                            // (KT·TILE_N = 256, wide 512), at least 3 of them.
                            let (kt, stages) = splitk::stage_shape(slots, tn, wide, 128);
                            let columns = if wide { 512 } else { 256 };
                            assert!(slots >= 12 && kt * tn == columns && stages >= 3, "{slots} {kt} {stages}");
                        }
                        if max_blocks == 3 {
                            let (kt, stages) = splitk::stage_shape(slots, tn, wide, 128);
                            let smem = geo::smem_bytes(mb, tn / 32, bits, stages, kt) / 1024;
                            table += &format!(" k{bits}m{mb}n{tn}:{slots}x{blocks}=KT{kt}xS{stages}({smem}K)");
                        }
                    }
                }
            }
        }
        eprintln!("{gpu} slots x blocks/SM = KT x stages (smem), long items:{table}");
    }
    // Llama-70B gate/up at M 16 (k = 4, TILE_N 128) on sm_90: two blocks per
    // SM, wide stages of 4 K tiles (128 weights per thread), ≥ 32 KiB of
    // weights in flight per SM.
    let (slots, blocks) = splitk::slots_for(4, 1, 128, GPUS[1].1, GPUS[1].2, 1024, 2).unwrap();
    let (kt, stages) = splitk::stage_shape(slots, 128, geo::wide_stages(1, 4), 32);
    let w_tile = 128 * 2 * 4 * 4;
    assert_eq!((blocks, kt), (2, 4), "{slots} slots");
    assert!(blocks * (stages - 1) * kt * w_tile >= 32 * 1024, "{stages} stages");
}

#[test]
fn stage_shapes_aim_at_256_tile_columns_in_three_stages_or_512_in_two_when_wide() {
    assert_eq!(splitk::stage_shape(11, 128, false, 32), (2, 5));
    assert_eq!(splitk::stage_shape(34, 64, false, 4), (4, 8));
    // An item of 3 tiles is one partial stage of 4, one of 2 a full stage of 2.
    assert_eq!(splitk::stage_shape(34, 64, false, 3), (4, 8));
    assert_eq!(splitk::stage_shape(34, 64, false, 2), (2, 12));
    assert_eq!(splitk::stage_shape(4, 128, false, 32), (1, 4));
    assert_eq!(splitk::stage_shape(9, 64, false, 32), (2, 4));
    assert_eq!(splitk::stage_shape(2, 64, false, 100), (1, 2));
    assert_eq!(splitk::stage_shape(48, 64, false, 1), (1, 12));
    assert_eq!(splitk::stage_shape(48, 128, false, 1000), (2, 12));
    // Wide stages: 4 tiles of 128 columns while two such stages fit.
    assert_eq!(splitk::stage_shape(11, 128, true, 32), (4, 2));
    assert_eq!(splitk::stage_shape(11, 128, true, 3), (4, 2));
    assert_eq!(splitk::stage_shape(11, 128, true, 2), (2, 5));
    assert_eq!(splitk::stage_shape(7, 128, true, 32), (2, 3));
    assert_eq!(splitk::stage_shape(4, 128, true, 32), (2, 2));
    assert_eq!(splitk::stage_shape(48, 128, true, 1000), (4, 12));
}

#[test]
fn ptx_of_every_mma_kernel_has_the_designed_instructions() {
    let ptx = kbit::module::PTX;
    let names = kbit::module::names::all_mma();
    assert_eq!(names.len(), 64 + 12 + 32);
    for name in names {
        let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} missing"));
        let body = &ptx[start..];
        let body = &body[..body.find("\n}\n").unwrap()];
        let bf16 = name.ends_with("bf16");
        for insn in [
            "cp.async.wait_group",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            if bf16 {
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
            } else {
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
            },
            if bf16 { "fma.rn.bf16x2" } else { "mul.rn.f16x2" },
            "fence.acq_rel.gpu",
            "atom.acq_rel.gpu.global.add.u32",
            "st.relaxed.gpu.global.u32",
            "ld.global.cg.v4",
        ] {
            assert!(body.contains(insn), "{name}: {insn} missing");
        }
        assert!(!body.contains(".local"), "{name}: uses local memory");
    }
}

// ------------------------------------------------------------- CPU: planner

const LIMITS: Limits = Limits { workspace_f32: kbit::SPLITK_WORKSPACE_F32, counters: kbit::SPLITK_COUNTERS };

/// Checks the invariants of one plan: splits non-empty and partitioning K,
/// tiles partitioning N, every (tile, split) item assigned to exactly one
/// block of the grid, every block busy, workspace within the limits.
fn check_plan(p: &kbit::Plan, what: &str) {
    if p.stream {
        return check_stream_plan(p, what);
    }
    assert!(p.splits >= 1 && p.tiles_per_split >= 1, "{what}: {p:?}");
    assert_eq!(p.k_tiles as usize, (p.k as usize).div_ceil(64), "{what}");
    let mut next = 0;
    for s in 0..p.splits {
        let r = p.split_range(s);
        assert!(!r.is_empty(), "{what}: split {s} of {} is empty ({p:?})", p.splits);
        assert_eq!(r.start, next, "{what}: splits not contiguous");
        next = r.end;
    }
    assert_eq!(next, p.k_tiles, "{what}: splits do not cover K");
    // Pipeline shape: within the instance's slots, and each split's stages
    // partition its range into runs of at most KT tiles.
    assert!((1..=geo::MAX_STAGE_TILES).contains(&p.stage_tiles), "{what}: {p:?}");
    assert!((geo::MIN_STAGES..=geo::MAX_STAGES).contains(&p.stages), "{what}: {p:?}");
    assert!(p.stages * p.stage_tiles <= p.tile.tile_slots, "{what}: {p:?}");
    for s in 0..p.splits {
        let r = p.split_range(s);
        let mut at = r.start;
        for st in p.split_stages(s) {
            assert!(st.start == at && !st.is_empty() && st.len() <= p.stage_tiles as usize, "{what}: {st:?}");
            at = st.end;
        }
        assert_eq!(at, r.end, "{what}: split {s} stages");
    }
    let mut col = 0;
    for t in 0..p.n_tiles {
        let c = p.tile_columns(t);
        assert!(!c.is_empty() && c.start == col, "{what}: tile {t}");
        col = c.end;
    }
    assert_eq!(col, p.n, "{what}: tiles do not cover N");
    assert_eq!(p.items, p.n_tiles * p.splits);
    assert!(p.grid >= 1 && p.grid <= p.items, "{what}: grid {} items {}", p.grid, p.items);
    let mut seen = vec![0u8; p.items as usize];
    for b in 0..p.grid {
        let mut any = false;
        for i in p.block_items(b) {
            let (t, s) = p.item(i);
            assert!(t < p.n_tiles && s < p.splits);
            seen[(t * p.splits + s) as usize] += 1;
            any = true;
        }
        assert!(any, "{what}: block {b} has no work");
    }
    assert!(seen.iter().all(|&c| c == 1), "{what}: an item is not covered exactly once");
    if p.splits > 1 {
        assert_eq!(p.workspace_f32, p.items as usize * geo::slot_f32(p.tile.m_blocks, p.tile.tile_n / 32) as usize);
        assert!(p.workspace_f32 <= LIMITS.workspace_f32 && p.n_tiles as usize <= LIMITS.counters, "{what}");
    }
}

/// Stream-K: every (n tile, K tile) iteration in exactly one block's
/// pieces, every block busy with at most its share, each tile's pieces from
/// the blocks `tile_blocks` names (in order), slots `t + b` distinct.
fn check_stream_plan(p: &kbit::Plan, what: &str) {
    assert!(p.splits == 1 && p.tiles_per_split >= 1 && p.grid >= 1, "{what}: {p:?}");
    assert_eq!(p.items, p.n_tiles + p.grid, "{what}");
    assert!((1..=geo::MAX_STAGE_TILES).contains(&p.stage_tiles), "{what}: {p:?}");
    assert!(p.stages * p.stage_tiles <= p.tile.tile_slots && p.stages >= geo::MIN_STAGES, "{what}: {p:?}");
    let mut seen = vec![0u8; (p.n_tiles * p.k_tiles) as usize];
    let mut blocks_of: Vec<Vec<u32>> = vec![Vec::new(); p.n_tiles as usize];
    let mut slots = vec![false; p.items as usize];
    for b in 0..p.grid {
        let pieces = p.block_pieces(b);
        assert!(!pieces.is_empty(), "{what}: block {b} has no work");
        let work: u32 = pieces.iter().map(|(_, r)| r.len() as u32).sum();
        assert!(work <= p.tiles_per_split, "{what}: block {b} does {work}");
        for (t, r) in pieces {
            assert!(t < p.n_tiles && !r.is_empty() && r.end <= p.k_tiles, "{what}: block {b} piece {t} {r:?}");
            for kt in r {
                seen[(t * p.k_tiles + kt) as usize] += 1;
            }
            blocks_of[t as usize].push(b);
            let slot = (t + b) as usize;
            assert!(slot < slots.len() && !slots[slot], "{what}: slot {slot} reused");
            slots[slot] = true;
        }
    }
    assert!(seen.iter().all(|&c| c == 1), "{what}: an iteration is not covered exactly once");
    for (t, bs) in blocks_of.iter().enumerate() {
        assert_eq!(*bs, p.tile_blocks(t as u32).collect::<Vec<_>>(), "{what}: tile {t}");
    }
    assert_eq!(p.workspace_f32, p.items as usize * geo::slot_f32(p.tile.m_blocks, p.tile.tile_n / 32) as usize);
    assert!(p.workspace_f32 <= LIMITS.workspace_f32 && p.n_tiles as usize <= LIMITS.counters, "{what}");
}

fn planner_shapes() -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    v.extend(common::AWKWARD.iter().map(|&(_, k, n)| (k, n)));
    for k in [32, 96, 8192] {
        for n in [8, 72, 4100] {
            v.push((k, n));
        }
    }
    v.extend([(8192, 28672), (28672, 8192), (8192, 8192), (64, 1), (6400, 130)]);
    v
}

#[test]
fn planner_covers_every_tile_once_with_no_empty_split_on_132_and_128_sms() {
    let mut n_plans = 0;
    for sms in [132u32, 128, 108, 114, 170, 7, 1] {
        for (k, n) in planner_shapes() {
            for m in [1usize, 5, 16, 17, 33, 64] {
                let mb = m.div_ceil(16) as u32;
                for tn in [64u32, 128] {
                    for (bps, slots) in [(1u32, 2u32), (2, 5), (1, 11), (2, geo::MAX_TILE_SLOTS)] {
                        let tile = TileConfig { m_blocks: mb, tile_n: tn, tile_slots: slots, blocks_per_sm: bps };
                        let k_tiles = k.div_ceil(64) as u32;
                        let requests =
                            [Splits::Auto, Splits::Max, Splits::Stream, Splits::Fixed(1), Splits::Fixed(sms)];
                        for req in requests.into_iter().chain([3, 7, 33, 131, 132, 1000].map(Splits::Fixed)) {
                            let what = format!("sms {sms} K {k} N {n} M {m} tile {tn} x{bps} slots {slots} {req:?}");
                            let p = match splitk::plan(m, n, k, 4, sms, tile, req, LIMITS) {
                                Ok(p) => p,
                                // A fixed count (or stream-K) the 16 MiB workspace cannot hold is an
                                // error, never a clamp.
                                Err(Error::SplitK { .. })
                                    if matches!(req, Splits::Fixed(r) if r > 1) || req == Splits::Stream =>
                                {
                                    continue;
                                }
                                Err(e) => panic!("{what}: {e}"),
                            };
                            check_plan(&p, &what);
                            match req {
                                Splits::Fixed(1) => assert_eq!(p.splits, 1, "{what}"),
                                Splits::Fixed(r) => assert!(p.splits <= r.min(k_tiles), "{what}"),
                                _ => {}
                            }
                            n_plans += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{n_plans} plans checked");
}

#[test]
fn split_counts_are_normalized_so_none_is_empty() {
    // The reference launched s splits of ceil(k_tiles / s) tiles: with
    // k_tiles = 128 and 132 SMs the last 4 had no work and their tiles were
    // never written. Normalized: ceil(k_tiles / ceil(k_tiles / s)).
    assert_eq!(splitk::normalize_splits(128, 132), (128, 1));
    assert_eq!(splitk::normalize_splits(100, 33), (25, 4));
    assert_eq!(splitk::normalize_splits(32, 132), (32, 1));
    assert_eq!(splitk::normalize_splits(2, 3), (2, 1));
    assert_eq!(splitk::normalize_splits(1, 0), (1, 1));
    assert_eq!(splitk::normalize_splits(130, 128), (65, 2));
    for k_tiles in 1..=300 {
        for s in 1..=300 {
            let (sp, tps) = splitk::normalize_splits(k_tiles, s);
            assert!(sp <= s && sp >= 1 && (sp - 1) * tps < k_tiles && sp * tps >= k_tiles, "{k_tiles} {s}");
        }
    }
}

#[test]
fn planner_rejects_bad_requests_with_named_arguments() {
    let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 4, blocks_per_sm: 1 };
    let p = |m, n, k, sms, t, s| splitk::plan(m, n, k, 4, sms, t, s, LIMITS);
    assert!(matches!(p(0, 64, 64, 132, tile, Splits::Auto), Err(Error::Rows { m: 0, .. })));
    assert!(matches!(p(17, 64, 64, 132, tile, Splits::Auto), Err(Error::Rows { m: 17, max: 16 })));
    assert!(matches!(p(8, 0, 64, 132, tile, Splits::Auto), Err(Error::OutFeatures)));
    assert!(matches!(p(8, 64, 48, 132, tile, Splits::Auto), Err(Error::InFeatures(48))));
    assert!(matches!(p(8, 64, 64, 0, tile, Splits::Auto), Err(Error::SplitK { what: "sm_count", .. })));
    assert!(matches!(p(8, 64, 64, 132, tile, Splits::Fixed(0)), Err(Error::SplitK { what: "splits", .. })));
    let bad_tile = TileConfig { tile_n: 96, ..tile };
    assert!(matches!(p(8, 64, 64, 132, bad_tile, Splits::Auto), Err(Error::SplitK { what: "tile_n", .. })));
    // 4100 columns × 128 splits of 16 × 64 f32 partials exceed the workspace.
    let e = p(8, 4100, 8192, 132, tile, Splits::Fixed(128)).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "splits", value: 128, .. }), "{e}");
    // Max stays within it.
    let m = p(8, 4100, 8192, 132, tile, Splits::Max).unwrap();
    check_plan(&m, "max");
    // Forced stage shapes: 1..=4 tiles while two stages fit the slots.
    let bad_slots = TileConfig { tile_slots: 1, ..tile };
    assert!(matches!(p(8, 64, 64, 132, bad_slots, Splits::Auto), Err(Error::SplitK { what: "tile_slots", .. })));
    let q = p(8, 200, 2080, 132, tile, Splits::Fixed(1)).unwrap();
    for kt in [0, 3, 5] {
        let e = q.with_stage_tiles(kt, 4).unwrap_err();
        assert!(matches!(e, Error::SplitK { what: "stage_tiles", .. }), "{e}");
    }
    let q2 = q.with_stage_tiles(2, 4).unwrap();
    assert_eq!((q2.stage_tiles, q2.stages), (2, 2));
    assert_eq!(q2.smem_bytes, geo::smem_bytes(1, 2, 4, 2, 2));
    check_plan(&q2, "forced KT 2");
}

#[test]
fn a_lone_block_keeps_the_work_and_takes_longer_stages() {
    // Llama-3-8B gate/up at M 64, k 5, 128-column tiles of 4 m blocks: with
    // two blocks per SM the instance has 5 slots (stages of 1 K tile); the
    // 112 blocks of one split leave every SM one block, which may take 14.
    let tile = TileConfig { m_blocks: 4, tile_n: 128, tile_slots: 5, blocks_per_sm: 2 };
    let p = splitk::plan(64, 14336, 4096, 5, 132, tile, Splits::Auto, LIMITS).unwrap();
    assert_eq!((p.splits, p.grid, p.stage_tiles), (1, 112, 1), "{p:?}");
    let a = p.alone(14, 5);
    check_plan(&a, "alone");
    assert_eq!((a.splits, a.items, a.grid, a.tiles_per_split), (p.splits, p.items, p.grid, p.tiles_per_split));
    assert_eq!((a.tile.tile_slots, a.tile.blocks_per_sm, a.stage_tiles, a.stages), (14, 1, 2, 7), "{a:?}");
    assert_eq!(a.smem_bytes, geo::smem_bytes(4, 4, 5, 7, 2));
}

#[test]
fn auto_splits_fill_the_gpu_on_small_n() {
    // kv (K 2048, N 512) at M 8 on 132 SMs: 8 tiles of 64 columns alone would
    // leave 124 SMs idle.
    let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 32, blocks_per_sm: 2 };
    let p = splitk::plan(8, 512, 2048, 4, 132, tile, Splits::Auto, LIMITS).unwrap();
    assert!(p.splits > 1 && p.items >= 64, "{p:?}");
    // Llama-3-70B gate/up (K 8192, N 28672): enough tiles; the model may still
    // split a little to balance the waves, never past 8.
    let tile = TileConfig { m_blocks: 1, tile_n: 128, tile_slots: 11, blocks_per_sm: 2 };
    let p = splitk::plan(8, 28672, 8192, 4, 132, tile, Splits::Auto, LIMITS).unwrap();
    assert!(p.splits <= 8, "{p:?}");
    // Items long enough for whole wide stages (4 tiles).
    assert!(p.tiles_per_split >= 16 && p.stage_tiles == 4, "{p:?}");
    eprintln!(
        "70B gate/up on 132 SMs: {} splits of {} K tiles, {} items, grid {}, {} stages x {} K tiles",
        p.splits, p.tiles_per_split, p.items, p.grid, p.stages, p.stage_tiles
    );
}

#[test]
fn auto_splits_balance_blocks_that_share_an_sm() {
    // 70B gate/up at M 16, 64-column tiles, two blocks per SM (grid 264):
    // 2 splits give 896 items, 4 to some blocks and 3 to others, and an SM
    // may hold two blocks of 4 (8 items where the average is 6.8); 4 splits
    // give 1792 items, at most 7 per block (14 per SM against 13.6).
    let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 2 };
    let p = splitk::plan(16, 28672, 8192, 4, 132, tile, Splits::Auto, LIMITS).unwrap();
    assert_eq!((p.splits, p.items, p.grid), (4, 1792, 264), "{p:?}");
    let busiest = |splits: u32| splitk::cost(448, 128, splits, 132, tile, 4);
    assert!(busiest(4) < busiest(2), "{} vs {}", busiest(4), busiest(2));
    // A grid of at most one block per SM is charged one item per SM.
    let one = splitk::cost(112, 64, 1, 132, TileConfig { tile_n: 128, ..tile }, 4);
    assert_eq!(one, 64.0);
    let two = splitk::cost(224, 64, 1, 132, tile, 4);
    assert_eq!(two, 128.0);
}

#[test]
fn auto_splits_let_short_items_share_an_sm() {
    // Qwen3 q (2048 → 4096), M = 5: 64 tiles of 64 columns, 32 K tiles.
    // 4 splits of 8 tiles (256 blocks, two on most SMs) cost less than 2 of
    // 16 (128 blocks), at every k.
    let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 2 };
    for bits in 2..=5 {
        let p = splitk::plan(5, 4096, 2048, bits, 132, tile, Splits::Auto, LIMITS).unwrap();
        assert_eq!((p.splits, p.tiles_per_split, p.grid), (4, 8, 256), "k = {bits}: {p:?}");
    }
    // Half an item for the second block, only for short items of one m block.
    let short = splitk::cost(64, 32, 4, 132, tile, 4);
    assert!((short - (1.5 * 10.0 + 4.0 / 3.0 + 2.0)).abs() < 1e-9, "{short}");
    let two_m = TileConfig { m_blocks: 2, ..tile };
    let long = splitk::cost(64, 32, 4, 132, two_m, 4);
    assert!((long - (2.0 * 10.0 + 8.0 / 3.0 + 2.0)).abs() < 1e-9, "{long}");
    assert_eq!(splitk::cost(160, 32, 1, 132, tile, 4), 64.0);
}

#[test]
fn auto_splits_avoid_partial_stages() {
    // Qwen3 kv (2048 → 512), k = 5: 8 tiles of 64 columns, 32 K tiles, one
    // round of blocks. 11 splits of 3 tiles end every item in a partial
    // stage (KT = 4) and cost one tile more than their length; 8 splits of
    // 4 are whole stages and win.
    let tile = TileConfig { m_blocks: 1, tile_n: 64, tile_slots: 16, blocks_per_sm: 2 };
    let per_split = 4.0 / 15.0;
    let c11 = splitk::cost(8, 32, 11, 132, tile, 5);
    assert!((c11 - (3.0 + 1.0 + 2.0 + 11.0 * per_split + 2.0)).abs() < 1e-9, "{c11}");
    let c8 = splitk::cost(8, 32, 8, 132, tile, 5);
    assert!((c8 - (4.0 + 2.0 + 8.0 * per_split + 2.0)).abs() < 1e-9, "{c8}");
    let p = splitk::plan(5, 512, 2048, 5, 132, tile, Splits::Auto, LIMITS).unwrap();
    assert_eq!((p.splits, p.tiles_per_split, p.stage_tiles, p.stages), (8, 4, 4, 4), "{p:?}");
    // Without split-K the charge applies alike: 6 tiles at KT = 4.
    assert_eq!(splitk::cost(1, 6, 1, 132, tile, 4), 7.0);
    assert_eq!(splitk::cost(1, 8, 1, 132, tile, 4), 8.0);
    // Longer items are not charged (11 tiles: stages of 4 + 4 + 3).
    assert_eq!(splitk::cost(1, 11, 1, 132, tile, 4), 11.0);
}

/// The kernel's work walk (`kernels-gpu/src/mma.rs`, `run`), replayed on the
/// CPU: per block a loader cursor S−1 stages ahead of a compute cursor over
/// a ring of S stage buffers, stages of `min(KT, kt_end − kt)` tiles. Returns
/// how often each (n tile, K tile) was computed, after checking that every
/// stage computed was the one its buffer was loaded with.
fn replay_kernel_walk(p: &kbit::Plan) -> Vec<u32> {
    #[derive(Clone, Copy, PartialEq, Debug)]
    struct Cursor {
        item: u32,
        nt: u32,
        kt: u32,
        kt_end: u32,
    }
    let at = |item: u32| {
        let (nt, sp) = (item / p.splits, item % p.splits);
        let kt = sp * p.tiles_per_split;
        Cursor { item, nt, kt, kt_end: (kt + p.tiles_per_split).min(p.k_tiles) }
    };
    // Stream-K: the piece of block b from iteration g (the kernel's `piece`).
    let total = p.n_tiles * p.k_tiles;
    let piece = |b: u32, g: u32| {
        let end = ((b + 1) * p.tiles_per_split).min(total);
        let (nt, kt) = (g / p.k_tiles, g % p.k_tiles);
        let item = if g < end { nt + b } else { u32::MAX };
        Cursor { item, nt, kt, kt_end: (kt + end.saturating_sub(g)).min(p.k_tiles) }
    };
    let first = |b: u32| if p.stream { piece(b, b * p.tiles_per_split) } else { at(b) };
    let next = |c: &Cursor| {
        if p.stream { piece(c.item - c.nt, c.nt * p.k_tiles + c.kt_end) } else { at(c.item.saturating_add(p.grid)) }
    };
    let live = |c: &Cursor| c.item < p.items;
    let len = |c: &Cursor| c.kt_end.saturating_sub(c.kt).min(p.stage_tiles);
    let advance = |c: &mut Cursor| {
        c.kt += len(c);
        if c.kt == c.kt_end {
            *c = next(c);
        }
    };
    let mut seen = vec![0u32; (p.n_tiles * p.k_tiles) as usize];
    for b in 0..p.grid {
        let s = p.stages as usize;
        let mut ring: Vec<Option<(u32, u32, u32)>> = vec![None; s];
        let mut ld = first(b);
        let mut cs = ld;
        let (mut w, mut r) = (0usize, 0usize);
        for _ in 1..s {
            ring[w] = live(&ld).then(|| (ld.item, ld.kt, len(&ld)));
            if live(&ld) {
                advance(&mut ld);
            }
            w = (w + 1) % s;
        }
        while live(&cs) {
            // The buffer refilled now was computed in the previous iteration.
            assert_eq!((w + 1) % s, r, "block {b}: loader and compute out of step");
            ring[w] = live(&ld).then(|| (ld.item, ld.kt, len(&ld)));
            if live(&ld) {
                advance(&mut ld);
            }
            w = (w + 1) % s;
            let n = len(&cs);
            assert!(n >= 1 && n <= p.stage_tiles);
            assert_eq!(ring[r], Some((cs.item, cs.kt, n)), "block {b}: stage buffer holds another stage");
            for j in 0..n {
                seen[(cs.nt * p.k_tiles + cs.kt + j) as usize] += 1;
            }
            r = (r + 1) % s;
            cs.kt += n;
            if cs.kt == cs.kt_end {
                cs = next(&cs);
            }
        }
    }
    seen
}

#[test]
fn kernel_walk_computes_every_k_tile_once_from_the_stage_it_loaded() {
    let mut n_plans = 0;
    for sms in [132u32, 128, 7, 1] {
        for (k, n) in [(8192usize, 72usize), (2080, 520), (96, 4100), (32, 130), (6400, 130), (8192, 28672)] {
            for req in [Splits::Auto, Splits::Max, Splits::Stream, Splits::Fixed(1), Splits::Fixed(5), Splits::Fixed(7)]
            {
                for slots in [2u32, 5, 11, geo::MAX_TILE_SLOTS] {
                    let tile = TileConfig { m_blocks: 1, tile_n: 128, tile_slots: slots, blocks_per_sm: 2 };
                    let base = splitk::plan(16, n, k, 4, sms, tile, req, LIMITS).unwrap();
                    for kt in [None, Some(1), Some(2), Some(3), Some(4)] {
                        let p = match kt {
                            None => base,
                            Some(kt) => match base.with_stage_tiles(kt, 4) {
                                Ok(p) => p,
                                Err(_) => continue,
                            },
                        };
                        let seen = replay_kernel_walk(&p);
                        assert!(seen.iter().all(|&c| c == 1), "K {k} N {n} sms {sms} {req:?} {p:?}");
                        n_plans += 1;
                    }
                }
            }
        }
    }
    eprintln!("{n_plans} kernel walks replayed");
}

// ------------------------------------------------------------------ GPU

/// Unit in the last place of `v` in T (f16: 11 significant bits, min
/// subnormal 2^-24; bf16: 8 bits).
fn ulp<T: Element>(v: f64) -> f64 {
    let (mant, min) = match T::DTYPE {
        kbit::Dtype::F16 => (10, -24),
        _ => (7, -133),
    };
    let e = if v == 0.0 { min } else { (v.abs().log2().floor() as i32 - mant).max(min) };
    2f64.powi(e)
}

struct Case {
    m: usize,
    k: usize,
    n: usize,
    bits: u32,
    splits: Splits,
    sms: Option<u32>,
    /// Forced K tiles per stage (partial stages), `None` for the planner's.
    stage_tiles: Option<u32>,
}

/// Quantized weight with its two references' weights.
struct Prepared<T> {
    dev: kbit::KbitWeight,
    w_t: Vec<T>,
    w_32: Vec<f32>,
}

fn prepare<T: Element>(ctx: &Context, rng: &mut SmallRng, k: usize, n: usize, bits: u32) -> Prepared<T> {
    let shape = Shape::new(n, k).unwrap();
    let cb = Codebook::nf(bits).unwrap();
    let scale = rng.random_range(0.05f32..3.0);
    let w: Vec<f32> = common::gaussian(rng, shape.numel(), scale);
    let tiled = reference::repack(&reference::quantize(&w, shape, &cb).unwrap(), ScaleMode::Strict).unwrap();
    let w_32 = reference::dequantize_tiled::<f32>(&tiled);
    // The kernel's weights: codebook rounded to T, product rounded to T
    // (f32(T(cb)·amax) is exact, so dequantize_tiled::<T> rounds it once).
    let cb_t = Codebook::new(cb.values().iter().map(|&v| T::from_f32_rne(v).to_f32()).collect()).unwrap();
    let as_t = TiledWeight::from_parts(shape, cb_t, tiled.packed().to_vec(), tiled.scales().to_vec()).unwrap();
    let w_t = reference::dequantize_tiled::<T>(&as_t);
    Prepared { dev: ctx.upload(&tiled).unwrap(), w_t, w_32 }
}

/// [`prepare`] and `m` rows of fresh activations, on the host and on the
/// device.
fn prepare_with_x<T: Element>(
    ctx: &Context,
    rng: &mut SmallRng,
    k: usize,
    n: usize,
    bits: u32,
    m: usize,
) -> (Prepared<T>, Vec<T>, cudarc::driver::CudaSlice<T>) {
    let p = prepare::<T>(ctx, rng, k, n, bits);
    let x: Vec<T> = common::uniform(rng, m * k);
    let xd = ctx.stream().clone_htod(&x).unwrap();
    (p, x, xd)
}

/// Runs one call into a NaN-poisoned output and returns it.
fn run<T: Element>(
    ctx: &Context,
    x: &cudarc::driver::CudaSlice<T>,
    m: usize,
    w: &kbit::KbitWeight,
    opts: MmaOptions,
) -> (Vec<T>, kbit::Plan) {
    let mut y = ctx.stream().clone_htod(&vec![T::nan(); m * w.shape().n]).unwrap();
    let plan = ctx.mma_gemm_with(x, m, w, &mut y, opts).unwrap();
    (ctx.stream().clone_dtoh(&y).unwrap(), plan)
}

/// Asserts `y` = `x · Wᵀ` (m rows) against both references of `p` (see
/// the module docs for the bounds).
fn assert_matches<T: Element>(what: &str, x: &[T], m: usize, shape: Shape, p: &Prepared<T>, y: &[T]) {
    let got: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    let ref_t = reference::matmul_f64(x, m, &p.w_t, shape).unwrap();
    let ref_32 = reference::matmul_f64(x, m, &p.w_32, shape).unwrap();
    let rms = (ref_t.iter().map(|v| v * v).sum::<f64>() / ref_t.len() as f64).sqrt();
    // f32 accumulation: at most one rounding of a partial sum (|s| ≲ 4·rms)
    // per k16 step, ≤ 2^-23 relative each even if truncating: K/16 · 2^-23 · 4·rms.
    let accumulation = shape.k as f64 * 2f64.powi(-25) * rms;
    for (i, (&g, &r)) in got.iter().zip(&ref_t).enumerate() {
        let bound = ulp::<T>(r) + accumulation;
        assert!(
            (g as f64 - r).abs() <= bound,
            "{what}: y[{}, {}] = {g}, exact-weight reference {r} (bound {bound:e})",
            i / shape.n,
            i % shape.n
        );
    }
    let (fro_t, _) = common::errors(&got, &ref_t, 1.0);
    let (fro_32, _) = common::errors(&got, &ref_32, 1.0);
    let (lim_t, lim_32) = if T::DTYPE == kbit::Dtype::F16 { (2f64.powi(-10), 2e-3) } else { (2f64.powi(-7), 1.2e-2) };
    assert!(fro_t < lim_t, "{what}: relative Frobenius error vs exact weights {fro_t:e}");
    assert!(fro_32 < lim_32, "{what}: relative Frobenius error vs f32 weights {fro_32:e}");
}

fn check_case<T: Element>(ctx: &Context, rng: &mut SmallRng, c: &Case) {
    let shape = Shape::new(c.n, c.k).unwrap();
    let p = prepare::<T>(ctx, rng, c.k, c.n, c.bits);
    let x: Vec<T> = common::uniform(rng, c.m * c.k);
    let xd = ctx.stream().clone_htod(&x).unwrap();
    let opts = MmaOptions {
        splits: c.splits,
        sm_count_override: c.sms,
        stage_tiles: c.stage_tiles,
        tile_rows: None,
        k_slots: None,
        // The pipelined kernel's plans: the direct-load variant has its own test.
        direct: Some(false),
        teams: None,
        early_decode: None,
        x_registers: None,
    };
    if let Err(e @ Error::SplitK { what: "stage_tiles", .. }) = ctx.mma_plan(T::DTYPE, c.m, &p.dev, opts) {
        // Only where this GPU's shared memory holds fewer than two such stages.
        eprintln!("M {} K {} N {} k={}: {e}; case skipped", c.m, c.k, c.n, c.bits);
        return;
    }
    let (y, plan) = run(ctx, &xd, c.m, &p.dev, opts);
    let what = format!(
        "M {} K {} N {} k={} {:?} {:?} sms {:?} KT {:?} -> {} splits x {} K tiles, tile {}x{}, grid {}, {} stages x {}",
        c.m,
        c.k,
        c.n,
        c.bits,
        T::DTYPE,
        c.splits,
        c.sms,
        c.stage_tiles,
        plan.splits,
        plan.tiles_per_split,
        16 * plan.tile.m_blocks,
        plan.tile.tile_n,
        plan.grid,
        plan.stages,
        plan.stage_tiles
    );
    if let Some(kt) = c.stage_tiles {
        assert_eq!(plan.stage_tiles, kt, "{what}");
    }
    if c.splits == Splits::Fixed(1) {
        assert_eq!(plan.splits, 1, "{what}");
    }
    assert_matches(&what, &x, c.m, shape, &p, &y);
    // Same call again, no re-zeroing in between: identical bits.
    let (again, _) = run(ctx, &xd, c.m, &p.dev, opts);
    common::assert_bits_eq(&again, &y, &format!("{what}: repeated call"));
}

/// M values, shapes (K, N) and split policies; each case takes the next M,
/// k and dtype from rotations, so every value appears without the full
/// cartesian product.
fn cases() -> Vec<(Case, bool)> {
    const MS: [usize; 10] = [5, 8, 13, 16, 17, 31, 32, 33, 48, 64];
    let mut shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    shapes.extend([(2048, 8), (1024, 72), (512, 4100), (32, 512), (96, 1024), (8192, 512), (8192, 72), (96, 4100)]);
    let mut v = Vec::new();
    let mut i = 0usize;
    for &(k, n) in &shapes {
        for splits in [Splits::Fixed(1), Splits::Max, Splits::Auto] {
            let bits = 2 + (i % 4) as u32;
            let bf16 = (i / 4 + i) % 2 == 1;
            v.push((Case { m: MS[(i * 3) % MS.len()], k, n, bits, splits, sms: None, stage_tiles: None }, bf16));
            i += 1;
        }
    }
    // Other GPUs' SM counts: the plan changes, the results must not.
    for (j, sms) in [128u32, 132, 7, 1].into_iter().enumerate() {
        let bits = 2 + j as u32;
        let sms = Some(sms);
        v.push((
            Case { m: MS[j * 3 % 10], k: 2048, n: 520, bits, splits: Splits::Auto, sms, stage_tiles: None },
            j % 2 == 0,
        ));
        v.push((Case { m: 16, k: 8192, n: 72, bits, splits: Splits::Max, sms, stage_tiles: None }, j % 2 == 1));
    }
    // Stream-K on few SMs: a block's range spans whole tiles (written
    // directly) and pieces of others; the zero half tile of K % 64 == 32.
    // Only the (k, m16 blocks) that have stream-K instances (128 columns).
    let stream = [(16, 8192, 1000, 3, 3u32), (5, 2080, 130, 4, 1), (60, 2080, 520, 4, 5), (64, 96, 4100, 5, 2)];
    for (j, (m, k, n, bits, sms)) in stream.into_iter().enumerate() {
        let case = Case { m, k, n, bits, splits: Splits::Stream, sms: Some(sms), stage_tiles: None };
        v.push((case, j % 2 == 0));
    }
    // Forced stage shapes: split ranges that KT does not divide (partial last
    // stages), KT above the item length (every stage partial), the zero half
    // tile of K % 64 == 32 in a partial stage, items crossing in one block.
    let forced = [
        (13, 8192, 72, Splits::Fixed(5), None, 4),
        (33, 8192, 200, Splits::Fixed(5), None, 3),
        (64, 2048, 520, Splits::Fixed(7), None, 3),
        (5, 96, 1024, Splits::Fixed(1), None, 4),
        (17, 2080, 130, Splits::Fixed(1), None, 4),
        (31, 2080, 520, Splits::Fixed(3), Some(7), 4),
        (48, 4096, 4100, Splits::Auto, Some(128), 2),
        (8, 2080, 72, Splits::Max, Some(132), 3),
        (32, 6400, 130, Splits::Fixed(9), Some(1), 4),
        (16, 8192, 1000, Splits::Auto, Some(132), 1),
    ];
    for (j, (m, k, n, splits, sms, kt)) in forced.into_iter().enumerate() {
        let bits = 2 + (j % 4) as u32;
        v.push((Case { m, k, n, bits, splits, sms, stage_tiles: Some(kt) }, j % 3 == 1));
    }
    v
}

#[test]
fn mma_gemm_matches_the_f64_references() {
    let cs = cases();
    // Coverage of the rotation (checked without a GPU too).
    for m in [5, 8, 13, 16, 17, 31, 32, 33, 48, 64] {
        assert!(cs.iter().any(|(c, _)| c.m == m), "M {m} not covered");
    }
    for bits in 2..=5 {
        for bf in [false, true] {
            assert!(cs.iter().any(|(c, b)| c.bits == bits && *b == bf), "k={bits} bf16={bf} not covered");
        }
    }
    for (k, n) in [(32, 512), (96, 1024), (8192, 512), (2048, 8), (1024, 72), (512, 4100)] {
        assert!(cs.iter().any(|(c, _)| c.k == k && c.n == n));
    }
    let Some(ctx) = common::gpu("mma_gemm_matches_the_f64_references") else { return };
    let mut rng = common::rng("mma_gemm_matches_the_f64_references");
    for (c, bf) in &cs {
        if *bf {
            check_case::<bf16>(&ctx, &mut rng, c);
        } else {
            check_case::<f16>(&ctx, &mut rng, c);
        }
    }
    eprintln!("mma_gemm: {} cases match", cs.len());
}

/// What [`forced_run`] leaves for further calls on the same data.
struct ForcedRun<T: Element> {
    weight: kbit::KbitWeight,
    x: cudarc::driver::CudaSlice<T>,
    y: Vec<T>,
    plan: kbit::Plan,
}

/// One call of `m` rows under `opts` (a forced variant) on fresh data,
/// checked against the references and repeated (identical bits); returns
/// its plan with the weight, activations and output for further calls.
fn forced_run<T: Element>(
    ctx: &Context,
    rng: &mut SmallRng,
    what: &str,
    m: usize,
    shape: Shape,
    bits: u32,
    opts: MmaOptions,
) -> ForcedRun<T> {
    let p = prepare::<T>(ctx, rng, shape.k, shape.n, bits);
    let x: Vec<T> = common::uniform(rng, m * shape.k);
    let xd = ctx.stream().clone_htod(&x).unwrap();
    let (y, plan) = run(ctx, &xd, m, &p.dev, opts);
    assert_matches(what, &x, m, shape, &p, &y);
    let (again, _) = run(ctx, &xd, m, &p.dev, opts);
    common::assert_bits_eq(&again, &y, &format!("{what}: repeated call"));
    ForcedRun { weight: p.dev, x: xd, y, plan }
}

/// [`forced_run`] of `case` in its dtype; its plan.
fn forced_plan(ctx: &Context, rng: &mut SmallRng, case: Pair, opts: MmaOptions) -> kbit::Plan {
    let Pair { what, m, shape, bits, bf16: bf } = case;
    if bf {
        forced_run::<bf16>(ctx, rng, what, m, shape, bits, opts).plan
    } else {
        forced_run::<f16>(ctx, rng, what, m, shape, bits, opts).plan
    }
}

/// The K-slot variant (`MmaOptions::k_slots`), forced on every k, both
/// dtypes and every block width (8, 16 and 32 columns, chosen by N against
/// the SM count), against the f64 references: M = 1..16, the design's
/// shapes and awkward ones (N = 8, 72, 4100: partial blocks and windows
/// that start mid-chunk; K = 32, 96: slots without tiles, and K % 64 == 32:
/// the zero half tile), poisoned outputs, and a repeated call bit-identical.
#[test]
fn kslots_variant_matches_the_f64_references() {
    let Some(ctx) = common::gpu("kslots_variant_matches_the_f64_references") else { return };
    let mut rng = common::rng("kslots_variant_matches_the_f64_references");
    let mut shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    shapes.extend([(32, 4100), (96, 72), (8192, 8), (8192, 4100), (2080, 520), (4096, 14336)]);
    let ms = [1usize, 2, 3, 4, 5, 8, 13, 16];
    let mut widths = std::collections::BTreeSet::new();
    let i = for_each_case(&shapes, |i, shape, bits, bf| {
        let m = ms[i % ms.len()];
        let what = format!("K-slot M {m} K {} N {} k={bits} bf16={bf}", shape.k, shape.n);
        let opts = MmaOptions { k_slots: Some(true), ..MmaOptions::default() };
        let plan = forced_plan(&ctx, &mut rng, Pair { what: &what, m, shape, bits, bf16: bf }, opts);
        assert!(plan.k_slots && plan.splits == 1 && plan.workspace_f32 == 0, "{what}: {plan:?}");
        assert_eq!(plan.grid as usize, shape.n.div_ceil(plan.tile.tile_n as usize), "{what}: {plan:?}");
        widths.insert(plan.tile.tile_n);
    });
    assert_eq!(widths.into_iter().collect::<Vec<_>>(), [8, 16, 32], "every block width tested");
    // Past one m block, and any split policy but the automatic one, are
    // refused by name.
    let opts = MmaOptions { k_slots: Some(true), ..MmaOptions::default() };
    refuses_rows_past_and_fixed_splits(&ctx, &mut rng, opts, 16, "k_slots");
    eprintln!("K-slot variant: {i} cases match");
}

/// A forced variant (`opts`) refuses `max + 1` rows by name
/// (`Error::Rows`), and any split policy but the automatic one
/// (`Error::SplitK` naming the option `what`).
fn refuses_rows_past_and_fixed_splits(ctx: &Context, rng: &mut SmallRng, opts: MmaOptions, max: usize, what: &str) {
    let p = prepare::<f16>(ctx, rng, 64, 64, 4);
    let x = ctx.stream().clone_htod(&vec![f16::ZERO; (max + 1) * 64]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>((max + 1) * 64).unwrap();
    let e = ctx.mma_gemm_with(&x, max + 1, &p.dev, &mut y, opts).unwrap_err();
    assert!(matches!(e, Error::Rows { m, max: mx } if m == max + 1 && mx == max), "{e}");
    let fixed = MmaOptions { splits: Splits::Fixed(2), ..opts };
    let e = ctx.mma_gemm_with(&x, max, &p.dev, &mut y, fixed).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: w, .. } if w == what), "{e}");
}

/// Calls `case(i, shape, k, bf16)` for every (K, N) of `shapes`, k = 2..5
/// and both dtypes, i counting from 0; returns the count.
fn for_each_case(shapes: &[(usize, usize)], mut case: impl FnMut(usize, Shape, u32, bool)) -> usize {
    let mut i = 0;
    for &(k, n) in shapes {
        for bits in 2..=5u32 {
            for bf in [false, true] {
                case(i, Shape::new(n, k).unwrap(), bits, bf);
                i += 1;
            }
        }
    }
    i
}

/// The direct-load variant (`MmaOptions::direct`), forced on every k, both
/// dtypes and M = 1..8 (one, four and eight staged rows; sixteen in the
/// next test), against the f64
/// references: the design's shapes and awkward ones (N = 8, 72, 129, 2312,
/// 4100: partial groups; K = 32, 96, 160, 2080: steps with blocks past K;
/// more groups than blocks; two groups per block on half the slots at
/// N = 2312 and 4096, 4100 from M = 2 or 5), poisoned outputs, and a
/// repeated call bit-identical.
#[test]
fn direct_variant_matches_the_f64_references() {
    let Some(ctx) = common::gpu("direct_variant_matches_the_f64_references") else { return };
    let mut rng = common::rng("direct_variant_matches_the_f64_references");
    let mut shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    let awkward = [(32, 4100), (96, 72), (160, 129), (8192, 8), (8192, 4100), (2080, 520), (4096, 14336), (2048, 2312)];
    shapes.extend(awkward);
    let i = for_each_case(&shapes, |i, shape, bits, bf| {
        // Every M on every shape, each with other k and dtypes.
        let m = 1 + (i + i / 8) % 8;
        let (k, n) = (shape.k, shape.n);
        let what = format!("direct M {m} K {k} N {n} k={bits} bf16={bf}");
        let opts = MmaOptions { direct: Some(true), ..MmaOptions::default() };
        let plan = forced_plan(&ctx, &mut rng, Pair { what: &what, m, shape, bits, bf16: bf }, opts);
        assert!(plan.direct && !plan.k_slots && plan.splits == 1 && plan.workspace_f32 == 0, "{what}: {plan:?}");
        assert_eq!(plan.n_tiles as usize, n.div_ceil(16), "{what}: {plan:?}");
        assert!(plan.grid >= 1 && plan.grid <= plan.n_tiles, "{what}: {plan:?}");
    });
    // Past sixteen rows, and any split policy but the automatic one, are
    // refused by name.
    let opts = MmaOptions { direct: Some(true), ..MmaOptions::default() };
    refuses_rows_past_and_fixed_splits(&ctx, &mut rng, opts, 16, "direct");
    eprintln!("direct-load variant: {i} cases match");
}

/// The direct-load variant at M = 9..16 (sixteen staged rows, two column
/// tiles per step), forced on every k and both dtypes, against the f64
/// references on the design's shapes and awkward ones (K = 32, 96, 160,
/// 2080: steps with blocks past K; N = 72, 129, 520, 2312: partial groups;
/// K = 5120: 160 KiB of staged rows), poisoned outputs, a repeated call
/// bit-identical; and rows 0..8 and 8..M each bit for bit the direct-load
/// call on those rows alone (each tile's mmas run in the eight-row order).
/// Where sixteen rows of K do not fit a block's shared memory (K = 8192)
/// the call is refused by name.
#[test]
fn direct_sixteen_rows_match_the_references_and_eight() {
    let Some(ctx) = common::gpu("direct_sixteen_rows_match_the_references_and_eight") else { return };
    let mut rng = common::rng("direct_sixteen_rows_match_the_references_and_eight");
    let mut shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    shapes.extend([(32, 4100), (96, 72), (160, 129), (2080, 520), (2048, 2312)]);
    let opts = MmaOptions { direct: Some(true), ..MmaOptions::default() };
    fn go<T: Element>(ctx: &Context, rng: &mut SmallRng, what: &str, m: usize, shape: Shape, bits: u32) {
        let opts = MmaOptions { direct: Some(true), ..MmaOptions::default() };
        let r = forced_run::<T>(ctx, rng, what, m, shape, bits, opts);
        assert!(r.plan.direct && r.plan.teams == 1 && !r.plan.x_registers, "{what}: {:?}", r.plan);
        let (k, n) = (shape.k, shape.n);
        let x = ctx.stream().clone_dtoh(&r.x).unwrap();
        for (lo, hi) in [(0, 8), (8, m)] {
            let xd = ctx.stream().clone_htod(&x[lo * k..hi * k]).unwrap();
            let (y, plan) = run(ctx, &xd, hi - lo, &r.weight, opts);
            let rows = format!("{what}: rows {lo}..{hi} against {plan:?}");
            common::assert_bits_eq(&y, &r.y[lo * n..hi * n], &rows);
        }
    }
    let i = for_each_case(&shapes, |i, shape, bits, bf| {
        let m = 9 + (i + i / 8) % 8;
        let what = format!("direct M {m} K {} N {} k={bits} bf16={bf}", shape.k, shape.n);
        if bf {
            go::<bf16>(&ctx, &mut rng, &what, m, shape, bits);
        } else {
            go::<f16>(&ctx, &mut rng, &what, m, shape, bits);
        }
    });
    let p = prepare::<f16>(&ctx, &mut rng, 8192, 64, 4);
    let x = ctx.stream().clone_htod(&vec![f16::ZERO; 9 * 8192]).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(9 * 64).unwrap();
    let e = ctx.mma_gemm_with(&x, 9, &p.dev, &mut y, opts).unwrap_err();
    assert!(matches!(e, Error::SharedMemory { .. }), "{e}");
    eprintln!("direct-load variant, sixteen rows: {i} cases match");
}

/// The direct-load variant with two teams per block (`Plan::teams`,
/// forced by `MmaOptions::teams`, on a plan for 2 or 3 SMs so that teams
/// walk several groups) matches the f64 references and gives the one-team
/// plan's outputs bit for bit (a group's warps are added in the same order
/// whichever team runs it): k = 2..4, both dtypes, M = 1..8 (1, 4 and 8
/// staged rows), K % 128 ≠ 0, partial groups, teams with unequal group
/// counts and (N = 72, 5 groups on 3 blocks) a block whose second team
/// has no group. k = 5 (no two-team instance) is refused by name.
#[test]
fn direct_teams_match_one_team_and_the_references() {
    let Some(ctx) = common::gpu("direct_teams_match_one_team_and_the_references") else { return };
    let mut rng = common::rng("direct_teams_match_one_team_and_the_references");
    let mut i = 0usize;
    for (k, n) in [(2080, 520), (96, 72), (8192, 4100), (160, 129), (4096, 2312)] {
        for bits in 2..=4u32 {
            for bf in [false, true] {
                // Each shape at M = 1, 2, 4, 5, 8, 3.
                let m = [1, 2, 4, 5, 8, 3][i % 6];
                let sms = if n == 72 { 3 } else { 2 + (i % 2) as u32 };
                i += 1;
                let shape = Shape::new(n, k).unwrap();
                let what = format!("direct teams M {m} K {k} N {n} k={bits} bf16={bf} sms {sms}");
                let base = MmaOptions { direct: Some(true), sm_count_override: Some(sms), ..MmaOptions::default() };
                let (two, one) = (MmaOptions { teams: Some(true), ..base }, MmaOptions { teams: Some(false), ..base });
                let case = Pair { what: &what, m, shape, bits, bf16: bf };
                let (plan, plan1) = forced_pair(&ctx, &mut rng, case, two, one);
                assert!(plan.direct && plan.teams == 2 && plan.grid <= 3, "{what}: {plan:?}");
                assert!(plan1.direct && plan1.teams == 1, "{what}: {plan1:?}");
                if n == 72 {
                    assert!(2 * plan.grid > plan.n_tiles, "{what}: a team without a group: {plan:?}");
                }
            }
        }
    }
    let p = prepare::<f16>(&ctx, &mut rng, 256, 64, 5);
    let opts = MmaOptions { direct: Some(true), teams: Some(true), ..MmaOptions::default() };
    match ctx.mma_plan(kbit::Dtype::F16, 1, &p.dev, opts) {
        Err(Error::SplitK { what: "teams", .. }) => {}
        other => panic!("k = 5 with two teams forced: {other:?}"),
    }
    eprintln!("direct-load variant, two teams: {i} cases match");
}

/// The direct-load variant whose warps decode half of their first step
/// before the grid-dependency wait (`MmaOptions::early_decode`, forced)
/// matches the f64 references and gives the plain one-team plan's outputs
/// bit for bit (the same sums in the same order): k = 2..4, both dtypes,
/// M = 1..4 (one and four staged rows), K % 128 ≠ 0, K with fewer steps
/// than warps, partial groups, plans for 2 or 3 SMs (blocks walk several
/// groups; the first one's first step comes early) and for the device.
/// Eight staged rows and k = 5 are refused by name.
#[test]
fn direct_early_decode_matches_the_plain_variant() {
    let Some(ctx) = common::gpu("direct_early_decode_matches_the_plain_variant") else { return };
    let mut rng = common::rng("direct_early_decode_matches_the_plain_variant");
    let mut i = 0usize;
    for (k, n) in [(4096, 2048), (5120, 2048), (2080, 520), (96, 72), (8192, 4100), (160, 129)] {
        for bits in 2..=4u32 {
            for bf in [false, true] {
                let m = [1, 2, 4, 3][i % 4];
                let sms = if i % 3 == 0 { None } else { Some(2 + (i % 2) as u32) };
                i += 1;
                let shape = Shape::new(n, k).unwrap();
                let what = format!("direct early M {m} K {k} N {n} k={bits} bf16={bf} sms {sms:?}");
                let base = MmaOptions {
                    direct: Some(true),
                    teams: Some(false),
                    sm_count_override: sms,
                    ..MmaOptions::default()
                };
                let early = MmaOptions { early_decode: Some(true), ..base };
                let plain = MmaOptions { early_decode: Some(false), ..base };
                let case = Pair { what: &what, m, shape, bits, bf16: bf };
                let (plan, plan1) = forced_pair(&ctx, &mut rng, case, early, plain);
                assert!(plan.direct && plan.early_decode && plan.teams == 1, "{what}: {plan:?}");
                assert!(plan1.direct && !plan1.early_decode, "{what}: {plan1:?}");
            }
        }
    }
    let opts = MmaOptions { direct: Some(true), early_decode: Some(true), ..MmaOptions::default() };
    for (bits, m) in [(5, 1), (4, 5)] {
        let p = prepare::<f16>(&ctx, &mut rng, 256, 64, bits);
        match ctx.mma_plan(kbit::Dtype::F16, m, &p.dev, opts) {
            Err(Error::SplitK { what: "early_decode", .. }) => {}
            other => panic!("early decode forced at k = {bits}, M = {m}: {other:?}"),
        }
    }
    eprintln!("direct-load variant, early decode: {i} cases match");
}

/// The direct-load variant whose warps load their one step's activations
/// into registers (`MmaOptions::x_registers`, forced; sm_90, k = 2..4,
/// K ≤ 2048, M = 2..8) matches the f64 references and gives the staged
/// one-team plan the same bits: both dtypes, four and eight rows, K with
/// fewer steps than warps and K % 128 ≠ 0, partial groups, plans for 2 or
/// 3 SMs (blocks walk several groups with the same registers) and for the
/// device. K past 2048, two teams, k = 5 and one row are refused by name,
/// and on a device before sm_90 every case.
#[test]
fn direct_x_registers_match_the_staged_variant() {
    let Some(ctx) = common::gpu("direct_x_registers_match_the_staged_variant") else { return };
    let mut rng = common::rng("direct_x_registers_match_the_staged_variant");
    let on = ctx.info().compute_capability == (9, 0);
    let mut i = 0usize;
    for (k, n) in [(2048, 5120), (2016, 520), (96, 72), (160, 129), (32, 4100), (1024, 2312), (2048, 10240)] {
        for bits in 2..=4u32 {
            for bf in [false, true] {
                let m = 2 + (i + i / 6) % 7;
                let sms = if i % 3 == 0 { None } else { Some(2 + (i % 2) as u32) };
                i += 1;
                let shape = Shape::new(n, k).unwrap();
                let what = format!("direct x registers M {m} K {k} N {n} k={bits} bf16={bf} sms {sms:?}");
                let base = MmaOptions { direct: Some(true), sm_count_override: sms, ..MmaOptions::default() };
                let regs = MmaOptions { x_registers: Some(true), ..base };
                if !on {
                    let p = prepare::<f16>(&ctx, &mut rng, k, n, bits);
                    match ctx.mma_plan(kbit::Dtype::F16, m, &p.dev, regs) {
                        Err(Error::SplitK { what: "x_registers", .. }) => continue,
                        other => panic!("{what} before sm_90: {other:?}"),
                    }
                }
                let staged =
                    MmaOptions { x_registers: Some(false), teams: Some(false), early_decode: Some(false), ..base };
                let case = Pair { what: &what, m, shape, bits, bf16: bf };
                let (plan, plan1) = forced_pair(&ctx, &mut rng, case, regs, staged);
                assert!(plan.direct && plan.x_registers && plan.teams == 1 && !plan.early_decode, "{what}: {plan:?}");
                assert!(plan1.direct && !plan1.x_registers && plan1.teams == 1, "{what}: {plan1:?}");
            }
        }
    }
    let regs = MmaOptions { direct: Some(true), x_registers: Some(true), ..MmaOptions::default() };
    for (k, bits, m, teams) in [(2080, 2, 4, None), (2048, 3, 8, Some(true)), (2048, 5, 4, None), (2048, 2, 1, None)] {
        let p = prepare::<f16>(&ctx, &mut rng, k, 64, bits);
        match ctx.mma_plan(kbit::Dtype::F16, m, &p.dev, MmaOptions { teams, ..regs }) {
            Err(Error::SplitK { what: "x_registers", .. }) => {}
            other => {
                panic!("activations in registers forced at K = {k}, k = {bits}, M = {m}, teams {teams:?}: {other:?}")
            }
        }
    }
    eprintln!("direct-load variant, activations in registers: {i} cases match");
}

/// A case of the paired runs of [`forced_pair`].
#[derive(Clone, Copy)]
struct Pair<'a> {
    what: &'a str,
    m: usize,
    shape: Shape,
    bits: u32,
    bf16: bool,
}

/// `case` under `forced` on fresh data, checked as [`forced_run`] checks
/// it, then under `other` on the same weight and activations, with the
/// same bits; returns the two plans.
fn forced_pair(
    ctx: &Context,
    rng: &mut SmallRng,
    case: Pair,
    forced: MmaOptions,
    other: MmaOptions,
) -> (kbit::Plan, kbit::Plan) {
    fn go<T: Element>(
        ctx: &Context,
        rng: &mut SmallRng,
        c: Pair,
        forced: MmaOptions,
        other: MmaOptions,
    ) -> (kbit::Plan, kbit::Plan) {
        let r = forced_run::<T>(ctx, rng, c.what, c.m, c.shape, c.bits, forced);
        let (y1, plan1) = run(ctx, &r.x, c.m, &r.weight, other);
        common::assert_bits_eq(&r.y, &y1, &format!("{}: against {plan1:?}", c.what));
        (r.plan, plan1)
    }
    if case.bf16 { go::<bf16>(ctx, rng, case, forced, other) } else { go::<f16>(ctx, rng, case, forced, other) }
}

/// The M ≤ 8 loop of the one-m-block, 128-column instances (k = 3, 4:
/// activation rows 8-15 zeroed once at the start and read with
/// `ldmatrix.x4`; k = 5: rows 0-7 with `ldmatrix.x2`) gives the rows of an
/// M = 16 call bit for bit, on a shape with edge stages (K % 64 == 32, a
/// partial n tile) and several items per block, and matches the
/// references. The plan is made for 8 SMs, so that 65 tiles of 128
/// columns need no split-K and the planner takes them.
#[test]
fn small_m_loop_gives_the_rows_of_the_m16_call() {
    let Some(ctx) = common::gpu("small_m_loop_gives_the_rows_of_the_m16_call") else { return };
    let mut rng = common::rng("small_m_loop_gives_the_rows_of_the_m16_call");
    let (k, n, sms) = (2080, 64 * 128 + 72, 8);
    let opts = MmaOptions { sm_count_override: Some(sms), k_slots: Some(false), ..MmaOptions::default() };
    for bits in [3, 4, 5] {
        let p = prepare::<f16>(&ctx, &mut rng, k, n, bits);
        let x16: Vec<f16> = common::uniform(&mut rng, 16 * k);
        let (y16, p16) = run(&ctx, &ctx.stream().clone_htod(&x16).unwrap(), 16, &p.dev, opts);
        assert_eq!((p16.tile.m_blocks, p16.tile.tile_n), (1, 128), "k={bits}: {p16:?}");
        assert!(p16.grid < p16.items, "k={bits}: several items per block: {p16:?}");
        // Wide stages (4 K tiles), the last one partial.
        assert_eq!(p16.stage_tiles, 4, "k={bits}: {p16:?}");
        for m in [1, 3, 8] {
            let xd = ctx.stream().clone_htod(&x16[..m * k]).unwrap();
            let (y, pm) = run(&ctx, &xd, m, &p.dev, opts);
            assert_eq!(kbit::Plan { m: 16, ..pm }, p16, "k={bits} M {m}: the same plan as M = 16");
            common::assert_bits_eq(&y, &y16[..m * n], &format!("k={bits} M {m} against the M = 16 rows"));
        }
        let c = Case { m: 8, k, n, bits, splits: Splits::Auto, sms: Some(sms), stage_tiles: None };
        check_case::<f16>(&ctx, &mut rng, &c);
        // Three splits of 11 K tiles: interior stages of 4, 4 and 3 tiles.
        for m in [5, 16] {
            let c = Case { m, k, n, bits, splits: Splits::Fixed(3), sms: Some(sms), stage_tiles: None };
            check_case::<f16>(&ctx, &mut rng, &c);
        }
    }
}

#[test]
fn mma_gemm_is_deterministic_across_interleaved_plans() {
    let Some(ctx) = common::gpu("mma_gemm_is_deterministic_across_interleaved_plans") else { return };
    let mut rng = common::rng("mma_gemm_is_deterministic_across_interleaved_plans");
    // Two weights whose split-K plans share the workspace and counters.
    let a = prepare::<f16>(&ctx, &mut rng, 4096, 520, 4);
    let b = prepare::<f16>(&ctx, &mut rng, 2048, 200, 3);
    let xa = ctx.stream().clone_htod(&common::uniform::<f16>(&mut rng, 24 * 4096)).unwrap();
    let xb = ctx.stream().clone_htod(&common::uniform::<f16>(&mut rng, 9 * 2048)).unwrap();
    let max = MmaOptions { splits: Splits::Max, ..MmaOptions::default() };
    let (ya, pa) = run(&ctx, &xa, 24, &a.dev, max);
    assert!(pa.splits > 1, "{pa:?}");
    let (yb, _) = run(&ctx, &xb, 9, &b.dev, max);
    for round in 0..5 {
        let three_of_5 = MmaOptions {
            splits: Splits::Fixed(3),
            sm_count_override: Some(5),
            stage_tiles: Some(4),
            tile_rows: None,
            k_slots: None,
            direct: None,
            teams: None,
            early_decode: None,
            x_registers: None,
        };
        for opts in [max, MmaOptions::default(), three_of_5] {
            let (y2, _) = run(&ctx, &xb, 9, &b.dev, opts);
            if opts == max {
                common::assert_bits_eq(&y2, &yb, &format!("b round {round}"));
            }
            let (y1, _) = run(&ctx, &xa, 24, &a.dev, max);
            common::assert_bits_eq(&y1, &ya, &format!("a round {round} after {opts:?}"));
        }
    }
    // Back-to-back launches with no host round trip in between.
    let mut outs: Vec<_> = (0..8).map(|_| ctx.stream().clone_htod(&vec![f16::NAN; 24 * 520]).unwrap()).collect();
    for y in outs.iter_mut() {
        ctx.mma_gemm_with(&xa, 24, &a.dev, y, max).unwrap();
    }
    for y in &outs {
        common::assert_bits_eq(&ctx.stream().clone_dtoh(y).unwrap(), &ya, "back-to-back");
    }
}

#[test]
fn wide_stages_take_stream_k_on_matrices_with_most_of_an_sm_in_tiles() {
    let Some(ctx) = common::gpu("wide_stages_take_stream_k_on_matrices_with_most_of_an_sm_in_tiles") else { return };
    let mut rng = common::rng("wide_stages_take_stream_k_on_matrices_with_most_of_an_sm_in_tiles");
    // Llama-3-8B gate/up: 112 tiles of 128 columns (≥ 3/4 of 132 SMs), 27 K
    // tiles per block; GLM shared: 80 tiles; on 148 SMs 112 tiles are too few.
    for bits in [2, 3, 4, 5] {
        let big = prepare::<f16>(&ctx, &mut rng, 4096, 14336, bits);
        let glm = prepare::<f16>(&ctx, &mut rng, 2048, 10240, bits);
        for (m, w, sms, stream) in
            [(16, &big, 132, true), (4, &big, 132, true), (16, &glm, 132, false), (16, &big, 160, false)]
        {
            let opts = MmaOptions { sm_count_override: Some(sms), k_slots: Some(false), ..MmaOptions::default() };
            let p = ctx.mma_plan(kbit::Dtype::F16, m, &w.dev, opts).unwrap();
            let want = stream;
            assert_eq!(p.stream, want, "k = {bits}, M = {m}, {sms} SMs: {p:?}");
            if want {
                assert_eq!((p.tile.tile_n, p.stage_tiles), (128, 4), "k = {bits}: {p:?}");
                check_stream_plan(&p, &format!("k = {bits}, M = {m}"));
            } else {
                check_plan(&p, &format!("k = {bits}, M = {m}, {sms} SMs"));
            }
        }
    }
    // Two m blocks on the same matrix: 128-column tiles in wide stages.
    for bits in [2, 3, 4, 5] {
        let big = prepare::<f16>(&ctx, &mut rng, 4096, 14336, bits);
        let opts = MmaOptions { sm_count_override: Some(132), k_slots: Some(false), ..MmaOptions::default() };
        let p = ctx.mma_plan(kbit::Dtype::F16, 24, &big.dev, opts).unwrap();
        assert_eq!((p.tile.m_blocks, p.tile.tile_n, p.stage_tiles), (2, 128, 4), "k = {bits}: {p:?}");
        check_plan(&p, &format!("k = {bits}, M = 24"));
    }
    // The results of such plans (stream-K pieces across n tiles, wide
    // stages; two m blocks at M = 24).
    for (bits, m) in [(2, 5), (3, 8), (4, 16), (5, 13), (4, 24)] {
        let c = Case { m, k: 4096, n: 14336, bits, splits: Splits::Auto, sms: Some(132), stage_tiles: None };
        check_case::<f16>(&ctx, &mut rng, &c);
    }
}

#[test]
fn wide_tiles_take_matrices_that_fill_the_gpu_without_split_k() {
    let Some(ctx) = common::gpu("wide_tiles_take_matrices_that_fill_the_gpu_without_split_k") else { return };
    let mut rng = common::rng("wide_tiles_take_matrices_that_fill_the_gpu_without_split_k");
    // 134 tiles of 128 columns: one block for each of 132 SMs and more.
    for bits in [3, 4] {
        let w = prepare::<f16>(&ctx, &mut rng, 256, 134 * 128, bits);
        for (m, sms, wide) in [(16, 132, true), (5, 132, true), (17, 132, false), (16, 140, false)] {
            let opts = MmaOptions { sm_count_override: Some(sms), k_slots: Some(false), ..MmaOptions::default() };
            let p = ctx.mma_plan(kbit::Dtype::F16, m, &w.dev, opts).unwrap();
            if wide {
                assert_eq!((p.tile.tile_n, p.splits), (128, 1), "k = {bits}, M = {m}, {sms} SMs: {p:?}");
            }
            check_plan(&p, &format!("k = {bits}, M = {m}, {sms} SMs"));
        }
    }
    // And their results, M ≤ 8 (the `ldmatrix.x2` loop of these instances) and 16.
    for bits in [3, 4, 5] {
        for m in [3, 8, 16] {
            let c = Case { m, k: 256, n: 134 * 128, bits, splits: Splits::Auto, sms: Some(132), stage_tiles: None };
            check_case::<f16>(&ctx, &mut rng, &c);
            check_case::<bf16>(&ctx, &mut rng, &c);
        }
    }
}

#[test]
fn mma_gemm_rejects_bad_arguments() {
    let Some(ctx) = common::gpu("mma_gemm_rejects_bad_arguments") else { return };
    let mut rng = common::rng("mma_gemm_rejects_bad_arguments");
    let p = prepare::<f16>(&ctx, &mut rng, 128, 64, 4);
    let x = ctx.stream().clone_htod(&common::uniform::<f16>(&mut rng, 8 * 128 + 8)).unwrap();
    let xs = x.slice(0..8 * 128);
    let mut y = ctx.stream().alloc_zeros::<f16>(8 * 64).unwrap();
    let e = ctx.mma_gemm(&xs, 0, &p.dev, &mut y).unwrap_err();
    assert!(matches!(e, Error::Rows { m: 0, max: 64 }), "{e}");
    let e = ctx.mma_gemm(&xs, 65, &p.dev, &mut y).unwrap_err();
    assert!(matches!(e, Error::Rows { m: 65, .. }), "{e}");
    let e = ctx.mma_gemm(&xs, 7, &p.dev, &mut y).unwrap_err();
    assert!(matches!(e, Error::Length { what: "activations", .. }), "{e}");
    let mut short = ctx.stream().alloc_zeros::<f16>(8 * 64 - 1).unwrap();
    let e = ctx.mma_gemm(&xs, 8, &p.dev, &mut short).unwrap_err();
    assert!(matches!(e, Error::Length { what: "output", .. }), "{e}");
    let shifted = x.slice(1..8 * 128 + 1);
    let e = ctx.mma_gemm(&shifted, 8, &p.dev, &mut y).unwrap_err();
    assert!(matches!(e, Error::Alignment { what: "activations", align: 16 }), "{e}");
    let x32 = ctx.stream().alloc_zeros::<f32>(8 * 128).unwrap();
    let mut y32 = ctx.stream().alloc_zeros::<f32>(8 * 64).unwrap();
    let e = ctx.mma_gemm(&x32, 8, &p.dev, &mut y32).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    let fixed0 = MmaOptions { splits: Splits::Fixed(0), ..MmaOptions::default() };
    let e = ctx.mma_gemm_with(&xs, 8, &p.dev, &mut y, fixed0).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "splits", .. }), "{e}");
    let zero_sms = MmaOptions { splits: Splits::Auto, sm_count_override: Some(0), ..MmaOptions::default() };
    let e = ctx.mma_gemm_with(&xs, 8, &p.dev, &mut y, zero_sms).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "sm_count", .. }), "{e}");
    let kt5 = MmaOptions { stage_tiles: Some(5), ..MmaOptions::default() };
    let e = ctx.mma_gemm_with(&xs, 8, &p.dev, &mut y, kt5).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "stage_tiles", .. }), "{e}");
    // A valid call still works after the rejected ones, into an odd-offset
    // output view (16-bit stores) of an odd N.
    let q = prepare::<bf16>(&ctx, &mut rng, 96, 33, 5);
    let xq = ctx.stream().clone_htod(&common::uniform::<bf16>(&mut rng, 5 * 96)).unwrap();
    let mut big = ctx.stream().clone_htod(&vec![bf16::NAN; 5 * 33 + 1]).unwrap();
    let mut view = big.slice_mut(1..5 * 33 + 1);
    ctx.mma_gemm(&xq, 5, &q.dev, &mut view).unwrap();
    let got: Vec<f32> = ctx.stream().clone_dtoh(&big).unwrap()[1..].iter().map(|v| v.to_f32()).collect();
    let want =
        reference::matmul_f64(&ctx.stream().clone_dtoh(&xq).unwrap(), 5, &q.w_t, Shape::new(33, 96).unwrap()).unwrap();
    let (fro, _) = common::errors(&got, &want, 1.0);
    assert!(fro < 2f64.powi(-7), "odd view: {fro:e}");
}

// ------------------------------------------------ warpgroup GEMM (sm_90a)

/// The warpgroup GEMM's maps against the PTX definitions of the
/// `wgmma.m64nNk16` fragments (A: each warp 16 rows as `mma.m16n8k16`'s A;
/// D: each warp 16 rows, register `4j + e` at row `g + 8·(e / 2)`, column
/// `8j + 2t + e % 2`): the A registers of a warpgroup cover its 64 weight
/// columns × 16 k once, the accumulators its 64 columns × 128 activation
/// rows once, and the activations that the tensor copy swizzles into a
/// stage sit where the descriptor reads them.
#[test]
fn wgmma_maps_cover_the_tiles_once() {
    use kbit_format::wgmma as wg;
    for wgroup in 0..2u32 {
        let mut a_seen = vec![0u32; 64 * 16];
        let mut d_seen = vec![0u32; 64 * 128];
        for w in 0..4u32 {
            let warp = 4 * wgroup + w;
            for lane in 0..32u32 {
                let (g, t) = (lane / 4, lane % 4);
                for r in 0..4u32 {
                    let (row, col) = mma_a(lane, r);
                    let c = wg::a_col(warp, lane, r);
                    assert_eq!(c, 64 * wgroup + 16 * w + row, "warp {warp} lane {lane} a{r}");
                    assert_eq!(wg::a_k(lane, r), col);
                    for e in 0..2 {
                        a_seen[((c - 64 * wgroup) * 16 + wg::a_k(lane, r) + e) as usize] += 1;
                    }
                }
                for i in 0..64u32 {
                    let (j, e) = (i / 4, i % 4);
                    let (row, col) = (16 * w + g + 8 * (e / 2), 8 * j + 2 * t + e % 2);
                    assert_eq!(wg::d_col(warp, lane, i), 64 * wgroup + row, "warp {warp} lane {lane} d{i}");
                    assert_eq!(wg::d_row(lane, i), col, "warp {warp} lane {lane} d{i}");
                    d_seen[(row * 128 + col) as usize] += 1;
                }
            }
        }
        assert!(a_seen.iter().all(|&v| v == 1), "A registers cover warpgroup {wgroup}'s tile once");
        assert!(d_seen.iter().all(|&v| v == 1), "accumulators cover warpgroup {wgroup}'s tile once");
    }
    // The stage's activations cover 256 rows × 64 values once, in 128-byte
    // rows of 16-byte chunks (the second half 128 rows on).
    let mut seen = vec![0u32; (wg::a_bytes(2) / 2) as usize];
    assert_eq!(wg::a_bytes(1), 128 * wg::HALF_M);
    for row in 0..wg::tile_m(2) {
        for k in 0..64 {
            let at = wg::a_offset(row, k);
            assert_eq!(at / 128, row);
            seen[(at / 2) as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&v| v == 1), "a stage's activations cover 128 rows × 64 values once");
    // Descriptor of k16 step s on an aligned stage: the hardware address of
    // (row, k) is the unswizzled K-major address (rows 128 bytes apart,
    // groups of 8 rows SBO apart) with bits 4..7 XORed by bits 7..10, the
    // 128-byte swizzle; it must be where a_offset puts the value.
    let base = 0x1_0000;
    assert_eq!(base % wg::ALIGN, 0);
    for step in 0..4 {
        let d = wg::b_descriptor(base, step);
        let start = ((d & 0x3FFF) << 4) as u32;
        let sbo = (((d >> 32) & 0x3FFF) << 4) as u32;
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        for row in 0..wg::HALF_M {
            for k in 0..16 {
                let linear = start + (row / 8) * sbo + (row % 8) * 128 + 2 * k;
                let swizzled = linear ^ (((linear >> 7) & 7) << 4);
                assert_eq!(swizzled, base + wg::a_offset(row, 16 * step + k), "step {step} row {row} k {k}");
            }
        }
    }
    for bits in 2..=5 {
        for h in [1, 2] {
            let smem = wg::smem_bytes(bits, h);
            assert!(smem <= 227 * 1024, "k = {bits}, {h} halves: {smem} bytes");
            assert_eq!(wg::stage_bytes(bits, h) % wg::ALIGN, 0);
            assert!(wg::stage_bytes(bits, h) >= wg::a_bytes(h) + 16 * (wg::w_chunks(bits) + wg::S_CHUNKS));
            // A split block parks its partial (halves × 64 KiB) over the stages.
            assert!(wg::barriers_offset(bits, h) >= h * 64 * 1024);
        }
    }
}

/// `wgmma_gemm` (sm_90 only) against both references, NaN-poisoned outputs:
/// M around the 128-row tile, the design shapes, N not a multiple of the
/// 128-column tile, K % 64 == 32, k = 2..5, f16 and bf16; a repeated call
/// gives the same bits, and `linear` forced to the tensor-core kernel takes
/// it beyond M = 64. Elsewhere the call reports that it does not apply.
#[test]
fn wgmma_gemm_matches_the_f64_references() {
    let Some(ctx) = common::gpu("wgmma_gemm_matches_the_f64_references") else { return };
    let mut rng = common::rng("wgmma_gemm_matches_the_f64_references");
    if !ctx.has_wgmma() {
        let p = prepare::<f16>(&ctx, &mut rng, 64, 64, 4);
        let x = ctx.stream().alloc_zeros::<f16>(64 * 64).unwrap();
        let mut y = ctx.stream().alloc_zeros::<f16>(64 * 64).unwrap();
        let e = ctx.wgmma_gemm(&x, 64, &p.dev, &mut y).unwrap_err();
        assert!(matches!(e, Error::NotApplicable { .. }), "{e}");
        eprintln!("SKIPPED (not sm_90): wgmma_gemm_matches_the_f64_references");
        return;
    }
    let mut shapes: Vec<(usize, usize)> = common::SHAPES.iter().map(|&(_, k, n)| (k, n)).collect();
    shapes.extend([(2080, 520), (96, 72), (32, 4100), (8192, 200), (160, 1)]);
    const MS: [usize; 7] = [1, 65, 128, 129, 200, 300, 512];
    let mut cases = 0;
    for (i, &(k, n)) in shapes.iter().enumerate() {
        for j in 0..2 {
            let idx = 2 * i + j;
            let (m, bits, bf) = (MS[idx % MS.len()], 2 + (idx % 4) as u32, (idx / 4) % 2 == 1);
            let shape = Shape::new(n, k).unwrap();
            macro_rules! one {
                ($t:ty) => {{
                    let (p, x, xd) = prepare_with_x::<$t>(&ctx, &mut rng, k, n, bits, m);
                    let mut y = ctx.stream().clone_htod(&vec![<$t>::NAN; m * n]).unwrap();
                    ctx.wgmma_gemm(&xd, m, &p.dev, &mut y).unwrap();
                    let got = ctx.stream().clone_dtoh(&y).unwrap();
                    let what = format!("wgmma M {m} K {k} N {n} k={bits} {:?}", <$t as Element>::DTYPE);
                    assert_matches(&what, &x, m, shape, &p, &got);
                    let mut again = ctx.stream().clone_htod(&vec![<$t>::NAN; m * n]).unwrap();
                    ctx.force_kernel(Some(kbit::Kernel::Mma)).unwrap();
                    let ran = ctx.linear(&xd, m, &p.dev, &mut again);
                    ctx.force_kernel(None).unwrap();
                    if m > 64 {
                        assert_eq!(ran.unwrap(), kbit::Kernel::Mma, "{what}");
                        common::assert_bits_eq(&ctx.stream().clone_dtoh(&again).unwrap(), &got, &what);
                    }
                }};
            }
            if bf {
                one!(bf16);
            } else {
                one!(f16);
            }
            cases += 1;
        }
    }
    eprintln!("wgmma_gemm: {cases} cases match");
}

/// Resident blocks of the warpgroup GEMM on an H100 by cluster size (from
/// `Context::wgmma_slots` on that GPU).
const H100_SLOTS: Slots = Slots([132, 132, 132, 117, 120, 110, 102, 105, 120]);

/// Checks a warpgroup plan: its blocks cover every output tile's K tiles
/// exactly once, no split is empty, and a split tile's blocks are one
/// cluster of `splits` consecutive blocks, cluster rank = split.
fn check_wgmma_plan(p: &kbit::WgmmaPlan, what: &str) {
    assert_eq!(p.k_tiles as usize, (p.k as usize).div_ceil(64), "{what}");
    assert!(p.splits >= 1 && p.tiles_per_split >= 1 && p.full <= p.tiles(), "{what}: {p:?}");
    assert!((p.halves == 1 || p.halves == 2) && p.row_tiles == p.m.div_ceil(geo_wg::tile_m(p.halves)), "{what}");
    assert!(p.splits <= p.k_tiles.min(geo_wg::MAX_SPLITS), "{what}: {p:?}");
    assert_eq!(p.blocks as u64, p.full as u64 + (p.tiles() - p.full) as u64 * p.splits as u64, "{what}");
    assert!(p.full.is_multiple_of(p.splits) && p.blocks.is_multiple_of(p.splits), "{what}: clusters of {}", p.splits);
    let mut next = vec![0u32; p.tiles() as usize];
    let mut pieces = vec![0u32; p.tiles() as usize];
    for b in 0..p.blocks {
        let w = p.work(b);
        assert!(w.tile < p.tiles() && w.kt0 < w.kt1, "{what}: block {b} {w:?}");
        assert_eq!(w.kt0, next[w.tile as usize], "{what}: block {b} K ranges not contiguous");
        assert_eq!(w.split, pieces[w.tile as usize], "{what}: block {b} out of split order");
        if w.splits > 1 {
            assert_eq!(b % p.splits, w.split, "{what}: block {b} is not cluster rank {}", w.split);
            assert_eq!((b - w.split - p.full) / p.splits + p.full, w.tile, "{what}: block {b}");
        }
        next[w.tile as usize] = w.kt1;
        pieces[w.tile as usize] += 1;
    }
    for t in 0..p.tiles() {
        assert_eq!(next[t as usize], p.k_tiles, "{what}: tile {t} does not cover K");
        let want = if t < p.full { 1 } else { p.splits };
        assert_eq!(pieces[t as usize], want, "{what}: tile {t}");
        assert!(!p.tile_rows(t).is_empty() && !p.tile_columns(t).is_empty(), "{what}: tile {t}");
    }
}

#[test]
fn wgmma_planner_covers_every_tile_once_with_no_empty_split() {
    use kbit::wgmma_plan;
    let mut n_plans = 0;
    for sms in [132u32, 128, 114, 7, 1] {
        for (k, n) in planner_shapes() {
            for m in [1usize, 65, 128, 300, 512, 1024, 4096] {
                let requests = [Splits::Auto, Splits::Max, Splits::Fixed(1), Splits::Fixed(3), Splits::Fixed(8)];
                for (req, rows) in requests.into_iter().flat_map(|r| [None, Some(128), Some(256)].map(|t| (r, t))) {
                    let what = format!("sms {sms} K {k} N {n} M {m} {req:?} rows {rows:?}");
                    let p = wgmma_plan::plan(m, n, k, &Slots::uniform(sms), req, rows)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    if let Some(r) = rows {
                        assert_eq!(geo_wg::tile_m(p.halves), r, "{what}");
                    }
                    check_wgmma_plan(&p, &what);
                    let k_tiles = k.div_ceil(64) as u32;
                    match req {
                        Splits::Fixed(1) => {
                            assert_eq!((p.splits, p.full, p.blocks), (1, p.tiles(), p.tiles()), "{what}")
                        }
                        Splits::Fixed(r) => assert_eq!(p.splits, splitk::normalize_splits(k_tiles, r).0, "{what}"),
                        Splits::Max => assert_eq!(p.splits, splitk::normalize_splits(k_tiles, 8).0, "{what}"),
                        _ => {}
                    }
                    n_plans += 1;
                }
            }
        }
    }
    eprintln!("{n_plans} warpgroup plans checked");
}

#[test]
fn wgmma_auto_splits_fill_the_sms_that_few_tiles_leave_idle() {
    use kbit::wgmma_plan::plan;
    let p = |m, n, k| plan(m, n, k, &H100_SLOTS, Splits::Auto, None).unwrap();
    // Qwen3 `down` / `o` at M = 128: 16 tiles on 132 SMs, K cut in 6
    // (clusters of 6: 102 blocks at once, one wave).
    assert_eq!((p(128, 2048, 5120).splits, p(128, 2048, 5120).blocks), (6, 96));
    assert_eq!(p(128, 2048, 4096).splits, 6);
    // `kv` at M = 128: 4 tiles of 32 K tiles, 8 splits of 4.
    assert_eq!((p(128, 512, 2048).splits, p(128, 512, 2048).tiles_per_split), (8, 4));
    // At M = 512 (64 tiles of 128 rows) in two.
    assert_eq!((p(512, 2048, 5120).halves, p(512, 2048, 5120).splits), (1, 2));
    // `q` at M = 512: 128 tiles of 128 rows, one wave already.
    assert_eq!((p(512, 4096, 2048).halves, p(512, 4096, 2048).splits), (1, 1));
    // Llama-3-70B gate/up at M = 512: 256-row blocks (448 tiles), three
    // whole waves, the other 52 tiles in two splits.
    let l = p(512, 28672, 8192);
    assert_eq!((l.halves, l.full, l.splits), (2, 396, 2), "{l:?}");
    // Qwen3 gate/up at M = 512: 256-row blocks fit 80 tiles in one wave.
    assert_eq!((p(512, 5120, 2048).halves, p(512, 5120, 2048).splits), (2, 1));
    for (m, n, k) in [(512, 5120, 2048), (256, 5120, 2048), (384, 2048, 5120), (1024, 10240, 2048)] {
        check_wgmma_plan(&p(m, n, k), &format!("M {m} N {n} K {k}"));
    }
}

#[test]
fn wgmma_planner_rejects_bad_requests_with_named_arguments() {
    use kbit::wgmma_plan::plan;
    let h100 = Slots::uniform(132);
    assert!(matches!(plan(0, 64, 64, &h100, Splits::Auto, None), Err(Error::Rows { m: 0, .. })));
    assert!(matches!(plan(1 << 31, 64, 64, &h100, Splits::Auto, None), Err(Error::Rows { .. })));
    assert!(matches!(plan(8, 0, 64, &h100, Splits::Auto, None), Err(Error::OutFeatures)));
    assert!(matches!(plan(8, 64, 48, &h100, Splits::Auto, None), Err(Error::InFeatures(48))));
    assert!(matches!(
        plan(8, 64, 64, &Slots::uniform(0), Splits::Auto, None),
        Err(Error::SplitK { what: "sm_count", .. })
    ));
    assert!(matches!(plan(8, 64, 64, &h100, Splits::Fixed(0), None), Err(Error::SplitK { what: "splits", .. })));
    assert!(matches!(plan(8, 64, 64, &h100, Splits::Stream, None), Err(Error::SplitK { what: "splits", .. })));
    let e = plan(8, 64, 8192, &h100, Splits::Fixed(9), None).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "splits", value: 9, .. }), "{e}");
    // 2^27 rows of 2^17 columns: more blocks than a grid can hold.
    assert!(matches!(plan(1 << 27, 1 << 17, 64, &h100, Splits::Auto, None), Err(Error::Rows { .. })));
    // One K tile: nothing to split.
    assert_eq!(plan(128, 128, 64, &h100, Splits::Max, None).unwrap().splits, 1);
    let e = plan(512, 128, 64, &h100, Splits::Auto, Some(192)).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "tile_rows", value: 192, .. }), "{e}");
    // 128 or 256 rows when asked; 256 only beyond M = 128 otherwise.
    assert_eq!(plan(512, 4096, 2048, &h100, Splits::Auto, Some(128)).unwrap().halves, 1);
    assert_eq!(plan(100, 4096, 2048, &h100, Splits::Auto, Some(256)).unwrap().halves, 2);
    assert_eq!(plan(128, 28672, 8192, &h100, Splits::Auto, None).unwrap().halves, 1);
}

/// `wgmma_gemm_with` under forced and automatic split counts and other SM
/// counts (sm_90 only): every plan matches both references on fresh data
/// with NaN-poisoned outputs, including K % 64 == 32 and ragged M and N
/// tiles, and a plan repeated without clearing the workspace gives the same
/// bits (the counters are left at zero).
#[test]
fn wgmma_split_k_matches_the_f64_references_on_every_plan() {
    let Some(ctx) = common::gpu("wgmma_split_k_matches_the_f64_references_on_every_plan") else { return };
    if !ctx.has_wgmma() {
        eprintln!("SKIPPED (not sm_90): wgmma_split_k_matches_the_f64_references_on_every_plan");
        return;
    }
    let mut rng = common::rng("wgmma_split_k_matches_the_f64_references_on_every_plan");
    for bits in 2..=5 {
        let slots = ctx.wgmma_slots(bits, kbit::Dtype::F16).unwrap();
        eprintln!("k = {bits}: resident blocks by cluster size {:?}", slots.0);
        for s in 1..=geo_wg::MAX_SPLITS {
            let n = slots.get(s);
            assert!(n >= s && n % s == 0 && n <= slots.get(1), "k = {bits}, clusters of {s}: {n}");
        }
    }
    assert_eq!(ctx.wgmma_slots(6, kbit::Dtype::F16), None);
    // (K, N, M, bits, bf16)
    let cases = [
        (2048, 512, 512, 4, false),
        (5120, 2048, 300, 2, true),
        (2080, 520, 200, 5, false),
        (4096, 2048, 129, 3, true),
        (96, 72, 65, 4, false),
        (160, 4100, 130, 2, true),
    ];
    let policies = [Splits::Auto, Splits::Fixed(1), Splits::Fixed(3), Splits::Max, Splits::Fixed(5)];
    let mut checked = 0;
    for (k, n, m, bits, bf) in cases {
        let shape = Shape::new(n, k).unwrap();
        macro_rules! one {
            ($t:ty) => {{
                let (p, x, xd) = prepare_with_x::<$t>(&ctx, &mut rng, k, n, bits, m);
                for (splits, rows) in policies.into_iter().flat_map(|s| [(s, Some(128)), (s, Some(256))]) {
                    for sms in [None, Some(128), Some(132)] {
                        let opts = MmaOptions {
                            splits,
                            sm_count_override: sms,
                            stage_tiles: None,
                            tile_rows: rows,
                            k_slots: None,
                            direct: None,
                            teams: None,
                            early_decode: None,
                            x_registers: None,
                        };
                        let mut y = ctx.stream().clone_htod(&vec![<$t>::NAN; m * n]).unwrap();
                        let plan = ctx.wgmma_gemm_with(&xd, m, &p.dev, &mut y, opts).unwrap();
                        let got = ctx.stream().clone_dtoh(&y).unwrap();
                        let what =
                            format!("wgmma M {m} K {k} N {n} k={bits} {splits:?} rows {rows:?} sms {sms:?}: {plan:?}");
                        assert_matches(&what, &x, m, shape, &p, &got);
                        let mut again = ctx.stream().clone_htod(&vec![<$t>::NAN; m * n]).unwrap();
                        assert_eq!(ctx.wgmma_gemm_with(&xd, m, &p.dev, &mut again, opts).unwrap(), plan);
                        common::assert_bits_eq(&ctx.stream().clone_dtoh(&again).unwrap(), &got, &what);
                        checked += 1;
                    }
                }
            }};
        }
        if bf {
            one!(bf16);
        } else {
            one!(f16);
        }
    }
    // An output view that starts 2 bytes into its buffer: whole tiles
    // then write y value by value, and nothing outside the view.
    let (k, n, m) = (96, 72, 65);
    let (p, x, xd) = prepare_with_x::<f16>(&ctx, &mut rng, k, n, 4, m);
    for rows in [Some(128), Some(256)] {
        let opts = MmaOptions { splits: Splits::Fixed(1), tile_rows: rows, ..MmaOptions::default() };
        let mut buf = ctx.stream().clone_htod(&vec![f16::NAN; m * n + 2]).unwrap();
        let plan = ctx.wgmma_gemm_with(&xd, m, &p.dev, &mut buf.slice_mut(1..m * n + 1), opts).unwrap();
        let got = ctx.stream().clone_dtoh(&buf).unwrap();
        let what = format!("wgmma M {m} K {k} N {n} into an unaligned view, rows {rows:?}: {plan:?}");
        assert!(got[0].is_nan() && got[m * n + 1].is_nan(), "{what}: wrote outside the view");
        assert_matches(&what, &x, m, Shape::new(n, k).unwrap(), &p, &got[1..m * n + 1]);
        checked += 1;
    }
    let opts = MmaOptions { stage_tiles: Some(2), ..MmaOptions::default() };
    let p = prepare::<f16>(&ctx, &mut rng, 64, 64, 4);
    let x = ctx.stream().alloc_zeros::<f16>(64 * 64).unwrap();
    let mut y = ctx.stream().alloc_zeros::<f16>(64 * 64).unwrap();
    let e = ctx.wgmma_gemm_with(&x, 64, &p.dev, &mut y, opts).unwrap_err();
    assert!(matches!(e, Error::SplitK { what: "stage_tiles", .. }), "{e}");
    eprintln!("wgmma split-K: {checked} plans match");
}
