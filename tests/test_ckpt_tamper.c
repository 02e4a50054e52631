/* test_ckpt_tamper.c: a checkpoint that cannot load wrong values. Each case damages a saved
 * checkpoint in a way that the chunk checksums do not see, and checks that loading and verify
 * (the library's and `fsdp-ckpt verify`) refuse it naming the file, the problem and the fix: a
 * piece's element type with one bit flipped (byte order) or another exponent bias; a chunk
 * stored shorter than its size, or with its checksum filter skipped; a FIFO in place of a
 * shard (refused before it is opened: the case cannot hang). */
#define _POSIX_C_SOURCE 200809L /* mkfifo, strdup, alarm */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

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

/* ---- the cases ---- */

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

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"type_bit_flip", test_type_bit_flip},
        {"exponent_bias", test_exponent_bias},
        {"short_chunk", test_short_chunk},
        {"fifo_shard", test_fifo_shard},
    };
    return fsdp_test_run(argc, argv, "ckpt_tamper", cases, sizeof cases / sizeof cases[0]);
}
