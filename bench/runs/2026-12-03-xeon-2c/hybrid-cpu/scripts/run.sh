#!/bin/bash
# Side-by-side CPU speed of hf2q bench and llama-bench (b11434) on the same GGUF files.
# Run under the cargo lock so no build runs meanwhile:
#   flock /tmp/hf2q-cargo.lock bash run.sh OUT_DIR
set -u
OUT=${1:-/tmp/hyb/out}; mkdir -p $OUT
HF2Q=/tmp/hyb/hf2q
LB=/tmp/hyb/llama/build/bin/llama-bench
start=$(date +%s)
{ date -u; uptime; } > $OUT/load_before.txt
ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -8 >> $OUT/load_before.txt
for round in 1 2; do
  for q in q8_0 q4_k_m; do
    f=/tmp/hyb/q35.$q.gguf
    if [ $round = 1 ]; then order="llama hf2q"; else order="hf2q llama"; fi
    for tool in $order; do
      el=$(( $(date +%s) - start ))
      if [ $round = 2 ] && [ $el -gt 300 ]; then echo "skip round 2 ($el s elapsed)"; continue; fi
      echo "== round $round $tool $q (t=${el}s)"
      if [ $tool = llama ]; then
        timeout 200 $LB -m $f -p 512 -n 128 -r 3 -t 2 -o json > $OUT/llama.$q.r$round.json 2> $OUT/llama.$q.r$round.err
      else
        timeout 200 $HF2Q bench -m $f -p 512 -n 128 -r 3 -t 2 --json > $OUT/hf2q.$q.r$round.json 2> $OUT/hf2q.$q.r$round.err
      fi
      echo "rc=$?"
    done
  done
done
{ date -u; uptime; } > $OUT/load_after.txt
echo "total $(( $(date +%s) - start )) s"
