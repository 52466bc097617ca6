#!/usr/bin/env python3
"""/v1/embeddings under concurrent clients: CLIENTS clients (default 8) each send ROUNDS requests
of 64 passages taken in turn from PASSAGES.txt to a running `hf2q serve` at URL, all at once.
Prints one JSON line: passages, seconds (first request sent to last answer), aggregate
passages/s. Standard library only.

usage: serve_clients.py URL MODEL PASSAGES.txt [CLIENTS] [ROUNDS]"""
import json
import sys
import threading
import time
import urllib.request

url, model, path = sys.argv[1], sys.argv[2], sys.argv[3]
clients = int(sys.argv[4]) if len(sys.argv) > 4 else 8
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 1
texts = [l for l in open(path, encoding="utf-8").read().splitlines() if l.strip()]
per = 64


def post(batch):
    body = json.dumps({"model": model, "input": batch}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        got = json.load(r)
    assert len(got["data"]) == len(batch), got


post(texts[:4])  # warm-up
work = [[texts[(c * rounds + r) * per % len(texts):][:per] for r in range(rounds)] for c in range(clients)]
errors = []


def client(batches):
    try:
        for b in batches:
            post(b)
    except Exception as e:  # reported below
        errors.append(repr(e))


threads = [threading.Thread(target=client, args=(w,)) for w in work]
t = time.perf_counter()
for th in threads:
    th.start()
for th in threads:
    th.join()
s = time.perf_counter() - t
n = sum(len(b) for w in work for b in w)
print(json.dumps({"tool": "hf2q serve", "clients": clients, "passages": n, "seconds": s, "passages_per_s": n / s, "errors": errors}))
