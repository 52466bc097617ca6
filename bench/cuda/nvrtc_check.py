"""Compile hf2q's CUDA modules with NVRTC (no GPU needed) and print each one's log.

usage: python3 bench/cuda/nvrtc_check.py LIBNVRTC [ARCH [MODULE.cu ...]]   (ARCH default sm_90,
       modules default every .cu file); HF2Q_NVRTC_OPTS adds options (e.g. "-Xptxas=-v" for the
       registers, shared memory and spills of each kernel)
The backend compiles the same sources the same way at run time (common.cuh + quant.cuh + module).
"""
import ctypes, os, sys, pathlib

lib = ctypes.CDLL(sys.argv[1])
arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
k = pathlib.Path(__file__).resolve().parents[2] / "crates/engine/src/backend/cuda/kernels"
head = (k / "common.cuh").read_text() + (k / "quant.cuh").read_text()
ok = True
mods = sys.argv[3:] or sorted(p.name for p in k.glob("*.cu"))
for mod in mods:
    src = (head + (k / mod).read_text()).encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, mod.encode(), 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"] + [o.encode() for o in os.environ.get("HF2Q_NVRTC_OPTS", "").split()]
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
        print(log.value.decode()[: int(os.environ.get("HF2Q_NVRTC_LOG", "4000"))])
    ok &= rc == 0
sys.exit(0 if ok else 1)
