/* test_ckpt.c: the state API and sharded checkpoints. Region arithmetic; the seed-002 TODO: train,
 * save, load at every layout of the matrix, continue, and match the uninterrupted run (bitwise in
 * the same layout; across layouts the single-rank run, the parameters by the statistical rule of
 * tests/numerics.h and Adam's moments to float32 rounding); resume of SGD
 * momentum bitwise; and bad checkpoints (uncommitted, missing, corrupt, truncated, not HDF5,
 * mismatched model, metadata truncated or of a newer format version) fail in load and in verify
 * with a message that names the problem, the file and, for a shard, the tensor. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "ckpt/region.h"
#include "ckpt_common.h"
#include "harness.h"

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

static const ckpt_layout matrix[] = {
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

/* ---- comparing checkpoints ---- */

/* The newest checkpoints of two save directories are equal (ckpt_test_same). */
static bool same_checkpoints(const char *da, const char *db, double rtol, double atol,
                             const char *what) {
    char *pa = ckpt_test_latest(da), *pb = ckpt_test_latest(db);
    bool ok = ckpt_test_same(pa, pb, rtol, atol, what);
    free(pa);
    free(pb);
    return ok;
}

/* Across layouts the sums of every step run in other orders, and Adam turns the rounding of a
 * gradient that passes near zero into a move of up to lr: the parameters after ALL_STEPS are
 * compared with the single-rank run by the statistical rule of tests/numerics.h. The noise is
 * the NOISE_Q quantile of |ref - ref'| over the parameters, ref' the single-rank run from
 * parameters nudged by one ulp; every element within NOISE_K x it, but MAX_EXCEPTIONS, each
 * within twice Adam's largest move in ALL_STEPS steps of lr 1e-2 (CKPT_LR). MLPStacked(2) has
 * 1,700 parameters, so the quantile is 0.99 as for SimpleMLP (tests/dp_common.h). Adam's
 * moments move smoothly with the gradients (m = (1 - b1) sum b1^k g, v likewise with g^2):
 * within MOMENT_RTOL of themselves, MOMENT_ATOL absolute for the elements whose gradient
 * cancels to rounding level (f32 sums of <= 40 terms of magnitude <= 1: ~1e-7). */
#define NOISE_Q        0.99
#define NOISE_K        16.0
#define MAX_EXCEPTIONS 4
#define MOMENT_RTOL    1e-4
#define MOMENT_ATOL    1e-6

static double g_noise; /* the single-rank run's rounding noise (test_reshard_matrix) */

static bool near_reference(const char *dir, const char *ref, const char *what) {
    char *pa = ckpt_test_latest(dir), *pb = ckpt_test_latest(ref);
    fsdp_test_adam_check rule = {.bulk = NOISE_K * g_noise,
                                 .move =
                                     2.0 * CKPT_LR * fsdp_test_adam_max_move(0.9, 0.999, ALL_STEPS),
                                 .max_exceptions = MAX_EXCEPTIONS};
    bool ok = ckpt_test_same_adam(pa, pb, &rule, MOMENT_RTOL, MOMENT_ATOL, what);
    free(pa);
    free(pb);
    return ok;
}

/* ---- the matrix ---- */

/* Train PRE_STEPS at layout A, save; load at layout B and train the rest: the same model and
 * Adam state as the uninterrupted run (bitwise when A == B, else to float32 rounding against
 * the single-rank run). */
static void test_reshard_matrix(void) {
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    char ref[600], saved[N_LAYOUTS][600], whole[N_LAYOUTS][600], resumed[600];
    snprintf(ref, sizeof ref, "%s/ref", root);
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[3], OPT_ADAM, NULL, ref, 0, ALL_STEPS));
    char nudged[600];
    snprintf(nudged, sizeof nudged, "%s/nudged", root);
    ckpt_job nj = {
        .l = &matrix[3], .opt = OPT_ADAM, .save = nudged, .steps = ALL_STEPS, .nudge = true};
    FSDP_TEST_OK(ckpt_test_run(&nj));
    char *pr = ckpt_test_latest(ref), *pn = ckpt_test_latest(nudged);
    g_noise = ckpt_test_param_noise(pr, pn, NOISE_Q);
    free(pr);
    free(pn);
    CU_ASSERT_FATAL(g_noise > 0);
    printf("\n    the single-rank run's rounding noise (quantile %g of |ref - nudged|): %.3g",
           NOISE_Q, g_noise);
    for (int a = 0; a < N_LAYOUTS; a++) {
        snprintf(saved[a], sizeof saved[a], "%s/saved-%d", root, a);
        snprintf(whole[a], sizeof whole[a], "%s/whole-%d", root, a);
        FSDP_TEST_OK(ckpt_test_run_job(&matrix[a], OPT_ADAM, NULL, saved[a], 0, PRE_STEPS));
        FSDP_TEST_OK(ckpt_test_run_job(&matrix[a], OPT_ADAM, NULL, whole[a], 0, ALL_STEPS));
        CU_ASSERT_TRUE(near_reference(whole[a], ref, matrix[a].name));
    }
    for (int a = 0; a < N_LAYOUTS; a++) {
        char *from = ckpt_test_latest(saved[a]);
        for (int b = 0; b < N_LAYOUTS; b++) {
            snprintf(resumed, sizeof resumed, "%s/resumed-%d-%d", root, a, b);
            FSDP_TEST_OK(ckpt_test_run_job(&matrix[b], OPT_ADAM, from, resumed, PRE_STEPS,
                                           ALL_STEPS - PRE_STEPS));
            char what[160];
            snprintf(what, sizeof what, "%s -> %s", matrix[a].name, matrix[b].name);
            if (a == b) CU_ASSERT_TRUE(same_checkpoints(resumed, whole[b], -1, 0, what));
            CU_ASSERT_TRUE(near_reference(resumed, ref, what));
        }
        free(from);
    }
    ckpt_test_remove_tree(root);
    free(root);
}

/* SGD with momentum: train 10 == train 5, save, load, train 5, bitwise, at 2x2. */
static void test_resume_sgd_momentum(void) {
    char *root = ckpt_test_tmp_root();
    char a[600], b[600], c[600];
    snprintf(a, sizeof a, "%s/ten", root);
    snprintf(b, sizeof b, "%s/five", root);
    snprintf(c, sizeof c, "%s/five-more", root);
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[0], OPT_SGD, NULL, a, 0, 10));
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[0], OPT_SGD, NULL, b, 0, 5));
    char *from = ckpt_test_latest(b);
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[0], OPT_SGD, from, c, 5, 5));
    CU_ASSERT_TRUE(same_checkpoints(c, a, -1, 0, "sgd momentum resume"));
    free(from);
    ckpt_test_remove_tree(root);
    free(root);
}

/* Async saves every step, keeping 2: the last equals a sync save bitwise; older ones are gone. */
static void test_async_and_keep(void) {
    char *root = ckpt_test_tmp_root();
    char a[600], b[600], old[700];
    snprintf(a, sizeof a, "%s/async", root);
    snprintf(b, sizeof b, "%s/sync", root);
    FSDP_TEST_OK(ckpt_test_run_async(true, &matrix[4], OPT_ADAM, NULL, a, 0, 4));
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[4], OPT_ADAM, NULL, b, 0, 4));
    CU_ASSERT_TRUE(same_checkpoints(a, b, -1, 0, "async vs sync"));
    snprintf(old, sizeof old, "%s/step-00000002", a);
    CU_ASSERT_NOT_EQUAL(access(old, F_OK), 0);
    snprintf(old, sizeof old, "%s/step-00000003", a);
    CU_ASSERT_EQUAL(access(old, F_OK), 0);
    ckpt_test_remove_tree(root);
    free(root);
}

/* What earlier saves left in the directory goes at the next save: a step directory without its
 * commit marker (a removal cut short by a kill: the marker goes first) and a failed save's
 * temporary directory; before, the first stayed forever. Committed checkpoints stay. */
static void test_leftovers_removed(void) {
    char *root = ckpt_test_tmp_root();
    char dir[600], half[700], tmp[700], file[800], kept[700];
    snprintf(dir, sizeof dir, "%s/c", root);
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[3], OPT_ADAM, NULL, dir, 0, 2));
    snprintf(half, sizeof half, "%s/step-00000001", dir);
    snprintf(tmp, sizeof tmp, "%s/.step-00000007.tmp", dir);
    const char *left[] = {half, tmp};
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(mkdir(left[i], 0755), 0);
        snprintf(file, sizeof file, "%s/shard-00000.h5", left[i]);
        FILE *f = fopen(file, "w");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fputs("half", f);
        fclose(f);
    }
    FSDP_TEST_OK(ckpt_test_run_job(&matrix[3], OPT_ADAM, NULL, dir, 0, 3));
    CU_ASSERT_NOT_EQUAL(access(half, F_OK), 0);
    CU_ASSERT_NOT_EQUAL(access(tmp, F_OK), 0);
    for (int step = 2; step <= 3; step++) {
        snprintf(kept, sizeof kept, "%s/step-%08d/commit", dir, step);
        CU_ASSERT_EQUAL(access(kept, F_OK), 0);
    }
    ckpt_test_remove_tree(root);
    free(root);
}

/* ---- bad checkpoints ---- */

/* A saved 2x2 checkpoint in a fresh directory; *dir and *path are malloc'ed. */
static void saved_2x2(char **root, char **path) {
    *root = ckpt_test_tmp_root();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", *root);
    FSDP_TEST_OK(ckpt_test_run_raw(&matrix[0], dir, 2));
    *path = ckpt_test_latest(dir);
}

/* Loads path at 1x1 with Adam; returns the status (the message is in the test context). */
static fsdp_status load_plain(const char *path, ckpt_optim opt) {
    return ckpt_test_run_job(&matrix[3], opt, path, NULL, 2, 0);
}

/* Replaces the dataset of the first piece that file rank `rank` holds with one of the same
 * shape and type whose chunks were never written. Returns the tensor's name (malloc'ed). */
static char *unwrite_first_piece(const char *path, int rank) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    if (fsdp_ckpt_open(ctx, path, &ck) != FSDP_OK) return NULL;
    char *name = NULL, file[700], ds[400];
    for (int t = 0; !name && t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        for (int k = 0; !name && k < x.n_pieces; k++) {
            fsdp_ckpt_piece p;
            fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            if (p.file_rank != rank || x.ndim == 0) continue;
            snprintf(ds, sizeof ds, "%s/%d", x.name, p.id);
            name = strdup(x.name);
            hsize_t dims[FSDP_MAX_DIMS];
            for (int d = 0; d < x.ndim; d++) dims[d] = (hsize_t)p.region.count[d];
            fsdp_ckpt_close(ck);
            ck = NULL;
            snprintf(file, sizeof file, "%s/shard-%05d.h5", path, rank);
            hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
            hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE),
                  space = H5Screate_simple(x.ndim, dims, NULL);
            H5Pset_chunk(dcpl, x.ndim, dims);
            CU_ASSERT(H5Ldelete(f, ds, H5P_DEFAULT) >= 0);
            hid_t d = H5Dcreate2(f, ds, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
            CU_ASSERT(d >= 0);
            H5Dclose(d);
            H5Sclose(space);
            H5Pclose(dcpl);
            H5Fclose(f);
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
    FSDP_TEST_FAILS(ckpt_test_verify(path), FSDP_ERR_IO, "shard-00001.h5", "tensor '");
    /* A truncated shard file: cut in its superblock, and cut in the middle of the data. */
    struct stat sb;
    snprintf(cmd, sizeof cmd, "%s.bak", file);
    CU_ASSERT_EQUAL_FATAL(stat(cmd, &sb), 0);
    long sizes[2] = {3000, (long)sb.st_size / 2};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "head -c %ld '%s.bak' > '%s'", sizes[i], file, file);
        CU_ASSERT_EQUAL(system(cmd), 0);
        FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_IO, "shard-00001.h5", "tensor '");
        FSDP_TEST_FAILS(ckpt_test_verify(path), FSDP_ERR_IO, "shard-00001.h5", "tensor '");
    }
    /* A flipped byte in the data: the checksum names the tensor, in load and in verify. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    FSDP_TEST_OK(ckpt_test_verify(path));
    char *flipped = ckpt_test_flip_value_byte(path, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(flipped);
    char named[300];
    snprintf(named, sizeof named, "tensor '%s'", flipped);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_IO, named, "shard-00001.h5", "corrupt");
    FSDP_TEST_FAILS(ckpt_test_verify(path), FSDP_ERR_IO, named, "shard-00001.h5", "corrupt");
    /* A piece dataset of the right shape and type that was never written (HDF5 would read
     * zeros): refused, naming the tensor. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    char *unwritten = unwrite_first_piece(path, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(unwritten);
    snprintf(named, sizeof named, "tensor '%s'", unwritten);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_IO, named, "not all in its file");
    FSDP_TEST_FAILS(ckpt_test_verify(path), FSDP_ERR_IO, named, "not all in its file");
    free(unwritten);
    free(flipped);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* Sets the integer attribute `name` of an HDF5 file (the file stays otherwise as it was). */
static void set_attr_i64(const char *file, const char *name, int64_t v) {
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
}

/* Rewrites the names table of metadata `file` with the first name in place of the second.
 * Returns that name (malloc'ed). */
static char *duplicate_first_name(const char *file) {
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "names", H5P_DEFAULT), space = H5Dget_space(ds);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, NULL);
    char *old = calloc(n + 1, 1), *names = calloc(2 * n + 1, 1);
    H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, old);
    H5Sclose(space);
    H5Dclose(ds);
    size_t first = strlen(old) + 1, second = strlen(old + first) + 1;
    memcpy(names, old, first);
    memcpy(names + first, old, first);
    memcpy(names + 2 * first, old + first + second, n - first - second);
    hsize_t len = n - second + first;
    CU_ASSERT(H5Ldelete(f, "names", H5P_DEFAULT) >= 0);
    space = H5Screate_simple(1, &len, NULL);
    ds = H5Dcreate2(f, "names", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, names) >= 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
    char *name = strdup(old);
    free(old);
    free(names);
    return name;
}

/* Metadata of a newer format, truncated or damaged: refused by fsdp_ckpt_open, naming the
 * file. */
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
    /* The trail has a hop per function the failure passed, the public call first, each with
     * its function, and the origin last (docs/comm.md, "Error trails"). */
    const char *trail = fsdp_last_error_trail(ctx), *origin = fsdp_last_error_origin(ctx);
    int hops = 0;
    for (const char *p = strstr(trail, " -> "); p; p = strstr(p + 4, " -> ")) hops++;
    CU_ASSERT_EQUAL(strncmp(trail, "src/ckpt/load.c:", 16), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(trail, " (fsdp_ckpt_open) -> src/ckpt/"));
    CU_ASSERT_TRUE(hops >= 2);
    CU_ASSERT_TRUE(strlen(origin) > 0 && strlen(trail) > strlen(origin) &&
                   strcmp(trail + strlen(trail) - strlen(origin), origin) == 0);
    if (hops < 2) fprintf(stderr, "\n  trail: %s\n", trail);
    /* Truncated: in its superblock, and halfway. */
    struct stat sb;
    snprintf(cmd, sizeof cmd, "%s.bak", file);
    CU_ASSERT_EQUAL_FATAL(stat(cmd, &sb), 0);
    long cut[2] = {100, (long)sb.st_size / 2};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "head -c %ld '%s.bak' > '%s'", cut[i], file, file);
        CU_ASSERT_EQUAL(system(cmd), 0);
        FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_IO, "metadata.h5");
        CU_ASSERT_PTR_NULL(ck);
        FSDP_TEST_FAILS(ckpt_test_verify(path), FSDP_ERR_IO, "metadata.h5");
    }
    /* A newer format version: the error names both versions and the fix. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    set_attr_i64(file, "format_version", FSDP_CKPT_FORMAT_VERSION + 1);
    char newer[32], ours[64];
    snprintf(newer, sizeof newer, "version %d", FSDP_CKPT_FORMAT_VERSION + 1);
    snprintf(ours, sizeof ours, "version %d this libfsdp (%s)", FSDP_CKPT_FORMAT_VERSION,
             FSDP_VERSION_STRING);
    FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_UNSUPPORTED, "metadata.h5", newer,
                    ours, "upgrade libfsdp");
    CU_ASSERT_PTR_NULL(ck);
    FSDP_TEST_FAILS(load_plain(path, OPT_ADAM), FSDP_ERR_UNSUPPORTED, newer, "upgrade libfsdp");
    /* Two tensors of one name. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    char *twice = duplicate_first_name(file);
    FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_IO, "metadata.h5", twice,
                    "two tensors");
    free(twice);
    /* A negative step count is named as what it is, with its own value (before: "step (2)"). */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    set_attr_i64(file, "optim_steps", -5);
    FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_IO, "metadata.h5",
                    "optim_steps is negative (-5)");
    set_attr_i64(file, "step", -3);
    FSDP_TEST_FAILS(fsdp_ckpt_open(ctx, path, &ck), FSDP_ERR_IO, "step is negative (-3)");
    /* Put back: it opens again. */
    snprintf(cmd, sizeof cmd, "cp '%s.bak' '%s'", file, file);
    CU_ASSERT_EQUAL(system(cmd), 0);
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    fsdp_ckpt_close(ck);
    ckpt_test_remove_tree(root);
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
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* ---- metadata that only one rank gets wrong ---- */

/* Each rank saves its own full MLP (step 1); rank `bad` gives an extra named "no spaces".
 * Every rank must fail alike (bad: the invalid argument, naming the extra; the others: an I/O
 * error naming rank `bad`), nothing is committed, and a right save (step 2) then works. */
typedef struct {
    const char *dir;
    int bad;
} one_bad_meta;

static fsdp_status one_bad_meta_rank(fsdp_ctx *ctx, int rank, void *user) {
    const one_bad_meta *c = user;
    fsdp_module *m = NULL;
    fsdp_state *st = NULL;
    fsdp_ckpt_writer *w = NULL;
    fsdp_status s = fsdp_model_mlp(ctx, 3, (int64_t[]){10, 16, 10}, FSDP_ACT_RELU, &m);
    if (s == FSDP_OK) s = fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st);
    if (s == FSDP_OK) s = fsdp_ckpt_writer_create(ctx, c->dir, NULL, &w);
    if (s != FSDP_OK) goto done;
    const char *names[] = {rank == c->bad ? "no spaces" : "seed"};
    const int64_t values[] = {7};
    fsdp_ckpt_meta meta = {.step = 1, .n_extras = 1, .extra_names = names, .extra_values = values};
    fsdp_status got = fsdp_ckpt_save(ctx, w, st, &meta);
    char want[64];
    snprintf(want, sizeof want, "rank %d could not prepare", c->bad);
    bool ok = rank == c->bad
                  ? got == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "'no spaces'")
                  : got == FSDP_ERR_IO && strstr(fsdp_last_error(ctx), want);
    if (!ok) {
        char said[512]; /* FSDP_FAIL writes the buffer fsdp_last_error reads */
        snprintf(said, sizeof said, "%s", fsdp_last_error(ctx));
        s = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the save gave %s, '%s'", fsdp_status_to_string(got),
                      said);
        goto done;
    }
    names[0] = "seed";
    meta.step = 2;
    s = fsdp_ckpt_save(ctx, w, st, &meta);
done:
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(st);
    fsdp_module_free(m);
    return s;
}

static void test_meta_bad_on_one_rank(void) {
    char *root = ckpt_test_tmp_root();
    char dir[600], path[700];
    for (int bad = 0; bad < 2; bad++) {
        snprintf(dir, sizeof dir, "%s/bad%d", root, bad);
        one_bad_meta c = {.dir = dir, .bad = bad};
        FSDP_TEST_OK(fsdp_test_run_world(2, 0, one_bad_meta_rank, &c));
        snprintf(path, sizeof path, "%s/step-00000001", dir);
        CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
        char *latest = ckpt_test_latest(dir);
        CU_ASSERT_PTR_NOT_NULL_FATAL(latest);
        CU_ASSERT_PTR_NOT_NULL(strstr(latest, "step-00000002"));
        FSDP_TEST_OK(ckpt_test_verify(latest));
        free(latest);
    }
    ckpt_test_remove_tree(root);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"flat_range_boxes", test_flat_range_boxes},
        {"subtract_and_copy", test_subtract_and_copy},
        {"reshard_matrix", test_reshard_matrix},
        {"resume_sgd_momentum", test_resume_sgd_momentum},
        {"async_and_keep", test_async_and_keep},
        {"leftovers_removed", test_leftovers_removed},
        {"bad_checkpoints", test_bad_checkpoints},
        {"bad_metadata", test_bad_metadata},
        {"mismatch_and_load_value", test_mismatch_and_load_value},
        {"meta_bad_on_one_rank", test_meta_bad_on_one_rank},
    };
    return fsdp_test_run(argc, argv, "ckpt", cases, sizeof cases / sizeof cases[0]);
}
