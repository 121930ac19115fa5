//! Which backend runs a GDN prefill, and why.
//!
//! Rule for `Auto` (from the GDN prefill benchmark, docs/performance.md and
//! docs/results/h200-2026-11-29-s2/): on a
//! compute capability 9.0 GPU, for head dim 128 and `Hv = r * Hqk` with `r`
//! among the ratios the bundle was built and validated for, the CuTe DSL
//! SM90 kernel runs, switching per call to the context-parallel DSL pipeline
//! by [`prefer_context_parallel`] (where that pipeline exists, Hv > 8). If the
//! bundle had no SM90 DSL kernel, the FlashInfer C++ SM90 kernel would run
//! instead. Anything else runs the portable kernel. The C++ kernel and each
//! DSL kernel can also be requested by name; the SM100 and SM120 DSL kernels
//! (built and linked, never run) and the C++ kernel with the value dimension
//! split across two CTAs (`flashinfer-vsplit`, our patch; built and linked,
//! never run) only by name. An explicit request for a
//! backend on an ineligible setup is an error, never a silent fallback; so is
//! an eligible setup whose linked launcher speaks another ABI version.

use std::fmt;
use std::str::FromStr;

use crate::bundle_embed::FLASHINFER_GVA_RATIOS;
use crate::deltanet::oracle::{GdnGeometry, HEAD_DIM};
use crate::deltanet::prefill::dsl::{self, DslFamily};
use crate::shared::cubins::cubin_for;
use crate::shared::error::Ineligible;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendRequest {
    Auto,
    FlashInfer,
    /// The C++ kernel with our value-dimension split; never chosen by `Auto`.
    FlashInferVsplit,
    Portable,
    CuteDslSm90,
    CuteDslSm90Cp,
    CuteDslSm100,
    CuteDslSm120,
}

/// A backend name [`BackendRequest`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown GDN backend {0:?}; expected auto, flashinfer, flashinfer-vsplit, portable, \
     cute-dsl-sm90, cute-dsl-sm90-cp, cute-dsl-sm100 or cute-dsl-sm120"
)]
pub struct UnknownBackend(pub String);

impl FromStr for BackendRequest {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        match s {
            "auto" => Ok(BackendRequest::Auto),
            "flashinfer" => Ok(BackendRequest::FlashInfer),
            "flashinfer-vsplit" => Ok(BackendRequest::FlashInferVsplit),
            "portable" => Ok(BackendRequest::Portable),
            "cute-dsl-sm90" => Ok(BackendRequest::CuteDslSm90),
            "cute-dsl-sm90-cp" => Ok(BackendRequest::CuteDslSm90Cp),
            "cute-dsl-sm100" => Ok(BackendRequest::CuteDslSm100),
            "cute-dsl-sm120" => Ok(BackendRequest::CuteDslSm120),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// FlashInfer 0.6.13's CUTLASS SM90 kernel, through the bundle's C ABI.
    FlashInfer,
    /// The same kernel with patches/0001's value-dimension split: two CTAs
    /// per (sequence, value head), 64 value columns each
    /// (`gdn_vsplit_abi.h`). Built and linked, never run.
    FlashInferVsplit,
    /// Our own recurrent kernel, one cubin per architecture.
    Portable,
    /// FlashInfer 0.7.2.post1's CuTe DSL SM90 kernel (`delta_rule_sm90`).
    CuteDslSm90,
    /// FlashInfer 0.7.2.post1's CuTe DSL SM90 context-parallel pipeline
    /// (`delta_rule_cp_sm90`: four kernels per call).
    CuteDslSm90Cp,
    /// FlashInfer 0.7.2.post1's CuTe DSL SM100 kernel; built for 148 SMs and
    /// Hqk 16. Built and linked, never run.
    CuteDslSm100,
    /// FlashInfer 0.7.2.post1's CuTe DSL SM120 kernel. Built and linked, never run.
    CuteDslSm120,
}

impl Backend {
    pub(crate) fn dsl_family(self) -> Option<DslFamily> {
        match self {
            Backend::CuteDslSm90 => Some(DslFamily::Sm90),
            Backend::CuteDslSm90Cp => Some(DslFamily::Sm90Cp),
            Backend::CuteDslSm100 => Some(DslFamily::Sm100),
            Backend::CuteDslSm120 => Some(DslFamily::Sm120),
            Backend::FlashInfer | Backend::FlashInferVsplit | Backend::Portable => None,
        }
    }
}

impl Backend {
    /// The name [`BackendRequest`] parses.
    pub fn name(self) -> &'static str {
        match self {
            Backend::FlashInfer => "flashinfer",
            Backend::FlashInferVsplit => "flashinfer-vsplit",
            Backend::Portable => "portable",
            dsl => dsl
                .dsl_family()
                .expect("the rest are DSL backends")
                .backend_name(),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What was asked, what runs, and the reason, for logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchDecision {
    pub requested: BackendRequest,
    pub resolved: Backend,
    pub reason: String,
    /// `Auto` on SM90: each call may switch to the context-parallel DSL
    /// kernel ([`prefer_context_parallel`]).
    pub context_parallel_per_call: bool,
}

/// The SM90 per-call rule of `Auto` between the CuTe DSL non-CP kernel
/// (`resolved`) and the context-parallel one: CP when the non-CP kernel's
/// parallelism, one CTA per (sequence, value head), fills less than half the
/// GPU (FlashInfer's own `should_use_cp` threshold for HBM parts) and the
/// longest sequence exceeds 2048 tokens. In the benchmark behind it
/// (`gdn-bench-b6bd937.jsonl` and `gdn-bench-07b2cf0.jsonl` in
/// docs/results/h200-2026-11-29-s2/) CP won clearly on single long
/// sequences (4B 1x8192, 1x65536), lost on short ones (1x2048) and on
/// batches whose CTAs already fill the SMs (4x2048, 8x8192), and tied on
/// the 27B's 1x8192, which the rule sends to CP. The C++ FlashInfer kernel
/// was no faster than the DSL non-CP one on any shape (8x8192 within
/// noise), so `Auto` does not pick it where the DSL kernels are eligible.
pub fn prefer_context_parallel(
    num_seqs: usize,
    num_v_heads: usize,
    max_seqlen: usize,
    sm_count: i32,
) -> bool {
    2 * num_seqs * num_v_heads < sm_count.max(0) as usize && max_seqlen > 2048
}

/// `Ok(())` if the FlashInfer kernel can run this GPU and geometry, else why not.
pub fn flashinfer_eligibility(
    compute_capability: (i32, i32),
    g: &GdnGeometry,
) -> Result<(), Ineligible> {
    flashinfer_refusal(compute_capability, g).map_or(Ok(()), |why| {
        Err(Ineligible::new(Backend::FlashInfer.name(), why))
    })
}

/// Why the FlashInfer kernel cannot run this GPU and geometry (`None`: it can).
fn flashinfer_refusal(compute_capability: (i32, i32), g: &GdnGeometry) -> Option<String> {
    if compute_capability != (9, 0) {
        return Some(format!(
            "the FlashInfer kernel is built for sm_90a only; this GPU is sm_{}{}",
            compute_capability.0, compute_capability.1
        ));
    }
    if g.head_dim != HEAD_DIM {
        return Some(format!(
            "head dim {} (the bundle supports {HEAD_DIM})",
            g.head_dim
        ));
    }
    if g.num_qk_heads == 0 || g.num_v_heads % g.num_qk_heads != 0 {
        return Some(format!(
            "Hv={} is not a multiple of Hqk={}",
            g.num_v_heads, g.num_qk_heads
        ));
    }
    let ratio = (g.num_v_heads / g.num_qk_heads) as u32;
    if !FLASHINFER_GVA_RATIOS.contains(&ratio) {
        return Some(format!("GVA ratio {ratio} is not among the bundle's validated ratios {FLASHINFER_GVA_RATIOS:?}"));
    }
    None
}

/// Resolves a request; `Err` names the backend and the reason it cannot run.
/// `sm_count` matters only to kernels that bake it in (SM100).
pub fn resolve(
    request: BackendRequest,
    compute_capability: (i32, i32),
    sm_count: i32,
    g: &GdnGeometry,
) -> Result<DispatchDecision, Ineligible> {
    let dsl = match request {
        BackendRequest::CuteDslSm90 => Some(Backend::CuteDslSm90),
        BackendRequest::CuteDslSm90Cp => Some(Backend::CuteDslSm90Cp),
        BackendRequest::CuteDslSm100 => Some(Backend::CuteDslSm100),
        BackendRequest::CuteDslSm120 => Some(Backend::CuteDslSm120),
        _ => None,
    };
    if let Some(backend) = dsl {
        let family = backend.dsl_family().expect("a DSL backend");
        dsl::eligibility(family, compute_capability, sm_count, g)?;
        return Ok(DispatchDecision {
            requested: request,
            resolved: backend,
            reason: "requested".to_string(),
            context_parallel_per_call: false,
        });
    }
    let eligible = flashinfer_eligibility(compute_capability, g);
    // Auto on SM90 for the validated geometries: the DSL kernels, CP or not
    // per call, when the bundle has both SM90 families.
    if request == BackendRequest::Auto
        && eligible.is_ok()
        && dsl::eligibility(DslFamily::Sm90, compute_capability, sm_count, g).is_ok()
    {
        // The CP pipeline exists for Hv > 8 only (its simt_row4 fixup is not
        // exported): smaller geometries stay on the non-CP kernel.
        let cp = dsl::eligibility(DslFamily::Sm90Cp, compute_capability, sm_count, g);
        return Ok(DispatchDecision {
            requested: request,
            resolved: Backend::CuteDslSm90,
            reason: match &cp {
                Ok(()) => "SM90: CuTe DSL kernel, context-parallel per call when sequences x value heads < SMs/2 and a sequence exceeds 2048 tokens".to_string(),
                Err(why) => format!(
                    "SM90: CuTe DSL kernel (no context-parallel: {})",
                    why.reason
                ),
            },
            context_parallel_per_call: cp.is_ok(),
        });
    }
    let (resolved, reason) = match (request, eligible) {
        (BackendRequest::Auto, Ok(())) => (
            Backend::FlashInfer,
            "eligible for the FlashInfer SM90 kernel".to_string(),
        ),
        (BackendRequest::Auto, Err(why)) => {
            (Backend::Portable, format!("fallback: {}", why.reason))
        }
        (BackendRequest::FlashInfer, Ok(())) => (Backend::FlashInfer, "requested".to_string()),
        (BackendRequest::FlashInfer, Err(why)) => return Err(why),
        (BackendRequest::FlashInferVsplit, Ok(())) => {
            (Backend::FlashInferVsplit, "requested".to_string())
        }
        (BackendRequest::FlashInferVsplit, Err(why)) => {
            return Err(Ineligible {
                backend: Backend::FlashInferVsplit.name(),
                ..why
            })
        }
        (BackendRequest::Portable, _) => (Backend::Portable, "requested".to_string()),
        (_, _) => unreachable!("DSL requests are resolved above"),
    };
    if resolved == Backend::Portable {
        portable_cubin(compute_capability)?;
    }
    Ok(DispatchDecision {
        requested: request,
        resolved,
        reason,
        context_parallel_per_call: false,
    })
}

/// The portable GDN cubin for a GPU (see [`cubin_for`]).
pub fn portable_cubin(compute_capability: (i32, i32)) -> Result<(u32, &'static [u8]), Ineligible> {
    cubin_for(PORTABLE_UNIT, compute_capability).map_err(|why| Ineligible {
        backend: Backend::Portable.name(),
        ..why
    })
}

pub(crate) const PORTABLE_UNIT: &str = "gdn_portable";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle_embed::CUBINS;

    const QWEN35_4B: GdnGeometry = GdnGeometry {
        num_qk_heads: 16,
        num_v_heads: 32,
        head_dim: 128,
    };

    #[test]
    fn auto_on_hopper_picks_the_dsl_kernels_for_every_validated_ratio() {
        for hv in [16, 32, 48] {
            let g = GdnGeometry {
                num_v_heads: hv,
                ..QWEN35_4B
            };
            let d = resolve(BackendRequest::Auto, (9, 0), 132, &g).unwrap();
            assert_eq!(d.resolved, Backend::CuteDslSm90, "Hv={hv}: {}", d.reason);
            assert!(d.context_parallel_per_call);
        }
        // Hv <= 8 (the tiny test models): non-CP only.
        let tiny = GdnGeometry {
            num_qk_heads: 2,
            num_v_heads: 4,
            head_dim: 128,
        };
        let d = resolve(BackendRequest::Auto, (9, 0), 132, &tiny).unwrap();
        assert_eq!(d.resolved, Backend::CuteDslSm90, "{}", d.reason);
        assert!(
            !d.context_parallel_per_call && d.reason.contains("simt_row4"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn context_parallel_rule_follows_the_h200_benchmark() {
        // (sequences, value heads, longest sequence) -> CP?, from docs/results/h200-2026-11-29-s2/README.md (the CP table).
        for (n, hv, len, cp) in [
            (1, 32, 2048, false),
            (1, 32, 8192, true),
            (1, 32, 65536, true),
            (4, 32, 2048, false),
            (8, 32, 8192, false),
            (1, 48, 8192, true),
        ] {
            assert_eq!(
                prefer_context_parallel(n, hv, len, 132),
                cp,
                "{n}x{len}, Hv={hv}"
            );
        }
    }

    #[test]
    fn auto_elsewhere_falls_back_to_portable_and_says_why() {
        for cc in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
            let d = resolve(BackendRequest::Auto, cc, 132, &QWEN35_4B).unwrap();
            assert_eq!(d.resolved, Backend::Portable);
            assert!(d.reason.contains("sm_90a"), "{}", d.reason);
        }
        let g = GdnGeometry {
            num_v_heads: 64,
            ..QWEN35_4B
        }; // ratio 4
        let d = resolve(BackendRequest::Auto, (9, 0), 132, &g).unwrap();
        assert_eq!(d.resolved, Backend::Portable);
        assert!(d.reason.contains("ratio 4"), "{}", d.reason);
    }

    #[test]
    fn explicit_flashinfer_on_ineligible_gpu_is_an_error() {
        for (request, name) in [
            (BackendRequest::FlashInfer, "flashinfer"),
            (BackendRequest::FlashInferVsplit, "flashinfer-vsplit"),
        ] {
            let why = resolve(request, (8, 9), 128, &QWEN35_4B).unwrap_err();
            assert_eq!(why.backend, name);
            assert!(why.reason.contains("sm_89"), "{why}");
            let g = GdnGeometry {
                head_dim: 64,
                ..QWEN35_4B
            };
            assert!(resolve(request, (9, 0), 132, &g)
                .unwrap_err()
                .reason
                .contains("head dim 64"));
        }
    }

    #[test]
    fn the_value_split_kernel_runs_only_by_request() {
        for hv in [16, 32, 48] {
            let g = GdnGeometry {
                num_v_heads: hv,
                ..QWEN35_4B
            };
            let d = resolve(BackendRequest::FlashInferVsplit, (9, 0), 132, &g).unwrap();
            assert_eq!(d.resolved, Backend::FlashInferVsplit, "Hv={hv}");
            assert!(!d.context_parallel_per_call);
            let auto = resolve(BackendRequest::Auto, (9, 0), 132, &g).unwrap();
            assert_ne!(auto.resolved, Backend::FlashInferVsplit);
        }
    }

    #[test]
    fn portable_cubin_selection_never_needs_jit() {
        assert_eq!(portable_cubin((8, 7)).unwrap().0, 86);
        assert_eq!(portable_cubin((8, 9)).unwrap().0, 89);
        assert_eq!(portable_cubin((9, 0)).unwrap().0, 90);
        assert_eq!(portable_cubin((12, 1)).unwrap().0, 120);
        let err = portable_cubin((7, 5)).unwrap_err();
        assert_eq!(err.backend, "portable");
        assert!(
            err.reason.contains("sm_75") && err.reason.contains("sm_80"),
            "{err}"
        );
        // Every embedded cubin is an ELF image, not PTX text.
        for (unit, sm, bytes) in CUBINS {
            assert_eq!(&bytes[..4], b"\x7fELF", "{unit} sm_{sm}");
        }
        for unit in [PORTABLE_UNIT, "model_kernels", "sampling", "skinny_linear"] {
            assert_eq!(cubin_for(unit, (9, 0)).unwrap().0, 90, "{unit}");
        }
        assert!(resolve(BackendRequest::Portable, (7, 5), 40, &QWEN35_4B).is_err());
    }

    #[test]
    fn dsl_backends_by_request_and_sm90_auto_only() {
        // Auto picks a DSL kernel only on SM90 (the Blackwell artifacts have
        // never run: explicit request only).
        for cc in [(10, 0), (12, 0)] {
            let d = resolve(BackendRequest::Auto, cc, 148, &QWEN35_4B).unwrap();
            assert!(d.resolved.dsl_family().is_none(), "{cc:?}: {d:?}");
        }
        for (request, backend) in [
            (BackendRequest::CuteDslSm90, Backend::CuteDslSm90),
            (BackendRequest::CuteDslSm90Cp, Backend::CuteDslSm90Cp),
        ] {
            let d = resolve(request, (9, 0), 132, &QWEN35_4B).unwrap();
            assert_eq!(d.resolved, backend);
            let why = resolve(request, (12, 0), 170, &QWEN35_4B).unwrap_err();
            assert_eq!(why.backend, backend.name());
            assert!(why.reason.contains("sm_120"), "{why}");
        }
        // On the H200 (sm_90, 132 SMs) both Blackwell families are refused.
        let why = resolve(BackendRequest::CuteDslSm100, (9, 0), 132, &QWEN35_4B).unwrap_err();
        assert_eq!(why.backend, "cute-dsl-sm100");
        assert!(why.reason.contains("sm_100a"), "{why}");
        let why = resolve(BackendRequest::CuteDslSm120, (9, 0), 132, &QWEN35_4B).unwrap_err();
        assert_eq!(why.backend, "cute-dsl-sm120");
        assert!(why.reason.contains("sm_120a"), "{why}");
        // A B200-class sm_100 part with another SM count is refused too.
        let why = resolve(BackendRequest::CuteDslSm100, (10, 0), 160, &QWEN35_4B).unwrap_err();
        assert!(why.reason.contains("148"), "{why}");
        assert_eq!(
            resolve(BackendRequest::CuteDslSm100, (10, 0), 148, &QWEN35_4B)
                .unwrap()
                .resolved,
            Backend::CuteDslSm100
        );
    }

    #[test]
    fn backend_request_parses() {
        assert_eq!(
            "auto".parse::<BackendRequest>().unwrap(),
            BackendRequest::Auto
        );
        assert_eq!(
            "flashinfer".parse::<BackendRequest>().unwrap(),
            BackendRequest::FlashInfer
        );
        assert_eq!(
            "portable".parse::<BackendRequest>().unwrap(),
            BackendRequest::Portable
        );
        for (name, request) in [
            ("flashinfer-vsplit", BackendRequest::FlashInferVsplit),
            ("cute-dsl-sm90", BackendRequest::CuteDslSm90),
            ("cute-dsl-sm90-cp", BackendRequest::CuteDslSm90Cp),
            ("cute-dsl-sm100", BackendRequest::CuteDslSm100),
            ("cute-dsl-sm120", BackendRequest::CuteDslSm120),
        ] {
            assert_eq!(name.parse::<BackendRequest>().unwrap(), request);
        }
        let e = "triton".parse::<BackendRequest>().unwrap_err();
        assert_eq!(e, UnknownBackend("triton".into()));
        assert!(e.to_string().contains("\"triton\"; expected auto"), "{e}");
        // Every backend parses from its own name.
        for backend in [
            Backend::FlashInfer,
            Backend::FlashInferVsplit,
            Backend::Portable,
            Backend::CuteDslSm90,
            Backend::CuteDslSm90Cp,
            Backend::CuteDslSm100,
            Backend::CuteDslSm120,
        ] {
            assert!(
                backend.name().parse::<BackendRequest>().is_ok(),
                "{backend}"
            );
        }
    }
}
