/* update.h: the fused update rules, as pure functions over arrays: one pass reads param,
 * grad and state once and writes them once (Adam also over many tensors in one call). The
 * per-parameter optimizers use them now; FSDP's flat shards (and host-offloaded shards) will call
 * the same functions. */
#ifndef FSDP_OPTIM_UPDATE_H
#define FSDP_OPTIM_UPDATE_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/optim.h"
#include "fsdp/tensor.h"     // defines: fsdp_device
#include "kernels/kernels.h" // defines: fsdp_adam_tensor

/* The arrays are memory of `device`; the step runs there (its kernel table's loop). */

/* SGD over n elements. buf is the momentum buffer (n floats) or NULL without momentum; on the
 * first step it takes the gradient as is. */
void fsdp_sgd_update(fsdp_device device, float *p, const float *g, float *buf, int64_t n,
                     const fsdp_sgd_options *o, bool first);

/* Adam or AdamW (decoupled) over n elements at step `step` (1 for the first update). m, v
 * (and vmax with amsgrad, else NULL) hold n floats each. o has its defaults filled in. */
void fsdp_adam_update(fsdp_device device, float *p, const float *g, float *m, float *v, float *vmax,
                      int64_t n, const fsdp_adam_options *o, bool decoupled, int64_t step);
/* The same step, and in the same pass p_bf16 (n, on `device`) = the updated p rounded to bf16
 * (fsdp_bf16_from_f32's bits): FSDP's bf16 copy of a flat shard. p and the state get
 * fsdp_adam_update's bits. */
void fsdp_adam_update_bf16(fsdp_device device, float *p, fsdp_bf16 *p_bf16, const float *g,
                           float *m, float *v, float *vmax, int64_t n, const fsdp_adam_options *o,
                           bool decoupled, int64_t step);
/* The same step over count tensors of `device` (t a host array; a tensor with p_bf16 set also
 * gets its bf16 copy): one call of the table's adam_update_multi (one launch per chunk on a
 * GPU), each tensor the bits fsdp_adam_update (or _bf16) gives it alone; the per-tensor entries
 * where the table has no multi-tensor entry. */
void fsdp_adam_update_multi(fsdp_device device, const fsdp_adam_tensor *t, int count,
                            const fsdp_adam_options *o, bool decoupled, int64_t step);

/* Tests only: on, fsdp_optimizer_step updates Adam/AdamW slot by slot and zero_grad fills
 * gradient by gradient (the per-tensor entries), the reference of the multi-tensor path. */
void fsdp_optimizer_test_per_tensor(bool on);

#endif
