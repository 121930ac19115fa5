//! The MLP of a decoder layer: the dense SwiGLU MLP, or the sparse MoE block
//! of Qwen3.5-MoE (HF's `Qwen3_5MoeSparseMoeBlock`): the router GEMM and
//! the shared expert on cuBLAS / our GEMM routes, then `gdn_kernels`'
//! routed-experts op (top-k softmax, grouping by expert, the expert GEMMs
//! with SwiGLU, the weighted un-permute plus the gated shared expert). At
//! a few tokens the op's direct path runs the shared expert itself, from
//! its weights, and the shared expert's one-column gate GEMM is a row of
//! the router's in every case.

use cudarc::driver::CudaSlice;
use gdn_kernels::{GemmShape, MoeExperts, MoePath, MoeScratch, MoeShape, SharedExpert};
use half::bf16;

use super::load::WeightSource;
use super::{scratch, GpuModel};
use crate::config::{Config, MoeConfig};
use crate::error::{LoadError, RunError};
use crate::experts::{experts_prefix, ExpertLayout};

pub(super) enum Mlp {
    Dense {
        /// Fused `[gate | up]`.
        gate_up: CudaSlice<bf16>,
        down: CudaSlice<bf16>,
    },
    Moe(Box<MoeMlp>),
}

pub(super) struct MoeMlp {
    /// `[router_width, H]`: the E experts' rows, the shared expert's gate
    /// (its logit before the sigmoid) as row E, zero rows after it
    /// ([`MoeShape::router_width`]).
    router: CudaSlice<bf16>,
    /// The shared expert's fused `[gate | up]`, `[2 Is, H]`.
    shared_gate_up: CudaSlice<bf16>,
    /// `[H, Is]`.
    shared_down: CudaSlice<bf16>,
    /// Every routed expert's `[gate | up]`, `[E, 2I, H]`.
    gate_up: CudaSlice<bf16>,
    /// Every routed expert's down projection, `[E, H, I]`.
    down: CudaSlice<bf16>,
}

/// The routed experts' shape of a MoE config with hidden size `hidden`.
pub(super) fn moe_shape(m: &MoeConfig, hidden: usize) -> MoeShape {
    MoeShape {
        experts: m.num_experts,
        top_k: m.num_experts_per_tok,
        hidden,
        inter: m.moe_intermediate_size,
        shared_inter: m.shared_expert_intermediate_size,
    }
}

impl Mlp {
    /// Layer `li`'s MLP from `src`: the experts from either checkpoint
    /// layout (see [`crate::experts`]), both loaded to the fused one.
    pub(super) fn load(
        src: &mut dyn WeightSource,
        c: &Config,
        li: usize,
    ) -> Result<Mlp, LoadError> {
        let (p, h) = (format!("model.layers.{li}.mlp"), c.hidden_size);
        let Some(m) = c.moe else {
            let i = c.intermediate_size;
            return Ok(Mlp::Dense {
                gate_up: src.matrix(
                    &[
                        (&format!("{p}.gate_proj.weight"), i),
                        (&format!("{p}.up_proj.weight"), i),
                    ],
                    h,
                )?,
                down: src.matrix(&[(&format!("{p}.down_proj.weight"), h)], i)?,
            });
        };
        let (e, i, is) = (
            m.num_experts,
            m.moe_intermediate_size,
            m.shared_expert_intermediate_size,
        );
        let x = experts_prefix(li);
        let (gate_up, down) = match src.expert_layout(li)? {
            ExpertLayout::Fused => (
                src.stacked(&[(&format!("{x}.gate_up_proj"), vec![e, 2 * i, h])])?,
                src.stacked(&[(&format!("{x}.down_proj"), vec![e, h, i])])?,
            ),
            ExpertLayout::PerExpert => {
                let names: Vec<[String; 3]> = (0..e)
                    .map(|n| {
                        ["gate_proj", "up_proj", "down_proj"].map(|w| format!("{x}.{n}.{w}.weight"))
                    })
                    .collect();
                let gate_up: Vec<(&str, Vec<usize>)> = names
                    .iter()
                    .flat_map(|[g, u, _]| [(g.as_str(), vec![i, h]), (u.as_str(), vec![i, h])])
                    .collect();
                let down: Vec<(&str, Vec<usize>)> = names
                    .iter()
                    .map(|[_, _, d]| (d.as_str(), vec![h, i]))
                    .collect();
                (src.stacked(&gate_up)?, src.stacked(&down)?)
            }
        };
        let s = format!("{p}.shared_expert");
        let router = src.matrix(
            &[
                (&format!("{p}.gate.weight"), e),
                (&format!("{p}.shared_expert_gate.weight"), 1),
            ],
            h,
        )?;
        let width = moe_shape(&m, h).router_width();
        let stream = router.stream().clone();
        let mut padded = stream.alloc_zeros::<bf16>(width * h)?;
        stream.memcpy_dtod(&router, &mut padded.slice_mut(0..(e + 1) * h))?;
        Ok(Mlp::Moe(Box::new(MoeMlp {
            router: padded,
            shared_gate_up: src.matrix(
                &[
                    (&format!("{s}.gate_proj.weight"), is),
                    (&format!("{s}.up_proj.weight"), is),
                ],
                h,
            )?,
            shared_down: src.matrix(&[(&format!("{s}.down_proj.weight"), h)], is)?,
            gate_up,
            down,
        })))
    }
}

impl GpuModel {
    /// Layer `li`'s MLP over the `T` rows of `x` (`[T, H]`): its output,
    /// the layer's delta to the residual. A MoE layer routes through
    /// `moe` (the step's scratch, sized for its tokens).
    pub(super) fn mlp(
        &self,
        li: usize,
        x: &CudaSlice<bf16>,
        moe: Option<&mut MoeScratch>,
    ) -> Result<CudaSlice<bf16>, RunError> {
        let (s, c) = (&self.stream, &self.config);
        let h = c.hidden_size;
        let t = x.len() / h;
        let mut out = scratch::<bf16>(s, t * h)?;
        match &self.layers[li].mlp {
            Mlp::Dense { gate_up, down } => {
                let inter = c.intermediate_size;
                let mut act = scratch::<bf16>(s, t * inter)?;
                self.gemm.gate_up_swiglu(
                    &self.ops,
                    x,
                    gate_up,
                    &mut act,
                    GemmShape::new(t, inter, h),
                )?;
                self.gemm
                    .linear(&act, down, &mut out, GemmShape::new(t, h, inter))?;
            }
            Mlp::Moe(w) => {
                let moe = moe.expect("a MoE model's step has a MoE scratch");
                let shape = moe.shape();
                let width = shape.router_width();
                let mut logits = scratch::<bf16>(s, t * width)?;
                self.gemm
                    .linear(x, &w.router, &mut logits, GemmShape::new(t, width, h))?;
                let experts = MoeExperts {
                    gate_up: &w.gate_up,
                    down: &w.down,
                };
                let path = match self.moe_path {
                    MoePath::Auto => gdn_kernels::moe_path(t, shape),
                    forced => forced,
                };
                // The direct path runs the shared expert from its weights;
                // the grouped paths take its output, from our GEMMs.
                let shared_out;
                let shared = if path == MoePath::Direct {
                    SharedExpert::Weights(MoeExperts {
                        gate_up: &w.shared_gate_up,
                        down: &w.shared_down,
                    })
                } else {
                    let is = shape.shared_inter;
                    let mut act = scratch::<bf16>(s, t * is)?;
                    self.gemm.gate_up_swiglu(
                        &self.ops,
                        x,
                        &w.shared_gate_up,
                        &mut act,
                        GemmShape::new(t, is, h),
                    )?;
                    let mut down = scratch::<bf16>(s, t * h)?;
                    self.gemm
                        .linear(&act, &w.shared_down, &mut down, GemmShape::new(t, h, is))?;
                    shared_out = down;
                    SharedExpert::Output(&shared_out)
                };
                self.ops
                    .moe_experts(x, &logits, experts, Some(shared), moe, &mut out, path)?;
            }
        }
        Ok(out)
    }
}
