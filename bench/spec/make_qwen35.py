"""Random-initialised Qwen 3.5 dense text model of Qwen3.5-0.8B's published shape, as an HF
directory, written with numpy alone (no torch/transformers), for CPU speed runs against llama.cpp.

usage: python3 bench/spec/make_qwen35.py OUT_DIR [LAYERS]

Shape (Qwen3.5-0.8B model card): hidden 1024, 24 layers laid out 6 x (3 Gated DeltaNet + 1 gated
attention), FFN 3584, gated attention 8 Q / 2 KV heads of dim 256 with rotary dim 64
(partial_rotary_factor 0.25, interleaved M-RoPE [11, 11, 10], theta 1e7), Gated DeltaNet 16 QK / 16 V
heads of dim 128 with conv kernel 4, vocabulary 248320, tied embeddings. The MTP layer and the
vision tower are left out (text-only Qwen3_5ForCausalLM, as the tiny fixture).

Config format, tensor names and tokenizer: the tiny fixture fixtures/tiny/qwen3_5_text ($FIXTURE
or /work/shared/fixtures/tiny/qwen3_5_text); its byte-level BPE vocabulary is padded with
unreachable tokens up to 248320 (as bench/cuda/make_model.py does), so every tensor has the real
model's shape. Weights in bf16: matrices normal(0, 0.02); the (1 + w) RMSNorm weights normal(0, 0.1)
as the fixture; the DeltaNet gated norm 1 + normal(0, 0.1); A_log = log(uniform(1, 16)); dt_bias
1 + normal(0, 0.02). Seeded, so the same bytes each run.
"""
import json, os, shutil, struct, sys, time
import numpy as np

out = sys.argv[1]
L = int(sys.argv[2]) if len(sys.argv) > 2 else 24
fix = os.environ.get("FIXTURE", "/work/shared/fixtures/tiny/qwen3_5_text")
H, FF, V = 1024, 3584, 248320
NH, NKV, HD = 8, 2, 256
LK, LV, LKD, LVD, KCONV = 16, 16, 128, 128, 4
types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)]

t0 = time.time()
os.makedirs(out, exist_ok=True)
cfg = json.load(open(os.path.join(fix, "config.json")))
cfg.update({
    "hidden_size": H, "intermediate_size": FF, "num_hidden_layers": L, "layer_types": types,
    "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
    "linear_num_key_heads": LK, "linear_num_value_heads": LV, "linear_key_head_dim": LKD,
    "linear_value_head_dim": LVD, "linear_conv_kernel_dim": KCONV, "vocab_size": V,
    "tie_word_embeddings": True,
})
cfg["rope_parameters"].update({"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                               "partial_rotary_factor": 0.25, "rope_theta": 10000000.0})
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
for f in ("generation_config.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(fix, f), out)
tj = json.load(open(os.path.join(fix, "tokenizer.json")))
nxt = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
for i in range(nxt, V):
    tj["model"]["vocab"][f"\u0120pad{i}"] = i
json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"))

# name -> (shape, kind)
T = {"model.embed_tokens.weight": ((V, H), "w"), "model.norm.weight": ((H,), "n0")}
qkv = 2 * LK * LKD + LV * LVD
for i, t in enumerate(types):
    p = f"model.layers.{i}."
    T[p + "input_layernorm.weight"] = ((H,), "n0")
    T[p + "post_attention_layernorm.weight"] = ((H,), "n0")
    T[p + "mlp.gate_proj.weight"] = ((FF, H), "w")
    T[p + "mlp.up_proj.weight"] = ((FF, H), "w")
    T[p + "mlp.down_proj.weight"] = ((H, FF), "w")
    if t == "linear_attention":
        a = p + "linear_attn."
        T[a + "in_proj_qkv.weight"] = ((qkv, H), "w")
        T[a + "in_proj_z.weight"] = ((LV * LVD, H), "w")
        T[a + "in_proj_a.weight"] = ((LV, H), "w")
        T[a + "in_proj_b.weight"] = ((LV, H), "w")
        T[a + "conv1d.weight"] = ((qkv, 1, KCONV), "w")
        T[a + "out_proj.weight"] = ((H, LV * LVD), "w")
        T[a + "norm.weight"] = ((LVD,), "n1")
        T[a + "A_log"] = ((LV,), "alog")
        T[a + "dt_bias"] = ((LV,), "dt")
    else:
        a = p + "self_attn."
        T[a + "q_proj.weight"] = ((2 * NH * HD, H), "w")  # query and its output gate
        T[a + "k_proj.weight"] = ((NKV * HD, H), "w")
        T[a + "v_proj.weight"] = ((NKV * HD, H), "w")
        T[a + "o_proj.weight"] = ((H, NH * HD), "w")
        T[a + "q_norm.weight"] = ((HD,), "n0")
        T[a + "k_norm.weight"] = ((HD,), "n0")

names = sorted(T)
hdr, off = {"__metadata__": {"format": "pt"}}, 0
for n in names:
    size = 2 * int(np.prod(T[n][0]))
    hdr[n] = {"dtype": "BF16", "shape": list(T[n][0]), "data_offsets": [off, off + size]}
    off += size
hb = json.dumps(hdr, separators=(",", ":")).encode()
hb += b" " * (-len(hb) % 8)

def bf16(x):  # float32 -> bf16 bits, round to nearest even
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

rng = np.random.default_rng(0)
nparams = 0
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb)
    for n in names:
        shape, kind = T[n]
        nparams += int(np.prod(shape))
        if kind == "w":
            rows = shape[0]
            step = max(1, (1 << 24) // int(np.prod(shape[1:])))
            for r in range(0, rows, step):  # in slices, to keep memory small
                sub = (min(step, rows - r),) + shape[1:]
                f.write(bf16(rng.standard_normal(sub, dtype=np.float32) * 0.02).tobytes())
            continue
        if kind == "n0":
            x = rng.standard_normal(shape, dtype=np.float32) * 0.1
        elif kind == "n1":
            x = 1 + rng.standard_normal(shape, dtype=np.float32) * 0.1
        elif kind == "alog":
            x = np.log(rng.uniform(1, 16, shape)).astype(np.float32)
        else:
            x = 1 + rng.standard_normal(shape, dtype=np.float32) * 0.02
        f.write(bf16(x).tobytes())
print(f"make_qwen35: {nparams/1e6:.0f}M parameters, {L} layers ({types.count('full_attention')} full attention), "
      f"vocab {V} -> {out} in {time.time()-t0:.0f} s")
