"""Reference logits of the Qwen 3.5 multi-token-prediction (MTP) head on the tiny `qwen3_5`
fixture (../shared/fixtures/tiny/qwen3_5, random weights), for hf2q's MTP test
(crates/hf2q/tests/mtp.rs; this file lives in crates/hf2q/tests/data/mtp).

transformers has the MTP weights (`mtp.*`) but no MTP forward, so the head is written here from
transformers' own blocks (Qwen3_5RMSNorm, Qwen3_5DecoderLayer, the text rotary embedding), wired
as vLLM's `qwen3_next_mtp.py` and llama.cpp's `src/models/qwen35.cpp` (`graph_mtp`) do:

    x = fc(cat(pre_fc_norm_embedding(embed(t[i+1])), pre_fc_norm_hidden(h[i])))   # embedding first
    x = decoder_layer(x)      # a full-attention layer, causal over the MTP rows, row i at position i
    g = mtp.norm(x)           # the next draft's hidden state
    logits = lm_head(g)       # the guess for t[i+2]

where h[i] is the target's last hidden state after its final norm (`last_hidden_state`; llama.cpp
`h_nextn`). Rows 0..n-2 pair the prompt's hidden states with the prompt's next tokens; row n-1
pairs the last one with the target's greedy token; row n (the chain) pairs row n-1's g with that
row's MTP argmax at position n, as a second draft is made.

Run: python3 qwen3_5_mtp.py FIXTURE_DIR > qwen3_5_mtp.json   (torch 2.15, transformers 5.23, CPU, fp32)
"""

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5RMSNorm,
    Qwen3_5TextRotaryEmbedding,
)

N_PROMPT = 6


def main(d):
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(d)
    cfg._attn_implementation = "eager"
    tc = cfg.text_config
    tc._attn_implementation = "eager"
    model = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = json.load(open(f"{d}/reference.json"))["input_ids"][:N_PROMPT]
    w = {k: v.float() for k, v in load_file(f"{d}/model.safetensors").items() if k.startswith("mtp.")}

    e = tc.hidden_size
    norm = lambda name: _norm(Qwen3_5RMSNorm(e, eps=tc.rms_norm_eps), w[f"mtp.{name}.weight"])
    enorm, hnorm, head_norm = norm("pre_fc_norm_embedding"), norm("pre_fc_norm_hidden"), norm("norm")
    fc = w["mtp.fc.weight"]  # [e, 2e]
    full = tc.layer_types.index("full_attention")
    layer = Qwen3_5DecoderLayer(tc, full).float().eval()
    sd = {k[len("mtp.layers.0."):]: v for k, v in w.items() if k.startswith("mtp.layers.0.")}
    missing, unexpected = layer.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    rot = Qwen3_5TextRotaryEmbedding(tc)
    embed = model.get_input_embeddings().weight
    lm_head = model.lm_head.weight

    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]))
        h = out.last_hidden_state[0]  # [n, e], after the final norm
        t_next = int(torch.argmax(model.lm_head(h[-1])))
        toks = ids[1:] + [t_next]

        def mtp(tokens, hidden, pos0, cache):
            x = torch.cat([enorm(embed[tokens]), hnorm(hidden)], dim=-1) @ fc.T
            cache.append(x)
            xs = torch.cat(cache)[None]  # every MTP row so far: recompute causally
            n = xs.shape[1]
            pos = torch.arange(n)[None]
            pos = pos[None].expand(3, 1, n)
            pe = rot(xs, pos)
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            y = layer(xs, position_embeddings=pe, attention_mask=mask)[0][-len(tokens):]
            g = head_norm(y)
            return g, g @ lm_head.T

        cache = []
        g, logits = mtp(toks, h, 0, cache)
        d1 = int(torch.argmax(logits[-1]))
        g2, logits2 = mtp([d1], g[-1:], len(toks), cache)
        rows = torch.cat([logits, logits2])

    json.dump(
        {
            "about": "qwen3_5_mtp.py on the tiny qwen3_5 fixture: MTP-head logits (fp32)",
            "input_ids": ids,
            "target_next": t_next,
            "mtp_tokens": toks + [d1],
            "mtp_argmax": [int(i) for i in rows.argmax(-1)],
            "logits": [[round(float(v), 5) for v in r] for r in rows],
            "transformers_version": __import__("transformers").__version__,
            "torch_version": torch.__version__,
        },
        sys.stdout,
        separators=(",", ":"),
    )


def _norm(m, weight):
    with torch.no_grad():
        m.weight.copy_(weight)
    return m.eval()


if __name__ == "__main__":
    main(sys.argv[1])
