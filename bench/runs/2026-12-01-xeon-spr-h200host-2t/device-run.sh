#!/usr/bin/env bash
# On the device machine: CPU facts, the VNNI kernels' unit tests, llama.cpp built there, and the
# 0.6B Q4_K_M bench pair (2 threads).
set -u
{ lscpu | grep -E "Model name|^Flags"; nproc; } > $OUT/cpu.txt
echo "== quant tests"; .devbin/quant-test 2>&1 | tail -4
echo "== engine tests"; .devbin/engine-test 2>&1 | tail -4
mkdir -p /tmp/ll && tar -xJf .devbin/llama-slim.tar.xz -C /tmp/ll
G=""; command -v ninja >/dev/null && G="-G Ninja"
cmake -S /tmp/ll/llama.cpp -B /tmp/ll/b $G -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > /tmp/ll/cfg.log 2>&1 || { tail -20 /tmp/ll/cfg.log; exit 1; }
time cmake --build /tmp/ll/b -j16 --target llama-bench > /tmp/ll/build.log 2>&1 || { tail -30 /tmp/ll/build.log; exit 1; }
time python3 bench/convert/make_qwen3_0.6b.py .devbin/qwen3tok /tmp/q || exit 1
time .devbin/hf2q convert /tmp/q --quant q4_k_m -o /tmp/hx.Q4_K_M.gguf || exit 1
HF2Q=.devbin/hf2q ROUNDS=2 bench/engine/run.sh $OUT/engine /tmp/ll/b/bin /tmp/hx.Q4_K_M.gguf
