#!/usr/bin/env python3
"""Write a random-initialised HF checkpoint with Qwen3-0.6B's published shapes (596M parameters, bf16,
tied embeddings) for the conversion benchmark. The tokenizer files are the tiny fixtures' byte-level BPE
(config vocab_size 151936 pads the vocabulary, which both converters do the same way).

    python3 make_qwen3_0.6b.py shared/fixtures/tiny/qwen3 OUT_DIR

With torch installed the weights come from torch's generator (seed 0); without it, from numpy's
(seed 0, other values, the same shapes and dtypes), written as safetensors by hand.
"""
import json
import shutil
import struct
import sys
from pathlib import Path

try:
    import torch
except ImportError:
    torch = None

src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
config = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
(out / "config.json").write_text(json.dumps(config, indent=2))
for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
    shutil.copy(src / f, out / f)
if torch is not None:
    g = torch.Generator().manual_seed(0)
    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)
else:
    import numpy as np
    rng = np.random.default_rng(0)
    def bf16(x):
        # f32 -> bf16 bits, round to nearest even
        u = x.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    def w(*shape):
        return bf16(rng.standard_normal(shape, dtype=np.float32) * 0.02)
    def norm(n):
        return bf16(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))
H, F, L, Q, KV, D = 1024, 3072, 28, 16, 8, 128
t = {"model.embed_tokens.weight": w(151936, H), "model.norm.weight": norm(H)}
for i in range(L):
    p = f"model.layers.{i}."
    t[p + "input_layernorm.weight"] = norm(H)
    t[p + "post_attention_layernorm.weight"] = norm(H)
    t[p + "self_attn.q_proj.weight"] = w(Q * D, H)
    t[p + "self_attn.k_proj.weight"] = w(KV * D, H)
    t[p + "self_attn.v_proj.weight"] = w(KV * D, H)
    t[p + "self_attn.o_proj.weight"] = w(H, Q * D)
    t[p + "self_attn.q_norm.weight"] = norm(D)
    t[p + "self_attn.k_norm.weight"] = norm(D)
    t[p + "mlp.gate_proj.weight"] = w(F, H)
    t[p + "mlp.up_proj.weight"] = w(F, H)
    t[p + "mlp.down_proj.weight"] = w(H, F)
if torch is not None:
    from safetensors.torch import save_file
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(sum(v.numel() for v in t.values()), "parameters")
else:
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for k, v in t.items():
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for v in t.values():
            f.write(v.tobytes())
    print(sum(v.size for v in t.values()), "parameters")
