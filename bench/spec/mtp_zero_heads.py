"""Copy a qwen35 GGUF (argv: SRC DST [--zero-target-head]) for bench/spec/mtp.sh, with
logit is then 0 and its argmax token 0 (the first largest), whatever the hidden state."""
import sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType

src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst, arch)
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture":
        continue
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        w.add_key_value(k, f.contents(), t, sub_type=f.types[-1])
    else:
        w.add_key_value(k, f.contents(), t)
n_layer = r.fields[f"{arch}.block_count"].contents() - r.fields[f"{arch}.nextn_predict_layers"].contents()
emb = None
for t in r.tensors:
    w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    if t.name == "token_embd.weight":
        emb = np.array(t.data)
w.add_tensor(f"blk.{n_layer}.nextn.shared_head_head.weight", np.zeros_like(emb, dtype=np.float32))
if len(sys.argv) > 3 and sys.argv[3] == "--zero-target-head":
    # the target's own head zero too: it always chooses token 0, and every draft is kept
    w.add_tensor("output.weight", np.zeros_like(emb, dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
