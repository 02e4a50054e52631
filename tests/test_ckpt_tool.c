/* test_ckpt_tool.c: the fsdp-ckpt tool on checkpoints of a small MLP saved at a 2x2 layout:
 * inspect lists every tensor with its shape; verify passes, and names the tensor of a flipped
 * byte; diff finds no difference with itself and one with more training; export to .h5 (read
 * back by h5dump when installed) and to .safetensors (parsed here) holds fsdp_ckpt_read's
 * values; output that cannot be written (a full disk, a missing directory, stdout on
 * /dev/full) fails the command; an option whose value is forgotten is refused. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup, popen, symlink */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_common.h"
#include "harness.h"
#include "shell.h" // defines: fsdp_test_shell

/* ---- saving a checkpoint at 2x2 (dp 2 FULL_SHARD with nested units, tp 2) ---- */

static const ckpt_layout layout_2x2 = {
    "2x2 FULL_SHARD", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true};

/* Trains `steps` at 2x2 and saves into root/name; returns the checkpoint's path (malloc'ed). */
static char *save_2x2(const char *root, const char *name, int64_t steps, bool raw) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    FSDP_TEST_OK(raw ? ckpt_test_run_raw(&layout_2x2, dir, steps)
                     : ckpt_test_run_job(&layout_2x2, OPT_ADAM, NULL, dir, 0, steps));
    return ckpt_test_latest(dir);
}

/* ---- running the tool ---- */

/* Runs `fsdp-ckpt ARGS` (stdout and stderr together into *out, malloc'ed); returns the exit
 * status. */
static int tool(char **out, const char *fmt, ...) {
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", FSDP_CKPT_EXE, args);
    return fsdp_test_shell(cmd, out);
}

/* The line of text that starts with `name` followed by a space. */
static const char *line_of(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, name, n) && l[n] == ' ') return l;
    return NULL;
}

/* Tensor t of ck read whole (f32), malloc'ed; *n receives its elements. */
static float *read_tensor(fsdp_ckpt *ck, int t, int64_t *n) {
    fsdp_ckpt_tensor x;
    FSDP_TEST_OK(fsdp_ckpt_tensor_get(fsdp_test_ctx(), ck, t, &x));
    fsdp_state_region all = {.ndim = x.ndim};
    *n = 1;
    for (int d = 0; d < x.ndim; d++) *n *= all.count[d] = x.shape[d];
    float *v = malloc((size_t)*n * 4 + 4);
    FSDP_TEST_OK(fsdp_ckpt_read(fsdp_test_ctx(), ck, t, &all, v));
    return v;
}

/* ---- the cases ---- */

/* inspect lists every tensor with its global shape, by checkpoint and by root directory. */
static void test_inspect(void) {
    char *root = ckpt_test_tmp_root(), *path = save_2x2(root, "c", 2, false), *out;
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    CU_ASSERT_EQUAL(tool(&out, "inspect '%s'", path), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "2x2 FULL_SHARD"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "saved world size: 4"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "model config:     -\n")); /* saved without one */
    for (int t = 0; t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        char shape[128] = "(";
        for (int d = 0; d < x.ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "",
                     (long long)x.shape[d]);
        strcat(shape, x.ndim == 1 ? ",)" : ")"); /* as Python writes a tuple */
        const char *line = line_of(out, x.name);
        CU_ASSERT_PTR_NOT_NULL(line);
        const char *end = line ? strchr(line, '\n') : NULL;
        const char *at = line ? strstr(line, shape) : NULL;
        CU_ASSERT_TRUE(at && (!end || at < end));
        if (!line || !at || (end && at > end))
            fprintf(stderr, "\n  %s %s not in:\n%s", x.name, shape, out);
    }
    free(out);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/c", root);
    CU_ASSERT_EQUAL(tool(&out, "inspect '%s'", dir), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "total:"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "inspect '%s/nothing'", root), 1);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "inspect"), 2);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "inspect --help"), 0);
    free(out);
    fsdp_ckpt_close(ck);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* verify passes on a good checkpoint; names the tensor of a flipped byte; refuses a checkpoint
 * without its commit marker. */
static void test_verify(void) {
    char *root = ckpt_test_tmp_root(), *path = save_2x2(root, "c", 2, true), *out;
    CU_ASSERT_EQUAL(tool(&out, "verify '%s'", path), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ok: "));
    free(out);
    char file[700], moved[700];
    snprintf(file, sizeof file, "%s/commit", path);
    snprintf(moved, sizeof moved, "%s/commit.moved", root);
    CU_ASSERT_EQUAL(rename(file, moved), 0);
    CU_ASSERT_EQUAL(tool(&out, "verify '%s'", path), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "commit"));
    free(out);
    CU_ASSERT_EQUAL(rename(moved, file), 0);
    char *flipped = ckpt_test_flip_value_byte(path, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(flipped);
    CU_ASSERT_EQUAL(tool(&out, "verify '%s'", path), 1);
    char want[300];
    snprintf(want, sizeof want, "tensor '%s'", flipped);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
    if (!strstr(out, want)) fprintf(stderr, "\n  no \"%s\" in:\n%s", want, out);
    free(out);
    free(flipped);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* diff: a checkpoint against itself is the same; against more training it differs, unless
 * the tolerance covers it. */
static void test_diff(void) {
    char *root = ckpt_test_tmp_root(), *a = save_2x2(root, "a", 2, false),
         *b = save_2x2(root, "b", 3, false);
    char *out;
    CU_ASSERT_EQUAL(tool(&out, "diff '%s' '%s'", a, a), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "same: 0 tensors differ"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "diff '%s' '%s'", a, b), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "DIFFERS"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "diff '%s' '%s' --atol 1e30", a, b), 0);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "diff '%s' '%s' --rtol x", a, b), 2);
    free(out);
    ckpt_test_remove_tree(root);
    free(a);
    free(b);
    free(root);
}

/* Parses h5dump's DATA block: the numbers after "DATA {", skipping "(i,j):" indices. */
static int64_t parse_h5dump(const char *text, float *out, int64_t max) {
    const char *p = strstr(text, "DATA {");
    if (!p) return -1;
    p += 6;
    int64_t n = 0;
    while (*p && *p != '}' && n < max) {
        if (*p == '(') {
            p = strchr(p, ')');
            if (!p) return -1;
            p += 2; /* "):" */
            continue;
        }
        char *end;
        double v = strtod(p, &end);
        if (end == p) {
            p++;
            continue;
        }
        out[n++] = (float)v;
        p = end;
    }
    return n;
}

/* export to .h5: h5dump reads the values fsdp_ckpt_read gives; optimizer state only with
 * --with-optim. */
static void test_export_h5(void) {
    char *root = ckpt_test_tmp_root(), *path = save_2x2(root, "c", 2, false), *out;
    char file[700], cmd[1600];
    snprintf(file, sizeof file, "%s/model.h5", root);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s'", path, file), 0);
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s.txt'", path, file), 2);
    free(out);
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), path, &ck));
    int t = fsdp_ckpt_find(ck, "layers.0.net1.weight");
    CU_ASSERT_TRUE_FATAL(t >= 0);
    int64_t n;
    float *want = read_tensor(ck, t, &n);
    if (system("h5dump --version > /dev/null 2>&1") != 0) {
        fprintf(stderr, "\n  h5dump not found: skipping the h5dump check of the export\n");
    } else {
        snprintf(cmd, sizeof cmd, "h5dump -m %%.9g -d /layers.0.net1.weight '%s'", file);
        CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 0);
        float *got = malloc((size_t)n * 4 + 4);
        CU_ASSERT_EQUAL(parse_h5dump(out, got, n), n);
        CU_ASSERT_EQUAL(memcmp(got, want, (size_t)n * 4), 0);
        free(got);
        free(out);
        snprintf(cmd, sizeof cmd, "h5dump -n '%s'", file);
        CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 0);
        CU_ASSERT_PTR_NULL(strstr(out, "exp_avg"));
        free(out);
        snprintf(file, sizeof file, "%s/all.h5", root);
        CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s' --with-optim", path, file), 0);
        free(out);
        snprintf(cmd, sizeof cmd, "h5dump -n '%s'", file);
        CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "/optim/layers.0.net1.weight/exp_avg"));
        free(out);
    }
    free(want);
    fsdp_ckpt_close(ck);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* export to .safetensors: the header names every parameter with offsets that tile the data,
 * and a tensor's bytes are fsdp_ckpt_read's. */
static void test_export_safetensors(void) {
    char *root = ckpt_test_tmp_root(), *path = save_2x2(root, "c", 2, false), *out;
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", root);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s'", path, file), 0);
    free(out);
    FILE *f = fopen(file, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc((size_t)size + 1);
    CU_ASSERT_EQUAL_FATAL(fread(bytes, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    CU_ASSERT_TRUE_FATAL(hlen % 8 == 0 && 8 + hlen <= (uint64_t)size);
    char *header = strndup((const char *)bytes + 8, hlen);
    const unsigned char *data = bytes + 8 + hlen;
    CU_ASSERT_PTR_NULL(strstr(header, "exp_avg"));
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), path, &ck));
    int64_t total = 0;
    for (int t = 0; t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(fsdp_test_ctx(), ck, t, &x);
        if (x.kind == FSDP_STATE_OPTIM) continue;
        char key[300];
        snprintf(key, sizeof key, "\"%s\":", x.name);
        const char *at = strstr(header, key);
        CU_ASSERT_PTR_NOT_NULL(at);
        const char *offs = at ? strstr(at, "\"data_offsets\":[") : NULL;
        long long b = -1, e = -1;
        CU_ASSERT_TRUE(offs && sscanf(offs, "\"data_offsets\":[%lld,%lld]", &b, &e) == 2);
        int64_t n;
        float *want = read_tensor(ck, t, &n);
        CU_ASSERT_EQUAL(e - b, n * 4);
        CU_ASSERT_TRUE(e <= size - 8 - (long long)hlen);
        if (b >= 0 && e - b == n * 4 && e <= size - 8 - (long long)hlen)
            CU_ASSERT_EQUAL(memcmp(data + b, want, (size_t)n * 4), 0);
        total += n * 4;
        free(want);
    }
    CU_ASSERT_EQUAL(total, size - 8 - (long)hlen); /* the ranges tile the data */
    fsdp_ckpt_close(ck);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s' --compress zstd", path, file), 2);
    free(out);
    /* --format: hf needs a model configuration (this MLP was saved without one) */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/hf", root);
    CU_ASSERT_EQUAL(tool(&out, "export --format hf '%s' --out '%s'", path, dir), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "no model configuration"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--format safetensors"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "export --format hf '%s' --out '%s' --with-optim", path, dir), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "drop --with-optim"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "export --format onnx '%s' --out '%s'", path, dir), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--format is hf, h5 or safetensors"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "export --format h5 '%s' --out '%s'", path, file), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "contradicts"));
    free(out);
    free(header);
    free(bytes);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* Output that cannot be written fails the command (exit 1) naming what, and a partial export
 * is removed only when it is a regular file: an export to /dev/full (through a link with the
 * suffix the command wants), into a path under a regular file or past a file size limit, and
 * stdout on /dev/full for every command. /dev/full is left as it was. */
static void test_output_errors(void) {
    struct stat sb;
    if (stat("/dev/full", &sb) != 0 || !S_ISCHR(sb.st_mode)) {
        printf("\n    skipped: no /dev/full");
        return;
    }
    char *root = ckpt_test_tmp_root(), *path = save_2x2(root, "c", 1, false), *out;
    char file[700], cmd[2000];
    static const char *const suffixes[] = {"h5", "safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(file, sizeof file, "%s/full.%s", root, suffixes[i]);
        CU_ASSERT_EQUAL_FATAL(symlink("/dev/full", file), 0);
        CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s'", path, file), 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "full."));
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "fsdp-ckpt export:"));
        free(out);
        CU_ASSERT_TRUE(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode));
    }
    snprintf(file, sizeof file, "%s/plain", root); /* a regular file where a directory goes */
    FILE *f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s/x.h5'", path, file), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "plain/x.h5"));
    free(out);
    CU_ASSERT_EQUAL(tool(&out, "export '%s' --out '%s/x.safetensors'", path, file), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "plain/x.safetensors"));
    free(out);
    /* A disk that fills during the export (a file size limit: EFBIG, as a full disk gives
     * ENOSPC): exit 1 with the reason and no HDF5 text; before, HDF5's exit handler crashed on
     * the file it could not close (signal 11). No leak report under AddressSanitizer: HDF5
     * never frees that file. */
    snprintf(cmd, sizeof cmd,
             "ulimit -f 2; trap '' XFSZ; ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" exec "
             "'%s' export '%s' --out '%s/limited.h5' 2>&1",
             FSDP_CKPT_EXE, path, root);
    CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "File too large"));
    CU_ASSERT_PTR_NULL(strstr(out, "0x"));
    printf("\n    %s", out);
    free(out);
    static const char *const commands[] = {"inspect '%s'", "verify '%s'", "diff '%s' '%s'",
                                           "export '%s' --out '%s/m.h5'", "--help"};
    for (int i = 0; i < 5; i++) {
        char args[1600];
        snprintf(args, sizeof args, commands[i], path, i == 3 ? root : path);
        snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/full", FSDP_CKPT_EXE, args);
        CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "cannot write"));
        if (!strstr(out, "cannot write")) fprintf(stderr, "\n  %s said: %s", args, out);
        free(out);
    }
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
}

/* An option's value in the next argument that is an option ("--..." or "-h": a forgotten
 * value) is refused before anything runs: exit 2, the option and the argument named, and the
 * command's usage (before, getopt_long took it as the value: an import into a directory "-h").
 * --name=VALUE takes any value. */
static void test_option_values(void) {
    char *root = ckpt_test_tmp_root(), *out;
    static const struct {
        const char *args, *want;
    } refused[] = {
        {"import '%s/none.safetensors' --out -h",
         "import: --out needs a value, got the option '-h'"},
        {"export '%s/none' --out --with-optim",
         "export: --out needs a value, got the option '--with-optim'; to give a value that "
         "starts with '-', write --out=--with-optim"},
        {"diff '%s/a' '%s/a' --rtol --atol 1",
         "diff: --rtol needs a value, got the option '--atol'"},
        {"generate '%s/none' --prompt --ids",
         "generate: --prompt needs a value, got the option '--ids'"},
        {"eval '%s/none' '%s/t' --batch --seq 4",
         "eval: --batch needs a value, got the option '--seq'"},
    };
    for (int i = 0; i < (int)(sizeof refused / sizeof refused[0]); i++) {
        char args[1600];
        snprintf(args, sizeof args, refused[i].args, root, root);
        CU_ASSERT_EQUAL(tool(&out, "%s", args), 2);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, refused[i].want));
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "usage: fsdp-ckpt "));
        if (!strstr(out, refused[i].want)) fprintf(stderr, "\n  %s said: %s", args, out);
        free(out);
    }
    /* --out=--x.h5 is taken as the file: the command goes on to the missing checkpoint */
    CU_ASSERT_EQUAL(tool(&out, "export '%s/none' --out=--x.h5", root), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "is neither a checkpoint"));
    free(out);
    ckpt_test_remove_tree(root);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"inspect", test_inspect},
        {"verify", test_verify},
        {"diff", test_diff},
        {"export_h5", test_export_h5},
        {"export_safetensors", test_export_safetensors},
        {"output_errors", test_output_errors},
        {"option_values", test_option_values},
    };
    return fsdp_test_run(argc, argv, "ckpt_tool", cases, sizeof cases / sizeof cases[0]);
}
