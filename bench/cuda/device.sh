#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with the stripped binaries
# in .dev/ (built here: hf2q, engine-tests = engine's lib tests, engine_tiny) and llama.cpp b11434's
# trimmed source (.dev/llama-src.tgz, PEERS.md). Phases, each one `device` call (those of the sessions
# up to the eighth, 2026-12-04, are in device-past.sh, which this file sources for them):
#   start  : starts (in the background) the llama.cpp CUDA build and the Llama-3.1-8B-shaped model
#            with its Q4_K_M / Q8_0 / BF16 conversions; runs doctor, the CUDA op tests and the
#            engine fixtures on CUDA
#   bench  : waits for the background work, then llama-bench and hf2q bench side by side
#   stash1, stash2: copy .dev/stash1/* or .dev/stash2/* to /tmp/stash (SmolLM2, 98 MB, in two halves
#            made here with `split -b 50000000 FILE smol.part.`: one call's carry is 64 MiB)
#   smollm2: reassembles SmolLM2 Q4_1 from /tmp/stash, makes Q8_0 / Q4_K_M from it, compares greedy
#            chat replies on CUDA with the goldens, and perplexity on the CPU and CUDA
#   extra  : after `all` on the same machine: greedy tokens CPU vs CUDA on the 8B Q8_0, and ncu's
#            per-kernel times of decode steps on the Q4_K_M
#   serve  : hf2q serve --device cuda vs llama-server -np N -fa on (bench/cuda/serve_bench.py) at 16
#            and 64 streams on the 8B Q4_K_M (made by `all`/`hf2q` on this machine)
#   p1, p2, p4: a chained session (each call within the machine's warm window, carried files
#            staying there): p1 starts the llama.cpp build and the 8B model in the background (new
#            process sessions) and measures the copy bandwidth; p2 runs the op tests and fixtures;
#            smollm2 (SmolLM2 in thirds, .dev/stash1..3, carried one per call) checks the goldens;
#            p4 benches hf2q and llama.cpp on the three files, A/Bs the warps per row, and takes
#            ncu's per-kernel times of decode (Q4_K_M) and prefill (BF16)
#   moe_start, moe: the Qwen3-30B-A3B-shaped model and its Q4_K_M in the background, then benched
#   s1, s2, s3: a chained session of three calls. s1 (carrying hf2q, engine-tests, engine_tiny,
#            fixtures, llama-src.tgz): the background builds, copy bandwidth, doctor, the op tests
#            and the fixtures on CUDA. s2 (carrying .dev/stashA, the first half of SmolLM2 Q4_1,
#            `split -n 2`): batched decoding (hf2q bench --parallel) against
#            llama-batched-bench, then hf2q bench and
#            llama-bench on the three 8B files. s3 (carrying .dev/stashB): serving at 16 and 64
#            streams against llama-server, then SmolLM2's goldens with logit margins
#            (golden_margins.py) and perplexity on the CPU and CUDA.
#   s9a, s9b, s9c, s11, s10, s9d: the chain written for the next session with device time, issued
#            as one batch (a machine is given back 30 s after a call): s9a carries .dev; s9b .dev1 (SmolLM2's first
#            half); `s9c auto` .dev2 (its second half); s11 the goldens (hf2q's and llama.cpp's CUDA
#            against their CPUs); s10 sampled serving; `s9d auto` greedy serving with the variants.
#            When a call gets no machine (2026-12-05: ~3 minutes of device time spent), each later
#            call for ~10 minutes is refused at 15 s of device time each. (Run 2026-12-05 on an H100:
#            bench/runs/2026-12-05-h100.)
#   s12    : the build with the GPU's top-k and sampling on by default: their op tests and sampled
#            serving against both off (carry .dev).
#   next H200 session: s15 (carry .dev: a fresh machine, the op tests, the fixtures with the MoE's
#            two new variants), s13 (the MoE variants' A/B; each MoE kernel's cost with launches
#            overlapping, HF2Q_CUDA_TWICE), s14 (the same costs on the 8B BF16; sampled serving
#            against llama-server; both tools on the four files with the variants chosen).
#   s19, s20 (2026-12-05, fourteenth session; ran on an H100: bench/runs/2026-12-05-h100-c): the
#            MoE routing by a block; s21, s22 (ran on an H200: bench/runs/2026-12-05-h200): the rope
#            inside decode attention; s25 (ran on an H100, 286 s: bench/runs/2026-12-05-h100-d) the
#            L2 prefetch (since taken out) and a router's four warps a row. s27, s28 (2026-12-05,
#            fifteenth session, on an H100: bench/runs/2026-12-05-h100-e): the float products'
#            loads (taken out) and a warp per pair of rows; s26 on an H200 (bench/runs/
#            2026-12-05-h200-b): the Done-when figures; s30 (asked for an H200, ran on an H100:
#            2026-12-05-h100-e call 3) one-row Q4_K + Q6_K launches. s31 (not run) on an H200:
#            the MoE's figure and its kernels' costs. s32 (2026-12-05, seventeenth session, one
#            call, not run: no device time left): the MoE's norm + router + routing launch against
#            the three, and both tools: ran 2026-12-06 (bench/runs/2026-12-06-h200), the variant
#            taken out. s34 (2026-12-06, nineteenth session) ran on an H100 (bench/runs/
#            2026-12-06-h100): no knob won. s37 on an H200 (bench/runs/2026-12-06-h200 call 2): the
#            one-launch MoE step (MoeOne) 0.907x, both tools on the MoE 1.474x. s38 (2026-12-06,
#            twentieth session, on an H100: 2026-12-06-h100 call 2): MoeOne's modes all slower, the
#            variant taken out. s40 / s41 (on H100s, 2026-12-06-h100 calls 3 and 4): the lean expert
#            products (HF2Q_CUDA_MOE_LEAN), 1.020x; s42 (asked for an H200, ran on an H100:
#            2026-12-06-h100 call 5): 1.024x as the defaults, both tools 1.446x on that H100.
#            s43 (carry .dev made at HEAD; ~450 s; for an H200): the MoE's Done-when figure with the
#            lean kernels, and the GLU variants A/B'd again with them; it ran 2026-12-06 on an H100
#            (bench/runs/2026-12-06-h100 call 6), and twice more on H100s (calls 8, 9: 1.393x,
#            1.400x); so did s44a-c (call 7: the goldens with the CPU's attention bit for bit, still
#            parting; taken out). s45 (twenty-second session, two H100s: bench/runs/2026-12-06-h100-b
#            calls 1, 2): the router making its input's norm (NormRouter), 0.959x then 1.002x, taken
#            out; s46 (both tools on the MoE only, ~410-440 s) ran twice on H100s (calls 3, 4: 1.429x,
#            1.439x). Twenty-third session, three H100s (bench/runs/2026-12-06-h100-c): s46
#            (llama-bench's build unfinished at 440 s), s47 (the experts' weights asked of the L2
#            early: slower, taken out), s48 (s46 waiting until 520 s: 1.389x). Twenty-fourth session
#            (bench/runs/2026-12-06-h100-d): ten refused starts; s49 / s49b on an H100, where the
#            48-layer MoE's save_pretrained ran out of GPU memory (make_model.py now writes it a
#            tensor at a time). Twenty-fifth session (bench/runs/2026-12-06-h100-e): six refused
#            starts, then s49 / s49b on an H100: the 48-layer MoE made (save_split, 56.9 GiB of GPU
#            memory), both tools 1.382x / 1.358x. Twenty-sixth session (bench/runs/2026-12-06-h100-f),
#            four H100s, no refusals: s49 (1.393x / 1.379x), s53 (shorter attention splits), s54 and s55
#            (decode attention's merge and the MoE router + routing in thread block clusters: slower,
#            taken out); s49h and s56 were refused. Twenty-seventh session (bench/runs/2026-12-06-h100-g):
#            s56 on an H100 (each MoE kernel's share of a step: gate / up 9.45 us a layer, attention
#            8.42), then eight refused starts. Twenty-eighth session (bench/runs/2026-12-06-h200-b):
#            five refused starts, then on one H200 s57 (the branch's head groups: 8 blocks 1.058x on
#            the 8-layer cut; one block 0.924x) and s49 with HF2Q_CUDA_ATTN_HG=8 (the whole MoE
#            1.527x / 1.525x); s58 (the 8B with HEAD's default) was refused twice; s58b is its
#            shorter form for the device time left. (s49 does round 2 and the tensor list itself
#            when it has time; s49b finishes what it could not.)
# A call carries at most 64 MiB with the tree, counted in disk blocks (du), not bytes (2026-12-06).
# Seen on the device (2026-12-02): a call's carried paths replace .dev there (files carried by an
# earlier call are gone), so phases copy what later calls need into /tmp; the machine is given back
# 30 s after a call, and calls issued together in one batch run back to back within that window;
# at most 8 files come back from $OUT.
# Logs go to $OUT.
set -uo pipefail
phase=$1
D=$PWD/.dev
export PATH=$PATH:/usr/local/cuda/bin
export HF2Q_CACHE=/tmp/hf2q-cache
W=/tmp/w
mkdir -p $W
bg_llama() {
  # llama.cpp b11434's CUDA build in the background (a new process session: it outlives the call
  # while the machine stays warm); BUILD-END in /tmp/lc.log when done.
  [ -f /tmp/lc.log ] && return
  mkdir -p /tmp/lc && tar -xzf $D/llama-src.tgz -C /tmp/lc
  setsid nohup bash -c "cmake -S /tmp/lc -B /tmp/lc/b -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      > /tmp/lc.log 2>&1 && cmake --build /tmp/lc/b -j10 --target ${LLAMA_TARGETS:-llama-bench llama-server llama-batched-bench} >> /tmp/lc.log 2>&1; \
      echo BUILD-END rc=\$? >> /tmp/lc.log" > /dev/null 2>&1 &
}
bg_llama_bench() {
  # llama-bench alone (-j12: the model conversions run beside it), in the background.
  mkdir -p /tmp/lc && tar -xzf $D/llama-src.tgz -C /tmp/lc
  setsid nohup bash -c "cmake -S /tmp/lc -B /tmp/lc/b -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      > /tmp/lc.log 2>&1 && cmake --build /tmp/lc/b -j12 --target llama-bench >> /tmp/lc.log 2>&1; echo BUILD-END rc=\$? >> /tmp/lc.log" > /dev/null 2>&1 &
}
bg_builds() {
  # The llama.cpp build and the 8B model with its three conversions, in the background.
  bg_llama
  bg_model
}
bg_model() {
  if [ ! -f /tmp/mk.log ]; then
    # (A copy of the binary: a later call that carries other files replaces .dev.)
    mkdir -p /tmp/bin && cp $D/hf2q /tmp/bin/hf2q
    setsid nohup bash -c "python3 bench/cuda/make_model.py llama8b $W/l8b > /tmp/mk.log 2>&1 && \
        for q in q4_k_m q8_0 bf16; do /usr/bin/time -v /tmp/bin/hf2q convert $W/l8b -o $W/l8b.\$q.gguf --quant \$q >> /tmp/mk.log 2>&1; done; \
        rm -rf $W/l8b; echo MAKE-END >> /tmp/mk.log" > /dev/null 2>&1 &
  fi
}
H=/tmp/bin/hf2q
wait_builds() {
  for i in $(seq 1 110); do grep -q BUILD-END /tmp/lc.log && grep -q MAKE-END /tmp/mk.log && break; sleep 5; done
  tail -n 1 /tmp/lc.log; grep -E "make_model|Elapsed|Maximum resident" /tmp/mk.log > $OUT/make.txt
}
stash() {
  # (From .dev/stash*, or from .devN/stash* when a call carries a part alone; SmolLM2 in parts made
  # here: `split -n 2 FILE smol.part.` into .dev1/stashA and .dev2/stashB, or thirds as s64's.)
  mkdir -p /tmp/stash && for d in $D/stash* $PWD/.dev[0-9]/stash*; do [ -d $d ] && cp $d/* /tmp/stash/; done; ls /tmp/stash
}
smol_models() {
  # SmolLM2 Q4_1 from its halves in /tmp/stash (`stash`) to M=/tmp/smollm2, and its Q8_0 / Q4_K_M.
  M=/tmp/smollm2 && mkdir -p $M
  cat /tmp/stash/smol.part.* > $M/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/smollm2-sha.txt
  for q in Q8_0 Q4_K_M; do
    $H quantize --allow-requantize $M/SmolLM2-135M-Instruct.Q4_1.gguf $M/SmolLM2-135M-Instruct.$q.gguf $q > /dev/null 2>&1
  done
}
smol_ppl() {  # smol_ppl TIMEOUT [TYPES]: perplexity of SmolLM2 in TYPES (Q8_0 Q4_1; smol_models) on the CPU and CUDA
  for q in ${2:-Q8_0 Q4_1}; do
    for dev in cpu cuda; do
      echo "$q $dev: $(timeout $1 $H perplexity -m $M/SmolLM2-135M-Instruct.$q.gguf --device $dev -f crates/hf2q/tests/data/perplexity/alice_in_wonderland.txt -c 512 2>&1 | grep -E "PPL|Final" | tail -1)" | tee -a $OUT/smollm2-perplexity.txt
    done
  done
}
batched() {
  # llama-batched-bench and hf2q bench --parallel on the 8B Q4_K_M (512-token prompts, 128 steps).
  m=$W/l8b.q4_k_m.gguf
  /tmp/lc/b/bin/llama-batched-bench -m $m -ngl 99 -fa on -c 45056 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,4,16,64 \
    > $OUT/llama-batched-bench.txt 2>&1
  grep -E "^\|" $OUT/llama-batched-bench.txt
  $H bench -m $m --device cuda -p 512 -n 128 -r 1 --parallel 1,4,16,64 2>&1 | tee -a $OUT/hf2q-batched.txt | grep " x"
}
serve_pair() {
  # serve_pair N [hf2q serve options]: llama-server then hf2q serve, N streams (serve_bench.py).
  local n=$1; shift
  B=/tmp/lc/b/bin; m=$W/l8b.q4_k_m.gguf
  if [ "${SKIP_LLAMA:-0}" != 1 ]; then
    $B/llama-server -m $m -ngl 99 -fa on -np $n -c $((n * 704)) --port 8081 > /tmp/ls.log 2>&1 &
    local srv=$!
    for i in $(seq 1 120); do curl -sf localhost:8081/health > /dev/null && break; sleep 1; done
    python3 bench/cuda/serve_bench.py http://127.0.0.1:8081 $n 512 128 128256 ${SERVE_TEMP:-0} ${SERVE_TOPK:-40} | sed "s/^/llama-server -np $n temp ${SERVE_TEMP:-0} top_k ${SERVE_TOPK:-40}: /" | tee -a $OUT/serve.txt
    kill $srv; wait $srv
  fi
  $H serve -m $m --device cuda --parallel $n -c 704 --port 8082 "$@" > /tmp/hs.log 2>&1 &
  local srv=$!
  for i in $(seq 1 120); do curl -sf localhost:8082/readyz > /dev/null && break; sleep 1; done
  python3 bench/cuda/serve_bench.py http://127.0.0.1:8082 $n 512 128 128256 ${SERVE_TEMP:-0} ${SERVE_TOPK:-40} | sed "s/^/hf2q --parallel $n $* temp ${SERVE_TEMP:-0} top_k ${SERVE_TOPK:-40} HF2Q_CUDA_TOPK=${HF2Q_CUDA_TOPK:-1} HF2Q_CUDA_SAMPLE=${HF2Q_CUDA_SAMPLE:-1}: /" | tee -a $OUT/serve.txt
  kill $srv; wait $srv
  tail -n 3 /tmp/hs.log >> $OUT/serve-hf2q-log.txt
}
prof() {
  # prof NAME FROM ARGS...: hf2q with HF2Q_CUDA_PROFILE=FROM (per-kernel GPU times from step FROM).
  local name=$1 from=$2; shift 2
  HF2Q_CUDA_PROFILE=$from timeout 90 $H "$@" > $OUT/prof-$name.txt 2>&1
  grep -A 14 HF2Q_CUDA_PROFILE $OUT/prof-$name.txt | sed "s/^/$name: /"
}
bg_model_all() {
  # The 8B model's three files, then the Qwen3-30B-A3B-shaped MoE in Q4_K_M (its HF directory in
  # /dev/shm, in memory, when it has room for the 48 layers: 61 GB of bf16 beside the 8B files would
  # not fit on the 64 GiB disk; else 24 layers there, else 16 on the disk), in the background.
  [ -f /tmp/mk.log ] && return
  mkdir -p /tmp/bin && cp $D/hf2q /tmp/bin/hf2q
  setsid nohup bash -c "python3 bench/cuda/make_model.py llama8b $W/l8b > /tmp/mk.log 2>&1 && \
      for q in q4_k_m q8_0 bf16; do /usr/bin/time -v /tmp/bin/hf2q convert $W/l8b -o $W/l8b.\$q.gguf --quant \$q >> /tmp/mk.log 2>&1; done; \
      rm -rf $W/l8b; echo MAKE-END >> /tmp/mk.log; \
      avail=\$(df -B1 --output=avail /dev/shm | tail -n 1); L=48; M=/dev/shm/moe; \
      [ \$avail -lt 66000000000 ] && L=24; [ \$avail -lt 34000000000 ] && { L=16; M=$W/moe; }; \
      echo moe layers \$L in \$M, /dev/shm avail \$avail >> /tmp/mk.log; \
      python3 bench/cuda/make_model.py qwen3moe30b \$M \$L >> /tmp/mk.log 2>&1 && \
      /usr/bin/time -v /tmp/bin/hf2q convert \$M -o $W/moe.q4_k_m.gguf --quant q4_k_m >> /tmp/mk.log 2>&1; \
      rm -rf \$M; echo MOE-END >> /tmp/mk.log" > /dev/null 2>&1 &
}
bench_pair() {
  # bench_pair TAG FILE: hf2q bench then llama-bench on one file (pp512, tg128, three repetitions).
  # Both tools' JSON go to bench-raw.txt under their commands (a call brings back 8 files at most).
  bench_hf2q "$@"
  bench_llama "$@"
  bench_sum $1
}
bench_hf2q() {  # bench_hf2q TAG FILE: bench_pair's hf2q half (/tmp/hf2q-bench-TAG.json, bench-raw.txt)
  local tag=$1 m=$2
  timeout 150 $H bench -m $m --device cuda -p 512 -n 128 -r 3 --json > /tmp/hf2q-bench-$tag.json 2> /dev/null
  { echo "== hf2q bench -m $m --device cuda -p 512 -n 128 -r 3 --json"; cat /tmp/hf2q-bench-$tag.json; } >> $OUT/bench-raw.txt
}
bench_llama() {  # bench_llama TAG FILE: bench_pair's llama-bench half (/tmp/llama-bench-TAG.json)
  local tag=$1 m=$2
  timeout 150 /tmp/lc/b/bin/llama-bench -m $m -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json > /tmp/llama-bench-$tag.json 2> /dev/null
  { echo "== llama-bench -m $m -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json"; cat /tmp/llama-bench-$tag.json; } >> $OUT/bench-raw.txt
}
bench_sum() {  # bench_sum TAG: both tools' figures for TAG (pp512 / tg128, mean and spread) to bench-summary.txt
  python3 -c "
import json,sys
for f in sys.argv[1:]:
    try: rows = json.load(open(f))
    except Exception as e: print(f, 'no result', e); continue
    for r in rows: print(f.split('/')[-1], r.get('test') or ('pp%d' % r['n_prompt'] if r['n_prompt'] else 'tg%d' % r['n_gen']), round(r['avg_ts'], 2), round(r.get('stddev_ts', 0), 2))
" /tmp/hf2q-bench-$1.json /tmp/llama-bench-$1.json | tee -a $OUT/bench-summary.txt
}
tg() {
  # tg TAG FILE [ENV=V ...]: hf2q tg128 alone with the per-step times (to $TG_OUT, else
  # bench-summary.txt).
  local tag=$1 m=$2; shift 2
  env HF2Q_CUDA_STEP_TIMES=1 "$@" timeout 60 $H bench -m $m --device cuda -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|STEP_TIMES" | sed "s/^/$tag $* /" | tee -a ${TG_OUT:-$OUT/bench-summary.txt}
}
tgp() {
  # tgp TAG FILE [ENV=V ...]: hf2q tg128 alone, five repetitions, nothing timed inside (ab.txt).
  local tag=$1 m=$2; shift 2
  env "$@" timeout 90 $H bench -m $m --device cuda -p 0 -n 128 -r 5 2>&1 | grep -E "tg128" | sed "s/^/$tag $* plain /" | tee -a $OUT/ab.txt
}
unpack() {
  # unpack [DIR]: the carried binaries (DIR/bins.tar.xz, DIR = .dev by default) to /tmp/bin.
  local d=${1:-$D}
  tar -xJf $d/bins.tar.xz -C $d && mkdir -p /tmp/bin && cp $d/hf2q /tmp/bin/ && for b in engine_tiny engine-tests; do [ -f $d/$b ] && cp $d/$b /tmp/bin/; done
}
machine_info() {
  { nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv; df -h /tmp /dev/shm; } | tee $OUT/gpu.txt
  nvidia-smi -q > $OUT/nvidia-smi-q.txt
}
bg_make() {
  # bg_make "TYPES" [moe [LAYERS]]: in the background, the 8B model in those types (TYPE-END in
  # /tmp/mk.log after each, MAKE-END after all), then with `moe` the MoE of LAYERS (24) of
  # Qwen3-30B-A3B's layers in Q4_K_M (MOE-END).
  local c=": > /tmp/mk.log"
  [ -n "$1" ] && c="$c; python3 bench/cuda/make_model.py llama8b $W/l8b >> /tmp/mk.log 2>&1 && for q in $1; do \
/usr/bin/time -v /tmp/bin/hf2q convert $W/l8b -o $W/l8b.\$q.gguf --quant \$q >> /tmp/mk.log 2>&1; echo \$q-END >> /tmp/mk.log; done; \
rm -rf $W/l8b; echo MAKE-END >> /tmp/mk.log"
  [ "${2:-}" = moe ] && c="$c; python3 bench/cuda/make_model.py qwen3moe30b /dev/shm/moe ${3:-24} >> /tmp/mk.log 2>&1 && \
/usr/bin/time -v /tmp/bin/hf2q convert /dev/shm/moe -o $W/moe.q4_k_m.gguf --quant q4_k_m >> /tmp/mk.log 2>&1; rm -rf /dev/shm/moe; echo MOE-END >> /tmp/mk.log"
  setsid nohup bash -c "$c" > /dev/null 2>&1 &
}
wait_for() {  # wait_for MARK [CAP]: until MARK is in /tmp/mk.log (at most 5 minutes, or until the call's CAP-th second)
  local cap=${2:-} n=100
  [ -n "$cap" ] && n=1000
  for i in $(seq 1 $n); do grep -q "$1" /tmp/mk.log && break; [ -n "$cap" ] && [ $SECONDS -gt $cap ] && break; sleep 3; done
}
moe_made() {  # moe_made CAP FILE: wait_for MOE-END until the call's CAP-th second; the make's lines to make.txt, the time to FILE
  wait_for MOE-END $1
  grep -E "make_model|Elapsed|Maximum resident|END|rror" /tmp/mk.log > $OUT/make.txt
  echo "model made by $SECONDS s" | tee -a $OUT/$2
}
op_tests() {  # op_tests [FILTER ...]: the CUDA op tests (all, or those matching), failures shown
  # (not the NVRTC compile check, which the CPU machine runs: on a GPU machine it took past 200 s)
  timeout 300 /tmp/bin/engine-tests --test-threads=1 --skip kernels_compile "${@:-cuda}" 2>&1 | tee $OUT/engine-tests.txt | grep -E "^test |test result|panicked" -A2 | grep -v " ok$"
}
fixtures() {  # fixtures DIR NAME: the engine fixtures in DIR on CUDA, to NAME.txt
  HF2Q_FIXTURES=$1 timeout 200 /tmp/bin/engine_tiny --nocapture fixtures_on_cuda 2>&1 | tee $OUT/$2.txt | grep -E "NOT RUN|test result|panicked|q8_0|over" | head -60
}
chosen() {
  # chosen [FILE VARIANT ...]: the launch-saving variants that measured faster than the defaults
  # (X=1) in an A/B (FILE; by default s9b's, /tmp/ab-s9b.txt, and its four variants), as ENV=V
  # words: a variant is chosen when its median tg128 alone beats the defaults' by more than 0.3 %
  # (about twice tgp's spread) on every file it was measured on.
  local f=${1:-/tmp/ab-s9b.txt}
  [ $# -gt 0 ] && shift
  python3 - $f "${@:-HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_ADD_FUSE=1 HF2Q_CUDA_ROUTE_FUSE=1 HF2Q_CUDA_GLU_FUSE=1}" <<'PY'
import re, sys, statistics
ts = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (.*?) plain .*tg128 \| ([0-9.]+)", line)
    if m: ts.setdefault((m.group(1), m.group(2)), []).append(float(m.group(3)))
out = []
for v in " ".join(sys.argv[2:]).split():
    r = [statistics.median(x) / statistics.median(ts[(t, "X=1")]) for (t, s), x in ts.items() if s == v and (t, "X=1") in ts]
    print(v, ["%.4f" % q for q in r], file=sys.stderr)
    if r and min(r) > 1.003: out.append(v)
print(" ".join(out) or "X=1")
PY
}
greedy_ab() {  # greedy_ab FILE ENV=V ...: the md5 of 48 greedy tokens under each setting
  local m=$1; shift
  for e in "$@"; do
    echo "$e $(env $e timeout 60 $H generate -m $m --device cuda -p "The capital of France is" -n 48 --temp 0 --spec off 2> /dev/null | md5sum)" | tee -a $OUT/greedy-ab.txt
  done
}
old_bin() {  # the binary before, carried as .dev/hf2q-old.xz, to /tmp/bin/hf2q-old (a visible line where it was not carried)
  if [ -f $D/hf2q-old.xz ]; then
    xz -dc $D/hf2q-old.xz > /tmp/bin/hf2q-old && chmod +x /tmp/bin/hf2q-old
  else
    rm -f /tmp/bin/hf2q-old
    echo "NOT RUN: the binary before (no .dev/hf2q-old.xz carried); only HEAD is measured" | tee -a $OUT/ab.txt
  fi
}
old_new() {  # old_new TAG FILE SETTING ...: tg128 (tgp) of the binary before (TAG-old), then HEAD's under each setting (TAG-new)
  local tag=$1 m=$2; shift 2
  [ -x /tmp/bin/hf2q-old ] && { H=/tmp/bin/hf2q-old; tgp $tag-old $m X=1; }
  H=/tmp/bin/hf2q; for c in "$@"; do tgp $tag-new $m $c; done
}
old_new_greedy() {  # old_new_greedy FILE SETTING ...: the greedy tokens of the binary before (OLD=1), then HEAD's under each setting
  local m=$1; shift
  [ -x /tmp/bin/hf2q-old ] && { H=/tmp/bin/hf2q-old; greedy_ab $m OLD=1; }
  H=/tmp/bin/hf2q; greedy_ab $m "$@"
}
cut_ab() {  # cut_ab "TESTS" SETTING ...: on a fresh machine, the 8-layer cut of the MoE made while the
  # op tests matching TESTS run; then tg128 under each setting (X=1: the defaults; a quoted setting
  # may hold several ENV=V), alternating, three rounds, and the greedy tokens (ab.txt, greedy-ab.txt)
  local tests=$1; shift
  unpack
  machine_info
  bg_make "" moe 8
  op_tests $tests
  local m=$W/moe.q4_k_m.gguf
  moe_made 200 ab.txt
  if [ -f $m ]; then
    for i in 1 2 3; do for c in "$@"; do tgp moe8 $m $c; done; done
    greedy_ab $m "$@"
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt make.txt
}
moe48_start() {  # moe48_start CAP: a fresh machine's start for the whole 48-layer MoE (s49, s49h):
  # llama-bench's build and the model in the background, doctor (the kernels into the cache), the
  # model waited for until the CAP-th second (m: its path), copy bandwidth
  unpack
  machine_info
  bg_llama_bench
  bg_make "" moe 48
  timeout 200 $H doctor > $OUT/doctor.txt 2>&1
  m=$W/moe.q4_k_m.gguf
  moe_made $1 bench-summary.txt
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
}
llama_by() {  # llama_by SECOND: wait for llama.cpp's build until then; its last lines to make.txt
  for i in $(seq 1 200); do grep -q BUILD-END /tmp/lc.log && break; [ $SECONDS -gt $1 ] && break; sleep 3; done
  tail -n 2 /tmp/lc.log >> $OUT/make.txt
}
fresh_start() {
  # fresh_start [BUILD]: a fresh machine's first call: the carried binaries; llama-bench (BUILD:
  # bg_llama_bench, or bg_llama for the server too) and the models in the background (8B Q4_K_M,
  # Q8_0, BF16, then the 24-layer MoE); copy bandwidth; the op tests; fixtures on CUDA.
  unpack
  machine_info
  ${1:-bg_llama_bench}
  bg_make "q4_k_m q8_0 bf16" moe
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests
  fixtures $D/fixtures engine-tiny
  tail -n 1 /tmp/lc.log; grep -E "make_model|Elapsed|END" /tmp/mk.log
}
decode_greedy_cuda() {  # fed greedy decoding on CUDA against step-by-step (engine_tiny's test)
  HF2Q_FIXTURES=$D/fixtures timeout 200 /tmp/bin/engine_tiny --nocapture decode_greedy_on_cuda 2>&1 | tee $OUT/decode-greedy.txt | grep -E "test result|panicked|NOT RUN"
}
fresh_bf16() {
  # fresh_bf16 [FILTER ...]: a fresh machine's first call: the carried binaries; llama-bench (or
  # LC_BUILD=bg_llama: with llama-server and llama-batched-bench) and the
  # models in the background (8B BF16 first, then Q4_K_M, Q8_0, then the 24-layer MoE); copy
  # bandwidth; the op tests (those matching); fixtures; decode_greedy on CUDA.
  unpack
  machine_info
  ${LC_BUILD:-bg_llama_bench}
  bg_make "bf16 q4_k_m q8_0" moe
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests "$@"
  fixtures $D/fixtures engine-tiny
  decode_greedy_cuda
}
ab_bf16() {
  # ab_bf16 COPY ENV=V ...: tg128 on the 8B BF16 under each setting (X=1: the defaults),
  # alternating, twice (tgp, ab.txt); ab.txt copied to COPY for a later call's best_of.
  local copy=$1; shift
  wait_for bf16-END
  for i in 1 2; do for c in "$@"; do tgp bf16 $W/l8b.bf16.gguf $c; done; done
  cp $OUT/ab.txt $copy
}
bench_four() {
  # Both tools on the 8B BF16, Q4_K_M, Q8_0 and the MoE (bench_pair), once built.
  wait_builds
  for q in bf16 q4_k_m q8_0; do bench_pair $q $W/l8b.$q.gguf; done
  wait_for MOE-END
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt
  bench_pair moe $W/moe.q4_k_m.gguf
}
pack() {
  # pack KEEP...: every file under $OUT into $OUT/logs.tgz, and only it and the KEEP files left
  # there (a call brings back 8 files at most).
  (cd $OUT && tar czf /tmp/logs.tgz . && find . -type f $(printf ' ! -name %s' "$@") -delete && mv /tmp/logs.tgz .)
}
best_of() {
  # best_of TAG FILE NONE CANDIDATE...: an `export` of the candidate (the ENV=V words of `tg`'s or
  # `tgp`'s lines for TAG in FILE) with the highest median tg128 tokens/s; NONE stands for X=1, the
  # defaults.
  python3 - "$@" <<'PY'
import re, sys, statistics
tag, path, none, cands = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ts = {}
for line in open(path):
    m = re.match(re.escape(tag) + r" (.*?) (?:plain )?\|.*tg128 \| ([0-9.]+)", line)
    if m: ts.setdefault(m.group(1), []).append(float(m.group(2)))
best = max(cands, key=lambda k: statistics.median(ts.get(k, [0])))
print("export " + (none if best == "X=1" else best))
PY
}
ab() {
  # ab TAG FILE SETTING ...: tg128 of FILE under each setting (X=1: the defaults; a quoted setting
  # may hold several ENV=V), alternating, twice (tgp, ab.txt).
  local tag=$1 m=$2; shift 2
  for i in 1 2; do for c in "$@"; do tgp $tag $m $c; done; done
}
twice() {
  # twice TAG FILE NAME ...: tg128 (tgp) with every launch of kernel NAME recorded twice
  # (HF2Q_CUDA_TWICE), one NAME after another, the defaults (X=1) first and last: a step's time
  # with a kernel doubled, less the defaults', is what that kernel costs where launches overlap.
  local tag=$1 m=$2; shift 2
  tgp $tag $m X=1
  for k in "$@"; do tgp $tag $m HF2Q_CUDA_TWICE=$k; done
  tgp $tag $m X=1
}
moe_start() {
  # A fresh machine's MoE phase: the carried binaries, llama-bench and the 24-layer MoE in the
  # background.
  unpack
  machine_info
  bg_llama_bench
  bg_make "" moe
}
moe_ready() {
  # moe_start, the moe op test, then waits for the model (m: its path; make.txt).
  moe_start
  op_tests cuda::moe
  m=$W/moe.q4_k_m.gguf
  wait_for MOE-END
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt
}
moe_close() {
  # moe_close LIMIT: waits for llama-bench's build until LIMIT seconds, then both tools on the MoE
  # (bench_pair) if before LIMIT + 10, and packs the phase's files.
  for i in $(seq 1 200); do grep -q BUILD-END /tmp/lc.log && break; [ $SECONDS -gt $1 ] && break; sleep 3; done
  tail -n 2 /tmp/lc.log >> $OUT/make.txt
  [ $SECONDS -lt $(($1 + 10)) ] && bench_pair moe $m
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt greedy-ab.txt ab.txt engine-tests.txt copy-bandwidth.txt
}
moe_both() {
  # moe_both LIMIT: the greedy tokens, copy bandwidth, then moe_close LIMIT (both tools on the MoE).
  greedy_ab $m X=1
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  moe_close $1
}
fresh_moe() {
  # fresh_moe [FILTER ...]: moe_start, copy bandwidth, the op tests (op_tests).
  moe_start
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests "$@"
}
case $phase in
s9a)
  # Written 2026-12-04, ninth session, which had no device time left (carrying .dev: the build with
  # the four launch-saving variants, off by default: HF2Q_CUDA_ATTN_MERGE, _ROUTE_FUSE, _GLU_FUSE,
  # _ADD_FUSE=1; llama-src.tgz; fixtures): fresh_bf16 with every op test (they turn the variants
  # on themselves, and top_rows), then the fixtures and decode_greedy with all four on; llama-server
  # built too (s9d).
  LC_BUILD=bg_llama fresh_bf16
  export HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_ROUTE_FUSE=1 HF2Q_CUDA_GLU_FUSE=1 HF2Q_CUDA_ADD_FUSE=1
  fixtures $D/fixtures engine-tiny-fused
  HF2Q_FIXTURES=$D/fixtures timeout 200 /tmp/bin/engine_tiny --nocapture decode_greedy_on_cuda 2>&1 | tee $OUT/decode-greedy-fused.txt | grep -E "test result|panicked|NOT RUN"
  tail -n 1 /tmp/lc.log; grep -E "make_model|Elapsed|END" /tmp/mk.log
  ;;
s9b)
  # Each variant on against the defaults (X=1: all off), alone and all four, on the 8B BF16, the
  # 8B Q4_K_M and the MoE; greedy tokens the same with and without; per-kernel launches.
  # (Carrying .dev1/stashA, SmolLM2's first half, for s11.)
  stash
  all_on="HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_ADD_FUSE=1 HF2Q_CUDA_ROUTE_FUSE=1 HF2Q_CUDA_GLU_FUSE=1"
  wait_for bf16-END
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_ADD_FUSE=1 "$all_on"
  greedy_ab $W/l8b.bf16.gguf X=1 "$all_on"
  wait_for q4_k_m-END
  ab q4_k_m $W/l8b.q4_k_m.gguf X=1 HF2Q_CUDA_ATTN_MERGE=1
  wait_for MOE-END
  m=$W/moe.q4_k_m.gguf
  ab moe $m X=1 HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_ROUTE_FUSE=1 HF2Q_CUDA_GLU_FUSE=1 "$all_on"
  greedy_ab $m X=1 "$all_on"
  (export $all_on; prof moe-fused 4 bench -m $m --device cuda -p 0 -n 16 -r 1)
  prof moe 4 bench -m $m --device cuda -p 0 -n 16 -r 1
  cp $OUT/ab.txt /tmp/ab-s9b.txt
  echo "chosen: $(chosen)" | tee $OUT/chosen.txt
  ;;
s9d)
  # Serving on the 8B Q4_K_M at 16 and 64 streams, greedy (ENV=V arguments after the phase
  # exported first, or `auto`: the variants that measured faster in s9b). Sampled serving: s10.
  shift
  [ "${1:-}" = auto ] && set -- $(chosen)
  for e in "$@"; do export "$e"; done
  wait_builds
  for n in 16 64; do serve_pair $n; done
  ;;
s10)
  # Written 2026-12-05 (tenth session, no device time): sampling drawn on the GPU
  # (HF2Q_CUDA_SAMPLE=1, kernels/sample.cu; off by default until run). Its op test, then serving
  # sampled streams with the OpenAI defaults (temperature 1, no top-k / top-p / min-p cut: the
  # whole vocabulary) and with top_k 40, drawn on the GPU and on the host, against llama-server;
  # generate's tokens the same either way (seeded).
  op_tests sample_rows
  wait_builds
  export SERVE_TEMP=1
  for n in 16 64; do SERVE_TOPK=0 serve_pair $n; HF2Q_CUDA_SAMPLE=1 SKIP_LLAMA=1 SERVE_TOPK=0 serve_pair $n; done
  # top_k 40 at 64 streams: the rows read, the top read (HF2Q_CUDA_TOPK), the token drawn there.
  export SERVE_TOPK=40
  serve_pair 64
  HF2Q_CUDA_TOPK=1 SKIP_LLAMA=1 serve_pair 64
  HF2Q_CUDA_SAMPLE=1 SKIP_LLAMA=1 serve_pair 64
  for e in X=1 HF2Q_CUDA_SAMPLE=1; do
    echo "$e $(env $e timeout 60 $H generate -m $W/l8b.q4_k_m.gguf --device cuda -p "The capital of France is" -n 48 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed 5 --spec off 2> /dev/null | md5sum)" | tee -a $OUT/greedy-ab.txt
  done
  ;;
s9c)
  # Both tools on the four files; ENV=V arguments after the phase are exported first (the
  # variants that measured faster in s9b; `auto`: chosen from s9b's ab.txt).
  shift
  # (Carrying .dev2/stashB, SmolLM2's second half, for s11.)
  stash
  [ "${1:-}" = auto ] && set -- $(chosen)
  for e in "$@"; do export "$e"; done
  env | grep HF2Q_ | tee $OUT/chosen.txt
  bench_four
  ;;
s11)
  # Written 2026-12-05 (eleventh session, no device time). SmolLM2 (its halves carried by s9b and
  # s9c, in /tmp/stash): greedy chat goldens on CUDA against the CPU with logit margins where they
  # part, for hf2q and then for llama.cpp itself (llama-server -fa on, -ngl 99 against -ngl 0: how
  # far the peer's own CUDA parts from its CPU on the same replies); perplexity on both backends.
  stash
  smol_models
  timeout 150 python3 bench/cuda/golden_margins.py $H $M 2>&1 | tee $OUT/smollm2-goldens.txt | tail -n 12
  wait_builds
  GM_SERVER=llama timeout 150 python3 bench/cuda/golden_margins.py /tmp/lc/b/bin/llama-server $M 2>&1 | tee $OUT/smollm2-goldens-llama.txt | tail -n 12
  smol_ppl 60
  ;;
s15)
  # Written 2026-12-05 (thirteenth session): the first call of the next H200 chain (carry .dev: the
  # build with three more MoE variants, off by default, that save a launch a layer without a last
  # block: HF2Q_CUDA_GLU_DOWN=1, the down products make their pair's GLU in every block, no
  # glu_q8; HF2Q_CUDA_SUM_NORM=1, the MoE combine made by the next residual add and norm, no
  # weighted_sum_rows; HF2Q_CUDA_ROUTE_IN=1, the gate / up and down products' blocks route their
  # pairs themselves, no moe_route). A fresh machine, every op test (the moe one runs both variants against
  # the launches they replace, bit for bit), the fixtures and decode_greedy with the defaults,
  # then with both on; llama.cpp with its server and the models in the background.
  LC_BUILD=bg_llama fresh_bf16
  export HF2Q_CUDA_ROUTE_IN=1 HF2Q_CUDA_SUM_NORM=1
  fixtures $D/fixtures engine-tiny-moe-variants
  HF2Q_FIXTURES=$D/fixtures timeout 200 /tmp/bin/engine_tiny --nocapture decode_greedy_on_cuda 2>&1 | tee $OUT/decode-greedy-variants.txt | grep -E "test result|panicked|NOT RUN"
  tail -n 1 /tmp/lc.log; grep -E "make_model|Elapsed|END" /tmp/mk.log
  ;;
s13)
  # After s15: the MoE's two new variants and the router's product at up to four warps a row
  # (HF2Q_CUDA_WPR=4) against the defaults, tg128, alternating; the greedy tokens under each;
  # then what each of the MoE step's kernels costs with launches overlapping (`twice`; names as
  # the profile of bench/runs/2026-12-05-h100 call 2 prints them).
  wait_for MOE-END
  m=$W/moe.q4_k_m.gguf
  both="HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1"
  all3="HF2Q_CUDA_ROUTE_IN=1 HF2Q_CUDA_SUM_NORM=1"
  ab moe $m X=1 HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1 HF2Q_CUDA_ROUTE_IN=1 "$both" "$all3" HF2Q_CUDA_WPR=4
  greedy_ab $m X=1 "$both" "$all3" HF2Q_CUDA_WPR=4
  cp $OUT/ab.txt /tmp/ab-s13.txt
  twice moe $m moe_route add_rms_norm_q8 attn_dec_f16 mmq_moe_v_TY_Q4_K mmq_moe_v_TY_Q6_K mmq_v5_TY_Q4_K \
    mmq_v_TY_Q6_K rope_store_kv mmv_TY_F32_1 attn_combine_q8 glu_q8 weighted_sum_rows
  ;;
s14)
  # After s13: what each of the 8B BF16 step's kernels costs with launches overlapping (`twice`);
  # sampled serving with the GPU's draws (the default) against llama-server at 16 and 64 streams
  # and with top_k 40; both tools on the four files with the MoE variants that measured faster
  # in s13 (`chosen`).
  wait_for bf16-END
  twice bf16 $W/l8b.bf16.gguf mmv_TY_BF16g_1 mmv_TY_BF16_1 mmv_TY_BF163_1 binary attn_dec_f16 add_rms_norm_q8 \
    attn_combine_q8 rope_store_kv
  wait_builds
  export SERVE_TEMP=1
  for n in 16 64; do SERVE_TOPK=0 serve_pair $n; done
  SERVE_TOPK=40 serve_pair 64
  unset SERVE_TEMP
  for e in X=1 HF2Q_CUDA_SAMPLE=0; do
    echo "$e $(env $e timeout 60 $H generate -m $W/l8b.q4_k_m.gguf --device cuda -p "The capital of France is" -n 48 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed 5 --spec off 2> /dev/null | md5sum)" | tee -a $OUT/greedy-ab.txt
  done
  # The fastest of the MoE settings by median (all give the same bits: the moe op test).
  c=$(best_of moe /tmp/ab-s13.txt X=1 X=1 HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1 HF2Q_CUDA_ROUTE_IN=1 \
    "HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1" "HF2Q_CUDA_ROUTE_IN=1 HF2Q_CUDA_SUM_NORM=1")
  echo "chosen: $c" | tee $OUT/chosen.txt
  eval "$c"
  bench_four
  ;;
s16)
  # s14 without the serving (measured on an H100 on 2026-12-05): the BF16 kernels' costs with
  # launches overlapping, then both tools on the four files with the fastest MoE setting of s13.
  wait_for bf16-END
  twice bf16 $W/l8b.bf16.gguf mmv_TY_BF16g_1 mmv_TY_BF16_1 mmv_TY_BF163_1 binary attn_dec_f16 add_rms_norm_q8 \
    attn_combine_q8 rope_store_kv
  c=$(best_of moe /tmp/ab-s13.txt X=1 X=1 HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1 HF2Q_CUDA_ROUTE_IN=1 \
    "HF2Q_CUDA_GLU_DOWN=1 HF2Q_CUDA_SUM_NORM=1" "HF2Q_CUDA_ROUTE_IN=1 HF2Q_CUDA_SUM_NORM=1")
  echo "chosen: $c" | tee $OUT/chosen.txt
  eval "$c"
  bench_four
  ;;
s19)
  # Written 2026-12-05 (fourteenth session): the first call of a chain (carry .dev: the build whose
  # moe_route routes a row with a block, the max / sum / top-k as trees and ranks, instead of one
  # warp's serial sum and k rounds of argmax; HF2Q_CUDA_ROUTE_WARP=1 the warp's, to compare). A
  # fresh machine, every op test (`routing` checks the block's against the warp's bit for bit, and
  # both against the CPU's), the fixtures, decode_greedy; then the MoE tg128 with the block's, the
  # warp's, and the block's routing done by the router's last block (HF2Q_CUDA_ROUTE_FUSE=1).
  fresh_bf16
  wait_for MOE-END
  m=$W/moe.q4_k_m.gguf
  ab moe $m X=1 HF2Q_CUDA_ROUTE_WARP=1 HF2Q_CUDA_ROUTE_FUSE=1
  greedy_ab $m X=1 HF2Q_CUDA_ROUTE_WARP=1 HF2Q_CUDA_ROUTE_FUSE=1
  cp $OUT/ab.txt /tmp/ab-s19.txt
  ;;
s20)
  # After s19: the routing's cost with launches overlapping (block and warp), then both tools on the
  # four files with the faster of the defaults and HF2Q_CUDA_ROUTE_FUSE=1.
  m=$W/moe.q4_k_m.gguf
  twice moe $m moe_route mmv_TY_F32_1
  HF2Q_CUDA_ROUTE_WARP=1 tgp moe $m HF2Q_CUDA_TWICE=moe_route_w
  c=$(best_of moe /tmp/ab-s19.txt X=1 X=1 HF2Q_CUDA_ROUTE_FUSE=1)
  echo "chosen: $c" | tee $OUT/chosen.txt
  eval "$c"
  bench_four
  ;;
s21)
  # Written 2026-12-05 (fourteenth session), the first call of its second chain (carry .dev: the
  # build whose decode attention can do rope_store_kv's norms, rope and KV store itself,
  # HF2Q_CUDA_ROPE_ATTN=1, and whose MoE products route their pairs with the block's routing,
  # HF2Q_CUDA_ROUTE_IN=1; both off by default). A fresh machine, every op test (rope_store_kv and
  # moe run both variants against the launches they replace, bit for bit; routing), fixtures and
  # decode_greedy with the defaults and with both on; then the MoE tg128 under each.
  fresh_bf16
  export HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1
  fixtures $D/fixtures engine-tiny-variants
  HF2Q_FIXTURES=$D/fixtures timeout 200 /tmp/bin/engine_tiny --nocapture decode_greedy_on_cuda 2>&1 | tee $OUT/decode-greedy-variants.txt | grep -E "test result|panicked|NOT RUN"
  unset HF2Q_CUDA_ROPE_ATTN HF2Q_CUDA_ROUTE_IN
  wait_for MOE-END
  m=$W/moe.q4_k_m.gguf
  both="HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1"
  ab moe $m X=1 HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1 "$both"
  greedy_ab $m X=1 HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1 "$both"
  cp $OUT/ab.txt /tmp/ab-s21.txt
  ;;
s22)
  # After s21: HF2Q_CUDA_ROPE_ATTN=1 against the defaults on the 8B Q4_K_M and BF16 (tg128,
  # alternating) with their greedy tokens; then both tools on the four files, each 8B file with the
  # faster setting on the Q4_K_M and the MoE with the fastest of s21.
  ab q4_k_m $W/l8b.q4_k_m.gguf X=1 HF2Q_CUDA_ROPE_ATTN=1
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_ROPE_ATTN=1
  greedy_ab $W/l8b.q4_k_m.gguf X=1 HF2Q_CUDA_ROPE_ATTN=1
  dense=$(best_of q4_k_m $OUT/ab.txt X=1 X=1 HF2Q_CUDA_ROPE_ATTN=1)
  moe=$(best_of moe /tmp/ab-s21.txt X=1 X=1 HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1 "HF2Q_CUDA_ROPE_ATTN=1 HF2Q_CUDA_ROUTE_IN=1")
  echo "chosen: 8B: $dense; MoE: $moe" | tee $OUT/chosen.txt
  wait_builds
  for q in bf16 q4_k_m q8_0; do (eval "$dense"; bench_pair $q $W/l8b.$q.gguf); done
  (eval "$moe"; bench_pair moe $W/moe.q4_k_m.gguf)
  ;;
s25)
  # With ~320 s of device time left and no H200 to be had: the relative A/Bs alone, on whatever card
  # comes (no llama.cpp): the L2 prefetch on the 8B BF16 as soon as it is made, then the MoE's
  # router at four warps a row against one (HF2Q_CUDA_WPR_SMALL=1) and the prefetch. (Run on an H100
  # with 7b11b23, bench/runs/2026-12-05-h100-d; the prefetch, slower, was taken out after it: on
  # later builds HF2Q_CUDA_PREFETCH_MB does nothing.)
  unpack
  machine_info
  bg_make bf16 moe
  wait_for bf16-END
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_PREFETCH_MB=16 HF2Q_CUDA_PREFETCH_MB=32
  wait_for MOE-END
  ab moe $W/moe.q4_k_m.gguf X=1 HF2Q_CUDA_WPR_SMALL=1 HF2Q_CUDA_PREFETCH_MB=16
  ;;
s26)
  # For the next session with device time (carry .dev, a fresh H200): the Done-when figures of
  # HEAD's defaults (RopeAttn, the router's four warps, the float products' warp per pair of
  # rows). Every op test, the fixtures and decode_greedy on CUDA, then both tools on the four
  # files, then the MoE's greedy tokens, and the 8B BF16 with a warp per row against the pairs.
  fresh_bf16
  bench_four
  greedy_ab $W/moe.q4_k_m.gguf X=1 HF2Q_CUDA_WPR_SMALL=1
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=0
  greedy_ab $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=0
  pack bench-summary.txt greedy-ab.txt copy-bandwidth.txt ab.txt
  ;;
s27)
  # The float weights' and activations' loads in the matrix-vector kernels (HF2Q_CUDA_DEFINE
  # MMV_LDW / MMV_LDA, kernels/matmul.cu) on the 8B BF16, relative, on whatever card comes (carry
  # .dev): every op test first (HEAD's kernels), each variant's module compiled by `doctor` beside
  # the model's making, then the A/B. (Run on an H100: bench/runs/2026-12-05-h100-e call 1; every
  # variant was slower and was taken out after it: on later builds these defines do nothing.)
  unpack
  machine_info
  bg_make bf16
  v="HF2Q_CUDA_DEFINE=MMV_LDW=1 HF2Q_CUDA_DEFINE=MMV_LDW=2 HF2Q_CUDA_DEFINE=MMV_LDW=3 HF2Q_CUDA_DEFINE=MMV_LDA=1 HF2Q_CUDA_DEFINE=MMV_LDA=2 HF2Q_CUDA_DEFINE=MMV_LDW=1,MMV_LDA=1"
  for e in $v; do env $e timeout 200 $H doctor > /dev/null 2>&1 & done
  op_tests
  wait
  wait_for bf16-END
  ab bf16 $W/l8b.bf16.gguf X=1 $v
  greedy_ab $W/l8b.bf16.gguf X=1 $v
  ;;
s28)
  # A warp per pair of rows in the float weights' plain products (HF2Q_CUDA_MMV_PAIR=1) on the 8B
  # BF16, relative, on whatever card comes (carry .dev): every op test first, then the A/B and the
  # greedy tokens. (Run on an H100: bench/runs/2026-12-05-h100-e call 2, 1.016×; the pairs are on by
  # default since, and HF2Q_CUDA_MMV_PAIR=0 turns them off.)
  unpack
  machine_info
  bg_make bf16
  op_tests
  wait_for bf16-END
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=1
  greedy_ab $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=1
  ;;
s30)
  # One H200 call with the session's last ~520 s of device time (carry .dev; a fresh machine): every
  # op test; on the 8B BF16 the fused FFN input's pairs (HF2Q_CUDA_MMV_PAIR=2) against the default
  # (1); on the MoE one-row Q4_K + Q6_K launches (the default) against a launch per type
  # (HF2Q_CUDA_MMQ_MIX=0); both tools on the MoE with the defaults; greedy tokens. Each later step
  # runs only while the call has time left (logs packed by ~400 s). (Asked for an H200, ran on an
  # H100: bench/runs/2026-12-05-h100-e call 3. The fused FFN input's pairs were no faster and were
  # taken out: on later builds HF2Q_CUDA_MMV_PAIR=2 means 1, the default.)
  unpack
  machine_info
  bg_llama_bench
  bg_make bf16 moe
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests
  wait_for bf16-END
  ab bf16 $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=2
  wait_for MOE-END
  ab moe $W/moe.q4_k_m.gguf X=1 HF2Q_CUDA_MMQ_MIX=0
  for i in $(seq 1 60); do grep -q BUILD-END /tmp/lc.log && break; [ $SECONDS -gt 360 ] && break; sleep 3; done
  [ $SECONDS -lt 360 ] && bench_pair moe $W/moe.q4_k_m.gguf
  [ $SECONDS -lt 375 ] && greedy_ab $W/moe.q4_k_m.gguf X=1 HF2Q_CUDA_MMQ_MIX=0
  [ $SECONDS -lt 385 ] && greedy_ab $W/l8b.bf16.gguf X=1 HF2Q_CUDA_MMV_PAIR=2
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt; tail -n 2 /tmp/lc.log >> $OUT/make.txt
  pack bench-summary.txt greedy-ab.txt ab.txt engine-tests.txt
  ;;
s31)
  # For the next session with device time (carry .dev at HEAD, a fresh H200): the MoE's Done-when
  # figure with HEAD's defaults (the Q4_K + Q6_K launches among them) and where its step goes now.
  # Every op test; the Q4_K + Q6_K launches against a launch per type; each kernel's cost with
  # launches overlapping (HF2Q_CUDA_TWICE); both tools on the MoE; greedy tokens.
  fresh_moe
  wait_for MOE-END
  m=$W/moe.q4_k_m.gguf
  ab moe $m X=1 HF2Q_CUDA_MMQ_MIX=0
  twice moe $m attn_dec_f16_rope attn_combine_q8 mmq_vx5_TY_Q4_K_TY_Q6_K mmq_v5_TY_Q4_K add_ws_rms_norm_q8 \
    add_rms_norm_q8 mmv_TY_F32_1 moe_route mmq_moe_v_TY_Q4_K glu_q8 mmq_moe_v_TY_Q6_K
  for i in $(seq 1 100); do grep -q BUILD-END /tmp/lc.log && break; sleep 3; done
  bench_pair moe $m
  greedy_ab $m X=1 HF2Q_CUDA_MMQ_MIX=0
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt; tail -n 2 /tmp/lc.log >> $OUT/make.txt
  pack bench-summary.txt greedy-ab.txt ab.txt engine-tests.txt
  ;;
s32 | s33)
  # Written 2026-12-05 (seventeenth session) for the MoE's FFN norm, router product and routing in
  # one launch (norm_route_*, a cluster of eight blocks a row; HF2Q_CUDA_NORM_ROUTE=1, and
  # HF2Q_CUDA_DEFINE=NR_L2). s32 ran 2026-12-06 on an H200 (bench/runs/2026-12-06-h200, call 1):
  # its op test passed and the greedy tokens were the same, but MoE tg128 was 0.960× (NR_L2 0.935×)
  # the three launches'; the variant was taken out. s33 was its cut-down form.
  echo "phase $phase: its variant was taken out (see the comment)" | tee $OUT/phase.txt
  ;;
s34 | s35)
  # Written 2026-12-06 (eighteenth session; carry .dev at the build without norm_route, a fresh
  # machine): the MoE op tests (the moe test's counts failed in s32 after norm_route's steps were
  # added; those steps are gone), then the existing knobs swept on the 24-layer MoE on this card
  # (each was tuned on an H100 or on the 8B): the router's warps a row (WPR_SMALL 8), the five-row
  # integer kernels' block line (MMQ_V5 0 and 2000), the routing by a warp a row (ROUTE_WARP), the
  # GLU in gate / up's launch (GLU_FUSE); alternating, twice; greedy tokens of the fastest against
  # the defaults. s34 (~370 s): then both tools on the MoE with the fastest. s35 (~280 s; a machine
  # was taken back mid-call in s34's first try): no llama.cpp figure, the sweep cut at 255 s.
  fresh_moe cuda::moe routing
  m=$W/moe.q4_k_m.gguf
  wait_for MOE-END
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt
  lim=$([ $phase = s34 ] && echo 300 || echo 255)
  set -- HF2Q_CUDA_WPR_SMALL=8 HF2Q_CUDA_MMQ_V5=0 HF2Q_CUDA_MMQ_V5=2000 HF2Q_CUDA_ROUTE_WARP=1 HF2Q_CUDA_GLU_FUSE=1
  for i in 1 2; do for c in X=1 "$@"; do [ $SECONDS -lt $lim ] && tgp moe $m $c; done; done
  pick=$(best_of moe $OUT/ab.txt X=1 X=1 "$@")
  echo "$pick ($phase: seconds $SECONDS)" | tee -a $OUT/bench-summary.txt
  [ $SECONDS -lt $((lim + 10)) ] && greedy_ab $m X=1 "${pick#export }"
  if [ $phase = s34 ]; then
    eval "$pick"
    for i in $(seq 1 60); do grep -q BUILD-END /tmp/lc.log && break; [ $SECONDS -gt 330 ] && break; sleep 3; done
    tail -n 2 /tmp/lc.log >> $OUT/make.txt
    [ $SECONDS -lt 340 ] && bench_pair moe $m
  fi
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt greedy-ab.txt ab.txt engine-tests.txt copy-bandwidth.txt
  ;;
s40 | s41)
  # Written 2026-12-06 (twentieth session; carry .dev made at HEAD, a fresh machine, ~420 s): the
  # MoE's one-row expert products through kernels with only the stages their warps' units need
  # and more blocks a multiprocessor (HF2Q_CUDA_MOE_LEAN=1: mmq_moe_v3_* for gate / up, 768
  # blocks, and mmq_moe_v2_* for down, 1,024 blocks, each launch resident at once on 132
  # multiprocessors instead of in two waves; the same sums, so the same bits). The moe op test,
  # the A/B (alternating, three rounds; S40_EXTRA: more settings), the greedy tokens, each MoE
  # kernel's cost with launches overlapping under the faster setting (HF2Q_CUDA_TWICE) while time
  # is left, then both tools on the MoE with the faster. (s40's build lacked the lean kernels in
  # kernel_names, so its lean runs panicked.) s41 also A/Bs the lean gate / up launched early,
  # reading the expert ids after waiting for the routing (HF2Q_CUDA_MOE_GATE_EARLY=1; taken out
  # after s41: 1.013x against the lean kernels' 1.020x). Since s42 the lean kernels are the
  # defaults (HF2Q_CUDA_MOE_LEAN=0 for the others).
  moe_ready
  set -- HF2Q_CUDA_MOE_LEAN=1 ${S40_EXTRA:-}
  [ $phase = s41 ] && set -- HF2Q_CUDA_MOE_LEAN=1 "HF2Q_CUDA_MOE_LEAN=1 HF2Q_CUDA_MOE_GATE_EARLY=1"
  for i in 1 2 3; do for c in X=1 "$@"; do tgp moe $m $c; done; done
  greedy_ab $m X=1 "$@"
  pick=$(best_of moe $OUT/ab.txt X=1 X=1 "$@")
  echo "$pick ($phase: seconds $SECONDS)" | tee -a $OUT/bench-summary.txt
  eval "$pick"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  # (s41: no kernel costs; the llama.cpp build took past 420 s on s40's H100.)
  [ $phase = s41 ] && LC_WAIT=470 || LC_WAIT=420
  [ $phase = s41 ] || for k in X=1 mmq_moe_v3_TY_Q4_K mmq_moe_v2_TY_Q4_K mmq_moe_v2_TY_Q6_K mmq_moe_v_TY_Q4_K mmq_moe_v_TY_Q6_K moe_route \
    attn_dec_f16_rope attn_combine_q8 glu_q8 mmv_TY_F32_1 add_ws_rms_norm_q8 add_rms_norm_q8 X=1; do
    [ $SECONDS -lt 330 ] || break
    if [ $k = X=1 ]; then tgp moe-twice $m X=1; else tgp moe-twice $m HF2Q_CUDA_TWICE=$k; fi
  done
  moe_close $LC_WAIT
  ;;
s36)
  # The session's last ~250 s of device time (2026-12-06; refused: too little left to start a
  # machine): the MoE op tests of the build without norm_route, then while time is left the knobs
  # of s34 on an 8-layer MoE (a relative figure); done by ~120 s.
  unpack
  bg_make "" moe 8
  timeout 90 /tmp/bin/engine-tests --test-threads=1 cuda::moe routing 2>&1 | tee $OUT/engine-tests.txt | grep -E "^test |test result|panicked"
  echo "op tests done at $SECONDS s" | tee -a $OUT/ab.txt
  for i in $(seq 1 20); do grep -q MOE-END /tmp/mk.log && break; [ $SECONDS -gt 100 ] && break; sleep 2; done
  m=$W/moe.q4_k_m.gguf
  for c in X=1 HF2Q_CUDA_WPR_SMALL=8 HF2Q_CUDA_MMQ_V5=0 HF2Q_CUDA_MMQ_V5=2000 HF2Q_CUDA_GLU_FUSE=1 X=1; do
    [ -f $m ] && [ $SECONDS -lt 112 ] && tgp moe8 $m $c
  done
  echo "s36 done at $SECONDS s" | tee -a $OUT/ab.txt
  cp /tmp/mk.log $OUT/make.txt
  ;;
s42)
  # Written 2026-12-06 (twentieth session; carry .dev made at HEAD, a fresh machine, ~330-450 s):
  # the lean expert products on by default (s41 on an H100: 1.020x, the same tokens; the early
  # gate / up 1.013x, taken out). The moe op test, the defaults against HF2Q_CUDA_MOE_LEAN=0
  # (alternating, two rounds), the greedy tokens of both, copy bandwidth, then both tools on the
  # MoE with the defaults (llama-bench waited for until 440 s).
  moe_ready
  for i in 1 2; do for c in X=1 HF2Q_CUDA_MOE_LEAN=0; do tgp moe $m $c; done; done
  greedy_ab $m X=1 HF2Q_CUDA_MOE_LEAN=0
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  moe_close 440
  ;;
s44a|s44b|s44c)
  # Written and run 2026-12-06 (twenty-first session; bench/runs/2026-12-06-h100 call 7): SmolLM2
  # (xz -9e in thirds, carried by the three calls) and its goldens on CUDA against the CPU with the
  # defaults and with attn_exact_f16 (the CPU's one-row attention bit for bit): 0 and 1 of 9 equal,
  # the exact attention 3.1x / 3.0x slower (SmolLM2 Q8_0 / the MoE); taken out (ccf3289, efacac0).
  echo "$phase: taken out (its kernel is gone)"
  ;;
s49)
  # Written 2026-12-06 (twenty-third session; rewritten in the twenty-fourth as the first of two
  # calls; carry .dev made at HEAD, timeout 600): both tools on the whole Qwen3-30B-A3B-shaped MoE,
  # its 48 layers, not the 24-layer cut. The cut was made on 2026-12-03, when the model's 61 GB of
  # bf16 went to the disk beside the 8B's files; it is now made in /dev/shm (128 GiB of memory), in
  # shards of at most 4 GB. In Q4_K_M it is ~17.5 GB on the disk. The make (~2x the cut's 63 s +
  # 2:21) runs beside llama-bench's build; no op test, to leave the cores to both. The kernels are
  # compiled into the cache while the model is made (`hf2q doctor`). hf2q bench runs as soon as the
  # model is there, llama-bench if its build ends by 560 s; what is left goes to s49b, the next
  # call on the same warm machine (issued at once: a machine is given back 30 s after a call).
  # On 2026-12-06 (bench/runs/2026-12-06-h100-e, an H100) the model was there at 308 s and both
  # tools done at 414 s, so s49 now also writes the tensors' types and runs round 2 when it can.
  moe48_start 520
  if grep -q MOE-END /tmp/mk.log && [ -f $m ]; then
    bench_hf2q moe $m
    greedy_ab $m X=1
    llama_by 560
    grep -q BUILD-END /tmp/lc.log && [ $SECONDS -lt 565 ] && bench_llama moe $m && touch /tmp/s49-llama-done
    bench_sum moe
    # Round 2 and the tensors' types took 16 s on the warm machine of 2026-12-06-h100-e (call 2):
    # done here when there is time, so that one call has it all and s49b is needed only when not.
    timeout 60 $H info --tensors $m > $OUT/moe-info.txt 2>&1
    python3 bench/cuda/active_bytes.py $OUT/moe-info.txt | tee -a $OUT/bench-summary.txt
    if [ -f /tmp/s49-llama-done ] && [ $SECONDS -lt 530 ]; then
      echo "round 2 at $SECONDS s" | tee -a $OUT/bench-summary.txt
      bench_pair moe2 $m && touch /tmp/s49-round2-done
    fi
  fi
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  head -20 $OUT/doctor.txt
  pack bench-summary.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s50)
  # Twenty-fourth session (2026-12-06; carry nothing, a fresh machine, ~150 s): s49's 48-layer MoE
  # made and written, nothing else. On an H100 (2026-12-06-h100-d) its save_pretrained took past the
  # 80 GB: the 57 GiB model plus its experts split on the GPU at once. make_model.py now writes the
  # same checkpoint a tensor at a time (save_split); this checks that it fits, and how long it takes.
  machine_info
  /usr/bin/time -v timeout 400 python3 bench/cuda/make_model.py qwen3moe30b /dev/shm/moe 48 > /tmp/mk50.log 2>&1
  grep -E "make_model|Elapsed|Maximum resident|rror" /tmp/mk50.log | tee $OUT/make.txt
  { ls /dev/shm/moe | head -3; ls /dev/shm/moe | wc -l; du -sh /dev/shm/moe; } | tee -a $OUT/make.txt
  python3 -c "
import json; d = json.load(open('/dev/shm/moe/model.safetensors.index.json'))
print(len(d['weight_map']), 'tensors,', d['metadata']['total_size'], 'bytes in', len(set(d['weight_map'].values())), 'shards')
" 2>&1 | tee -a $OUT/make.txt
  rm -rf /dev/shm/moe
  echo "$phase done at $SECONDS s" | tee -a $OUT/make.txt
  ;;
s51)
  # Written 2026-12-06 (twenty-fifth session; carry .dev made at HEAD, timeout 330, for the ~460 s
  # of device time left): the short-context attention's settings on an 8-layer cut of the MoE (its
  # layers are the whole model's; only the head's share of a step is larger). Attention and its
  # combine cost ~5 + 2.6 us a layer at tg128's contexts, and a layer has to lose ~4.5 us for 1.5x
  # on the whole model (bench/runs/2026-12-06-h100-e). Tried: the splits merged by the last block
  # (HF2Q_CUDA_ATTN_MERGE=1, now with the rope in the same launch), and longer splits
  # (HF2Q_CUDA_DEFINE=SPLIT_KEYS=32 / 64: fewer blocks, fewer partials to merge). Op tests first.
  # Ran 2026-12-06 on an H100 (bench/runs/2026-12-06-h100-e call 3, 75 s): op tests passed; every
  # setting slower (merge 0.870x, merge + 32 / 64 keys 0.881x / 0.833x, 32 keys 0.957x).
  unpack
  machine_info
  bg_make "" moe 8
  timeout 120 /tmp/bin/engine-tests --test-threads 1 cuda::rope_store_kv cuda::attention_merge cuda::attention 2>&1 | tail -n 12 > $OUT/engine-tests.txt
  HF2Q_CUDA_DEFINE=SPLIT_KEYS=64 timeout 120 /tmp/bin/engine-tests --test-threads 1 cuda::rope_store_kv cuda::attention_merge 2>&1 | tail -n 6 >> $OUT/engine-tests.txt
  cat $OUT/engine-tests.txt
  m=$W/moe.q4_k_m.gguf
  moe_made 240 ab.txt
  if [ -f $m ]; then
    ab moe8 $m X=1 HF2Q_CUDA_ATTN_MERGE=1 "HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=32" \
      "HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=64" HF2Q_CUDA_DEFINE=SPLIT_KEYS=32
    greedy_ab $m X=1 HF2Q_CUDA_ATTN_MERGE=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=32
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s52)
  # Written 2026-12-06 (twenty-fifth session; carry .dev made at df45f6d, timeout 240, for the 348 s
  # of device time left): s51 found 32-key splits 0.957x the default 16; so shorter ones, 8 keys
  # (HF2Q_CUDA_DEFINE=SPLIT_KEYS=8: more blocks of fewer keys, more partials for the combine), on
  # the same 8-layer cut, three rounds; the attention op tests with it first. Not run in that
  # session: with 348 s left, no machine of either kind would be started.
  unpack
  machine_info
  bg_make "" moe 8
  HF2Q_CUDA_DEFINE=SPLIT_KEYS=8 timeout 120 /tmp/bin/engine-tests --test-threads 1 cuda::rope_store_kv cuda::attention 2>&1 | tail -n 8 > $OUT/engine-tests.txt
  cat $OUT/engine-tests.txt
  m=$W/moe.q4_k_m.gguf
  moe_made 150 ab.txt
  if [ -f $m ]; then
    for i in 1 2 3; do for c in X=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=8; do tgp moe8 $m $c; done; done
    greedy_ab $m X=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=8
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s53)
  # Written 2026-12-06 (twenty-sixth session; carry nothing, timeout 300): the second call after s49
  # on the same warm machine, so on the whole 48-layer MoE that s49 made (no remake): the attention's
  # shorter splits (HF2Q_CUDA_DEFINE=SPLIT_KEYS=8 and 4: more blocks of fewer keys, more partials for
  # the combine; 32 keys measured 0.957x the default 16 on the 8-layer cut), their op tests first,
  # then three alternating rounds of tg128 and the greedy tokens. On a fresh machine it says so.
  # Ran 2026-12-06 on an H100 (bench/runs/2026-12-06-h100-f call 2, 84 s): op tests passed; 8 keys
  # 0.999x, 4 keys 0.986x (medians of three); the tokens differ (another summation order).
  m=$W/moe.q4_k_m.gguf
  if [ ! -f $m ] || [ ! -f /tmp/bin/engine-tests ]; then echo "s53: a fresh machine, s49's model is gone" | tee $OUT/ab.txt; exit 0; fi
  machine_info
  for n in 8 4; do
    HF2Q_CUDA_DEFINE=SPLIT_KEYS=$n timeout 120 /tmp/bin/engine-tests --test-threads 1 cuda::rope_store_kv cuda::attention 2>&1 | tail -n 6 | sed "s/^/SPLIT_KEYS=$n /" >> $OUT/engine-tests.txt
  done
  cat $OUT/engine-tests.txt
  for i in 1 2 3; do for c in X=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=8 HF2Q_CUDA_DEFINE=SPLIT_KEYS=4; do tgp moe48 $m $c; done; done
  greedy_ab $m X=1 HF2Q_CUDA_DEFINE=SPLIT_KEYS=8 HF2Q_CUDA_DEFINE=SPLIT_KEYS=4
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt
  ;;
s54)
  # Written 2026-12-06 (twenty-sixth session; carry .dev made at HEAD, a fresh machine, timeout 300):
  # decode attention's splits merged in a thread block cluster (HF2Q_CUDA_ATTN_CLUSTER=1:
  # attn_dec_f16(_rope)_cl, no attn_combine_q8 launch; contexts of at most 128 keys, as all of
  # tg128's) on the 8-layer cut of the MoE: its op tests first (bit for bit against the separate
  # launches), then three alternating rounds of tg128 and the greedy tokens.
  # Ran 2026-12-06 on an H100 (bench/runs/2026-12-06-h100-f call 3, 84 s, built at 9710c5d): op tests
  # passed, the same tokens, 0.984x; the variant taken out at 3e65648 (this phase needs 9710c5d).
  cut_ab "cuda::attention cuda::rope_store_kv" X=1 HF2Q_CUDA_ATTN_CLUSTER=1
  ;;
s55)
  # Written 2026-12-06 (twenty-sixth session; carry .dev made at HEAD, a fresh machine, timeout 300):
  # the MoE router's product and routing in one thread block cluster (HF2Q_CUDA_ROUTER_CLUSTER=1:
  # moe_router_cl, no mmv_TY_F32_1 + moe_route; the router's weights streaming during the norm
  # before it), alone and with decode attention's splits merged in a cluster (HF2Q_CUDA_ATTN_CLUSTER=1),
  # on the 8-layer cut of the MoE: the op tests first (bit for bit against the separate launches),
  # then three alternating rounds of tg128 and the greedy tokens.
  # Ran 2026-12-06 on an H100 (bench/runs/2026-12-06-h100-f call 4, 87 s, built at 4bb23c0): op tests
  # passed, the same tokens; the router in a cluster 0.973x, with the attention's 0.972x; both taken
  # out at 3e65648 (this phase needs 4bb23c0).
  cut_ab "cuda::moe cuda::attention_cluster cuda::rope_store_kv" X=1 HF2Q_CUDA_ROUTER_CLUSTER=1 \
    "HF2Q_CUDA_ROUTER_CLUSTER=1 HF2Q_CUDA_ATTN_CLUSTER=1"
  ;;
s49h)
  # Written 2026-12-06 (twenty-sixth session; carry .dev made at HEAD, timeout 450, for ~538 s of
  # device time left after two refused starts): s49 cut to what fits ~430 s: the whole 48-layer MoE
  # made beside llama-bench's build, then one round of both tools and the tensor list (no greedy
  # tokens, no round 2); llama-bench is skipped past 412 s and the tensor list past 422 s, so the
  # files are packed before the limit.
  moe48_start 400
  if grep -q MOE-END /tmp/mk.log && [ -f $m ]; then
    bench_hf2q moe $m
    llama_by 412
    grep -q BUILD-END /tmp/lc.log && [ $SECONDS -lt 412 ] && bench_llama moe $m
    bench_sum moe
    [ $SECONDS -lt 422 ] && timeout 10 $H info --tensors $m > $OUT/moe-info.txt 2>&1 && python3 bench/cuda/active_bytes.py $OUT/moe-info.txt | tee -a $OUT/bench-summary.txt
  fi
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt copy-bandwidth.txt make.txt moe-info.txt
  ;;
s56)
  # Written 2026-12-06 (twenty-sixth session; carry .dev made at HEAD, a fresh machine, timeout 170,
  # for the 448 s of device time left): what each MoE kernel adds to a decode step's chain of
  # launches, on the 8-layer cut: tg128 with its launches left out from the 41st step on
  # (HF2Q_CUDA_SKIP=NAME, dev.rs; timing only, the tokens are wrong) against the defaults, two
  # alternating rounds. The step's time less that with a kernel left out is the most that fusing it
  # away could save; HF2Q_CUDA_TWICE (2026-12-06-h100 call 3) measured what adding one costs.
  # Not run in that session: three starts refused, then too little device time left
  # (bench/runs/2026-12-06-h100-f). Run in the next on an H100 (bench/runs/2026-12-06-h100-g call 1,
  # cap 300 s, done at 114 s): the defaults 1,893.0 t/s; left out, moe_route 1,979.1, glu_q8
  # 1,957.5, mmv_TY_F32_1 1,949.4, attn_dec_f16_rope 2,169.6, mmq_moe_v3_TY_Q4_K 2,209.2, down
  # (both types) 2,030.2, mmq_v5_TY_Q4_K 2,080.7 (means of two). attn_combine_q8, add_rms_norm_q8
  # and add_ws_rms_norm_q8 printed no line: each alone ended in CUDA_ERROR_ILLEGAL_ADDRESS (call 2,
  # on the same warm machine; the three together 2,164.5 against 1,893.7).
  unpack
  machine_info
  bg_make "" moe 8
  m=$W/moe.q4_k_m.gguf
  moe_made 150 ab.txt
  if [ -f $m ]; then
    for i in 1 2; do
      for k in X moe_route glu_q8 attn_combine_q8 mmv_TY_F32_1 add_rms_norm_q8 add_ws_rms_norm_q8 attn_dec_f16_rope \
          mmq_moe_v3_TY_Q4_K mmq_moe_v2_TY_Q4_K,mmq_moe_v2_TY_Q6_K mmq_v5_TY_Q4_K; do
        [ $SECONDS -gt 300 ] && break
        tgp moe8 $m HF2Q_CUDA_SKIP=$k
      done
    done
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt copy-bandwidth.txt make.txt
  ;;
s57)
  # Written 2026-12-06 (twenty-seventh session; not run: no machine could be started). Carry .dev
  # made (make_dev.sh) on branch cuda-attn-prewait, with .dev/hf2q-old.xz, main's hf2q binary
  # (xz of it). The branch's routing in f32::total_cmp's order is held to the CPU's by
  # cuda::routing (with non-finite logits). Decode attention's loads that do not depend on the kernel ahead asked
  # for before waiting for it (attn_dec_f16_rope: the norms' weights, the row's rope pairs, the
  # new key's and value's cache rows; attn_combine_q8: the step's tables, then every split's
  # values at once), against the binary before; and a KV head's query heads over 2, 4 or 8 blocks
  # a split (HF2Q_CUDA_ATTN_HG). The op tests that hold them to the bits of what they stand for
  # (attention_merge, attention_head_groups, rope_store_kv), two alternating tg128 rounds on the
  # 8-layer cut, and the greedy tokens of each.
  unpack
  machine_info
  old_bin
  bg_make "" moe 8
  op_tests cuda::attention cuda::rope_store_kv cuda::moe cuda::routing
  m=$W/moe.q4_k_m.gguf
  moe_made 200 ab.txt
  if [ -f $m ]; then
    for i in 1 2; do
      old_new moe8 $m X=1 HF2Q_CUDA_ATTN_HG=2 HF2Q_CUDA_ATTN_HG=4 HF2Q_CUDA_ATTN_HG=8
    done
    old_new_greedy $m X=1 HF2Q_CUDA_ATTN_HG=2 HF2Q_CUDA_ATTN_HG=4 HF2Q_CUDA_ATTN_HG=8
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s58)
  # Written 2026-12-06 (twenty-eighth session; carry .dev made at HEAD by make_dev.sh with
  # FIXTURES="llama qwen3 qwen3_moe gemma3 gemma4 qwen3_5_text", plus .dev/hf2q-old.xz, the binary
  # before 958dca1's attention; a fresh machine, ~480 s, timeout 600; then s58s at once on the same
  # machine). s57 (2026-12-06-h200-b call 1) measured the MoE's 8-layer cut faster with a KV head's
  # query heads over 4 or 8 blocks a split and slower with 1; HEAD's default takes the most of 8 / 4
  # / 2 dividing them in steps of at most 4 rows (the 8B has 4 a KV head), one in larger steps.
  # This checks the rest on an H200: every op test, the fixtures carried, fed greedy decoding,
  # both tools on the 8B Q4_K_M, Q8_0 and BF16, then tg128 of the binary before against HEAD's
  # defaults and HF2Q_CUDA_ATTN_HG=1 / 2 on the 8B Q4_K_M and BF16, and the greedy tokens.
  unpack
  machine_info
  old_bin
  bg_llama
  bg_make "q4_k_m q8_0 bf16"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests
  fixtures $D/fixtures engine-tiny
  decode_greedy_cuda
  wait_builds
  for q in q4_k_m q8_0 bf16; do bench_pair $q $W/l8b.$q.gguf; done
  for i in 1 2; do
    for q in q4_k_m bf16; do
      [ $SECONDS -lt 520 ] || break
      old_new $q $W/l8b.$q.gguf X=1 HF2Q_CUDA_ATTN_HG=1 HF2Q_CUDA_ATTN_HG=2
    done
  done
  old_new_greedy $W/l8b.q8_0.gguf X=1 HF2Q_CUDA_ATTN_HG=1
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt ab.txt greedy-ab.txt copy-bandwidth.txt engine-tiny.txt
  ;;
s58s)
  # After s58 on the same warm machine (carry .dev again, timeout 600): serving at 16 and 64
  # streams on the 8B Q4_K_M with HEAD's attention against llama-server (the Done-when figure was
  # measured before 958dca1: 2026-12-04-h200/cuda-session7 call 13), then hf2q alone at 64 streams
  # with the head groups forced (HF2Q_CUDA_ATTN_HG=4: every block of a split reads its keys and
  # values again from the L2) and with the binary before.
  wait_builds
  for n in 16 64; do serve_pair $n; done
  echo "== the next line: HF2Q_CUDA_ATTN_HG=4" >> $OUT/serve.txt
  (export HF2Q_CUDA_ATTN_HG=4; SKIP_LLAMA=1 serve_pair 64)
  if [ -x /tmp/bin/hf2q-old ]; then
    echo "== the next line: the binary before 958dca1 (hf2q-old)" >> $OUT/serve.txt
    (H=/tmp/bin/hf2q-old; SKIP_LLAMA=1 serve_pair 64)
  fi
  echo "$phase done at $SECONDS s" | tee -a $OUT/serve.txt
  pack serve.txt serve-hf2q-log.txt
  ;;
s59)
  # Written 2026-12-06 (twenty-eighth session; carry .dev made at HEAD, a fresh machine, ~220 s, any
  # card): attn_combine(_q8)'s merge of the splits in HEAD's form (every split asked for at once
  # where there are at most 8, 52 registers), in 958dca1's (all 32 unrolled, 155 registers: the
  # form s57 and s49 measured, HF2Q_CUDA_DEFINE=COMBINE_FAST=32) and as loops (before 958dca1,
  # COMBINE_LOOP), on the MoE's 8-layer cut, two alternating rounds, with the head groups forced
  # to 4 beside them; the attention op tests; the greedy tokens (the same bits by construction).
  unpack
  machine_info
  bg_make "" moe 8
  op_tests cuda::attention cuda::rope_store_kv
  for d in COMBINE_FAST=32 COMBINE_LOOP; do HF2Q_CUDA_DEFINE=$d timeout 150 $H doctor > /dev/null 2>&1; done
  m=$W/moe.q4_k_m.gguf
  moe_made 200 ab.txt
  set -- X=1 HF2Q_CUDA_DEFINE=COMBINE_FAST=32 HF2Q_CUDA_DEFINE=COMBINE_LOOP HF2Q_CUDA_ATTN_HG=4
  if [ -f $m ]; then
    for i in 1 2; do for c in "$@"; do tgp moe8 $m $c; done; done
    greedy_ab $m "$@"
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt engine-tests.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s60)
  # Written 2026-12-07 (twenty-ninth session; carry .dev made at HEAD, a fresh machine, ~430 s,
  # timeout 600; the command checks for an H200 first). s58 ran HEAD on an H100 (bench/runs/
  # 2026-12-07-h100); this is the Done-when's 8B part on an H200: every op test while llama.cpp
  # (llama-bench, llama-server) and the 8B files are made, both tools on the three files, serving
  # at 16 and 64 streams against llama-server, the greedy tokens. Then s61 on the same machine.
  unpack
  machine_info
  LLAMA_TARGETS="llama-bench llama-server" bg_llama
  bg_make "q4_k_m q8_0 bf16"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  op_tests
  wait_builds
  for q in q4_k_m q8_0 bf16; do bench_pair $q $W/l8b.$q.gguf; done
  for n in 16 64; do serve_pair $n; done
  greedy_ab $W/l8b.q8_0.gguf X=1
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt serve.txt greedy-ab.txt copy-bandwidth.txt engine-tests.txt
  ;;
s62)
  # s60 for a short budget (twenty-ninth session, ~370 s of device time left; carry .dev, a fresh
  # machine, the command checks for an H200 first): llama-bench alone built, the 8B files made
  # beside it, both tools on BF16 (the thinnest margin), Q8_0, then Q4_K_M, each as soon as it can;
  # no op tests (they passed with this build on an H100, bench/runs/2026-12-07-h100), no serving.
  unpack
  machine_info
  LLAMA_TARGETS=llama-bench bg_llama
  bg_make "bf16 q8_0 q4_k_m"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  timeout 150 $H doctor > $OUT/doctor.txt 2>&1
  wait_builds
  for q in bf16 q8_0 q4_k_m; do bench_pair $q $W/l8b.$q.gguf; done
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt copy-bandwidth.txt
  ;;
s61)
  # After s60 on the same warm machine (carry .dev, timeout 600, ~360 s): the whole 48-layer MoE
  # (as s49: made in /dev/shm, the kernels compiled meanwhile by doctor), both tools on it with the
  # llama-bench s60 built, its active bytes a token, copy bandwidth again, the greedy tokens.
  [ -x /tmp/lc/b/bin/llama-bench ] || { echo "NOT RUN: s61 needs s60's machine (no llama-bench here)"; exit 3; }
  bg_make "" moe 48
  timeout 200 $H doctor > $OUT/doctor.txt 2>&1
  m=$W/moe.q4_k_m.gguf
  moe_made 480 bench-summary.txt
  if [ -f $m ] && grep -q MOE-END /tmp/mk.log; then
    bench_pair moe $m
    greedy_ab $m X=1
    timeout 60 $H info --tensors $m > $OUT/moe-info.txt 2>&1
    python3 bench/cuda/active_bytes.py $OUT/moe-info.txt | tee -a $OUT/bench-summary.txt
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s63)
  # Written 2026-12-07 (thirtieth session; carry .dev, any card, a fresh machine, ~250 s, timeout
  # 360): the one-row products of Q8_0 and Q4_K with each lane's weight words loaded straight into
  # registers, PF units in flight a warp (mmq.cu mmq_vd: HF2Q_CUDA_DEFINE=Q8_DIRECT=PF /
  # Q4_DIRECT=PF), against HEAD's shared-memory stages (Q8_0: two, one unit in flight; Q4_K: four or
  # five), and Q8_0's products launched early (HF2Q_CUDA_PDL_Q8=1) with each: the matmul op tests
  # under each define (one-row products the same bits as the tensor-core kernels' rows), then tg128
  # on the 8B Q8_0 and Q4_K_M alternating, two rounds while there is time, and the greedy tokens.
  unpack
  machine_info
  bg_make "q8_0 q4_k_m"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  Q8=(X=1 HF2Q_CUDA_DEFINE=Q8_DIRECT=2 HF2Q_CUDA_PDL_Q8=1 "HF2Q_CUDA_DEFINE=Q8_DIRECT=2 HF2Q_CUDA_PDL_Q8=1")
  Q4=(X=1 HF2Q_CUDA_DEFINE=Q4_DIRECT=4)
  for d in Q8_DIRECT=2 Q4_DIRECT=4; do
    HF2Q_CUDA_DEFINE=$d timeout 100 /tmp/bin/engine-tests --test-threads=1 cuda::matmul 2>&1 | grep -E "test result|panicked|FAILED" | sed "s/^/$d /" | tee -a $OUT/ab.txt
  done
  wait_for MAKE-END 200
  grep -E "make_model|Elapsed|END|rror" /tmp/mk.log > $OUT/make.txt
  for i in 1 2; do
    [ $i = 1 ] || [ $SECONDS -lt 230 ] || break
    for c in "${Q8[@]}"; do tgp q8_0 $W/l8b.q8_0.gguf $c; done
    for c in "${Q4[@]}"; do tgp q4_k_m $W/l8b.q4_k_m.gguf $c; done
  done
  for c in "${Q8[@]}"; do [ $SECONDS -lt 300 ] && greedy_ab $W/l8b.q8_0.gguf "$c"; done
  for c in "${Q4[@]}"; do [ $SECONDS -lt 310 ] && greedy_ab $W/l8b.q4_k_m.gguf "$c"; done
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt greedy-ab.txt copy-bandwidth.txt make.txt gpu.txt
  ;;
s64a | s64b | s64)
  # Written 2026-12-07 (thirty-first session): HEAD's SmolLM2 goldens on CUDA against the CPU
  # with the logit margins where they part (hf2q serve on both, side by side, golden_margins.py),
  # and perplexity on both backends. SmolLM2 Q4_1 travels in thirds (`split -n 3 FILE smol.part.`
  # here: the working tree, 16.7 MiB, and a call's carry are 64 MiB together), one a call on the
  # same warm machine, from folders that .git/info/exclude ignores (so only the one named travels):
  # s64a carries .dev1 = bins.tar.xz + stash/smol.part.aa and unpacks, s64b .dev2 =
  # stash/smol.part.ab, s64 .dev3 = stash/smol.part.ac and runs.
  stash
  [ $phase = s64a ] && unpack $PWD/.dev1
  [ $phase = s64 ] || exit 0
  [ -x $H ] || { echo "NOT RUN: s64 needs s64a's machine (no /tmp/bin/hf2q here)"; exit 3; }
  machine_info
  smol_models
  timeout 200 python3 bench/cuda/golden_margins.py $H $M 2>&1 | tee $OUT/smollm2-goldens.txt | tail -n 14
  smol_ppl 120 Q8_0  # the Done-when's file
  echo "$phase done at $SECONDS s"
  ;;
s65)
  # Written 2026-12-07 (thirty-first session; ~100 s, any card, timeout 240): the engine fixture
  # families that .dev cannot carry beside the rest, on CUDA. Carry .dev4 alone, made here with
  #   mkdir -p .dev4/fixtures/tiny && cp .dev/bins.tar.xz .dev4/ && for f in llama qwen2 gemma4_moe \
  #     gemma4_ple qwen3_5 qwen3_5_moe qwen3_5_moe_text; do cp -r ../shared/fixtures/tiny/$f \
  #     .dev4/fixtures/tiny/; done     (39 MiB; /.dev4/ in .git/info/exclude)
  # and .dev removed or ignored (an untracked folder that is not ignored travels uncarried too);
  # llama too, as engine_tiny takes a fixtures folder only when it holds tiny/llama. Ran in
  # bench/runs/2026-12-07-h100-b.
  unpack $PWD/.dev4
  machine_info
  fixtures $PWD/.dev4/fixtures engine-tiny-rest
  echo "$phase done at $SECONDS s"
  ;;
s63q)
  # s63 for ~200 s (thirtieth session, 263 s of device time left; carry .dev, any card, a fresh
  # machine, timeout 200): Q8_0 alone, HEAD's stages against Q8_DIRECT=2 launched in order and
  # early, while there is time; its op test and greedy tokens.
  unpack
  machine_info
  bg_make "q8_0"
  Q8=(X=1 HF2Q_CUDA_DEFINE=Q8_DIRECT=2 "HF2Q_CUDA_DEFINE=Q8_DIRECT=2 HF2Q_CUDA_PDL_Q8=1")
  HF2Q_CUDA_DEFINE=Q8_DIRECT=2 timeout 60 /tmp/bin/engine-tests --test-threads=1 cuda::matmul_rows_alone 2>&1 | grep -E "test result|panicked|FAILED" | sed "s/^/Q8_DIRECT=2 /" | tee -a $OUT/ab.txt
  wait_for MAKE-END 120
  grep -E "make_model|Elapsed|END|rror" /tmp/mk.log > $OUT/make.txt
  for i in 1 2; do
    for c in "${Q8[@]}"; do [ $SECONDS -lt 165 ] && tgp q8_0 $W/l8b.q8_0.gguf $c; done
  done
  for c in "${Q8[@]}"; do [ $SECONDS -lt 175 ] && greedy_ab $W/l8b.q8_0.gguf "$c"; done
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt greedy-ab.txt make.txt gpu.txt
  ;;
s58b)
  # Written 2026-12-06 (twenty-eighth session, for 364 s of device time left, too little for s58's
  # llama.cpp build; carry .dev as for s58, timeout 300): HEAD's decode attention (head groups by
  # default) against the binary before it on the 8B Q4_K_M, BF16 and Q8_0, whose ratios to
  # llama.cpp were measured with the attention before (2026-12-05-h200-b): tg128 alternating, two
  # rounds while there is time; the op tests, the fixtures carried and fed greedy decoding while
  # the models are made; the greedy tokens of both.
  unpack
  machine_info
  old_bin
  bg_make "q4_k_m bf16 q8_0"
  timeout 100 /tmp/bin/engine-tests --test-threads=1 --skip kernels_compile cuda > $OUT/engine-tests.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/engine-tests.txt
  HF2Q_FIXTURES=$D/fixtures timeout 40 /tmp/bin/engine_tiny --nocapture fixtures_on_cuda > $OUT/engine-tiny.txt 2>&1
  grep -E "NOT RUN|test result|panicked|over" $OUT/engine-tiny.txt | head
  HF2Q_FIXTURES=$D/fixtures timeout 20 /tmp/bin/engine_tiny --nocapture decode_greedy_on_cuda > $OUT/decode-greedy.txt 2>&1
  grep -E "test result|panicked|NOT RUN" $OUT/decode-greedy.txt
  for i in 1 2; do
    for q in q4_k_m bf16 q8_0; do
      wait_for $q-END 240
      [ $SECONDS -lt 250 ] && [ -f $W/l8b.$q.gguf ] || continue
      old_new $q $W/l8b.$q.gguf X=1
    done
  done
  old_new_greedy $W/l8b.q8_0.gguf X=1
  grep -E "make_model|Elapsed|END" /tmp/mk.log > $OUT/make.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/ab.txt
  pack ab.txt greedy-ab.txt engine-tests.txt engine-tiny.txt decode-greedy.txt make.txt
  ;;
s49b)
  # The second call of s49's chain (twenty-fourth session; carry nothing, timeout 600), on the same
  # warm machine: what s49 left (the make, hf2q bench, llama-bench's build and its bench), then a
  # second round of both tools on the 48-layer MoE, and copy bandwidth again. On a fresh machine (s49's
  # files gone) it says so and stops.
  m=$W/moe.q4_k_m.gguf
  if [ ! -f /tmp/mk.log ]; then echo "s49b: a fresh machine, s49's files are gone" | tee $OUT/bench-summary.txt; exit 0; fi
  for i in $(seq 1 100); do grep -q MOE-END /tmp/mk.log && break; sleep 3; done
  grep -E "make_model|Elapsed|Maximum resident|END|rror" /tmp/mk.log > $OUT/make.txt
  if [ ! -f $m ]; then echo "s49b: no model ($m): see make.txt" | tee -a $OUT/bench-summary.txt; pack bench-summary.txt make.txt; exit 0; fi
  [ -f /tmp/hf2q-bench-moe.json ] && [ -s /tmp/hf2q-bench-moe.json ] || { bench_hf2q moe $m; greedy_ab $m X=1; }
  timeout 60 $H info --tensors $m > $OUT/moe-info.txt 2>&1  # (the tensors' types: the active bytes a token)
  for i in $(seq 1 100); do grep -q BUILD-END /tmp/lc.log && break; sleep 3; done
  tail -n 2 /tmp/lc.log >> $OUT/make.txt
  [ -f /tmp/s49-llama-done ] || bench_llama moe $m
  bench_sum moe
  if [ ! -f /tmp/s49-round2-done ]; then
    echo "round 2 at $SECONDS s" | tee -a $OUT/bench-summary.txt
    bench_pair moe2 $m
  fi
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  nvidia-smi -q > $OUT/nvidia-smi-q.txt
  echo "$phase done at $SECONDS s" | tee -a $OUT/bench-summary.txt
  pack bench-summary.txt greedy-ab.txt copy-bandwidth.txt make.txt
  ;;
s47)
  # Written and run 2026-12-06 (twenty-third session, an H100: bench/runs/2026-12-06-h100-c call 2):
  # the experts' weights asked of the L2 early (prefetch.global.L2) against the defaults, two
  # rounds: HF2Q_CUDA_DOWN_L2 (the lean gate / up blocks asking for their pair's down weights,
  # before / after their own product) 0.978x / 0.980x; HF2Q_CUDA_ROUTE_L2 (the routing by 128
  # blocks that also ask for the chosen experts' gate / up weights, and down's) 0.81x / 0.77x.
  # The same tokens; taken out (af4cc1a has them).
  echo "phase $phase: its variants were taken out (see the comment)" | tee $OUT/phase.txt
  ;;
s46 | s48)
  # Written 2026-12-06 (twenty-second session; carry .dev made at HEAD, a fresh machine, ~410-440 s):
  # the MoE's Done-when figure, both tools, nothing else: the moe op test, the greedy tokens, copy
  # bandwidth, then hf2q bench and llama-bench on the 24-layer MoE (for an H200; s43 without its
  # A/B, which three H100s have settled). s48 (twenty-third session; timeout 600): the same with
  # llama-bench's build waited for until 520 s, not 440 (its build was at 97 % at 440 s on the
  # H100 of bench/runs/2026-12-06-h100-c call 1).
  moe_ready
  if [ $phase = s48 ]; then moe_both 520; else moe_both 440; fi
  ;;
s45)
  # Written and run 2026-12-06 (twenty-second session, two H100s: bench/runs/2026-12-06-h100-b calls
  # 1, 2): Fused::NormRouter, the MoE router making its input's residual add and norm in its own
  # blocks (mmv_TY_F32n_1, then moe_route_add writing the add), against the defaults, with its op
  # test (moe_after_norm, bit for bit); 0.959x with the blocks' loads one after another, 1.002x
  # with them asked for at once (the same tokens): no gain, so it was taken out.
  echo "phase $phase: its variant was taken out (see the comment)" | tee $OUT/phase.txt
  ;;
s43)
  # Written 2026-12-06 (twentieth session, for the next one; carry .dev made at HEAD, a fresh
  # machine, ~450 s): s42 on an H200 (it ran on an H100), with the GLU variants A/B'd again now that
  # the expert products are lean: the defaults, HF2Q_CUDA_MOE_LEAN=0, HF2Q_CUDA_GLU_FUSE=1 (each
  # pair's GLU by its last gate / up block; 0.973x before the lean kernels) and HF2Q_CUDA_GLU_DOWN=1
  # (by every down block, now through lean kernels too, mmq_moe_gd_v2_*: Q4_K's 1,024 blocks
  # resident at once; 0.98x before), alternating, two rounds; the greedy tokens of each; both
  # tools on the MoE with the fastest.
  moe_ready
  set -- HF2Q_CUDA_MOE_LEAN=0 HF2Q_CUDA_GLU_FUSE=1 HF2Q_CUDA_GLU_DOWN=1
  for i in 1 2; do for c in X=1 "$@"; do [ $SECONDS -lt 330 ] && tgp moe $m $c; done; done
  greedy_ab $m X=1 "$@"
  pick=$(best_of moe $OUT/ab.txt X=1 X=1 HF2Q_CUDA_GLU_FUSE=1 HF2Q_CUDA_GLU_DOWN=1)
  echo "$pick ($phase: seconds $SECONDS)" | tee -a $OUT/bench-summary.txt
  eval "$pick"
  python3 bench/cuda/copy_bandwidth.py | tee $OUT/copy-bandwidth.txt
  moe_close 440
  ;;
s37 | s38 | s39)
  # Written 2026-12-06 for Fused::MoeOne (a MoE decode step in one launch) and its modes: s37 ran on
  # an H200 (0.907x, bench/runs/2026-12-06-h200 call 2), s38 on an H100 (0.861-0.943x,
  # bench/runs/2026-12-06-h100 call 2); the variant was taken out.
  echo "phase $phase: its variant was taken out (see the comment)" | tee $OUT/phase.txt
  ;;
s17 | s18)
  # Written 2026-12-05 for HF2Q_CUDA_GATE_EARLY=1 (a MoE step's gate / up products launched early,
  # reading the expert ids after waiting for the routing): on an H100 its moe op test did not finish
  # within 100 s (bench/runs/2026-12-05-h100-b, call 4), and the variant was taken out.
  echo "phase $phase: its variant was taken out (see the comment)" | tee $OUT/phase.txt
  ;;
s12)
  # Written 2026-12-05 (twelfth session), carrying .dev (bins.tar.xz of the build with top_rows and
  # sample_rows on by default; until 2026-12-05 HF2Q_CUDA_TOPK / _SAMPLE=1 turned them on, and the
  # labels of serve_pair read 0 when unset): their op tests, then the 8B Q4_K_M and sampled serving
  # (temperature 1) at 64 streams, over the whole vocabulary and with top_k 40 (the figures drawn on
  # the host: 2026-12-05-h100 call 5); generate's seeded tokens the same with HF2Q_CUDA_SAMPLE=0.
  unpack
  machine_info
  bg_make q4_k_m
  op_tests sample_rows top_rows
  wait_for MAKE-END
  grep -E "make_model|Elapsed" /tmp/mk.log > $OUT/make.txt
  export SERVE_TEMP=1 SKIP_LLAMA=1
  SERVE_TOPK=0 serve_pair 64
  SERVE_TOPK=40 serve_pair 64
  for e in X=1 HF2Q_CUDA_SAMPLE=0; do
    echo "$e $(env $e timeout 60 $H generate -m $W/l8b.q4_k_m.gguf --device cuda -p "The capital of France is" -n 48 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed 5 --spec off 2> /dev/null | md5sum)" | tee -a $OUT/greedy-ab.txt
  done
  ;;
*)
  # The earlier sessions' phases.
  . "$(dirname "${BASH_SOURCE[0]}")/device-past.sh"
  ;;
esac
