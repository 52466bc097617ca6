"""Table of hf2q bench vs llama-bench results written by run.sh (ratio = hf2q / llama.cpp).

Files are NAME.ROUND.hf2q.json / NAME.ROUND.llama.json (older runs: NAME.hf2q.json, one round).
Each round's ratio compares runs made back to back; the table gives every round's t/s and ratio
and the median ratio.
"""
import json, pathlib, re, statistics, sys

out = pathlib.Path(sys.argv[1])


def peer_tests(path):
    res = {}
    for r in json.loads(path.read_text()):
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        res[test] = r
    return res


runs = {}  # name -> [(round, ours, peer)]
for h in sorted(out.glob("*.hf2q.json")):
    m = re.match(r"(.*?)(?:\.(\d+))?\.hf2q\.json$", h.name)
    name, rnd = m.group(1), int(m.group(2) or 1)
    stem = h.name[: -len(".hf2q.json")]
    ours = {r["test"]: r for r in json.loads(h.read_text())}
    runs.setdefault(name, []).append((rnd, ours, peer_tests(out / f"{stem}.llama.json")))

print("| model file | test | hf2q t/s (per round) | llama.cpp t/s (per round) | ratio per round | median ratio |")
print("| --- | --- | --- | --- | --- | ---: |")
for name, rs in sorted(runs.items()):
    rs.sort(key=lambda x: x[0])
    for test in ("pp512", "tg128"):
        a = [o[test] for _, o, _ in rs]
        b = [p[test] for _, _, p in rs]
        ratios = [x["avg_ts"] / y["avg_ts"] for x, y in zip(a, b)]
        fa = " / ".join(f"{x['avg_ts']:.1f} ± {x['stddev_ts']:.1f}" for x in a)
        fb = " / ".join(f"{y['avg_ts']:.1f} ± {y['stddev_ts']:.1f}" for y in b)
        fr = " / ".join(f"{r:.2f}" for r in ratios)
        print(f"| {name} | {test} | {fa} | {fb} | {fr} | {statistics.median(ratios):.2f}x |")
