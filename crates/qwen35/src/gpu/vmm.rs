//! CUDA virtual memory management for the arena ([`crate::gpu::arena`]):
//! a pool of physical chunks of the device's granularity, created up front,
//! and virtual ranges whose chunks are backed by any pooled chunk on
//! demand. A range keeps its address for life (kernels and captured graphs
//! hold it); only what backs each chunk of it changes.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::{CudaStream, DriverError};

use crate::error::RunError;

/// Device-local memory of `stream`'s device.
fn allocation_prop(stream: &CudaStream) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: location(stream),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn location(stream: &CudaStream) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: stream.context().cu_device(),
    }
}

/// The device's mapping granularity: the chunk size of an arena.
pub(crate) fn granularity(stream: &CudaStream) -> Result<usize, DriverError> {
    stream.context().bind_to_thread()?;
    let prop = allocation_prop(stream);
    let mut bytes = 0usize;
    // SAFETY: `prop` and `bytes` outlive the call.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut bytes,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
        .result()?;
    }
    Ok(bytes)
}

/// A reserved virtual range, chunk by chunk: the handle backing each
/// chunk, if any.
struct VirtualRange {
    base: CUdeviceptr,
    backing: Vec<Option<CUmemGenericAllocationHandle>>,
}

/// Physical chunks and the virtual ranges they back.
pub(crate) struct Vmm {
    stream: Arc<CudaStream>,
    chunk: usize,
    /// Chunks backing nothing.
    free: Vec<CUmemGenericAllocationHandle>,
    ranges: Vec<VirtualRange>,
}

impl Vmm {
    /// `chunks` physical chunks of `chunk` bytes (the granularity) on
    /// `stream`'s device, and no range yet.
    pub fn new(stream: Arc<CudaStream>, chunk: usize, chunks: usize) -> Result<Vmm, DriverError> {
        stream.context().bind_to_thread()?;
        let prop = allocation_prop(&stream);
        // Released by `drop` if a later chunk fails.
        let mut vmm = Vmm {
            stream,
            chunk,
            free: Vec::with_capacity(chunks),
            ranges: Vec::new(),
        };
        for _ in 0..chunks {
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` and `prop` outlive the call.
            unsafe { sys::cuMemCreate(&mut handle, chunk, &prop, 0).result()? };
            vmm.free.push(handle);
        }
        Ok(vmm)
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    /// Reserves a range of `chunks` chunks, none backed; returns its index
    /// and address.
    pub fn reserve(&mut self, chunks: usize) -> Result<(usize, CUdeviceptr), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut base: CUdeviceptr = 0;
        // SAFETY: `base` outlives the call.
        unsafe {
            sys::cuMemAddressReserve(&mut base, chunks.max(1) * self.chunk, self.chunk, 0, 0)
                .result()?;
        }
        self.ranges.push(VirtualRange {
            base,
            backing: vec![None; chunks],
        });
        Ok((self.ranges.len() - 1, base))
    }

    /// Backs chunks `chunks` of range `range` with free chunks, readable and
    /// writable from the device. All or nothing: an error leaves them
    /// unbacked.
    pub fn map(&mut self, range: usize, chunks: Range<usize>) -> Result<(), RunError> {
        let r = &self.ranges[range];
        if chunks.end > r.backing.len() || r.backing[chunks.clone()].iter().any(Option::is_some) {
            return Err(RunError::InvalidInput(format!(
                "chunks {chunks:?} of a range of {}: beyond it or already backed",
                r.backing.len()
            )));
        }
        if chunks.len() > self.free.len() {
            return Err(RunError::InvalidInput(format!(
                "{} chunks wanted, {} free in the pool",
                chunks.len(),
                self.free.len()
            )));
        }
        self.stream.context().bind_to_thread()?;
        let mut done = chunks.start;
        let mapped = (|| {
            for c in chunks.clone() {
                let handle = *self.free.last().expect("counted above");
                let at = self.ranges[range].base + (c * self.chunk) as u64;
                // SAFETY: `at` is a reserved, unbacked chunk of this range.
                unsafe { sys::cuMemMap(at, self.chunk, 0, handle, 0).result()? };
                self.free.pop();
                self.ranges[range].backing[c] = Some(handle);
                done = c + 1;
            }
            let access = sys::CUmemAccessDesc {
                location: location(&self.stream),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            let at = self.ranges[range].base + (chunks.start * self.chunk) as u64;
            // SAFETY: the chunks were all mapped above; `access` outlives the call.
            unsafe { sys::cuMemSetAccess(at, chunks.len() * self.chunk, &access, 1).result() }
        })();
        if let Err(e) = mapped {
            self.unmap(range, chunks.start..done)?;
            return Err(e.into());
        }
        Ok(())
    }

    /// Returns chunks `chunks` of range `range` to the pool (those backed).
    /// The caller has waited for every use of them.
    pub fn unmap(&mut self, range: usize, chunks: Range<usize>) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        for c in chunks {
            let Some(handle) = self.ranges[range].backing[c] else {
                continue;
            };
            let at = self.ranges[range].base + (c * self.chunk) as u64;
            // SAFETY: `at` is backed by `handle` (one whole mapping).
            unsafe { sys::cuMemUnmap(at, self.chunk).result()? };
            self.ranges[range].backing[c] = None;
            self.free.push(handle);
        }
        Ok(())
    }
}

impl Drop for Vmm {
    /// Waits for the stream, then unmaps, releases and frees everything
    /// (the caller has dropped or leaked every slice over the ranges).
    fn drop(&mut self) {
        let ctx = self.stream.context().clone();
        ctx.record_err(ctx.bind_to_thread());
        ctx.record_err(self.stream.synchronize());
        for r in std::mem::take(&mut self.ranges) {
            for (c, handle) in r.backing.iter().enumerate() {
                if let Some(handle) = *handle {
                    let at = r.base + (c * self.chunk) as u64;
                    // SAFETY: backed by `handle`; nothing uses it any more.
                    ctx.record_err(unsafe { sys::cuMemUnmap(at, self.chunk).result() });
                    self.free.push(handle);
                }
            }
            let bytes = r.backing.len().max(1) * self.chunk;
            // SAFETY: reserved by `reserve` with this size, now unbacked.
            ctx.record_err(unsafe { sys::cuMemAddressFree(r.base, bytes).result() });
        }
        for handle in self.free.drain(..) {
            // SAFETY: created by `new`, backing nothing.
            ctx.record_err(unsafe { sys::cuMemRelease(handle).result() });
        }
    }
}
