#!/bin/bash
# perf profiles of both tools (pp512 alone, tg64 alone), then a supplementary tg128 repeat.
set -u
P=/tmp/hyb/prof; HF2Q=/tmp/hyb/hf2q; LB=/tmp/hyb/llama/build/bin/llama-bench
start=$(date +%s); { date -u; uptime; } > $P/load_before.txt
for q in q8_0 q4_k_m; do
  f=/tmp/hyb/q35.$q.gguf
  echo "== perf $q t=$(( $(date +%s)-start ))s"
  perf record -F 499 -o $P/hf2q.$q.pp.data -- $HF2Q bench -m $f -p 512 -n 0 -r 1 -t 2 --json > $P/hf2q.$q.pp.json 2>/dev/null
  perf record -F 499 -o $P/llama.$q.pp.data -- $LB -m $f -p 512 -n 0 -r 1 -t 2 -o json > $P/llama.$q.pp.json 2>/dev/null
  perf record -F 499 -o $P/hf2q.$q.tg.data -- $HF2Q bench -m $f -p 0 -n 64 -r 1 -t 2 --json > $P/hf2q.$q.tg.json 2>/dev/null
  perf record -F 499 -o $P/llama.$q.tg.data -- $LB -m $f -p 0 -n 64 -r 1 -t 2 -o json > $P/llama.$q.tg.json 2>/dev/null
done
for q in q8_0 q4_k_m; do
  f=/tmp/hyb/q35.$q.gguf
  echo "== tg128 repeat $q t=$(( $(date +%s)-start ))s"
  timeout 150 $HF2Q bench -m $f -p 0 -n 128 -r 3 -t 2 --json > $P/tgrep.hf2q.$q.json 2>/dev/null
  timeout 150 $LB -m $f -p 0 -n 128 -r 3 -t 2 -o json > $P/tgrep.llama.$q.json 2>/dev/null
done
{ date -u; uptime; } > $P/load_after.txt
echo "total $(( $(date +%s)-start )) s"
