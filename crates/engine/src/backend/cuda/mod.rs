//! The CUDA backend: weights uploaded once in their GGUF types, activations as f32 matrices in
//! device memory, the paged KV cache in device memory (`kv.rs`), every op a kernel of
//! `kernels/*.cu` compiled by NVRTC at first use (`compile.rs`). All work goes to one stream in
//! order; only `read` (logits, embeddings) waits for the device.
//!
//! The CUDA libraries are loaded at run time (cudarc's dynamic loading), so this backend is in
//! every build and a machine without a GPU gets [`Cuda::new`]'s error, never a crash.

mod attn;
mod compile;
mod dev;
mod feed;
mod fused;
mod gemm;
mod kv;
mod mmq;
mod moe;
mod products;
mod prof;
mod recurrent;
mod sample;

pub use fused::Fused;
pub use kv::{CudaKv, GpuPage};

use dev::{blocks, Dev, StepArgs, A};
use mmq::{mmq_fits, mmq_on, MMQ_MOE_NT, MMQ_NT, MMQ_TYPES};

use super::{
    AttnLayer, Backend, Deferred, DeltaNetLayer, KvType, Norm, QkNorm, Rope, StepPlan, Top, TopAsk, WeightSource, FED,
};
use crate::model::blocks::Glu;
use crate::{EngineError, Result};
use cudarc::driver::CudaSlice;
use gguf::GgmlType;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Activation rows the matrix-vector kernels take at once (one decoded weight, many rows).
const MMV_ROWS: [usize; 4] = [1, 2, 4, 8];
/// Weight types with device decoders (the rest are decoded to F16 on the host at load).
const DEVICE_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];
/// Most f16 values of a decoded weight chunk (the rest of a larger matrix is decoded in turns).
const DECODE_CHUNK: usize = 64 << 20;

/// The kernels' widest head (attention keeps a head in registers).
const MAX_HEAD_DIM: usize = 512;
/// The kernels' name for a weight type (`kernels/quant.cuh`).
fn ty_name(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::F32 => "TY_F32",
        GgmlType::F16 => "TY_F16",
        GgmlType::BF16 => "TY_BF16",
        GgmlType::Q4_0 => "TY_Q4_0",
        GgmlType::Q4_1 => "TY_Q4_1",
        GgmlType::Q5_0 => "TY_Q5_0",
        GgmlType::Q5_1 => "TY_Q5_1",
        GgmlType::Q8_0 => "TY_Q8_0",
        GgmlType::Q2_K => "TY_Q2_K",
        GgmlType::Q3_K => "TY_Q3_K",
        GgmlType::Q4_K => "TY_Q4_K",
        GgmlType::Q5_K => "TY_Q5_K",
        GgmlType::Q6_K => "TY_Q6_K",
        GgmlType::IQ4_NL => "TY_IQ4_NL",
        GgmlType::IQ4_XS => "TY_IQ4_XS",
        GgmlType::MXFP4 => "TY_MXFP4",
        _ => unreachable!("only DEVICE_TYPES reach the kernels"),
    }
}

/// The CUDA backend on one device.
pub struct Cuda {
    dev: Arc<Dev>,
    /// The activations whose quantized form the activation scratch holds, from a fused rms_norm
    /// or GLU: (address, rows, columns, the launch count right after it); good only for the next
    /// launch.
    q8_of: Mutex<Option<(u64, usize, usize, u64)>>,
    /// Scratch of the MoE steps taken on the device (`moe.rs`), and each MoE layer's expert
    /// tables (keyed by its router's address).
    moe_scratch: Mutex<Option<CudaSlice<f32>>>,
    moe_tables: Mutex<Vec<(u64, moe::ExpertTables)>>,
    /// `rope_store_kv` in one launch instead of `rope` and `store_kv` (`HF2Q_CUDA_ROPE_STORE=0`: two;
    /// on an H200 one saved 56 µs of an 8B Q4_K_M decode step: cuda-session5 call 12).
    rope_store: bool,
    /// Q4_K's one-row products of at most this many blocks take `mmq_v5_*` (four units in flight a
    /// warp, not three; in a launch with Q6_K weights, `mmq_vx5_*`, counting all its blocks):
    /// `HF2Q_CUDA_MMQ_V5=N` (0: never). 400 by default: on an H200 the 8B
    /// Q4_K_M's step took 2,378 µs against 2,441 µs without it and 2,477 µs with it for every
    /// launch (bench/runs/2026-12-04-h200/cuda-session6, call 2).
    mmq_v5_blocks: u32,
    /// A MoE step's one-row expert products through kernels with only the stages their warps'
    /// units need and more blocks a multiprocessor (`mmq_moe_v2_*`, `mmq_moe_v3_*`; the same
    /// bits). On by default: MoE tg128 1.020× on an H100 (bench/runs/2026-12-06-h100 call 4);
    /// `HF2Q_CUDA_MOE_LEAN=0` or `with_moe_lean(false)` for `mmq_moe_v_*`.
    moe_lean: bool,
    /// Launches of the lean kernels so far (for the op tests).
    moe_lean_n: std::sync::atomic::AtomicUsize,
    /// Decode attention over F16 caches through `attn_dec_f16` (`HF2Q_CUDA_ATTN_DEC=0`: through
    /// `attn_split_f16`, its keys loaded one after another).
    attn_dec: bool,
    /// Query heads of a KV head split over this many blocks in `attn_dec_f16(_rope)`
    /// (`HF2Q_CUDA_ATTN_HG=N`, N dividing the query heads a KV head; 1: a block takes them all;
    /// 0, the default: `head_groups`): more blocks a split, each with fewer heads' work after the
    /// wait, the same bits. On the MoE's 8-layer cut (8 query heads a KV head) tg128 2,179.7 t/s
    /// with 8 against 2,060.4 before the change and 1,903.2 with 1 (H200,
    /// bench/runs/2026-12-06-h200-b call 1).
    attn_hg: usize,
    /// Which launch-saving variants (`Fused`) are on: `with_fused`, or each one's variable
    /// (`Fused::var`) set to 1 (0). All but SumNorm off by default: each measured slower on an
    /// H100 (tg128, median of two: the MoE 0.94× / 0.99× / 0.98× / 0.98× / 0.83× for AttnMerge /
    /// Route / Glu / GluDown / RouteIn, the 8B BF16 0.99× / 0.77× for AttnMerge / Add;
    /// bench/runs/2026-12-05-h100 call 2, 2026-12-05-h100-b call 2); SumNorm 1.012×.
    fuse: [bool; 8],
    /// `Backend::top_of_rows` on the GPU (`top_rows`: the values asked for cross to the host,
    /// not the rows); `HF2Q_CUDA_TOPK=0` or `with_tops(false)` reads the rows instead. On an
    /// H100, 64 streams of top_k 40: 1,528.6 against 1,033.0 tokens/s (2026-12-05-h100, call 5).
    tops: bool,
    /// `Backend::sample_rows` on the GPU (`sample_rows`: only the tokens cross to the host);
    /// `HF2Q_CUDA_SAMPLE=0` or `with_draws(false)` draws on the host from the rows read back. On
    /// an H100, 16 / 64 streams sampling the whole vocabulary: 1,179.9 / 1,501.4 against 603.6 /
    /// 810.7 tokens/s, the same seeded tokens (2026-12-05-h100, call 5).
    draws: bool,
    /// Launches so far that did another's work too (`Fused`; for the op tests).
    fused: [std::sync::atomic::AtomicUsize; 8],
    /// Most warps per output row of the matrix-vector kernels (`warps_per_row`; not for a matrix
    /// of at most 256 rows):
    /// `HF2Q_CUDA_WPR=1|2|4`, 1 by default: on an H200 the 8B BF16's tg128 was 221.8 tokens/s at 1
    /// against 219.2 at 2 and 218.9 at 4 (bench/runs/2026-12-04-h200/cuda-session8, call 7).
    wpr_cap: usize,
    /// The float weights' plain matrix-vector products of one warp a row (matrices of more than
    /// 256 rows at the default cap) with a warp per pair of rows instead (`mmv_TYp`:
    /// each activation loaded once for two rows; each row summed as alone); `HF2Q_CUDA_MMV_PAIR=0`
    /// or `with_pairs(false)`: a warp per row. 8B BF16 tg128: on an H100 174.80 against 172.11
    /// tokens/s (1.016×, bench/runs/2026-12-05-h100-e), on an H200 230.89 against 224.72 (1.027×,
    /// bench/runs/2026-12-05-h200-b). (Pairs in the fused FFN input too measured no faster on an
    /// H100: 2026-12-05-h100-e call 3.)
    pairs: bool,
}

/// Whether a usable GPU and NVRTC are present, and what `Cuda::new` would report (for `doctor`).
pub fn check(ordinal: usize) -> Result<String> {
    let c = Cuda::new(ordinal)?;
    let (free, total) = c
        .dev
        .ctx
        .mem_get_info()
        .map_err(|e| EngineError::Backend(format!("CUDA memory info: {e}")))?;
    Ok(format!(
        "{}: {} kernels in {} modules ({} compiled now, the rest from the cache); NVRTC {}; {:.1} of {:.1} GiB free",
        c.dev.name,
        c.dev.kernels.funcs.len(),
        compile::MODULES.len(),
        c.dev.compiled,
        compile::preload_nvrtc().unwrap_or_default(),
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    ))
}

impl Cuda {
    /// The backend on GPU `ordinal`: opens the device and compiles (or loads) the kernels.
    pub fn new(ordinal: usize) -> Result<Cuda> {
        Ok(Cuda {
            dev: Arc::new(Dev::open(ordinal)?),
            q8_of: Mutex::new(None),
            moe_scratch: Mutex::new(None),
            moe_tables: Mutex::new(Vec::new()),
            rope_store: std::env::var("HF2Q_CUDA_ROPE_STORE").map_or(true, |v| v != "0"),
            mmq_v5_blocks: std::env::var("HF2Q_CUDA_MMQ_V5")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(400),
            attn_dec: std::env::var("HF2Q_CUDA_ATTN_DEC").map_or(true, |v| v != "0"),
            attn_hg: std::env::var("HF2Q_CUDA_ATTN_HG")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            moe_lean: std::env::var("HF2Q_CUDA_MOE_LEAN").map_or(true, |v| v != "0"),
            moe_lean_n: Default::default(),
            fuse: Fused::ALL.map(|k| std::env::var(k.var()).map_or(k.default_on(), |v| v == "1")),
            tops: std::env::var("HF2Q_CUDA_TOPK").map_or(true, |v| v != "0"),
            draws: std::env::var("HF2Q_CUDA_SAMPLE").map_or(true, |v| v != "0"),
            fused: Default::default(),
            wpr_cap: std::env::var("HF2Q_CUDA_WPR")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|v| [1, 2, 4].contains(v))
                .unwrap_or(1),
            pairs: std::env::var("HF2Q_CUDA_MMV_PAIR").map_or(true, |v| v != "0"),
        })
    }

    /// The float weights' plain products with a warp per pair of rows, or per row.
    pub fn with_pairs(mut self, on: bool) -> Cuda {
        self.pairs = on;
        self
    }

    /// The matrix-vector kernels' warps per output row capped at `cap` (1, 2 or 4).
    pub fn with_wpr_cap(mut self, cap: usize) -> Cuda {
        assert!([1, 2, 4].contains(&cap), "warps per row: 1, 2 or 4, not {cap}");
        self.wpr_cap = cap;
        self
    }

    /// Decode attention over F16 caches through `attn_dec_f16` or `attn_split_f16`.
    pub fn with_attn_dec(mut self, on: bool) -> Cuda {
        self.attn_dec = on;
        self
    }

    /// `attn_dec_f16`'s query heads of a KV head split over `hg` blocks (where `hg` divides them;
    /// otherwise one block takes them all; 0: the choice of `attn.rs`'s `head_groups`).
    pub fn with_attn_hg(mut self, hg: usize) -> Cuda {
        self.attn_hg = hg;
        self
    }

    /// `Backend::top_of_rows` on the GPU or on the host.
    pub fn with_tops(mut self, on: bool) -> Cuda {
        self.tops = on;
        self
    }

    /// `Backend::sample_rows` on the GPU or on the host.
    pub fn with_draws(mut self, on: bool) -> Cuda {
        self.draws = on;
        self
    }

    /// A launch-saving variant on or off.
    pub fn with_fused(mut self, kind: Fused, on: bool) -> Cuda {
        self.fuse[kind as usize] = on;
        self
    }

    fn fuse_on(&self, kind: Fused) -> bool {
        self.fuse[kind as usize]
    }

    /// Launches so far that did another's work too, of each kind.
    pub fn fused(&self, kind: Fused) -> usize {
        self.fused[kind as usize].load(Ordering::Relaxed)
    }

    fn count_fused(&self, kind: Fused) {
        self.fused[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Rope and KV store fused into one launch (`Backend::rope_store_kv`) or not.
    pub fn with_rope_store(mut self, on: bool) -> Cuda {
        self.rope_store = on;
        self
    }

    /// Q4_K's one-row products through `mmq_v5_*` for launches of at most `blocks` blocks.
    pub fn with_mmq_v5(mut self, blocks: u32) -> Cuda {
        self.mmq_v5_blocks = blocks;
        self
    }

    /// A MoE step's one-row expert products through the lean kernels (`moe_lean`) or not.
    pub fn with_moe_lean(mut self, on: bool) -> Cuda {
        self.moe_lean = on;
        self
    }

    /// Launches of the lean kernels so far.
    pub fn moe_lean_launches(&self) -> usize {
        self.moe_lean_n.load(Ordering::Relaxed)
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.dev
            .ctx
            .mem_get_info()
            .map_err(|e| EngineError::Backend(format!("CUDA memory info: {e}")))
    }
}

pub struct CudaWeight {
    data: CudaSlice<u8>,
    /// The GGUF type (what `weight_type` reports).
    ty: GgmlType,
    /// The type the device holds (`ty`, or F16/F32 where decoded at load).
    dev_ty: GgmlType,
    shape: Vec<u64>,
    row_bytes: usize,
    /// `data` holds the integer kernels' tiled layout (`kernels/mmq.cu`) instead of GGUF rows: a
    /// weight that is only ever multiplied.
    tiled: bool,
    /// The tiled layout of a weight whose `data` stays in GGUF rows (a tied embedding, also looked
    /// up by row), made at its first product.
    tiled_copy: std::sync::OnceLock<CudaSlice<u8>>,
}

impl CudaWeight {
    fn row_len(&self) -> usize {
        self.shape[0] as usize
    }
    fn n_rows(&self) -> usize {
        self.shape.iter().skip(1).product::<u64>() as usize
    }
}

pub struct CudaBuf {
    /// Device address of the values (kernels take raw addresses).
    ptr: u64,
    /// The allocation; on drop it waits in the device's graveyard until the launches that may
    /// still use it have been issued (launches are recorded and issued in batches, see `Dev::flush`).
    mem: Option<CudaSlice<f32>>,
    dev: Arc<Dev>,
    cap: usize,
    rows: usize,
    cols: usize,
    /// As `CpuBuf::runs`.
    runs: Arc<[usize]>,
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.dev.bury(Box::new(m));
        }
    }
}

impl CudaBuf {
    fn set_shape(&mut self, rows: usize, cols: usize) {
        assert!(
            rows * cols <= self.cap,
            "buffer of {} values cannot hold {rows}x{cols}",
            self.cap
        );
        self.rows = rows;
        self.cols = cols;
        self.runs = Arc::from([]);
    }
    fn shape_from(&mut self, rows: usize, runs: &Arc<[usize]>, cols: usize) {
        self.set_shape(rows, cols);
        self.runs = runs.clone();
    }
    fn len(&self) -> u64 {
        (self.rows * self.cols) as u64
    }
}

/// A step on the device: its row and sequence tables, the page table of its caches, and the
/// rotary tables of its positions (made on first use per rope, as the CPU's).
pub struct CudaStep {
    plan: StepPlan,
    ids: u64,
    ptab_host: Mutex<Vec<u64>>,
    ptab: u64,
    args: StepArgs,
    rope: Mutex<Vec<(Rope, u64)>>,
    /// Each row's index among the split-K attention rows (-1: not one) on the device, and their
    /// count; made by the step's first attention.
    split: Mutex<Option<(u64, usize)>>,
    /// Flash attention's tiles (first row, rows) on the device and their count, for the rows
    /// split-K attention does not take (with / without it): made by the step's first attention.
    fa_tiles: Mutex<[Option<(u64, usize)>; 2]>,
    /// Where `FED` ids take their tokens: the last deferred argmax's output on the device, its
    /// rows and the row length it was taken over.
    fed: Option<(u64, usize, usize)>,
}

impl Backend for Cuda {
    type Weight = CudaWeight;
    type Buf = CudaBuf;
    type Kv = CudaKv;
    type Page = Arc<GpuPage>;
    type Step = CudaStep;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.dev.ordinal, self.dev.name)
    }

    fn prefill_chunk(&self) -> usize {
        // Measured on an H200 (bench/runs/2026-12-02-h200/cuda-batched): 512 gives 16 streams of
        // 512-token prompts a lower time to first token than llama-server's.
        512
    }

    fn threads(&self) -> usize {
        1
    }

    fn spec_by_default(&self) -> bool {
        // Measured on an H200 (bench/runs/2026-12-03-h200/cuda-session4 call 3, SmolLM2 Q8_0,
        // greedy, same bytes with and without): n-gram drafts 5.41x on the quoting task and
        // 1.31-2.03x on chat prompts, where a decode step's time is mostly fixed costs that a
        // check of 17 rows shares.
        true
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.dev
            .ctx
            .bind_to_thread()
            .unwrap_or_else(|e| self.dev.fail("binding the context", e));
        f()
    }

    fn reserve_weights(&self, bytes: u64, what: &str) -> Result<()> {
        let (free, total) = self.memory()?;
        // Room for activations and the first KV pages besides the weights.
        let margin = 512u64 << 20;
        if bytes + margin > free as u64 {
            return Err(EngineError::Input(format!(
                "{what}: the weights need {:.2} GiB (+{:.1} GiB for activations) of GPU memory but cuda:{} has {:.2} GiB free of {:.2} GiB",
                bytes as f64 / (1u64 << 30) as f64,
                margin as f64 / (1u64 << 30) as f64,
                self.dev.ordinal,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            )));
        }
        Ok(())
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CudaWeight> {
        let bad = |why: String| EngineError::Model(format!("tensor {}: {why}", src.name));
        let n = src.shape.first().copied().unwrap_or(1);
        let expect = src
            .ty
            .row_bytes(n)
            .and_then(|r| src.shape.iter().skip(1).try_fold(r, |a, &d| a.checked_mul(d)));
        if expect != Some(src.data.len() as u64) {
            return Err(bad(format!(
                "{} bytes of data for shape {:?} of {}",
                src.data.len(),
                src.shape,
                src.ty.name()
            )));
        }
        let one_d = src.shape.iter().skip(1).all(|&d| d == 1);
        let decode = |ty: GgmlType| -> Result<Vec<f32>> {
            let codec = quant::codec(ty).ok_or_else(|| bad(format!("cannot decode type {}", ty.name())))?;
            let mut v = vec![0f32; src.data.len() / ty.row_bytes(n).unwrap_or(1).max(1) as usize * n as usize];
            (codec.dequantize)(src.data, &mut v);
            Ok(v)
        };
        // Vectors (norms, biases, rope factors) as f32; matrices in their own type where the
        // kernels decode it, else decoded to F16 here.
        let (dev_ty, bytes): (GgmlType, Vec<u8>) = if one_d && src.ty != GgmlType::F32 {
            (
                GgmlType::F32,
                decode(src.ty)?.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        } else if DEVICE_TYPES.contains(&src.ty) {
            (src.ty, Vec::new())
        } else {
            let v = decode(src.ty)?;
            (
                GgmlType::F16,
                v.iter().flat_map(|&x| quant::fp::f32_to_f16(x).to_le_bytes()).collect(),
            )
        };
        let host: &[u8] = if bytes.is_empty() { src.data } else { &bytes };
        let mut data = self.dev.alloc_bytes(host.len()).map_err(|e| {
            EngineError::Backend(format!(
                "GPU memory for tensor {} ({} bytes): {e}",
                src.name,
                host.len()
            ))
        })?;
        self.dev
            .stream
            .memcpy_htod(host, &mut data)
            .map_err(|e| EngineError::Backend(format!("uploading tensor {}: {e}", src.name)))?;
        let mut w = CudaWeight {
            data,
            ty: src.ty,
            dev_ty,
            shape: src.shape.to_vec(),
            row_bytes: dev_ty.row_bytes(n).unwrap_or(0) as usize,
            tiled: false,
            tiled_copy: std::sync::OnceLock::new(),
        };
        if src.matmul_only && !one_d && mmq_fits(dev_ty, n as usize) {
            // Only ever multiplied: kept in the integer kernels' layout alone.
            let tiled = self
                .tile(&w)
                .map_err(|e| EngineError::Backend(format!("GPU memory for the tiled tensor {}: {e}", src.name)))?;
            self.dev.bury(Box::new(std::mem::replace(&mut w.data, tiled)));
            // Issued now: the GGUF rows are freed (in stream order) before the next tensor loads.
            self.dev.flush();
            w.tiled = true;
        }
        Ok(w)
    }

    fn weight_type(&self, w: &CudaWeight) -> GgmlType {
        w.ty
    }

    fn weight_shape<'a>(&self, w: &'a CudaWeight) -> &'a [u64] {
        &w.shape
    }

    fn alloc(&self, rows: usize, cols: usize) -> CudaBuf {
        let mem = self.dev.alloc_f32(rows * cols);
        CudaBuf {
            ptr: self.dev.ptr(&mem),
            mem: Some(mem),
            dev: self.dev.clone(),
            cap: rows * cols,
            rows,
            cols,
            runs: Arc::from([]),
        }
    }

    fn shape(&self, b: &CudaBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn alloc_kv(&self, layers: &[crate::model::KvLayer], n_ctx: usize, ty: KvType) -> Result<CudaKv> {
        CudaKv::new(&self.dev, layers, n_ctx, ty)
    }

    fn kv_sibling(&self, kv: &CudaKv, n_ctx: usize) -> CudaKv {
        kv.sibling(n_ctx)
    }

    fn kv_capacity(&self, kv: &CudaKv) -> usize {
        kv.capacity()
    }

    fn kv_reserve(&self, kv: &mut CudaKv, positions: usize) -> Result<()> {
        kv.reserve(positions)
    }

    fn kv_release(&self, kv: &mut CudaKv, positions: usize) {
        kv.release(positions)
    }

    fn kv_page_shared(&self, kv: &CudaKv, block: usize) -> bool {
        kv.page_shared(block)
    }

    fn kv_page_bytes(&self, kv: &CudaKv) -> usize {
        kv.page_bytes()
    }

    fn kv_live_pages(&self, kv: &CudaKv) -> usize {
        kv.live_pages()
    }

    fn kv_page(&self, kv: &CudaKv, block: usize) -> Arc<GpuPage> {
        kv.page(block)
    }

    fn kv_map(&self, kv: &mut CudaKv, block: usize, page: &Arc<GpuPage>) -> Result<()> {
        kv.map(block, page)
    }

    fn page_data(&self, page: &Arc<GpuPage>) -> Vec<u8> {
        kv::page_data(page)
    }

    fn kv_import(&self, kv: &mut CudaKv, pos0: usize, data: &[u8]) -> Result<()> {
        kv.import(pos0, data)
    }

    fn kv_state_pos(&self, kv: &CudaKv) -> Option<usize> {
        kv.state_pos()
    }

    fn kv_restore(&self, kv: &mut CudaKv, positions: usize) -> usize {
        kv.restore(positions)
    }

    fn kv_keep_states(&self, kv: &mut CudaKv, positions: &[usize]) {
        kv.keep_states(positions)
    }

    fn kv_state_bytes(&self, kv: &CudaKv) -> usize {
        kv.state_bytes()
    }

    fn kv_drop_copies(&self, kv: &mut CudaKv) {
        kv.drop_copies()
    }

    fn begin_step(&self, plan: StepPlan, kvs: &[&CudaKv]) -> Result<CudaStep> {
        let rows: usize = plan.seqs.iter().map(|s| s.rows).sum();
        if plan.ids.len() != rows || plan.positions.len() != rows || !(kvs.is_empty() || kvs.len() == plan.seqs.len()) {
            return Err(EngineError::Backend(format!(
                "a step of {} ids, {} positions and {} caches for {} sequences of {rows} rows",
                plan.ids.len(),
                plan.positions.len(),
                kvs.len(),
                plan.seqs.len()
            )));
        }
        let s = plan.seqs.len();
        self.dev.new_step();
        // One table: row_seq[rows], row_pos[rows], seq_pos0[s], seq_rows[s], poff[s].
        let mut t: Vec<i32> = Vec::with_capacity(2 * rows + 3 * s);
        for (i, q) in plan.seqs.iter().enumerate() {
            t.extend(std::iter::repeat_n(i as i32, q.rows));
        }
        t.extend(plan.positions.iter().map(|&p| p as i32));
        t.extend(plan.seqs.iter().map(|q| q.pos0 as i32));
        t.extend(plan.seqs.iter().map(|q| q.rows as i32));
        let mut ptab_host = Vec::new();
        for kv in kvs {
            t.push(ptab_host.len() as i32);
            ptab_host.extend(kv.pages.iter().map(|p| p.ptr));
        }
        if kvs.is_empty() {
            t.extend(std::iter::repeat_n(0, s));
        }
        let fed = match plan
            .ids
            .iter()
            .filter(|&&id| id & FED != 0)
            .map(|&id| (id & !FED) as usize)
            .max()
        {
            None => None,
            Some(k) => match self.dev.feed().last {
                Some(last) if k < last.1 => Some(last),
                _ => {
                    return Err(EngineError::Input(format!(
                        "a step takes token {k} of the last deferred argmax, which made fewer"
                    )))
                }
            },
        };
        let base = self.dev.upload(&t);
        let ids = self.dev.upload(&plan.ids);
        let ptab = self.dev.upload(&ptab_host);
        let at = |i: usize| base + 4 * i as u64;
        let args = StepArgs {
            row_seq: at(0),
            row_pos: at(rows),
            seq_pos0: at(2 * rows),
            seq_rows: at(2 * rows + s),
            poff: at(2 * rows + 2 * s),
            ptab,
        };
        Ok(CudaStep {
            plan,
            ids,
            ptab_host: Mutex::new(ptab_host),
            ptab,
            args,
            rope: Mutex::new(Vec::new()),
            split: Mutex::new(None),
            fa_tiles: Mutex::new([None, None]),
            fed,
        })
    }

    fn embed(&self, table: &CudaWeight, step: &CudaStep, out: &mut CudaBuf) -> Result<()> {
        let rows = table.n_rows();
        if let Some(&id) = step.plan.ids.iter().find(|&&id| id & FED == 0 && id as usize >= rows) {
            return Err(EngineError::Input(format!(
                "token id {id} is outside the vocabulary of {rows} tokens"
            )));
        }
        let fed = match step.fed {
            Some((_, _, cols)) if cols > rows => {
                return Err(EngineError::Input(format!(
                    "tokens fed from logits of {cols} columns to an embedding of {rows} rows"
                )))
            }
            Some((ptr, _, _)) => ptr,
            None => 0,
        };
        self.gather(table, step.ids, fed, step.plan.ids.len(), out);
        out.runs = Arc::from(step.plan.row_runs());
        Ok(())
    }

    fn get_rows(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaBuf) -> Result<()> {
        let rows = table.n_rows();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= rows) {
            return Err(EngineError::Input(format!(
                "token id {id} is outside the vocabulary of {rows} tokens"
            )));
        }
        let dev_ids = self.dev.upload(ids);
        self.gather(table, dev_ids, 0, ids.len(), out);
        Ok(())
    }

    fn split_cols(&self, x: &CudaBuf, outs: &mut [(usize, &mut CudaBuf)], width: usize) {
        for (off, out) in outs.iter_mut() {
            assert!(
                *off + width <= x.cols,
                "split_cols: columns {off}..{} of {}",
                *off + width,
                x.cols
            );
            out.shape_from(x.rows, &x.runs, width);
            let n = (x.rows * width) as u64;
            self.dev.launch(
                "split_cols",
                (blocks(n, 256), 1),
                256,
                &[
                    A::P(x.ptr),
                    A::P(out.ptr),
                    A::I(x.rows as i32),
                    A::I(x.cols as i32),
                    A::I(*off as i32),
                    A::I(width as i32),
                ],
            );
        }
    }

    fn select_rows(&self, x: &CudaBuf, rows: &[usize], out: &mut CudaBuf) {
        out.set_shape(rows.len(), x.cols);
        self.move_rows(x, rows, out, 0);
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        self.norm(x, None, w, eps, out);
    }

    fn add_rms_norm(&self, x: &mut CudaBuf, y: &CudaBuf, w: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        self.norm(x, Some(y), w, eps, out);
    }

    fn layer_norm(&self, x: &CudaBuf, w: &CudaWeight, b: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        out.shape_from(x.rows, &x.runs, x.cols);
        self.dev.launch(
            "layer_norm",
            (x.rows as u32, 1),
            256,
            &[
                A::P(x.ptr),
                A::P(self.dev.ptr(&w.data)),
                A::P(self.dev.ptr(&b.data)),
                A::P(out.ptr),
                A::I(x.cols as i32),
                A::F(eps),
            ],
        );
    }

    fn gelu(&self, x: &mut CudaBuf) {
        self.unary(x, 0, 0.0);
    }

    fn head_rms_norm(&self, x: &mut CudaBuf, w: Option<&CudaWeight>, head_dim: usize, eps: f32) {
        let heads = x.len() as usize / head_dim.max(1);
        self.dev.launch(
            "head_rms_norm",
            (blocks(heads as u64, 4), 1),
            128,
            &[
                A::P(x.ptr),
                A::P(w.map_or(0, |w| self.dev.ptr(&w.data))),
                A::I(head_dim as i32),
                A::I(heads as i32),
                A::F(eps),
            ],
        );
    }

    fn gelu_tanh(&self, x: &mut CudaBuf) {
        self.unary(x, 1, 0.0);
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaBuf, out: &mut CudaBuf) {
        self.products(&[w], x, &mut [out]);
    }

    fn matmul_many(&self, ws: &[&CudaWeight], x: &CudaBuf, outs: &mut [&mut CudaBuf]) {
        self.products(ws, x, outs);
    }

    // The matrix-vector products and their fused variant: `products.rs`.
    fn fuses_products(&self, ws: &[&CudaWeight], x: &CudaBuf) -> bool {
        self.fuses(ws, x)
    }

    fn norm_glu(
        &self,
        x: &CudaBuf,
        norm: Norm<'_, CudaWeight>,
        gate_up: [&CudaWeight; 2],
        glu: Glu,
        t: (&mut CudaBuf, &mut CudaBuf, &mut CudaBuf),
        out: &mut CudaBuf,
    ) {
        self.norm_glu_op(x, None, norm, gate_up, glu, t, out)
    }

    fn add_norm_glu(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        norm: Norm<'_, CudaWeight>,
        gate_up: [&CudaWeight; 2],
        glu: Glu,
        t: (&mut CudaBuf, &mut CudaBuf, &mut CudaBuf),
        out: &mut CudaBuf,
    ) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        if self.adds_inside(x, norm, gate_up) {
            self.norm_glu_op(x, Some(y), norm, gate_up, glu, t, out)
        } else {
            self.add(x, y);
            self.norm_glu_op(x, None, norm, gate_up, glu, t, out)
        }
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaWeight) {
        self.row_op(x, b, 0);
    }

    fn rope(&self, x: &mut CudaBuf, head_dim: usize, step: &CudaStep, rope: &Rope) {
        self.rotate(x, None, head_dim, step, rope);
    }

    fn rope_qk(&self, q: &mut CudaBuf, k: &mut CudaBuf, head_dim: usize, step: &CudaStep, rope: &Rope) {
        assert_eq!(q.rows, k.rows, "rope_qk: queries and keys of one step");
        self.rotate(q, Some(k), head_dim, step, rope);
    }

    fn store_kv(&self, kvs: &mut [&mut CudaKv], step: &CudaStep, layer: usize, k: &CudaBuf, v: &CudaBuf) {
        let Some((kd, vd, ko, vo, q8)) = self.kv_pages(kvs, step, layer, k, v) else {
            return;
        };
        let rows = step.plan.positions.len();
        self.dev.launch(
            "store_kv",
            (rows as u32, 2 * kd.max(vd).div_ceil(256) as u32),
            128,
            &[
                A::S(step.args),
                A::P(k.ptr),
                A::P(v.ptr),
                A::I(kd as i32),
                A::I(vd as i32),
                A::P(ko as u64),
                A::P(vo as u64),
                A::I(q8 as i32),
            ],
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_store_kv(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        head_dim: usize,
        norm: Option<QkNorm<'_, CudaWeight>>,
        rope: &Rope,
        kvs: &mut [&mut CudaKv],
        step: &CudaStep,
        layer: usize,
    ) {
        // One launch where every 256-value segment of a row holds whole heads.
        let fits = self.rope_store
            && !kvs.is_empty()
            && head_dim > 0
            && 256 % head_dim == 0
            && rope.n_dims <= head_dim
            && q.rows == k.rows
            && q.rows == step.plan.positions.len();
        if !fits {
            if let Some(n) = norm {
                n.apply(self, q, k, head_dim);
            }
            self.rope_qk(q, k, head_dim, step, rope);
            self.store_kv(kvs, step, layer, k, v);
            return;
        }
        let Some((kd, vd, ko, vo, q8)) = self.kv_pages(kvs, step, layer, k, v) else {
            return;
        };
        let table = self.rope_table(step, rope);
        let segs = q.cols.div_ceil(256) + kd.div_ceil(256) + vd.div_ceil(256);
        self.dev.launch_early(
            "rope_store_kv",
            (q.rows as u32, segs as u32),
            128,
            &[
                A::S(step.args),
                A::P(q.ptr),
                A::I(q.cols as i32),
                A::P(k.ptr),
                A::I(kd as i32),
                A::P(v.ptr),
                A::I(vd as i32),
                A::P(table),
                A::I(head_dim as i32),
                A::I(rope.n_dims as i32),
                A::I(rope.neox as i32),
                A::P(ko as u64),
                A::P(vo as u64),
                A::I(q8 as i32),
                A::P(norm.map_or(0, |n| self.dev.ptr(&n.q.data))),
                A::P(norm.map_or(0, |n| self.dev.ptr(&n.k.data))),
                A::F(norm.map_or(0.0, |n| n.eps)),
            ],
        );
    }
    fn attention(&self, q: &CudaBuf, step: &CudaStep, kvs: &[&CudaKv], l: &AttnLayer, out: &mut CudaBuf) {
        self.attend(q, step, kvs, l, out);
    }

    fn encoder_attention(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        seqs: &[std::ops::Range<usize>],
        n_head: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) {
        let hd = q.cols / n_head.max(1);
        assert!(
            hd <= MAX_HEAD_DIM,
            "CUDA attention takes heads of at most {MAX_HEAD_DIM} values, not {hd}"
        );
        out.set_shape(q.rows, q.cols);
        let mut lo = vec![0i32; q.rows];
        let mut hi = vec![0i32; q.rows];
        for s in seqs {
            for r in s.clone() {
                lo[r] = s.start as i32;
                hi[r] = s.end as i32;
            }
        }
        let (lo, hi) = (self.dev.upload(&lo), self.dev.upload(&hi));
        self.dev.launch(
            "encoder_attn",
            (q.rows as u32, n_head as u32),
            128,
            &[
                A::P(q.ptr),
                A::P(k.ptr),
                A::P(v.ptr),
                A::P(out.ptr),
                A::P(lo),
                A::P(hi),
                A::I(q.cols as i32),
                A::I(hd as i32),
                A::F(scale),
            ],
        );
    }

    fn moe_ffn_on_device(
        &self,
        router: &CudaWeight,
        experts: &[crate::model::blocks::Ffn<Cuda>],
        r: &crate::model::blocks::Routing,
        glu: crate::model::blocks::Glu,
        x_route: &CudaBuf,
        x: &CudaBuf,
        bufs: &mut crate::model::blocks::MoeBufs<Cuda>,
        out: &mut CudaBuf,
    ) -> bool {
        self.moe_device(router, experts, r, glu, x_route, x, bufs, out)
    }

    fn swiglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        self.glu(gate, up, out, 2);
    }

    fn geglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        self.glu(gate, up, out, 3);
    }

    fn scale(&self, x: &mut CudaBuf, f: f32) {
        self.unary(x, 2, f);
    }

    fn softcap(&self, x: &mut CudaBuf, cap: f32) {
        self.unary(x, 3, cap);
    }

    fn mul(&self, x: &mut CudaBuf, y: &CudaBuf) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        self.in_place(x, y, 1);
    }

    fn mul_row(&self, x: &mut CudaBuf, w: &CudaWeight) {
        self.row_op(x, w, 1);
    }

    fn scatter_rows(&self, src: &CudaBuf, rows: &[usize], dst: &mut CudaBuf) {
        assert_eq!(src.cols, dst.cols);
        if let Some(&r) = rows.iter().find(|&&r| r >= dst.rows) {
            panic!("scatter_rows: row {r} of {}", dst.rows);
        }
        self.move_rows(src, rows, dst, 1);
    }

    fn weighted_sum_rows(&self, src: &CudaBuf, weights: &[f32], k_per: usize, out: &mut CudaBuf) {
        let n = src.cols;
        let t = src.rows / k_per.max(1);
        out.set_shape(t, n);
        let w = self.dev.upload(weights);
        self.dev.launch(
            "weighted_sum_rows",
            (t as u32, blocks(n as u64, 256)),
            256,
            &[
                A::P(src.ptr),
                A::P(0),
                A::P(w),
                A::P(out.ptr),
                A::I(t as i32),
                A::I(k_per as i32),
                A::I(n as i32),
            ],
        );
    }

    fn reshape(&self, x: &mut CudaBuf, rows: usize, cols: usize) {
        x.set_shape(rows, cols);
    }

    fn set_runs(&self, x: &mut CudaBuf, runs: &[usize]) {
        x.runs = Arc::from(runs);
    }

    fn runs(&self, x: &CudaBuf) -> Vec<usize> {
        x.runs.to_vec()
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        self.in_place(x, y, 0);
    }

    fn read(&self, x: &CudaBuf) -> Vec<f32> {
        let n = x.len() as usize;
        self.dev.read_with(x.ptr, 4 * n, |bytes| {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    fn read_rows(&self, x: &CudaBuf, r0: usize, rows: usize) -> Vec<f32> {
        assert!(r0 + rows <= x.rows, "read_rows: rows {r0}..{} of {}", r0 + rows, x.rows);
        let off = 4 * (r0 * x.cols) as u64;
        self.dev.read_with(x.ptr + off, 4 * rows * x.cols, |bytes| {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    fn top_of_rows(&self, x: &CudaBuf, asks: &[TopAsk]) -> Vec<Top> {
        // (An ask of more than an eighth of the row reads back about as much as the row.)
        if !self.tops || asks.is_empty() || asks.iter().any(|a| a.n.saturating_mul(8) > x.cols) {
            return crate::backend::top_of_rows_on_host(self, x, asks);
        }
        self.top_rows(x, asks)
    }

    fn sample_rows(&self, x: &CudaBuf, asks: &[crate::backend::SampleAsk]) -> Vec<u32> {
        if !self.draws || asks.is_empty() {
            return crate::backend::sample_rows_on_host(self, x, asks);
        }
        self.sample_rows_dev(x, asks)
    }

    fn samples_on_device(&self) -> bool {
        self.draws
    }

    fn argmax_rows(&self, x: &CudaBuf) -> Vec<u32> {
        if x.rows == 0 {
            return Vec::new();
        }
        let out = self.argmax_launch(x);
        self.dev.read_with(out, 4 * x.rows, feed::ids_of)
    }

    fn feeds_tokens(&self) -> bool {
        // `HF2Q_CUDA_FEED=0`: every step's token through the host (to compare).
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("HF2Q_CUDA_FEED").map_or(true, |v| v != "0"))
    }

    fn argmax_rows_defer(&self, x: &CudaBuf) -> Deferred {
        self.defer_argmax(x)
    }

    fn deferred_ids(&self, d: Deferred) -> Vec<u32> {
        match d.ids {
            Some(ids) => ids,
            None => {
                self.dev.flush();
                self.dev.feed().take(d.slot as u64, d.rows)
            }
        }
    }

    fn write(&self, x: &mut CudaBuf, rows: usize, cols: usize, data: &[f32]) {
        assert_eq!(
            data.len(),
            rows * cols,
            "write: {} values for {rows}x{cols}",
            data.len()
        );
        x.set_shape(rows, cols);
        if !data.is_empty() {
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.dev.write_bytes(x.ptr, &bytes);
        }
    }

    // Hybrid models' ops: `recurrent.rs`.
    fn ssm_conv(
        &self,
        x: &CudaBuf,
        w: &CudaWeight,
        step: &CudaStep,
        kvs: &mut [&mut CudaKv],
        l: &DeltaNetLayer,
        out: &mut CudaBuf,
    ) {
        self.ssm_conv_op(x, w, step, kvs, l, out)
    }

    fn gated_delta_net(
        &self,
        qkv: &CudaBuf,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
        step: &CudaStep,
        kvs: &mut [&mut CudaKv],
        l: &DeltaNetLayer,
        out: &mut CudaBuf,
    ) {
        self.gated_delta_net_op(qkv, alpha, beta, dt_bias, a, step, kvs, l, out)
    }

    fn sigmoid_mul(&self, x: &mut CudaBuf, g: &CudaBuf) {
        self.sigmoid_mul_op(x, g)
    }

    fn unzip_heads(&self, x: &CudaBuf, width: usize, a: &mut CudaBuf, b: &mut CudaBuf) {
        self.unzip_heads_op(x, width, a, b)
    }
}

impl Cuda {
    /// `out = rms_norm(x) · w`, after `x += y` when `y` is given (one kernel), also quantized for
    /// the integer products that follow when they are on.
    fn norm(&self, x: &CudaBuf, y: Option<&CudaBuf>, w: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        out.shape_from(x.rows, &x.runs, x.cols);
        let q8 = mmq_on() && x.rows > 0 && x.cols.is_multiple_of(4);
        let mut args = vec![A::P(x.ptr)];
        args.extend(y.map(|y| A::P(y.ptr)));
        args.extend([A::P(self.dev.ptr(&w.data)), A::P(out.ptr)]);
        let n_pad = x.cols.next_multiple_of(256);
        if q8 {
            let act = self.act_scratch(x.rows, n_pad);
            args.extend([A::P(act.q0), A::P(act.d0), A::P(act.qk), A::P(act.dk)]);
            args.extend([A::I(x.cols as i32), A::I(n_pad as i32), A::F(eps)]);
        } else {
            args.extend([A::I(x.cols as i32), A::F(eps)]);
        }
        let mut name = format!(
            "{}rms_norm{}",
            if y.is_some() { "add_" } else { "" },
            if q8 { "_q8" } else { "" }
        );
        // y the MoE combine recorded just before (`Fused::SumNorm`): made here instead.
        if let Some(y) = y.filter(|_| q8 && self.fuse_on(Fused::SumNorm)) {
            let (rows, cols) = (A::I(x.rows as i32), A::I(x.cols as i32));
            let ws = self.dev.take_last("weighted_sum_rows", |a| {
                a.len() == 7 && a[3] == A::P(y.ptr) && a[4] == rows && a[6] == cols
            });
            if let Some(ws) = ws {
                // (src, pos, weights, sum, k_per) then x and the rest without y.
                let mut fused = vec![ws[0], ws[1], ws[2], ws[3], ws[5]];
                fused.push(args[0]);
                fused.extend_from_slice(&args[2..]);
                args = fused;
                name = "add_ws_rms_norm_q8".into();
                self.count_fused(Fused::SumNorm);
            }
        }
        // A thread per four values (16-byte loads), up to 1024: one row is one block (when
        // quantizing, 64 threads per unit of 256 values).
        let threads = if q8 {
            (n_pad / 4).min(1024)
        } else {
            (x.cols / 4).clamp(32, 1024).next_multiple_of(32)
        } as u32;
        self.dev.launch_early(&name, (x.rows as u32, 1), threads, &args);
        if q8 {
            *self.q8_of.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((out.ptr, x.rows, x.cols, self.dev.seq.load(Ordering::Relaxed)));
        }
    }

    /// Rope of `x` (and `y`, in the same launch).
    fn rotate(&self, x: &CudaBuf, y: Option<&CudaBuf>, head_dim: usize, step: &CudaStep, rope: &Rope) {
        assert_eq!(step.plan.positions.len(), x.rows);
        let half = rope.n_dims / 2;
        let table = self.rope_table(step, rope);
        let cols = y.map_or(x.cols, |y| x.cols.max(y.cols));
        let n = (x.rows * (cols / head_dim) * half) as u64;
        let (y_ptr, y_cols) = y.map_or((x.ptr, x.cols), |y| (y.ptr, y.cols));
        self.dev.launch(
            "rope",
            (blocks(n, 256), 1 + y.is_some() as u32),
            256,
            &[
                A::P(x.ptr),
                A::I(x.cols as i32),
                A::P(y_ptr),
                A::I(y_cols as i32),
                A::P(table),
                A::I(x.rows as i32),
                A::I(head_dim as i32),
                A::I(rope.n_dims as i32),
                A::I(rope.neox as i32),
            ],
        );
    }

    /// The device address of a grow-only scratch buffer of at least `need` elements (`size` when
    /// it has to grow); its contents are written by the kernels that use it before they read it.
    fn grown<T: cudarc::driver::DeviceRepr>(
        &self,
        slot: &Mutex<Option<CudaSlice<T>>>,
        need: usize,
        size: usize,
        what: &str,
    ) -> u64 {
        // SAFETY: written by the kernels that use it before any of them reads it.
        self.grown_by(slot, need, what, || unsafe {
            self.dev.stream.alloc::<T>(size.max(need))
        })
    }

    /// `grown` for counters: a new buffer is zeroed (the kernels set each counter back to 0).
    fn grown_zeroed(&self, slot: &Mutex<Option<CudaSlice<i32>>>, need: usize, what: &str) -> u64 {
        let size = need.next_power_of_two().max(1024);
        self.grown_by(slot, need, what, || self.dev.stream.alloc_zeros::<i32>(size))
    }

    /// The device address of the buffer in `slot`, replaced by `make`'s when shorter than `need`.
    fn grown_by<T>(
        &self,
        slot: &Mutex<Option<CudaSlice<T>>>,
        need: usize,
        what: &str,
        make: impl FnOnce() -> std::result::Result<CudaSlice<T>, cudarc::driver::DriverError>,
    ) -> u64 {
        let mut buf = slot.lock().unwrap_or_else(|e| e.into_inner());
        if buf.as_ref().is_none_or(|b| b.len() < need) {
            // Launches recorded so far may read the old buffer: issue them before it is freed
            // (the free is ordered on the stream after them).
            self.dev.flush();
            *buf = Some(make().unwrap_or_else(|e| self.dev.fail(what, e)));
        }
        self.dev.ptr(buf.as_ref().expect("allocated"))
    }

    /// Rows `ids` of `table`; an id with the `FED` bit is row k of the argmax output at `fed`.
    fn gather(&self, table: &CudaWeight, ids: u64, fed: u64, count: usize, out: &mut CudaBuf) {
        let n = table.row_len();
        out.set_shape(count, n);
        if count == 0 {
            return;
        }
        self.dev.launch(
            &format!("get_rows_{}", ty_name(table.dev_ty)),
            (count as u32, 1),
            128,
            &[
                A::P(self.dev.ptr(&table.data)),
                A::P(table.row_bytes as u64),
                A::P(ids),
                A::P(fed),
                A::P(out.ptr),
                A::I(n as i32),
            ],
        );
    }

    fn move_rows(&self, x: &CudaBuf, rows: &[usize], out: &mut CudaBuf, mode: i32) {
        if rows.is_empty() {
            return;
        }
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let idx = self.dev.upload(&idx);
        self.dev.launch(
            "move_rows",
            (rows.len() as u32, 1),
            256,
            &[
                A::P(x.ptr),
                A::P(out.ptr),
                A::P(idx),
                A::I(rows.len() as i32),
                A::I(x.cols as i32),
                A::I(mode),
            ],
        );
    }

    fn unary(&self, x: &mut CudaBuf, op: i32, a: f32) {
        let n = x.len();
        if n == 0 {
            return;
        }
        self.dev.launch(
            "unary",
            (blocks(n, 256), 1),
            256,
            &[A::P(x.ptr), A::P(n), A::I(op), A::F(a)],
        );
    }

    /// A gated activation (op 2 SwiGLU, 3 GeGLU), also quantized for the integer product that
    /// follows when they are on (as `norm`).
    fn glu(&self, x: &CudaBuf, y: &CudaBuf, out: &CudaBuf, op: i32) {
        if !mmq_on() || x.len() == 0 || !x.cols.is_multiple_of(4) {
            return self.binary(x, y, out, op);
        }
        let n_pad = x.cols.next_multiple_of(256);
        let act = self.act_scratch(x.rows, n_pad);
        self.dev.launch_early(
            "glu_q8",
            (x.rows as u32, (n_pad / 256) as u32),
            64,
            &[
                A::P(x.ptr),
                A::P(y.ptr),
                A::P(out.ptr),
                A::P(act.q0),
                A::P(act.d0),
                A::P(act.qk),
                A::P(act.dk),
                A::I(x.cols as i32),
                A::I(n_pad as i32),
                A::I(op),
            ],
        );
        *self.q8_of.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((out.ptr, x.rows, x.cols, self.dev.seq.load(Ordering::Relaxed)));
    }

    fn binary(&self, x: &CudaBuf, y: &CudaBuf, out: &CudaBuf, op: i32) {
        let n = x.len();
        if n == 0 {
            return;
        }
        self.dev.launch(
            "binary",
            (blocks(n, 256), 1),
            256,
            &[A::P(x.ptr), A::P(y.ptr), A::P(out.ptr), A::P(n), A::I(op)],
        );
    }

    fn in_place(&self, x: &mut CudaBuf, y: &CudaBuf, op: i32) {
        let n = x.len();
        if n == 0 {
            return;
        }
        let p = x.ptr;
        self.dev.launch(
            "binary",
            (blocks(n, 256), 1),
            256,
            &[A::P(p), A::P(y.ptr), A::P(p), A::P(n), A::I(op)],
        );
    }

    fn row_op(&self, x: &mut CudaBuf, w: &CudaWeight, op: i32) {
        let n = x.len();
        if n == 0 {
            return;
        }
        self.dev.launch(
            "row_op",
            (blocks(n, 256), 1),
            256,
            &[
                A::P(x.ptr),
                A::P(self.dev.ptr(&w.data)),
                A::P(n),
                A::I(w.row_len() as i32),
                A::I(op),
            ],
        );
    }
}
