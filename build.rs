//! Builds the `kernels-gpu` crate to PTX with rustc's nvptx64 backend and
//! places it in `OUT_DIR/kbit.ptx`, where `host/module.rs` embeds it.
//!
//! The nested cargo runs in a clean environment (the outer build's
//! `CARGO_*`/`RUSTC*`/`RUSTFLAGS` variables would otherwise leak into it,
//! e.g. clippy's wrapper or host target flags), with its own target
//! directory so that the host and device builds never contend for a lock.
//! `KBIT_PTX=path` skips the nested build and embeds a prebuilt PTX file.
//!
//! The entries of the sm_90a module (`kbit_wgmma_*`: warpgroup MMA, which
//! no other architecture has; `kbit_mma_direct_xreg_*`) are cut out of `kbit.ptx` into
//! `kbit_sm90a.ptx`, which holds only them; `host/module.rs` appends them
//! to the module it loads on sm_90.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The PTX target: sm_89 is the oldest GPU we tune for; the driver JIT-compiles
/// the PTX for newer ones (sm_90).
const TARGET_CPU: &str = "sm_89";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for p in ["kernels-gpu/src", "kernels-gpu/Cargo.toml", "format/src", "format/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=KBIT_PTX");

    let ptx = if let Ok(prebuilt) = env::var("KBIT_PTX") { PathBuf::from(prebuilt) } else { build_kernels(&root) };
    let text = std::fs::read_to_string(&ptx).unwrap_or_else(|e| panic!("reading {}: {e}", ptx.display()));
    let (common, sm90a) = split_sm90a(&with_launch_bounds(&text));
    std::fs::write(out.join("kbit.ptx"), common).expect("writing OUT_DIR/kbit.ptx");
    std::fs::write(out.join("kbit_sm90a.ptx"), sm90a).expect("writing OUT_DIR/kbit_sm90a.ptx");
}

/// Name prefix of the entries that only the sm_90a module holds.
const SM90A_PREFIX: &str = "kbit_wgmma_";

/// The direct-load entries with the activations in registers, also in the
/// sm_90a module only (measured on sm_90; at k = 2 they need one register
/// over 64 on sm_89).
const SM90A_DIRECT_PREFIX: &str = "kbit_mma_direct_xreg_";

/// `ptx` without the sm_90a entries, and those entries alone (each from
/// its `.visible .entry` line to the closing brace of its body).
fn split_sm90a(ptx: &str) -> (String, String) {
    let (mut common, mut sm90a) = (String::with_capacity(ptx.len()), String::new());
    let mut rest = ptx;
    while let Some(at) = rest.find(".visible .entry ") {
        let name = &rest[at + ".visible .entry ".len()..];
        let end = at + rest[at..].find("\n}\n").expect("an entry body ends with a closing brace") + 3;
        common.push_str(&rest[..at]);
        if name.starts_with(SM90A_PREFIX) || name.starts_with(SM90A_DIRECT_PREFIX) {
            sm90a.push_str(&rest[at..end]);
        } else {
            common.push_str(&rest[at..end]);
        }
        rest = &rest[end..];
    }
    common.push_str(rest);
    (common, sm90a)
}

/// PTX performance directives of an entry, by name (rustc has no attribute
/// for them). The grouped tensor-core GEMM runs 256 threads, and its
/// instances must hold the blocks per SM that the host plans for from
/// shared memory alone: 3 for one m block, 2 for more. Left alone, ptxas
/// gives some two- and four-m-block instances 129-132 registers, one
/// block's worth; capped, they keep two, with no spills (the PTX test
/// checks). The dense one- and two-m-block, 128-column instances (wide
/// stages, `kbit_format::mma::wide_stages`) likewise keep the two blocks
/// their shared memory allows (one m block at k = 4, 5 uncapped: 131
/// registers). The one-row, one-team k = 2 scalar GEMV instances carry
/// their launch size (512 threads): with pair sums their tables hold them
/// to one block per SM, so ptxas may take up to 128 registers (89 on
/// sm_90, 49 on sm_89; before pair sums the directive took them from 54 to
/// 60 registers at two blocks per SM, Llama-size shapes 2–3 % faster); at k = 3
/// the launch size would give 95–106 registers, and a 60-register budget
/// ran Llama-3-8B 2 % faster. At k = 4 both ran Llama-3-8B 1–3 % faster
/// and Llama-3-70B 8–13 % slower (`bench-results/NOTES.md`); since the
/// one-row instances at k ≤ 4 carry one loop per constant ring depth
/// (`kernels-gpu` `gemv::dense`), the one-team k = 4 instance would take 66
/// registers, over the 64 of two 512-thread blocks per SM, and is held to
/// 64 (no spills). The one- and three-row k = 4 column-slot
/// instances are held to 64 registers (ptxas gives them 65 and 66 on
/// sm_90, which costs resident blocks and with them the overlap of a call
/// with the previous one; capped, no spills: three-row `q`, `o`, `down`
/// −8 to −10 %), and so, since the one-row k = 4 blocks are folded
/// (`kbit_format::gemv_slots::folds`), are the grouped pairs three-row
/// k = 4 instance (70 on sm_90; capped, `moe_dn` ×8 at max_m = 3 ran
/// 4.8 % slower than before the fold, uncapped 6–7 % slower still) and
/// the grouped one-row k = 4 instance (67 on sm_90), the latter at 63:
/// capped at 64, ptxas spills it on sm_89 (8 bytes of stack), where it
/// takes 60 uncapped; at 63 neither spills, and 63 and 64 registers hold
/// the same blocks. So is the one-row two-team k = 2 instance (72 on sm_90),
/// whose 1024 threads need 64 (pair sums: two teams share one block's
/// tables on Llama-3-8B). Other instances a little over 64 spill when
/// capped. The two-team direct-load instances carry their launch size
/// (1024 threads), which holds them to 64 registers (57–64, no spills).
fn launch_bounds(entry: &str) -> Option<&'static str> {
    let dense = entry.starts_with("kbit_mma_k") || entry.starts_with("kbit_mma_stream_");
    if entry.starts_with("kbit_gemv_m1_k2_") {
        Some(".maxntid 512, 1, 1\n")
    } else if entry.starts_with("kbit_gemv_m1_k3_") {
        Some(".maxnreg 60\n")
    } else if entry.starts_with("kbit_gemv_slots_m1_k4_")
        || entry.starts_with("kbit_gemv_slots_m3_k4_")
        || entry.starts_with("kbit_grouped_gemv_pairs_m3_k4_")
        || entry.starts_with("kbit_gemv_teams_m1_k2_")
        || entry.starts_with("kbit_gemv_m1_k4_")
    {
        Some(".maxnreg 64\n")
    } else if entry.starts_with("kbit_grouped_gemv_slots_m1_k4_") {
        Some(".maxnreg 63\n")
    } else if entry.starts_with("kbit_mma_direct_teams_") {
        Some(".maxntid 1024, 1, 1\n")
    } else if entry.starts_with("kbit_mma_direct_k") && entry.contains("_r16_") {
        // Sixteen staged rows hold an SM to one block by shared memory.
        Some(".maxntid 512, 1, 1\n")
    } else if entry.starts_with("kbit_mma_direct_k5_") {
        Some(".maxntid 512, 1, 1\n.maxnreg 80\n")
    } else if entry.starts_with("kbit_mma_direct_") {
        Some(".maxntid 512, 1, 1\n.minnctapersm 2\n")
    } else if dense && (entry.contains("_m1_n128_") || entry.contains("_m2_n128_")) {
        Some(".maxntid 256, 1, 1\n.minnctapersm 2\n")
    } else if entry.starts_with(SM90A_PREFIX) {
        Some(".maxntid 384, 1, 1\n")
    } else if !entry.starts_with("kbit_mma_grouped_") {
        None
    } else if entry.contains("_m1_") {
        Some(".maxntid 256, 1, 1\n.minnctapersm 3\n")
    } else {
        Some(".maxntid 256, 1, 1\n.minnctapersm 2\n")
    }
}

/// `ptx` with the directives of [`launch_bounds`] between each entry's
/// parameter list and its body.
fn with_launch_bounds(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut rest = ptx;
    while let Some(at) = rest.find(".visible .entry ") {
        let name_at = at + ".visible .entry ".len();
        let name_end = rest[name_at..].find('(').map_or(rest.len(), |e| name_at + e);
        let body = rest[name_at..].find("\n{").map(|b| name_at + b + 1).expect("an entry has a body");
        out.push_str(&rest[..body]);
        if let Some(d) = launch_bounds(&rest[name_at..name_end]) {
            out.push_str(d);
        }
        rest = &rest[body..];
    }
    out.push_str(rest);
    out
}

fn build_kernels(root: &std::path::Path) -> PathBuf {
    let target_dir =
        env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target")).join("nvptx-kernels");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = k == "CARGO_HOME" || k == "RUSTUP_HOME" || k == "RUSTUP_TOOLCHAIN";
        if !keep
            && (k.starts_with("CARGO")
                || k.starts_with("RUSTC")
                || k.starts_with("RUSTDOC")
                || k == "RUSTFLAGS"
                || k.starts_with("__CARGO"))
        {
            cmd.env_remove(&k);
        }
    }
    let rustflags = format!("-C target-cpu={TARGET_CPU}");
    let args = ["build", "--release", "-Zbuild-std=core", "--target", "nvptx64-nvidia-cuda"];
    cmd.current_dir(root.join("kernels-gpu"))
        .env("RUSTFLAGS", &rustflags)
        .args(args)
        .arg("--target-dir")
        .arg(&target_dir);
    // The same build elsewhere (scripts/ptx-paths.sh) replays these two lines.
    std::fs::create_dir_all(&target_dir).expect("creating the kernel target directory");
    let replay = format!("RUSTFLAGS={rustflags}\nARGS={}\n", args.join(" "));
    std::fs::write(target_dir.join("build-command"), replay).expect("writing the kernel build command");
    let status = cmd.status().expect("running cargo for kernels-gpu");
    assert!(
        status.success(),
        "building kernels-gpu for nvptx64 failed; the pinned nightly with rust-src and llvm-bitcode-linker is required (rustup toolchain install)"
    );
    target_dir.join("nvptx64-nvidia-cuda/release/kbit_kernels_gpu.ptx")
}
