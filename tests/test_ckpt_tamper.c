/* test_ckpt_tamper.c: a checkpoint that cannot load wrong values. Each case damages a saved
 * checkpoint in a way that the chunk checksums do not see, and checks that loading and verify
 * (the library's and `fsdp-ckpt verify`) refuse it naming the file, the problem and the fix: a
 * piece's element type with one bit flipped (byte order) or another exponent bias; a chunk
 * stored shorter than its size, or with its checksum filter skipped; a shard or a metadata.h5
 * from another save of the same run; optim_steps changed; values edited with their checksums
 * recomputed (the piece digests tell, and the failed load changes no value of the state); a
 * FIFO in place of a shard (refused before it is opened: the case cannot hang). A checkpoint of
 * format 1 (before the binding) still loads. Also the digest (XXH64) against the reference's
 * values, and a piece read in slabs of any size. */
#define _POSIX_C_SOURCE 200809L /* mkfifo, strdup, alarm */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "ckpt/bind.h"   // defines: ckpt_digest_init, ckpt_digest_values, ckpt_digest_final
#include "ckpt/h5.h"     // defines: h5_create, h5_write, h5_read_rows
#include "ckpt/region.h" // defines: region_numel, region_intersect, region_equal
#include "ckpt_common.h"
#include "harness.h"
#include "shell.h" // defines: fsdp_test_shell

static const ckpt_layout layout_2x2 = {
    "2x2 FULL_SHARD", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true};
static const ckpt_layout layout_1x1 = {"1x1 plain", 1, 1, MODE_PLAIN, 0, 1, false, false, false};

/* ---- saving and checking ---- */

/* Trains 2 steps at 2x2 with Adam, uncompressed, saving after each (keep 2)
 * into root/c: *step1 and *step2 (malloc'ed) are the two checkpoints. */
static void save_two(char **root, char **step1, char **step2) {
    *root = ckpt_test_tmp_root();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", *root);
    ckpt_job jb = {
        .each_step = true, .raw = true, .l = &layout_2x2, .opt = OPT_ADAM, .save = dir, .steps = 2};
    FSDP_TEST_OK(ckpt_test_run(&jb));
    *step1 = malloc(700);
    snprintf(*step1, 700, "%s/step-00000001", dir);
    *step2 = ckpt_test_latest(dir);
}

static void done(char *root, char *step1, char *step2) {
    ckpt_test_remove_tree(root);
    free(root);
    free(step1);
    free(step2);
}

/* Loads path at 1x1 with Adam. */
static fsdp_status load_1x1(const char *path) {
    return ckpt_test_run_job(&layout_1x1, OPT_ADAM, path, NULL, 2, 0);
}

/* `fsdp-ckpt verify PATH`: its exit status; *out receives stdout and stderr
 * (malloc'ed). */
static int tool_verify(const char *path, char **out) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' 2>&1", FSDP_CKPT_EXE, path);
    return fsdp_test_shell(cmd, out);
}

/* Asserts that load, the library's verify and the tool's verify all fail with
 * status `want` and messages naming every needle. */
#define REFUSED(path, want, ...)                                                                   \
    do {                                                                                           \
        FSDP_TEST_FAILS(load_1x1(path), want, __VA_ARGS__);                                        \
        FSDP_TEST_FAILS(ckpt_test_verify(path), want, __VA_ARGS__);                                \
        char *out_;                                                                                \
        CU_ASSERT_EQUAL(tool_verify(path, &out_), 1);                                              \
        const char *needles_[] = {__VA_ARGS__, NULL};                                              \
        CU_ASSERT_TRUE(fsdp_test_message_has(out_, needles_));                                     \
        if (!fsdp_test_message_has(out_, needles_)) fprintf(stderr, "\n  verify said:\n%s", out_); \
        free(out_);                                                                                \
    } while (0)

static void copy_file(const char *from, const char *to) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
}

/* ---- rewriting a piece's dataset with HDF5 ---- */

/* The dataset "<tensor>/<id>" of the first piece that file rank 1 holds with at
 * least 4 elements (into ds), its tensor's name (malloc'ed, returned) and the
 * shard's path. */
static char *first_piece(const char *path, char *ds, size_t ds_size, char *file, size_t f_size) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    if (fsdp_ckpt_open(ctx, path, &ck) != FSDP_OK) return NULL;
    char *name = NULL;
    for (int t = 0; !name && t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        for (int k = 0; !name && k < x.n_pieces; k++) {
            fsdp_ckpt_piece p;
            fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            int64_t n = 1;
            for (int d = 0; d < p.region.ndim; d++) n *= p.region.count[d];
            if (p.file_rank != 1 || n < 4) continue;
            snprintf(ds, ds_size, "%s/%d", x.name, p.id);
            name = strdup(x.name);
        }
    }
    fsdp_ckpt_close(ck);
    snprintf(file, f_size, "%s/shard-00001.h5", path);
    return name;
}

/* Replaces the dataset of first_piece with one of element type `type` whose
 * stored bytes are the same (same shape, chunks and filters): only the type
 * description differs. Returns the tensor's name (malloc'ed). */
static char *retype_piece(const char *path, hid_t type) {
    char ds[400], file[700];
    char *name = first_piece(path, ds, sizeof ds, file, sizeof file);
    CU_ASSERT_PTR_NOT_NULL_FATAL(name);
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    hid_t space = H5Dget_space(d), dcpl = H5Dget_create_plist(d), old = H5Dget_type(d);
    hssize_t n = H5Sget_simple_extent_npoints(space);
    size_t size = H5Tget_size(old);
    void *bytes = malloc((size_t)n * size);
    CU_ASSERT(H5Dread(d, old, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes) >= 0);
    H5Dclose(d);
    CU_ASSERT(H5Ldelete(f, ds, H5P_DEFAULT) >= 0);
    d = H5Dcreate2(f, ds, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    CU_ASSERT(d >= 0 && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes) >= 0);
    H5Dclose(d);
    H5Tclose(old);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
    free(bytes);
    return name;
}

/* Writes chunk 0 of first_piece's dataset directly: `bytes` bytes of `data`,
 * with the filters of filter_mask marked as not applied. Returns the tensor's
 * name (malloc'ed); *chunk_bytes receives the size of a chunk. */
static char *write_chunk0(const char *path, unsigned filter_mask, size_t bytes, const void *data,
                          size_t *chunk_bytes) {
    char ds[400], file[700];
    char *name = first_piece(path, ds, sizeof ds, file, sizeof file);
    CU_ASSERT_PTR_NOT_NULL_FATAL(name);
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT), dcpl = H5Dget_create_plist(d);
    hsize_t chunk[8] = {0}, offset[8] = {0};
    int nd = H5Pget_chunk(dcpl, 8, chunk);
    CU_ASSERT_FATAL(nd >= 1);
    *chunk_bytes = 4;
    for (int i = 0; i < nd; i++) *chunk_bytes *= chunk[i];
    if (data) CU_ASSERT(H5Dwrite_chunk(d, H5P_DEFAULT, filter_mask, offset, bytes, data) >= 0);
    H5Pclose(dcpl);
    H5Dclose(d);
    H5Fclose(f);
    return name;
}

/* Adds 1 to the first value of the first piece of tensor `name` (in any shard), writing it
 * back through HDF5 with the dataset's own type and filters: its chunk checksums are
 * recomputed, so only the digest in metadata.h5 tells. Returns the shard's rank. */
static int edit_values(const char *path, const char *name) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    int t = fsdp_ckpt_find(ck, name);
    CU_ASSERT_TRUE_FATAL(t >= 0);
    fsdp_ckpt_piece p;
    FSDP_TEST_OK(fsdp_ckpt_piece_get(ctx, ck, t, 0, &p));
    fsdp_ckpt_close(ck);
    char ds[400], file[700];
    snprintf(ds, sizeof ds, "%s/%d", name, p.id);
    snprintf(file, sizeof file, "%s/shard-%05d.h5", path, p.file_rank);
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT), space = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(space);
    float *v = malloc((size_t)n * 4);
    CU_ASSERT(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    v[0] += 1.0f;
    CU_ASSERT(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    free(v);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
    return p.file_rank;
}

/* ---- the cases ---- */

/* XXH64 (seed 0) as the reference implementation gives it, fed whole and in pieces. */
static void test_digest_vectors(void) {
    static const struct {
        const char *text;
        uint64_t want;
    } known[] = {{"", 0xef46db3751d8e999ULL},
                 {"a", 0xd24ec4f1a98c6e5bULL},
                 {"abc", 0x44bc2cf5ad770999ULL},
                 {"Nobody inspects the spammish repetition", 0xfbcea83c8a378bf1ULL}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        ckpt_digest d;
        ckpt_digest_init(&d);
        ckpt_digest_values(&d, known[i].text, strlen(known[i].text), 1);
        CU_ASSERT_EQUAL(ckpt_digest_final(&d), known[i].want);
    }
    unsigned char bytes[1000];
    for (int i = 0; i < 1000; i++) bytes[i] = (unsigned char)(i % 251);
    for (size_t cut = 0; cut <= 1000; cut += 37) {
        ckpt_digest d;
        ckpt_digest_init(&d);
        ckpt_digest_values(&d, bytes, cut, 1);
        ckpt_digest_values(&d, bytes + cut, 1000 - cut, 1);
        CU_ASSERT_EQUAL(ckpt_digest_final(&d), 0xf306f04aa88b54d3ULL);
    }
}

/* What h5_read_rows hands over: the values in order, each slab a box inside the piece. */
typedef struct rows_seen {
    float got[60];
    int64_t n;
    fsdp_state_region stored;
    bool inside;
} rows_seen;

static fsdp_status take_rows(fsdp_ctx *ctx, const fsdp_state_region *slab, const void *values,
                             void *user) {
    rows_seen *r = user;
    int64_t n = region_numel(slab);
    fsdp_state_region cut;
    r->inside &= region_intersect(slab, &r->stored, &cut) && region_equal(&cut, slab);
    if (r->n + n <= 60) memcpy(r->got + r->n, values, (size_t)n * 4);
    r->n += n;
    (void)ctx;
    return FSDP_OK;
}

/* A piece read in slabs of any budget (one element, a row, rows, blocks, all of it) gives its
 * values in row-major order, each slab a box inside the piece; a scalar piece is one slab. */
static void test_read_rows_slabs(void) {
    char *root = ckpt_test_tmp_root(), file[700];
    snprintf(file, sizeof file, "%s/rows.h5", root);
    fsdp_ctx *ctx = fsdp_test_ctx();
    float v[60];
    for (int i = 0; i < 60; i++) v[i] = (float)i;
    fsdp_state_region stored = {.ndim = 3, .offset = {1, 2, 3}, .count = {3, 4, 5}};
    hid_t f;
    CU_ASSERT_EQUAL(h5_lock(NULL), FSDP_OK); /* no world: waits as long as it takes */
    FSDP_TEST_OK(h5_create(ctx, file, &f));
    FSDP_TEST_OK(h5_write(ctx, f, "p", FSDP_DTYPE_F32, 3, stored.count, v, 1));
    static const size_t budgets[] = {1, 4, 8, 20, 24, 80, 96, 240, 100000};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        rows_seen r = {.stored = stored, .inside = true};
        FSDP_TEST_OK(h5_read_rows(ctx, f, "p", FSDP_DTYPE_F32, &stored, budgets[b], take_rows, &r));
        CU_ASSERT_EQUAL(r.n, 60);
        CU_ASSERT_TRUE(r.inside);
        CU_ASSERT_EQUAL(memcmp(r.got, v, sizeof v), 0);
    }
    fsdp_state_region scalar = {.ndim = 0};
    FSDP_TEST_OK(h5_write(ctx, f, "s", FSDP_DTYPE_F32, 0, NULL, v + 7, 1));
    rows_seen r = {.stored = scalar, .inside = true};
    FSDP_TEST_OK(h5_read_rows(ctx, f, "s", FSDP_DTYPE_F32, &scalar, 4, take_rows, &r));
    CU_ASSERT_TRUE(r.n == 1 && r.got[0] == 7.0f);
    H5Fclose(f);
    h5_unlock();
    ckpt_test_remove_tree(root);
    free(root);
}

/* Values edited in a shard, with the chunk checksums recomputed: the piece's digest tells. */
static void test_values_edited(void) {
    char *root, *s1, *s2, named[300];
    save_two(&root, &s1, &s2);
    int rank = edit_values(s2, "layers.1.net2.weight");
    char shard[32];
    snprintf(shard, sizeof shard, "shard-%05d.h5", rank);
    snprintf(named, sizeof named, "tensor 'layers.1.net2.weight' in %s", shard);
    REFUSED(s2, FSDP_ERR_IO, named, "holds other values than its save wrote", "same save");
    done(root, s1, s2);
}

/* A load that fails on a damaged piece changes no value of the state: every piece it reads is
 * checked before the first value is written. */
static fsdp_status load_into_fresh(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    fsdp_module *m = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_state *st = NULL;
    fsdp_ckpt *ck = NULL;
    float *before = NULL, *after = NULL;
    int64_t total = 0;
    fsdp_status s = fsdp_model_mlp_stacked(ctx, 2, &m);
    if (s == FSDP_OK) s = fsdp_module_reset_parameters(ctx, m, 5);
    if (s == FSDP_OK) s = fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-2}, &opt);
    if (s == FSDP_OK)
        s = fsdp_state_create(ctx, &(fsdp_state_sources){.model = m, .optimizer = opt}, &st);
    for (int i = 0; s == FSDP_OK && i < fsdp_state_num_entries(st); i++) {
        fsdp_state_entry e;
        s = fsdp_state_entry_get(ctx, st, i, &e);
        int64_t n = 1;
        for (int d = 0; d < e.ndim; d++) n *= e.shape[d];
        total += n;
    }
    before = calloc((size_t)total + 1, 4), after = calloc((size_t)total + 1, 4);
    for (int pass = 0; s == FSDP_OK && pass < 2; pass++) {
        if (pass == 1) {
            s = fsdp_ckpt_open(ctx, user, &ck);
            fsdp_status l = s == FSDP_OK ? fsdp_ckpt_load(ctx, ck, st, NULL) : s;
            CU_ASSERT_EQUAL(l, FSDP_ERR_IO);
            CU_ASSERT_PTR_NOT_NULL(strstr(fsdp_last_error(ctx), "holds other values"));
        }
        float *at = pass ? after : before;
        for (int i = 0; s == FSDP_OK && i < fsdp_state_num_entries(st); i++) {
            fsdp_state_entry e;
            s = fsdp_state_entry_get(ctx, st, i, &e);
            if (s == FSDP_OK) s = fsdp_state_read_region(ctx, st, i, 0, at); /* one region at 1x1 */
            int64_t n = 1;
            for (int d = 0; d < e.ndim; d++) n *= e.shape[d];
            at += n;
        }
    }
    CU_ASSERT_EQUAL(memcmp(before, after, (size_t)total * 4), 0);
    CU_ASSERT_TRUE(fsdp_ckpt_optim_steps(ck) > 0 && fsdp_state_steps(st) == 0);
    free(before), free(after);
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    return s;
}

static void test_failed_load_changes_nothing(void) {
    char *root, *s1, *s2;
    save_two(&root, &s1, &s2);
    /* the state's last entry: every other one would be loaded before it */
    edit_values(s2, "optim/layers.1.net2.bias/exp_avg_sq");
    FSDP_TEST_OK(fsdp_test_run_world(1, 0, load_into_fresh, s2));
    done(root, s1, s2);
}

/* One bit of a piece's type description flipped (little- to big-endian f32):
 * the stored bytes and their checksums are as saved, but HDF5 would convert
 * every value. */
static void test_type_bit_flip(void) {
    char *root, *s1, *s2;
    save_two(&root, &s1, &s2);
    FSDP_TEST_OK(load_1x1(s2));
    hid_t be = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_order(be, H5T_ORDER_BE);
    char *name = retype_piece(s2, be);
    H5Tclose(be);
    char named[300];
    snprintf(named, sizeof named, "tensor '%s'", name);
    REFUSED(s2, FSDP_ERR_IO, named, "shard-00001.h5", "element type", "big-endian");
    free(name);
    done(root, s1, s2);
}

/* A crafted exponent bias (126 instead of 127) would double every value of the
 * piece. */
static void test_exponent_bias(void) {
    char *root, *s1, *s2;
    save_two(&root, &s1, &s2);
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_ebias(t, 126);
    char *name = retype_piece(s2, t);
    H5Tclose(t);
    char named[300];
    snprintf(named, sizeof named, "tensor '%s'", name);
    REFUSED(s2, FSDP_ERR_IO, named, "shard-00001.h5", "element type", "bias 126");
    free(name);
    done(root, s1, s2);
}

/* A chunk stored shorter than its size (its checksum filter marked as skipped):
 * HDF5 would copy a whole chunk out of the shorter buffer. And a whole chunk
 * with its checksum skipped: nothing would check its values. */
static void test_short_chunk(void) {
    char *root, *s1, *s2;
    save_two(&root, &s1, &s2);
    char shard[700], backup[800];
    snprintf(shard, sizeof shard, "%s/shard-00001.h5", s2);
    snprintf(backup, sizeof backup, "%s.bak", shard);
    copy_file(shard, backup);
    size_t chunk_bytes;
    free(write_chunk0(s2, 0, 0, NULL, &chunk_bytes));
    unsigned char *junk = calloc(chunk_bytes, 1);
    memset(junk, 0x41, chunk_bytes);
    char *name = write_chunk0(s2, 1u, chunk_bytes / 2, junk, &chunk_bytes);
    char named[300];
    snprintf(named, sizeof named, "tensor '%s'", name);
    REFUSED(s2, FSDP_ERR_IO, named, "shard-00001.h5", "chunk", "stored in");
    free(name);
    copy_file(backup, shard);
    name = write_chunk0(s2, 1u, chunk_bytes, junk, &chunk_bytes);
    REFUSED(s2, FSDP_ERR_IO, named, "shard-00001.h5", "chunk", "checksum");
    free(name);
    free(junk);
    done(root, s1, s2);
}

/* A shard of step 1 in the directory of step 2 (the same run, layout and
 * pieces). */
static void test_shard_from_other_step(void) {
    char *root, *s1, *s2, from[700], to[700];
    save_two(&root, &s1, &s2);
    snprintf(from, sizeof from, "%s/shard-00001.h5", s1);
    snprintf(to, sizeof to, "%s/shard-00001.h5", s2);
    copy_file(from, to);
    REFUSED(s2, FSDP_ERR_IO, "shard-00001.h5", "belongs to another checkpoint",
            "mixes files of two saves");
    done(root, s1, s2);
}

/* A metadata.h5 of step 1 in the directory of step 2. */
static void test_metadata_from_other_step(void) {
    char *root, *s1, *s2, from[700], to[700];
    save_two(&root, &s1, &s2);
    snprintf(from, sizeof from, "%s/metadata.h5", s1);
    snprintf(to, sizeof to, "%s/metadata.h5", s2);
    copy_file(from, to);
    REFUSED(s2, FSDP_ERR_IO, "shard-0000", "belongs to another checkpoint",
            "mixes files of two saves");
    done(root, s1, s2);
}

/* Sets the integer attribute `name` of an HDF5 file. */
static void set_attr_i64(const char *file, const char *name, int64_t v) {
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
}

/* Adam's step count changed in metadata.h5 (bias correction would be off on
 * resume). */
static void test_optim_steps(void) {
    char *root, *s1, *s2, file[700];
    save_two(&root, &s1, &s2);
    snprintf(file, sizeof file, "%s/metadata.h5", s2);
    set_attr_i64(file, "optim_steps", 1000);
    REFUSED(s2, FSDP_ERR_IO, "metadata.h5", "optim_steps");
    done(root, s1, s2);
}

/* A FIFO in place of a shard file: refused before it is opened (opening would
 * wait for a writer forever; the alarm ends the test instead). */
static void test_fifo_shard(void) {
    char *root, *s1, *s2, file[700];
    save_two(&root, &s1, &s2);
    snprintf(file, sizeof file, "%s/shard-00001.h5", s2);
    CU_ASSERT_EQUAL_FATAL(unlink(file), 0);
    CU_ASSERT_EQUAL_FATAL(mkfifo(file, 0600), 0);
    alarm(120);
    REFUSED(s2, FSDP_ERR_IO, "shard-00001.h5", "not a regular file");
    snprintf(file, sizeof file, "%s/metadata.h5", s2);
    CU_ASSERT_EQUAL_FATAL(unlink(file), 0);
    CU_ASSERT_EQUAL_FATAL(mkfifo(file, 0600), 0);
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_FAILS(fsdp_ckpt_open(fsdp_test_ctx(), s2, &ck), FSDP_ERR_IO, "metadata.h5",
                    "not a regular file");
    /* A FIFO as the state dict to import. */
    char out[800];
    snprintf(out, sizeof out, "%s/imported", root);
    FSDP_TEST_FAILS(fsdp_ckpt_import(fsdp_test_ctx(), file, out, NULL), FSDP_ERR_IO, "metadata.h5",
                    "not a regular file (a FIFO)");
    alarm(0);
    done(root, s1, s2);
}

/* Deletes attribute `attr` of object `obj` of `file` and the links `links`
 * (NULL-ended). */
static void strip(const char *file, const char *obj, const char *attr, ...) {
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    CU_ASSERT(H5Adelete_by_name(f, obj, attr, H5P_DEFAULT) >= 0);
    va_list ap;
    va_start(ap, attr);
    for (const char *l; (l = va_arg(ap, const char *));)
        CU_ASSERT(H5Ldelete(f, l, H5P_DEFAULT) >= 0);
    va_end(ap);
    H5Fclose(f);
}

/* A checkpoint of format 1 (no checkpoint id, header or digests) still loads
 * and verifies, with the same values. */
static void test_format_1_loads(void) {
    char *root, *s1, *s2, file[800], copy[700], cmd[1600];
    save_two(&root, &s1, &s2);
    snprintf(copy, sizeof copy, "%s/old", root);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", s2, copy);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    snprintf(file, sizeof file, "%s/metadata.h5", copy);
    strip(file, ".", "checkpoint_id", "header", "piece_digests", (const char *)NULL);
    set_attr_i64(file, "format_version", 1);
    for (int r = 0; r < 4; r++) {
        snprintf(file, sizeof file, "%s/shard-%05d.h5", copy, r);
        strip(file, ".", "checkpoint_id", (const char *)NULL);
        strip(file, ".", "rank", (const char *)NULL);
    }
    FSDP_TEST_OK(load_1x1(copy));
    FSDP_TEST_OK(ckpt_test_verify(copy));
    CU_ASSERT_TRUE(ckpt_test_same(copy, s2, -1, 0, "format 1"));
    char *out;
    CU_ASSERT_EQUAL(tool_verify(copy, &out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "format 1"));
    free(out);
    done(root, s1, s2);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"type_bit_flip", test_type_bit_flip},
        {"exponent_bias", test_exponent_bias},
        {"short_chunk", test_short_chunk},
        {"shard_from_other_step", test_shard_from_other_step},
        {"metadata_from_other_step", test_metadata_from_other_step},
        {"optim_steps", test_optim_steps},
        {"fifo_shard", test_fifo_shard},
        {"format_1_loads", test_format_1_loads},
        {"digest_vectors", test_digest_vectors},
        {"read_rows_slabs", test_read_rows_slabs},
        {"values_edited", test_values_edited},
        {"failed_load_changes_nothing", test_failed_load_changes_nothing},
    };
    return fsdp_test_run(argc, argv, "ckpt_tamper", cases, sizeof cases / sizeof cases[0]);
}
