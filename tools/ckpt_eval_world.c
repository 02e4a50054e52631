/* ckpt_eval_world.c: fsdp-ckpt eval's batches and their mean (shared by every layout), and the
 * evaluation on a world of ranks: each loads its part of the Llama from the checkpoint at the
 * mesh (dp, tp), tp with torchtitan's plan and loss parallel, the batches dealt over dp.
 * docs/checkpoint.md, "Using a trained Llama". */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_eval_world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_cli.h" // defines: EXIT_OK, EXIT_FAILED, EXIT_USAGE

/* Returns the status of x when it failed (its message is in ctx). */
#define EVAL_TRY(x)                                                                                \
    do {                                                                                           \
        fsdp_status eval_st_ = (x);                                                                \
        if (eval_st_ != FSDP_OK) return eval_st_;                                                  \
    } while (0)

fsdp_status ckpt_eval_batches(fsdp_ctx *ctx, fsdp_module *model, const ckpt_eval_data *d,
                              int64_t first, int64_t stride, float *losses) {
    int64_t B = d->B, T = d->T, nb = d->n_seq / d->B;
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    fsdp_tensor *x = NULL, *xd = NULL; /* the batch's ids on the host, and on the device */
    fsdp_device dev = fsdp_ctx_device(ctx);
    fsdp_status st = in && tg ? fsdp_tensor_from_blob(ctx, in, FSDP_DTYPE_I32, FSDP_CPU, 2,
                                                      (int64_t[]){B, T}, &x)
                              : fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY,
                                                   "out of memory for a batch of %lld x %lld",
                                                   (long long)B, (long long)T);
    if (st == FSDP_OK && dev.type != FSDP_DEVICE_CPU)
        st = fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_I32, dev, 2, (int64_t[]){B, T}, &xd);
    for (int64_t b = first; st == FSDP_OK && b < nb; b += stride) {
        for (int64_t r = 0; r < B; r++)
            for (int64_t t = 0; t < T; t++) {
                in[r * T + t] = d->ids[(b * B + r) * T + t];
                tg[r * T + t] = d->ids[(b * B + r) * T + t + 1];
            }
        const fsdp_tensor *logits;
        if (xd) st = fsdp_tensor_copy(ctx, xd, x);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, model, xd ? xd : x, &logits);
        /* Plain logits go to fsdp_loss_cross_entropy_ignore; a vocabulary-sharded DTensor's
         * (loss parallel) are reduced over tp, the same loss on every tp rank. */
        if (st == FSDP_OK)
            st = fsdp_loss_parallel_cross_entropy(ctx, logits, tg, FSDP_IGNORE_INDEX, &losses[b],
                                                  NULL);
    }
    fsdp_tensor_free(xd);
    fsdp_tensor_free(x);
    free(in);
    free(tg);
    return st;
}

fsdp_status ckpt_eval_to_device(fsdp_ctx *ctx, fsdp_device_type type, int rank,
                                fsdp_module *model) {
    if (type == FSDP_DEVICE_CPU) return FSDP_OK;
    int count = fsdp_device_count(type);
    fsdp_device dev = {type, count > 0 ? rank % count : 0};
    EVAL_TRY(fsdp_ctx_set_device(ctx, dev));
    return fsdp_module_to(ctx, model, dev);
}

double ckpt_eval_mean(const ckpt_eval_data *d, const float *losses) {
    double share = 0;
    for (int64_t b = 0; b < d->n_seq / d->B; b++)
        share += (double)losses[b] * (double)d->B / (double)d->n_seq;
    return share;
}

bool ckpt_under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE");
}

typedef struct eval_job {
    const ckpt_eval_layout *l;
    const ckpt_eval_data *d;
    float *losses; /* n_seq / B: rank 0's, after the gathering over dp */
} eval_job;

/* The Llama at this rank's place of the mesh, its parameters loaded from the checkpoint. */
static fsdp_status load_part(fsdp_ctx *ctx, const ckpt_eval_layout *l, const fsdp_mesh *mesh,
                             bool loss_parallel, fsdp_module **model) {
    EVAL_TRY(fsdp_model_llama(ctx, l->cfg, model));
    /* before TP, as fsdp-train moves it: the load then fills the device tensors */
    EVAL_TRY(ckpt_eval_to_device(ctx, l->device, fsdp_ctx_rank(ctx), *model));
    if (l->tp > 1) {
        fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
        int n = 0;
        fsdp_mesh *tp = NULL;
        EVAL_TRY(fsdp_llama_tp_plan(ctx, l->cfg, l->tp, loss_parallel, plan, &n));
        EVAL_TRY(fsdp_mesh_dim(ctx, mesh, "tp", &tp));
        fsdp_tp_options o = {.src_rank = FSDP_NO_SRC_RANK}; /* the load sets every value */
        EVAL_TRY(fsdp_tp_parallelize(ctx, *model, tp, n, plan, &o));
    }
    fsdp_ckpt *ck = NULL;
    fsdp_state *st = NULL;
    EVAL_TRY(fsdp_ckpt_open(ctx, l->ckpt, &ck));
    fsdp_status s = fsdp_state_create(ctx, &(fsdp_state_sources){.model = *model}, &st);
    for (int i = 0; s == FSDP_OK && i < fsdp_state_num_entries(st); i++) {
        fsdp_state_entry e;
        s = fsdp_state_entry_get(ctx, st, i, &e);
        if (s == FSDP_OK && fsdp_ckpt_find(ck, e.name) < 0)
            s = fsdp_ctx_set_error(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                   "'%s' has no tensor '%s', which the Llama of its model "
                                   "configuration has",
                                   l->arg, e.name);
    }
    fsdp_ckpt_load_options lo = {.non_strict = true}; /* optimizer state and extras ignored */
    if (s == FSDP_OK) s = fsdp_ckpt_load(ctx, ck, st, &lo);
    fsdp_state_free(st);
    fsdp_ckpt_close(ck);
    return s;
}

static fsdp_status eval_rank(fsdp_ctx *ctx, int rank, void *user) {
    eval_job *job = user;
    const ckpt_eval_layout *l = job->l;
    int world = fsdp_world_size(fsdp_ctx_world(ctx));
    int shape[2] = {world / l->tp, l->tp};
    const char *names[2] = {"dp", "tp"};
    int64_t nb = job->d->n_seq / job->d->B;
    fsdp_mesh *mesh = NULL;
    fsdp_module *model = NULL;
    fsdp_tensor *losses = NULL;
    fsdp_group *dp = NULL;
    fsdp_status s = fsdp_mesh_create(ctx, 2, shape, names, &mesh);
    if (s == FSDP_OK) s = load_part(ctx, l, mesh, true, &model);
    if (s == FSDP_OK) s = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &nb, &losses);
    if (s == FSDP_OK) s = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (s == FSDP_OK)
        s = ckpt_eval_batches(ctx, model, job->d, fsdp_mesh_coordinate(mesh, 0), shape[0],
                              fsdp_tensor_data(losses));
    /* Each batch's loss is on one dp rank, zeros elsewhere: the sum is that loss exactly. */
    if (s == FSDP_OK) s = fsdp_all_reduce(ctx, dp, losses, FSDP_REDUCE_SUM);
    if (s == FSDP_OK && rank == 0)
        memcpy(job->losses, fsdp_tensor_data(losses), (size_t)nb * sizeof(float));
    fsdp_tensor_free(losses);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    return s;
}

int ckpt_eval_world(fsdp_ctx *ctx, const ckpt_eval_layout *l, const ckpt_eval_data *d, double *loss,
                    bool *printer) {
    fsdp_world_options wo = {.backend = l->world ? FSDP_BACKEND_LOCAL : FSDP_BACKEND_MPI,
                             .nranks = l->world};
    fsdp_world *world = NULL;
    if (fsdp_world_create(ctx, &wo, &world) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt eval: cannot make the world of ranks: %s\n",
                fsdp_last_error(ctx));
        return EXIT_FAILED;
    }
    int size = fsdp_world_size(world), rc = EXIT_FAILED;
    eval_job job = {.l = l, .d = d, .losses = calloc((size_t)(d->n_seq / d->B), sizeof(float))};
    if (size % l->tp != 0) {
        fprintf(stderr,
                "fsdp-ckpt eval: --tp %d does not divide the %d ranks; give a --tp that divides "
                "them (dp = ranks / tp)\n",
                l->tp, size);
        rc = EXIT_USAGE;
    } else if (!job.losses) {
        fprintf(stderr, "fsdp-ckpt eval: out of memory\n");
    } else if (fsdp_world_run(ctx, world, eval_rank, &job) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt eval: on %d ranks (dp %d x tp %d): %s\n", size, size / l->tp,
                l->tp, fsdp_last_error(ctx));
    } else {
        *printer = fsdp_world_hosts_rank(world, 0);
        *loss = ckpt_eval_mean(d, job.losses);
        rc = EXIT_OK;
    }
    free(job.losses);
    fsdp_world_free(world);
    return rc;
}

/* ---- generate on a world ---- */

/* n rounded up to a multiple of k. */
static int64_t pad_to(int64_t n, int k) {
    return (n + k - 1) / k * k;
}

typedef struct gen_job {
    const ckpt_eval_layout *l;
    const int32_t *prompt;
    int64_t n, max_new;
    const fsdp_sample_options *so;
    bool (*emit)(void *user, int64_t i, int32_t tok);
    void *user;
} gen_job;

/* Every rank runs the full forward of the growing sequence and samples the same token from the
 * same gathered logits (the sampler depends on the logits, the seed and the step only); rank 0
 * hands it to emit. */
static fsdp_status gen_rank(fsdp_ctx *ctx, int rank, void *user) {
    gen_job *job = user;
    const ckpt_eval_layout *l = job->l;
    int world = fsdp_world_size(fsdp_ctx_world(ctx));
    int shape[2] = {world / l->tp, l->tp};
    const char *names[2] = {"dp", "tp"};
    int64_t V = l->cfg->vocab_size, total = pad_to(job->n + job->max_new, l->tp);
    int64_t padded = pad_to(job->n + job->max_new - 1, l->tp);
    int32_t *seq = calloc((size_t)total, sizeof *seq);
    fsdp_mesh *mesh = NULL;
    fsdp_module *model = NULL;
    /* on a device: the ids' copy there, and the host copy of the logits of a position */
    fsdp_tensor *xd = NULL, *row = NULL;
    fsdp_status s = seq ? fsdp_mesh_create(ctx, 2, shape, names, &mesh)
                        : fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == FSDP_OK) s = load_part(ctx, l, mesh, false, &model); /* logits gathered over tp */
    fsdp_device dev = fsdp_ctx_device(ctx);                       /* load_part set it */
    if (s == FSDP_OK && dev.type != FSDP_DEVICE_CPU) {
        s = fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_I32, dev, 2, (int64_t[]){1, padded}, &xd);
        if (s == FSDP_OK) s = fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &V, &row);
    }
    if (seq) memcpy(seq, job->prompt, (size_t)job->n * sizeof *seq);
    for (int64_t i = 0, len = job->n; s == FSDP_OK && i < job->max_new; i++, len++) {
        fsdp_tensor *x = NULL;
        const fsdp_tensor *logits = NULL;
        int32_t tok = 0;
        /* Sequence parallelism splits the sequence evenly over tp, and the TP buffers keep
         * their first shape: every forward is padded on the right with token 0 to the longest
         * one's length (a multiple of tp), which causal attention keeps from the earlier
         * positions; the logits of position len - 1 are read. */
        for (int64_t p = len; p < padded; p++) seq[p] = 0;
        s = fsdp_tensor_from_blob(ctx, seq, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){1, padded},
                                  &x);
        if (s == FSDP_OK && xd) s = fsdp_tensor_copy(ctx, xd, x);
        if (s == FSDP_OK) s = fsdp_module_forward(ctx, model, xd ? xd : x, &logits);
        const float *at = NULL; /* position len - 1's logits, on the host */
        if (s == FSDP_OK && row) {
            fsdp_tensor *last = NULL;
            s = fsdp_tensor_view(ctx, logits, (len - 1) * V, 1, &V, &last);
            if (s == FSDP_OK) s = fsdp_tensor_copy(ctx, row, last);
            fsdp_tensor_free(last);
            at = fsdp_tensor_data(row);
        } else if (s == FSDP_OK) {
            at = (const float *)fsdp_tensor_data(logits) + (len - 1) * V;
        }
        if (s == FSDP_OK) s = fsdp_sample_logits(ctx, at, V, job->so, (uint64_t)i, &tok);
        fsdp_tensor_free(x);
        if (s == FSDP_OK) seq[len] = tok;
        if (s == FSDP_OK && rank == 0 && !job->emit(job->user, i, tok))
            s = fsdp_ctx_set_error(ctx, FSDP_ERR_IO, "writing the generated tokens failed");
    }
    fsdp_tensor_free(row);
    fsdp_tensor_free(xd);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    free(seq);
    return s;
}

int ckpt_generate_world(fsdp_ctx *ctx, const ckpt_eval_layout *l, const int32_t *prompt, int64_t n,
                        int64_t max_new, const fsdp_sample_options *so,
                        bool (*emit)(void *user, int64_t i, int32_t tok), void *user,
                        bool *printer) {
    fsdp_world_options wo = {.backend = l->world ? FSDP_BACKEND_LOCAL : FSDP_BACKEND_MPI,
                             .nranks = l->world};
    fsdp_world *world = NULL;
    if (fsdp_world_create(ctx, &wo, &world) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt generate: cannot make the world of ranks: %s\n",
                fsdp_last_error(ctx));
        return EXIT_FAILED;
    }
    int size = fsdp_world_size(world), rc = EXIT_FAILED;
    gen_job job = {
        .l = l, .prompt = prompt, .n = n, .max_new = max_new, .so = so, .emit = emit, .user = user};
    *printer = fsdp_world_hosts_rank(world, 0);
    int64_t last = pad_to(n + max_new - 1, l->tp); /* the longest forward */
    if (last > l->cfg->max_seq_len) {
        fprintf(stderr,
                "fsdp-ckpt generate: at tp %d the sequence is padded to a multiple of %d, %lld "
                "tokens for the last new one, past the model's max_seq_len %lld; lower "
                "--max-new-tokens by %lld\n",
                l->tp, l->tp, (long long)last, (long long)l->cfg->max_seq_len,
                (long long)(last - l->cfg->max_seq_len));
        rc = EXIT_USAGE;
    } else if (size % l->tp != 0) {
        fprintf(stderr,
                "fsdp-ckpt generate: --tp %d does not divide the %d ranks; give a --tp that "
                "divides them\n",
                l->tp, size);
        rc = EXIT_USAGE;
    } else if (fsdp_world_run(ctx, world, gen_rank, &job) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt generate: on %d ranks (tp %d): %s\n", size, l->tp,
                fsdp_last_error(ctx));
    } else {
        rc = EXIT_OK;
    }
    fsdp_world_free(world);
    return rc;
}
