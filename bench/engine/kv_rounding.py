"""How far an f16 KV cache alone moves a compact fixture's log-probabilities in transformers itself:
the fixture's fp32 model run once as is and once with the values the cache would store (K after its
norm, V after its projection / norm) rounded to f16 by forward hooks, each against reference.json.

    ~/peers/st/bin/python bench/engine/kv_rounding.py gemma4   (transformers 5.24, torch 2.15)

Gemma 4 attends with scale 1 over RMS-normed q and k, so the 2^-11 rounding of K enters the scores
unscaled; that is why its fixtures cannot come within ~2e-3 of fp32 with llama.cpp's f16 cache.
"""
import json, sys, torch, transformers
name = sys.argv[1]
d = f"/work/shared/fixtures/tiny/{name}"
ref = json.load(open(f"{d}/reference.json"))
cls = getattr(transformers, ref["class"])
m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
ids = torch.tensor([ref["input_ids"]])
def lp(x): return torch.log_softmax(x.double(), -1)
with torch.no_grad():
    base = m(ids).logits[0]
    r = torch.tensor(ref["logits"], dtype=torch.float64)
    print(name, "rerun vs reference max|dlogprob|", (lp(base) - lp(r)).abs().max().item())
    # Round what the cache stores: K after its norm and rope, V after its norm (hooks on the
    # modules that produce them; rope is applied inside attention, so K is rounded before rope).
    hooks = []
    for mod_name, mod in m.named_modules():
        if mod_name.endswith("k_norm") or mod_name.endswith("v_norm") or mod_name.endswith("v_proj"):
            hooks.append(mod.register_forward_hook(lambda mod, i, o: o.half().float()))
    rounded = m(ids).logits[0]
    print(name, "K/V rounded to f16 vs reference max|dlogprob|", (lp(rounded) - lp(r)).abs().max().item())
