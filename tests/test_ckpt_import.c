/* test_ckpt_import.c: PyTorch state dicts imported as checkpoints (fsdp_ckpt_import and
 * `fsdp-ckpt import`), against references PyTorch made (tools/gen_import_fixture.py): the
 * safetensors and the h5py file import to the same values, verify clean and load at 1x1 and
 * at dp 2 x tp 2 with FSDP; the model's output then matches torch's, and 3 steps of SGD or
 * Adam end at torch's parameters; an export of the trained checkpoint imports back to the same
 * bits; examples/finetune_ckpt trained from an import ends at torch's parameters too; F64,
 * F16 and BF16 convert as torch converts them; damaged or hostile files fail with
 * a message naming the file, the tensor and the problem, and commit nothing. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup, popen */
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_common.h"
#include "fixture.h"
#include "harness.h"
#include "numerics.h" // defines: fsdp_test_adam_check
#include "shell.h"    // defines: fsdp_test_shell

#define FIX(name) FSDP_FIXTURE_DIR "/" name

static const ckpt_layout layout_1x1 = {"1x1", 1,     1,     MODE_PLAIN, FSDP_FULL_SHARD,
                                       1,     false, false, false};
static const ckpt_layout layout_2x2 = {
    "2x2 FULL_SHARD", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true};

static const char *const mlp_params[] = {
    "layers.0.net1.weight", "layers.0.net1.bias", "layers.0.net2.weight", "layers.0.net2.bias",
    "layers.1.net1.weight", "layers.1.net1.bias", "layers.1.net2.weight", "layers.1.net2.bias"};
#define N_PARAMS 8

/* ---- helpers ---- */

/* Imports src into root/name (options o, may be NULL); returns the checkpoint's path. */
static char *import_to(const char *src, const char *root, const char *name,
                       const fsdp_ckpt_import_options *o) {
    char dir[700], *path = malloc(800);
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    FSDP_TEST_OK(fsdp_ckpt_import(fsdp_test_ctx(), src, dir, o));
    snprintf(path, 800, "%s/step-%08lld", dir, (long long)(o ? o->step : 0));
    return path;
}

/* Tensor `name` of the checkpoint at path read whole (malloc'ed, its dtype's bytes); *x
 * receives its description. */
static void *read_named(const char *path, const char *name, fsdp_ckpt_tensor *x) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    int t = fsdp_ckpt_find(ck, name);
    CU_ASSERT_TRUE_FATAL(t >= 0);
    FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ck, t, x));
    fsdp_state_region all = {.ndim = x->ndim};
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) n *= all.count[d] = x->shape[d];
    void *v = malloc((size_t)n * fsdp_dtype_size(x->dtype) + 4);
    FSDP_TEST_OK(fsdp_ckpt_read(ctx, ck, t, &all, v));
    x->name = NULL; /* owned by ck */
    fsdp_ckpt_close(ck);
    return v;
}

static int64_t numel_of(const fsdp_ckpt_tensor *x) {
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d];
    return n;
}

/* Every tensor of a has the same shape, dtype and bits in b, and both have as many. */
static void assert_same(const char *a, const char *b) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ca, *cb;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, a, &ca));
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, b, &cb));
    CU_ASSERT_EQUAL(fsdp_ckpt_num_tensors(ca), fsdp_ckpt_num_tensors(cb));
    for (int t = 0; t < fsdp_ckpt_num_tensors(ca); t++) {
        fsdp_ckpt_tensor x, y;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ca, t, &x));
        char name[FSDP_STATE_NAME_MAX];
        snprintf(name, sizeof name, "%s", x.name);
        void *va = read_named(a, name, &x), *vb = read_named(b, name, &y);
        CU_ASSERT_EQUAL(x.dtype, y.dtype);
        CU_ASSERT_EQUAL(x.ndim, y.ndim);
        CU_ASSERT_EQUAL(memcmp(x.shape, y.shape, sizeof x.shape), 0);
        bool same = !memcmp(va, vb, (size_t)numel_of(&x) * fsdp_dtype_size(x.dtype));
        CU_ASSERT_TRUE(same);
        if (!same) fprintf(stderr, "\n  '%s' differs between %s and %s\n", name, a, b);
        free(va);
        free(vb);
    }
    fsdp_ckpt_close(ca);
    fsdp_ckpt_close(cb);
}

/* Runs `fsdp-ckpt ARGS` (stdout and stderr into *out, malloc'ed); returns the exit status. */
static int tool(char **out, const char *fmt, ...) {
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", FSDP_CKPT_EXE, args);
    return fsdp_test_shell(cmd, out);
}

/* ---- importing ---- */

/* Both files import (library and tool) to the same 8 parameters, which verify clean; the
 * options set the step and the storage. */
static void test_import_verify(void) {
    char *root = ckpt_test_tmp_root(), *out;
    char *st = import_to(FIX("import_mlp.safetensors"), root, "st", NULL);
    fsdp_ckpt_import_options o = {.step = 7, .zstd_level = FSDP_CKPT_NO_COMPRESSION};
    char *h5 = import_to(FIX("import_mlp.h5"), root, "h5", &o);
    CU_ASSERT_PTR_NOT_NULL(strstr(h5, "step-00000007"));
    assert_same(st, h5);
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), st, &ck));
    CU_ASSERT_EQUAL(fsdp_ckpt_num_tensors(ck), N_PARAMS);
    CU_ASSERT_EQUAL(fsdp_ckpt_step(ck), 0);
    CU_ASSERT_EQUAL(fsdp_ckpt_optim_steps(ck), 0);
    CU_ASSERT_EQUAL(fsdp_ckpt_world_size(ck), 1);
    for (int i = 0; i < N_PARAMS; i++) {
        int t = fsdp_ckpt_find(ck, mlp_params[i]);
        CU_ASSERT_TRUE(t >= 0);
        fsdp_ckpt_tensor x;
        if (t >= 0) FSDP_TEST_OK(fsdp_ckpt_tensor_get(fsdp_test_ctx(), ck, t, &x));
        if (t >= 0) CU_ASSERT_TRUE(x.dtype == FSDP_DTYPE_F32 && x.n_pieces == 1);
    }
    fsdp_ckpt_close(ck);
    CU_ASSERT_EQUAL(tool(&out, "verify '%s'", st), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ok: 8 tensors"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "verify '%s'", h5), 0);
    free(out);
    /* the tool: the same checkpoint; usage errors exit 2; a bad file exits 1 */
    CU_ASSERT_EQUAL(tool(&out, "import '%s' --out '%s/tool' --step 3 --compress none",
                         FIX("import_mlp.h5"), root),
                    0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "step-00000003: 8 tensors"));
    free(out);
    char tool_path[800];
    snprintf(tool_path, sizeof tool_path, "%s/tool/step-00000003", root);
    assert_same(tool_path, h5);
    CU_ASSERT_EQUAL(tool(&out, "import --help"), 0);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "import '%s'", FIX("import_mlp.h5")), 2);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "import '%s' --out '%s/x' --step -1", FIX("import_mlp.h5"), root),
                    2);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "import '%s' --out '%s/x' --dtype f16", FIX("import_mlp.h5"), root),
                    2);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "import '%s' --out '%s/x'", FIX("import_mlp.bin"), root), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "import_mlp.bin' is not a valid safetensors file"));
    free(out);
    ckpt_test_remove_tree(root);
    free(st);
    free(h5);
    free(root);
}

/* ---- training from an import, against torch ---- */

/* Imports src, loads it at layout l, runs 3 steps of opt on the fixture's batch, saves to
 * root/name: the output before the first step matches torch's, and the saved parameters match
 * torch's after 3 steps. Returns the trained checkpoint's path.
 * Bounds: the forward and SGD's parameters within rtol 1e-5 + atol 1e-6 (values of order 1;
 * MLPStacked(2)'s sums have at most 16 terms, reordered against torch's: a few u; seen at most
 * 0.043 of the bound). Adam's parameters by the statistical rule of tests/numerics.h: within
 * 16 x the 0.99 quantile of libfsdp's own rounding noise (the same 3 steps at 1x1 from the
 * import nudged by one ulp), at most 4 elements beyond, each within twice Adam's largest move
 * in 3 steps of lr 1e-2; MLPStacked(2) has 692 parameters, as few as SimpleMLP's 1896
 * (tests/dp_common.h). */
#define NOISE_Q        0.99
#define NOISE_K        16.0
#define MAX_EXCEPTIONS 4
static char *train_against_torch(const char *src, const ckpt_layout *l, ckpt_optim opt,
                                 const char *root, const char *name) {
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("import_mlp", &fx), 0);
    const fixture_tensor *x = fixture_require(&fx, "x", FIXTURE_F32),
                         *y = fixture_require(&fx, "y", FIXTURE_F32),
                         *want = fixture_require(&fx, "out", FIXTURE_F32);
    CU_ASSERT_TRUE_FATAL(x && y && want && x->numel == CKPT_TEST_BATCH * CKPT_TEST_DIM);
    char init[300], saved[700];
    snprintf(init, sizeof init, "%s-init", name);
    char *imported = import_to(src, root, init, NULL);
    snprintf(saved, sizeof saved, "%s/%s", root, name);
    float out[CKPT_TEST_BATCH * CKPT_TEST_DIM];
    ckpt_job jb = {.l = l,
                   .opt = opt,
                   .load = imported,
                   .save = saved,
                   .steps = 3,
                   .load_model_only = true,
                   .fixed_x = x->data,
                   .fixed_y = y->data,
                   .forward_out = out};
    FSDP_TEST_OK(ckpt_test_run(&jb));
    fprintf(stderr, "\n  [%s, %s]\n", l->name, opt == OPT_SGD ? "SGD" : "Adam");
    FSDP_TEST_CLOSE("  forward", out, want->data, want->numel, 1e-5, 1e-6);
    char *path = ckpt_test_latest(saved);
    fsdp_test_adam_check rule = {.max_exceptions = MAX_EXCEPTIONS,
                                 .move = 2.0 * CKPT_LR * fsdp_test_adam_max_move(0.9, 0.999, 3)};
    if (opt == OPT_ADAM) {
        /* libfsdp's own rounding noise: the same 3 steps at 1x1 from the import, and again
         * from the import nudged by one ulp */
        char plain[720], nudged[720];
        snprintf(plain, sizeof plain, "%s-1x1", saved);
        snprintf(nudged, sizeof nudged, "%s-nudged", saved);
        ckpt_job pj = jb;
        pj.l = &layout_1x1, pj.save = plain, pj.forward_out = NULL;
        if (l != &layout_1x1) FSDP_TEST_OK(ckpt_test_run(&pj));
        pj.save = nudged, pj.nudge = true;
        FSDP_TEST_OK(ckpt_test_run(&pj));
        char *pp = l == &layout_1x1 ? NULL : ckpt_test_latest(plain),
             *pn = ckpt_test_latest(nudged);
        double noise = ckpt_test_param_noise(pp ? pp : path, pn, NOISE_Q);
        rule.bulk = NOISE_K * noise;
        fprintf(stderr, "    libfsdp's rounding noise (quantile %g of |run - nudged|): %.3g\n",
                NOISE_Q, noise);
        CU_ASSERT_TRUE(noise > 0);
        free(pp);
        free(pn);
    }
    for (int i = 0; i < N_PARAMS; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s.%s", opt == OPT_SGD ? "sgd" : "adam", mlp_params[i]);
        const fixture_tensor *ref = fixture_require(&fx, key, FIXTURE_F32);
        fsdp_ckpt_tensor t;
        float *got = read_named(path, mlp_params[i], &t);
        CU_ASSERT_TRUE_FATAL(ref && numel_of(&t) == ref->numel);
        if (opt == OPT_SGD) {
            FSDP_TEST_CLOSE(key, got, ref->data, ref->numel, 1e-5, 1e-6);
        } else {
            fsdp_test_adam_add(&rule, key, got, ref->data, ref->numel);
        }
        free(got);
    }
    char why[256];
    if (opt == OPT_ADAM) {
        bool ok = fsdp_test_adam_ok(&rule, why, sizeof why);
        fprintf(stderr,
                "    Adam's parameters: max abs diff %.3g (%.2g x the bound), %lld elements "
                "beyond it%s%s\n",
                rule.max_abs, rule.max_abs / rule.bulk, (long long)rule.exceptions, ok ? "" : ": ",
                ok ? "" : why);
        CU_ASSERT_TRUE(ok);
    }
    free(imported);
    fixture_free(&fx);
    return path;
}

static void test_train_1x1(void) {
    char *root = ckpt_test_tmp_root();
    free(train_against_torch(FIX("import_mlp.safetensors"), &layout_1x1, OPT_SGD, root, "sgd"));
    free(train_against_torch(FIX("import_mlp.h5"), &layout_1x1, OPT_ADAM, root, "adam"));
    ckpt_test_remove_tree(root);
    free(root);
}

static void test_train_2x2(void) {
    char *root = ckpt_test_tmp_root();
    free(train_against_torch(FIX("import_mlp.h5"), &layout_2x2, OPT_SGD, root, "sgd"));
    free(train_against_torch(FIX("import_mlp.safetensors"), &layout_2x2, OPT_ADAM, root, "adam"));
    ckpt_test_remove_tree(root);
    free(root);
}

/* Trained at 2x2, exported to .safetensors and .h5 by fsdp-ckpt: each imports back to the
 * trained parameters, bit for bit. */
static void test_export_roundtrip(void) {
    char *root = ckpt_test_tmp_root(), *out;
    char *trained =
        train_against_torch(FIX("import_mlp.safetensors"), &layout_2x2, OPT_SGD, root, "t");
    char file[700];
    for (int k = 0; k < 2; k++) {
        snprintf(file, sizeof file, "%s/model.%s", root, k ? "h5" : "safetensors");
        CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s'", trained, file), 0);
        free(out);
        char *back = import_to(file, root, k ? "back-h5" : "back-st", NULL);
        fsdp_ckpt *ck;
        FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), back, &ck));
        CU_ASSERT_EQUAL(fsdp_ckpt_num_tensors(ck), N_PARAMS);
        fsdp_ckpt_close(ck);
        for (int i = 0; i < N_PARAMS; i++) {
            fsdp_ckpt_tensor a, b;
            float *va = read_named(trained, mlp_params[i], &a),
                  *vb = read_named(back, mlp_params[i], &b);
            CU_ASSERT_EQUAL(memcmp(a.shape, b.shape, sizeof a.shape), 0);
            CU_ASSERT_EQUAL(memcmp(va, vb, (size_t)numel_of(&a) * 4), 0);
            free(va);
            free(vb);
        }
        free(back);
    }
    free(trained);
    ckpt_test_remove_tree(root);
    free(root);
}

/* examples/finetune_ckpt from the imported model on the fixture's batch (a safetensors data
 * file), 3 SGD steps at 2x2, then exported and imported back: torch's parameters. */
static void test_finetune_example(void) {
    char *root = ckpt_test_tmp_root(), *out;
    char *init = import_to(FIX("import_mlp.h5"), root, "init", NULL);
    char cmd[2600], file[700], back[700];
    snprintf(cmd, sizeof cmd,
             "'%s' '%s' '%s' '%s/run' --steps 3 --lr 0.01 --momentum 0.9 --layout 2x2 2>&1",
             FSDP_FINETUNE_EXE, init, FIX("import_batch.safetensors"), root);
    CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "step   2  loss"));
    free(out);
    snprintf(file, sizeof file, "%s/trained.safetensors", root);
    CU_ASSERT_EQUAL(tool(&out, "export '%s/run' --out '%s'", root, file), 0);
    free(out);
    char *path = import_to(file, root, "back", NULL);
    snprintf(back, sizeof back, "%s", path);
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("import_mlp", &fx), 0);
    fprintf(stderr, "\n  [finetune_ckpt 2x2, SGD]\n");
    for (int i = 0; i < N_PARAMS; i++) {
        char key[64];
        snprintf(key, sizeof key, "sgd.%s", mlp_params[i]);
        const fixture_tensor *ref = fixture_require(&fx, key, FIXTURE_F32);
        fsdp_ckpt_tensor t;
        float *got = read_named(back, mlp_params[i], &t);
        CU_ASSERT_TRUE_FATAL(ref && numel_of(&t) == ref->numel);
        FSDP_TEST_CLOSE(key, got, ref->data, ref->numel, 1e-5, 1e-6);
        free(got);
    }
    fixture_free(&fx);
    free(path);
    free(init);
    ckpt_test_remove_tree(root);
    free(root);
}

/* ---- dtypes ---- */

static void write_file(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* A safetensors file: the header text, then `data_len` bytes of `data` (or a pattern). */
static void write_safetensors(const char *path, const char *header, const void *data,
                              size_t data_len) {
    size_t hlen = strlen(header);
    unsigned char *b = malloc(8 + hlen + data_len + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hlen + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)(i * 7 + 1);
    write_file(path, b, 8 + hlen + data_len);
    free(b);
}

/* F64, F16, BF16 and F32 (0-d) convert to f32 as torch's .to(torch.float32) does, from both
 * files; keeping dtypes keeps BF16 and refuses F64. */
static void test_dtypes(void) {
    char *root = ckpt_test_tmp_root();
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("import_mlp", &fx), 0);
    static const char *const names[] = {"a.f64", "b.f16", "c.bf16", "d.f32"};
    for (int k = 0; k < 2; k++) {
        char *path = import_to(k ? FIX("import_dtypes.h5") : FIX("import_dtypes.safetensors"), root,
                               k ? "h5" : "st", NULL);
        for (int i = 0; i < 4; i++) {
            char key[32];
            snprintf(key, sizeof key, "dt.%s", names[i]);
            const fixture_tensor *ref = fixture_require(&fx, key, FIXTURE_F32);
            fsdp_ckpt_tensor t;
            float *got = read_named(path, names[i], &t);
            CU_ASSERT_TRUE_FATAL(ref && t.dtype == FSDP_DTYPE_F32 && numel_of(&t) == ref->numel);
            CU_ASSERT_EQUAL(t.ndim, ref->ndim);
            bool same = !memcmp(got, ref->data, (size_t)ref->numel * 4);
            CU_ASSERT_TRUE(same);
            if (!same) fprintf(stderr, "\n  %s converted differently than torch\n", names[i]);
            free(got);
        }
        free(path);
    }
    fsdp_ckpt_import_options keep = {.dtype = FSDP_CKPT_IMPORT_KEEP};
    char dir[700];
    snprintf(dir, sizeof dir, "%s/keep", root);
    FSDP_TEST_FAILS(fsdp_ckpt_import(fsdp_test_ctx(), FIX("import_dtypes.safetensors"), dir, &keep),
                    FSDP_ERR_UNSUPPORTED, "import_dtypes.safetensors", "'a.f64'", "F64");
    char file[700];
    snprintf(file, sizeof file, "%s/bf16.safetensors", root);
    const uint16_t bits[3] = {0x3fc0, 0xc2f7, 0x0001};
    write_safetensors(file, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
                      bits, 6);
    char *path = import_to(file, root, "keep", &keep);
    fsdp_ckpt_tensor t;
    uint16_t *got = read_named(path, "w", &t);
    CU_ASSERT_EQUAL(t.dtype, FSDP_DTYPE_BF16);
    CU_ASSERT_EQUAL(memcmp(got, bits, 6), 0);
    free(got);
    free(path);
    fixture_free(&fx);
    ckpt_test_remove_tree(root);
    free(root);
}

/* ---- damaged and hostile files ---- */

/* Importing file into root/bad fails with `want`, naming each of the strings, and leaves
 * nothing committed nor any temporary directory. */
static void expect_refused(const char *root, const char *file, fsdp_status want,
                           const char *needle1, const char *needle2) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/bad", root);
    fsdp_status s = fsdp_ckpt_import(fsdp_test_ctx(), file, dir, NULL);
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    CU_ASSERT_EQUAL(s, want);
    const char *needles[] = {needle1, needle2, NULL};
    bool named = fsdp_test_message_has(msg, needles);
    CU_ASSERT_TRUE(named);
    if (s != want || !named)
        fprintf(stderr, "\n  %s: got %s: %s\n", file, fsdp_status_to_string(s), msg);
    char *latest = NULL;
    CU_ASSERT_NOT_EQUAL(fsdp_ckpt_latest(fsdp_test_ctx(), dir, &latest), FSDP_OK);
    free(latest);
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s/.step-00000000.tmp", dir);
    struct stat sb;
    CU_ASSERT_NOT_EQUAL(stat(tmp, &sb), 0);
}

#define ENTRY(name, dtype, shape, b, e)                                                            \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_bad_safetensors(void) {
    char *root = ckpt_test_tmp_root(), file[700];
    snprintf(file, sizeof file, "%s/bad.safetensors", root);
    /* the good file cut short: in the data, then in the header, then in the length */
    FILE *f = fopen(FIX("import_mlp.safetensors"), "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    unsigned char good[8192];
    size_t size = fread(good, 1, sizeof good, f);
    fclose(f);
    CU_ASSERT_TRUE_FATAL(size > 100 && size < sizeof good);
    write_file(file, good, size - 5);
    expect_refused(root, file, FSDP_ERR_IO, "bad.safetensors", "truncated");
    write_file(file, good, 60);
    expect_refused(root, file, FSDP_ERR_IO, "bad.safetensors", "header length");
    write_file(file, good, 5);
    expect_refused(root, file, FSDP_ERR_IO, "bad.safetensors", "8-byte header length");
    /* a header length beyond the file */
    unsigned char huge[40] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    write_file(file, huge, sizeof huge);
    expect_refused(root, file, FSDP_ERR_IO, "header length", "9223372036854775807");
    static const struct {
        const char *header;
        size_t data;
        fsdp_status want;
        const char *needle1, *needle2;
    } cases[] = {
        {"{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 4, 12) "}", 12,
         FSDP_ERR_IO, "tensor 'b'", "overlap tensor 'a'"},
        {"{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 8, 16) "}", 12,
         FSDP_ERR_IO, "tensor 'b'", "run past the end"},
        {"{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("b", "F32", "[1]", 8, 12) "}", 12,
         FSDP_ERR_IO, "[4, 8)", "belong to no tensor"},
        {"{" ENTRY("a", "F12", "[2]", 0, 8) "}", 8, FSDP_ERR_UNSUPPORTED, "tensor 'a'",
         "dtype \"F12\""},
        {"{" ENTRY("a", "F32", "[3]", 0, 8) "}", 8, FSDP_ERR_IO, "tensor 'a'",
         "holds 8 bytes but its shape and dtype F32 take 12"},
        {"{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("a", "F32", "[2]", 8, 16) "}", 16,
         FSDP_ERR_IO, "duplicate", "bad.safetensors"},
        {"{" ENTRY("steps", "I64", "[1]", 0, 8) "}", 8, FSDP_ERR_UNSUPPORTED, "tensor 'steps'",
         "I64"},
        {"{" ENTRY("a", "F32", "[1,1,1,1,1]", 0, 4) "}", 4, FSDP_ERR_UNSUPPORTED, "tensor 'a'",
         "5 dimensions"},
        {"{" ENTRY("a", "F32", "[-2]", 0, 8) "}", 8, FSDP_ERR_IO, "tensor 'a'", "dimension"},
        {"{" ENTRY("a", "F32", "[2]", 8, 0) "}", 8, FSDP_ERR_IO, "tensor 'a'", "data_offsets"},
        {"{" ENTRY("a", "F32", "[2]", 0, 8.0) "}", 8, FSDP_ERR_IO, "tensor 'a'", "data_offsets"},
        {"{" ENTRY("a/b", "F32", "[2]", 0, 8) "}", 8, FSDP_ERR_INVALID_ARGUMENT, "'a/b'",
         "not allowed"},
        {"{" ENTRY("a", "F32", "[2]", 0, 8) ",\"__metadata__\":[1]}", 8, FSDP_ERR_IO,
         "__metadata__", "bad.safetensors"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, FSDP_ERR_IO, "tensor 'a'", "data_offsets"},
        {"{\"a\": [1, 2", 8, FSDP_ERR_IO, "not valid JSON", "bad.safetensors"},
        {"[1]", 0, FSDP_ERR_IO, "start with '{'", "bad.safetensors"},
        {"{\"a\":1}  ", 0, FSDP_ERR_IO, "tensor 'a'", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_safetensors(file, cases[i].header, NULL, cases[i].data);
        expect_refused(root, file, cases[i].want, cases[i].needle1, cases[i].needle2);
    }
    snprintf(file, sizeof file, "%s/missing.safetensors", root);
    expect_refused(root, file, FSDP_ERR_IO, "cannot open", "missing.safetensors");
    /* a valid file with no tensor imports to an empty checkpoint */
    snprintf(file, sizeof file, "%s/empty.safetensors", root);
    write_safetensors(file, "{\"__metadata__\":{\"format\":\"pt\"}}", NULL, 0);
    free(import_to(file, root, "empty", NULL));
    ckpt_test_remove_tree(root);
    free(root);
}

/* An HDF5 file with one f32 dataset at each given path, and an int64 one at `int_path`. */
static void write_h5(const char *file, const char *const *paths, int n, const char *int_path) {
    hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_TRUE_FATAL(f >= 0);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hsize_t dims[1] = {2};
    hid_t space = H5Screate_simple(1, dims, NULL);
    float v[2] = {1.0f, 2.0f};
    int64_t iv[2] = {1, 2};
    for (int i = 0; i <= n; i++) {
        const char *p = i < n ? paths[i] : int_path;
        if (!p) continue;
        hid_t type = i < n ? H5T_IEEE_F32LE : H5T_STD_I64LE;
        hid_t ds = H5Dcreate2(f, p, type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        CU_ASSERT_TRUE_FATAL(ds >= 0);
        H5Dwrite(ds, i < n ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                 i < n ? (const void *)v : (const void *)iv);
        H5Dclose(ds);
    }
    H5Sclose(space);
    H5Pclose(lcpl);
    H5Fclose(f);
}

static void test_bad_h5(void) {
    char *root = ckpt_test_tmp_root(), file[700];
    snprintf(file, sizeof file, "%s/bad.h5", root);
    const char *dup[] = {"net.weight", "net/weight"};
    write_h5(file, dup, 2, NULL);
    expect_refused(root, file, FSDP_ERR_INVALID_ARGUMENT, "tensor 'net.weight'", "bad.h5");
    const char *ok[] = {"net.weight"};
    write_h5(file, ok, 1, "bn/num_batches_tracked");
    expect_refused(root, file, FSDP_ERR_UNSUPPORTED, "tensor 'bn.num_batches_tracked'", "int64");
    /* an HDF5 file cut short */
    write_h5(file, ok, 1, NULL);
    FILE *f = fopen(file, "rb");
    unsigned char head[1024];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    write_file(file, head, n / 2);
    expect_refused(root, file, FSDP_ERR_IO, "bad.h5", "cannot open");
    ckpt_test_remove_tree(root);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"import_verify", test_import_verify},
        {"train_1x1", test_train_1x1},
        {"train_2x2", test_train_2x2},
        {"export_roundtrip", test_export_roundtrip},
        {"finetune_example", test_finetune_example},
        {"dtypes", test_dtypes},
        {"bad_safetensors", test_bad_safetensors},
        {"bad_h5", test_bad_h5},
    };
    return fsdp_test_run(argc, argv, "ckpt_import", cases, sizeof cases / sizeof cases[0]);
}
