//! Our cubins in the bundle (`gdn_portable`, `model_kernels`, `sampling`,
//! `skinny_linear`), embedded at build time: which one a GPU loads.

use crate::bundle_embed::CUBINS;
use crate::shared::error::Ineligible;

/// The cubin of one of our units for a GPU: the newest one of the same major
/// version not newer than the GPU (cubins run on later minors of their
/// major). No PTX is shipped, so an architecture without a cubin is refused,
/// not JIT-compiled.
/// The refusal names the unit as the backend.
pub(crate) fn cubin_for(
    unit: &'static str,
    compute_capability: (i32, i32),
) -> Result<(u32, &'static [u8]), Ineligible> {
    let (major, minor) = (compute_capability.0 as u32, compute_capability.1 as u32);
    let of_unit = || CUBINS.iter().filter(move |(u, _, _)| *u == unit);
    of_unit()
        .filter(|(_, sm, _)| sm / 10 == major && sm % 10 <= minor)
        .max_by_key(|(_, sm, _)| *sm)
        .map(|(_, sm, bytes)| (*sm, *bytes))
        .ok_or_else(|| {
            let have: Vec<String> = of_unit().map(|(_, sm, _)| format!("sm_{sm}")).collect();
            Ineligible::new(
                unit,
                format!(
                    "no {unit} cubin for sm_{major}{minor} (the bundle has {}); PTX JIT is not used",
                    have.join(", ")
                ),
            )
        })
}
