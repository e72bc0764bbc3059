//! Builds the `kernels-gpu` crate to PTX with rustc's nvptx64 backend and
//! places it in `OUT_DIR/kbit.ptx`, where `host/module.rs` embeds it.
//!
//! The nested cargo runs in a clean environment (the outer build's
//! `CARGO_*`/`RUSTC*`/`RUSTFLAGS` variables would otherwise leak into it,
//! e.g. clippy's wrapper or host target flags), with its own target
//! directory so that the host and device builds never contend for a lock.
//! `KBIT_PTX=path` skips the nested build and embeds a prebuilt PTX file.

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
    std::fs::copy(&ptx, out.join("kbit.ptx")).unwrap_or_else(|e| panic!("copying {} to OUT_DIR: {e}", ptx.display()));
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
    cmd.current_dir(root.join("kernels-gpu"))
        .env("RUSTFLAGS", format!("-C target-cpu={TARGET_CPU}"))
        .args(["build", "--release", "-Zbuild-std=core", "--target", "nvptx64-nvidia-cuda", "--target-dir"])
        .arg(&target_dir);
    let status = cmd.status().expect("running cargo for kernels-gpu");
    assert!(
        status.success(),
        "building kernels-gpu for nvptx64 failed; the pinned nightly with rust-src and llvm-bitcode-linker is required (rustup toolchain install)"
    );
    target_dir.join("nvptx64-nvidia-cuda/release/kbit_kernels_gpu.ptx")
}
