"""Compile hf2q's CUDA modules with NVRTC (no GPU needed) and print each one's log.

usage: python3 bench/cuda/nvrtc_check.py LIBNVRTC [ARCH]   (ARCH default sm_90)
The backend compiles the same sources the same way at run time (common.cuh + quant.cuh + module).
"""
import ctypes, sys, pathlib

lib = ctypes.CDLL(sys.argv[1])
arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
k = pathlib.Path(__file__).resolve().parents[2] / "crates/engine/src/backend/cuda/kernels"
head = (k / "common.cuh").read_text() + (k / "quant.cuh").read_text()
ok = True
for mod in ["ops.cu", "matmul.cu", "attention.cu"]:
    src = (head + (k / mod).read_text()).encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, mod.encode(), 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    size = ctypes.c_size_t()
    if rc == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    print(f"{mod}: rc={rc} cubin={size.value} bytes")
    if log.value.strip():
        print(log.value.decode()[:4000])
    ok &= rc == 0
sys.exit(0 if ok else 1)
