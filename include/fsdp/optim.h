/* optim.h: optimizers over a module's parameters: SGD, Adam and AdamW with PyTorch's update
 * equations, each a single pass over every parameter that reads and writes each value once. */
#ifndef FSDP_OPTIM_H
#define FSDP_OPTIM_H

#include "fsdp/module.h"
#include "fsdp/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_optimizer fsdp_optimizer;

/* ---- per-parameter options (PyTorch's param_groups) ---- */

/* A hyperparameter that a group may override: set false (the zero value) keeps the
 * optimizer's own option, so an override of 0 (weight_decay = 0 for biases) is unambiguous. */
typedef struct fsdp_override {
    bool set;
    double value;
} fsdp_override;
/* In an initialiser: .weight_decay = FSDP_OVERRIDE(0.0). */
#define FSDP_OVERRIDE(v)                                                                           \
    { .set = true, .value = (v) }

/* Options for the parameters whose fully qualified name ("net1.bias", "layers.0.norm.weight")
 * matches `pattern`, a POSIX fnmatch(3) pattern with no flags ('*' also matches '.', so
 * "*.bias" is every bias at any depth). A parameter takes the first group that matches it,
 * in array order; a parameter no group matches takes the optimizer's own options. Every group
 * must get at least one trainable parameter, or creation fails naming the pattern. A field
 * left unset keeps the optimizer's value; a set field must suit the optimizer (momentum and
 * dampening for SGD, beta1, beta2 and eps for Adam and AdamW) and lie in its range, where an
 * explicit 0 is allowed for lr (a frozen group), weight_decay, momentum, dampening and the
 * betas. Under FSDP, wrap with use_orig_params so the optimizer sees the original names. */
typedef struct fsdp_param_group {
    const char *pattern; /* required */
    fsdp_override lr;    /* the group's initial lr; set_lr scales it (fsdp_optimizer_set_lr) */
    fsdp_override weight_decay;
    fsdp_override momentum;  /* SGD; a group with momentum 0 keeps no momentum buffer */
    fsdp_override dampening; /* SGD */
    fsdp_override beta1;     /* Adam, AdamW */
    fsdp_override beta2;     /* Adam, AdamW */
    fsdp_override eps;       /* Adam, AdamW; > 0 */
} fsdp_param_group;

/* PyTorch's SGD: g += weight_decay*p; with momentum, buf = g on the first step, then
 * buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g. */
/* Hyperparameters are doubles, as PyTorch's are Python floats; each is rounded to f32 where
 * PyTorch rounds it. */
typedef struct fsdp_sgd_options {
    double lr;           /* required, > 0 */
    double momentum;     /* default 0 */
    double dampening;    /* default 0 */
    double weight_decay; /* default 0 */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 */
    bool maximize;       /* ascend instead of descend */
    /* Per-parameter overrides (see fsdp_param_group); read at creation only. */
    const fsdp_param_group *param_groups;
    int n_param_groups;
} fsdp_sgd_options;

/* An SGD optimizer over every parameter of m that requires a gradient. The caller owns
 * *out (release with fsdp_optimizer_free); m must outlive it. A model wrapped by
 * fsdp_fully_shard is refused (FSDP_ERR_STATE): FSDP steps its shards, so pass
 * fsdp_sharded_flat_params(sh). The same holds for Adam and AdamW. */
fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out);

/* PyTorch's Adam and AdamW, in the order of its single-tensor implementation:
 * g = maximize ? -g : g; Adam: g += weight_decay*p; AdamW: p *= 1 - lr*weight_decay;
 * m += (1-beta1)*(g - m); v = beta2*v + (1-beta2)*g*g; vmax = max(vmax, v) with amsgrad;
 * p += (-lr/(1-beta1^t)) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1-beta2^t) + eps).
 * Zero in beta1, beta2 or eps selects PyTorch's default (0.9, 0.999, 1e-8); a beta of
 * exactly 0 cannot be asked for, but 1e-30 computes the same in f32. */
typedef struct fsdp_adam_options {
    double lr;           /* required, > 0 */
    double beta1;        /* default 0.9, in [0, 1) */
    double beta2;        /* default 0.999, in [0, 1) */
    double eps;          /* default 1e-8 */
    double weight_decay; /* default 0 (Adam: L2 in the gradient; AdamW: decoupled) */
    bool amsgrad;        /* keep the running maximum of v */
    bool maximize;
    /* Per-parameter overrides (see fsdp_param_group); read at creation only. */
    const fsdp_param_group *param_groups;
    int n_param_groups;
} fsdp_adam_options;

fsdp_status fsdp_adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                             fsdp_optimizer **out);
fsdp_status fsdp_adamw_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                              fsdp_optimizer **out);
/* One update from the current gradients. */
fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt);
/* Steps taken so far. */
int64_t fsdp_optimizer_steps(const fsdp_optimizer *opt);
fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt);
/* Sets the learning rate of the optimizer's own options to lr and scales every group as
 * PyTorch's LR schedulers do: a group whose lr was overridden gets
 * group_initial_lr * (lr / initial_lr), where initial_lr is the options' lr at creation; a group
 * that kept the optimizer's lr gets lr exactly. */
void fsdp_optimizer_set_lr(fsdp_optimizer *opt, double lr);
/* The learning rate of the optimizer's own options (what set_lr set last). */
double fsdp_optimizer_lr(const fsdp_optimizer *opt);
/* The number of parameter groups given at creation (0 without). */
int fsdp_optimizer_num_groups(const fsdp_optimizer *opt);
/* The learning rate group `group` (0 .. num_groups - 1) uses now; FSDP_OPTIM_NO_GROUP gives the
 * optimizer's own (fsdp_optimizer_lr). NAN when group is out of range. */
double fsdp_optimizer_group_lr(const fsdp_optimizer *opt, int group);
#define FSDP_OPTIM_NO_GROUP (-1)
/* The group that a parameter of the optimizer (by fully qualified name) takes, or
 * FSDP_OPTIM_NO_GROUP when it takes the optimizer's own options. FSDP_ERR_INVALID_ARGUMENT
 * naming fqn when the optimizer has no such parameter. */
fsdp_status fsdp_optimizer_param_group(fsdp_ctx *ctx, const fsdp_optimizer *opt, const char *fqn,
                                       int *group);
void fsdp_optimizer_free(fsdp_optimizer *opt); /* NULL does nothing */

/* Clips the gradients of m's trainable parameters by their global norm, as PyTorch's
 * clip_grad_norm_: total = (sum |g|^p)^(1/p) over every element of every parameter's global
 * gradient (p = 2.0, or INFINITY for the max norm), then, when total > max_norm, every gradient
 * is scaled by max_norm / (total + 1e-6). *total_norm (may be NULL) receives the norm before
 * clipping. Distributed parameters count as their global tensors: for a TP parameter
 * (fsdp_param_dtensor_spec) the local sums are added up (max for inf) over the group of each
 * mesh dim where it is Shard, with one all_reduce per such group for the whole model, and a
 * Replicate dim counts once; data-parallel replicas (fsdp_replicate_apply) hold equal gradients
 * and count once. So every rank that holds part of the model must call it, and each gets the
 * single-rank model's norm (to f32 rounding: sums cross ranks in f32). */
fsdp_status fsdp_clip_grad_norm(fsdp_ctx *ctx, fsdp_module *m, double max_norm, double norm_type,
                                double *total_norm);

/* ---- optimizer state, by parameter (what a checkpoint saves and reloads) ---- */

typedef enum fsdp_optim_state_kind {
    FSDP_OPTIM_MOMENTUM_BUFFER = 0, /* SGD with momentum > 0 */
    FSDP_OPTIM_EXP_AVG,             /* Adam, AdamW: the first moment m */
    FSDP_OPTIM_EXP_AVG_SQ,          /* Adam, AdamW: the second moment v */
    FSDP_OPTIM_MAX_EXP_AVG_SQ,      /* Adam, AdamW with amsgrad: the running max of v */
    FSDP_OPTIM_STATE_KIND_COUNT
} fsdp_optim_state_kind;

/* PyTorch's state keys: "momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq". */
const char *fsdp_optim_state_kind_to_string(fsdp_optim_state_kind kind);

/* One state tensor of one parameter. Pointers are borrowed from the optimizer (name, value)
 * and the parameter (spec) and stay valid while both live. */
typedef struct fsdp_optim_state {
    const char *param_name; /* fully qualified from the model's root: "net1.weight" */
    fsdp_param *param;
    fsdp_optim_state_kind kind;
    /* The state of this rank's local block of the parameter, with the local data's shape.
     * Writable: a checkpoint loads into it. */
    fsdp_tensor *value;
    /* Where that block lies in the global parameter: fsdp_param_dtensor_spec(param) (mesh,
     * placements, global shape); NULL for a plain parameter, whose state is the whole tensor. */
    const fsdp_dtensor_spec *spec;
    int64_t step; /* updates taken (fsdp_optimizer_steps); PyTorch's "step" of Adam */
} fsdp_optim_state;

/* The number of state tensors: SGD 1 per trainable parameter whose momentum (its group's, or
 * the optimizer's) is > 0; Adam and AdamW 2 per trainable parameter (3 with amsgrad). */
int fsdp_optimizer_num_states(const fsdp_optimizer *opt);
/* State i, ordered by parameter (named_parameters() order) and then kind in the order of the
 * enum above. FSDP_ERR_INVALID_ARGUMENT when i is out of range. */
fsdp_status fsdp_optimizer_get_state(fsdp_ctx *ctx, const fsdp_optimizer *opt, int i,
                                     fsdp_optim_state *out);
/* Sets the step count, as loading a checkpoint does: the next update is step steps + 1 (Adam's
 * bias corrections), and SGD's momentum buffer is used as it is when steps > 0. */
void fsdp_optimizer_set_steps(fsdp_optimizer *opt, int64_t steps);

typedef enum fsdp_lr_schedule_kind {
    FSDP_LR_CONSTANT = 0,  /* base_lr throughout */
    FSDP_LR_LINEAR_WARMUP, /* base_lr * step / warmup_steps, then base_lr */
    FSDP_LR_COSINE         /* linear warmup, then cosine from base_lr to min_lr at total_steps */
} fsdp_lr_schedule_kind;

/* A learning-rate schedule; steps count from 0, and the lr of step s is used for update s. */
typedef struct fsdp_lr_schedule {
    fsdp_lr_schedule_kind kind;
    double base_lr;       /* the peak learning rate, > 0 */
    int64_t warmup_steps; /* default 0: no warmup */
    int64_t total_steps;  /* FSDP_LR_COSINE: the step where min_lr is reached (> warmup_steps) */
    double min_lr;        /* FSDP_LR_COSINE: the floor, in [0, base_lr]; default 0 */
} fsdp_lr_schedule;

/* Checks a schedule's fields; the message names the bad field. */
fsdp_status fsdp_lr_schedule_check(fsdp_ctx *ctx, const fsdp_lr_schedule *s);
/* The learning rate at `step` (>= 0) of a checked schedule. After total_steps the cosine
 * schedule stays at min_lr. */
double fsdp_lr_at(const fsdp_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
