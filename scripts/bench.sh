#!/usr/bin/env bash
# kbit's main job: installs what it needs, builds, and prints the benchmark
# tables (bench-results/ gets JSON + Markdown). Arguments go to kbit-bench
# (e.g. --m 1,16 --k 4 --dequant). Without a GPU it says so and runs the
# checks that need none (PTX assembly for sm_89/sm_90, CPU reference tests).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --bin kbit-bench
status=0
./target/release/kbit-bench "$@" || status=$?
if [ "$status" = 3 ]; then
  echo "== no GPU here: running what can run without one (PTX checks, CPU reference)"
  KBIT_REQUIRE_PTXAS=1 cargo test --release -p kbit --test ptx --test reference
  cargo test --release -p kbit-format --features std
  exit 0
fi
exit "$status"
