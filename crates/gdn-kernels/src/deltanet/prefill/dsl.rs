//! The CuTe DSL kernels of the bundle (FlashInfer 0.7.2.post1, exported ahead
//! of time): which family runs where, and the host-side policy FlashInfer
//! runs in Python before launching them, ported to Rust. The C side
//! (`cuda/gdn_dsl_abi.cpp`) owns the tensor views and the workspace layout;
//! nothing here names a generated symbol.

use crate::bundle_embed::DSL_FAMILIES;
use crate::deltanet::oracle::{GdnGeometry, HEAD_DIM};
use crate::shared::error::Ineligible;

/// A DSL kernel family, as `gdn_dsl_kernel` in `gdn_dsl_abi.h` numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DslFamily {
    Sm90 = 1,
    Sm90Cp = 2,
    Sm100 = 3,
    Sm120 = 4,
}

impl DslFamily {
    /// The driver's `--kernel` name, the table's `dsl.kernel`.
    pub(crate) fn table_name(self) -> &'static str {
        match self {
            DslFamily::Sm90 => "sm90",
            DslFamily::Sm90Cp => "sm90_cp",
            DslFamily::Sm100 => "sm100",
            DslFamily::Sm120 => "sm120",
        }
    }

    /// The backend's name (`BackendRequest` parses it, `Backend` prints it).
    pub(crate) fn backend_name(self) -> &'static str {
        match self {
            DslFamily::Sm90 => "cute-dsl-sm90",
            DslFamily::Sm90Cp => "cute-dsl-sm90-cp",
            DslFamily::Sm100 => "cute-dsl-sm100",
            DslFamily::Sm120 => "cute-dsl-sm120",
        }
    }

    /// The compute capability an `sm_XYa` cubin runs on (arch-specific
    /// features: exactly that one, no later minor).
    fn compute_capability(self) -> (i32, i32) {
        match self {
            DslFamily::Sm90 | DslFamily::Sm90Cp => (9, 0),
            DslFamily::Sm100 => (10, 0),
            DslFamily::Sm120 => (12, 0),
        }
    }
}

/// What the bundle says a family was built with (from the artifact table).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DslFamilyInfo {
    pub kernel: &'static str,
    pub target: &'static str,
    pub sm_count: Option<u32>,
    pub baked_heads: &'static [[u32; 2]],
}

fn info(family: DslFamily) -> Option<&'static DslFamilyInfo> {
    DSL_FAMILIES
        .iter()
        .find(|f| f.kernel == family.table_name())
}

/// Hv/Hqk ratios of Qwen3.5 the DSL variants are exported and tested for.
const QWEN35_RATIOS: [usize; 3] = [1, 2, 3];

/// `Ok(())` if `family` can run on this GPU with this geometry, else why not.
pub(crate) fn eligibility(
    family: DslFamily,
    compute_capability: (i32, i32),
    sm_count: i32,
    g: &GdnGeometry,
) -> Result<(), Ineligible> {
    refusal(family, compute_capability, sm_count, g).map_or(Ok(()), |why| {
        Err(Ineligible::new(family.backend_name(), why))
    })
}

/// Why `family` cannot run on this GPU with this geometry (`None`: it can).
fn refusal(
    family: DslFamily,
    compute_capability: (i32, i32),
    sm_count: i32,
    g: &GdnGeometry,
) -> Option<String> {
    let Some(info) = info(family) else {
        return Some(format!(
            "the bundle has no CuTe DSL {} kernels",
            family.table_name()
        ));
    };
    let want = family.compute_capability();
    if compute_capability != want {
        return Some(format!(
            "the CuTe DSL {} kernels are {} code and run only on sm_{}{}; this GPU is sm_{}{}",
            family.table_name(),
            info.target,
            want.0,
            want.1,
            compute_capability.0,
            compute_capability.1
        ));
    }
    if g.head_dim != HEAD_DIM {
        return Some(format!(
            "head dim {} (the DSL kernels support {HEAD_DIM})",
            g.head_dim
        ));
    }
    if g.num_qk_heads == 0 || g.num_v_heads % g.num_qk_heads != 0 {
        return Some(format!(
            "Hv={} is not a multiple of Hqk={}",
            g.num_v_heads, g.num_qk_heads
        ));
    }
    let ratio = g.num_v_heads / g.num_qk_heads;
    if !QWEN35_RATIOS.contains(&ratio) {
        return Some(format!(
            "GVA ratio {ratio} is not among the exported Qwen3.5 ratios {QWEN35_RATIOS:?}"
        ));
    }
    if let Some(baked) = info.sm_count {
        if sm_count != baked as i32 {
            return Some(format!(
                "the CuTe DSL {} kernels bake in {baked} SMs (persistent scheduler); this GPU has {sm_count}",
                family.table_name()
            ));
        }
    }
    if !info.baked_heads.is_empty()
        && !info
            .baked_heads
            .iter()
            .any(|h| h[0] as usize == g.num_qk_heads && h[1] as usize == g.num_v_heads)
    {
        return Some(format!(
            "the CuTe DSL {} kernels bake in head counts {:?} ([Hqk, Hv]); asked for [{}, {}]",
            family.table_name(),
            info.baked_heads,
            g.num_qk_heads,
            g.num_v_heads
        ));
    }
    // FlashInfer picks the simt_row4 fixup for <= 8 state heads; only the
    // row-8 and hmma fixups are exported.
    if family == DslFamily::Sm90Cp && g.num_v_heads <= 8 {
        return Some(format!(
            "Hv={} needs the CP simt_row4 fixup, which is not exported",
            g.num_v_heads
        ));
    }
    None
}

// ---- FlashInfer host policy, ported from
// flashinfer/gdn_kernels/delta_rule_dsl/varlen_helper.py (0.7.2.post1). ----

const BLK: usize = 64;
/// `CP_CHUNK_LEN_GRANULARITY`
pub(crate) const CP_CHUNK_LEN_GRANULARITY: usize = 512;

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// `chunk_bound_host`: an upper bound of the chunks `num_items` sequences of
/// `total` tokens in all split into, without reading the lengths.
pub(crate) fn chunk_bound(num_items: usize, total: usize, chunk: usize) -> usize {
    let m = num_items.min(total);
    m + (total - m) / chunk
}

/// `is_gddr_device_host`: consumer/workstation names count as GDDR parts.
fn is_gddr(device_name: &str) -> bool {
    let lowered = device_name.to_lowercase();
    ["geforce", "rtx", "workstation"]
        .iter()
        .any(|m| lowered.contains(m))
}

/// `cp_parallelism_threshold_host`: (numerator, denominator).
fn parallelism_threshold(device_name: &str) -> (usize, usize) {
    if is_gddr(device_name) {
        (1, 3)
    } else {
        (1, 2)
    }
}

/// `cp_short_workload_ratio_host`.
fn short_workload_ratio(cc: (i32, i32), num_heads: usize) -> Option<(usize, usize)> {
    if cc.0 == 12 {
        // CP_SM120_SHORT_HEURISTIC_MAX_HEADS = 16
        return (num_heads <= 16).then_some((1, 2));
    }
    Some((1, 1))
}

/// `should_use_cp_host`: FlashInfer's own rule for its public wrapper (CP when
/// the non-CP kernel's parallelism, sequences x state heads, is under the
/// card's threshold). Not our dispatch rule (that comes from the H200
/// benchmark); kept for the benchmark's report.
pub fn flashinfer_would_use_cp(
    num_seqs: usize,
    num_heads: usize,
    sm_count: usize,
    device_name: &str,
    cc: (i32, i32),
) -> bool {
    let work = num_seqs * num_heads;
    if cc.0 == 10 {
        return work * 4 < sm_count;
    }
    let (num, den) = parallelism_threshold(device_name);
    work * den < sm_count * num
}

/// `choose_cp_chunk_len_host`: the smallest 512-aligned chunk length whose
/// bounded CTA count fits one wave, or for short sequences on an idle GPU the
/// length that balances fixup and prefill recurrences.
pub(crate) fn choose_cp_chunk_len(
    max_seqlen: usize,
    num_heads: usize,
    sm_count: usize,
    cc: (i32, i32),
    total_seqlen: usize,
    num_seqs: usize,
    device_name: &str,
) -> usize {
    let granularity = CP_CHUNK_LEN_GRANULARITY;
    if let Some((ratio_num, ratio_den)) = short_workload_ratio(cc, num_heads) {
        let (threshold_num, threshold_den) = parallelism_threshold(device_name);
        let approx_ctas = ceil_div(total_seqlen, granularity) * num_heads;
        if approx_ctas * threshold_den < sm_count * threshold_num {
            let square = ceil_div(max_seqlen * BLK * ratio_num, ratio_den);
            let mut balanced = square.isqrt();
            if balanced * balanced < square {
                balanced += 1;
            }
            return BLK.max(ceil_div(balanced, BLK) * BLK);
        }
    }
    let target_chunks = (sm_count / num_heads.max(1)).max(1);
    let remaining_seqlen = total_seqlen.saturating_sub(max_seqlen);
    let remaining_seqs = num_seqs.saturating_sub(1);
    let bound = |chunk_len: usize| {
        ceil_div(max_seqlen, chunk_len) + chunk_bound(remaining_seqs, remaining_seqlen, chunk_len)
    };
    let (mut lo, mut hi) = (1, ceil_div(max_seqlen, granularity).max(1));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if bound(mid * granularity) <= target_chunks {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo * granularity
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: &str = "NVIDIA H200";

    #[test]
    fn cp_chunk_len_matches_flashinfer() {
        // Expected values from FlashInfer 0.7.2.post1's choose_cp_chunk_len_host
        // (varlen_helper.py), evaluated with these arguments.
        for (max, heads, sms, cc, total, n, name, want) in [
            (8192, 32, 132, (9, 0), 8192, 1, H200, 2048),
            (2048, 32, 132, (9, 0), 2048, 1, H200, 512),
            (65536, 32, 132, (9, 0), 65536, 1, H200, 16384),
            (8192, 48, 132, (9, 0), 8192, 1, H200, 4096),
            (8192, 16, 132, (9, 0), 8192, 1, H200, 1024),
            (4096, 32, 132, (9, 0), 4099, 4, H200, 4096),
            (100, 32, 132, (9, 0), 100, 1, H200, 128),
            (
                8192,
                32,
                170,
                (12, 0),
                8192,
                1,
                "NVIDIA GeForce RTX 5090",
                2048,
            ),
        ] {
            assert_eq!(
                choose_cp_chunk_len(max, heads, sms, cc, total, n, name),
                want,
                "{max} {heads} {sms} {cc:?} {total} {n} {name}"
            );
        }
    }

    #[test]
    fn flashinfer_cp_rule_and_chunk_bound() {
        assert!(flashinfer_would_use_cp(1, 32, 132, H200, (9, 0)));
        assert!(!flashinfer_would_use_cp(4, 32, 132, H200, (9, 0)));
        assert!(!flashinfer_would_use_cp(
            1,
            48,
            132,
            "RTX PRO 6000",
            (12, 0)
        ));
        assert_eq!(chunk_bound(1, 8192, 2048), 4);
        assert_eq!(chunk_bound(4, 4099, 64), 4 + 4095 / 64);
        assert_eq!(chunk_bound(3, 2, 64), 2);
    }

    fn g(hq: usize, hv: usize) -> GdnGeometry {
        GdnGeometry {
            num_qk_heads: hq,
            num_v_heads: hv,
            head_dim: 128,
        }
    }

    #[test]
    fn sm100_and_sm120_are_refused_on_other_arches_and_sm100_on_other_sm_counts() {
        for cc in [(9, 0), (8, 9), (12, 0), (10, 3)] {
            let why = eligibility(DslFamily::Sm100, cc, 148, &g(16, 32))
                .unwrap_err()
                .reason;
            assert!(
                why.contains("sm_100a") && why.contains("only on sm_100"),
                "{why}"
            );
        }
        for cc in [(9, 0), (10, 0), (12, 1)] {
            let why = eligibility(DslFamily::Sm120, cc, 170, &g(16, 32))
                .unwrap_err()
                .reason;
            assert!(why.contains("sm_120a"), "{why}");
        }
        let why = eligibility(DslFamily::Sm100, (10, 0), 132, &g(16, 32))
            .unwrap_err()
            .reason;
        assert!(why.contains("148 SMs") && why.contains("132"), "{why}");
        let why = eligibility(DslFamily::Sm100, (10, 0), 148, &g(8, 16))
            .unwrap_err()
            .reason;
        assert!(why.contains("[8, 16]"), "{why}");
        assert!(eligibility(DslFamily::Sm100, (10, 0), 148, &g(16, 48)).is_ok());
        assert!(eligibility(DslFamily::Sm120, (12, 0), 170, &g(16, 16)).is_ok());
    }

    #[test]
    fn sm90_families_need_hopper_and_qwen35_geometry() {
        for f in [DslFamily::Sm90, DslFamily::Sm90Cp] {
            for hv in [16, 32, 48] {
                assert!(eligibility(f, (9, 0), 132, &g(16, hv)).is_ok());
            }
            assert!(eligibility(f, (9, 0), 132, &g(16, 64))
                .unwrap_err()
                .reason
                .contains("ratio 4"));
            assert!(eligibility(f, (8, 0), 108, &g(16, 32))
                .unwrap_err()
                .reason
                .contains("sm_80"));
            let mut odd = g(16, 32);
            odd.head_dim = 64;
            assert!(eligibility(f, (9, 0), 132, &odd)
                .unwrap_err()
                .reason
                .contains("head dim 64"));
        }
        assert!(eligibility(DslFamily::Sm90Cp, (9, 0), 132, &g(4, 8))
            .unwrap_err()
            .reason
            .contains("simt_row4"));
        assert!(eligibility(DslFamily::Sm90, (9, 0), 132, &g(4, 8)).is_ok());
    }
}
