#!/usr/bin/env bash
# kbit's test command (what CI runs): installs what it needs, then checks
# formatting, lints, the API docs, the PTX (ptxas for sm_89 and sm_90) and
# every test.
# GPU tests skip visibly without a GPU (KBIT_REQUIRE_GPU=1 makes that fail).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
(cd kernels-gpu && cargo fmt -- --check)
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo doc (broken links and doc warnings fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
echo "== cargo test"
KBIT_REQUIRE_PTXAS=1 cargo test --workspace --all-targets
cargo test --workspace --doc
echo "== PTX independent of the checkout path"
bash scripts/ptx-paths.sh
