/* stage.h: an async save's host copies. Each held piece that a fragment of the save reads is
 * copied once, at the save, into one host buffer per device kind (pinned for a device:
 * fsdp_host_alloc; one allocation per save, as pinned allocations are slow), so the caller waits
 * only for the device-to-host copies; the writer thread later cuts each fragment's values out of
 * its piece. Internal to src/ckpt. */
#ifndef FSDP_CKPT_STAGE_H
#define FSDP_CKPT_STAGE_H

#include "ckpt/state_impl.h"

typedef struct ckpt_stage ckpt_stage;

/* Pieces start at multiples of this many bytes in their buffer. */
#define CKPT_STAGE_ALIGN 64

/* An empty staging area for the entries of st (owned by the caller: ckpt_stage_free). */
fsdp_status ckpt_stage_create(fsdp_ctx *ctx, const fsdp_state *st, ckpt_stage **out);
/* Marks piece k of entry i as read by a fragment (marking twice is marking once). */
void ckpt_stage_mark(ckpt_stage *sg, int i, int k);
/* Allocates the buffers and copies every marked piece of st into them. */
fsdp_status ckpt_stage_copy(fsdp_ctx *ctx, ckpt_stage *sg, const fsdp_state *st);
/* The values of box (inside staged piece k of entry i): in the staged piece when box is the
 * whole piece (*owned NULL), else a malloc'ed copy in *owned. Reads no state: safe on the
 * writer thread while the model trains on. */
fsdp_status ckpt_stage_values(fsdp_ctx *ctx, const ckpt_stage *sg, int i, int k, const region *box,
                              const void **data, void **owned);
/* Releases the buffers; NULL does nothing. */
void ckpt_stage_free(ckpt_stage *sg);

#endif
