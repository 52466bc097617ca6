#!/bin/bash
# Replicate of tg128 only, llama-bench first then hf2q for each file (run 1's order).
set -u
P=/tmp/hyb/rep; HF2Q=/tmp/hyb/hf2q; LB=/tmp/hyb/llama/build/bin/llama-bench
start=$(date +%s); { date -u; uptime; head -1 /proc/stat; } > $P/load_before.txt
for q in q8_0 q4_k_m; do
  f=/tmp/hyb/q35.$q.gguf
  echo "== $q t=$(( $(date +%s)-start ))s"
  timeout 150 $LB -m $f -p 0 -n 128 -r 3 -t 2 -o json > $P/llama.$q.json 2>/dev/null
  timeout 150 $HF2Q bench -m $f -p 0 -n 128 -r 3 -t 2 --json > $P/hf2q.$q.json 2>/dev/null
done
{ date -u; uptime; head -1 /proc/stat; } > $P/load_after.txt
echo "total $(( $(date +%s)-start )) s"
