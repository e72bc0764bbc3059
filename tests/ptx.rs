//! The embedded PTX: every kernel the host expects is there, assembles with
//! `ptxas` for sm_89 and sm_90 with 0 spill bytes and 0 stack frame, the
//! tensor-core and async-copy instructions are present, and no panic path
//! was compiled in. Prints a register table per kernel and architecture.
//!
//! ptxas comes from `KBIT_PTXAS`, `PATH`, or `.tools/` (where the test
//! script installs the `nvidia-cuda-nvcc-cu12` wheel). Without it the test
//! skips visibly, unless `KBIT_REQUIRE_PTXAS=1`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

const ARCHS: [&str; 2] = ["sm_89", "sm_90"];

fn ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KBIT_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/nvcc/nvidia/cuda_nvcc/bin/ptxas");
    if local.exists() {
        return Some(local);
    }
    Command::new("ptxas").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from("ptxas"))
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
}

/// Every GEMV and tensor-core GEMM entry (the kernels launched as
/// programmatic dependents) waits for its producers and lets its dependents
/// start; the sm_90 module has the instructions in place of every marker.
#[test]
fn programmatic_kernels_wait_for_their_producers() {
    let ptx = kbit::module::PTX;
    let [(wait, wait_insn), (dependents, dependents_insn)] = kbit::module::GRID_DEPENDENCY_MARKERS;
    let mut checked = 0;
    for body in ptx.split(".entry ").skip(1) {
        let name = &body[..body.find('(').unwrap()];
        let programmatic = name.contains("gemv") || name.starts_with("kbit_mma_");
        // A body ends where the next entry begins; markers only occur inside kernels.
        assert_eq!(body.contains(wait), programmatic, "{name}: grid-dependency wait");
        assert_eq!(body.contains(dependents), programmatic, "{name}: launch of dependents");
        checked += programmatic as usize;
    }
    assert!(checked > 200, "only {checked} programmatic kernels found");
    let sm90 = kbit::module::ptx_for((9, 0));
    assert!(sm90.contains(".target sm_90") && !sm90.contains(".target sm_89"));
    assert_eq!(sm90.matches(wait_insn).count(), ptx.matches(wait).count());
    assert_eq!(sm90.matches(dependents_insn).count(), ptx.matches(dependents).count());
    assert!(!sm90.contains("// kbit:"));
    assert_eq!(kbit::module::ptx_for((8, 9)), ptx);
}

#[test]
fn ptxas_sm89_sm90_no_spills_no_stack() {
    let Some(ptxas) = ptxas() else {
        if std::env::var("KBIT_REQUIRE_PTXAS").is_ok_and(|v| v == "1") {
            panic!(
                "KBIT_REQUIRE_PTXAS=1 but no ptxas (set KBIT_PTXAS or install nvidia-cuda-nvcc-cu12 into .tools/nvcc)"
            );
        }
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no ptxas): ptxas_sm89_sm90_no_spills_no_stack");
        return;
    };
    let dir = std::env::temp_dir().join(format!("kbit-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let expected = kbit::module::names::all();
    let mut table: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut bad = Vec::new();
    for arch in ARCHS {
        // Each architecture gets the module the host loads on it.
        let src = dir.join(format!("{arch}.ptx"));
        let cc = if arch == "sm_89" { (8, 9) } else { (9, 0) };
        std::fs::write(&src, kbit::module::ptx_for(cc).as_bytes()).unwrap();
        let out = Command::new(&ptxas)
            .args(["-v", "--warn-on-spills", "-arch", arch, "-o"])
            .arg(dir.join(format!("{arch}.cubin")))
            .arg(&src)
            .output()
            .expect("running ptxas");
        let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ptxas {arch} failed:\n{log}");
        let props = parse(&log);
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
            table.entry(name.clone()).or_default().push(p.registers);
        }
    }
    let mut s = String::from("\nkernel                                   regs sm_89  regs sm_90\n");
    for (name, regs) in &table {
        s += &format!("{name:<40} {:>10} {:>11}\n", regs[0], regs[1]);
    }
    s += &format!("{} kernels, 0 bytes stack frame and 0 bytes spills required on {ARCHS:?}\n", table.len());
    let _ = writeln!(std::io::stderr().lock(), "{s}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "kernels with stack frames, spills or too many registers:\n{}", bad.join("\n"));
}
