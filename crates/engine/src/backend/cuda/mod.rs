//! The CUDA backend: weights uploaded once in their GGUF types, activations as f32 matrices in
//! device memory, the paged KV cache in device memory (`kv.rs`), every op a kernel of
//! `kernels/*.cu` compiled by NVRTC at first use (`compile.rs`). All work goes to one stream in
//! order; only `read` (logits, embeddings) waits for the device.
//!
//! The CUDA libraries are loaded at run time (cudarc's dynamic loading), so this backend is in
//! every build and a machine without a GPU gets [`Cuda::new`]'s error, never a crash.

mod compile;
mod kv;

pub use kv::{CudaKv, GpuPage};

use super::{AttnLayer, Backend, KvType, Rope, StepPlan, WeightSource};
use crate::{EngineError, Result};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use gguf::GgmlType;
use std::collections::HashMap;
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

/// The kernel modules as the device knows them.
struct Kernels {
    funcs: HashMap<String, CudaFunction>,
    _modules: Vec<Arc<CudaModule>>,
}

/// The device, its stream and kernels, shared by the backend, its buffers and its KV pools.
pub struct Dev {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    name: String,
    ordinal: usize,
    /// How many modules were compiled now (not taken from the disk cache).
    compiled: usize,
}

/// A step's layout as the kernels read it (`struct Step` in `kernels/attention.cu`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct StepArgs {
    row_seq: u64,
    row_pos: u64,
    seq_pos0: u64,
    seq_rows: u64,
    poff: u64,
    ptab: u64,
}
// SAFETY: plain old data of device pointers, laid out as the kernel's struct.
unsafe impl DeviceRepr for StepArgs {}

/// One kernel argument.
enum A {
    P(u64),
    I(i32),
    F(f32),
    S(StepArgs),
}

fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0.max(1), grid.1.max(1), 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn blocks(n: u64, per: u32) -> u32 {
    u32::try_from(n.div_ceil(per as u64)).expect("grid within u32")
}

impl Dev {
    fn open(ordinal: usize) -> Result<Dev> {
        // SAFETY: the presence check only opens the library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(EngineError::Backend(
                "no NVIDIA driver library (libcuda.so.1) found: --device cuda needs an NVIDIA GPU and its driver"
                    .into(),
            ));
        }
        let err = |what: &str, e: &dyn std::fmt::Display| EngineError::Backend(format!("CUDA {what}: {e}"));
        let count = CudaContext::device_count().map_err(|e| err("device count", &e))?;
        if ordinal >= count.max(0) as usize {
            return Err(EngineError::Backend(format!(
                "--device cuda:{ordinal}: this machine has {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| err("context", &e))?;
        // One stream, in order: the per-buffer events cudarc can keep for several streams are not
        // needed (and cost two events per allocation).
        // SAFETY: no buffers exist yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        // Keep freed stream-ordered memory in the pool (the default returns it at every sync).
        // SAFETY: the device's default pool; a u64 attribute value.
        unsafe {
            let mut pool = std::ptr::null_mut();
            if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS {
                let mut max = u64::MAX;
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut max as *mut u64 as *mut _,
                );
            }
        }
        let cc = ctx.compute_capability().map_err(|e| err("compute capability", &e))?;
        let name = ctx.name().map_err(|e| err("device name", &e))?;
        let mut funcs = HashMap::new();
        let mut modules = Vec::new();
        let mut compiled = 0;
        for (m, src) in compile::MODULES {
            let (cubin, fresh) = compile::module_cubin(m, src, cc)?;
            compiled += fresh as usize;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .map_err(|e| err(&format!("loading module {m}"), &e))?;
            for f in kernel_names(m) {
                let func = module
                    .load_function(&f)
                    .map_err(|e| err(&format!("kernel {f} of module {m}"), &e))?;
                funcs.insert(f, func);
            }
            modules.push(module);
        }
        Ok(Dev {
            ctx,
            stream,
            kernels: Kernels {
                funcs,
                _modules: modules,
            },
            name: format!("{name} (sm_{}{})", cc.0, cc.1),
            ordinal,
            compiled,
        })
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> ! {
        panic!("CUDA error on device {} in {what}: {e}", self.ordinal)
    }

    fn alloc_bytes(&self, n: usize) -> std::result::Result<CudaSlice<u8>, cudarc::driver::DriverError> {
        // SAFETY: the bytes are written before they are read (weights, KV pages after a memset).
        unsafe { self.stream.alloc::<u8>(n.max(1)) }
    }

    fn alloc_f32(&self, n: usize) -> CudaSlice<f32> {
        // SAFETY: ops write their outputs' logical shape before anything reads it.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }
            .unwrap_or_else(|e| self.fail(&format!("allocating {n} floats"), e))
    }

    fn upload<T: DeviceRepr>(&self, data: &[T]) -> CudaSlice<T> {
        if data.is_empty() {
            // SAFETY: a one-element placeholder nothing reads.
            return unsafe { self.stream.alloc::<T>(1) }.unwrap_or_else(|e| self.fail("allocating", e));
        }
        self.stream
            .clone_htod(data)
            .unwrap_or_else(|e| self.fail(&format!("uploading {} values", data.len()), e))
    }

    fn memset(&self, ptr: u64, bytes: usize) {
        // SAFETY: `ptr .. ptr + bytes` is a page of this device's pool.
        let rc = unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("memset", format!("{rc:?}"));
        }
    }

    fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) {
        // SAFETY: two pages of `bytes` of this device's pool.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("device copy", format!("{rc:?}"));
        }
    }

    fn read_bytes(&self, ptr: u64, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        // SAFETY: `ptr .. + bytes` is device memory of this context; `out` has `bytes`.
        unsafe {
            let rc = sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut _, ptr, bytes, self.stream.cu_stream());
            if rc != sys::CUresult::CUDA_SUCCESS {
                self.fail("reading device memory", format!("{rc:?}"));
            }
        }
        self.sync();
        out
    }

    fn write_bytes(&self, ptr: u64, data: &[u8]) {
        // SAFETY: `ptr .. + len` is device memory of this context; pageable host memory is copied
        // before the call returns.
        let rc =
            unsafe { sys::cuMemcpyHtoDAsync_v2(ptr, data.as_ptr() as *const _, data.len(), self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("writing device memory", format!("{rc:?}"));
        }
    }

    fn sync(&self) {
        self.stream
            .synchronize()
            .unwrap_or_else(|e| self.fail("a kernel (seen at synchronize)", e));
    }

    fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[A]) {
        let f = self
            .kernels
            .funcs
            .get(name)
            .unwrap_or_else(|| panic!("CUDA kernel {name} is not in the compiled modules"));
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                A::P(p) => b.arg(p),
                A::I(i) => b.arg(i),
                A::F(x) => b.arg(x),
                A::S(s) => b.arg(s),
            };
        }
        // SAFETY: the arguments match the kernel's parameters (`kernels/*.cu`), pointers are live
        // device buffers of the sizes the kernel indexes.
        unsafe { b.launch(cfg(grid, block)) }.unwrap_or_else(|e| self.fail(&format!("launching {name}"), e));
    }
}

/// Every kernel of a module (the names the `.cu` files define).
fn kernel_names(module: &str) -> Vec<String> {
    match module {
        "ops" => {
            let mut v: Vec<String> = [
                "rms_norm",
                "head_rms_norm",
                "layer_norm",
                "unary",
                "binary",
                "row_op",
                "split_cols",
                "move_rows",
                "weighted_sum_rows",
                "rope",
                "to_half",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for &t in DEVICE_TYPES {
                v.push(format!("get_rows_{}", ty_name(t)));
                v.push(format!("decode_{}", ty_name(t)));
            }
            v
        }
        "matmul" => DEVICE_TYPES
            .iter()
            .flat_map(|&t| MMV_ROWS.iter().map(move |r| format!("mmv_{}_{r}", ty_name(t))))
            .collect(),
        "attention" => ["store_kv", "attn_f16", "attn_q8_0", "encoder_attn"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// The CUDA backend on one device.
pub struct Cuda {
    dev: Arc<Dev>,
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
        })
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
    data: CudaSlice<f32>,
    cap: usize,
    rows: usize,
    cols: usize,
    /// As `CpuBuf::runs`.
    runs: Arc<[usize]>,
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
    _tables: CudaSlice<i32>,
    ids: CudaSlice<u32>,
    ptab_host: Mutex<Vec<u64>>,
    ptab: CudaSlice<u64>,
    args: StepArgs,
    rope: Mutex<Vec<(Rope, CudaSlice<f32>)>>,
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

    fn threads(&self) -> usize {
        1
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
        Ok(CudaWeight {
            data,
            ty: src.ty,
            dev_ty,
            shape: src.shape.to_vec(),
            row_bytes: dev_ty.row_bytes(n).unwrap_or(0) as usize,
        })
    }

    fn weight_type(&self, w: &CudaWeight) -> GgmlType {
        w.ty
    }

    fn weight_shape<'a>(&self, w: &'a CudaWeight) -> &'a [u64] {
        &w.shape
    }

    fn alloc(&self, rows: usize, cols: usize) -> CudaBuf {
        CudaBuf {
            data: self.dev.alloc_f32(rows * cols),
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
        let tables = self.dev.upload(&t);
        let ids = self.dev.upload(&plan.ids);
        let ptab = self.dev.upload(&ptab_host);
        let base = self.dev.ptr(&tables);
        let at = |i: usize| base + 4 * i as u64;
        let args = StepArgs {
            row_seq: at(0),
            row_pos: at(rows),
            seq_pos0: at(2 * rows),
            seq_rows: at(2 * rows + s),
            poff: at(2 * rows + 2 * s),
            ptab: self.dev.ptr(&ptab),
        };
        Ok(CudaStep {
            plan,
            _tables: tables,
            ids,
            ptab_host: Mutex::new(ptab_host),
            ptab,
            args,
            rope: Mutex::new(Vec::new()),
        })
    }

    fn embed(&self, table: &CudaWeight, step: &CudaStep, out: &mut CudaBuf) -> Result<()> {
        let rows = table.n_rows();
        if let Some(&id) = step.plan.ids.iter().find(|&&id| id as usize >= rows) {
            return Err(EngineError::Input(format!(
                "token id {id} is outside the vocabulary of {rows} tokens"
            )));
        }
        self.gather(table, self.dev.ptr(&step.ids), step.plan.ids.len(), out);
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
        self.gather(table, self.dev.ptr(&dev_ids), ids.len(), out);
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
                    A::P(self.dev.ptr(&x.data)),
                    A::P(self.dev.ptr(&out.data)),
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
        out.shape_from(x.rows, &x.runs, x.cols);
        self.dev.launch(
            "rms_norm",
            (x.rows as u32, 1),
            256,
            &[
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&w.data)),
                A::P(self.dev.ptr(&out.data)),
                A::I(x.cols as i32),
                A::F(eps),
            ],
        );
    }

    fn layer_norm(&self, x: &CudaBuf, w: &CudaWeight, b: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        out.shape_from(x.rows, &x.runs, x.cols);
        self.dev.launch(
            "layer_norm",
            (x.rows as u32, 1),
            256,
            &[
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&w.data)),
                A::P(self.dev.ptr(&b.data)),
                A::P(self.dev.ptr(&out.data)),
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
                A::P(self.dev.ptr(&x.data)),
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
        let (t, n, m) = (x.rows, x.cols, w.n_rows());
        assert_eq!(
            n,
            w.row_len(),
            "matmul: activations of {n} columns by weight rows of {}",
            w.row_len()
        );
        out.shape_from(t, &x.runs, m);
        let name = ty_name(w.dev_ty);
        // Eight rows at a time: each launch decodes the weight once for up to eight rows.
        for r0 in (0..t).step_by(8) {
            let rows = (t - r0).min(8);
            let r = MMV_ROWS.iter().copied().find(|&r| r >= rows).expect("at most 8");
            self.dev.launch(
                &format!("mmv_{name}_{r}"),
                (blocks(m as u64, 4), 1),
                128,
                &[
                    A::P(self.dev.ptr(&w.data)),
                    A::P(w.row_bytes as u64),
                    A::P(self.dev.ptr(&x.data) + 4 * (r0 * n) as u64),
                    A::P(self.dev.ptr(&out.data) + 4 * (r0 * m) as u64),
                    A::I(n as i32),
                    A::I(m as i32),
                    A::I(rows as i32),
                ],
            );
        }
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaWeight) {
        self.row_op(x, b, 0);
    }

    fn rope(&self, x: &mut CudaBuf, head_dim: usize, step: &CudaStep, rope: &Rope) {
        assert_eq!(step.plan.positions.len(), x.rows);
        let half = rope.n_dims / 2;
        let mut memo = step.rope.lock().unwrap_or_else(|e| e.into_inner());
        let i = match memo.iter().position(|(r, _)| r == rope) {
            Some(i) => i,
            None => {
                // The CPU's tables (ggml_rope_cache_init), computed on the host once per step.
                let mut cs = Vec::with_capacity(x.rows * half * 2);
                for &p in &step.plan.positions {
                    for (c, s) in super::cpu::rope::cache(rope, p as f32) {
                        cs.push(c);
                        cs.push(s);
                    }
                }
                memo.push((rope.clone(), self.dev.upload(&cs)));
                memo.len() - 1
            }
        };
        let n = (x.rows * (x.cols / head_dim) * half) as u64;
        self.dev.launch(
            "rope",
            (blocks(n, 256), 1),
            256,
            &[
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&memo[i].1)),
                A::I(x.rows as i32),
                A::I(x.cols as i32),
                A::I(head_dim as i32),
                A::I(rope.n_dims as i32),
                A::I(rope.neox as i32),
            ],
        );
    }

    fn store_kv(&self, kvs: &mut [&mut CudaKv], step: &CudaStep, layer: usize, k: &CudaBuf, v: &CudaBuf) {
        let Some(first) = kvs.first() else { return };
        let layout = first.layout.clone();
        let (kd, vd) = layout.dims[layer];
        assert_eq!((k.cols, v.cols), (kd, vd), "KV rows of layer {layer}");
        // Pages shared with other holders are copied before the write (the page table follows).
        let mut changed = false;
        let mut entry = 0usize;
        let mut ptab = step.ptab_host.lock().unwrap_or_else(|e| e.into_inner());
        for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
            assert!(
                s.pos0 + s.rows <= kv.capacity(),
                "KV cache of {} positions cannot hold {}",
                kv.capacity(),
                s.pos0 + s.rows
            );
            if s.rows > 0 {
                for b in s.pos0 / crate::model::PAGE..=(s.pos0 + s.rows - 1) / crate::model::PAGE {
                    if kv
                        .own_page(b)
                        .unwrap_or_else(|e| self.dev.fail("copying a shared KV page", e))
                    {
                        ptab[entry + b] = kv.pages[b].ptr;
                        changed = true;
                    }
                }
            }
            entry += kv.pages.len();
        }
        if changed {
            // SAFETY: the same table, same length, on the stream before the kernels that read it.
            let bytes: Vec<u8> = ptab.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.dev.write_bytes(self.dev.ptr(&step.ptab), &bytes);
        }
        drop(ptab);
        let (ko, vo) = layout.offsets[layer];
        let rows = step.plan.positions.len();
        self.dev.launch(
            "store_kv",
            (rows as u32, 2),
            128,
            &[
                A::S(step.args),
                A::P(self.dev.ptr(&k.data)),
                A::P(self.dev.ptr(&v.data)),
                A::I(kd as i32),
                A::I(vd as i32),
                A::P(ko as u64),
                A::P(vo as u64),
                A::I((layout.ty == KvType::Q8_0) as i32),
            ],
        );
    }

    fn attention(&self, q: &CudaBuf, step: &CudaStep, kvs: &[&CudaKv], l: &AttnLayer, out: &mut CudaBuf) {
        let Some(first) = kvs.first() else { return };
        assert!(
            l.head_dim <= MAX_HEAD_DIM,
            "CUDA attention takes heads of at most {MAX_HEAD_DIM} values, not {}",
            l.head_dim
        );
        let layout = &first.layout;
        out.shape_from(q.rows, &q.runs, l.n_head * l.head_dim);
        let (ko, vo) = layout.offsets[l.layer];
        let (kb, vb) = layout.row_bytes[l.layer];
        let name = match layout.ty {
            KvType::F16 => "attn_f16",
            KvType::Q8_0 => "attn_q8_0",
        };
        self.dev.launch(
            name,
            (q.rows as u32, l.n_head as u32),
            128,
            &[
                A::S(step.args),
                A::P(self.dev.ptr(&q.data)),
                A::P(self.dev.ptr(&out.data)),
                A::I(q.cols as i32),
                A::I(l.head_dim as i32),
                A::I(l.n_head as i32),
                A::I(l.n_kv_head as i32),
                A::F(l.scale),
                A::I(l.window.unwrap_or(0) as i32),
                A::I(l.causal as i32),
                A::P(ko as u64),
                A::P(vo as u64),
                A::I(kb as i32),
                A::I(vb as i32),
            ],
        );
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
                A::P(self.dev.ptr(&q.data)),
                A::P(self.dev.ptr(&k.data)),
                A::P(self.dev.ptr(&v.data)),
                A::P(self.dev.ptr(&out.data)),
                A::P(self.dev.ptr(&lo)),
                A::P(self.dev.ptr(&hi)),
                A::I(q.cols as i32),
                A::I(hd as i32),
                A::F(scale),
            ],
        );
    }

    fn swiglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        self.binary(gate, up, out, 2);
    }

    fn geglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        out.shape_from(gate.rows, &gate.runs, gate.cols);
        self.binary(gate, up, out, 3);
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
            (t as u32, 1),
            256,
            &[
                A::P(self.dev.ptr(&src.data)),
                A::P(self.dev.ptr(&w)),
                A::P(self.dev.ptr(&out.data)),
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
        let mut out = vec![0f32; n];
        if n > 0 {
            self.dev
                .stream
                .memcpy_dtoh(&x.data.slice(0..n), &mut out)
                .unwrap_or_else(|e| self.dev.fail("reading a buffer", e));
        }
        self.dev.sync();
        out
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
            let mut dst = x.data.slice_mut(0..data.len());
            self.dev
                .stream
                .memcpy_htod(data, &mut dst)
                .unwrap_or_else(|e| self.dev.fail("writing a buffer", e));
        }
    }
}

impl Cuda {
    fn gather(&self, table: &CudaWeight, ids: u64, count: usize, out: &mut CudaBuf) {
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
                A::P(self.dev.ptr(&out.data)),
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
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&out.data)),
                A::P(self.dev.ptr(&idx)),
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
            &[A::P(self.dev.ptr(&x.data)), A::P(n), A::I(op), A::F(a)],
        );
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
            &[
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&y.data)),
                A::P(self.dev.ptr(&out.data)),
                A::P(n),
                A::I(op),
            ],
        );
    }

    fn in_place(&self, x: &mut CudaBuf, y: &CudaBuf, op: i32) {
        let n = x.len();
        if n == 0 {
            return;
        }
        let p = self.dev.ptr(&x.data);
        self.dev.launch(
            "binary",
            (blocks(n, 256), 1),
            256,
            &[A::P(p), A::P(self.dev.ptr(&y.data)), A::P(p), A::P(n), A::I(op)],
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
                A::P(self.dev.ptr(&x.data)),
                A::P(self.dev.ptr(&w.data)),
                A::P(n),
                A::I(w.row_len() as i32),
                A::I(op),
            ],
        );
    }
}
