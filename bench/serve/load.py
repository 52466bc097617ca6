"""Streaming chat load against an OpenAI-compatible server: C concurrent clients, each sending
R requests one after another (greedy, fixed max_tokens), over raw HTTP/1.1 (no client library,
so the load generator costs little CPU next to the server on a small machine).

    python3 load.py BASE_URL MODEL CONCURRENCY ROUNDS MAX_TOKENS [--json OUT]

Reports aggregate output tokens/s (completion tokens from the usage chunk, over the wall time of
the whole level), time to first token p50/p99 (request sent → first content delta) and checks
that every request finished with a usage chunk and [DONE].
"""
import asyncio, json, sys, time, urllib.parse

TOPICS = ["a lighthouse keeper", "a lost robot", "the first snow", "a tiny dragon", "an old map",
          "a city of bridges", "a clockmaker", "a quiet library", "a desert train", "a paper boat",
          "a mountain echo", "a garden at night", "a violin", "a comet", "a fox and a crow", "a storm at sea"]


async def one(host, port, path, body):
    r, w = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    w.write((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    t0 = time.perf_counter()
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    status = int(head.split()[1])
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {head!r} {await r.read()!r}")
    chunked = b"chunked" in head.lower()
    buf, ttft, usage, done = b"", None, None, False

    async def body_bytes():
        if not chunked:
            while True:
                b = await r.read(65536)
                if not b:
                    return
                yield b
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            yield await r.readexactly(size)
            await r.readexactly(2)

    async for b in body_bytes():
        buf += b
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                msg = json.loads(payload)
                if msg.get("usage"):
                    usage = msg["usage"]
                for c in msg.get("choices") or []:
                    if ttft is None and (c.get("delta") or {}).get("content"):
                        ttft = time.perf_counter() - t0
    w.close()
    if not done or usage is None or ttft is None:
        raise RuntimeError(f"incomplete stream (done={done}, usage={usage}, ttft={ttft})")
    return ttft, usage["completion_tokens"]


async def level(url, model, conc, rounds, max_tokens):
    u = urllib.parse.urlparse(url)
    path = u.path.rstrip("/") + "/chat/completions"
    ttfts, tokens, per_round = [], 0, []

    async def client(i):
        nonlocal tokens
        for k in range(rounds):
            topic = TOPICS[(i + k * conc) % len(TOPICS)]
            body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"Write a long story about {topic}."}]}
            t, n = await one(u.hostname, u.port, path, body)
            ttfts.append(t)
            per_round.append((k, round(t, 4)))
            tokens += n

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(conc)))
    wall = time.perf_counter() - t0
    ttfts.sort()
    pct = lambda p: ttfts[min(len(ttfts) - 1, int(round(p / 100 * (len(ttfts) - 1))))]
    return {"concurrency": conc, "requests": len(ttfts), "completion_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_s": pct(50), "ttft_p99_s": pct(99),
            "ttft_by_round": [[t for r, t in per_round if r == k] for k in range(rounds)]}


def main():
    url, model, conc, rounds, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    res = asyncio.run(level(url, model, conc, rounds, max_tokens))
    print(json.dumps(res))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
