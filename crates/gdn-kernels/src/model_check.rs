//! [`ModelOps::check_model`]: every family's shape checks for one model,
//! run once when it is loaded. It alone names several families, so it sits
//! above them rather than in the shared context.

use crate::attention::shape::{prefill_attention_smem, AttentionShape};
use crate::deltanet::shape::DeltaNetShape;
use crate::model_ops::{ModelOps, MAX_STATIC_SHARED};
use crate::shared::error::{invalid, During, GdnError, Op};

impl ModelOps {
    /// Everything about a model's shapes the ops would otherwise only refuse
    /// mid-step (after earlier layers changed state): the DeltaNet and
    /// attention shapes, the norm width, and the prefill attention's shared
    /// memory against this GPU's opt-in limit.
    pub fn check_model(
        &self,
        hidden: usize,
        deltanet: DeltaNetShape,
        attention: AttentionShape,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::CheckModel;
        deltanet.check()?;
        attention.check()?;
        if hidden == 0 || hidden * 4 > MAX_STATIC_SHARED {
            return Err(invalid(
                OP,
                "hidden",
                format!("size {hidden} outside 1..=12288"),
            ));
        }
        let need = prefill_attention_smem(attention);
        let have = self.stream.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        ).during(OP)? as usize;
        if need > have {
            return Err(invalid(
                OP,
                "attention",
                format!(
                    "prefill attention needs {need} bytes of shared memory per block (head dim {}, GQA group {}); this GPU allows {have}",
                    attention.head_dim,
                    attention.q_heads / attention.kv_heads
                ),
            ));
        }
        Ok(())
    }
}
