/* train_estimate.c: fsdp-train --plan's figures. The kind lists its parameters by FSDP unit, its
 * activations and its collectives on tp for one rank (train_kind.estimate); this file lays the
 * units out as src/dp/units.c flattens them, replays one optimizer step's gathers, gradient
 * bindings and reductions through a copy of the caching pool's rule (src/dp/pool.c: best fit
 * among the free blocks of the dtype, a new block of exactly the size otherwise, no splitting)
 * and counts the collectives as comm-debug does; under [parallel] mode = replicate it lays out
 * the gradient buckets as replicate.c does. Printing is in train_estimate_print.c. */
#include "train_estimate.h"

#include <fnmatch.h> // defines: fnmatch
#include <math.h>    // defines: ceil
#include <stdlib.h>
#include <string.h>

#include "train_kind.h" // defines: train_kind_of

bool train_est_param_add(train_est_model *m, int unit, int64_t numel, bool tp_sharded) {
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 64;
        train_est_param *p = realloc(m->params, (size_t)cap * sizeof *p);
        if (!p) return false;
        m->params = p, m->cap_params = cap;
    }
    m->params[m->n_params++] = (train_est_param){unit, numel, tp_sharded};
    if (unit + 1 > m->n_units) m->n_units = unit + 1;
    return true;
}

void train_est_comm_add(train_est_model *m, bool recompute, fsdp_comm_op op, fsdp_comm_phase phase,
                        int64_t calls, int64_t bytes) {
    train_est_comm *list = recompute ? m->tp_ckpt : m->tp;
    int *n = recompute ? &m->n_tp_ckpt : &m->n_tp;
    int i = 0;
    while (i < *n && (list[i].op != op || list[i].phase != phase)) i++;
    if (i == *n) {
        if (*n == TRAIN_EST_MAX_COMM) return; /* not reached: kinds list a few ops */
        list[(*n)++] = (train_est_comm){op, phase, 0, 0};
    }
    list[i].calls += calls;
    list[i].bytes += bytes;
}

void train_est_model_free(train_est_model *m) {
    free(m->params);
    m->params = NULL;
    m->n_params = m->cap_params = 0;
}

bool train_est_checkpointed(const train_config *cfg, const char *name, bool all) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    if (n <= 0) return all;
    for (int i = 0; i < n; i++)
        if (fnmatch(patterns[i], name, 0) == 0) return true;
    return false;
}

/* ---- the caching pool, block by block ---------------------------------------------------------
 */

typedef struct sim_block {
    int64_t numel;
    fsdp_dtype dtype;
    bool in_use;
} sim_block;

typedef struct sim_pool {
    sim_block *blocks;
    int n, cap;
    int64_t reserved, peak;
    bool oom;
} sim_pool;

static int dtype_bytes(fsdp_dtype d) {
    return d == FSDP_DTYPE_F32 ? 4 : 2;
}

/* The block a tensor of n elements of dtype is bound to (fsdp_pool_take), or -1. */
static int pool_take(sim_pool *p, int64_t n, fsdp_dtype dtype) {
    int best = -1;
    for (int i = 0; i < p->n; i++) {
        sim_block *b = &p->blocks[i];
        if (!b->in_use && b->dtype == dtype && b->numel >= n &&
            (best < 0 || b->numel < p->blocks[best].numel))
            best = i;
    }
    if (best < 0) {
        if (p->n == p->cap) {
            int cap = p->cap ? 2 * p->cap : 16;
            sim_block *b = realloc(p->blocks, (size_t)cap * sizeof *b);
            if (!b) {
                p->oom = true;
                return -1;
            }
            p->blocks = b, p->cap = cap;
        }
        best = p->n++;
        p->blocks[best] = (sim_block){n > 0 ? n : 1, dtype, false};
        p->reserved += p->blocks[best].numel * dtype_bytes(dtype);
        if (p->reserved > p->peak) p->peak = p->reserved;
    }
    p->blocks[best].in_use = true;
    return best;
}

static void pool_give(sim_pool *p, int *block) {
    if (*block >= 0) p->blocks[*block].in_use = false;
    *block = -1;
}

/* ---- FSDP's units over one step ---------------------------------------------------------------
 */

typedef struct sim_unit {
    int64_t numel, shard, padded; /* N, S = ceil(N / W) when sharded, W * S */
    int full, grad;               /* pool blocks, -1 when none */
    bool gathered, grads_bound;
} sim_unit;

/* What the step replays against. */
typedef struct sim_fsdp {
    const train_config *cfg;
    sim_unit *units;
    int n_units;
    bool sharded, resident, shared, fused, reshard_after_forward, replicated;
    int group_size;            /* W: the ranks FSDP shards over */
    fsdp_dtype pdtype, gdtype; /* what parameters are gathered in, gradients reduced in */
    int pesize, gesize;        /* their bytes */
    const char *dim;           /* the group FSDP shards over: "dp", or "shard" for hybrid_shard */
    sim_pool pool;
    train_est_rank *r; /* where the collectives are counted */
} sim_fsdp;

static void count(train_est_rank *r, fsdp_comm_op op, const char *dim, int64_t calls,
                  int64_t bytes) {
    int i = 0;
    while (i < r->n_comm && (r->comm[i].op != op || strcmp(r->comm[i].dim, dim) != 0)) i++;
    if (i == r->n_comm) {
        if (r->n_comm == TRAIN_EST_MAX_STEP_COMM) return; /* not reached: a few ops and dims */
        r->comm[r->n_comm] = (train_est_step_comm){.op = op};
        snprintf(r->comm[r->n_comm].dim, sizeof r->comm[0].dim, "%s", dim);
        r->n_comm++;
    }
    r->comm[i].calls += calls;
    r->comm[i].bytes += bytes;
}

/* hooks.c's gather_params: into the group's shared block (rank threads, f32), or a pool block
 * (in param_dtype through a low-precision block first); one all_gather when sharded. */
static void unshard(sim_fsdp *s, sim_unit *u) {
    if (s->resident || u->gathered) return;
    u->gathered = true;
    if (u->numel == 0) return;
    if (s->sharded) count(s->r, FSDP_COMM_ALL_GATHER, s->dim, 1, u->padded * s->pesize);
    if (s->shared && s->pdtype == FSDP_DTYPE_F32) return;
    u->full = pool_take(&s->pool, u->padded, FSDP_DTYPE_F32);
    if (s->pdtype != FSDP_DTYPE_F32) {
        int low = pool_take(&s->pool, u->padded, s->pdtype);
        pool_give(&s->pool, &low);
    }
}

static void reshard(sim_fsdp *s, sim_unit *u) {
    if (s->resident || !u->gathered) return;
    u->gathered = false;
    pool_give(&s->pool, &u->full);
}

static void pre_backward(sim_fsdp *s, sim_unit *u) {
    unshard(s, u);
    if (u->grads_bound || u->numel == 0) return;
    u->grads_bound = true;
    u->grad = pool_take(&s->pool, u->padded, FSDP_DTYPE_F32);
}

/* hooks.c's post-backward and reduce_grad: under no_sync the gradient stays bound; else the
 * fused reduce_scatter, or the comm hook's passes through pool blocks; then reshard. */
static void post_backward(sim_fsdp *s, sim_unit *u, bool sync) {
    if (!sync) {
        if (s->reshard_after_forward) reshard(s, u);
        return;
    }
    if (u->numel > 0) {
        int reduced = -1, low_grad = -1, low_reduced = -1;
        bool low = s->gdtype != FSDP_DTYPE_F32;
        if (!s->fused) {
            if (s->sharded) reduced = pool_take(&s->pool, u->shard, FSDP_DTYPE_F32);
            if (low) low_grad = pool_take(&s->pool, u->padded, s->gdtype);
            if (low && s->sharded) low_reduced = pool_take(&s->pool, u->shard, s->gdtype);
        }
        if (s->sharded)
            count(s->r, FSDP_COMM_REDUCE_SCATTER, s->dim, 1, u->padded * s->gesize);
        else if (s->group_size > 1)
            count(s->r, FSDP_COMM_ALL_REDUCE, s->dim, 1, u->padded * s->gesize);
        if (s->replicated)
            count(s->r, FSDP_COMM_ALL_REDUCE, "replicate", 1,
                  (s->sharded ? u->shard : u->padded) * s->gesize);
        pool_give(&s->pool, &low_reduced);
        pool_give(&s->pool, &low_grad);
        pool_give(&s->pool, &reduced);
    }
    u->grads_bound = false;
    pool_give(&s->pool, &u->grad);
    reshard(s, u);
}

/* One step of grad_accum micro-batches as trainer.c runs it: forward through the units in order
 * (the root first), then backward: the root's pre-backward, the nested units in reverse, the
 * root's post-backward; only the last micro-batch reduces. */
static void replay_step(sim_fsdp *s, int64_t n_micro) {
    for (int64_t m = 0; m < n_micro; m++) {
        bool sync = m == n_micro - 1;
        for (int i = 0; i < s->n_units; i++) {
            unshard(s, &s->units[i]);
            if (i > 0 && s->reshard_after_forward) reshard(s, &s->units[i]);
        }
        pre_backward(s, &s->units[0]);
        for (int i = s->n_units - 1; i > 0; i--) {
            pre_backward(s, &s->units[i]);
            post_backward(s, &s->units[i], sync);
        }
        post_backward(s, &s->units[0], sync);
    }
}

/* The dtype a gradient is reduced in (src/dp's fsdp_dp_hook_dtype): the hook's, else
 * reduce_dtype. */
static fsdp_dtype grad_dtype(const train_config *cfg) {
    if (cfg->parallel.comm_hook == FSDP_COMM_HOOK_BF16) return FSDP_DTYPE_BF16;
    if (cfg->parallel.comm_hook == FSDP_COMM_HOOK_FP16) return FSDP_DTYPE_F16;
    return train_config_mixed_precision(cfg).reduce_dtype;
}

/* Lays the units out as units.c flattens them: each parameter at the next free offset (aligned
 * to 4 elements with use_orig_params); and the optimizer's elements on this rank: the flat
 * shards, or with use_orig_params the parts of the parameters in the shard (gaps left out). */
static int64_t lay_out_units(sim_fsdp *s, const train_est_model *m, int shard_index) {
    int64_t align = s->cfg->parallel.use_orig_params ? 4 : 1;
    int64_t *offsets = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *offsets);
    if (!offsets) return -1;
    for (int i = 0; i < m->n_params; i++) {
        sim_unit *u = &s->units[m->params[i].unit];
        offsets[i] = (u->numel + align - 1) / align * align;
        u->numel = offsets[i] + m->params[i].numel;
    }
    int64_t W = s->group_size, optim = 0;
    for (int k = 0; k < s->n_units; k++) {
        sim_unit *u = &s->units[k];
        u->shard = s->sharded ? (u->numel + W - 1) / W : u->numel;
        u->padded = s->sharded ? u->shard * W : u->numel;
        u->full = u->grad = -1;
        if (!s->cfg->parallel.use_orig_params) optim += u->shard;
    }
    for (int i = 0; s->cfg->parallel.use_orig_params && i < m->n_params; i++) {
        const sim_unit *u = &s->units[m->params[i].unit];
        int64_t lo = s->sharded ? shard_index * u->shard : 0, hi = lo + u->shard;
        int64_t a = offsets[i] > lo ? offsets[i] : lo;
        int64_t b = offsets[i] + m->params[i].numel < hi ? offsets[i] + m->params[i].numel : hi;
        optim += b > a ? b - a : 0;
    }
    free(offsets);
    return optim;
}

/* The gradient-norm all_reduces of clipping (src/dp/norm.c): one per group, of a float per
 * distinct set of groups that contains it; parameters replicated over tp form one set ({dp}),
 * those sharded over tp another ({dp, tp}). */
static void count_clipping(const char *shard_dim, const train_est_model *m, train_est_rank *r) {
    bool rep = false, tp = false;
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].tp_sharded)
            tp = true;
        else
            rep = true;
    }
    if (shard_dim) count(r, FSDP_COMM_ALL_REDUCE, shard_dim, 1, 4 * (rep + tp));
    if (tp) count(r, FSDP_COMM_ALL_REDUCE, "tp", 1, 4);
}

/* What every mode adds to a step: the activations, the model's collectives on tp (and the
 * recompute's), the loss's all_reduce over dp, clipping's, the stop flag's over the world; the
 * total. shard_dim: the mesh dim FSDP shards over, NULL when it does not shard. */
static void count_step_extras(const train_config *c, const train_layout *l,
                              const train_est_model *m, train_est_rank *r, const char *shard_dim) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    bool ckpt = train_config_checkpoint_patterns(c, patterns) > 0;
    int64_t n = c->train.grad_accum;
    r->act_bytes = m->act_bytes;
    r->act_ckpt_bytes = m->act_ckpt_bytes;
    for (int i = 0; l->tp > 1 && i < m->n_tp; i++)
        count(r, m->tp[i].op, "tp", m->tp[i].calls * n, m->tp[i].bytes * n);
    for (int i = 0; l->tp > 1 && ckpt && i < m->n_tp_ckpt; i++)
        count(r, m->tp_ckpt[i].op, "tp", m->tp_ckpt[i].calls * n, m->tp_ckpt[i].bytes * n);
    if (l->dp > 1) count(r, FSDP_COMM_ALL_REDUCE, "dp", 1, 8); /* the batch loss and a 0 */
    if (c->optim.clip_grad_norm > 0) count_clipping(shard_dim, m, r);
    if (c->checkpoint.dir[0] && l->world > 1) count(r, FSDP_COMM_ALL_REDUCE, "world", 1, 4);
    r->total_bytes = r->device_bytes + (c->parallel.offload ? 0 : r->optim_bytes) +
                     (ckpt ? r->act_ckpt_bytes : r->act_bytes);
}

/* mode = replicate (src/dp/replicate.c): every rank holds its whole local parameters and
 * gradients; the trainable parameters, last registered first, form buckets as DDP does (the
 * first closes at 1 MiB, or at bucket_mb when set, the others at 25 MiB or bucket_mb), each
 * all_reduced over dp in the reduction's dtype. The buckets' buffers (replicate.c's setup): with
 * the default f32 reduction during backward the gradients live in one buffer of every bucket
 * (nothing beyond them), else one as large as the largest bucket; a bf16/fp16 reduction adds
 * one of that size in its dtype; bf16/f16 parameters an f32 copy of all, and f16 ones a
 * rounding buffer of the largest (bf16 rounds in place). Returns the optimizer's elements. */
static int64_t replicate_memory(const train_config *c, const train_layout *l,
                                const train_est_model *m, train_est_rank *r) {
    int64_t first = FSDP_REPLICATE_FIRST_BUCKET_BYTES, cap = FSDP_REPLICATE_DEFAULT_BUCKET_BYTES;
    if (c->parallel.bucket_mb > 0) first = cap = (int64_t)ceil(c->parallel.bucket_mb * 1024 * 1024);
    fsdp_mixed_precision mp = train_config_mixed_precision(c);
    fsdp_dtype g = grad_dtype(c);
    int64_t total = 0, largest = 0, fill = 0, grad_max = 0;
    int nb = 0;
    for (int i = m->n_params - 1; i >= 0; i--) {
        int64_t e = m->params[i].numel;
        total += e, fill += e;
        largest = e > largest ? e : largest;
        if (4 * fill < (nb == 0 ? first : cap) && i > 0) continue;
        grad_max = fill > grad_max ? fill : grad_max;
        if (l->dp > 1) count(r, FSDP_COMM_ALL_REDUCE, "dp", 1, fill * dtype_bytes(g));
        nb++, fill = 0;
    }
    bool apart = l->dp > 1 && c->parallel.comm_hook == FSDP_COMM_HOOK_DEFAULT &&
                 mp.reduce_dtype == FSDP_DTYPE_F32;
    r->param_bytes = r->grad_bytes = 4 * total;
    r->gathered_bytes = apart ? 0 : 4 * grad_max;
    if (g != FSDP_DTYPE_F32) r->gathered_bytes += dtype_bytes(g) * grad_max;
    if (mp.param_dtype != FSDP_DTYPE_F32 && m->n_params > 0)
        r->gathered_bytes += 4 * total + (mp.param_dtype == FSDP_DTYPE_F16 ? 2 * largest : 0);
    r->device_bytes = r->param_bytes + r->grad_bytes + r->gathered_bytes;
    return total;
}

static fsdp_status estimate_rank(const train_config *cfg, const train_kind *kind,
                                 const train_layout *l, int rank, int64_t micro, train_est_rank *r,
                                 const char **note, char *err, size_t err_size) {
    *r = (train_est_rank){.rank = rank, .dp_index = rank / l->tp, .tp_index = rank % l->tp};
    int64_t off, rows;
    fsdp_chunk_range(micro, l->dp, r->dp_index, &off, &rows);
    train_est_model m = {0};
    fsdp_status st = kind->estimate(cfg, l, r->tp_index, rows, &m, err, err_size);
    if (st != FSDP_OK) {
        train_est_model_free(&m);
        return st;
    }
    *note = m.activation_note;
    const train_config *c = cfg;
    int states = c->optim.name != TRAIN_OPTIM_SGD ? 2 : c->optim.momentum > 0 ? 1 : 0;
    if (c->parallel.mode == TRAIN_MODE_REPLICATE) {
        r->optim_bytes = 4 * states * replicate_memory(c, l, &m, r);
        count_step_extras(c, l, &m, r, NULL);
        train_est_model_free(&m);
        return FSDP_OK;
    }
    bool hybrid = c->parallel.strategy == FSDP_HYBRID_SHARD;
    fsdp_mixed_precision mp = train_config_mixed_precision(c);
    sim_fsdp s = {.cfg = c, .n_units = m.n_units > 0 ? m.n_units : 1, .r = r};
    s.group_size = hybrid ? l->shard : l->dp;
    s.dim = hybrid ? "shard" : "dp";
    s.sharded = c->parallel.strategy != FSDP_NO_SHARD && s.group_size > 1;
    s.replicated = hybrid && l->replicas > 1;
    s.pdtype = mp.param_dtype;
    s.gdtype = grad_dtype(c);
    s.pesize = dtype_bytes(s.pdtype);
    s.gesize = dtype_bytes(s.gdtype);
    s.resident = !s.sharded && !c->parallel.offload && mp.param_dtype == FSDP_DTYPE_F32;
    s.shared = l->backend == TRAIN_BACKEND_LOCAL && s.sharded && !c->parallel.offload;
    s.fused = s.sharded && !s.replicated && !c->parallel.offload &&
              c->parallel.comm_hook == FSDP_COMM_HOOK_DEFAULT && mp.reduce_dtype == FSDP_DTYPE_F32;
    s.reshard_after_forward = c->parallel.strategy == FSDP_FULL_SHARD || hybrid;
    s.units = calloc((size_t)s.n_units, sizeof *s.units);
    int64_t optim =
        s.units ? lay_out_units(&s, &m, hybrid ? r->dp_index % l->shard : r->dp_index) : -1;
    if (optim < 0) {
        free(s.units);
        train_est_model_free(&m);
        snprintf(err, err_size, "--plan: out of memory");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (int k = 0; k < s.n_units; k++) r->param_bytes += 4 * s.units[k].shard;
    r->grad_bytes = r->param_bytes;
    r->optim_bytes = 4 * states * optim;

    /* Two steps: the first finds the root gathered by the loss evaluation before training (and
     * fills the pool), the second is the steady state comm-debug's table shows. */
    train_est_rank scratch = {0};
    s.r = &scratch;
    replay_step(&s, c->train.grad_accum);
    s.r = r;
    replay_step(&s, c->train.grad_accum);
    bool oom = s.pool.oom;
    r->gathered_bytes = s.pool.peak;
    free(s.pool.blocks);
    free(s.units);
    r->device_bytes = r->gathered_bytes + (c->parallel.offload ? 0 : 2 * r->param_bytes);

    count_step_extras(c, l, &m, r, s.sharded ? s.dim : NULL);
    train_est_model_free(&m);
    if (!oom) return FSDP_OK;
    snprintf(err, err_size, "--plan: out of memory");
    return FSDP_ERR_OUT_OF_MEMORY;
}

/* The run's mfu basis (train_device_mfu) on a context of its own: the peak of the configured
 * device's first where this machine has one. */
static fsdp_status estimate_flops(const train_config *cfg, const train_kind *kind, train_mfu *mfu,
                                  char *err, size_t err_size) {
    fsdp_ctx *ctx = NULL;
    fsdp_status st = fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx);
    fsdp_device_type type = cfg->parallel.device;
    fsdp_device dev = fsdp_device_count(type) > 0 ? (fsdp_device){type, 0} : FSDP_CPU;
    if (st == FSDP_OK) st = train_device_mfu(ctx, cfg, kind, dev, mfu);
    if (st != FSDP_OK)
        snprintf(err, err_size, "--plan: counting the model's FLOPs: %s",
                 ctx ? fsdp_last_error(ctx) : "cannot make a context");
    fsdp_ctx_free(ctx);
    return st;
}

fsdp_status train_estimate_make(const train_config *cfg, int world, train_estimate *out, char *err,
                                size_t err_size) {
    memset(out, 0, sizeof *out);
    const train_kind *kind = train_kind_of(cfg);
    if (!kind->estimate) {
        snprintf(err, err_size, "--plan has no estimate for [model] kind = %s yet", kind->name);
        return FSDP_ERR_CONFIG;
    }
    if (world <= 0) world = train_config_world_size(cfg);
    if (world <= 0) {
        snprintf(err, err_size,
                 "--plan needs the world size, which under [parallel] backend = mpi with ranks = "
                 "0 is the MPI job's: set [parallel] ranks (e.g. --set parallel.ranks=8)");
        return FSDP_ERR_CONFIG;
    }
    fsdp_status st = train_layout_resolve(cfg, world, &out->layout, err, err_size);
    if (st != FSDP_OK) return st;
    out->micro = cfg->data.batch_size / cfg->train.grad_accum;
    out->ranks = calloc((size_t)world, sizeof *out->ranks);
    if (!out->ranks) {
        snprintf(err, err_size, "--plan: out of memory for %d ranks", world);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (int r = 0; r < world && st == FSDP_OK; r++)
        st = estimate_rank(cfg, kind, &out->layout, r, out->micro, &out->ranks[r],
                           &out->activation_note, err, err_size);
    if (st == FSDP_OK) st = estimate_flops(cfg, kind, &out->mfu, err, err_size);
    if (st != FSDP_OK) train_estimate_free(out);
    return st;
}

void train_estimate_free(train_estimate *e) {
    free(e->ranks);
    e->ranks = NULL;
}
