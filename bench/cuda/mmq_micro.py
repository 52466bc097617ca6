"""Decode-product microbenchmark on the GPU machine (CuPy + NVRTC, the compiler the engine uses):
the batch-1 kernels of kernels/mmq.cu (Q4_K, Q6_K, Q8_0 through the tensor cores) and
kernels/matmul.cu (BF16) on the Llama-3.1-8B shapes, timed alone, and variants that leave a stage
out, to tell whether a kernel waits on memory or on its own instructions (METHOD.md: time variants
that leave one stage out, take differences).

usage: python3 bench/cuda/mmq_micro.py [VARIANT,...] [--ncu]   (from the repository root)

Variants (text edits of a copy of the kernel source, compiled here):
  base       the kernel as the engine runs it
  v          the one-row dp4a kernel (mmq_v_*, batch-1 decode); vnoload, vnocompute, vstagesN
             as the variants below on it
  noload     the weight copies (cp.async) left out: the products on whatever shared memory holds
  nocompute  the products left out: the weight copies alone (one byte of each stage read)
  stagesN    N cp.async stages per warp instead of the type's own
Weights are random bytes in each type's tiled layout (the values do not change the work), in enough
copies that each launch reads from DRAM, not L2 (50 MB). Per launch: the mean of 50 launches
captured in a CUDA graph, replayed 4 times (CUDA events), as a decode step runs (call3/micro.txt
timed plain launches, whose ~11-17 µs of Python launch cost hid the small shapes). --ncu: one launch of each base kernel only (for `ncu --section ...`).
"""
import sys
import cupy as cp
import numpy as np

K = "crates/engine/src/backend/cuda/kernels/"
common = open(K + "common.cuh").read() + open(K + "quant.cuh").read()
mmq_src = open(K + "mmq.cu").read()
mmv_src = open(K + "matmul.cu").read()
UB = {"TY_Q4_K": 2304, "TY_Q6_K": 3360, "TY_Q8_0": 4352}
STAGES_LINE = {"TY_Q4_K": "UB = 2304, STAGES = 4;", "TY_Q6_K": "UB = 3360, STAGES = 3;", "TY_Q8_0": "UB = 4352, STAGES = 2;"}


def mmq_module(ty, variant):
    s = mmq_src.split("// ---- Mixture-of-experts decode steps")[0]
    one = f"MMQ_K(mmq_{ty}_1, {ty}, 1, true)" if variant.startswith("v") else f"MMQ(mmq_{ty}, {ty}, 1)"
    s = s.replace("MMQ_ALL(TY_Q4_K)\nMMQ_ALL(TY_Q6_K)\nMMQ_ALL(TY_Q8_0)\n", one + "\n")
    variant = variant[1:] if variant.startswith("v") and variant != "v" else variant
    if variant == "noload":
        s = s.replace("cp_async16(sw + s * Q::UB + 16 * c, src + 16 * c);", ";")
        s = s.replace("cp_async16(dst + 16 * c, src + 16 * c);", ";")
    elif variant == "nocompute":
        for call in ("Q::template unit<NT>(sw + ((u - u0) % Q::STAGES) * Q::UB, x, u, lane, acc);",
                     "Q::unit_v(sw + ((u - u0) % Q::STAGES) * Q::UB, x, u, lane, acc);"):
            s = s.replace(call, "acc[0][0] += (float)sw[((u - u0) % Q::STAGES) * Q::UB + lane];")
    elif variant.startswith("stages"):
        old = STAGES_LINE[ty]
        s = s.replace(old, old.split("STAGES")[0] + "STAGES = " + variant[6:] + ";")
    assert s.count(one) == 1
    return cp.RawModule(code=common + s, options=("--gpu-architecture=sm_90", "--std=c++17"))


def mmv_module(variant):
    s = mmv_src.replace("FOR_EACH_TYPE(MMV_ALL)", "MMV(mmv_TY_BF16, TY_BF16, 1)")
    return cp.RawModule(code=common + s, options=("--gpu-architecture=sm_90", "--std=c++17"))


def time_launches(launch, reps=50, replays=4):
    # The launches captured in a CUDA graph and replayed (as the engine's decode steps run), so
    # Python's launch cost (10-17 µs a launch) is not timed.
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for i in range(5):
            launch(i)
        s.synchronize()
        s.begin_capture()
        for i in range(reps):
            launch(i)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(s)
        for _ in range(replays):
            g.launch(s)
        b.record(s)
        b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / (reps * replays)  # µs


def copies_for(nbytes):
    return max(2, -(-300_000_000 // nbytes))


def run_mmq(ty, variant, shapes, ncu=False):
    try:
        mod = mmq_module(ty, variant)
        f = mod.get_function(f"mmq_{ty}_1")
    except Exception as e:  # a variant past 48 KB of static shared memory does not compile
        print(f"{ty:8} {variant:10} does not compile: {str(e).splitlines()[0][:120]}")
        return
    for name, ms, n in shapes:
        U = n // 256
        n_pad = n
        ws = [m // 16 * U * UB[ty] for m in ms]
        total = sum(ws)
        c = 1 if ncu else copies_for(total)
        W = [[cp.random.randint(0, 256, w, dtype=cp.uint8) for w in ws] for _ in range(c)]
        outs = [cp.zeros(m, dtype=cp.float32) for m in ms]
        qa = cp.random.randint(-127, 128, n_pad, dtype=cp.int8)
        ad = cp.random.random(n_pad // 32, dtype=cp.float32) * 0.01
        nbs = [m // 16 for m in ms]

        def launch(i):
            w = W[i % c]
            args = [qa, ad, np.int32(n_pad), np.int32(U), np.int32(1), np.int32(1)]
            for k in range(3):
                if k < len(ms):
                    args += [w[k], outs[k], np.int32(ms[k])]
                else:
                    args += [w[0], outs[0], np.int32(0)]
                if k < 2:
                    args.append(np.int32(nbs[k] if k < len(ms) else 0))
            f((sum(nbs),), (128,), tuple(args))

        if ncu:
            launch(0)
            cp.cuda.Device().synchronize()
            continue
        us = time_launches(launch)
        print(f"{ty:8} {variant:10} {name:14} {total / 1e6:8.1f} MB {us:8.2f} us {total / us / 1e6:6.2f} TB/s"
              f"  regs {f.num_regs} smem {f.shared_size_bytes}")


def run_bf16(variant, shapes, ncu=False):
    mod = mmv_module(variant)
    f = mod.get_function("mmv_TY_BF16_1")
    for name, m, n in shapes:
        total = m * n * 2
        c = 1 if ncu else copies_for(total)
        W = [cp.random.randint(0, 1 << 14, m * n, dtype=cp.uint16) for _ in range(c)]
        x = cp.random.random(n, dtype=cp.float32)
        out = cp.zeros(m, dtype=cp.float32)

        def launch(i):
            f(((m + 3) // 4,), (128,), (W[i % c], np.uint64(2 * n), x, out, np.int32(n), np.int32(m), np.int32(1), np.int32(1)))

        if ncu:
            launch(0)
            cp.cuda.Device().synchronize()
            continue
        us = time_launches(launch)
        print(f"TY_BF16  {variant:10} {name:14} {total / 1e6:8.1f} MB {us:8.2f} us {total / us / 1e6:6.2f} TB/s  regs {f.num_regs}")


ncu = "--ncu" in sys.argv
# Llama-3.1-8B: q (4096) + k, v (1024 each) in one launch; o 4096 x 4096; gate + up 2 x 14336; down 4096 x 14336.
q4 = [("qkv", [4096, 1024, 1024], 4096), ("o", [4096], 4096), ("gate+up", [14336, 14336], 4096), ("down", [4096], 14336)]
q6 = [("down", [4096], 14336), ("v", [1024], 4096), ("head", [128256], 4096)]
q8 = [("qkv", [4096, 1024, 1024], 4096), ("gate+up", [14336, 14336], 4096), ("down", [4096], 14336)]
if ncu:
    run_mmq("TY_Q4_K", "base", [q4[2]], True)
    run_mmq("TY_Q6_K", "base", [q6[0]], True)
    run_bf16("base", [("gate", 14336, 4096)], True)
    sys.exit(0)
variants = sys.argv[1].split(",") if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else \
    ["base", "noload", "nocompute", "stages2", "stages3", "stages5"]
for v in variants:
    run_mmq("TY_Q4_K", v, q4)
for v in variants:
    if v not in ("stages3", "stages5"):
        run_mmq("TY_Q6_K", v, q6)
for v in variants:
    if not v.startswith("stages"):
        run_mmq("TY_Q8_0", v, q8)
run_bf16("base", [("gate", 14336, 4096), ("down", 4096, 14336), ("q", 4096, 4096)])
