#!/usr/bin/env bash
# Installs everything dloco needs to build, test and run on Debian 12 (idempotent; needs root or sudo).
# Packages only from Debian's registry: LibTorch (CPU), OpenBLAS (pthread build, so matmul is not ~17x slow),
# tcmalloc (gperftools; glibc's malloc hands large tensors back to the kernel and re-faults them every step),
# gRPC + protobuf, Gloo (c10d's collectives for the baselines), SentencePiece, CLI11, spdlog, toml++, nlohmann-json, GoogleTest, Google Benchmark,
# the KJV corpus (bible-kjv), gnuplot for plots, and Debian's PyTorch + numpy for /usr/bin/python3 (the golden
# test of the GPT against an independent PyTorch implementation, tests/model/golden_gpt.py) with gRPC + protobuf
# (python3-grpcio, python3-protobuf: the Python learner, python/, and its tests in tests/python), cpp-httplib (the
# monitoring endpoint: /metrics, /status.json, the dashboard), Chromium (headless, the dashboard's browser test),
# slurm-wlm + munge (the one-node Slurm cluster of tests/slurm), iproute2 (network namespaces: tests/launcher),
# iptables + libnetfilter-queue (bench/wan's delay line: a link's latency on kernels without sch_netem) and
# openssl (scripts/make-certs.sh: a run's TLS certificates), clang 14 with its libFuzzer runtime (scripts/fuzz.sh:
# the fuzz targets under fuzz/).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libtorch-dev libopenblas0-pthread libopenblas-pthread-dev libgoogle-perftools-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libgloo-dev
  libsentencepiece-dev sentencepiece
  libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  bible-kjv gnuplot-nox python3 python3-torch python3-numpy python3-grpcio python3-protobuf
  libcpp-httplib-dev prometheus-cpp-dev chromium slurm-wlm munge iproute2 openssl libssl-dev
  iptables libnetfilter-queue-dev
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "[setup] all ${#packages[@]} packages present"
fi

# LibTorch links libblas.so.3 / liblapack.so.3 through Debian's alternatives: make sure OpenBLAS serves them.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 liblapack.so.3; do
  alt="$lib-$arch"
  target=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-pthread | head -n1 || true)
  if [ -n "$target" ]; then
    $SUDO update-alternatives --set "$alt" "$target" >/dev/null
  fi
done
echo "[setup] BLAS: $(readlink -f /usr/lib/$arch/libblas.so.3)"
