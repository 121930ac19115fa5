//! Row-major linear layers on cuBLAS: `y[m, n] = x[m, k] · w[n, k]ᵀ`, bf16
//! inputs, fp32 accumulation (`CUBLAS_COMPUTE_32F`), bf16 or fp32 output —
//! what a PyTorch `nn.Linear` in bf16 computes. cuBLAS is loaded at run time
//! (libcublas.so.13); the handle is bound to one stream.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;

use crate::error::{op_error, GdnError};

const OP: &str = "linear";

/// Output element types of [`Gemm::linear`].
pub trait GemmOutput: DeviceRepr {
    const CUDA_TYPE: cudaDataType;
}
impl GemmOutput for bf16 {
    const CUDA_TYPE: cudaDataType = cudaDataType::CUDA_R_16BF;
}
impl GemmOutput for f32 {
    const CUDA_TYPE: cudaDataType = cudaDataType::CUDA_R_32F;
}

/// A cuBLAS handle on one stream.
pub struct Gemm {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        let blas = CudaBlas::new(stream.clone()).map_err(|e| GdnError::Blas(format!("{e:?}")))?;
        Ok(Gemm { blas, stream })
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with every matrix dense row-major.
    /// `x` and `y` may be longer than `m` rows (only the first `m` are used).
    pub fn linear<X, W, Y, O>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        Y: DevicePtrMut<O>,
        O: GemmOutput,
    {
        if m == 0 {
            return Ok(());
        }
        let need = |what: &str, have: usize, want: usize| {
            if have < want {
                Err(op_error(
                    OP,
                    format!("{what} has {have} elements, needs {want} (m={m}, n={n}, k={k})"),
                ))
            } else {
                Ok(())
            }
        };
        need("x", x.len(), m * k)?;
        need("w", w.len(), n * k)?;
        need("y", y.len(), m * n)?;
        if w.len() != n * k {
            return Err(op_error(OP, format!("w has {} elements, is not [{n}, {k}]", w.len())));
        }
        let dims: Vec<i32> = [m, n, k]
            .iter()
            .map(|&d| i32::try_from(d).map_err(|_| op_error(OP, format!("dimension {d} exceeds i32"))))
            .collect::<Result<_, _>>()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let s = &self.stream;
        let (xp, _xg) = x.device_ptr(s);
        let (wp, _wg) = w.device_ptr(s);
        let (yp, _yg) = y.device_ptr_mut(s);
        // Column-major view: yᵀ[n, m] = w[n, k] (stored as wᵀ, k-major) · xᵀ[k, m].
        // SAFETY: the pointers are live allocations of this stream's context
        // with at least the element counts checked above; alpha/beta are host
        // scalars (the handle's default pointer mode); the guards order the
        // accesses on `s`.
        unsafe {
            gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                dims[1],
                dims[0],
                dims[2],
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                cudaDataType::CUDA_R_16BF,
                dims[2],
                xp as *const c_void,
                cudaDataType::CUDA_R_16BF,
                dims[2],
                &beta as *const f32 as *const c_void,
                yp as *mut c_void,
                O::CUDA_TYPE,
                dims[1],
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GdnError::Blas(format!("{e:?} (m={m}, n={n}, k={k})")))
    }
}
