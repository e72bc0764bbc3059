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
ptxas_bin=.tools/nvcc/nvidia/cuda_nvcc/bin/ptxas
if [ ! -x "$ptxas_bin" ]; then
  echo "== ptxas (PyPI nvidia-cuda-nvcc-cu12)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d .tools/wheel 'nvidia-cuda-nvcc-cu12>=12.8'
  python3 -c "import zipfile, glob; zipfile.ZipFile(sorted(glob.glob('.tools/wheel/nvidia_cuda_nvcc_cu12-*.whl'))[-1]).extractall('.tools/nvcc')"
  chmod +x "$ptxas_bin"
  rm -rf .tools/wheel
fi
export KBIT_PTXAS="$PWD/$ptxas_bin"
nvdisasm_bin=.tools/nvdisasm/nvidia/cu13/bin/nvdisasm
if [ ! -x "$nvdisasm_bin" ]; then
  echo "== nvdisasm (PyPI nvidia-cuda-nvdisasm)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d .tools/wheel 'nvidia-cuda-nvdisasm>=13,<14'
  python3 -c "import zipfile, glob; zipfile.ZipFile(sorted(glob.glob('.tools/wheel/nvidia_cuda_nvdisasm-*.whl'))[-1]).extractall('.tools/nvdisasm')"
  chmod +x "$nvdisasm_bin"
  rm -rf .tools/wheel
fi
export KBIT_NVDISASM="$PWD/$nvdisasm_bin"
"$KBIT_PTXAS" --version | tail -n 1
