//! Allowed-token bitmasks for the device sampler (structured outputs): the
//! layout [`crate::DeviceSampler::sample`] reads ([`TokenMasks`]) and a
//! staged upload of host rows into it ([`MaskUpload`]).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, PinnedHostSlice};

use crate::shared::error::{invalid, During, GdnError, Op};

const OP: Op = Op::SampleRows;

/// Words of one mask row covering `vocab` tokens.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Allowed-token bitmasks on the device: `[rows, words_per_row]` u32, bit
/// `t % 32` of word `t / 32` of a row set when token `t` may be sampled. A
/// [`crate::RowSampling`] names its row (`mask_row`); `words_per_row`
/// covers the vocabulary (bits beyond it are not read).
#[derive(Debug)]
pub struct TokenMasks<'a> {
    pub words: CudaView<'a, u32>,
    pub words_per_row: usize,
}

impl TokenMasks<'_> {
    /// The number of mask rows, after checking the layout against `vocab`.
    pub(crate) fn rows(&self, vocab: usize) -> Result<usize, GdnError> {
        let (len, w) = (self.words.len(), self.words_per_row);
        if w == 0 || w < mask_words(vocab) {
            return Err(invalid(
                OP,
                "masks",
                format!(
                    "{w} words per row do not cover vocab {vocab} ({} needed)",
                    mask_words(vocab)
                ),
            ));
        }
        if len % w != 0 {
            return Err(invalid(
                OP,
                "masks",
                format!("{len} words are not rows of {w} words"),
            ));
        }
        Ok(len / w)
    }
}

/// Rows of allowed-token words copied to the device through pinned memory
/// (an asynchronous copy that the step's later work queues behind), into
/// buffers that grow as needed and are reused step after step.
#[derive(Default)]
pub struct MaskUpload {
    pinned: Option<PinnedHostSlice<u32>>,
    device: Option<CudaSlice<u32>>,
    /// Recorded after the last copy out of `pinned`: the host waits on it
    /// before writing `pinned` again.
    copied: Option<CudaEvent>,
}

impl MaskUpload {
    pub fn new() -> Self {
        Self::default()
    }

    /// Copies `rows` (each the words of one row, bit `t % 32` of word
    /// `t / 32` for token `t`) to the device as [`TokenMasks`] over
    /// `vocab` tokens, on `stream`: row `i` becomes mask row `i`. A row
    /// shorter than the vocabulary disallows the tokens beyond it; words
    /// beyond the vocabulary's are not copied.
    pub fn upload<'s>(
        &'s mut self,
        stream: &Arc<CudaStream>,
        vocab: usize,
        rows: &[&[u32]],
    ) -> Result<TokenMasks<'s>, GdnError> {
        let w = mask_words(vocab);
        if w == 0 {
            return Err(invalid(OP, "vocab", "0 tokens: nothing to mask"));
        }
        let total = rows.len().max(1) * w;
        // Room for a power of two of rows: a few sizes over a server's life.
        let room = rows.len().max(1).next_power_of_two() * w;
        if let Some(copied) = &self.copied {
            // The previous copy out of `pinned` may still be in flight.
            copied.synchronize().during(OP)?;
        }
        if self.pinned.as_ref().is_none_or(|p| p.len() < total) {
            // SAFETY: the words below are written before the copy reads them.
            self.pinned = Some(unsafe {
                stream
                    .context()
                    .alloc_pinned_with_flags::<u32>(room, 0)
                    .during(OP)?
            });
        }
        if self.device.as_ref().is_none_or(|d| d.len() < total) {
            // SAFETY: written by the copy below before the kernel reads it.
            self.device = Some(unsafe { stream.alloc::<u32>(room) }.during(OP)?);
        }
        let pinned = self.pinned.as_mut().expect("allocated above");
        let host = &mut pinned.as_mut_slice().during(OP)?[..total];
        host[rows.len() * w..].fill(0);
        for (dst, src) in host.chunks_exact_mut(w).zip(rows) {
            let n = src.len().min(w);
            dst[..n].copy_from_slice(&src[..n]);
            dst[n..].fill(0);
        }
        let device = self.device.as_mut().expect("allocated above");
        // Exactly `total` words (cudarc copies the source's whole length):
        // through a plain slice of pinned memory the copy is asynchronous,
        // so the event recorded after it guards the next write of `pinned`.
        stream
            .memcpy_htod(&*host, &mut device.slice_mut(..total))
            .during(OP)?;
        if self.copied.is_none() {
            self.copied = Some(stream.context().new_event(None).during(OP)?);
        }
        self.copied
            .as_ref()
            .expect("created above")
            .record(stream)
            .during(OP)?;
        Ok(TokenMasks {
            words: self
                .device
                .as_ref()
                .expect("allocated above")
                .slice(..total),
            words_per_row: w,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_row_covers_the_vocabulary_in_words_of_32() {
        assert_eq!(mask_words(1), 1);
        assert_eq!(mask_words(32), 1);
        assert_eq!(mask_words(33), 2);
        assert_eq!(mask_words(248_320), 7_760);
    }
}
