//! The device side of the CUDA backend: context, stream, compiled kernels, and how launches reach
//! the GPU — recorded, issued together, replayed as CUDA graphs when a step repeats — plus the
//! per-step upload arena and deferred frees.

use super::{compile, ty_name, DEVICE_TYPES, MMQ_MOE_NT, MMQ_NT, MMQ_TYPES, MMV_ROWS};
use crate::{EngineError, Result};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The kernel modules as the device knows them.
pub(super) struct Kernels {
    pub(super) by_name: HashMap<String, usize>,
    pub(super) funcs: Vec<CudaFunction>,
    names: Vec<String>,
    _modules: Vec<Arc<CudaModule>>,
}

/// Steps run whole before `HF2Q_CUDA_SKIP` leaves its kernels out (bench's warm-up run of a test
/// is longer), so that what they write holds a real step's values.
const SKIP_AFTER: usize = 40;

/// A recorded launch: kernel index, grid, block, arguments, and whether it may start before the
/// kernel ahead of it ends (programmatic dependent launch: the kernel waits for it itself).
#[derive(Clone, PartialEq)]
struct Launch {
    f: usize,
    grid: (u32, u32),
    block: u32,
    args: Vec<A>,
    early: bool,
}

/// An instantiated CUDA graph of a run of launches.
struct Graph {
    launches: Vec<Launch>,
    exec: sys::CUgraphExec,
}

/// Launches are recorded, not issued, until something needs their results or the stream's order
/// (a read, a copy into an existing buffer, a cuBLAS call), or `flush_every` of them wait; then
/// they are issued together (`Dev::flush`). A run of launches seen in a recent flush (same
/// kernels, grids and arguments: a part of a decode step, whose step data sits at the same arena
/// addresses every time) is captured once as a CUDA graph and replayed: a few launches per step
/// instead of hundreds, and the GPU runs the step's first parts while the host records the rest.
struct Recorder {
    pending: Vec<Launch>,
    /// Hashes of the recent flushes' launches (a run seen twice is captured).
    seen: std::collections::VecDeque<u64>,
    graphs: Vec<Graph>,
    /// Per-step small uploads (step tables, ids, rope tables), bump-allocated: the same sequence
    /// of uploads lands at the same addresses every step, so the launches that read them repeat.
    arena: Option<CudaSlice<u8>>,
    arena_off: usize,
    /// Allocations dropped while launches that may use them were still recorded.
    graveyard: Vec<Box<dyn Send>>,
    /// Arenas replaced during the current step: the step's earlier uploads (its tables, read by
    /// every layer's launches) stay there until the step ends.
    old_arenas: Vec<CudaSlice<u8>>,
}

// SAFETY: the graph handles are used under the recorder's mutex only.
unsafe impl Send for Recorder {}

/// Graphs kept per device (the parts of each decode shape of the batch).
const MAX_GRAPHS: usize = 96;
/// Flushes remembered for capturing a run seen again.
const SEEN_FLUSHES: usize = 64;
/// Launches issued together at most, by default (`Dev::flush_every`).
const FLUSH_EVERY: usize = 64;
/// First arena size in bytes (grown by doubling).
const ARENA_BYTES: usize = 8 << 20;

/// A grow-only f16 / bf16 scratch buffer.
pub(super) type HalfScratch = Option<CudaSlice<u16>>;

/// Page-locked host memory (`cuMemAllocHost`), freed when dropped; null where it could not be had.
pub(super) struct PageLocked(pub(super) *mut u8);
// SAFETY: host memory owned by the device object, used under its mutexes only.
unsafe impl Send for PageLocked {}

impl PageLocked {
    pub(super) fn new(bytes: usize) -> PageLocked {
        let mut p = std::ptr::null_mut();
        // SAFETY: a fresh allocation of `bytes`; null kept on failure.
        let ok = unsafe { sys::cuMemAllocHost_v2(&mut p, bytes) } == sys::CUresult::CUDA_SUCCESS;
        PageLocked(if ok { p as *mut u8 } else { std::ptr::null_mut() })
    }

    pub(super) fn null() -> PageLocked {
        PageLocked(std::ptr::null_mut())
    }
}

impl Drop for PageLocked {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by cuMemAllocHost; no copy into it is pending (a buffer is
            // replaced only when idle, and the device syncs its stream before its fields drop).
            unsafe { sys::cuMemFreeHost(self.0 as *mut _) };
        }
    }
}

/// The host side of reads: a grow-only page-locked buffer of `len` bytes (`len` usize::MAX with
/// a null buffer: pageable memory from then on).
pub(super) struct Pinned {
    host: PageLocked,
    len: usize,
}

/// The device, its stream and kernels, shared by the backend, its buffers and its KV pools.
pub struct Dev {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) kernels: Kernels,
    pub(super) name: String,
    pub(super) ordinal: usize,
    /// Compute capability (major, minor).
    pub(super) cc: (i32, i32),
    /// How many modules were compiled now (not taken from the disk cache).
    pub(super) compiled: usize,
    /// cuBLAS for products of many rows (None where libcublas is missing: the matrix-vector
    /// kernels take every product).
    pub(super) blas: Option<cudarc::cublas::CudaBlas>,
    rec: Mutex<Recorder>,
    /// `HF2Q_CUDA_GRAPHS=0` issues every launch directly.
    graphs: bool,
    /// Recorded launches are issued once this many wait (0: only when something needs them):
    /// `HF2Q_CUDA_FLUSH_EVERY=N`.
    flush_every: usize,
    /// Kernels recorded with `launch_early` may start before the one ahead ends (compute
    /// capability 9.0 and later; `HF2Q_CUDA_PDL=0` turns it off). On by default since it measured
    /// faster on an H200 with steps issued in parts: 8B Q4_K_M 332.0 against 326.4 tokens/s, the
    /// MoE 474.1 against 467.1 (bench/runs/2026-12-03-h200/cuda-session4, call 5; it had measured
    /// slower before that, 237.9 against 243.9 in bench/runs/2026-12-03-h200/cuda-mmq).
    pdl: bool,
    /// Scratch of the cuBLAS path: a decoded weight chunk and the activations, in f16 / bf16.
    pub(super) scratch: Mutex<(HalfScratch, HalfScratch)>,
    /// Activation rows quantized for the integer tensor-core kernels (grow-only).
    pub(super) q8: Mutex<Option<CudaSlice<u8>>>,
    /// `top_rows`' values, columns and values at the asked columns (grow-only).
    pub(super) top_out: Mutex<Option<CudaSlice<f32>>>,
    /// `argmax_rows`' chunk maxima and indices and its output (grow-only).
    pub(super) argmax: Mutex<Option<CudaSlice<u32>>>,
    /// Split-K attention's partial outputs, maxima and sums (grow-only).
    pub(super) attn_part: Mutex<Option<CudaSlice<f32>>>,
    /// Split-K attention's finished splits per (row, KV head) when the last one merges them
    /// (`attn_dec_f16`'s merge_last; zeroed when made, set back to 0 by each merge; grow-only).
    pub(super) attn_cnt: Mutex<Option<CudaSlice<i32>>>,
    /// The MoE router's finished blocks when its last one routes (`Fuse::Route`; the same).
    pub(super) route_cnt: Mutex<Option<CudaSlice<i32>>>,
    /// Each (row, slot) pair's finished gate / up blocks when its last one makes the GLU
    /// (`mmq_moe_glu_*`; the same).
    pub(super) glu_cnt: Mutex<Option<CudaSlice<i32>>>,
    /// The fused FFN input's finished blocks when its last one does the residual add (the same).
    pub(super) add_cnt: Mutex<Option<CudaSlice<i32>>>,
    /// Launches (and host writes) so far: a value recorded after a launch says whether anything
    /// ran since.
    pub(super) seq: std::sync::atomic::AtomicU64,
    /// Per-kernel timing (`HF2Q_CUDA_PROFILE`).
    prof: Option<super::prof::Prof>,
    /// Per-replay timing (`HF2Q_CUDA_STEP_TIMES`).
    step_times: Option<super::prof::StepTimes>,
    /// A kernel whose every launch is recorded twice (`HF2Q_CUDA_TWICE=NAME`, a name as the
    /// profile prints it): a step's time with it against without is what that kernel costs where
    /// launches overlap, which the event-timed profile cannot show. For timing only: a kernel that
    /// updates its input in place gives other numbers when run twice.
    twice: Option<String>,
    /// Kernels whose launches are left out after the first `SKIP_AFTER` steps
    /// (`HF2Q_CUDA_SKIP=NAME[,NAME...]`, names as the profile prints them): a step's time with
    /// them less its time without them is what they add to the chain of launches, the most that
    /// fusing them away could save. For timing only: the outputs are wrong (the skipped kernels'
    /// outputs keep what the steps before left there). Not every kernel can be left out alone:
    /// `attn_combine_q8`, `add_rms_norm_q8` or `add_ws_rms_norm_q8` alone ended in
    /// CUDA_ERROR_ILLEGAL_ADDRESS on the MoE (the three together ran; cause not found;
    /// bench/runs/2026-12-06-h100-g call 2).
    skip: Vec<String>,
    /// Steps begun (`new_step`), for `skip`.
    steps: std::sync::atomic::AtomicUsize,
    /// The host side of reads (`read_with`).
    pinned: Mutex<Pinned>,
    /// Deferred argmaxes and page-locked step uploads (`feed.rs`).
    pub(super) feed: Mutex<super::feed::Feed>,
}

/// A step's layout as the kernels read it (`struct Step` in `kernels/attention.cu`).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Hash)]
pub(super) struct StepArgs {
    pub(super) row_seq: u64,
    pub(super) row_pos: u64,
    pub(super) seq_pos0: u64,
    pub(super) seq_rows: u64,
    pub(super) poff: u64,
    pub(super) ptab: u64,
}
// SAFETY: plain old data of device pointers, laid out as the kernel's struct.
unsafe impl DeviceRepr for StepArgs {}

/// One kernel argument.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum A {
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

pub(super) fn blocks(n: u64, per: u32) -> u32 {
    u32::try_from(n.div_ceil(per as u64)).expect("grid within u32")
}

impl Dev {
    pub(super) fn open(ordinal: usize) -> Result<Dev> {
        // SAFETY: the presence check only opens the library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(EngineError::Unsupported(
                "no NVIDIA driver library (libcuda.so.1) found: --device cuda needs an NVIDIA GPU and its driver"
                    .into(),
            ));
        }
        let err = |what: &str, e: &dyn std::fmt::Display| EngineError::Backend(format!("CUDA {what}: {e}"));
        let count = CudaContext::device_count().map_err(|e| err("device count", &e))?;
        if ordinal >= count.max(0) as usize {
            return Err(EngineError::Unsupported(format!(
                "--device cuda:{ordinal}: this machine has {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| err("context", &e))?;
        // One stream, in order: the per-buffer events cudarc can keep for several streams are not
        // needed (and cost two events per allocation).
        // SAFETY: no buffers exist yet.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(|e| err("stream", &e))?;
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
        let mut by_name = HashMap::new();
        let mut funcs = Vec::new();
        let mut names = Vec::new();
        let mut modules = Vec::new();
        let mut compiled = 0;
        for ((m, _), built) in compile::MODULES.iter().zip(compile::compile_all(cc)) {
            let (cubin, fresh) = built?;
            compiled += fresh as usize;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .map_err(|e| err(&format!("loading module {m}"), &e))?;
            for f in kernel_names(m) {
                let func = module
                    .load_function(&f)
                    .map_err(|e| err(&format!("kernel {f} of module {m}"), &e))?;
                by_name.insert(f.clone(), funcs.len());
                names.push(f);
                funcs.push(func);
            }
            modules.push(module);
        }
        // SAFETY: the presence check only opens the library.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            Some(cudarc::cublas::CudaBlas::new(stream.clone()).map_err(|e| err("cuBLAS handle", &e))?)
        } else {
            tracing::warn!("libcublas not found: products of many rows use the matrix-vector kernels (slow prompts)");
            None
        };
        Ok(Dev {
            ctx,
            stream,
            kernels: Kernels {
                by_name,
                funcs,
                names,
                _modules: modules,
            },
            name: format!("{name} (sm_{}{})", cc.0, cc.1),
            ordinal,
            cc,
            compiled,
            blas,
            rec: Mutex::new(Recorder {
                pending: Vec::new(),
                seen: std::collections::VecDeque::new(),
                graphs: Vec::new(),
                arena: None,
                arena_off: 0,
                graveyard: Vec::new(),
                old_arenas: Vec::new(),
            }),
            graphs: std::env::var("HF2Q_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            flush_every: std::env::var("HF2Q_CUDA_FLUSH_EVERY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(FLUSH_EVERY),
            pdl: cc.0 >= 9 && std::env::var("HF2Q_CUDA_PDL").map_or(true, |v| v != "0"),
            scratch: Mutex::new((None, None)),
            q8: Mutex::new(None),
            attn_part: Mutex::new(None),
            attn_cnt: Mutex::new(None),
            route_cnt: Mutex::new(None),
            glu_cnt: Mutex::new(None),
            add_cnt: Mutex::new(None),
            argmax: Mutex::new(None),
            top_out: Mutex::new(None),
            seq: std::sync::atomic::AtomicU64::new(0),
            prof: super::prof::Prof::from_env(),
            step_times: super::prof::StepTimes::from_env(),
            twice: std::env::var("HF2Q_CUDA_TWICE").ok().filter(|v| !v.is_empty()),
            skip: std::env::var("HF2Q_CUDA_SKIP")
                .unwrap_or_default()
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|v| !v.is_empty())
                .map(String::from)
                .collect(),
            steps: Default::default(),
            pinned: Mutex::new(Pinned {
                host: PageLocked::null(),
                len: 0,
            }),
            feed: Mutex::new(super::feed::Feed::new()),
        })
    }

    pub(super) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    pub(super) fn fail(&self, what: &str, e: impl std::fmt::Display) -> ! {
        panic!("CUDA error on device {} in {what}: {e}", self.ordinal)
    }

    pub(super) fn alloc_bytes(&self, n: usize) -> std::result::Result<CudaSlice<u8>, cudarc::driver::DriverError> {
        // SAFETY: the bytes are written before they are read (weights, KV pages after a memset).
        unsafe { self.stream.alloc::<u8>(n.max(1)) }
    }

    pub(super) fn alloc_f32(&self, n: usize) -> CudaSlice<f32> {
        // SAFETY: ops write their outputs' logical shape before anything reads it.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }
            .unwrap_or_else(|e| self.fail(&format!("allocating {n} floats"), e))
    }

    /// Copy `data` into this step's part of the upload arena; its device address.
    pub(super) fn upload<T: DeviceRepr + Copy>(&self, data: &[T]) -> u64 {
        let bytes = std::mem::size_of_val(data);
        let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        let need = rec.arena_off + bytes.next_multiple_of(256);
        if rec.arena.as_ref().is_none_or(|a| a.len() < need) {
            // A larger arena; the old one stays alive until the launches that read it are issued.
            let size = need.next_power_of_two().max(ARENA_BYTES);
            // SAFETY: written by the uploads before any launch reads it.
            let fresh = unsafe { self.stream.alloc::<u8>(size) }.unwrap_or_else(|e| self.fail("the upload arena", e));
            if let Some(old) = rec.arena.replace(fresh) {
                rec.old_arenas.push(old);
            }
            rec.arena_off = 0;
        }
        let at = self.ptr(rec.arena.as_ref().expect("made above")) + rec.arena_off as u64;
        rec.arena_off += bytes.next_multiple_of(256);
        drop(rec);
        if bytes > 0 {
            let t = self.step_times.as_ref().map(|_| std::time::Instant::now());
            // From page-locked staging where it fits (`feed.rs`: never waits on the stream).
            // SAFETY: a slice of `bytes` bytes.
            let raw = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) };
            let src = self.feed().stage(raw).unwrap_or(raw.as_ptr());
            // SAFETY: a fresh region of the arena, nothing recorded reads it yet; the staging half
            // is not rewritten before this copy ran, pageable host memory is staged before the
            // call returns; in stream order after earlier flushes.
            let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(at, src as *const _, bytes, self.stream.cu_stream()) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                self.fail("uploading step data", format!("{rc:?}"));
            }
            if let (Some(st), Some(t)) = (&self.step_times, t) {
                st.uploaded(t.elapsed());
            }
        }
        at
    }

    /// Keep an allocation alive until the launches recorded so far are issued.
    pub(super) fn bury(&self, mem: Box<dyn Send>) {
        self.rec.lock().unwrap_or_else(|e| e.into_inner()).graveyard.push(mem);
    }

    pub(super) fn memset(&self, ptr: u64, bytes: usize) {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.flush();
        // SAFETY: `ptr .. ptr + bytes` is a page of this device's pool.
        let rc = unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("memset", format!("{rc:?}"));
        }
    }

    pub(super) fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) {
        self.flush();
        // SAFETY: two pages of `bytes` of this device's pool.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("device copy", format!("{rc:?}"));
        }
    }

    pub(super) fn read_bytes(&self, ptr: u64, bytes: usize) -> Vec<u8> {
        self.read_with(ptr, bytes, |b| b.to_vec())
    }

    /// `f` of `bytes` of device memory at `ptr`, copied through a pinned host buffer kept for the
    /// next read (a step's logits: DMA at the bus's speed, no fresh pages to fault in each step);
    /// through pageable memory where pinned memory cannot be had.
    pub(super) fn read_with<R>(&self, ptr: u64, bytes: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.flush();
        if bytes == 0 {
            return f(&[]);
        }
        let mut pin = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        if pin.len < bytes {
            // The old buffer is idle (every read waits for its copy): freed, a larger one made;
            // without pinned memory, pageable from now on (not asked again at every read).
            pin.host = PageLocked::null();
            let len = bytes.next_power_of_two();
            pin.host = PageLocked::new(len);
            pin.len = if pin.host.0.is_null() { usize::MAX } else { len };
        }
        let mut pageable = if pin.host.0.is_null() {
            vec![0u8; bytes]
        } else {
            Vec::new()
        };
        let dst = if pin.host.0.is_null() {
            pageable.as_mut_ptr()
        } else {
            pin.host.0
        };
        // SAFETY: `ptr .. + bytes` is device memory of this context; `dst` has `bytes`.
        let rc = unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut _, ptr, bytes, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("reading device memory", format!("{rc:?}"));
        }
        let t = self.step_times.as_ref().map(|_| std::time::Instant::now());
        self.sync();
        if let (Some(st), Some(t)) = (&self.step_times, t) {
            st.waited(t.elapsed());
        }
        // SAFETY: the copy into `dst` (`bytes` long) is complete; the buffer is ours while the
        // lock is held.
        f(unsafe { std::slice::from_raw_parts(dst, bytes) })
    }

    pub(super) fn write_bytes(&self, ptr: u64, data: &[u8]) {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.flush();
        // SAFETY: `ptr .. + len` is device memory of this context; pageable host memory is copied
        // before the call returns.
        let rc =
            unsafe { sys::cuMemcpyHtoDAsync_v2(ptr, data.as_ptr() as *const _, data.len(), self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("writing device memory", format!("{rc:?}"));
        }
    }

    /// Run `f`, which enqueues work on the stream itself (cuBLAS), timed as `name` when profiling.
    pub(super) fn timed(&self, name: &str, f: impl FnOnce()) {
        match &self.prof {
            Some(p) => p.time(&self.ctx, &self.stream, name, f),
            None => f(),
        }
    }

    pub(super) fn sync(&self) {
        self.flush();
        self.stream
            .synchronize()
            .unwrap_or_else(|e| self.fail("a kernel (seen at synchronize)", e));
    }

    /// Record a launch of kernel `name` (issued at the next flush).
    pub(super) fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[A]) {
        self.record(name, grid, block, args, false);
    }

    /// `launch` for a kernel that may start before the kernel ahead of it ends (it calls
    /// `pdl_wait` before reading what that one writes; `kernels/common.cuh`) when `HF2Q_CUDA_PDL=1`;
    /// otherwise as any other.
    pub(super) fn launch_early(&self, name: &str, grid: (u32, u32), block: u32, args: &[A]) {
        self.record(name, grid, block, args, self.pdl);
    }

    /// The arguments of the last launch recorded and not yet issued, taken back (it will not
    /// run), where it is of kernel `name` and `keep` accepts its arguments: a launch that does
    /// its work too is recorded in its place. Never while a kernel is recorded twice.
    pub(super) fn take_last(&self, name: &str, keep: impl Fn(&[A]) -> bool) -> Option<Vec<A>> {
        let f = *self.kernels.by_name.get(name)?;
        if self.twice.is_some() {
            return None;
        }
        let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        match rec.pending.last() {
            Some(l) if l.f == f && keep(&l.args) => rec.pending.pop().map(|l| l.args),
            _ => None,
        }
    }

    fn record(&self, name: &str, grid: (u32, u32), block: u32, args: &[A], early: bool) {
        let f = *self
            .kernels
            .by_name
            .get(name)
            .unwrap_or_else(|| panic!("CUDA kernel {name} is not in the compiled modules"));
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !self.skip.is_empty()
            && self.steps.load(std::sync::atomic::Ordering::Relaxed) > SKIP_AFTER
            && self.skip.iter().any(|k| k == name)
        {
            return;
        }
        let l = Launch {
            f,
            grid,
            block,
            args: args.to_vec(),
            early,
        };
        let twice = self.twice.as_deref() == Some(name);
        let waiting = {
            let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
            if twice {
                rec.pending.push(l.clone());
            }
            rec.pending.push(l);
            rec.pending.len()
        };
        if let Some(st) = &self.step_times {
            st.recorded();
        }
        if self.flush_every > 0 && waiting >= self.flush_every {
            self.flush();
        }
    }

    fn issue(&self, l: &Launch) {
        if l.early {
            return self.issue_early(l);
        }
        let mut b = self.stream.launch_builder(&self.kernels.funcs[l.f]);
        for a in &l.args {
            match a {
                A::P(p) => b.arg(p),
                A::I(i) => b.arg(i),
                A::F(x) => b.arg(x),
                A::S(s) => b.arg(s),
            };
        }
        // SAFETY: the arguments match the kernel's parameters (`kernels/*.cu`), pointers are live
        // device buffers of the sizes the kernel indexes (kept alive until issued: `bury`).
        unsafe { b.launch(cfg(l.grid, l.block)) }.unwrap_or_else(|e| self.fail("launching a kernel", e));
    }

    /// `issue` with the programmatic-stream-serialization attribute (cuLaunchKernelEx).
    fn issue_early(&self, l: &Launch) {
        // Each argument's bytes in a slot of its own (8-byte aligned), as the kernel declares it.
        let mut slots: Vec<Vec<u64>> = l
            .args
            .iter()
            .map(|a| match *a {
                A::P(p) => vec![p],
                A::I(i) => vec![i as u32 as u64],
                A::F(x) => vec![x.to_bits() as u64],
                A::S(s) => vec![s.row_seq, s.row_pos, s.seq_pos0, s.seq_rows, s.poff, s.ptab],
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|s| s.as_mut_ptr() as *mut _).collect();
        // SAFETY: a plain-old-data union; the attribute's value is its int member.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let c = cfg(l.grid, l.block);
        let config = sys::CUlaunchConfig {
            gridDimX: c.grid_dim.0,
            gridDimY: c.grid_dim.1,
            gridDimZ: c.grid_dim.2,
            blockDimX: c.block_dim.0,
            blockDimY: c.block_dim.1,
            blockDimZ: c.block_dim.2,
            sharedMemBytes: c.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the arguments match the kernel's parameters (`kernels/*.cu`: u64 pointers, i32,
        // f32, and the 48-byte step struct), each in a slot that outlives the call; pointers are
        // live device buffers kept alive until issued (`bury`).
        let rc = unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.kernels.funcs[l.f].cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            self.fail("launching a kernel (programmatic dependent launch)", format!("{rc:?}"));
        }
    }

    /// The fed tokens' and staged uploads' state (`feed.rs`).
    pub(super) fn feed(&self) -> std::sync::MutexGuard<'_, super::feed::Feed> {
        self.feed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new step's uploads start at the arena's beginning (so they land where the previous step's
    /// did). Everything recorded before is issued first; the uploads are ordered after it on the
    /// stream, so in-flight launches still read the previous step's data.
    pub(super) fn new_step(&self) {
        self.steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.flush();
        self.feed().new_step(&self.ctx, &self.stream);
        if let Some(p) = &self.prof {
            p.new_step();
        }
        if let Some(st) = &self.step_times {
            st.new_step();
        }
        let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        rec.arena_off = 0;
        // (Freed in stream order, after the launches issued above.)
        rec.old_arenas.clear();
    }

    /// Issue the recorded launches: as a cached graph when the same run was issued before, captured
    /// into one when a recent flush had the same run, else one by one (timed for
    /// `HF2Q_CUDA_STEP_TIMES`).
    pub(super) fn flush(&self) {
        match &self.step_times {
            Some(st) => {
                let t = std::time::Instant::now();
                self.issue_recorded();
                st.flushed(t.elapsed());
            }
            None => self.issue_recorded(),
        }
    }

    fn issue_recorded(&self) {
        let mut rec = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.pending.is_empty() {
            rec.graveyard.clear();
            return;
        }
        let pending = std::mem::take(&mut rec.pending);
        if let Some(p) = self.prof.as_ref().filter(|p| p.on()) {
            for l in &pending {
                // Keyed by kernel and grid: a layer's products of different shapes apart.
                let name = format!("{} {:?}", self.kernels.names[l.f], l.grid);
                p.time(&self.ctx, &self.stream, &name, || self.issue(l));
            }
            self.stream
                .synchronize()
                .unwrap_or_else(|e| self.fail("a kernel (seen at synchronize)", e));
            p.collect();
            rec.graveyard.clear();
            return;
        }
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for l in &pending {
                (l.f, l.grid, l.block, l.early).hash(&mut h);
                for a in &l.args {
                    match a {
                        A::P(p) => p.hash(&mut h),
                        A::I(i) => i.hash(&mut h),
                        A::F(x) => x.to_bits().hash(&mut h),
                        A::S(s) => s.hash(&mut h),
                    }
                }
            }
            h.finish()
        };
        let repeat = rec.seen.contains(&hash);
        if !repeat {
            if rec.seen.len() >= SEEN_FLUSHES {
                rec.seen.pop_front();
            }
            rec.seen.push_back(hash);
        }
        let cached = rec.graphs.iter().position(|g| g.launches == pending);
        let stream = self.stream.cu_stream();
        let exec = match cached {
            Some(i) => {
                // Most recently used last.
                let g = rec.graphs.remove(i);
                let e = g.exec;
                rec.graphs.push(g);
                Some(e)
            }
            None if repeat && self.graphs && pending.len() > 1 => {
                let mut graph: sys::CUgraph = std::ptr::null_mut();
                let mut exec: sys::CUgraphExec = std::ptr::null_mut();
                // SAFETY: our stream, nothing else enqueued on it meanwhile (the recorder's lock is
                // held); the graph is destroyed once instantiated.
                unsafe {
                    let rc =
                        sys::cuStreamBeginCapture_v2(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        self.fail("beginning a graph capture", format!("{rc:?}"));
                    }
                    for l in &pending {
                        self.issue(l);
                    }
                    let rc = sys::cuStreamEndCapture(stream, &mut graph);
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        self.fail("ending a graph capture", format!("{rc:?}"));
                    }
                    let rc = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0);
                    sys::cuGraphDestroy(graph);
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        self.fail("instantiating a graph", format!("{rc:?}"));
                    }
                }
                if rec.graphs.len() >= MAX_GRAPHS {
                    let old = rec.graphs.remove(0);
                    // SAFETY: not running: a graph launch is ordered on the stream and the exec
                    // may be destroyed while a launch is pending (the driver keeps it).
                    unsafe { sys::cuGraphExecDestroy(old.exec) };
                }
                rec.graphs.push(Graph {
                    launches: pending.clone(),
                    exec,
                });
                Some(exec)
            }
            None => None,
        };
        match exec {
            Some(e) => {
                let launch = || {
                    // SAFETY: an instantiated graph of this context, launched on our stream.
                    let rc = unsafe { sys::cuGraphLaunch(e, stream) };
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        self.fail("launching a graph", format!("{rc:?}"));
                    }
                };
                match &self.step_times {
                    Some(st) => st.replay(&self.ctx, &self.stream, launch),
                    None => launch(),
                }
            }
            None => {
                for l in &pending {
                    self.issue(l);
                }
            }
        }
        // Frees are stream-ordered: after the launches just issued.
        rec.graveyard.clear();
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // Nothing pending copies into the page-locked buffers freed with the fields.
        let _ = self.stream.synchronize();
        if let Some(p) = &self.prof {
            p.report();
        }
        if let Some(st) = &self.step_times {
            st.report();
        }
        let rec = self.rec.get_mut().unwrap_or_else(|e| e.into_inner());
        for g in rec.graphs.drain(..) {
            // SAFETY: instantiated by this device; nothing launches it any more.
            unsafe { sys::cuGraphExecDestroy(g.exec) };
        }
    }
}

/// Every kernel of a module (the names the `.cu` files define).
pub(super) fn kernel_names(module: &str) -> Vec<String> {
    match module {
        "ops" => {
            let mut v: Vec<String> = [
                "rms_norm",
                "rms_norm_q8",
                "add_rms_norm",
                "add_rms_norm_q8",
                "add_ws_rms_norm_q8",
                "glu_q8",
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
        // The matrix-vector kernels of one row count (matmul1 ... matmul8).
        m if m.starts_with("matmul") => {
            let r: usize = m["matmul".len()..].parse().expect("a row count");
            assert!(MMV_ROWS.contains(&r), "no matrix-vector kernels of {r} rows");
            let mut v: Vec<String> = DEVICE_TYPES
                .iter()
                .flat_map(|&t| [format!("mmv_{}_{r}", ty_name(t)), format!("mmv_{}3_{r}", ty_name(t))])
                .collect();
            // The fused variants (`Fuse`) of the float weights: the FFN input, the MoE routing.
            for &t in &super::products::FUSED_TYPES {
                for s in ["g", "r", "ga", "p", "p3"] {
                    v.push(format!("mmv_{}{s}_{r}", ty_name(t)));
                }
            }
            v
        }
        "mmq" => {
            let mut v: Vec<String> = [
                "quantize_act",
                "argmax_part",
                "argmax_rows",
                "top_rows",
                "moe_route",
                "moe_route_w",
                "moe_group",
                "gather_act",
                "mmq_v5_TY_Q4_K",
                "mmq_vx_TY_Q4_K_TY_Q6_K",
                "mmq_vx5_TY_Q4_K_TY_Q6_K",
                "mmq_moe_v2_TY_Q4_K",
                "mmq_moe_v3_TY_Q4_K",
                "mmq_moe_v2_TY_Q6_K",
                "mmq_moe_gd_v2_TY_Q4_K",
                "mmq_moe_gd_v2_TY_Q6_K",
            ]
            .map(String::from)
            .to_vec();
            for &t in MMQ_TYPES {
                v.push(format!("mmq_moe_{}", ty_name(t)));
                v.push(format!("mmq_moe_v_{}", ty_name(t)));
                v.push(format!("mmq_moe_glu_{}", ty_name(t)));
                v.push(format!("mmq_moe_glu_v_{}", ty_name(t)));
                v.push(format!("mmq_moe_gd_v_{}", ty_name(t)));
                v.push(format!("mmq_moe_r_v_{}", ty_name(t)));
                v.push(format!("mmq_v_{}", ty_name(t)));
                v.extend(MMQ_MOE_NT.iter().map(|k| format!("mmq_moe_g_{}_{k}", ty_name(t))));
                v.push(format!("tile_{}", ty_name(t)));
                v.push(format!("decode_tiled_{}", ty_name(t)));
                v.extend(MMQ_NT.iter().map(|k| format!("mmq_{}_{k}", ty_name(t))));
            }
            v
        }
        "attention" => [
            "store_kv",
            "rope_store_kv",
            "attn_f16",
            "attn_q8_0",
            "attn_split_f16",
            "attn_split_q8_0",
            "attn_dec_f16",
            "attn_dec_f16_rope",
            "attn_combine",
            "attn_combine_q8",
            "attn_fa_f16_64",
            "attn_fa_f16_128",
            "encoder_attn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        "sample" => vec!["sample_rows".to_string()],
        "recurrent" => [
            "ssm_conv",
            "ssm_conv_state",
            "gated_delta_net_64",
            "gated_delta_net_128",
            "sigmoid_mul",
            "unzip_heads",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        _ => Vec::new(),
    }
}
