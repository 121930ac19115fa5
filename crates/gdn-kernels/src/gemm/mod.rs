//! Linear layers (`cuda/skinny_linear.cu`, cuBLAS, quack's SwiGLU GEMM
//! through `gdn_swiglu_abi.h`): [`ops`] routes each call by [`route`]'s
//! measured rule, [`skinny`] and [`swiglu`] are the kernels it routes to,
//! [`linear`] what they share; [`swiglu_ffi`] binds the fused kernel.

pub(crate) mod linear;
pub(crate) mod ops;
pub(crate) mod route;
pub(crate) mod skinny;
pub(crate) mod swiglu;
pub(crate) mod swiglu_ffi;

pub use linear::{GemmOutput, GemmShape};
pub use ops::Gemm;
pub use route::{route_in, LinearRoute, SkinnyRule, SKINNY_RULES};
pub use skinny::{SkinnyConfig, SkinnyLinear, SKINNY_MAX_ROWS};
pub use swiglu::{swiglu_route, SwigluGemm, SwigluRequest, SwigluRoute, SWIGLU_FUSED_MIN_ROWS};
