#!/usr/bin/env python3
"""Write a random-initialised HF checkpoint with Qwen3-0.6B's published shapes (596M parameters, bf16,
tied embeddings) for the conversion benchmark. The tokenizer files are the tiny fixtures' byte-level BPE
(config vocab_size 151936 pads the vocabulary, which both converters do the same way).

    python3 make_qwen3_0.6b.py shared/fixtures/tiny/qwen3 OUT_DIR
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

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
g = torch.Generator().manual_seed(0)
def w(*shape):
    return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
def norm(n):
    return (1.0 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)
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
save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
print(sum(v.numel() for v in t.values()), "parameters")
