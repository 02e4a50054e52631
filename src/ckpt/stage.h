/* stage.h: an async save's host copies. Each held piece that a fragment of the save reads is
 * copied once, at the save, into host memory of its tensor's device kind (pinned for a device:
 * fsdp_host_alloc), so the caller waits only for the device-to-host copies; the writer thread
 * later cuts each fragment's values out of its piece. Internal to src/ckpt. */
#ifndef FSDP_CKPT_STAGE_H
#define FSDP_CKPT_STAGE_H

#include "ckpt/state_impl.h"

typedef struct ckpt_stage ckpt_stage;

/* An empty staging area for the entries of st (owned by the caller: ckpt_stage_free). */
fsdp_status ckpt_stage_create(fsdp_ctx *ctx, const fsdp_state *st, ckpt_stage **out);
/* Copies piece k of entry i to the host, once (a second call does nothing). */
fsdp_status ckpt_stage_piece(fsdp_ctx *ctx, ckpt_stage *sg, const fsdp_state *st, int i, int k);
/* The values of box (inside staged piece k of entry i): in the staged piece when box is the
 * whole piece (*owned NULL), else a malloc'ed copy in *owned. Reads no state: safe on the
 * writer thread while the model trains on. */
fsdp_status ckpt_stage_values(fsdp_ctx *ctx, const ckpt_stage *sg, int i, int k, const region *box,
                              const void **data, void **owned);
/* Bytes staged so far. */
size_t ckpt_stage_bytes(const ckpt_stage *sg);
/* Releases every staged copy; NULL does nothing. */
void ckpt_stage_free(ckpt_stage *sg);

#endif
