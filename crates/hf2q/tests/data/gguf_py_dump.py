#!/usr/bin/env python3
"""Dump a GGUF file's metadata and tensor table as read by the `gguf` PyPI package (0.19.0),
in the shape of `hf2q info --json --full` (`metadata` and `tensors`), so the two can be compared.

    pip install gguf==0.19.0 numpy
    python3 gguf_py_dump.py MODEL.gguf > expected.json
"""
import json
import math
import sys

import gguf
from gguf import GGUFReader, GGUFValueType

assert gguf.__version__ if hasattr(gguf, "__version__") else True

NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "str",
    GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64", GGUFValueType.FLOAT64: "f64",
}


def type_string(types):
    if types[0] == GGUFValueType.ARRAY:
        return "array[%s]" % (type_string(types[1:]) if len(types) > 1 else "array")
    return NAMES[types[0]]


def clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return [clean(x) for x in v]
    return v


def main(path):
    r = GGUFReader(path)
    metadata = {}
    header = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            header[name] = int(field.parts[-1][0])
            continue
        entry = {"type": type_string(field.types), "value": clean(field.contents())}
        if field.types[0] == GGUFValueType.ARRAY:
            entry["length"] = len(field.data)
        metadata[name] = entry
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(x) for x in t.shape],
            "file_offset": int(t.data_offset),
            "size": int(t.n_bytes),
        }
        for t in r.tensors
    ]
    json.dump({"producer": "gguf %s GGUFReader" % getattr(gguf, "__version__", "0.19.0"), "header": header,
               "metadata": metadata, "tensors": tensors}, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
