/* llama_breakdown.h: where a Llama training step's time goes (bench_llama_gpu --breakdown).
 * Hooks on the model's modules and marks between the step's phases synchronise the device and
 * read the clock, so each part's forward and backward device time is measured; the report is
 * the median per part over the recorded steps, and "other" is the step's total less the parts. */
#ifndef FSDP_BENCH_LLAMA_BREAKDOWN_H
#define FSDP_BENCH_LLAMA_BREAKDOWN_H

#include "fsdp/fsdp.h"
#include "kernels/kernels.h" // defines: fsdp_launch_counts

/* The parts, in the order they are printed. Per decoder layer parts are summed over layers. */
typedef enum llama_bd_part {
    LLAMA_BD_EMBEDDING = 0, /* model.embed_tokens */
    LLAMA_BD_INPUT_NORM,    /* input_layernorm */
    LLAMA_BD_ATTN_PROJ,     /* self_attn.{q,k,v,o}_proj */
    LLAMA_BD_ATTN_CORE,     /* self_attn less its projections: RoPE, the attention kernel */
    LLAMA_BD_POST_NORM,     /* post_attention_layernorm */
    LLAMA_BD_MLP_PROJ,      /* mlp.{gate,up,down}_proj */
    LLAMA_BD_MLP_REST,      /* mlp less its projections: the SwiGLU */
    LLAMA_BD_RESIDUAL,      /* the decoder layer less its four children: the residual adds */
    LLAMA_BD_FINAL_NORM,    /* model.norm */
    LLAMA_BD_LM_HEAD,       /* lm_head */
    LLAMA_BD_LOSS,          /* the cross-entropy: loss and its gradient in one call */
    LLAMA_BD_OPTIMIZER,     /* the optimizer step */
    LLAMA_BD_OTHER,         /* the step's total less every part above */
    LLAMA_BD_PARTS
} llama_bd_part;

/* The moments of a step, in this order; each synchronises the device first. */
typedef enum llama_bd_mark {
    LLAMA_BD_START = 0,     /* before zero_grad */
    LLAMA_BD_FORWARD_DONE,  /* after the model's forward */
    LLAMA_BD_LOSS_DONE,     /* after the cross-entropy */
    LLAMA_BD_BACKWARD_DONE, /* after the model's backward */
    LLAMA_BD_END,           /* after the optimizer step: the step is recorded */
    LLAMA_BD_MARKS
} llama_bd_mark;

typedef struct llama_breakdown llama_breakdown;

/* The report: milliseconds per part (one-call parts, loss and optimizer, have their time in
 * fwd_ms and 0 in bwd_ms; other's fwd_ms is the forward phase less its parts, its bwd_ms the
 * rest), the median step, and the sum of the parts other than "other". */
typedef struct llama_bd_report {
    double fwd_ms[LLAMA_BD_PARTS], bwd_ms[LLAMA_BD_PARTS];
    double step_ms, parts_ms;
    double idle_sync_us; /* one device synchronize with nothing queued (median of 21) */
    int steps;
    /* The last recorded step's launches per part (forward, backward; loss and optimizer in
     * forward; other's left to llama_breakdown_print_counts), the launches of its forward
     * phase, and the synchronizes the breakdown made in it before its END mark. */
    int64_t launches[LLAMA_BD_PARTS][2];
    int64_t forward_launches, syncs;
} llama_bd_report;

/* Times an idle device synchronize, then hooks the timed modules of model (fsdp_model_llama's
 * tree, Hugging Face's names) to synchronise dev at each hook point, for up to max_steps steps.
 * *out is the caller's: free it with llama_breakdown_detach, which removes the hooks. A model
 * without one of the names is refused (FSDP_ERR_NOT_FOUND) with nothing left hooked. */
fsdp_status llama_breakdown_attach(fsdp_ctx *ctx, fsdp_module *model, fsdp_device dev,
                                   int max_steps, llama_breakdown **out);
/* Synchronises the device and records the moment `mark` of the current step; the marks must
 * come in order, LLAMA_BD_END closes the step. bd NULL does nothing (an ordinary step). */
fsdp_status llama_breakdown_mark(fsdp_ctx *ctx, llama_breakdown *bd, llama_bd_mark mark);
/* The report of the steps recorded so far (none: every figure 0). */
void llama_breakdown_report(const llama_breakdown *bd, llama_bd_report *out);
/* Prints the report of one shape and mode, one line per part then the total (bench/README.md):
 *   breakdown libfsdp SHAPE MODE PART fwd_ms X bwd_ms Y share Z
 *   breakdown libfsdp SHAPE MODE total step_ms X parts_ms Y timed_step_ms Z steps N
 *     idle_sync_us S loss L
 * share: the part's fwd + bwd over the median step; loss: the last recorded step's, to 9
 * significant digits (a float's round trip, so runs compare bitwise). */
void llama_breakdown_print(const llama_bd_report *r, const char *shape, const char *mode,
                           double timed_step_ms, float loss);
/* Prints the last recorded step's launches per part, "other" the step's (`step`: its launches
 * and host waits, the breakdown's synchronizes included) less the parts, and the step's launches
 * and host waits less the breakdown's own synchronizes (bench/README.md):
 *   counts libfsdp SHAPE MODE PART launches_fwd X launches_bwd Y
 *   counts libfsdp SHAPE MODE breakdown_step launches N host_waits W */
void llama_breakdown_print_counts(const llama_bd_report *r, const char *shape, const char *mode,
                                  fsdp_launch_counts step);
/* "embedding", "attn_proj", ... (NULL out of range). */
const char *llama_breakdown_part_name(int part);
/* Removes every hook and frees bd; NULL does nothing. Returns the first removal's failure. */
fsdp_status llama_breakdown_detach(fsdp_ctx *ctx, llama_breakdown *bd);

#endif
