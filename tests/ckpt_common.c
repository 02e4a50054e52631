/* ckpt_common.c: the checkpoint suites' shared model, layouts, training run and scratch
 * directories (see ckpt_common.h). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup */
#include "ckpt_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/region.h"
#include "harness.h"

#define SEED   5
#define BATCH  CKPT_TEST_BATCH
#define IN_DIM CKPT_TEST_DIM
#define LR     CKPT_LR

typedef struct run {
    fsdp_mesh *mesh, *tp;
    fsdp_group *dp, *rep;
    fsdp_module *model;
    fsdp_sharded *sh;
    fsdp_optimizer *opt;
    fsdp_state *state;
    fsdp_tensor *x, *y, *dout;
    int dp_index;
} run;

static void run_free(fsdp_ctx *ctx, run *r) {
    fsdp_state_free(r->state);
    fsdp_optimizer_free(r->opt);
    fsdp_sharded_free(r->sh);
    fsdp_module_free(r->model);
    fsdp_tensor_free(r->x);
    fsdp_tensor_free(r->y);
    fsdp_tensor_free(r->dout);
    fsdp_mesh_free(r->mesh);
    (void)ctx;
}

static fsdp_status build(fsdp_ctx *ctx, const ckpt_job *jb, run *r) {
    const ckpt_layout *l = jb->l;
    int shard = l->dp / l->rep;
    FSDP_TRY(fsdp_mesh_create(ctx, 3, (int[]){l->rep, shard, l->tp},
                              (const char *[]){"rep", "dp", "tp"}, &r->mesh));
    FSDP_TRY(fsdp_mesh_get_group(ctx, r->mesh, "dp", &r->dp));
    FSDP_TRY(fsdp_mesh_get_group(ctx, r->mesh, "rep", &r->rep));
    r->dp_index = fsdp_mesh_coordinate(r->mesh, 0) * shard + fsdp_mesh_coordinate(r->mesh, 1);
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, 2, &r->model));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, r->model, SEED));
    if (l->tp > 1) {
        FSDP_TRY(fsdp_mesh_dim(ctx, r->mesh, "tp", &r->tp));
        fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                     {"layers.*.net2", FSDP_ROWWISE()}};
        FSDP_TRY(fsdp_tp_parallelize(ctx, r->model, r->tp, 2, plan, NULL));
    }
    fsdp_module *stepped = r->model;
    if (l->mode == MODE_FSDP) {
        const char *paths[] = {"layers.0", "layers.1"};
        fsdp_fully_shard_options o = {.strategy = l->strategy,
                                      .group = r->dp,
                                      .replicate_group =
                                          l->strategy == FSDP_HYBRID_SHARD ? r->rep : NULL,
                                      .wrap_paths = l->nested ? paths : NULL,
                                      .n_wrap_paths = l->nested ? 2 : 0,
                                      .offload_params = l->offload,
                                      .use_orig_params = l->orig};
        FSDP_TRY(fsdp_fully_shard(ctx, r->model, &o, &r->sh));
        stepped = fsdp_sharded_flat_params(r->sh);
    } else if (l->mode == MODE_REPLICATE) {
        FSDP_TRY(
            fsdp_replicate_apply(ctx, r->model, &(fsdp_replicate_options){.group = r->dp}, NULL));
    }
    if (jb->opt == OPT_ADAM)
        FSDP_TRY(fsdp_adam_create(ctx, stepped, &(fsdp_adam_options){.lr = LR}, &r->opt));
    else
        FSDP_TRY(
            fsdp_sgd_create(ctx, stepped, &(fsdp_sgd_options){.lr = LR, .momentum = 0.9}, &r->opt));
    fsdp_state_sources src = {.model = r->model, .sharded = r->sh, .optimizer = r->opt};
    return fsdp_state_create(ctx, &src, &r->state);
}

/* This rank's rows of the global batch of step s: inputs and targets from the global indices. */
static fsdp_status batch(fsdp_ctx *ctx, const ckpt_job *jb, run *r, int64_t s) {
    int64_t off, len;
    fsdp_chunk_range(BATCH, jb->l->dp, r->dp_index, &off, &len);
    fsdp_tensor_free(r->x);
    fsdp_tensor_free(r->y);
    r->x = r->y = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, IN_DIM}, &r->x));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, IN_DIM}, &r->y));
    if (jb->fixed_x) {
        memcpy(fsdp_tensor_data(r->x), jb->fixed_x + off * IN_DIM, (size_t)(len * IN_DIM) * 4);
        memcpy(fsdp_tensor_data(r->y), jb->fixed_y + off * IN_DIM, (size_t)(len * IN_DIM) * 4);
        return FSDP_OK;
    }
    fsdp_init u = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    int64_t shape[2] = {BATCH, IN_DIM}, start[2] = {off, 0};
    FSDP_TRY(fsdp_init_block(ctx, r->x, &u, 100 + (uint64_t)s, 1, 2, shape, start));
    return fsdp_init_block(ctx, r->y, &u, 100 + (uint64_t)s, 2, 2, shape, start);
}

/* The output for the fixed batch: this dp rank's rows into jb->forward_out (by tp rank 0). */
static void keep_output(const ckpt_job *jb, run *r, const fsdp_tensor *out) {
    int64_t off, len;
    fsdp_chunk_range(BATCH, jb->l->dp, r->dp_index, &off, &len);
    if (fsdp_mesh_coordinate(r->mesh, 2) == 0)
        memcpy(jb->forward_out + off * IN_DIM, fsdp_tensor_data(out), (size_t)(len * IN_DIM) * 4);
}

static fsdp_status train(fsdp_ctx *ctx, const ckpt_job *jb, run *r) {
    for (int64_t s = jb->first_step; s < jb->first_step + jb->steps; s++) {
        FSDP_TRY(batch(ctx, jb, r, s));
        const fsdp_tensor *out;
        FSDP_TRY(fsdp_module_forward(ctx, r->model, r->x, &out));
        if (jb->forward_out && s == jb->first_step) keep_output(jb, r, out);
        if (!r->dout) FSDP_TRY(fsdp_tensor_create_like(ctx, out, &r->dout));
        FSDP_TRY(fsdp_tensor_resize(ctx, r->dout, 2, fsdp_tensor_shape(out)));
        float loss;
        FSDP_TRY(fsdp_loss_mse(ctx, out, r->y, &loss, r->dout));
        FSDP_TRY(fsdp_module_backward(ctx, r->model, r->dout, NULL));
        FSDP_TRY(fsdp_optimizer_step(ctx, r->opt));
        FSDP_TRY(fsdp_optimizer_zero_grad(ctx, r->opt));
    }
    return FSDP_OK;
}

/* Loads jb->load into the run's state, or (load_model_only) into a state of the model alone. */
static fsdp_status load(fsdp_ctx *ctx, const ckpt_job *jb, run *r) {
    fsdp_ckpt *ck = NULL;
    fsdp_state *model_only = NULL;
    fsdp_state_sources src = {.model = r->model, .sharded = r->sh};
    fsdp_status s = fsdp_ckpt_open(ctx, jb->load, &ck);
    if (s == FSDP_OK && jb->load_model_only) s = fsdp_state_create(ctx, &src, &model_only);
    if (s == FSDP_OK) s = fsdp_ckpt_load(ctx, ck, model_only ? model_only : r->state, NULL);
    fsdp_state_free(model_only);
    fsdp_ckpt_close(ck);
    return s;
}

static fsdp_status job_rank(fsdp_ctx *ctx, int rank, void *user) {
    const ckpt_job *jb = user;
    run r = {0};
    fsdp_status s = build(ctx, jb, &r);
    if (s == FSDP_OK && jb->load) s = load(ctx, jb, &r);
    if (s == FSDP_OK && jb->nudge) {
        FSDP_RANK_CHECK(ctx, jb->l->mode == MODE_PLAIN && jb->l->tp == 1,
                        "ckpt_job.nudge: layout %s is not one plain rank", jb->l->name);
        s = fsdp_test_nudge_params(ctx, r.model, 77);
    }
    fsdp_ckpt_writer *w = NULL;
    bool each = jb->async || jb->each_step;
    fsdp_ckpt_options wo = {.zstd_level = jb->raw ? FSDP_CKPT_NO_COMPRESSION : 0,
                            .async = jb->async,
                            .keep = each ? (jb->keep ? jb->keep : 2) : 0};
    if (s == FSDP_OK && jb->save) s = fsdp_ckpt_writer_create(ctx, jb->save, &wo, &w);
    if (s == FSDP_OK && !each) s = train(ctx, jb, &r);
    for (int64_t i = 0; s == FSDP_OK && each && i < jb->steps; i++) {
        ckpt_job one = *jb;
        one.first_step = jb->first_step + i, one.steps = 1;
        s = train(ctx, &one, &r);
        fsdp_ckpt_meta m = {.step = one.first_step + 1};
        if (s == FSDP_OK && i + 1 < jb->steps && jb->before_save && rank == 0)
            jb->before_save(m.step, jb->hook_user);
        if (s == FSDP_OK && i + 1 < jb->steps) s = fsdp_ckpt_save(ctx, w, r.state, &m);
    }
    fsdp_ckpt_meta meta = {.step = jb->first_step + jb->steps, .layout = jb->l->name};
    if (s == FSDP_OK && w && jb->before_save && rank == 0)
        jb->before_save(meta.step, jb->hook_user);
    if (s == FSDP_OK && w) s = fsdp_ckpt_save(ctx, w, r.state, &meta);
    fsdp_ckpt_writer_free(ctx, w);
    run_free(ctx, &r);
    return s;
}

fsdp_status ckpt_test_run_async(bool async, const ckpt_layout *l, ckpt_optim opt, const char *load,
                                const char *save, int64_t first, int64_t steps) {
    ckpt_job jb = {.async = async,
                   .l = l,
                   .opt = opt,
                   .load = load,
                   .save = save,
                   .first_step = first,
                   .steps = steps};
    return ckpt_test_run(&jb);
}

fsdp_status ckpt_test_run_job(const ckpt_layout *l, ckpt_optim opt, const char *load,
                              const char *save, int64_t first, int64_t steps) {
    return ckpt_test_run_async(false, l, opt, load, save, first, steps);
}

fsdp_status ckpt_test_run_raw(const ckpt_layout *l, const char *save, int64_t steps) {
    ckpt_job jb = {.raw = true, .l = l, .opt = OPT_ADAM, .save = save, .steps = steps};
    return ckpt_test_run(&jb);
}

fsdp_status ckpt_test_run(const ckpt_job *jb) {
    return fsdp_test_run_world(jb->l->dp * jb->l->tp, 0, job_rank, (void *)jb);
}

char *ckpt_test_tmp_root(void) {
    char tmpl[] = "/tmp/fsdp-ckpt-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void ckpt_test_remove_tree(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

char *ckpt_test_latest(const char *dir) {
    char *p = NULL;
    FSDP_TEST_OK(fsdp_ckpt_latest(fsdp_test_ctx(), dir, &p));
    return p;
}

char *ckpt_test_flip_value_byte(const char *path, int rank) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    if (fsdp_ckpt_open(ctx, path, &ck) != FSDP_OK) return NULL;
    char *name = NULL;
    for (int t = 0; !name && t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor ti;
        fsdp_ckpt_tensor_get(ctx, ck, t, &ti);
        for (int k = 0; !name && k < ti.n_pieces; k++) {
            fsdp_ckpt_piece p;
            fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            if (p.file_rank != rank || region_numel(&p.region) < 4) continue;
            float *v = malloc((size_t)region_numel(&p.region) * 4);
            fsdp_ckpt_read(ctx, ck, t, &p.region, v);
            char file[700];
            snprintf(file, sizeof file, "%s/shard-%05d.h5", path, rank);
            FILE *f = fopen(file, "r+b");
            fseek(f, 0, SEEK_END);
            long size = ftell(f);
            unsigned char *bytes = malloc((size_t)size);
            fseek(f, 0, SEEK_SET);
            if (fread(bytes, 1, (size_t)size, f) == (size_t)size)
                for (long i = 0; i + 8 <= size; i++)
                    if (!memcmp(bytes + i, v, 8)) {
                        fseek(f, i + 1, SEEK_SET);
                        fputc(bytes[i + 1] ^ 0x5a, f);
                        name = strdup(ti.name);
                        break;
                    }
            fclose(f);
            free(bytes);
            free(v);
        }
    }
    fsdp_ckpt_close(ck);
    return name;
}

fsdp_status ckpt_test_verify(const char *path) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    FSDP_TRY(fsdp_ckpt_open(ctx, path, &ck));
    fsdp_status s = FSDP_OK;
    for (int t = 0; s == FSDP_OK && t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        s = fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        for (int k = 0; s == FSDP_OK && k < x.n_pieces; k++) {
            fsdp_ckpt_piece p;
            s = fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            void *buf = malloc((size_t)region_numel(&p.region) * fsdp_dtype_size(x.dtype) + 1);
            if (s == FSDP_OK) s = buf ? fsdp_ckpt_read(ctx, ck, t, &p.region, buf) : FSDP_ERR_IO;
            free(buf);
        }
    }
    for (int r = 0; s == FSDP_OK && r < fsdp_ckpt_world_size(ck); r++)
        s = fsdp_ckpt_check_shard(ctx, ck, r); /* also those that hold no piece */
    fsdp_ckpt_close(ck);
    return s;
}

/* Calls fn on every tensor of checkpoint a with the tensor of the same name in b, both read
 * whole; false (with a message) when they do not match in tensors, shapes or steps, or when fn
 * returns false. */
typedef bool (*pair_fn)(const fsdp_ckpt_tensor *t, const float *va, const float *vb, int64_t n,
                        void *user);

static bool each_pair(const char *pa, const char *pb, pair_fn fn, void *user, const char *what) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *a = NULL, *b = NULL;
    bool ok = pa && pb && fsdp_ckpt_open(ctx, pa, &a) == FSDP_OK &&
              fsdp_ckpt_open(ctx, pb, &b) == FSDP_OK;
    ok = ok && fsdp_ckpt_num_tensors(a) == fsdp_ckpt_num_tensors(b);
    ok = ok && fsdp_ckpt_optim_steps(a) == fsdp_ckpt_optim_steps(b);
    for (int t = 0; ok && t < fsdp_ckpt_num_tensors(a); t++) {
        fsdp_ckpt_tensor ta, tb;
        ok = fsdp_ckpt_tensor_get(ctx, a, t, &ta) == FSDP_OK;
        int u = ok ? fsdp_ckpt_find(b, ta.name) : -1;
        ok = u >= 0 && fsdp_ckpt_tensor_get(ctx, b, u, &tb) == FSDP_OK && ta.ndim == tb.ndim;
        fsdp_state_region all = {.ndim = ta.ndim};
        int64_t n = 1;
        for (int d = 0; ok && d < ta.ndim; d++) n *= all.count[d] = ta.shape[d];
        float *va = malloc((size_t)n * 4 + 4), *vb = malloc((size_t)n * 4 + 4);
        ok = ok && fsdp_ckpt_read(ctx, a, t, &all, va) == FSDP_OK &&
             fsdp_ckpt_read(ctx, b, u, &all, vb) == FSDP_OK;
        ok = ok && fn(&ta, va, vb, n, user);
        free(va);
        free(vb);
    }
    if (!ok) fprintf(stderr, "  %s: %s\n", what, fsdp_last_error(ctx));
    fsdp_ckpt_close(a);
    fsdp_ckpt_close(b);
    return ok;
}

typedef struct same_cmp {
    double rtol, atol; /* rtol < 0: bitwise */
    const char *what;
    double max_abs, used; /* the largest difference, and the largest over its bound */
    char worst[96];
} same_cmp;

static bool same_tensor(const fsdp_ckpt_tensor *t, const float *va, const float *vb, int64_t n,
                        void *user) {
    same_cmp *c = user;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)va[i] - vb[i]), bound = c->atol + c->rtol * fabs((double)vb[i]);
        bool good = c->rtol < 0 ? memcmp(&va[i], &vb[i], 4) == 0 : d <= bound;
        c->max_abs = fmax(c->max_abs, d);
        if (c->rtol >= 0 && d / bound > c->used) {
            c->used = d / bound;
            snprintf(c->worst, sizeof c->worst, "%.60s[%lld]", t->name, (long long)i);
        }
        if (!good) {
            fprintf(stderr, "\n  %s: %s[%lld] is %.9g, want %.9g\n", c->what, t->name, (long long)i,
                    va[i], vb[i]);
            return false;
        }
    }
    return true;
}

bool ckpt_test_same(const char *pa, const char *pb, double rtol, double atol, const char *what) {
    same_cmp c = {.rtol = rtol, .atol = atol, .what = what};
    bool ok = each_pair(pa, pb, same_tensor, &c, what);
    if (ok && rtol >= 0)
        printf("\n    %s: max abs diff %.3g, %.2g of the bound (at %s)", what, c.max_abs, c.used,
               c.worst);
    return ok;
}

typedef struct adam_cmp {
    same_cmp state; /* everything but the parameters */
    fsdp_test_adam_check *rule;
} adam_cmp;

static bool adam_tensor(const fsdp_ckpt_tensor *t, const float *va, const float *vb, int64_t n,
                        void *user) {
    adam_cmp *c = user;
    if (t->kind != FSDP_STATE_PARAM) return same_tensor(t, va, vb, n, &c->state);
    fsdp_test_adam_add(c->rule, t->name, va, vb, n);
    return true;
}

bool ckpt_test_same_adam(const char *pa, const char *pb, fsdp_test_adam_check *rule, double rtol,
                         double atol, const char *what) {
    adam_cmp c = {.state = {.rtol = rtol, .atol = atol, .what = what}, .rule = rule};
    char why[256];
    bool ok = each_pair(pa, pb, adam_tensor, &c, what);
    if (ok && !fsdp_test_adam_ok(rule, why, sizeof why)) {
        fprintf(stderr, "\n  %s: parameters: %s\n", what, why);
        ok = false;
    }
    if (ok)
        printf("\n    %s: parameters max abs diff %.3g (%.2g x the bound, %lld elements beyond "
               "it); moments %.2g of their bound",
               what, rule->max_abs, rule->max_abs / rule->bulk, (long long)rule->exceptions,
               c.state.used);
    return ok;
}

typedef struct noise_cmp {
    float *a, *b;
    int64_t n, cap;
} noise_cmp;

static bool collect_params(const fsdp_ckpt_tensor *t, const float *va, const float *vb, int64_t n,
                           void *user) {
    noise_cmp *c = user;
    if (t->kind != FSDP_STATE_PARAM) return true;
    if (c->n + n > c->cap) {
        c->cap = 2 * (c->n + n);
        float *a = realloc(c->a, (size_t)c->cap * 4),
              *b = a ? realloc(c->b, (size_t)c->cap * 4) : NULL;
        if (a) c->a = a;
        if (b) c->b = b;
        if (!a || !b) return false;
    }
    memcpy(c->a + c->n, va, (size_t)n * 4);
    memcpy(c->b + c->n, vb, (size_t)n * 4);
    c->n += n;
    return true;
}

double ckpt_test_param_noise(const char *pa, const char *pb, double q) {
    noise_cmp c = {0};
    double noise = each_pair(pa, pb, collect_params, &c, "noise")
                       ? fsdp_test_quantile_abs_diff(c.a, c.b, c.n, q)
                       : NAN;
    free(c.a);
    free(c.b);
    return noise;
}

/* ckpt_test_compare (ckpt_common.h) */
bool ckpt_test_compare(const char *a, const char *b, double *max_diff, bool *bitwise) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ca = NULL, *cb = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, a, &ca));
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, b, &cb));
    bool ok = ca && cb && fsdp_ckpt_num_tensors(ca) == fsdp_ckpt_num_tensors(cb);
    *max_diff = 0;
    *bitwise = true;
    for (int t = 0; ok && t < fsdp_ckpt_num_tensors(ca); t++) {
        fsdp_ckpt_tensor ta, tb;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ca, t, &ta));
        int u = fsdp_ckpt_find(cb, ta.name);
        ok = u >= 0 && fsdp_ckpt_tensor_get(ctx, cb, u, &tb) == FSDP_OK && ta.ndim == tb.ndim;
        fsdp_state_region all = {.ndim = ta.ndim};
        int64_t n = 1;
        for (int d = 0; ok && d < ta.ndim; d++) {
            ok = ta.shape[d] == tb.shape[d];
            all.count[d] = ta.shape[d];
            n *= ta.shape[d];
        }
        if (!ok) {
            printf("\n    %s: not in both checkpoints with one shape", ta.name);
            break;
        }
        float *va = malloc((size_t)n * sizeof(float) + 1),
              *vb = malloc((size_t)n * sizeof(float) + 1);
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, ca, t, &all, va));
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, cb, u, &all, vb));
        for (int64_t i = 0; i < n; i++) {
            *max_diff = fmax(*max_diff, fabs((double)va[i] - (double)vb[i]));
            *bitwise = *bitwise && memcmp(&va[i], &vb[i], sizeof(float)) == 0;
        }
        free(va);
        free(vb);
    }
    fsdp_ckpt_close(ca);
    fsdp_ckpt_close(cb);
    return ok;
}
