//! The CPU backend: weights stay in the memory-mapped GGUF, activations are f32 matrices, the KV
//! cache is f16 (or Q8_0). Matrix products convert activations to the weight type's dot type and
//! run the `quant::dot` kernels over row tiles on a persistent rayon pool (one per backend).

mod attn;
mod dense;
pub(crate) mod kv;
pub use dense::matmul as dense_matmul;
pub use kv::{CpuKv, CpuPage};
mod pages;
mod recurrent;
pub(crate) mod rope;
mod simd;

use super::{AttnArgs, AttnLayer, Backend, DeltaNetLayer, KvType, Rope, StepPlan, WeightSource};
use crate::{EngineError, Result};
use gguf::GgmlType;
use quant::dot::packed::{Packing, PACK_ROWS};
use quant::dot::{self, Kernel, KernelPath, MAX_COLS, MAX_ROWS};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct Cpu {
    pool: rayon::ThreadPool,
    threads: usize,
    path: KernelPath,
    /// Multiply by f32 activations and dequantized weights instead of ggml's quantized activations.
    exact_activations: bool,
    /// Attend short batches and decode rows in f32 instead of ggml's f16 rounding of Q and of the
    /// softmax·V accumulator (`attn.rs`).
    pub(super) attn_f32: bool,
    /// Activation scratch of matmul (converted rows, one buffer per activation type), reused.
    scratch: Mutex<Vec<Vec<u8>>>,
    /// Empty polls between a waiting worker's yields of its CPU ([`keep_warm`]): every poll when
    /// there are more threads than CPUs, so a waiting worker never holds a CPU a working one needs.
    warm_polls: u32,
}

impl Cpu {
    /// A backend with `threads` workers (0 = one per core).
    pub fn new(threads: usize) -> Result<Cpu> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if threads == 0 { cpus } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hf2q-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Backend(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(Cpu {
            pool,
            threads,
            path: KernelPath::detect(),
            exact_activations: false,
            attn_f32: std::env::var("HF2Q_CPU_ATTN_F32").is_ok_and(|v| v == "1"),
            scratch: Mutex::new(Vec::new()),
            warm_polls: if threads > cpus { 1 } else { 256 },
        })
    }

    /// Weights loaded from now on are multiplied by unquantized f32 activations: for encoders,
    /// whose outputs are compared as vectors, this removes the activation-rounding error of ggml's
    /// quantized dot products. Matrices used only in matrix products are decoded to f32 once at
    /// load and multiplied with a blocked GEMM over the whole batch (`dense.rs`).
    pub fn with_exact_activations(mut self) -> Cpu {
        self.exact_activations = true;
        self
    }

    /// Short batches and decode rows attend in f32 (Q and the softmax·V accumulator not rounded to
    /// f16 as ggml's CPU flash attention rounds them; `HF2Q_CPU_ATTN_F32=1` sets it too): the
    /// arithmetic of the CUDA backend's attention up to summation order, for comparing the two.
    /// llama.cpp's numbers are the f16 ones, so this is off by default.
    pub fn with_f32_attention(mut self) -> Cpu {
        self.attn_f32 = true;
        self
    }

    pub fn kernel_path(&self) -> KernelPath {
        self.path
    }
}

pub struct CpuWeight {
    _owner: Arc<gguf::GgufModel>,
    ptr: *const u8,
    len: usize,
    ty: GgmlType,
    shape: Vec<u64>,
    kernel: Option<Kernel>,
    /// The rows repacked for `quant::dot::packed`, where llama.cpp repacks such a matrix.
    packed: Option<Packed>,
    /// 1-D tensors (norms, biases, rope factors) decoded to f32 once.
    f32s: Option<Vec<f32>>,
    /// Exact-activation mode: the matrix decoded to f32 for the GEMM path (`dense.rs`).
    dense: Option<dense::Dense>,
}

// SAFETY: `ptr` points into the read-only memory map kept alive by `_owner`; nothing writes it.
unsafe impl Send for CpuWeight {}
unsafe impl Sync for CpuWeight {}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        // SAFETY: see the Send/Sync note; `len` was taken from the slice this came from.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn row_len(&self) -> usize {
        self.shape[0] as usize
    }
    fn n_rows(&self) -> usize {
        self.shape.iter().skip(1).product::<u64>() as usize
    }
    fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.shape[0]).unwrap_or(0) as usize
    }
    fn vector(&self) -> &[f32] {
        self.f32s.as_deref().expect("1-D weight decoded at load")
    }
}

/// A matrix in groups of [`PACK_ROWS`] interleaved rows.
struct Packed {
    packing: Packing,
    group_bytes: usize,
    data: pages::WeightBuf,
}

pub struct CpuBuf {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
    /// Rows per sequence (`Backend::set_runs`); empty: one run. Outputs row-aligned with an
    /// input take the input's runs.
    runs: Arc<[usize]>,
}

impl CpuBuf {
    /// A new logical shape; the rows no longer belong to known sequences.
    fn set_shape(&mut self, rows: usize, cols: usize) {
        assert!(
            rows * cols <= self.data.len(),
            "buffer of {} values cannot hold {rows}x{cols}",
            self.data.len()
        );
        self.rows = rows;
        self.cols = cols;
        self.runs = Arc::from([]);
    }
    /// The shape of an output whose rows are `x`'s rows (`cols` wide), with `x`'s sequences.
    fn shape_from(&mut self, x_rows: usize, x_runs: &Arc<[usize]>, cols: usize) {
        self.set_shape(x_rows, cols);
        self.runs = x_runs.clone();
    }
    fn view(&self) -> &[f32] {
        &self.data[..self.rows * self.cols]
    }
    fn view_mut(&mut self) -> &mut [f32] {
        &mut self.data[..self.rows * self.cols]
    }
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A step as the CPU keeps it: the plan, and the rotary tables of its positions per rope (Q and K
/// of every layer share them).
pub struct CpuStep {
    plan: StepPlan,
    rope: Mutex<Vec<(Rope, RopeCaches)>>,
}

impl CpuStep {
    fn rope_caches(&self, rope: &Rope) -> RopeCaches {
        let mut memo = self.rope.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = memo.iter().find(|(r, _)| r == rope) {
            return c.clone();
        }
        let positions = &self.plan.positions;
        let caches: RopeCaches = Arc::new(if positions.len() > 1 {
            positions.par_iter().map(|&p| rope::cache(rope, p as f32)).collect()
        } else {
            positions.iter().map(|&p| rope::cache(rope, p as f32)).collect()
        });
        memo.push((rope.clone(), caches.clone()));
        caches
    }
}

/// Write K and V rows `src_rows` at positions `pos0 ..` of `layer`.
fn store_rows(kv: &mut CpuKv, layer: usize, pos0: usize, k: &CpuBuf, v: &CpuBuf, src_rows: Range<usize>) {
    let (row0, rows) = (src_rows.start, src_rows.len());
    assert!(
        pos0 + rows <= kv.capacity(),
        "KV cache of {} positions cannot hold {}",
        kv.capacity(),
        pos0 + rows
    );
    let (kd, vd) = kv.layout.dims[layer];
    let ty = kv.ty();
    for (src, is_v, dim) in [(k, false, kd), (v, true, vd)] {
        assert_eq!(src.cols, dim, "KV rows of layer {layer}");
        for i in 0..rows {
            let d = kv.row_mut(layer, is_v, pos0 + i);
            match ty {
                KvType::F16 => dot::quantize_act(GgmlType::F16, src.row(row0 + i), d),
                KvType::Q8_0 => dot::quantize_q8_0_ggml(src.row(row0 + i), d),
            }
        }
    }
}

/// `body(x_row, out_row)` for every row, on the pool when there is more than one row.
/// Element-wise ops over at least this many values run on the pool (smaller ones, such as a decode
/// step's rows, would spend more on the hand-off than on the work). Same results either way.
const PARALLEL_ELEMS: usize = 1 << 16;

fn map_rows(x: &CpuBuf, out: &mut CpuBuf, body: impl Fn(&[f32], &mut [f32]) + Send + Sync) {
    let n = x.cols;
    out.shape_from(x.rows, &x.runs, n);
    if x.rows > 1 {
        x.view()
            .par_chunks(n)
            .zip(out.view_mut().par_chunks_mut(n))
            .for_each(|(a, b)| body(a, b));
    } else {
        x.view()
            .chunks(n)
            .zip(out.view_mut().chunks_mut(n))
            .for_each(|(a, b)| body(a, b));
    }
}

/// The rotary (cos, sin) tables of one step's positions.
type RopeCaches = Arc<Vec<Vec<(f32, f32)>>>;

/// ggml's GELU table (`ggml_table_gelu_f16`): the tanh-form GELU of every f16 value, rounded to f16.
fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| {
                let x = quant::fp::f16_to_f32(h);
                // ggml_gelu_f32 as GCC builds it for ggml: `1 + A·x·x` contracted to one FMA.
                let inner = (0.044715f32 * x).mul_add(x, 1.0);
                let y = 0.5 * x * (1.0 + (GELU_SQRT_2_OVER_PI * x * inner).tanh());
                quant::fp::f32_to_f16(y)
            })
            .collect()
    })
}

const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;

// ggml-cpu/vec.h ggml_vec_gelu_f32 with GGML_GELU_FP16: the table at the f16-rounded input
fn gelu_tanh_ggml(table: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        quant::fp::f16_to_f32(table[quant::fp::f32_to_f16(x) as usize])
    }
}

/// A raw pointer for disjoint parallel writes.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: users write disjoint elements from different threads and nothing reads them meanwhile.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The element `i` past the start (a method, so closures capture the whole `SyncPtr`).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    /// Each pool thread's buffer for a tile of unpacked weight rows.
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The kernels one row tile of a matmul runs.
struct Tile {
    dot: dot::DotFn,
    rows: Option<dot::DotRowsFn>,
    max_rows: usize,
}

impl Tile {
    /// Output rows `rows` (weight rows `wb`, `rb` bytes each, from `rows.start`) for all `t`
    /// activation rows, into the t×m output at `outp`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        ty: GgmlType,
        n: usize,
        t: usize,
        m: usize,
        rows: Range<usize>,
        wb: &[u8],
        rb: usize,
        acts: &[u8],
        abytes: usize,
        outp: SyncPtr,
    ) {
        let (r0, r1) = (rows.start, rows.end);
        let row = |r: usize| &wb[(r - r0) * rb..(r - r0 + 1) * rb];
        let mut res = [0f32; MAX_COLS];
        let mut cols: [&[u8]; MAX_COLS] = [&[]; MAX_COLS];
        for t0 in (0..t).step_by(MAX_COLS) {
            let c = (t - t0).min(MAX_COLS);
            for (j, col) in cols.iter_mut().enumerate().take(c) {
                *col = &acts[(t0 + j) * abytes..(t0 + j + 1) * abytes];
            }
            let mut r = r0;
            // Several rows per call pay off in batches (more accumulator chains, each
            // activation block loaded once per row group); a single token streams row by
            // row (interleaved rows stream from memory at half the speed, `gemv` bench).
            if let (Some(rows), true) = (self.rows, t > 1) {
                let mut multi = [[0f32; MAX_COLS]; MAX_ROWS];
                for group in [self.max_rows.min(MAX_ROWS), 2] {
                    while r + group <= r1 {
                        let ws: [&[u8]; MAX_ROWS] = std::array::from_fn(|i| row(r + i.min(group - 1)));
                        rows(ty, n, &ws[..group], &cols[..c], &mut multi[..group]);
                        for (i, res) in multi[..group].iter().enumerate() {
                            for (j, &v) in res[..c].iter().enumerate() {
                                // SAFETY: (t0 + j, r + i) of this output belongs to this tile
                                // only; within t×m.
                                unsafe { *outp.at((t0 + j) * m + r + i) = v };
                            }
                        }
                        r += group;
                    }
                }
            }
            for r in r..r1 {
                (self.dot)(ty, n, row(r), &cols[..c], &mut res[..c]);
                for (j, &v) in res[..c].iter().enumerate() {
                    // SAFETY: (t0 + j, r) of this output is written by this tile only; within t×m.
                    unsafe { *outp.at((t0 + j) * m + r) = v };
                }
            }
        }
    }
}

/// Rows `rows` (whole groups) of a packed weight by all `t` activation rows, into `out` (t × m):
/// each group stays in cache while the activations stream past it, four at a time (llama.cpp's
/// GEMM groups; the remainder takes its GEMV order).
#[allow(clippy::too_many_arguments)]
fn packed_tile(p: &Packed, n: usize, t: usize, m: usize, rows: Range<usize>, acts: &[u8], abytes: usize, out: SyncPtr) {
    debug_assert!(rows.start.is_multiple_of(PACK_ROWS) && rows.end.is_multiple_of(PACK_ROWS));
    let mut res = [[0f32; PACK_ROWS]; MAX_COLS];
    let mut cols: [&[u8]; MAX_COLS] = [&[]; MAX_COLS];
    for r in rows.step_by(PACK_ROWS) {
        let g = r / PACK_ROWS;
        let group = &p.data.as_slice()[g * p.group_bytes..(g + 1) * p.group_bytes];
        for t0 in (0..t).step_by(MAX_COLS) {
            let c = (t - t0).min(MAX_COLS);
            for (j, col) in cols.iter_mut().enumerate().take(c) {
                *col = &acts[(t0 + j) * abytes..(t0 + j + 1) * abytes];
            }
            (p.packing.dot)(n, group, &cols[..c], &mut res[..c]);
            for (j, v) in res[..c].iter().enumerate() {
                // SAFETY: rows r..r+8 of output row t0 + j belong to this tile only; within t×m.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out.at((t0 + j) * m + r), PACK_ROWS) };
            }
        }
    }
}

/// A pool worker's wait for the step running on worker `step` (`Backend::run`): it takes the
/// step's parallel jobs as soon as they are queued, until `done` or until no job has come for
/// [`WARM_IDLE`] (then the worker sleeps as usual and is woken for the step's next job: a long
/// serial stretch, or a machine busy with other work, costs no more spinning). Returns at once on
/// the step's own worker (which can pick this job up while it waits for one of its own), so the
/// step never waits on itself. While it polls it yields the CPU every `polls` empty polls.
fn keep_warm(done: &AtomicBool, step: Option<usize>, polls: u32) {
    if rayon::current_thread_index() == step {
        return;
    }
    let mut idle = 0u32;
    let mut last = std::time::Instant::now();
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
            last = std::time::Instant::now();
            continue;
        }
        idle += 1;
        if idle.is_multiple_of(16) && last.elapsed() > WARM_IDLE {
            return;
        }
        if idle.is_multiple_of(polls) {
            std::thread::yield_now();
        } else {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
        }
    }
}

/// How long [`keep_warm`] polls without a job before its worker goes to sleep: longer than the
/// serial stretches between a decode step's parallel operations, short against a step. Measured on
/// a 2-vCPU Xeon (Qwen 3.5 0.8B shape, Q8_0 tg128, two rounds): 0 (no waiting) 21.1-22.0 t/s,
/// 100 µs 21.2-21.7, 500 µs 21.9-22.7, 2 ms 22.6-22.9, unbounded 22.4-23.0. With unbounded waiting
/// CI's serve tests (several servers on two CPUs) took 259 s (74 s in the CI run before); with 2 ms
/// they take 70 s here, as with no waiting.
const WARM_IDLE: std::time::Duration = std::time::Duration::from_millis(2);

impl Backend for Cpu {
    type Weight = CpuWeight;
    type Buf = CpuBuf;
    type Kv = CpuKv;
    type Page = Arc<CpuPage>;
    type Step = CpuStep;

    fn name(&self) -> String {
        format!("cpu ({}, {} threads)", self.path.name(), self.threads)
    }

    fn threads(&self) -> usize {
        self.threads
    }

    /// The step runs on one worker while the others wait for its parallel work busily (see
    /// [`keep_warm`]) rather than asleep: a decode step is ~200 parallel operations of tens of
    /// microseconds, and waking a sleeping worker for each cost ~5% of a Qwen 3.5 0.8B Q8_0 token
    /// on a 2-vCPU VM.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.threads < 2 {
            return self.pool.install(f);
        }
        self.pool.install(|| {
            let done = AtomicBool::new(false);
            let me = rayon::current_thread_index();
            rayon::scope(|s| {
                for _ in 1..self.threads {
                    s.spawn(|_| keep_warm(&done, me, self.warm_polls));
                }
                // Set even when `f` panics, so the scope's helpers end and the panic goes on.
                struct Done<'a>(&'a AtomicBool);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::Release);
                    }
                }
                let _done = Done(&done);
                f()
            })
        })
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CpuWeight> {
        let bad = |why: String| EngineError::Model(format!("tensor {}: {why}", src.name));
        let expect = src
            .ty
            .row_bytes(src.shape.first().copied().unwrap_or(1))
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
        let f32s = if one_d {
            let codec = quant::codec(src.ty).ok_or_else(|| bad(format!("cannot decode type {}", src.ty.name())))?;
            let mut v = vec![0f32; src.shape[0] as usize];
            (codec.dequantize)(src.data, &mut v);
            Some(v)
        } else {
            None
        };
        let kernel = if self.exact_activations && src.ty != GgmlType::F32 {
            dot::kernel_f32(src.ty)
        } else {
            dot::kernel(src.ty, self.path)
        };
        // llama.cpp repacks a matrix whose row count is a multiple of 8 when the weight type has a
        // repacked kernel on this CPU and the matrix only takes part in matrix products
        // (ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type).
        let n_rows: u64 = src.shape.iter().skip(1).product();
        let packing = (src.matmul_only && !self.exact_activations && src.shape.len() == 2)
            .then(|| dot::packed::packing(src.ty, self.path))
            .flatten()
            .filter(|_| (n_rows as usize).is_multiple_of(PACK_ROWS) && src.shape[0].is_multiple_of(256));
        let packed = packing.map(|packing| {
            let n = src.shape[0] as usize;
            let group_bytes = (packing.group_bytes)(n);
            let rows_bytes = PACK_ROWS * src.ty.row_bytes(n as u64).unwrap_or(0) as usize;
            let mut data = pages::WeightBuf::zeroed(n_rows as usize / PACK_ROWS * group_bytes);
            self.pool.install(|| {
                data.as_mut_slice()
                    .par_chunks_mut(group_bytes)
                    .zip(src.data.par_chunks(rows_bytes))
                    .for_each(|(dst, rows)| (packing.pack)(n, rows, dst))
            });
            Packed {
                packing,
                group_bytes,
                data,
            }
        });
        // HF2Q_KERNEL=scalar keeps the per-row reference (dequantize a row, f64 sums) instead.
        let dense =
            (self.exact_activations && self.path != KernelPath::Scalar && src.matmul_only && src.shape.len() == 2)
                .then(|| {
                    let (k, n) = (src.shape[0] as usize, src.shape[1] as usize);
                    self.pool.install(|| dense::Dense::decode(src.ty, src.data, k, n))
                })
                .flatten();
        Ok(CpuWeight {
            ptr: src.data.as_ptr(),
            len: src.data.len(),
            _owner: src.owner,
            ty: src.ty,
            shape: src.shape.to_vec(),
            kernel,
            packed,
            f32s,
            dense,
        })
    }

    fn weight_type(&self, w: &CpuWeight) -> GgmlType {
        w.ty
    }

    fn weight_shape<'a>(&self, w: &'a CpuWeight) -> &'a [u64] {
        &w.shape
    }

    fn alloc(&self, rows: usize, cols: usize) -> CpuBuf {
        CpuBuf {
            data: vec![0.0; rows * cols],
            rows,
            cols,
            runs: Arc::from([]),
        }
    }

    fn shape(&self, b: &CpuBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn alloc_kv(&self, layers: &[crate::model::KvLayer], n_ctx: usize, ty: KvType) -> Result<CpuKv> {
        CpuKv::new(layers, n_ctx, ty)
    }

    fn kv_sibling(&self, kv: &CpuKv, n_ctx: usize) -> CpuKv {
        kv.sibling(n_ctx)
    }

    fn kv_capacity(&self, kv: &CpuKv) -> usize {
        kv.capacity()
    }

    fn kv_reserve(&self, kv: &mut CpuKv, positions: usize) -> Result<()> {
        kv.reserve(positions)
    }

    fn kv_release(&self, kv: &mut CpuKv, positions: usize) {
        kv.release(positions)
    }

    fn kv_page_shared(&self, kv: &CpuKv, block: usize) -> bool {
        kv.page_shared(block)
    }

    fn kv_page_bytes(&self, kv: &CpuKv) -> usize {
        kv.page_bytes()
    }

    fn kv_live_pages(&self, kv: &CpuKv) -> usize {
        kv.live_pages()
    }

    fn kv_page(&self, kv: &CpuKv, block: usize) -> Arc<CpuPage> {
        kv.page(block)
    }

    fn kv_map(&self, kv: &mut CpuKv, block: usize, page: &Arc<CpuPage>) -> Result<()> {
        kv.map(block, page)
    }

    fn page_data(&self, page: &Arc<CpuPage>) -> Vec<u8> {
        page.export()
    }

    fn kv_import(&self, kv: &mut CpuKv, pos0: usize, data: &[u8]) -> Result<()> {
        kv.import(pos0, data)
    }

    fn kv_state_pos(&self, kv: &CpuKv) -> Option<usize> {
        kv.state_pos()
    }

    fn kv_restore(&self, kv: &mut CpuKv, positions: usize) -> usize {
        kv.restore(positions)
    }

    fn kv_keep_states(&self, kv: &mut CpuKv, positions: &[usize]) {
        kv.keep_states(positions)
    }

    fn kv_state_bytes(&self, kv: &CpuKv) -> usize {
        kv.state_bytes()
    }

    fn kv_drop_copies(&self, kv: &mut CpuKv) {
        kv.drop_copies()
    }

    fn ssm_conv(
        &self,
        x: &CpuBuf,
        w: &CpuWeight,
        step: &CpuStep,
        kvs: &mut [&mut CpuKv],
        l: &DeltaNetLayer,
        out: &mut CpuBuf,
    ) {
        recurrent::ssm_conv(x, w, step, kvs, l, out)
    }

    fn gated_delta_net(
        &self,
        qkv: &CpuBuf,
        alpha: &CpuBuf,
        beta: &CpuBuf,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
        step: &CpuStep,
        kvs: &mut [&mut CpuKv],
        l: &DeltaNetLayer,
        out: &mut CpuBuf,
    ) {
        recurrent::gated_delta_net(qkv, alpha, beta, dt_bias, a, step, kvs, l, out)
    }

    fn sigmoid_mul(&self, x: &mut CpuBuf, g: &CpuBuf) {
        assert!(
            g.rows == x.rows && (g.cols == x.cols || g.cols == 1),
            "sigmoid_mul: gates {}x{} for {}x{}",
            g.rows,
            g.cols,
            x.rows,
            x.cols
        );
        let (n, gc) = (x.cols.max(1), g.cols);
        for (r, row) in x.view_mut().chunks_mut(n).enumerate() {
            let gr = g.row(r);
            for (i, v) in row.iter_mut().enumerate() {
                *v *= 1.0 / (1.0 + (-gr[if gc == 1 { 0 } else { i }]).exp());
            }
        }
    }

    fn unzip_heads(&self, x: &CpuBuf, width: usize, a: &mut CpuBuf, b: &mut CpuBuf) {
        assert!(
            width > 0 && x.cols.is_multiple_of(2 * width),
            "unzip_heads: rows of {} values in pairs of {width}",
            x.cols
        );
        let half = x.cols / 2;
        a.shape_from(x.rows, &x.runs, half);
        b.shape_from(x.rows, &x.runs, half);
        for r in 0..x.rows {
            for (h, pair) in x.row(r).chunks(2 * width).enumerate() {
                a.data[r * half + h * width..r * half + (h + 1) * width].copy_from_slice(&pair[..width]);
                b.data[r * half + h * width..r * half + (h + 1) * width].copy_from_slice(&pair[width..]);
            }
        }
    }

    fn begin_step(&self, plan: StepPlan, kvs: &[&CpuKv]) -> Result<CpuStep> {
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
        Ok(CpuStep {
            plan,
            rope: Mutex::new(Vec::new()),
        })
    }

    fn embed(&self, table: &CpuWeight, step: &CpuStep, out: &mut CpuBuf) -> Result<()> {
        self.get_rows(table, &step.plan.ids, out)?;
        out.runs = Arc::from(step.plan.row_runs());
        Ok(())
    }

    fn get_rows(&self, table: &CpuWeight, ids: &[u32], out: &mut CpuBuf) -> Result<()> {
        let (n, rows) = (table.row_len(), table.n_rows());
        let codec = quant::codec(table.ty)
            .ok_or_else(|| EngineError::Model(format!("cannot decode embedding type {}", table.ty.name())))?;
        out.set_shape(ids.len(), n);
        let rb = table.row_bytes();
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= rows {
                return Err(EngineError::Input(format!(
                    "token id {id} is outside the vocabulary of {rows} tokens"
                )));
            }
            (codec.dequantize)(
                &table.bytes()[id * rb..(id + 1) * rb],
                &mut out.data[i * n..(i + 1) * n],
            );
        }
        Ok(())
    }

    fn split_cols(&self, x: &CpuBuf, outs: &mut [(usize, &mut CpuBuf)], width: usize) {
        for (off, out) in outs.iter_mut() {
            assert!(
                *off + width <= x.cols,
                "split_cols: columns {off}..{} of {}",
                *off + width,
                x.cols
            );
            out.shape_from(x.rows, &x.runs, width);
            for r in 0..x.rows {
                out.data[r * width..(r + 1) * width].copy_from_slice(&x.row(r)[*off..*off + width]);
            }
        }
    }

    fn select_rows(&self, x: &CpuBuf, rows: &[usize], out: &mut CpuBuf) {
        out.set_shape(rows.len(), x.cols);
        for (i, &r) in rows.iter().enumerate() {
            out.data[i * x.cols..(i + 1) * x.cols].copy_from_slice(x.row(r));
        }
    }

    // ggml-cpu/ops.cpp ggml_compute_forward_rms_norm_f32: sum of squares in double, scale in f32
    fn rms_norm(&self, x: &CpuBuf, w: &CpuWeight, eps: f32, out: &mut CpuBuf) {
        let n = x.cols;
        let wv = w.vector();
        let finish = |sum: f64, xr: &[f32], yr: &mut [f32]| {
            let mean = (sum / n as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(wv) {
                *y = (v * scale) * g;
            }
        };
        // Four rows at a time: their sums advance side by side (each in its own order).
        let body = |xs: &[f32], ys: &mut [f32]| {
            if xs.len() == 4 * n {
                let rows: [&[f32]; 4] = std::array::from_fn(|r| &xs[r * n..(r + 1) * n]);
                let sums = simd::sum_squares_x4(rows);
                for ((sum, xr), yr) in sums.into_iter().zip(xs.chunks(n)).zip(ys.chunks_mut(n)) {
                    finish(sum, xr, yr);
                }
            } else {
                for (xr, yr) in xs.chunks(n).zip(ys.chunks_mut(n)) {
                    finish(xr.iter().map(|&v| (v * v) as f64).sum(), xr, yr);
                }
            }
        };
        out.shape_from(x.rows, &x.runs, n);
        if x.rows > 1 {
            x.view()
                .par_chunks(4 * n)
                .zip(out.view_mut().par_chunks_mut(4 * n))
                .for_each(|(a, b)| body(a, b));
        } else {
            body(x.view(), out.view_mut());
        }
    }

    // ggml-cpu/ops.cpp ggml_compute_forward_norm_f32: mean, then variance of the centred row, both
    // summed in double
    fn layer_norm(&self, x: &CpuBuf, w: &CpuWeight, b: &CpuWeight, eps: f32, out: &mut CpuBuf) {
        let n = x.cols;
        let (wv, bv) = (w.vector(), b.vector());
        // Sums in eight f64 lanes (vectorised), then the lanes in order.
        fn sum8(x: &[f32], square: bool) -> f64 {
            let mut acc = [0f64; 8];
            let mut it = x.chunks_exact(8);
            for c in &mut it {
                for (a, &v) in acc.iter_mut().zip(c) {
                    let v = if square { v * v } else { v };
                    *a += v as f64;
                }
            }
            for (a, &v) in acc.iter_mut().zip(it.remainder()) {
                let v = if square { v * v } else { v };
                *a += v as f64;
            }
            acc.iter().sum()
        }
        let body = |xr: &[f32], yr: &mut [f32]| {
            let mean = (sum8(xr, false) / n as f64) as f32;
            for (y, &v) in yr.iter_mut().zip(xr) {
                *y = v - mean;
            }
            let var = sum8(yr, true);
            let scale = 1.0 / ((var / n as f64) as f32 + eps).sqrt();
            for ((y, &g), &c) in yr.iter_mut().zip(wv).zip(bv) {
                *y = (*y * scale) * g + c;
            }
        };
        map_rows(x, out, body);
    }

    fn gelu(&self, x: &mut CpuBuf) {
        let v = x.view_mut();
        self.pool.install(|| dense::gelu(v));
    }

    fn encoder_attention(
        &self,
        q: &CpuBuf,
        k: &CpuBuf,
        v: &CpuBuf,
        seqs: &[Range<usize>],
        n_head: usize,
        scale: f32,
        out: &mut CpuBuf,
    ) {
        let hd = q.cols / n_head.max(1);
        out.set_shape(q.rows, q.cols);
        let o = &mut out.data;
        self.pool
            .install(|| dense::attention(q.view(), k.view(), v.view(), seqs, n_head, hd, scale, o));
    }

    fn head_rms_norm(&self, x: &mut CpuBuf, w: Option<&CpuWeight>, head_dim: usize, eps: f32) {
        let wv = w.map(|w| w.vector());
        for h in x.view_mut().chunks_mut(head_dim) {
            let sum: f64 = h.iter().map(|&v| (v * v) as f64).sum();
            let scale = 1.0 / ((sum / head_dim as f64) as f32 + eps).sqrt();
            match wv {
                Some(wv) => {
                    for (v, &g) in h.iter_mut().zip(wv) {
                        *v = (*v * scale) * g;
                    }
                }
                None => {
                    for v in h.iter_mut() {
                        *v *= scale;
                    }
                }
            }
        }
    }

    fn gelu_tanh(&self, x: &mut CpuBuf) {
        let table = gelu_table();
        for v in x.view_mut() {
            *v = gelu_tanh_ggml(table, *v);
        }
    }

    fn matmul(&self, w: &CpuWeight, x: &CpuBuf, out: &mut CpuBuf) {
        self.matmul_many(&[w], x, &mut [out]);
    }

    /// Several weights by the same activations (Q/K/V, gate/up): the activations are converted
    /// once per activation type and all row tiles of all weights run in one parallel region.
    fn matmul_many(&self, ws: &[&CpuWeight], x: &CpuBuf, outs: &mut [&mut CpuBuf]) {
        assert_eq!(ws.len(), outs.len());
        let mut jobs: Vec<(&CpuWeight, &CpuBuf, &mut CpuBuf)> =
            ws.iter().zip(outs.iter_mut()).map(|(w, o)| (*w, x, &mut **o)).collect();
        self.matmul_each(&mut jobs);
    }

    /// Products with their own activations each (a MoE layer's experts): each distinct
    /// activation matrix is converted once per activation type, and all row tiles of all products
    /// run in one parallel region.
    fn matmul_each(&self, jobs: &mut [(&CpuWeight, &CpuBuf, &mut CpuBuf)]) {
        if jobs.is_empty() {
            return;
        }
        if jobs.iter().all(|(w, _, _)| w.dense.is_some()) {
            for (w, x, out) in jobs.iter_mut() {
                let (t, n) = (x.rows, x.cols);
                let d = w.dense.as_ref().expect("checked");
                assert_eq!(n, d.k, "matmul: activations of {n} columns by weight rows of {}", d.k);
                out.shape_from(t, &x.runs, d.n_out);
                self.pool.install(|| d.matmul(x.view(), t, &mut out.data, self.threads));
            }
            return;
        }
        // (activation buffer, its type) → converted rows, shared by the jobs that use them.
        let mut acts_of: Vec<(*const f32, GgmlType, usize, usize)> = Vec::new();
        let mut plan = Vec::with_capacity(jobs.len());
        let mut job_runs = Vec::with_capacity(jobs.len());
        for (w, x, out) in jobs.iter_mut() {
            job_runs.push(x.runs.clone());
            let (t, n) = (x.rows, x.cols);
            assert_eq!(
                n,
                w.row_len(),
                "matmul: activations of {n} columns by weight rows of {}",
                w.row_len()
            );
            let k = w.kernel.expect("weight type checked at model load");
            out.shape_from(t, &x.runs, w.n_rows());
            let key = (x.data.as_ptr(), k.act, t, n);
            let ai = match acts_of.iter().position(|&a| a == key) {
                Some(i) => i,
                None => {
                    acts_of.push(key);
                    acts_of.len() - 1
                }
            };
            plan.push((k, ai, t, n, SyncPtr(out.data.as_mut_ptr())));
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let have = scratch.len();
        scratch.resize_with(acts_of.len().max(have), Vec::new);
        for (ai, &(_, act, t, n)) in acts_of.iter().enumerate() {
            // The source of this conversion: the first job using it.
            let x = jobs
                .iter()
                .zip(&plan)
                .find(|(_, p)| p.1 == ai)
                .map(|(j, _)| j.1)
                .expect("every conversion has a job");
            let buf = &mut scratch[ai];
            let abytes = dot::act_row_bytes(act, n);
            buf.resize(t * abytes, 0);
            if t > 1 {
                buf.par_chunks_mut(abytes)
                    .zip(x.view().par_chunks(n))
                    .for_each(|(d, s)| dot::quantize_act(act, s, d));
            } else {
                dot::quantize_act(act, x.view(), &mut buf[..abytes]);
            }
        }
        // Row tiles: small enough to keep a tile of weight rows in L1/L2 while all token groups
        // stream past it, many enough that every thread gets several. (A multiple of PACK_ROWS,
        // so that packed groups are never split.)
        let single_rows: usize = jobs
            .iter()
            .zip(&plan)
            .filter(|(_, p)| p.2 == 1)
            .map(|(j, _)| j.0.n_rows())
            .sum();
        let single_tile = single_rows
            .div_ceil(self.threads * 8)
            .clamp(8, 256)
            .next_multiple_of(PACK_ROWS);
        let mut tiles = Vec::new();
        for (wi, ((w, _, _), p)) in jobs.iter().zip(&plan).enumerate() {
            let m = w.n_rows();
            let tile = if p.2 == 1 { single_tile } else { 16 };
            tiles.extend((0..m.div_ceil(tile)).map(|ti| (wi, ti * tile, ((ti + 1) * tile).min(m))));
        }
        let scratch: &[Vec<u8>] = &scratch;
        let ws: Vec<&CpuWeight> = jobs.iter().map(|j| j.0).collect();
        let plan = &plan;
        // Sequences' rows (`set_runs` on the activations): each sequence's columns are grouped
        // and given kernels as if it ran alone, so a reply does not depend on what else is
        // batched with it. Activations without runs are one run.
        let segs: Vec<Vec<(usize, usize)>> = plan
            .iter()
            .zip(&job_runs)
            .map(|(p, r)| super::run_segments(r, p.2))
            .collect();
        let segs = &segs;
        // One tile per task: rayon would otherwise hand out runs of tiles that cannot be split
        // once started, and the last run leaves the other threads idle.
        tiles.into_par_iter().with_max_len(1).for_each(|(wi, r0, r1)| {
            let (w, (k, ai, t, n, outp)) = (ws[wi], plan[wi]);
            let m = w.n_rows();
            let acts: &[u8] = &scratch[ai];
            let abytes = dot::act_row_bytes(k.act, n);
            // A sequence's slice of the activations and of the output.
            let part = |s0: usize, len: usize| (&acts[s0 * abytes..(s0 + len) * abytes], SyncPtr(outp.at(s0 * m)));
            if let Some(p) = &w.packed {
                // Groups of four activation rows sum in another order than fewer: per sequence.
                for &(s0, len) in &segs[wi] {
                    let (a, o) = part(s0, len);
                    packed_tile(p, n, len, m, r0..r1, a, abytes, o);
                }
                return;
            }
            let rb = w.row_bytes();
            let rows = &w.bytes()[r0 * rb..r1 * rb];
            // Batches where llama.cpp sums in another order take that order's kernel, decided
            // per sequence.
            if let Some(b) = k.batch {
                for &(s0, len) in &segs[wi] {
                    let (a, o) = part(s0, len);
                    let kern = if len >= k.batch_min {
                        Tile {
                            dot: b,
                            rows: None,
                            max_rows: 1,
                        }
                    } else {
                        Tile {
                            dot: k.dot,
                            rows: k.rows,
                            max_rows: k.max_rows,
                        }
                    };
                    kern.run(w.ty, n, len, m, r0..r1, rows, rb, a, abytes, o);
                }
                return;
            }
            let unpacked = k.unpacked.filter(|_| t >= dot::UNPACK_MIN);
            let run = |kern: Tile, wb: &[u8], rb: usize| kern.run(w.ty, n, t, m, r0..r1, wb, rb, acts, abytes, outp);
            match unpacked {
                Some(u) => UNPACKED.with_borrow_mut(|buf| {
                    // The tile's rows unpacked once for all the batch's activation rows.
                    let urb = n / 32 * u.block_bytes;
                    buf.resize((r1 - r0) * urb, 0);
                    for (d, s) in buf.chunks_exact_mut(urb).zip(rows.chunks_exact(rb)) {
                        (u.unpack)(n, s, d);
                    }
                    let kern = Tile {
                        dot: u.dot,
                        rows: Some(u.rows),
                        max_rows: k.max_rows,
                    };
                    run(kern, buf, urb)
                }),
                None => run(
                    Tile {
                        dot: k.dot,
                        rows: k.rows,
                        max_rows: k.max_rows,
                    },
                    rows,
                    rb,
                ),
            }
        });
    }

    fn add_bias(&self, x: &mut CpuBuf, b: &CpuWeight) {
        let bv = b.vector();
        let n = x.cols;
        let body = |r: &mut [f32]| {
            for (v, &c) in r.iter_mut().zip(bv) {
                *v += c;
            }
        };
        // Whole-batch encoder activations go to the pool; a decode step's row stays on this thread.
        if x.rows * n >= PARALLEL_ELEMS {
            x.view_mut().par_chunks_mut(n).for_each(body);
        } else {
            x.view_mut().chunks_mut(n).for_each(body);
        }
    }

    fn rope(&self, x: &mut CpuBuf, head_dim: usize, step: &CpuStep, rope: &Rope) {
        let cols = x.cols;
        assert_eq!(step.plan.positions.len(), x.rows);
        let caches = step.rope_caches(rope);
        let body = |(i, row): (usize, &mut [f32])| {
            for h in row.chunks_mut(head_dim) {
                rope::rotate(h, &caches[i], rope);
            }
        };
        if x.rows > 1 {
            x.view_mut().par_chunks_mut(cols).enumerate().for_each(body);
        } else {
            x.view_mut().chunks_mut(cols).enumerate().for_each(body);
        }
    }

    fn store_kv(&self, kvs: &mut [&mut CpuKv], step: &CpuStep, layer: usize, k: &CpuBuf, v: &CpuBuf) {
        for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
            store_rows(kv, layer, s.pos0, k, v, s.row0..s.row0 + s.rows);
        }
    }

    fn attention(&self, q: &CpuBuf, step: &CpuStep, kvs: &[&CpuKv], layer: &AttnLayer, out: &mut CpuBuf) {
        let runs: Vec<(&CpuKv, AttnArgs)> = kvs
            .iter()
            .zip(&step.plan.seqs)
            .map(|(kv, s)| (*kv, AttnArgs::new(s, layer)))
            .collect();
        attn::attention(self, q, &runs, out)
    }

    fn geglu(&self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        let table = gelu_table();
        let body = |(o, (g, u)): (&mut [f32], (&[f32], &[f32]))| {
            for ((o, &x), &y) in o.iter_mut().zip(g).zip(u) {
                *o = gelu_tanh_ggml(table, x) * y;
            }
        };
        let n = gate.cols.max(1);
        if gate.rows * gate.cols >= PARALLEL_ELEMS {
            out.view_mut()
                .par_chunks_mut(n)
                .zip(gate.view().par_chunks(n).zip(up.view().par_chunks(n)))
                .for_each(body);
        } else {
            body((out.view_mut(), (gate.view(), up.view())));
        }
    }

    fn scale(&self, x: &mut CpuBuf, f: f32) {
        for v in x.view_mut() {
            *v *= f;
        }
    }

    // llama.cpp graph: ggml_scale(1/cap), ggml_tanh, ggml_scale(cap)
    fn softcap(&self, x: &mut CpuBuf, cap: f32) {
        let inv = 1.0 / cap;
        let body = |r: &mut [f32]| {
            for v in r {
                *v = (*v * inv).tanh() * cap;
            }
        };
        if x.rows * x.cols >= PARALLEL_ELEMS {
            x.view_mut().par_chunks_mut(4096).for_each(body);
        } else {
            body(x.view_mut());
        }
    }

    fn mul(&self, x: &mut CpuBuf, y: &CpuBuf) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        for (a, &b) in x.view_mut().iter_mut().zip(y.view()) {
            *a *= b;
        }
    }

    fn mul_row(&self, x: &mut CpuBuf, w: &CpuWeight) {
        let wv = w.vector();
        for r in x.view_mut().chunks_mut(wv.len().max(1)) {
            for (a, &b) in r.iter_mut().zip(wv) {
                *a *= b;
            }
        }
    }

    fn scatter_rows(&self, src: &CpuBuf, rows: &[usize], dst: &mut CpuBuf) {
        assert_eq!(src.cols, dst.cols);
        let n = src.cols;
        for (i, &r) in rows.iter().enumerate() {
            assert!(r < dst.rows, "scatter_rows: row {r} of {}", dst.rows);
            dst.data[r * n..(r + 1) * n].copy_from_slice(src.row(i));
        }
    }

    // llama-graph.cpp build_moe_ffn: ggml_mul by the weights, then the experts' views added in slot order
    fn weighted_sum_rows(&self, src: &CpuBuf, weights: &[f32], k_per: usize, out: &mut CpuBuf) {
        let n = src.cols;
        let t = src.rows / k_per.max(1);
        out.set_shape(t, n);
        for i in 0..t {
            let o = &mut out.data[i * n..(i + 1) * n];
            for k in 0..k_per {
                let w = weights[i * k_per + k];
                let y = src.row(i * k_per + k);
                if k == 0 {
                    for (o, &y) in o.iter_mut().zip(y) {
                        *o = y * w;
                    }
                } else {
                    for (o, &y) in o.iter_mut().zip(y) {
                        *o += y * w;
                    }
                }
            }
        }
    }

    fn reshape(&self, x: &mut CpuBuf, rows: usize, cols: usize) {
        x.set_shape(rows, cols);
    }

    fn set_runs(&self, x: &mut CpuBuf, runs: &[usize]) {
        x.runs = Arc::from(runs);
    }

    fn runs(&self, x: &CpuBuf) -> Vec<usize> {
        x.runs.to_vec()
    }

    fn swiglu(&self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        let n = gate.cols;
        if gate.rows > 1 {
            out.view_mut()
                .par_chunks_mut(n)
                .zip(gate.view().par_chunks(n).zip(up.view().par_chunks(n)))
                .for_each(|(o, (g, u))| simd::silu_mul(g, u, o));
        } else {
            simd::silu_mul(gate.view(), up.view(), out.view_mut());
        }
    }

    fn add(&self, x: &mut CpuBuf, y: &CpuBuf) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols));
        let body = |(a, b): (&mut [f32], &[f32])| {
            for (a, &b) in a.iter_mut().zip(b) {
                *a += b;
            }
        };
        if x.rows * x.cols >= PARALLEL_ELEMS {
            x.view_mut()
                .par_chunks_mut(4096)
                .zip(y.view().par_chunks(4096))
                .for_each(body);
        } else {
            body((x.view_mut(), y.view()));
        }
    }

    fn read(&self, x: &CpuBuf) -> Vec<f32> {
        x.view().to_vec()
    }

    fn read_rows(&self, x: &CpuBuf, r0: usize, rows: usize) -> Vec<f32> {
        let cols = self.shape(x).1;
        x.view()[r0 * cols..(r0 + rows) * cols].to_vec()
    }

    /// The logits are here: a sampled token is drawn from the row where it lies
    /// (`sample_rows_on_host`), as from the row read whole.
    fn samples_on_device(&self) -> bool {
        true
    }

    /// Each asked row copied and drawn from on this backend's threads, the rows in parallel (as
    /// `sample_rows_on_host`, without reading them through one buffer first).
    fn sample_rows(&self, x: &CpuBuf, asks: &[crate::backend::SampleAsk]) -> Vec<u32> {
        let cols = self.shape(x).1;
        let v = x.view();
        self.pool.install(|| {
            asks.par_iter()
                .map(|a| crate::sampler::masses::sample_row(&mut v[a.row * cols..(a.row + 1) * cols].to_vec(), a))
                .collect()
        })
    }

    /// `top_of_rows_on_host` on this backend's threads.
    fn top_of_rows(&self, x: &CpuBuf, asks: &[crate::backend::TopAsk]) -> Vec<crate::backend::Top> {
        self.pool.install(|| crate::backend::top_of_rows_on_host(self, x, asks))
    }

    fn write(&self, x: &mut CpuBuf, rows: usize, cols: usize, data: &[f32]) {
        assert_eq!(
            data.len(),
            rows * cols,
            "write: {} values for {rows}x{cols}",
            data.len()
        );
        x.set_shape(rows, cols);
        x.view_mut().copy_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF holding one Q4_K matrix of `rows` rows of `n` values, opened as a model.
    fn q4k_model(dir: &std::path::Path, n: usize, rows: usize) -> Arc<gguf::GgufModel> {
        let mut s = 3u64;
        let vals: Vec<f32> = (0..n * rows)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        let data = quant::quantize(GgmlType::Q4_K, &vals, n, None).unwrap();
        let path = dir.join("w.gguf");
        let spec = gguf::writer::TensorSpec {
            name: "w".into(),
            ty: GgmlType::Q4_K,
            shape: vec![n as u64, rows as u64],
        };
        let mut w = gguf::writer::GgufWriter::create(&path, &gguf::Metadata::new(), &[spec]).unwrap();
        w.write_tensor(&data).unwrap();
        w.finish().unwrap();
        Arc::new(gguf::GgufModel::open(&path).unwrap())
    }

    /// A packed matrix (rows a multiple of 8) gives, for batches that end in full and partial
    /// groups of four tokens and for one token, exactly what the packed kernel gives for each
    /// group of rows, and within f32 rounding what the unpacked matrix gives.
    #[test]
    fn packed_matmul_places_every_group_and_token() {
        let cpu = Cpu::new(2).unwrap();
        if dot::packed::packing(GgmlType::Q4_K, cpu.path).is_none() {
            return; // no repacked kernel on this CPU: nothing packs
        }
        let dir = tempfile::tempdir().unwrap();
        let (n, rows) = (512, 40);
        let model = q4k_model(dir.path(), n, rows);
        let (file, info) = model.tensor("w").unwrap();
        let load = |matmul_only| {
            cpu.load_weight(WeightSource {
                name: "w",
                ty: info.ty,
                shape: &info.shape,
                data: file.tensor_data(info),
                matmul_only,
                owner: model.clone(),
            })
            .unwrap()
        };
        let (packed, plain) = (load(true), load(false));
        assert!(packed.packed.is_some() && plain.packed.is_none());
        let p = packed.packed.as_ref().unwrap();
        for t in [1, 3, 4, 5, 9] {
            let mut x = cpu.alloc(t, n);
            for (i, v) in x.data.iter_mut().enumerate() {
                *v = ((i * 37 % 101) as f32 - 50.0) / 40.0;
            }
            let (mut a, mut b) = (cpu.alloc(t, rows), cpu.alloc(t, rows));
            cpu.run(|| cpu.matmul(&packed, &x, &mut a));
            cpu.run(|| cpu.matmul(&plain, &x, &mut b));
            let ab = dot::act_row_bytes(GgmlType::Q8_K, n);
            let mut acts = vec![0u8; t * ab];
            for (d, s) in acts.chunks_mut(ab).zip(x.view().chunks(n)) {
                dot::quantize_act(GgmlType::Q8_K, s, d);
            }
            for t0 in (0..t).step_by(MAX_COLS) {
                let c = (t - t0).min(MAX_COLS);
                let cols: Vec<&[u8]> = (t0..t0 + c).map(|j| &acts[j * ab..(j + 1) * ab]).collect();
                for g in 0..rows / PACK_ROWS {
                    let mut want = vec![[0f32; PACK_ROWS]; c];
                    dot::packed::q4k_x8_reference(n, &p.data.as_slice()[g * p.group_bytes..], &cols, &mut want);
                    for (j, w) in want.iter().enumerate() {
                        assert_eq!(
                            &a.row(t0 + j)[g * PACK_ROWS..(g + 1) * PACK_ROWS],
                            w,
                            "t={t} token {} group {g}",
                            t0 + j
                        );
                    }
                }
            }
            for (u, v) in a.view().iter().zip(b.view()) {
                // Same integer sums, f32 accumulation in another order: a few ulps of results ~1.
                assert!((u - v).abs() <= 1e-4 * v.abs().max(1.0), "t={t}: {u} vs {v}");
            }
        }
    }
}
