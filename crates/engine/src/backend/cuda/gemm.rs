//! Products of many rows through cuBLAS (tensor cores): F32 weights as they are, F16 / BF16 with
//! the activations rounded to that type, the other types decoded to f16 in chunks of rows (from the
//! integer kernels' tiled layout where a weight is kept in it).

use super::dev::{blocks, A};
use super::{ty_name, Cuda, CudaBuf, CudaWeight, DECODE_CHUNK};
use cudarc::driver::CudaSlice;
use gguf::GgmlType;

impl Cuda {
    /// Rows `s0 .. s0 + len` of `out = x · Wᵀ` through cuBLAS with f32 accumulation: F32 weights
    /// as they are (f32 products, no TF32), F16 / BF16 weights as they are with the activations
    /// rounded to that type, other types decoded to f16 in chunks of rows (activations in f16).
    pub(super) fn gemm(&self, w: &CudaWeight, x: &CudaBuf, s0: usize, len: usize, out: &CudaBuf) {
        use cudarc::cublas::sys::{cublasComputeType_t as Compute, cublasOperation_t as Op, cudaDataType_t as Dt};
        let blas = self.dev.blas.as_ref().expect("checked by the caller");
        let (n, m) = (x.cols, w.n_rows());
        let x_ptr = x.ptr + 4 * (s0 * n) as u64;
        let out_ptr = out.ptr + 4 * (s0 * m) as u64;
        let (alpha, beta) = (1f32, 0f32);
        // C (m_chunk × len, column-major, ldc = m) = op(A) · B with A the weight rows (n × m_chunk
        // column-major, transposed) and B the activations (n × len column-major).
        let gemm = |a: u64, a_ty: Dt, b: u64, b_ty: Dt, rows: usize, c: u64| {
            // cuBLAS enqueues on the stream itself: the recorded launches (conversions) go first.
            self.dev.flush();
            let mut r = Ok(());
            self.dev.timed("cublasGemmEx", || {
                // SAFETY: device pointers of the sizes given (weight rows × n, len × n activations,
                // the output's rows with stride m); host scalars in the default pointer mode.
                r = unsafe {
                    cudarc::cublas::result::gemm_ex(
                        *blas.handle(),
                        Op::CUBLAS_OP_T,
                        Op::CUBLAS_OP_N,
                        rows as i32,
                        len as i32,
                        n as i32,
                        &alpha as *const f32 as *const _,
                        a as *const _,
                        a_ty,
                        n as i32,
                        b as *const _,
                        b_ty,
                        n as i32,
                        &beta as *const f32 as *const _,
                        c as *mut _,
                        Dt::CUDA_R_32F,
                        m as i32,
                        Compute::CUBLAS_COMPUTE_32F,
                        cudarc::cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    )
                }
            });
            r.unwrap_or_else(|e| self.dev.fail("cublasGemmEx", format!("{e:?}")));
        };
        if w.dev_ty == GgmlType::F32 {
            return gemm(self.dev.ptr(&w.data), Dt::CUDA_R_32F, x_ptr, Dt::CUDA_R_32F, m, out_ptr);
        }
        let mut scratch = self.dev.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let grow = |buf: &mut Option<CudaSlice<u16>>, len: usize| {
            if buf.as_ref().is_none_or(|b| b.len() < len) {
                // SAFETY: written by the conversion kernels before cuBLAS reads it.
                *buf = Some(
                    unsafe { self.dev.stream.alloc::<u16>(len) }.unwrap_or_else(|e| self.dev.fail("GEMM scratch", e)),
                );
            }
        };
        let (wbuf, xbuf) = &mut *scratch;
        // Activations rounded as the CPU's integer products round them (its vec_dot type), so
        // that a prompt's numbers follow the CPU's (then f16 for the tensor cores).
        let (mode, dt) = match (w.dev_ty, quant::dot::vec_dot_type(w.dev_ty)) {
            (GgmlType::BF16, _) => (1, Dt::CUDA_R_16BF),
            (_, Some(GgmlType::Q8_0 | GgmlType::Q8_1)) if n.is_multiple_of(32) => (2, Dt::CUDA_R_16F),
            (_, Some(GgmlType::Q8_K)) if n.is_multiple_of(256) => (3, Dt::CUDA_R_16F),
            _ => (0, Dt::CUDA_R_16F),
        };
        grow(xbuf, len * n);
        let xh = self.dev.ptr(xbuf.as_ref().expect("grown"));
        let count = (len * n) as u64;
        self.dev.launch(
            "to_half",
            (blocks(count, 256), 1),
            256,
            &[A::P(x_ptr), A::P(xh), A::P(count), A::I(mode)],
        );
        if matches!(w.dev_ty, GgmlType::F16 | GgmlType::BF16) {
            return gemm(self.dev.ptr(&w.data), dt, xh, dt, m, out_ptr);
        }
        // (A tiled weight's chunks start at whole tiles: `decode_tiled_*` reads its layout.)
        let chunk = (DECODE_CHUNK / n).clamp(1, m);
        let chunk = if w.tiled { chunk.next_multiple_of(16) } else { chunk };
        grow(wbuf, chunk * n);
        let wh = self.dev.ptr(wbuf.as_ref().expect("grown"));
        for r0 in (0..m).step_by(chunk) {
            let rows = chunk.min(m - r0);
            if w.tiled {
                self.dev.launch(
                    &format!("decode_tiled_{}", ty_name(w.dev_ty)),
                    (rows as u32, 1),
                    128,
                    &[
                        A::P(self.dev.ptr(&w.data)),
                        A::I(n.div_ceil(256) as i32),
                        A::I(r0 as i32),
                        A::P(wh),
                        A::I(n as i32),
                    ],
                );
            } else {
                self.dev.launch(
                    &format!("decode_{}", ty_name(w.dev_ty)),
                    (rows as u32, 1),
                    128,
                    &[
                        A::P(self.dev.ptr(&w.data) + (r0 * w.row_bytes) as u64),
                        A::P(w.row_bytes as u64),
                        A::P(wh),
                        A::I(n as i32),
                        A::I(0),
                    ],
                );
            }
            gemm(wh, Dt::CUDA_R_16F, xh, Dt::CUDA_R_16F, rows, out_ptr + 4 * r0 as u64);
        }
    }
}
