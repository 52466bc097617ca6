"""Random-initialised models of published shapes as HF directories, made with transformers on the
GPU machine, for the CUDA benchmarks (#19):
  llama8b      Llama-3.1-8B's config (dense, 32 layers)
  qwen3moe30b  Qwen3-30B-A3B's config (48 layers, 128 experts, 8 per token)

usage: python3 bench/cuda/make_model.py SHAPE OUT_DIR [LAYERS]

The tokenizer is the tiny llama fixture's (byte-level BPE, recognised by the converters) with its
vocabulary padded with unreachable tokens to the model's vocabulary, so every tensor has the real
model's shape. Weights: transformers' own initialisation (normal, std 0.02), made in bf16.
"""
import json, os, shutil, sys, time
import torch
import transformers

shape, out = sys.argv[1], sys.argv[2]
t0 = time.time()
if shape == "llama8b":
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    V = 128256
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=1013, eos_token_id=1015,
    )
    cls = transformers.LlamaForCausalLM
elif shape == "qwen3moe30b":
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    V = 151936
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=V, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
        rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=1013, eos_token_id=1015,
    )
    cls = transformers.Qwen3MoeForCausalLM
else:
    sys.exit(f"make_model: unknown shape {shape!r} (llama8b, qwen3moe30b)")
tok_src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
torch.manual_seed(0)
# Made in bf16 directly: a 30B model made in f32 first would not fit in the GPU's memory.
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = cls(cfg)


def save_split(model, out, shard_bytes=4_000_000_000):
    """The checkpoint save_pretrained writes (per-expert tensors, shards, their index), a tensor at a
    time: transformers 5 keeps a MoE's experts fused (`experts.gate_up_proj` [E, 2I, H],
    `experts.down_proj` [E, H, I]) and its save_pretrained splits them on the GPU all at once, which
    took past an H100's 80 GB for the 48-layer MoE's 57 GiB (2026-12-06). Checked against
    save_pretrained on a 1-layer cut, key for key and bit for bit."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # (as save_pretrained sets them)
    model.config.dtype = next(model.parameters()).dtype
    model.config.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    shards, cur, size, total = [], {}, 0, 0

    def flush():
        nonlocal cur, size
        shards.append(list(cur))  # the names only: the tensors go once written
        save_file(cur, os.path.join(out, f"part-{len(shards)}.tmp"), metadata={"format": "pt"})
        cur, size = {}, 0

    for name, p in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [gate; up] along dim 1, as transformers fuses them
            base, half = name[: -len("gate_up_proj")], p.shape[1] // 2
            items = [(f"{base}{e}.{w}_proj.weight", p[e, :half] if w == "gate" else p[e, half:]) for e in range(p.shape[0]) for w in ("gate", "up")]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            items = [(f"{base}{e}.down_proj.weight", p[e]) for e in range(p.shape[0])]
        else:
            items = [(name, p)]
        for k, t in items:
            t = t.detach().to("cpu").contiguous()
            n = t.numel() * t.element_size()
            if cur and size + n > shard_bytes:
                flush()
            cur[k] = t
            size += n
            total += n
    if cur:
        flush()
    weight_map = {}
    for i, sh in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(out, f"part-{i}.tmp"), os.path.join(out, fname))
        weight_map.update({k: fname for k in sh})
    json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)


# Shards of at most 4 GB, so that little of the model is in host memory at once beside the files:
# the 48-layer MoE's 61 GB go to /dev/shm on a machine of 128 GiB.
if os.environ.get("MAKE_MODEL_SAVE") == "pretrained" or shape != "qwen3moe30b":
    model.save_pretrained(out, safe_serialization=True, max_shard_size="4GB")
else:
    save_split(model, out)
tj = json.load(open(os.path.join(tok_src, "tokenizer.json")))
nxt = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
for i in range(nxt, V):
    tj["model"]["vocab"][f"\u0120pad{i}"] = i
json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"))
shutil.copy(os.path.join(tok_src, "tokenizer_config.json"), out)
n = sum(p.numel() for p in model.parameters())
peak = f", GPU memory at most {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if torch.cuda.is_available() else ""
print(f"make_model: {shape} {n/1e9:.2f}B parameters, {layers} layers, vocab {V} -> {out} in {time.time()-t0:.0f} s{peak}")
