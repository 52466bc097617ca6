# A random-initialised Qwen3-30B-A3B-shaped MoE (published config, 4 of 48 layers), bf16 safetensors.
import json, os, struct, sys, numpy as np, shutil
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
L = 4
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
 "norm_topk_prob": True, "num_hidden_layers": L, "num_attention_heads": 32, "num_key_value_heads": 4,
 "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
 "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
 "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645}
json.dump(cfg, open(f"{out}/config.json", "w"), indent=1)
fx = "/work/shared/fixtures/tiny/qwen3_moe"
for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
    shutil.copy(f"{fx}/{f}", f"{out}/{f}")
rng = np.random.default_rng(0)
H, E, F, V = 2048, 128, 768, 151936
tensors = [("model.embed_tokens.weight", (V, H), 0.02), ("lm_head.weight", (V, H), 0.02), ("model.norm.weight", (H,), None)]
for i in range(L):
    p = f"model.layers.{i}."
    tensors += [(p+"input_layernorm.weight", (H,), None), (p+"post_attention_layernorm.weight", (H,), None),
      (p+"self_attn.q_proj.weight", (4096, H), 0.02), (p+"self_attn.k_proj.weight", (512, H), 0.02),
      (p+"self_attn.v_proj.weight", (512, H), 0.02), (p+"self_attn.o_proj.weight", (H, 4096), 0.02),
      (p+"self_attn.q_norm.weight", (128,), None), (p+"self_attn.k_norm.weight", (128,), None),
      (p+"mlp.gate.weight", (E, H), 0.02)]
    for e in range(E):
        q = p+f"mlp.experts.{e}."
        tensors += [(q+"gate_proj.weight", (F, H), 0.02), (q+"up_proj.weight", (F, H), 0.02), (q+"down_proj.weight", (H, F), 0.02)]
header = {}; off = 0
for name, shape, _ in tensors:
    n = int(np.prod(shape)) * 2
    header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}; off += n
hb = json.dumps(header).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hb))); f.write(hb)
    for name, shape, std in tensors:
        if std is None:
            a = np.ones(shape, np.float32)
        else:
            a = rng.standard_normal(shape, dtype=np.float32) * std
        f.write((a.view(np.uint32) >> 16).astype(np.uint16).tobytes())
print("wrote", off / 1e9, "GB")
