"""Concurrent streaming clients against an OpenAI-compatible /v1/completions (hf2q serve or
llama-server): N streams at once, each a 512-token prompt of token ids and 128 new tokens, greedy
(or sampled at TEMP with top_k TOPK, 40 by default, 0 for none: the OpenAI default, seeded per
stream, ignoring end-of-sequence so every stream makes its NEW_TOKENS). Prints aggregate output tokens/s, time to first token (p50, p90) and inter-token
latency (p50).

usage: python3 bench/cuda/serve_bench.py URL N [PROMPT_TOKENS] [NEW_TOKENS] [VOCAB] [TEMP] [TOPK]
Prompts differ per stream (no prefix-cache help); ids below VOCAB, seeded, the same for both servers.
Needs aiohttp (on the GPU machine's image).
"""
import asyncio, json, random, statistics, sys, time

import aiohttp

url, n = sys.argv[1].rstrip("/"), int(sys.argv[2])
p_tok = int(sys.argv[3]) if len(sys.argv) > 3 else 512
g_tok = int(sys.argv[4]) if len(sys.argv) > 4 else 128
vocab = int(sys.argv[5]) if len(sys.argv) > 5 else 32000
temp = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
top_k = int(sys.argv[7]) if len(sys.argv) > 7 else 40


async def one(session, i, out):
    rng = random.Random(1000 + i)
    body = {"prompt": [rng.randrange(100, vocab) for _ in range(p_tok)], "max_tokens": g_tok,
            "temperature": temp, "stream": True, "stream_options": {"include_usage": True}}
    if temp > 0:
        body.update({"top_k": top_k, "top_p": 1.0, "min_p": 0.0, "seed": i, "ignore_eos": True})
    t0 = time.perf_counter()
    stamps, usage = [], None
    async with session.post(f"{url}/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"stream {i}: HTTP {r.status}: {await r.text()}")
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            ch = d.get("choices") or []
            if ch and ch[0].get("text"):
                stamps.append(time.perf_counter())
    toks = (usage or {}).get("completion_tokens") or len(stamps)
    out.append((stamps[0] - t0 if stamps else float("nan"), stamps, toks, time.perf_counter() - t0))


async def main():
    out = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as s:
        await one(s, 10_000, [])  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(one(s, i, out) for i in range(n)))
        wall = time.perf_counter() - t0
    ttft = sorted(o[0] for o in out)
    itl = [b - a for o in out for a, b in zip(o[1], o[1][1:])]
    total = sum(o[2] for o in out)
    res = {"url": url, "streams": n, "prompt_tokens": p_tok, "new_tokens": g_tok, "wall_s": round(wall, 3),
           "output_tokens": total, "aggregate_tps": round(total / wall, 1),
           "ttft_p50_ms": round(1e3 * statistics.median(ttft), 1),
           "ttft_p90_ms": round(1e3 * ttft[int(0.9 * (len(ttft) - 1))], 1),
           "itl_p50_ms": round(1e3 * statistics.median(itl), 2) if itl else None}
    print(json.dumps(res))


asyncio.run(main())
