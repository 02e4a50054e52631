/* test_ckpt.c: the state API and sharded checkpoints. Region arithmetic; the state of every
 * layout tiles each global tensor; the seed-002 TODO: train, save, load at every layout of the
 * matrix, continue, and match the uninterrupted run (bitwise in the same layout, to float32
 * rounding across layouts, parameters and Adam state); resume of SGD momentum bitwise; and bad
 * checkpoints (uncommitted, missing, corrupt, truncated, newer format, mismatched model) fail
 * with a message that names the problem. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/region.h"
#include "harness.h"

#define SEED      5
#define BATCH     12 /* divisible by every dp size of the matrix */
#define IN_DIM    10
#define LR        1e-2
#define PRE_STEPS 3 /* before the save */
#define ALL_STEPS 5 /* uninterrupted */

/* ---- region arithmetic ---- */

typedef struct collect {
    region boxes[64];
    int n;
} collect;

static int collect_box(const region *b, void *user) {
    collect *c = user;
    if (c->n == 64) return 1;
    c->boxes[c->n++] = *b;
    return 0;
}

/* Cutting every flat range of a block gives boxes that, in order, enumerate exactly the
 * range's elements. */
static void test_flat_range_boxes(void) {
    const int64_t len[3] = {3, 4, 5}, off[3] = {2, 0, 7};
    int64_t n = 60;
    for (int64_t lo = 0; lo <= n; lo += 7)
        for (int64_t hi = lo; hi <= n; hi += 5) {
            collect c = {.n = 0};
            CU_ASSERT_EQUAL_FATAL(region_from_flat_range(3, off, len, lo, hi, collect_box, &c), 0);
            int64_t next = lo;
            for (int b = 0; b < c.n; b++) {
                const region *r = &c.boxes[b];
                for (int64_t i = 0; i < r->count[0]; i++)
                    for (int64_t j = 0; j < r->count[1]; j++)
                        for (int64_t k = 0; k < r->count[2]; k++) {
                            int64_t g0 = r->offset[0] + i - off[0], g1 = r->offset[1] + j - off[1];
                            int64_t g2 = r->offset[2] + k - off[2];
                            CU_ASSERT_EQUAL((g0 * len[1] + g1) * len[2] + g2, next);
                            next++;
                        }
            }
            CU_ASSERT_EQUAL(next, hi);
            CU_ASSERT_TRUE(c.n <= 5);
        }
}

static void test_subtract_and_copy(void) {
    region a = {.ndim = 2, .offset = {0, 0}, .count = {4, 6}};
    region b = {.ndim = 2, .offset = {1, 2}, .count = {2, 10}};
    region parts[4];
    int n = region_subtract(&a, &b, parts);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        total += region_numel(&parts[i]);
        CU_ASSERT_FALSE(region_intersect(&parts[i], &b, NULL));
        for (int j = 0; j < i; j++) CU_ASSERT_FALSE(region_intersect(&parts[i], &parts[j], NULL));
    }
    CU_ASSERT_EQUAL(total, 24 - 8);
    float src[24], dst[8] = {0};
    for (int i = 0; i < 24; i++) src[i] = (float)i;
    region cut;
    CU_ASSERT_TRUE(region_intersect(&a, &b, &cut));
    region_copy(dst, &cut, src, &a, &cut, sizeof(float));
    CU_ASSERT_EQUAL(dst[0], 8.0f);  /* (1, 2) */
    CU_ASSERT_EQUAL(dst[4], 14.0f); /* (2, 2) */
    CU_ASSERT_EQUAL(dst[7], 17.0f); /* (2, 5) */
}

/* ---- layouts ---- */

typedef enum mode { MODE_PLAIN, MODE_FSDP, MODE_REPLICATE } mode;

typedef struct layout {
    const char *name;
    int dp, tp;
    mode mode;
    fsdp_sharding_strategy strategy;
    int rep; /* HYBRID_SHARD: replica groups (dp = rep * shard) */
    bool offload, orig, nested;
} layout;

static const layout matrix[] = {
    {"2x2 FULL_SHARD", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true},
    {"4x1 SHARD_GRAD_OP", 4, 1, MODE_FSDP, FSDP_SHARD_GRAD_OP, 1, false, false, false},
    {"1x4 TP", 1, 4, MODE_PLAIN, 0, 1, false, false, false},
    {"1x1 plain", 1, 1, MODE_PLAIN, 0, 1, false, false, false},
    {"3x1 FULL_SHARD", 3, 1, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true},
    {"2x1 HYBRID_SHARD", 2, 1, MODE_FSDP, FSDP_HYBRID_SHARD, 2, false, false, false},
    {"2x1 replicate", 2, 1, MODE_REPLICATE, 0, 1, false, false, false},
    {"2x2 FULL_SHARD offload orig", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, true, true, true},
};
#define N_LAYOUTS ((int)(sizeof matrix / sizeof matrix[0]))

typedef enum optim_kind { OPT_ADAM, OPT_SGD } optim_kind;

/* One run: train `steps` after loading `load` (NULL: from the seed), then save to `save`. */
typedef struct job {
    bool async; /* save every step (keep 2), asynchronously */
    bool raw;   /* uncompressed (the flipped-byte case finds values in the file) */
    const layout *l;
    optim_kind opt;
    const char *load, *save;
    int64_t first_step, steps;
} job;

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

static fsdp_status build(fsdp_ctx *ctx, const job *jb, run *r) {
    const layout *l = jb->l;
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
static fsdp_status batch(fsdp_ctx *ctx, const job *jb, run *r, int64_t s) {
    int64_t off, len;
    fsdp_chunk_range(BATCH, jb->l->dp, r->dp_index, &off, &len);
    fsdp_tensor_free(r->x);
    fsdp_tensor_free(r->y);
    r->x = r->y = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, IN_DIM}, &r->x));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, IN_DIM}, &r->y));
    fsdp_init u = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    int64_t shape[2] = {BATCH, IN_DIM}, start[2] = {off, 0};
    FSDP_TRY(fsdp_init_block(ctx, r->x, &u, 100 + (uint64_t)s, 1, 2, shape, start));
    return fsdp_init_block(ctx, r->y, &u, 100 + (uint64_t)s, 2, 2, shape, start);
}

static fsdp_status train(fsdp_ctx *ctx, const job *jb, run *r) {
    for (int64_t s = jb->first_step; s < jb->first_step + jb->steps; s++) {
        FSDP_TRY(batch(ctx, jb, r, s));
        const fsdp_tensor *out;
        FSDP_TRY(fsdp_module_forward(ctx, r->model, r->x, &out));
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

static fsdp_status job_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const job *jb = user;
    run r = {0};
    fsdp_status s = build(ctx, jb, &r);
    fsdp_ckpt *ck = NULL;
    if (s == FSDP_OK && jb->load) s = fsdp_ckpt_open(ctx, jb->load, &ck);
    if (s == FSDP_OK && ck) s = fsdp_ckpt_load(ctx, ck, r.state, NULL);
    fsdp_ckpt_close(ck);
    fsdp_ckpt_writer *w = NULL;
    fsdp_ckpt_options wo = {.zstd_level = jb->raw ? FSDP_CKPT_NO_COMPRESSION : 0,
                            .async = jb->async,
                            .keep = jb->async ? 2 : 0};
    if (s == FSDP_OK && jb->save) s = fsdp_ckpt_writer_create(ctx, jb->save, &wo, &w);
    if (s == FSDP_OK && !jb->async) s = train(ctx, jb, &r);
    for (int64_t i = 0; s == FSDP_OK && jb->async && i < jb->steps; i++) {
        job one = *jb;
        one.first_step = jb->first_step + i, one.steps = 1;
        s = train(ctx, &one, &r);
        fsdp_ckpt_meta m = {.step = one.first_step + 1};
        if (s == FSDP_OK && i + 1 < jb->steps) s = fsdp_ckpt_save(ctx, w, r.state, &m);
    }
    fsdp_ckpt_meta meta = {.step = jb->first_step + jb->steps, .layout = jb->l->name};
    if (s == FSDP_OK && w) s = fsdp_ckpt_save(ctx, w, r.state, &meta);
    fsdp_ckpt_writer_free(ctx, w);
    run_free(ctx, &r);
    return s;
}

static fsdp_status run_async(bool async, const layout *l, optim_kind opt, const char *load,
                             const char *save, int64_t first, int64_t steps) {
    job jb = {.async = async,
              .l = l,
              .opt = opt,
              .load = load,
              .save = save,
              .first_step = first,
              .steps = steps};
    return fsdp_test_run_world(l->dp * l->tp, 0, job_rank, &jb);
}

static fsdp_status run_job(const layout *l, optim_kind opt, const char *load, const char *save,
                           int64_t first, int64_t steps) {
    return run_async(false, l, opt, load, save, first, steps);
}

static fsdp_status run_raw(const layout *l, const char *save, int64_t steps) {
    job jb = {.raw = true, .l = l, .opt = OPT_ADAM, .save = save, .steps = steps};
    return fsdp_test_run_world(l->dp * l->tp, 0, job_rank, &jb);
}

/* ---- comparing checkpoints ---- */

static char *tmp_root(void) {
    char tmpl[] = "/tmp/fsdp-ckpt-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static void remove_tree(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static char *latest(const char *dir) {
    char *p = NULL;
    FSDP_TEST_OK(fsdp_ckpt_latest(fsdp_test_ctx(), dir, &p));
    return p;
}

/* Every tensor of a equals b's: bitwise (rtol < 0) or within rtol/atol. */
static bool same_checkpoints(const char *da, const char *db, double rtol, double atol,
                             const char *what) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char *pa = latest(da), *pb = latest(db);
    fsdp_ckpt *a = NULL, *b = NULL;
    bool ok = pa && pb && fsdp_ckpt_open(ctx, pa, &a) == FSDP_OK &&
              fsdp_ckpt_open(ctx, pb, &b) == FSDP_OK;
    ok = ok && fsdp_ckpt_num_tensors(a) == fsdp_ckpt_num_tensors(b);
    ok = ok && fsdp_ckpt_optim_steps(a) == fsdp_ckpt_optim_steps(b);
    double worst = 0.0;
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
        for (int64_t i = 0; ok && i < n; i++) {
            double d = fabs((double)va[i] - vb[i]);
            worst = fmax(worst, d);
            bool good =
                rtol < 0 ? memcmp(&va[i], &vb[i], 4) == 0 : d <= atol + rtol * fabs((double)vb[i]);
            if (!good) {
                fprintf(stderr, "\n  %s: %s[%lld] is %.9g, want %.9g\n", what, ta.name,
                        (long long)i, va[i], vb[i]);
                ok = false;
            }
        }
        free(va);
        free(vb);
    }
    if (!ok && a && b) fprintf(stderr, "  %s: %s\n", what, fsdp_last_error(ctx));
    fsdp_ckpt_close(a);
    fsdp_ckpt_close(b);
    free(pa);
    free(pb);
    return ok;
}

/* ---- the matrix ---- */

/* Train PRE_STEPS at layout A, save; load at layout B and train the rest: the same model and
 * Adam state as the uninterrupted run (bitwise when A == B, else to float32 rounding against
 * the single-rank run). */
static void test_reshard_matrix(void) {
    char *root = tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    char ref[600], saved[N_LAYOUTS][600], whole[N_LAYOUTS][600], resumed[600];
    snprintf(ref, sizeof ref, "%s/ref", root);
    FSDP_TEST_OK(run_job(&matrix[3], OPT_ADAM, NULL, ref, 0, ALL_STEPS));
    for (int a = 0; a < N_LAYOUTS; a++) {
        snprintf(saved[a], sizeof saved[a], "%s/saved-%d", root, a);
        snprintf(whole[a], sizeof whole[a], "%s/whole-%d", root, a);
        FSDP_TEST_OK(run_job(&matrix[a], OPT_ADAM, NULL, saved[a], 0, PRE_STEPS));
        FSDP_TEST_OK(run_job(&matrix[a], OPT_ADAM, NULL, whole[a], 0, ALL_STEPS));
        CU_ASSERT_TRUE(same_checkpoints(whole[a], ref, 1e-4, 1e-6, matrix[a].name));
    }
    for (int a = 0; a < N_LAYOUTS; a++) {
        char *from = latest(saved[a]);
        for (int b = 0; b < N_LAYOUTS; b++) {
            snprintf(resumed, sizeof resumed, "%s/resumed-%d-%d", root, a, b);
            FSDP_TEST_OK(
                run_job(&matrix[b], OPT_ADAM, from, resumed, PRE_STEPS, ALL_STEPS - PRE_STEPS));
            char what[160];
            snprintf(what, sizeof what, "%s -> %s", matrix[a].name, matrix[b].name);
            if (a == b) CU_ASSERT_TRUE(same_checkpoints(resumed, whole[b], -1, 0, what));
            CU_ASSERT_TRUE(same_checkpoints(resumed, ref, 1e-4, 1e-6, what));
        }
        free(from);
    }
    remove_tree(root);
    free(root);
}

/* SGD with momentum: train 10 == train 5, save, load, train 5, bitwise, at 2x2. */
static void test_resume_sgd_momentum(void) {
    char *root = tmp_root();
    char a[600], b[600], c[600];
    snprintf(a, sizeof a, "%s/ten", root);
    snprintf(b, sizeof b, "%s/five", root);
    snprintf(c, sizeof c, "%s/five-more", root);
    FSDP_TEST_OK(run_job(&matrix[0], OPT_SGD, NULL, a, 0, 10));
    FSDP_TEST_OK(run_job(&matrix[0], OPT_SGD, NULL, b, 0, 5));
    char *from = latest(b);
    FSDP_TEST_OK(run_job(&matrix[0], OPT_SGD, from, c, 5, 5));
    CU_ASSERT_TRUE(same_checkpoints(c, a, -1, 0, "sgd momentum resume"));
    free(from);
    remove_tree(root);
    free(root);
}

/* Async saves every step, keeping 2: the last equals a sync save bitwise; older ones are gone. */
static void test_async_and_keep(void) {
    char *root = tmp_root();
    char a[600], b[600], old[700];
    snprintf(a, sizeof a, "%s/async", root);
    snprintf(b, sizeof b, "%s/sync", root);
    FSDP_TEST_OK(run_async(true, &matrix[4], OPT_ADAM, NULL, a, 0, 4));
    FSDP_TEST_OK(run_job(&matrix[4], OPT_ADAM, NULL, b, 0, 4));
    CU_ASSERT_TRUE(same_checkpoints(a, b, -1, 0, "async vs sync"));
    snprintf(old, sizeof old, "%s/step-00000002", a);
    CU_ASSERT_NOT_EQUAL(access(old, F_OK), 0);
    snprintf(old, sizeof old, "%s/step-00000003", a);
    CU_ASSERT_EQUAL(access(old, F_OK), 0);
    remove_tree(root);
    free(root);
}

/* ---- bad checkpoints ---- */

/* A saved 2x2 checkpoint in a fresh directory; *dir and *path are malloc'ed. */
static void saved_2x2(char **root, char **path) {
    *root = tmp_root();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", *root);
    FSDP_TEST_OK(run_raw(&matrix[0], dir, 2));
    *path = latest(dir);
}

/* Loads path at 1x1 with Adam; returns the status (the message is in the test context). */
static fsdp_status load_plain(const char *path, optim_kind opt) {
    return run_job(&matrix[3], opt, path, NULL, 2, 0);
}

/* Flips a byte of the stored values of the first piece that file rank `rank` holds: finds the
 * piece's first 8 bytes (read through the checkpoint) in the uncompressed file. Returns the
 * tensor's name (owned by the caller) or NULL. */
static char *flip_value_byte(const char *path, int rank) {
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

static void test_bad_checkpoints(void) {
    char *root, *path, file[700], cmd[1600];
    saved_2x2(&root, &path);
    FSDP_TEST_OK(load_plain(path, OPT_ADAM));
    /* Another optimizer: its state is not in the checkpoint (strict), and the checkpoint's
     * Adam state is not in the model. */
    FSDP_TEST_FAILS(load_plain(path, OPT_SGD), FSDP_ERR_NOT_FOUND, "exp_avg", "non_strict");
    /* No commit marker: never loaded. */
    snprintf(file, sizeof file, "%s/commit", path);
    CU_ASSERT_EQUAL(rename(file, "/tmp/fsdp-ckpt-test-commit"), 0);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_NOT_FOUND, "no commit marker");
    CU_ASSERT_EQUAL(rename("/tmp/fsdp-ckpt-test-commit", file), 0);
    /* A missing shard file. */
    snprintf(file, sizeof file, "%s/shard-00001.h5", path);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    CU_ASSERT_EQUAL(unlink(file), 0);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_IO, "shard-00001.h5", "cannot open");
    /* A truncated shard file. */
    snprintf(cmd, sizeof cmd, "head -c 3000 '%s.bak' > '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    CU_ASSERT_EQUAL(load_plain(path, OPT_ADAM), FSDP_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(fsdp_last_error(fsdp_test_ctx()), "shard-00001.h5"));
    /* A flipped byte in the data: the checksum names the tensor. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    char *flipped = flip_value_byte(path, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(flipped);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_IO, flipped, "shard-00001.h5", "corrupt");
    free(flipped);
    remove_tree(root);
    free(path);
    free(root);
}

/* Metadata of a newer format, or damaged: refused by fsdp_ckpt_open, naming the file. */
static void test_bad_metadata(void) {
    char *root, *path, file[700], cmd[1600];
    saved_2x2(&root, &path);
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck = NULL;
    snprintf(file, sizeof file, "%s/metadata.h5", path);
    /* Not an HDF5 file at all. */
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    FILE *f = fopen(file, "w");
    fputs("not an HDF5 file", f);
    fclose(f);
    FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_IO, "metadata.h5");
    CU_ASSERT_PTR_NULL(ck);
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    fsdp_ckpt_close(ck);
    remove_tree(root);
    free(path);
    free(root);
}

/* A model of another shape: the error names the tensor and both shapes. */
static fsdp_status wrong_shape_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    fsdp_module *m = NULL;
    fsdp_state *st = NULL;
    fsdp_ckpt *ck = NULL;
    fsdp_status s = fsdp_model_mlp(ctx, 3, (int64_t[]){10, 16, 10}, FSDP_ACT_RELU, &m);
    if (s == FSDP_OK) s = fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st);
    if (s == FSDP_OK) s = fsdp_ckpt_open(ctx, user, &ck);
    if (s == FSDP_OK)
        s = fsdp_ckpt_load(ctx, ck, st, &(fsdp_ckpt_load_options){.non_strict = true});
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
    fsdp_module_free(m);
    return s;
}

static void test_mismatch_and_load_value(void) {
    char *root, *path;
    saved_2x2(&root, &path);
    fsdp_ctx *ctx = fsdp_test_ctx();
    /* Names that match nothing load nothing non-strictly; strictly they are errors. */
    FSDP_TEST_OK(fsdp_test_run_world(1, 0, wrong_shape_rank, path));
    /* Loading a whole value by name into a sharded model, then reading it back. */
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 1, &m));
    fsdp_state *st;
    FSDP_TEST_OK(fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st));
    fsdp_tensor *v = fsdp_test_random(2, (int64_t[]){16, 10}, -1, 1, 3);
    FSDP_TEST_OK(fsdp_state_load_value(ctx, st, "layers.0.net1.weight", v));
    CU_ASSERT_EQUAL(
        memcmp(fsdp_tensor_data(v),
               fsdp_tensor_data(fsdp_param_data(fsdp_module_get_param(m, "layers.0.net1.weight"))),
               16 * 10 * 4),
        0);
    fsdp_tensor *bad = fsdp_test_random(2, (int64_t[]){10, 16}, -1, 1, 3);
    FSDP_TEST_FAILS(fsdp_state_load_value(ctx, st, "layers.0.net1.weight", bad), FSDP_ERR_SHAPE,
                    "layers.0.net1.weight", "(10, 16)", "[0:16, 0:10]");
    FSDP_TEST_FAILS(fsdp_state_load_value(ctx, st, "nope", v), FSDP_ERR_NOT_FOUND, "nope");
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    fsdp_state_free(st);
    fsdp_module_free(m);
    /* A 2-layer checkpoint into a 1-layer model: strict names the extra tensor. */
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 1, &m));
    FSDP_TEST_OK(fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st));
    FSDP_TEST_FAILS(fsdp_ckpt_load(ctx, ck, st, NULL), FSDP_ERR_NOT_FOUND, "layers.1.net1.weight",
                    "lacks");
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
    fsdp_module_free(m);
    fsdp_tensor_free(v);
    fsdp_tensor_free(bad);
    remove_tree(root);
    free(path);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"flat_range_boxes", test_flat_range_boxes},
        {"subtract_and_copy", test_subtract_and_copy},
        {"reshard_matrix", test_reshard_matrix},
        {"resume_sgd_momentum", test_resume_sgd_momentum},
        {"async_and_keep", test_async_and_keep},
        {"bad_checkpoints", test_bad_checkpoints},
        {"bad_metadata", test_bad_metadata},
        {"mismatch_and_load_value", test_mismatch_and_load_value},
    };
    return fsdp_test_run(argc, argv, "ckpt", cases, sizeof cases / sizeof cases[0]);
}
