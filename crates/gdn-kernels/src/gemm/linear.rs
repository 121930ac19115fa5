//! What every linear-layer path shares (cuBLAS in [`crate::gemm::ops`], the
//! skinny kernels in [`crate::gemm::skinny`], the fused SwiGLU GEMM in
//! [`crate::gemm::swiglu`]): the shape of a call, the output element types, and
//! the length check of its operands.

use cudarc::cublas::sys::cudaDataType;
use cudarc::driver::DeviceRepr;
use half::bf16;

use crate::shared::error::{invalid, GdnError, Op};

/// The shape of `y[m, n] = x[m, k] · w[n, k]ᵀ`: `m` rows of x (tokens),
/// `n` output columns (rows of the weight), `k` the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl GemmShape {
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        GemmShape { m, n, k }
    }
}

impl std::fmt::Display for GemmShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "m={}, n={}, k={}", self.m, self.n, self.k)
    }
}

/// Output element types of [`crate::Gemm::linear`].
pub trait GemmOutput: DeviceRepr {
    const CUDA_TYPE: cudaDataType;
    /// fp32 (else bf16): picks the skinny kernel's output variant.
    const IS_F32: bool;
}

impl GemmOutput for bf16 {
    const CUDA_TYPE: cudaDataType = cudaDataType::CUDA_R_16BF;
    const IS_F32: bool = false;
}

impl GemmOutput for f32 {
    const CUDA_TYPE: cudaDataType = cudaDataType::CUDA_R_32F;
    const IS_F32: bool = true;
}

/// The lengths every linear call needs: x at least `m * k`, w exactly
/// `n * k`, y at least `m * n` elements.
pub(crate) fn check_lengths(
    op: Op,
    x: usize,
    w: usize,
    y: usize,
    shape: GemmShape,
) -> Result<(), GdnError> {
    let GemmShape { m, n, k } = shape;
    let short = |arg: &'static str, have: usize, want: usize| {
        invalid(
            op,
            arg,
            format!("has {have} elements, needs {want} ({shape})"),
        )
    };
    if x < m * k {
        return Err(short("x", x, m * k));
    }
    if y < m * n {
        return Err(short("y", y, m * n));
    }
    if w != n * k {
        return Err(invalid(
            op,
            "w",
            format!("has {w} elements, is not [{n}, {k}]"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked_with_the_shape_in_the_message() {
        let shape = GemmShape::new(2, 16, 8);
        assert!(check_lengths(Op::Linear, 64, 128, 32, shape).is_ok());
        let e = check_lengths(Op::Linear, 15, 128, 32, shape)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "linear: x: has 15 elements, needs 16 (m=2, n=16, k=8)");
        let e = check_lengths(Op::SkinnyLinear, 16, 128, 31, shape)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("skinny_linear: y: has 31"), "{e}");
        let e = check_lengths(Op::Linear, 16, 136, 32, shape)
            .unwrap_err()
            .to_string();
        assert!(e.contains("w: has 136 elements, is not [16, 8]"), "{e}");
    }
}
