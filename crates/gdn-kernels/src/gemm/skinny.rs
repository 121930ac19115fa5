//! Skinny linear layers for decode steps (`cuda/skinny_linear.cu`, cubins
//! from the verified bundle): `y[m, n] = x[m, k] · w[n, k]ᵀ` for m <= 16
//! rows, the contract of [`crate::Gemm::linear`] (bf16 in, fp32
//! accumulation, bf16 or fp32 out). A block owns 16 output columns over all
//! of k; its warps split k and sum their partials in shared memory, so
//! there is no split-K pass. This module alone knows the kernels' names,
//! arguments and launch geometry, and checks every argument before
//! launching. Which calls take it instead of cuBLAS is [`crate::gemm::ops`]'s
//! rule.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::bf16;

use crate::gemm::linear::{check_lengths, GemmOutput, GemmShape};
use crate::shared::cubins::cubin_for;
use crate::shared::error::{invalid, During, GdnError, Op};

const UNIT: &str = "skinny_linear";
const OP: Op = Op::SkinnyLinear;
/// Most rows of x one call takes (two 8-row blocks of the kernel).
pub const SKINNY_MAX_ROWS: usize = 16;
/// Output columns per block (`kTileCols`).
const TILE_COLS: usize = 16;
/// Most warps per block (`kMaxWarps`).
const MAX_WARPS: u32 = 16;
/// Streaming multiprocessors the heuristic fills (the H200 has 132).
const HEURISTIC_SMS: usize = 132;
/// Resident warps per SM the heuristic aims for (the kernels use up to 128
/// registers per thread: 16 warps of them fit an SM).
const HEURISTIC_WARPS_PER_SM: usize = 16;

/// Launch shape of one skinny call: warps per block (they split k) and
/// steps of 32 k each warp loads before it multiplies (16-byte weight loads
/// in flight per lane: twice that).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SkinnyConfig {
    pub warps: u32,
    pub k_unroll: u32,
}

impl SkinnyConfig {
    /// Every configuration the kernels have (the benchmark sweeps them);
    /// `k_unroll` 8 only for m <= 8 (see [`SkinnyConfig::check`]).
    pub fn all() -> Vec<SkinnyConfig> {
        let mut v = Vec::new();
        for warps in [1, 2, 4, 8, 16] {
            for k_unroll in [2, 4, 8] {
                v.push(SkinnyConfig { warps, k_unroll });
            }
        }
        v
    }

    /// An unmeasured default: enough warps per block that the grid's warps
    /// fill every SM about [`HEURISTIC_WARPS_PER_SM`] deep, but no more
    /// warps than k has rounds of 4 steps.
    pub fn heuristic(n: usize, k: usize) -> SkinnyConfig {
        let k_unroll = 4;
        let tiles = n.div_ceil(TILE_COLS).max(1);
        let want = (HEURISTIC_SMS * HEURISTIC_WARPS_PER_SM)
            .div_ceil(tiles)
            .next_power_of_two();
        let rounds = k.div_ceil(32 * k_unroll as usize).max(1);
        let warps = want.min(rounds).min(MAX_WARPS as usize).max(1) as u32;
        SkinnyConfig { warps, k_unroll }
    }

    /// Whether the kernels have this configuration for `m` rows.
    pub fn check(&self, m: usize) -> Result<(), GdnError> {
        if !(1..=MAX_WARPS).contains(&self.warps) {
            return Err(invalid(
                OP,
                "config",
                format!("{} warps per block (1..={MAX_WARPS})", self.warps),
            ));
        }
        if ![2, 4, 8].contains(&self.k_unroll) || (m > 8 && self.k_unroll == 8) {
            return Err(invalid(
                OP,
                "config",
                format!(
                    "k_unroll {} for m = {m} (2, 4 or 8; 8 only for m <= 8)",
                    self.k_unroll
                ),
            ));
        }
        Ok(())
    }

    /// Index into [`SkinnyLinear`]'s kernels (after [`SkinnyConfig::check`]).
    fn kernel_index(&self, m: usize, f32_out: bool) -> usize {
        let variant = match (m > 8, self.k_unroll) {
            (false, 2) => 0,
            (false, 4) => 1,
            (false, _) => 2,
            (true, 2) => 3,
            (true, _) => 4,
        };
        variant * 2 + usize::from(f32_out)
    }
}

/// Kernel names in [`SkinnyConfig::kernel_index`] order.
const KERNELS: [&str; 10] = [
    "skinny_linear_r1_u2_bf16",
    "skinny_linear_r1_u2_f32",
    "skinny_linear_r1_u4_bf16",
    "skinny_linear_r1_u4_f32",
    "skinny_linear_r1_u8_bf16",
    "skinny_linear_r1_u8_f32",
    "skinny_linear_r2_u2_bf16",
    "skinny_linear_r2_u2_f32",
    "skinny_linear_r2_u4_bf16",
    "skinny_linear_r2_u4_f32",
];

/// The skinny kernels, loaded for one stream's device.
pub struct SkinnyLinear {
    stream: Arc<CudaStream>,
    kernels: Vec<CudaFunction>,
    _module: Arc<CudaModule>,
}

impl SkinnyLinear {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().during(OP)?;
        let (_, cubin) = cubin_for(UNIT, cc).map_err(|why| why.into_error(OP))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .during(OP)?;
        let kernels = KERNELS
            .iter()
            .map(|name| module.load_function(name))
            .collect::<Result<Vec<_>, _>>()
            .during(OP)?;
        Ok(SkinnyLinear {
            stream,
            kernels,
            _module: module,
        })
    }

    /// Why these operands cannot take the skinny kernels (`None`: they
    /// can): m in 1..=16, k a multiple of 8, x and w 16-byte aligned, every
    /// dimension within i32. Lengths are the caller's check.
    pub fn unsupported(x_ptr: u64, w_ptr: u64, shape: GemmShape) -> Option<String> {
        let GemmShape { m, n, k } = shape;
        if !(1..=SKINNY_MAX_ROWS).contains(&m) {
            return Some(format!("m = {m} (1..={SKINNY_MAX_ROWS})"));
        }
        if n == 0 || k == 0 || k % 8 != 0 {
            return Some(format!("n = {n}, k = {k} (k a positive multiple of 8)"));
        }
        if i32::try_from(n).is_err() || i32::try_from(k).is_err() {
            return Some(format!("n = {n}, k = {k} exceed i32"));
        }
        if x_ptr % 16 != 0 || w_ptr % 16 != 0 {
            return Some("x and w must be 16-byte aligned".into());
        }
        None
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` on the skinny kernels with `config`.
    /// Lengths as [`crate::Gemm::linear`] (x and y may be longer than m
    /// rows, w exactly `[n, k]`); refuses what [`SkinnyLinear::unsupported`]
    /// names and configurations the kernels lack.
    pub fn linear<X, W, Y, O>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        shape: GemmShape,
        config: SkinnyConfig,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        Y: DevicePtrMut<O>,
        O: GemmOutput,
    {
        check_lengths(OP, x.len(), w.len(), y.len(), shape)?;
        let GemmShape { m, n, k } = shape;
        config.check(m)?;
        let s = &self.stream;
        let (xp, _xg) = x.device_ptr(s);
        let (wp, _wg) = w.device_ptr(s);
        let (yp, _yg) = y.device_ptr_mut(s);
        if let Some(why) = Self::unsupported(xp, wp, shape) {
            return Err(invalid(OP, "operands", format!("{why} ({shape})")));
        }
        let f = &self.kernels[config.kernel_index(m, O::IS_F32)];
        let (m_, n_, k_) = (m as i32, n as i32, k as i32);
        let mut b = s.launch_builder(f);
        b.arg(&yp).arg(&xp).arg(&wp).arg(&m_).arg(&n_).arg(&k_);
        // The warps' partial sums, [warps][16 columns][8 or 16 rows] f32.
        let row_blocks = if m > 8 { 2 } else { 1 };
        let shared = if config.warps == 1 {
            0
        } else {
            config.warps * (TILE_COLS as u32) * 8 * row_blocks * 4
        };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(TILE_COLS) as u32, 1, 1),
            block_dim: (config.warps * 32, 1, 1),
            shared_mem_bytes: shared,
        };
        // SAFETY: matches skinny_linear_r*_u*_{bf16,f32}(y, x, w, M, N, K):
        // y holds >= m * n outputs of the kernel's type, x >= m * k and w
        // n * k bf16 (checked above), both 16-byte aligned with k % 8 == 0
        // (the kernel's 16-byte loads); m <= 8 for the r1 kernels and <= 16
        // for r2 (kernel_index), at most MAX_WARPS warps, the dynamic shared
        // memory the kernel indexes (at most 16 KiB); the guards keep
        // the buffers alive and ordered on `s` until the launch is queued.
        unsafe { b.launch(cfg) }.during(OP)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_config_names_an_existing_kernel_variant() {
        for c in SkinnyConfig::all() {
            for m in [1, 8, 9, 16] {
                match c.check(m) {
                    Ok(()) => {
                        let i = c.kernel_index(m, false);
                        let name = KERNELS[i];
                        let rows = if m > 8 { "_r2_" } else { "_r1_" };
                        assert!(name.contains(rows), "{c:?} m={m}: {name}");
                        assert!(name.contains(&format!("_u{}_", c.k_unroll)), "{name}");
                        assert!(KERNELS[c.kernel_index(m, true)].ends_with("_f32"));
                        assert!(name.ends_with("_bf16"));
                    }
                    Err(_) => assert!(m > 8 && c.k_unroll == 8, "{c:?} m={m}"),
                }
            }
        }
        assert!(SkinnyConfig {
            warps: 0,
            k_unroll: 4
        }
        .check(1)
        .is_err());
        assert!(SkinnyConfig {
            warps: 17,
            k_unroll: 4
        }
        .check(1)
        .is_err());
        assert!(SkinnyConfig {
            warps: 4,
            k_unroll: 3
        }
        .check(1)
        .is_err());
    }

    #[test]
    fn heuristic_stays_within_the_kernels_and_k() {
        for (n, k) in [
            (12352, 2560),
            (2560, 4096),
            (2560, 9216),
            (248320, 2560),
            (16, 64),
        ] {
            let c = SkinnyConfig::heuristic(n, k);
            c.check(16).unwrap();
            assert!(c.warps as usize <= k.div_ceil(32 * 4), "{n}x{k}: {c:?}");
        }
        // Few tiles: many warps per block; many tiles: few.
        assert_eq!(SkinnyConfig::heuristic(2560, 9216).warps, 16);
        assert_eq!(SkinnyConfig::heuristic(248320, 2560).warps, 1);
    }

    #[test]
    fn unsupported_operands_are_named() {
        assert!(SkinnyLinear::unsupported(0, 0, GemmShape::new(1, 16, 64)).is_none());
        assert!(SkinnyLinear::unsupported(0, 0, GemmShape::new(16, 16, 64)).is_none());
        assert!(SkinnyLinear::unsupported(0, 0, GemmShape::new(17, 16, 64))
            .unwrap()
            .contains("m = 17"));
        assert!(SkinnyLinear::unsupported(0, 0, GemmShape::new(0, 16, 64)).is_some());
        assert!(SkinnyLinear::unsupported(0, 0, GemmShape::new(1, 16, 60))
            .unwrap()
            .contains("multiple of 8"));
        assert!(SkinnyLinear::unsupported(8, 0, GemmShape::new(1, 16, 64))
            .unwrap()
            .contains("aligned"));
        assert!(SkinnyLinear::unsupported(0, 24, GemmShape::new(1, 16, 64))
            .unwrap()
            .contains("aligned"));
    }
}
