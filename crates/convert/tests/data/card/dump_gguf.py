"""Describes a GGUF in the schema of shared/fixtures/tiny/README.md (expected/<model>.<variant>.json)."""
import hashlib, json, struct, sys
from gguf import GGUFReader, GGUFValueType

path, produced_by = sys.argv[1], sys.argv[2]
r = GGUFReader(path)
FMT = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
       GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.UINT64: "<Q",
       GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?"}

def scalar(f, t, i):
    part = f.parts[i]
    if t == GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    v = part[0].item()
    return bool(v) if t == GGUFValueType.BOOL else v

def encode(t, v):
    if t == GGUFValueType.STRING:
        b = v.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    return struct.pack(FMT[t], v)

meta = {}
for f in r.fields.values():
    if f.name.startswith("GGUF."):
        continue
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        et = f.types[1] if len(f.types) > 1 else GGUFValueType.UINT8
        vals = [scalar(f, et, i) for i in f.data]
        e = {"type": "ARRAY", "element_type": et.name, "length": len(vals)}
        if len(vals) <= 64:
            e["value"] = vals
        else:
            e["sha256"] = hashlib.sha256(b"".join(encode(et, v) for v in vals)).hexdigest()
            e["first8"] = vals[:8]
        meta[f.name] = e
    else:
        meta[f.name] = {"type": t.name, "value": scalar(f, t, f.data[0])}
tensors = []
for t in r.tensors:
    data = bytes(r.data[t.data_offset:t.data_offset + t.n_bytes])
    tensors.append({"name": t.name, "type": t.tensor_type.name, "ne": [int(x) for x in t.shape],
                    "offset": int(t.data_offset), "n_bytes": int(t.n_bytes),
                    "sha256": hashlib.sha256(data).hexdigest()})
import os
out = {"gguf_version": 3, "alignment": r.alignment, "tensor_count": len(r.tensors),
       "tensor_data_offset": int(r.data_offset), "file_size": os.path.getsize(path),
       "kv_count": len(meta), "produced_by": produced_by, "metadata": meta, "tensors": tensors,
       "file_sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}
json.dump(out, sys.stdout, indent=1)
print()
