"""Greedy SmolLM2 chat goldens on CUDA vs the CPU, with the logit margin at the first differing step.

usage: python3 bench/cuda/golden_margins.py HF2Q MODEL_DIR   (MODEL_DIR holds SmolLM2-135M-Instruct.{Q4_1,Q8_0,Q4_K_M}.gguf)
       GM_DEVICES=A,B (default cpu,cuda) picks the two servers' devices, GM_ENV_A / GM_ENV_B add
       variables to the first's / second's environment, GM_THREADS their threads (4)
       GM_SERVER=llama: HF2Q is llama.cpp's llama-server instead, `-fa on -np 1`, a device cpu as
       `-ngl 0` and cuda as `-ngl 99` (the peer's own CUDA against its own CPU on the same goldens)

For each quantization, `hf2q serve` runs on the CPU and on CUDA side by side; each golden prompt is
sent to both as a chat completion (temperature 0, 64 tokens, logprobs with the top 5). Where the two
replies part, the step is shown with both backends' top tokens: the margin is the chosen token's
log-probability minus the other backend's token's (a difference of log-probabilities is the
difference of the logits), so a near-tie shows as a margin close to 0.
"""
import json, os, subprocess, sys, time, urllib.request

hf2q, mdir = sys.argv[1], sys.argv[2]
gold = json.load(open("crates/hf2q/tests/data/goldens/smollm2_chat_goldens.json"))


def post(port, prompt):
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 64,
            "logprobs": True, "top_logprobs": 5}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=120))
    c = r["choices"][0]
    return c["message"]["content"], c["logprobs"]["content"]


llama = os.environ.get("GM_SERVER") == "llama"


def command(model, dev, port):
    threads = os.environ.get("GM_THREADS", "4")
    if llama:
        return [hf2q, "-m", model, "--port", str(port), "-np", "1", "-fa", "on", "-c", "2048", "-t", threads,
                "-ngl", "99" if dev.startswith("cuda") else "0"]
    return [hf2q, "serve", "-m", model, "--device", dev, "--port", str(port), "--parallel", "1", "-t", threads]


def wait(port):
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/{'health' if llama else 'readyz'}", timeout=2)
            return
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"server on {port} did not get ready")


same = total = 0
for quant in ("Q4_1", "Q8_0", "Q4_K_M"):
    model = f"{mdir}/SmolLM2-135M-Instruct.{quant}.gguf"
    # GM_ENV_A / GM_ENV_B="NAME=VALUE ..." are added to the first / second server's environment
    # (GM_DEVICES=cpu,cpu GM_ENV_B=HF2Q_CPU_ATTN_F32=1: the CPU with and without ggml's f16 attention
    # rounding; GM_ENV_A=HF2Q_CPU_ATTN_F32=1: CUDA against the CPU attending in f32).
    env_of = lambda var: dict(os.environ, **dict(kv.split("=", 1) for kv in os.environ.get(var, "").split()))
    procs = [subprocess.Popen(command(model, dev, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env)
             for dev, port, env in zip(os.environ.get("GM_DEVICES", "cpu,cuda").split(","), (8090, 8091),
                                       (env_of("GM_ENV_A"), env_of("GM_ENV_B")))]
    try:
        wait(8090)
        wait(8091)
        for g in (g for g in gold if g["quant"] == quant):
            total += 1
            (cpu_text, cpu_lp), (gpu_text, gpu_lp) = post(8090, g["prompt"]), post(8091, g["prompt"])
            ok = gpu_text == cpu_text
            same += ok
            print(f"{quant:7} {'=' if ok else '!='} (cpu {'=' if cpu_text == g['text'] else '!='} golden) {g['prompt'][:40]!r}")
            if ok:
                continue
            k = next((i for i, (a, b) in enumerate(zip(cpu_lp, gpu_lp)) if a["token"] != b["token"]), None)
            if k is None:
                print(f"   replies differ in length only ({len(cpu_lp)} vs {len(gpu_lp)} tokens)")
                continue
            top = lambda lp: {t["token"]: t["logprob"] for t in lp[k]["top_logprobs"]}
            ct, gt = top(cpu_lp), top(gpu_lp)
            a, b = cpu_lp[k]["token"], gpu_lp[k]["token"]
            gm = gt[b] - gt[a] if a in gt else float("nan")
            cm = ct[a] - ct[b] if b in ct else float("nan")
            print(f"   first differing step {k}: cpu {a!r}, cuda {b!r}; margin on cuda {gm:.4f}, on cpu {cm:.4f}")
            print(f"   cpu top: {json.dumps({t: round(v, 4) for t, v in ct.items()})}")
            print(f"   cuda top: {json.dumps({t: round(v, 4) for t, v in gt.items()})}")
    finally:
        for p in procs:
            p.terminate()
            p.wait()
print(f"SmolLM2 greedy chat replies{' (llama-server)' if llama else ''}, CUDA equal to the CPU: {same} of {total}")
