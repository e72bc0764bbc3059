//! The embedded PTX: every kernel the host expects is there, assembles with
//! `ptxas` for sm_89 and sm_90a with 0 spill bytes and 0 stack frame, the
//! tensor-core and async-copy instructions are present, no panic path was
//! compiled in, and on sm_90 every dense programmatic kernel requests memory
//! before its grid-dependency wait. Prints a register table per kernel and
//! architecture.
//!
//! ptxas comes from `KBIT_PTXAS`, `PATH`, or `.tools/` (where the test
//! script installs the `nvidia-cuda-nvcc-cu12` wheel), nvdisasm from
//! `KBIT_NVDISASM`, `PATH`, or `.tools/` (the `nvidia-cuda-nvdisasm` wheel).
//! Without them the tests that need them skip visibly, unless
//! `KBIT_REQUIRE_PTXAS=1`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The architectures of the modules the host loads: sm_89's, and sm_90's
/// (`.target sm_90a`, with the warpgroup GEMM).
const ARCHS: [&str; 2] = ["sm_89", "sm_90a"];

/// A tool from the environment variable `var`, the `.tools/` path `local`
/// (relative to the crate root), or `PATH`.
fn tool(var: &str, local: &str, name: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var) {
        return Some(PathBuf::from(p));
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(local);
    if local.exists() {
        return Some(local);
    }
    Command::new(name).arg("--version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from(name))
}

fn ptxas() -> Option<PathBuf> {
    tool("KBIT_PTXAS", ".tools/nvcc/nvidia/cuda_nvcc/bin/ptxas", "ptxas")
}

fn nvdisasm() -> Option<PathBuf> {
    tool("KBIT_NVDISASM", ".tools/nvdisasm/nvidia/cu13/bin/nvdisasm", "nvdisasm")
}

/// Whether a missing tool is an error (`KBIT_REQUIRE_PTXAS=1`) or a visible skip.
fn skip_without(tool: &str, test: &str) {
    if std::env::var("KBIT_REQUIRE_PTXAS").is_ok_and(|v| v == "1") {
        panic!("KBIT_REQUIRE_PTXAS=1 but no {tool} (scripts/setup.sh installs it into .tools/)");
    }
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no {tool}): {test}");
}

/// Assembles the module the host loads on `arch` into `dir/<arch>.cubin`;
/// returns ptxas' `-v` log.
fn assemble(ptxas: &Path, arch: &str, dir: &Path) -> String {
    let src = dir.join(format!("{arch}.ptx"));
    let cc = if arch == "sm_89" { (8, 9) } else { (9, 0) };
    assert!(arch == "sm_89" || arch == "sm_90a", "no module for {arch}");
    std::fs::write(&src, kbit::module::ptx_for(cc).as_bytes()).unwrap();
    let out = Command::new(ptxas)
        .args(["-v", "--warn-on-spills", "-arch", arch, "-o"])
        .arg(dir.join(format!("{arch}.cubin")))
        .arg(&src)
        .output()
        .expect("running ptxas");
    let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas {arch} failed:\n{log}");
    log
}

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kbit-ptx-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[derive(Default, Debug)]
struct Props {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Parses `ptxas -v` output into per-entry properties.
fn parse(log: &str) -> BTreeMap<String, Props> {
    let mut out: BTreeMap<String, Props> = BTreeMap::new();
    let mut current: Option<String> = None;
    let num_before = |line: &str, word: &str| -> u32 {
        let i = line.find(word).unwrap();
        line[..i].split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty()).unwrap().parse().unwrap()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap().to_string();
            out.entry(name.clone()).or_default();
            current = Some(name);
        } else if let Some(name) = &current {
            let p = out.get_mut(name).unwrap();
            if line.contains("bytes stack frame") {
                p.stack = num_before(line, "bytes stack frame");
                p.spill_stores = num_before(line, "bytes spill stores");
                p.spill_loads = num_before(line, "bytes spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                p.registers = num_before(line, "registers");
            }
        }
    }
    out
}

#[test]
fn ptx_has_every_kernel_and_no_panic_path() {
    let ptx = kbit::module::PTX;
    for name in kbit::module::names::all() {
        assert!(ptx.contains(&format!(".entry {name}(")), "kernel {name} missing from the PTX");
    }
    assert!(!ptx.contains("panic"), "a panic path was compiled into the kernels");
    for insn in [
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "shfl.sync.bfly.b32",
        "vote.sync.ballot.b32",
    ] {
        assert!(ptx.contains(insn), "instruction {insn} missing");
    }
    assert!(ptx.contains(".target sm_89"));
    // The sm_90a entries are only in the module loaded on sm_90.
    let sm90 = kbit::module::ptx_for((9, 0));
    for name in kbit::module::names::all_wgmma() {
        assert!(!ptx.contains(&format!(".entry {name}(")), "{name} in the sm_89 module");
        assert!(sm90.contains(&format!(".entry {name}(")), "kernel {name} missing from the sm_90 module");
        // The tensor map of x must be 64-aligned: it follows 4 pointers and
        // 4 u32 (48 bytes), so it starts 48 bytes into the parameter block,
        // 64-aligned on sm_90 (see the entry's docs).
        let at = sm90.find(&format!(".entry {name}(")).unwrap();
        let params = &sm90[at..at + sm90[at..].find(')').unwrap()];
        let kinds: Vec<&str> = params.lines().skip(1).map(|l| l.split_whitespace().nth(1).unwrap_or("")).collect();
        let expect = [".u64", ".u64", ".u64", ".u64", ".u32", ".u32", ".u32", ".u32", ".align", ".u32", ".u32"];
        assert_eq!(kinds, expect, "{name}: {params}");
        assert!(params.contains(&format!(".param .align 16 .b8 {name}_param_8[128]")), "{name}: {params}");
    }
    // So are the direct-load instances with the activations in registers.
    for name in kbit::module::names::all_mma_direct_xreg() {
        assert!(!ptx.contains(&format!(".entry {name}(")), "{name} in the sm_89 module");
        assert!(sm90.contains(&format!(".entry {name}(")), "kernel {name} missing from the sm_90 module");
    }
    for insn in [
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "wgmma.fence.sync.aligned",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned",
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "mbarrier.arrive.expect_tx.shared::cta.b64",
        "cvta.param.u64",
    ] {
        assert!(kbit::module::PTX_SM90A_ENTRIES.contains(insn), "instruction {insn} missing from the sm_90a entries");
    }
    assert!(sm90.contains(".target sm_90a") && sm90.contains(".version 8.0"));
}

/// No floating-point instruction flushes subnormals: the E4M4 decode of the
/// one-row GEMV multiplies the subnormal `m · 2^−130` by `2^116`
/// (`kbit_format::e4m4::decode`), which a `.ftz` multiply would turn into 0
/// for every scale below `2^−10`.
#[test]
fn no_flush_to_zero() {
    for (what, ptx) in [("sm_89 module", kbit::module::PTX), ("sm_90a entries", kbit::module::PTX_SM90A_ENTRIES)] {
        assert!(!ptx.contains(".ftz"), "a flush-to-zero instruction in the {what}");
    }
}

/// Every GEMV and tensor-core GEMM entry (the kernels launched as
/// programmatic dependents) waits for its producers and lets its dependents
/// start; the sm_90 module has the instructions in place of every marker.
#[test]
fn programmatic_kernels_wait_for_their_producers() {
    let ptx = kbit::module::PTX;
    let [(wait, wait_insn), (dependents, dependents_insn)] = kbit::module::GRID_DEPENDENCY_MARKERS;
    let mut checked = 0;
    let sm90a = kbit::module::PTX_SM90A_ENTRIES;
    for body in ptx.split(".entry ").skip(1).chain(sm90a.split(".entry ").skip(1)) {
        let name = &body[..body.find('(').unwrap()];
        let programmatic = name.contains("gemv") || name.starts_with("kbit_mma_") || name.starts_with("kbit_wgmma_");
        // A body ends where the next entry begins; markers only occur inside kernels.
        assert_eq!(body.contains(wait), programmatic, "{name}: grid-dependency wait");
        assert_eq!(body.contains(dependents), programmatic, "{name}: launch of dependents");
        checked += programmatic as usize;
    }
    assert!(checked > 200, "only {checked} programmatic kernels found");
    let sm90 = kbit::module::ptx_for((9, 0));
    assert!(sm90.contains(".target sm_90a") && !sm90.contains(".target sm_89"));
    assert_eq!(sm90.matches(wait_insn).count(), ptx.matches(wait).count() + sm90a.matches(wait).count());
    let dependents_markers = ptx.matches(dependents).count() + sm90a.matches(dependents).count();
    assert_eq!(sm90.matches(dependents_insn).count(), dependents_markers);
    let later = kbit::module::ptx_for((10, 0));
    assert!(later.contains(".target sm_90\n") && !later.contains(".entry kbit_wgmma_"));
    assert!(!sm90.contains("// kbit:"));
    assert_eq!(kbit::module::ptx_for((8, 9)), ptx);
}

#[test]
fn ptxas_sm89_sm90_no_spills_no_stack() {
    let Some(ptxas) = ptxas() else {
        return skip_without("ptxas", "ptxas_sm89_sm90_no_spills_no_stack");
    };
    let dir = scratch("regs");
    let mut table: BTreeMap<String, Vec<Option<u32>>> = BTreeMap::new();
    let mut bad = Vec::new();
    for (i, arch) in ARCHS.into_iter().enumerate() {
        // Each architecture gets the module the host loads on it.
        let log = assemble(&ptxas, arch, &dir);
        let props = parse(&log);
        let mut expected = kbit::module::names::all();
        if arch == "sm_90a" {
            expected.extend(kbit::module::names::all_wgmma());
            expected.extend(kbit::module::names::all_mma_direct_xreg());
        }
        for name in &expected {
            let p = props.get(name).unwrap_or_else(|| panic!("{arch}: ptxas did not report {name}"));
            if p.stack != 0 || p.spill_stores != 0 || p.spill_loads != 0 {
                bad.push(format!("{arch} {name}: {p:?}"));
            }
            // The scalar GEMV launches W = warps(K) ≤ 16 warps whatever the
            // instance (the K split fixes its summation order): 512 threads
            // need at most 128 registers.
            if name.contains("gemv_") && p.registers > 128 {
                bad.push(format!("{arch} {name}: {} registers, 512-thread blocks need ≤ 128", p.registers));
            }
            table.entry(name.clone()).or_insert_with(|| vec![None; ARCHS.len()])[i] = Some(p.registers);
        }
    }
    let mut s = String::from("\nkernel                                   regs sm_89  regs sm_90a\n");
    let show = |r: Option<u32>| r.map_or("-".to_string(), |r| r.to_string());
    for (name, regs) in &table {
        s += &format!("{name:<40} {:>10} {:>12}\n", show(regs[0]), show(regs[1]));
    }
    s += &format!("{} kernels, 0 bytes stack frame and 0 bytes spills required on {ARCHS:?}\n", table.len());
    let _ = writeln!(std::io::stderr().lock(), "{s}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "kernels with stack frames, spills or too many registers:\n{}", bad.join("\n"));
}

/// The instructions (SASS text, one per entry) of each function in
/// `nvdisasm -c` output, by function name.
fn functions(listing: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in listing.lines() {
        if let Some(name) = line.strip_prefix(".text.").and_then(|l| l.strip_suffix(':')) {
            current = Some(name.to_string());
            out.entry(name.to_string()).or_default();
        } else if let (Some(name), Some(at)) = (&current, line.find("*/")) {
            // `/*0040*/  @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;`
            if line.trim_start().starts_with("/*") {
                let insn = line[at + 2..].trim().trim_end_matches(';').trim();
                out.get_mut(name).unwrap().push(insn.to_string());
            }
        }
    }
    out
}

/// On sm_90 a GEMV or tensor-core GEMM launch starts while the previous
/// kernel finishes and waits for it at `griddepcontrol.wait` (`ACQBULK`).
/// Every dense instance issues reads that need no earlier kernel (its
/// first weight tiles or their L2 prefetch, its codebook) before that wait,
/// so their latency passes while the previous kernel runs. ptxas is free
/// to schedule the wait above independent loads of the same basic block;
/// this checks the assembled code still has a global read (`LDG`,
/// `LDGSTS`) or prefetch (`CCTL`) ahead of the main path's wait (the
/// first one not followed at once by `EXIT`). The grouped instances wait
/// first: they read the expert offsets before they know which weights to load.
#[test]
fn dense_launches_read_before_their_wait() {
    let (Some(ptxas), Some(nvdisasm)) = (ptxas(), nvdisasm()) else {
        return skip_without("ptxas or nvdisasm", "dense_launches_read_before_their_wait");
    };
    let dir = scratch("wait");
    assemble(&ptxas, "sm_90a", &dir);
    let out = Command::new(&nvdisasm).arg("-c").arg(dir.join("sm_90a.cubin")).output().expect("running nvdisasm");
    assert!(out.status.success(), "nvdisasm failed: {}", String::from_utf8_lossy(&out.stderr));
    let code = functions(&String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&dir);
    let mut bad = Vec::new();
    let mut checked = 0;
    for name in kbit::module::names::all().into_iter().chain(kbit::module::names::all_mma_direct_xreg()) {
        let programmatic = name.contains("gemv") || name.starts_with("kbit_mma_");
        if !programmatic || name.contains("grouped") {
            continue;
        }
        let insns = code.get(&name).unwrap_or_else(|| panic!("nvdisasm did not list {name}"));
        // The opcode and operands, without a guard predicate (`@!P0 `).
        let ops: Vec<&str> = insns
            .iter()
            .map(|i| if i.starts_with('@') { i.split_once(' ').map_or("", |(_, r)| r.trim()) } else { i })
            .collect();
        let wait = ops
            .iter()
            .enumerate()
            .position(|(i, o)| o.starts_with("ACQBULK") && !ops[i + 1..(i + 3).min(ops.len())].contains(&"EXIT"));
        let Some(wait) = wait else {
            bad.push(format!("{name}: no grid-dependency wait on its main path"));
            continue;
        };
        let reads = ops[..wait].iter().filter(|o| o.starts_with("LDG") || o.starts_with("CCTL")).count();
        if reads == 0 {
            bad.push(format!("{name}: nothing read before the wait (instruction {wait})"));
        }
        // The tensor-core instances of two m blocks at k = 4, 5 copy their
        // first stages' weights into shared memory before the wait, and so
        // do the K-slot ones (into their warps' rings); the other
        // tensor-core instances copy nothing before it.
        let early = ["kbit_mma_k4_m2_", "kbit_mma_k5_m2_", "kbit_mma_kslots_"].iter().any(|p| name.starts_with(p));
        let copies = ops[..wait].iter().filter(|o| o.starts_with("LDGSTS")).count();
        if name.starts_with("kbit_mma_") && early != (copies > 0) {
            bad.push(format!("{name}: {copies} shared-memory copies before the wait (copies expected: {early})"));
        }
        checked += 1;
    }
    assert!(checked > 100, "only {checked} dense programmatic kernels found");
    assert!(
        bad.is_empty(),
        "dense programmatic kernels whose reads before their wait are not as designed:\n{}",
        bad.join("\n")
    );
}
