//! Static instruction counts of the kernels' loops, from the SASS that
//! `ptxas` makes of the module the host loads (no GPU needed): per kernel,
//! its registers and instructions, and per loop (a backward branch and the
//! code up to its target) the instructions of one trip by class. A proxy
//! for issue-bound kernels (the one-row GEMV): a change that takes
//! instructions out of a loop body shows here before any GPU run, and the
//! classes say which pipe it relieves.
//!
//! ```text
//! cargo run --release --example sass_loops -- [--arch sm_89|sm_90a] [--largest] [--opcodes] [--sass] PATTERN...
//!   PATTERN    substrings of entry names, e.g. kbit_gemv_m1_k4_f16 grouped_pairs_m1_k4_f16
//!   --largest  only each kernel's longest loop (its main loop, as a rule)
//!   --opcodes  after each loop, its opcodes with their counts
//!   --sass     after each loop, its instructions
//! ```
//! Uses `ptxas` and `nvdisasm` from `KBIT_PTXAS` / `KBIT_NVDISASM`, from
//! `.tools/` (where `scripts/setup.sh` installs them), or from `PATH`.
//! Counts are per warp and loop trip; how many weights a trip covers
//! depends on the kernel (its docs and `kbit_format`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, exit};

/// The instruction classes reported, by opcode (the part before the first
/// `.`), in print order.
const CLASSES: [(&str, &[&str]); 9] = [
    ("shared ld", &["LDS", "LDSM"]),
    ("global ld", &["LDG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "CCTL"]),
    ("store", &["STS", "STG", "STSM", "RED", "ATOM", "ATOMS"]),
    ("fp32", &["FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP"]),
    ("fp16", &["HFMA2", "HMUL2", "HADD2", "F2FP", "HMMA"]),
    (
        "int",
        &[
            "IMAD",
            "IADD3",
            "IADD",
            "VIADD",
            "VIADDMNMX",
            "VIMNMX",
            "LEA",
            "ISETP",
            "IMNMX",
            "SEL",
            "IABS",
            "MOV",
            "CS2R",
            "LDC",
            "UIADD3",
            "UIMAD",
            "ULEA",
            "USEL",
            "UISETP",
            "UMOV",
            "ULDC",
        ],
    ),
    (
        "bit",
        &[
            "LOP3", "SHF", "PRMT", "SHL", "SHR", "BFE", "BMSK", "POPC", "FLO", "SGXT", "PLOP3", "R2P", "P2R", "ULOP3",
            "USHF", "UPRMT", "UPLOP3",
        ],
    ),
    ("convert", &["I2F", "F2I", "I2FP", "F2F", "F2IP"]),
    ("control", &["BRA", "BRX", "BRXU", "BAR", "BSYNC", "BSSY", "WARPSYNC", "SYNCS", "NOP", "YIELD", "EXIT"]),
];

/// A tool from its environment variable, `.tools/`, or `PATH`.
fn find(var: &str, under_tools: &str, name: &str) -> PathBuf {
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools").join(under_tools);
    let candidates = std::env::var_os(var).map(PathBuf::from).into_iter().chain([local, PathBuf::from(name)]);
    for c in candidates {
        if Command::new(&c).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return c;
        }
    }
    eprintln!("sass_loops: no {name} (set {var}, or run scripts/setup.sh to install it into .tools/)");
    exit(2);
}

/// One SASS instruction: its text, its opcode and, for a branch, the
/// target label.
struct Insn {
    text: String,
    opcode: String,
    target: Option<String>,
}

/// `nvdisasm -c` output: per function, its instructions and the index of
/// each label.
fn parse(listing: &str) -> BTreeMap<String, (Vec<Insn>, BTreeMap<String, usize>)> {
    let mut out: BTreeMap<String, (Vec<Insn>, BTreeMap<String, usize>)> = BTreeMap::new();
    let mut current = None;
    for line in listing.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix(".text.").and_then(|l| l.strip_suffix(':')) {
            current = Some(name.to_string());
            out.entry(name.to_string()).or_default();
            continue;
        }
        let Some(f) = current.as_ref().and_then(|c| out.get_mut(c)) else { continue };
        if let Some(label) = t.strip_suffix(':').filter(|l| l.starts_with(".L")) {
            f.1.insert(label.to_string(), f.0.len());
        } else if let Some(rest) = t.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) {
            // `@!P0 BRA `(.L_x_3) ;`: skip the predicate, keep the opcode.
            let mut words = rest.trim_end_matches(';').split_whitespace().skip_while(|w| w.starts_with('@'));
            let Some(op) = words.next() else { continue };
            let target = rest.split_once("`(").and_then(|(_, r)| r.split_once(')')).map(|(l, _)| l.to_string());
            let text = rest.trim_end_matches(';').trim().to_string();
            f.0.push(Insn { text, opcode: op.to_string(), target: target.filter(|_| op.starts_with("BRA")) });
        }
    }
    out
}

/// The class of an opcode (`LDS.U.128` → "shared ld"), "other" if none.
fn class(opcode: &str) -> &'static str {
    let base = opcode.split('.').next().unwrap_or(opcode);
    CLASSES.iter().find(|(_, ops)| ops.contains(&base)).map_or("other", |(c, _)| c)
}

fn main() {
    let mut arch = "sm_90a".to_string();
    let (mut largest, mut opcodes, mut sass) = (false, false, false);
    let mut patterns = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--arch" => arch = args.next().unwrap_or_default(),
            "--largest" => largest = true,
            "--opcodes" => opcodes = true,
            "--sass" => sass = true,
            "-h" | "--help" => {
                println!("usage: sass_loops [--arch sm_89|sm_90a] [--largest] [--opcodes] [--sass] PATTERN...");
                return;
            }
            _ => patterns.push(a),
        }
    }
    let cc = match arch.as_str() {
        "sm_89" => (8, 9),
        "sm_90a" => (9, 0),
        other => {
            eprintln!("sass_loops: --arch {other:?}: sm_89 or sm_90a (the modules the host loads)");
            exit(2);
        }
    };
    if patterns.is_empty() {
        eprintln!(
            "usage: sass_loops [--arch sm_89|sm_90a] [--largest] [--opcodes] [--sass] PATTERN... (substrings of entry names)"
        );
        exit(2);
    }
    let ptx = kbit::module::ptx_for(cc);
    let entries: Vec<&str> = ptx
        .match_indices(".entry ")
        .filter_map(|(at, _)| ptx[at + 7..].split('(').next())
        .filter(|name| patterns.iter().any(|p| name.contains(p.as_str())))
        .collect();
    if entries.is_empty() {
        eprintln!("sass_loops: no entry of the {arch} module matches {patterns:?}");
        exit(2);
    }
    let (ptxas, nvdisasm) = (
        find("KBIT_PTXAS", "nvcc/nvidia/cuda_nvcc/bin/ptxas", "ptxas"),
        find("KBIT_NVDISASM", "nvdisasm/nvidia/cu13/bin/nvdisasm", "nvdisasm"),
    );
    let dir = std::env::temp_dir().join(format!("kbit-sass-loops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let (src, cubin) = (dir.join("m.ptx"), dir.join("m.cubin"));
    std::fs::write(&src, ptx.as_bytes()).expect("writing the PTX");
    let built = Command::new(&ptxas)
        .args(["-v", "-arch", &arch, "-e", &entries.join(","), "-o"])
        .arg(&cubin)
        .arg(&src)
        .output()
        .expect("running ptxas");
    let log = String::from_utf8_lossy(&built.stderr).into_owned();
    if !built.status.success() {
        eprintln!("sass_loops: ptxas failed:\n{log}");
        exit(1);
    }
    let listing = Command::new(&nvdisasm).arg("-c").arg(&cubin).output().expect("running nvdisasm");
    let _ = std::fs::remove_dir_all(&dir);
    let functions = parse(&String::from_utf8_lossy(&listing.stdout));
    // `Function properties for NAME` … `Used N registers`
    let mut registers = BTreeMap::new();
    let mut last = None;
    for line in log.lines() {
        if let Some(name) = line.split("Compiling entry function '").nth(1).and_then(|r| r.split('\'').next()) {
            last = Some(name.to_string());
        } else if let (Some(name), Some(r)) = (&last, line.split("Used ").nth(1).and_then(|r| r.split(' ').next())) {
            registers.insert(name.clone(), r.to_string());
        }
    }
    let classes: Vec<&str> = CLASSES.iter().map(|c| c.0).chain(["other"]).collect();
    println!("{arch}: instructions per warp and trip of each loop (innermost first), by class");
    println!("| kernel | regs | insns | loop | trip | {} |", classes.join(" | "));
    println!("|---|--:|--:|---|--:|{}", "--:|".repeat(classes.len()));
    for name in &entries {
        let Some((insns, labels)) = functions.get(*name) else { continue };
        let regs = registers.get(*name).map_or("?", String::as_str);
        // Loops: a backward branch at j to a label at i ≤ j.
        let mut loops: Vec<(usize, usize)> = insns
            .iter()
            .enumerate()
            .filter_map(|(j, x)| Some((*labels.get(x.target.as_ref()?)?, j)))
            .filter(|&(i, j)| i <= j)
            .collect();
        loops.sort_by_key(|&(i, j)| (j - i, i));
        if largest {
            loops = loops.split_off(loops.len().saturating_sub(1));
        }
        if loops.is_empty() {
            println!("| {name} | {regs} | {} | none | | {} |", insns.len(), vec![""; classes.len()].join(" | "));
        }
        for (i, j) in loops {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for x in &insns[i..=j] {
                *counts.entry(class(&x.opcode)).or_default() += 1;
            }
            let cells: Vec<String> =
                classes.iter().map(|c| counts.get(c).map_or(String::new(), |n| n.to_string())).collect();
            println!("| {name} | {regs} | {} | {i}..={j} | {} | {} |", insns.len(), j - i + 1, cells.join(" | "));
            if opcodes {
                let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
                for x in &insns[i..=j] {
                    *ops.entry(x.opcode.as_str()).or_default() += 1;
                }
                let mut ops: Vec<_> = ops.into_iter().collect();
                ops.sort_by_key(|&(op, n)| (std::cmp::Reverse(n), op));
                let list: Vec<String> = ops.iter().map(|(op, n)| format!("{op} {n}")).collect();
                println!("|  | | | | | {} |", list.join(", "));
            }
            if sass {
                println!("```");
                for x in &insns[i..=j] {
                    println!("{}", x.text);
                }
                println!("```");
            }
        }
    }
}
