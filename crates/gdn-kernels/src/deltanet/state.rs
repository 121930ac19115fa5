//! The DeltaNet recurrent state's storage: its dtype ([`StateDtype`], a
//! setting: `mamba_ssm_dtype` in config.json, vLLM's
//! `--mamba-ssm-cache-dtype`) and the typed buffers that hold it on the
//! device ([`RecurrentState`]) and on the host ([`HostState`]). Callers see
//! the dtype, never bytes: every op that reads or writes the state picks its
//! kernel from the buffer's variant. The math on the state is f32 in either
//! case; a bf16 state is rounded to nearest-even bf16 when stored.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};
use half::bf16;

/// How the recurrent state is stored between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StateDtype {
    /// f32: what Hugging Face keeps, and real Qwen3.5 configs ask for.
    #[default]
    F32,
    /// bf16: half the bytes a decode step reads and writes and a slot or
    /// snapshot holds; the math stays f32, each store rounds.
    Bf16,
}

impl StateDtype {
    /// Bytes of one state element.
    pub fn bytes(self) -> usize {
        match self {
            StateDtype::F32 => 4,
            StateDtype::Bf16 => 2,
        }
    }

    /// The name config.json and vLLM use (`float32`, `bfloat16`).
    pub fn name(self) -> &'static str {
        match self {
            StateDtype::F32 => "float32",
            StateDtype::Bf16 => "bfloat16",
        }
    }

    /// The dtype a config.json / vLLM name stands for (`None`: not a state dtype).
    pub fn from_name(name: &str) -> Option<StateDtype> {
        match name {
            "float32" => Some(StateDtype::F32),
            "bfloat16" => Some(StateDtype::Bf16),
            _ => None,
        }
    }

    /// `x` as this dtype stores it: the value a step reads back (the CPU
    /// oracle of the storage rounding).
    pub fn stored(self, x: f32) -> f32 {
        match self {
            StateDtype::F32 => x,
            StateDtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
}

impl fmt::Display for StateDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A pool of recurrent-state slots on the device, in its storage dtype
/// (`[slots, Hv, 128, 128]` elements, see the crate docs).
pub enum RecurrentState {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

/// One slot's recurrent state (or part of it) copied to the host, in the
/// dtype it was stored in.
#[derive(Clone, Debug, PartialEq)]
pub enum HostState {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl HostState {
    pub fn dtype(&self) -> StateDtype {
        match self {
            HostState::F32(_) => StateDtype::F32,
            HostState::Bf16(_) => StateDtype::Bf16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            HostState::F32(v) => v.len(),
            HostState::Bf16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().bytes()
    }

    /// The values, widened to f32 (tests compare states with it).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostState::F32(v) => v.clone(),
            HostState::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

impl RecurrentState {
    /// `len` zero elements of `dtype` on `stream`'s device.
    pub fn zeros(
        stream: &Arc<CudaStream>,
        dtype: StateDtype,
        len: usize,
    ) -> Result<RecurrentState, DriverError> {
        Ok(match dtype {
            StateDtype::F32 => RecurrentState::F32(stream.alloc_zeros(len)?),
            StateDtype::Bf16 => RecurrentState::Bf16(stream.alloc_zeros(len)?),
        })
    }

    /// `values` (f32, rounded to the dtype where it is bf16) on the device:
    /// tests start a state from known values with it.
    pub fn from_f32(
        stream: &Arc<CudaStream>,
        dtype: StateDtype,
        values: &[f32],
    ) -> Result<RecurrentState, DriverError> {
        Ok(match dtype {
            StateDtype::F32 => RecurrentState::F32(stream.clone_htod(values)?),
            StateDtype::Bf16 => {
                let narrow: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
                RecurrentState::Bf16(stream.clone_htod(&narrow)?)
            }
        })
    }

    pub fn dtype(&self) -> StateDtype {
        match self {
            RecurrentState::F32(_) => StateDtype::F32,
            RecurrentState::Bf16(_) => StateDtype::Bf16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            RecurrentState::F32(s) => s.len(),
            RecurrentState::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().bytes()
    }

    /// Zeroes elements `range` (queued on `stream`).
    pub fn zero(
        &mut self,
        stream: &Arc<CudaStream>,
        range: Range<usize>,
    ) -> Result<(), DriverError> {
        match self {
            RecurrentState::F32(s) => stream.memset_zeros(&mut s.slice_mut(range)),
            RecurrentState::Bf16(s) => stream.memset_zeros(&mut s.slice_mut(range)),
        }
    }

    /// Copies element block `from` onto block `to` (blocks of `per`; queued
    /// on `stream`). The blocks must differ.
    pub fn copy_block(
        &mut self,
        stream: &Arc<CudaStream>,
        per: usize,
        from: usize,
        to: usize,
    ) -> Result<(), DriverError> {
        match self {
            RecurrentState::F32(s) => copy_block(stream, s, per, from, to),
            RecurrentState::Bf16(s) => copy_block(stream, s, per, from, to),
        }
    }

    /// Elements `range`, copied to the host (waits for the stream).
    pub fn to_host(
        &self,
        stream: &Arc<CudaStream>,
        range: Range<usize>,
    ) -> Result<HostState, DriverError> {
        Ok(match self {
            RecurrentState::F32(s) => HostState::F32(stream.clone_dtoh(&s.slice(range))?),
            RecurrentState::Bf16(s) => HostState::Bf16(stream.clone_dtoh(&s.slice(range))?),
        })
    }

    /// Writes `host` into the elements from `start` (queued on `stream`;
    /// the caller synchronises before dropping `host`). `false`, and nothing
    /// written, where `host`'s dtype is not this pool's.
    pub fn write_host(
        &mut self,
        stream: &Arc<CudaStream>,
        start: usize,
        host: &HostState,
    ) -> Result<bool, DriverError> {
        let end = start + host.len();
        match (self, host) {
            (RecurrentState::F32(d), HostState::F32(h)) => {
                stream.memcpy_htod(h, &mut d.slice_mut(start..end))?
            }
            (RecurrentState::Bf16(d), HostState::Bf16(h)) => {
                stream.memcpy_htod(h, &mut d.slice_mut(start..end))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Copies element block `from` of `buf` onto block `to` (blocks of `per`).
fn copy_block<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    per: usize,
    from: usize,
    to: usize,
) -> Result<(), DriverError> {
    let (lo, hi) = (from.min(to), from.max(to));
    let (mut low, mut high) = buf.split_at_mut(hi * per);
    // `high` starts at the higher of the two blocks.
    let mut lo_block = low.slice_mut(lo * per..(lo + 1) * per);
    let mut hi_block = high.slice_mut(..per);
    if from < to {
        stream.memcpy_dtod(&lo_block, &mut hi_block)
    } else {
        stream.memcpy_dtod(&hi_block, &mut lo_block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_halve() {
        for d in [StateDtype::F32, StateDtype::Bf16] {
            assert_eq!(StateDtype::from_name(d.name()), Some(d));
        }
        assert_eq!(StateDtype::from_name("float16"), None);
        assert_eq!(StateDtype::from_name("auto"), None);
        assert_eq!(StateDtype::F32.bytes(), 2 * StateDtype::Bf16.bytes());
        assert_eq!(StateDtype::default(), StateDtype::F32);
    }

    #[test]
    fn bf16_storage_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to even (1).
        assert_eq!(StateDtype::Bf16.stored(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            StateDtype::Bf16.stored(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(
            StateDtype::F32.stored(1.0 + 2f32.powi(-8)),
            1.0 + 2f32.powi(-8)
        );
    }
}
