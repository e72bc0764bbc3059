#!/usr/bin/env bash
# Checks that the kernels compile to the same PTX whatever the checkout's
# path: builds `kernels-gpu` (with `format`) once more from a copy at a path
# of another length, with the command build.rs ran (which it wrote to
# target/nvptx-kernels/build-command), and compares the PTX with the one in
# target/nvptx-kernels (run after a build of this checkout).
#
# Why it can differ: cargo hashes a path dependency that lies outside the
# building workspace by its absolute path, the hash enters the symbol names
# of the generic code instantiated from it, and LLVM's order of work (so
# the instruction order of some kernels) follows the names. Through the
# link kernels-gpu/format the dependency lies inside the kernel workspace
# and is hashed by its relative path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
ptx=$target/nvptx-kernels/nvptx64-nvidia-cuda/release/kbit_kernels_gpu.ptx
[ -f "$ptx" ] || { echo "ptx-paths: $ptx is missing: build first (cargo build --release)" >&2; exit 2; }
recipe=$target/nvptx-kernels/build-command
rustflags=$(sed -n 's/^RUSTFLAGS=//p' "$recipe" 2>/dev/null || true)
args=$(sed -n 's/^ARGS=//p' "$recipe" 2>/dev/null || true)
[ -n "$rustflags" ] && [ -n "$args" ] || { echo "ptx-paths: $recipe is missing or incomplete: build first (cargo build --release)" >&2; exit 2; }

copy=$(mktemp -d "${TMPDIR:-/tmp}/kbit-ptx-path-check-XXXXXXXXXXXX")
trap 'rm -rf "$copy"' EXIT
# The sources (kernels-gpu/format stays a link) and the pinned toolchain;
# no build outputs, and no git needed.
tar -cf - --exclude=target kernels-gpu format rust-toolchain.toml | tar -xf - -C "$copy"
(
  cd "$copy/kernels-gpu"
  env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_TARGET_DIR -u RUSTC_WRAPPER \
    RUSTFLAGS="$rustflags" \
    cargo $args --quiet --target-dir "$copy/target"
)
if cmp -s "$ptx" "$copy/target/nvptx64-nvidia-cuda/release/kbit_kernels_gpu.ptx"; then
  echo "ptx-paths: the PTX built at $copy is byte-identical to $ptx"
else
  echo "ptx-paths: the PTX depends on the checkout path ($root vs $copy)" >&2
  exit 1
fi
