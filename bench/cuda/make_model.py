"""A random-initialised Llama-3.1-8B-shaped model (the published config) as a HF directory, made
with transformers on the GPU machine, for the CUDA benchmarks (#19).

usage: python3 bench/cuda/make_llama8b.py OUT_DIR [LAYERS]

The tokenizer is the tiny llama fixture's (byte-level BPE, recognised by the converters) with its
vocabulary padded with unreachable tokens to Llama 3's 128,256 ids, so every tensor has the real
model's shape. Weights: transformers' own initialisation (normal, std 0.02), bf16.
"""
import json, os, shutil, sys, time
import torch
import transformers

out = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 32
tok_src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
V = 128256
t0 = time.time()
cfg = transformers.LlamaConfig(
    vocab_size=V, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
    rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    bos_token_id=1013, eos_token_id=1015,
)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
tj = json.load(open(os.path.join(tok_src, "tokenizer.json")))
have = len(tj["model"]["vocab"]) + len(tj.get("added_tokens", []))
nxt = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
for i in range(nxt, V):
    tj["model"]["vocab"][f"\u0120pad{i}"] = i
json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"))
shutil.copy(os.path.join(tok_src, "tokenizer_config.json"), out)
n = sum(p.numel() for p in model.parameters())
print(f"make_llama8b: {n/1e9:.2f}B parameters, {layers} layers, vocab {V} -> {out} in {time.time()-t0:.0f} s")
