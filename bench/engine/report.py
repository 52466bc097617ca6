"""Table of hf2q bench vs llama-bench results written by run.sh (ratio = hf2q / llama.cpp)."""
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
rows = []
for h in sorted(out.glob("*.hf2q.json")):
    name = h.name[: -len(".hf2q.json")]
    ours = {r["test"]: r for r in json.loads(h.read_text())}
    peer = {}
    for r in json.loads((out / f"{name}.llama.json").read_text()):
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        peer[test] = r
    for test in ("pp512", "tg128"):
        a, b = ours[test], peer[test]
        rows.append((name, test, a["avg_ts"], a["stddev_ts"], b["avg_ts"], b["stddev_ts"], a["avg_ts"] / b["avg_ts"]))
print("| model file | test | hf2q t/s | llama.cpp t/s | ratio |")
print("| --- | --- | ---: | ---: | ---: |")
for n, t, a, sa, b, sb, r in rows:
    print(f"| {n} | {t} | {a:.2f} ± {sa:.2f} | {b:.2f} ± {sb:.2f} | {r:.2f}x |")
