"""Speculative decoding (n-gram lookup) against plain decoding, CPU, side by side in one run.

usage: python3 bench/spec/run.py HF2Q MODELS_DIR [OUT.json]

For each model (SmolLM2-135M-Instruct Q8_0 with its chat template; Gemma 3 270M Q4_K_M, a base
model, with a plain-text prompt) and each task — a quoting task (the reply should reproduce the first
~1,000 tokens of Alice in Wonderland's chapter I, given in the prompt) and ordinary chat / continuation prompts — runs
`hf2q generate --temp 0 --device $DEVICE` (default cpu) with `--spec off` and `--spec ngram` (`--draft-max $DRAFT_MAX` when set, else
hf2q's default), and reports decode tokens/s (hf2q's
own `-v` log line), the ratio, the acceptance, whether the two outputs are the same bytes, and for
the quoting task how much of the quoted text the reply reproduces (longest common prefix, and the
fraction of the quote's words that appear in order: difflib's matching blocks).
"""
import difflib, json, os, re, subprocess, sys

hf2q, models = sys.argv[1], sys.argv[2]
out_path = sys.argv[3] if len(sys.argv) > 3 else None
here = os.path.dirname(os.path.abspath(__file__))
alice = open(os.path.join(here, "../../crates/hf2q/tests/data/perplexity/alice_in_wonderland.txt")).read()
# The first ~1,000 tokens of chapter I, whitespace normalised.
body = " ".join(alice[alice.index("Alice was beginning"):][:6000].split())
quote = body[:4200].rsplit(" ", 1)[0]

CHAT = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator keeps food cold.",
    "Give me ten tips for sleeping better.",
]
PLAIN = [
    "The history of the printing press begins",
    "Once upon a time, in a small village by the sea,",
    "The three most important rules of cooking are",
]

def run(model, prompt, chat, spec, n):
    args = [hf2q, "-v", "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "2",
            "--spec", spec, "--device", os.environ.get("DEVICE", "cpu")]
    if os.environ.get("DRAFT_MAX"):
        args += ["--draft-max", os.environ["DRAFT_MAX"]]
    if chat:
        args.insert(5, "--chat")
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args[:6])}...: {r.stderr[-2000:]}")
    m = re.search(r"generated (\d+) tokens \(([\d.]+) tok/s\)", r.stderr)
    s = re.search(r"speculative: (\d+) checks, (\d+) tokens drafted, (\d+) accepted", r.stderr)
    return {
        "tokens": int(m.group(1)), "tps": float(m.group(2)), "text": r.stdout,
        "checks": int(s.group(1)) if s else 0, "drafted": int(s.group(2)) if s else 0,
        "accepted": int(s.group(3)) if s else 0,
    }

def reproduced(reply, quote):
    prefix = 0
    for a, b in zip(reply, quote):
        if a != b:
            break
        prefix += 1
    qw, rw = quote.split(), reply.split()
    sm = difflib.SequenceMatcher(None, qw, rw, autojunk=False)
    inorder = sum(b.size for b in sm.get_matching_blocks()) / max(1, len(qw))
    return prefix, inorder

rows = []
cases = [
    ("SmolLM2-135M-Instruct.Q8_0.gguf", True, "quote", quote + "\n\nRepeat the text above exactly.", 1000),
    *[("SmolLM2-135M-Instruct.Q8_0.gguf", True, "chat", p, 256) for p in CHAT],
    ("gemma-3-270m-q4_k_m.gguf", False, "quote", "Here is a passage:\n\n" + quote + "\n\nThe same passage, copied exactly:\n\n", 1000),
    *[("gemma-3-270m-q4_k_m.gguf", False, "plain", p, 256) for p in PLAIN],
]
for name, chat, kind, prompt, n in cases:
    model = os.path.join(models, name)
    if not os.path.exists(model):
        print(f"NOT RUN: {name} (not in {models})", flush=True)
        continue
    off = run(model, prompt, chat, "off", n)
    ng = run(model, prompt, chat, "ngram", n)
    row = {
        "model": name, "task": kind, "prompt": prompt[:60], "max_tokens": n,
        "off_tps": off["tps"], "ngram_tps": ng["tps"], "ratio": round(ng["tps"] / off["tps"], 3),
        "tokens": ng["tokens"], "checks": ng["checks"], "drafted": ng["drafted"], "accepted": ng["accepted"],
        "same_text": off["text"] == ng["text"],
    }
    if kind == "quote":
        p, f = reproduced(ng["text"], quote)
        row["quote_chars"], row["reply_prefix_chars"], row["quote_words_in_order"] = len(quote), p, round(f, 3)
    rows.append(row)
    acc = f"{100 * ng['accepted'] / ng['drafted']:.1f} %" if ng["drafted"] else "-"
    extra = f", reproduces {row['quote_words_in_order']:.0%} of the quote's words in order" if kind == "quote" else ""
    print(f"{name:34} {kind:5} off {off['tps']:6.1f}  ngram {ng['tps']:6.1f}  {row['ratio']:.2f}x  "
          f"accepted {acc}, {ng['checks']} checks, same text: {row['same_text']}{extra}", flush=True)
if out_path:
    json.dump(rows, open(out_path, "w"), indent=1)
