//! Checkpoint bytes to device memory. Two pinned staging buffers: while the
//! asynchronous copy out of one runs, a few threads fill the other straight
//! from the mmapped checkpoint (bf16 copied as stored; f16 and f32 rounded
//! to bf16). The path this replaces widened every tensor to an f32 vector,
//! narrowed it again into a bf16 vector and copied that synchronously from
//! pageable memory: three passes and two fresh allocations per weight, most
//! of the 4B's cold start then (the serving cold start now: "Serving" in
//! docs/performance.md).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use half::{bf16, f16};
use safetensors::Dtype;

use crate::error::DeviceError;
use crate::weights::RawTensor;

/// Elements per staging buffer (64 MiB of bf16): large enough that a copy
/// costs far more than its launch, small enough that pinning two is quick.
pub(crate) const STAGING_ELEMS: usize = 32 << 20;

/// Threads filling one staging buffer: host memory bandwidth is shared, and
/// more than a few threads no longer make a copy faster.
const MAX_FILL_THREADS: usize = 8;

/// Pieces below this many elements are filled by one thread (a spawn costs
/// more than copying them).
const MIN_PIECE: usize = 1 << 18;

pub(crate) struct Staging {
    stream: Arc<CudaStream>,
    buffers: Vec<PinnedHostSlice<bf16>>,
    /// Recorded after the copy out of each buffer: it is refilled only
    /// once that copy is done.
    copied: Vec<Option<CudaEvent>>,
    next: usize,
    threads: usize,
}

impl Staging {
    /// Two pinned buffers of `elems` bf16 each, on the context of `stream`.
    pub fn new(stream: Arc<CudaStream>, elems: usize) -> Result<Staging, DeviceError> {
        let ctx = stream.context().clone();
        let elems = elems.max(1);
        // SAFETY: the buffers are written (fill) before any copy reads them.
        let buffers = (0..2)
            .map(|_| unsafe { ctx.alloc_pinned::<bf16>(elems) })
            .collect::<Result<Vec<_>, _>>()?;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_FILL_THREADS);
        Ok(Staging {
            stream,
            copied: vec![None, None],
            buffers,
            next: 0,
            threads,
        })
    }

    /// Copies `parts` one after the other into `dst` (a row-wise stack of
    /// the parts), as bf16. The copies may still run when this returns;
    /// [`Staging::finish`] waits for them.
    pub fn upload(
        &mut self,
        parts: &[RawTensor<'_>],
        dst: &mut CudaSlice<bf16>,
    ) -> Result<(), DeviceError> {
        let total: usize = parts.iter().map(RawTensor::len).sum();
        assert_eq!(total, dst.len(), "the destination holds the parts");
        let mut at = 0;
        for part in parts {
            let n = part.len();
            let mut done = 0;
            while done < n {
                let i = self.next;
                self.next = (i + 1) % self.buffers.len();
                if let Some(copy) = self.copied[i].take() {
                    copy.synchronize()?;
                }
                let buffer = self.buffers[i].as_mut_slice()?;
                let k = (n - done).min(buffer.len());
                fill_bf16(*part, done, &mut buffer[..k], self.threads);
                let mut target = dst.slice_mut(at + done..at + done + k);
                self.stream.memcpy_htod(&buffer[..k], &mut target)?;
                self.copied[i] = Some(
                    self.stream
                        .record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))?,
                );
                done += k;
            }
            at += n;
        }
        Ok(())
    }

    /// Waits until every copy out of the staging buffers is done.
    pub fn finish(&mut self) -> Result<(), DeviceError> {
        for copy in self.copied.iter_mut().filter_map(Option::take) {
            copy.synchronize()?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The pinned memory is freed next: no copy may still read it.
        if let Err(e) = self.finish() {
            log::error!("waiting for weight uploads: {e}");
        }
    }
}

/// Elements `from..from + out.len()` of `src` as bf16 into `out`, split
/// over up to `threads` threads.
pub(crate) fn fill_bf16(src: RawTensor<'_>, from: usize, out: &mut [bf16], threads: usize) {
    let piece = out.len().div_ceil(threads.max(1)).max(MIN_PIECE);
    if piece >= out.len() {
        fill_piece(src, from, out);
        return;
    }
    std::thread::scope(|s| {
        for (j, chunk) in out.chunks_mut(piece).enumerate() {
            s.spawn(move || fill_piece(src, from + j * piece, chunk));
        }
    });
}

/// Rounds as the f32 path did (`bf16::from_f32`, to nearest even), so the
/// device holds the same bits as before.
fn fill_piece(src: RawTensor<'_>, from: usize, out: &mut [bf16]) {
    let n = out.len();
    match src.dtype {
        Dtype::BF16 => {
            let bytes = &src.bytes[from * 2..(from + n) * 2];
            if cfg!(target_endian = "little") {
                // SAFETY: `out` is `n` bf16 = `2n` initialised bytes, and
                // every bit pattern is a valid bf16.
                let raw =
                    unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 2 * n) };
                raw.copy_from_slice(bytes);
            } else {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]);
                }
            }
        }
        Dtype::F16 => {
            let bytes = &src.bytes[from * 2..(from + n) * 2];
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32());
            }
        }
        // F32, the one dtype left that `Weights::raw` accepts.
        _ => {
            let bytes = &src.bytes[from * 4..(from + n) * 4];
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Weights;
    use safetensors::tensor::TensorView;

    /// Values with every kind of rounding case: halfway bits, subnormals,
    /// signs, zeros, large magnitudes.
    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = ((i as f32) * 0.618_034).sin() * 10f32.powi((i % 9) as i32 - 4);
                match i % 11 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::from_bits(0x3f80_8000), // exactly halfway between two bf16
                    3 => 1e-40,                       // f32 subnormal
                    _ => x,
                }
            })
            .collect()
    }

    fn bytes_of(dtype: Dtype, v: &[f32]) -> Vec<u8> {
        match dtype {
            Dtype::BF16 => v
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
            Dtype::F16 => v
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        }
    }

    /// A checkpoint with `a` (bf16 [3, 4]), `b` (f32 [2, 4]), `c` (f16
    /// [1, 4]) and `big` (f32 [`big`], several fill threads' worth).
    fn checkpoint(big: usize) -> tempfile::TempDir {
        let specs = [
            ("a", Dtype::BF16, vec![3, 4]),
            ("b", Dtype::F32, vec![2, 4]),
            ("c", Dtype::F16, vec![1, 4]),
            ("big", Dtype::F32, vec![big]),
        ];
        let data: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(k, (_, d, s))| {
                let v = values(s.iter().product::<usize>() + k);
                bytes_of(*d, &v[k..])
            })
            .collect();
        let views: Vec<(&str, TensorView)> = specs
            .iter()
            .zip(&data)
            .map(|((n, d, s), b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let out = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
        dir
    }

    /// The reference: the f32 path (`Weights::get`) rounded to bf16.
    fn expected(w: &Weights, name: &str, shape: &[usize]) -> Vec<u16> {
        w.get(name, shape)
            .unwrap()
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect()
    }

    #[test]
    fn staging_fills_hold_the_bits_of_the_f32_path_for_every_dtype_and_split() {
        let big = 3 * MIN_PIECE + 17;
        let dir = checkpoint(big);
        let w = Weights::open(dir.path()).unwrap();
        for (name, shape) in [
            ("a", vec![3, 4]),
            ("b", vec![2, 4]),
            ("c", vec![1, 4]),
            ("big", vec![big]),
        ] {
            let raw = w.raw(name, &shape).unwrap();
            let want = expected(&w, name, &shape);
            assert_eq!(raw.len(), want.len());
            // Whole, and from an offset with several threads (pieces of
            // MIN_PIECE, the last one short).
            for (from, threads) in [(0, 1), (want.len() / 3, 4), (0, 8)] {
                let mut out = vec![bf16::from_bits(0xdead); want.len() - from];
                fill_bf16(raw, from, &mut out, threads);
                let got: Vec<u16> = out.iter().map(|x| x.to_bits()).collect();
                assert!(got == want[from..], "{name} from {from}, {threads} threads");
            }
        }
    }

    #[test]
    fn uploads_through_small_staging_buffers_equal_the_f32_path() {
        let Some(stream) = gdn_kernels_testkit::gpu_stream() else {
            return;
        };
        let big = MIN_PIECE + 5;
        let dir = checkpoint(big);
        let w = Weights::open(dir.path()).unwrap();
        let parts = [
            w.raw("a", &[3, 4]).unwrap(),
            w.raw("b", &[2, 4]).unwrap(),
            w.raw("c", &[1, 4]).unwrap(),
        ];
        let mut want = expected(&w, "a", &[3, 4]);
        want.extend(expected(&w, "b", &[2, 4]));
        want.extend(expected(&w, "c", &[1, 4]));
        // Buffers of 5 elements: chunks straddle parts, both buffers
        // alternate many times; then one buffer larger than everything.
        for elems in [5, 1 << 20] {
            let mut staging = Staging::new(stream.clone(), elems).unwrap();
            let mut fused = stream.alloc_zeros::<bf16>(want.len()).unwrap();
            staging.upload(&parts, &mut fused).unwrap();
            let mut large = stream.alloc_zeros::<bf16>(big).unwrap();
            staging
                .upload(&[w.raw("big", &[big]).unwrap()], &mut large)
                .unwrap();
            staging.finish().unwrap();
            let bits = |buf: &CudaSlice<bf16>| -> Vec<u16> {
                let host = stream.clone_dtoh(buf).unwrap();
                host.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(bits(&fused), want, "staging of {elems} elements");
            assert!(
                bits(&large) == expected(&w, "big", &[big]),
                "big, staging of {elems}"
            );
        }
    }
}
