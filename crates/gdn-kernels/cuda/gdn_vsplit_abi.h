/* C ABI of the value-split FlashInfer SM90 GDN prefill (patches/0001): the
 * same kernel as gdn_prefill_sm90 with GDN_VSPLIT_COUNT CTAs per (sequence,
 * value head), each owning 128 / GDN_VSPLIT_COUNT value columns of v, the
 * output and the state. Same argument struct, tensor contract and workspace
 * (gdn_prefill_sm90_workspace_bytes) as gdn_abi.h; any Hv = r * Hqk, r >= 1.
 * Built by the flashinfer_sm90_gva_vsplit unit; not yet run on a GPU.
 */
#ifndef GDN_VSPLIT_ABI_H
#define GDN_VSPLIT_ABI_H

#include "gdn_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_VSPLIT_COUNT 2

/* Enqueues one prefill on args->stream. Returns a gdn_status. */
int32_t gdn_prefill_sm90_vsplit(const gdn_prefill_args* args);

/* Detail of the last failure of gdn_prefill_sm90_vsplit on this thread. */
const char* gdn_vsplit_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GDN_VSPLIT_ABI_H */
