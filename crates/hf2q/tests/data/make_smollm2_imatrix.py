#!/usr/bin/env python3
"""Make smollm2.imatrix.gguf: a llama-imatrix-format importance matrix (random positive in_sum2, counts 7)
for every 2-D weight of SmolLM2-135M-Instruct. Uses the `gguf` PyPI package 0.19.0 and numpy.

    python3 make_smollm2_imatrix.py ~/.cache/hf2q/models/SmolLM2-135M-Instruct.Q4_1.gguf

smollm2_llama_quantize_imatrix.sha256 holds the SHA-256 of the files llama.cpp b11434's llama-quantize
wrote with it, run from the folder holding it (the path is recorded in the output metadata):

    llama-quantize --allow-requantize --imatrix smollm2.imatrix.gguf SmolLM2-135M-Instruct.Q4_1.gguf OUT.gguf TYPE 2
"""
import sys

import gguf
import numpy as np

r = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter("smollm2.imatrix.gguf", arch="llama")
w.add_type("imatrix")
w.add_array("imatrix.datasets", ["hf2q-test-random"])
w.add_uint32("imatrix.chunk_count", 7)
w.add_uint32("imatrix.chunk_size", 512)
rng = np.random.default_rng(20261129)
for t in r.tensors:
    if len(t.shape) >= 2 and t.name.endswith(".weight"):
        ne0 = int(t.shape[0])
        w.add_tensor(t.name + ".in_sum2", (rng.random((1, ne0), dtype=np.float32) * 50 + 0.01).astype(np.float32))
        w.add_tensor(t.name + ".counts", np.array([[7.0]], dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
