/* fsdp_ckpt.c: fsdp-ckpt, the checkpoint tool: inspect (metadata and per-tensor sizes), verify
 * (read every piece, checking checksums), diff (two checkpoints, any layouts), export (one
 * unsharded .h5 or .safetensors file, or a Hugging Face model directory) and import (a PyTorch
 * state dict or a Hugging Face model directory as a checkpoint); generate and eval, which use a
 * trained Llama, are in ckpt_generate.c, the shared command-line pieces in ckpt_cli.c.
 * docs/checkpoint.md, "fsdp-ckpt".
 * Exit status: 0 success, 1 the command failed (or found a difference, or its output could not
 * be written), 2 bad command line. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_cli.h"      // defines: ckpt_parse_args, ckpt_open_arg, EXIT_OK, opt_spec
#include "ckpt_generate.h" // defines: ckpt_cmd_generate, ckpt_cmd_eval
#include "fsdp/fsdp.h"
#include "tool_exit.h" // defines: tool_exit_begin, tool_exit

/* ---- shared ---- */

static const char *const usage_main =
    "usage: fsdp-ckpt COMMAND [ARGS]\n"
    "       fsdp-ckpt --help | -h     (this help; COMMAND --help: the command's)\n"
    "\n"
    "Commands (each takes --help):\n"
    "  inspect DIR          metadata and the tensors with their stored sizes\n"
    "  verify DIR           read every piece, checking the checksums\n"
    "  diff A B             compare two checkpoints tensor by tensor (any layouts)\n"
    "  export DIR --out F   write one unsharded F.h5 or F.safetensors, or with --format hf\n"
    "                       a Hugging Face model directory F\n"
    "  import SRC --out D   a PyTorch state dict (.safetensors or .h5) or a Hugging Face model\n"
    "                       directory as a checkpoint in D\n"
    "  generate DIR --prompt TEXT\n"
    "                       continue a prompt with a Llama (greedy, or sampled with a seed)\n"
    "  eval DIR TOKENS      a Llama's loss and perplexity on a token file\n"
    "                       (both also on rank threads or under mpirun: --world N, --tp T)\n"
    "\n"
    "DIR is a checkpoint directory (step-XXXXXXXX) or a directory of checkpoints, whose newest\n"
    "committed one is taken. Options go before or after the arguments, as --name VALUE or\n"
    "--name=VALUE (or any unambiguous start of the name); \"--\" ends them.\n"
    "Exit status: 0 success, 1 failure (or a difference, or output that could not be\n"
    "written), 2 bad command line.\n";

static int64_t tensor_numel(const fsdp_ckpt_tensor *x) {
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d];
    return n;
}

/* Tensor t read whole into a malloc'ed buffer (NULL on failure, the message in ctx). */
static void *read_whole(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, const fsdp_ckpt_tensor *x) {
    fsdp_state_region all = {.ndim = x->ndim};
    for (int d = 0; d < x->ndim; d++) all.count[d] = x->shape[d];
    void *buf = malloc((size_t)tensor_numel(x) * fsdp_dtype_size(x->dtype) + 1);
    if (buf && fsdp_ckpt_read(ctx, ck, t, &all, buf) == FSDP_OK) return buf;
    free(buf);
    return NULL;
}

/* ---- inspect ---- */

static const char *const usage_inspect =
    "usage: fsdp-ckpt inspect DIR\n"
    "Prints the checkpoint's step, optimizer steps, saved world size, layout, library version\n"
    "and model configuration (a Llama's sizes, when one was saved), then one line per tensor:\n"
    "name, global shape, dtype, pieces, raw bytes, stored bytes (on disk, after compression)\n"
    "and their ratio, then the totals.\n";

static int cmd_inspect(fsdp_ctx *ctx, int argc, char **argv) {
    const char *dir = NULL;
    int parsed = ckpt_parse_dir("inspect", usage_inspect, argc, argv, &dir);
    if (parsed >= 0) return parsed;
    fsdp_ckpt *ck = ckpt_open_arg(ctx, "inspect", dir);
    if (!ck) return EXIT_FAILED;
    printf("step:             %lld\n", (long long)fsdp_ckpt_step(ck));
    printf("optimizer steps:  %lld\n", (long long)fsdp_ckpt_optim_steps(ck));
    printf("saved world size: %d\n", fsdp_ckpt_world_size(ck));
    printf("layout:           %s\n", *fsdp_ckpt_layout(ck) ? fsdp_ckpt_layout(ck) : "-");
    printf("library version:  %s\n", fsdp_ckpt_library_version(ck));
    const char *model = fsdp_ckpt_model_config(ck);
    fsdp_llama_config c;
    if (!*model)
        printf("model config:     -\n\n");
    else if (fsdp_llama_config_from_hf_json(ctx, model, &c) == FSDP_OK)
        printf("model config:     llama: hidden %lld, %d layers, %d/%d heads, ffn %lld, vocab %lld "
               "(export --format hf)\n\n",
               (long long)c.dim, c.n_layers, c.n_heads, c.n_kv_heads, (long long)c.ffn_hidden,
               (long long)c.vocab_size);
    else
        printf("model config:     %zu bytes of JSON, not a Llama libfsdp builds\n\n",
               strlen(model));
    int n = fsdp_ckpt_num_tensors(ck), width = 4;
    for (int t = 0; t < n; t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        int len = (int)strlen(x.name);
        width = len > width ? len : width;
    }
    printf("%-*s  %-16s %-5s %6s %12s %12s %6s\n", width, "name", "shape", "dtype", "pieces", "raw",
           "stored", "ratio");
    int64_t raw_total = 0, stored_total = 0, pieces = 0;
    int rc = EXIT_OK;
    for (int t = 0; t < n && rc == EXIT_OK; t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        int64_t raw = tensor_numel(&x) * (int64_t)fsdp_dtype_size(x.dtype), stored = 0;
        for (int k = 0; k < x.n_pieces && rc == EXIT_OK; k++) {
            int64_t b;
            if (fsdp_ckpt_piece_stored_bytes(ctx, ck, t, k, &b) != FSDP_OK) {
                fprintf(stderr, "fsdp-ckpt inspect: %s\n  run `fsdp-ckpt verify` on it\n",
                        fsdp_last_error(ctx));
                rc = EXIT_FAILED;
            }
            stored += b;
        }
        char shape[128];
        fsdp_shape_string(x.ndim, x.shape, shape, sizeof shape);
        printf("%-*s  %-16s %-5s %6d %12lld %12lld %6.2f\n", width, x.name, shape,
               fsdp_dtype_to_string(x.dtype), x.n_pieces, (long long)raw, (long long)stored,
               stored ? (double)raw / (double)stored : 0.0);
        raw_total += raw, stored_total += stored, pieces += x.n_pieces;
    }
    if (rc == EXIT_OK)
        printf("\ntotal: %d tensors, %lld pieces, %lld raw bytes, %lld stored bytes, ratio %.2f\n",
               n, (long long)pieces, (long long)raw_total, (long long)stored_total,
               stored_total ? (double)raw_total / (double)stored_total : 0.0);
    fsdp_ckpt_close(ck);
    return rc;
}

/* ---- verify ---- */

static const char *const usage_verify =
    "usage: fsdp-ckpt verify DIR\n"
    "Checks the metadata and that the pieces tile every tensor (as loading does), that every\n"
    "shard file belongs to this checkpoint (its id and rank), then reads every piece in full:\n"
    "each chunk's type, size, Fletcher32 checksum and zstd frame, and the values against the\n"
    "digest metadata.h5 records. Prints \"ok: N tensors, M pieces, B bytes verified\", or\n"
    "names each failing shard and tensor and exits 1. A directory without its commit marker\n"
    "(an interrupted save) fails. A checkpoint of format 1 has no ids or digests to check:\n"
    "the line says so.\n";

/* Every shard file bound to the checkpoint; bad[r] set for each that is not. */
static int verify_shards(fsdp_ctx *ctx, fsdp_ckpt *ck, bool *bad) {
    int n = 0;
    for (int r = 0; r < fsdp_ckpt_world_size(ck); r++)
        if ((bad[r] = fsdp_ckpt_check_shard(ctx, ck, r) != FSDP_OK)) {
            fprintf(stderr, "fsdp-ckpt verify: shard-%05d.h5: %s\n", r, fsdp_last_error(ctx));
            n++;
        }
    return n;
}

static int cmd_verify(fsdp_ctx *ctx, int argc, char **argv) {
    const char *dir = NULL;
    int parsed = ckpt_parse_dir("verify", usage_verify, argc, argv, &dir);
    if (parsed >= 0) return parsed;
    fsdp_ckpt *ck = ckpt_open_arg(ctx, "verify", dir);
    if (!ck) return EXIT_FAILED;
    bool *bad_shard = calloc((size_t)fsdp_ckpt_world_size(ck) + 1, 1);
    if (!bad_shard) return fsdp_ckpt_close(ck), fprintf(stderr, "out of memory\n"), EXIT_FAILED;
    int n = fsdp_ckpt_num_tensors(ck), bad = 0, bad_files = verify_shards(ctx, ck, bad_shard);
    int64_t pieces = 0, bytes = 0;
    for (int t = 0; t < n; t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, ck, t, &x);
        for (int k = 0; k < x.n_pieces; k++) {
            fsdp_ckpt_piece p;
            fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            if (bad_shard[p.file_rank]) { /* named above */
                bad++;
                break;
            }
            int64_t numel = 1;
            for (int d = 0; d < p.region.ndim; d++) numel *= p.region.count[d];
            size_t size = (size_t)numel * fsdp_dtype_size(x.dtype);
            void *buf = malloc(size + 1);
            if (!buf || fsdp_ckpt_read(ctx, ck, t, &p.region, buf) != FSDP_OK) {
                fprintf(stderr, "fsdp-ckpt verify: tensor '%s', piece %d (shard-%05d.h5): %s\n",
                        x.name, k, p.file_rank, buf ? fsdp_last_error(ctx) : "out of memory");
                bad++;
                free(buf);
                break;
            }
            free(buf);
            pieces++, bytes += (int64_t)size;
        }
    }
    int version = fsdp_ckpt_format_version(ck);
    fsdp_ckpt_close(ck);
    free(bad_shard);
    if (bad || bad_files) {
        fprintf(stderr,
                "fsdp-ckpt verify: %d of %d tensors and %d shard files failed; the checkpoint is "
                "damaged or mixes files of two saves: restore the files named above from the "
                "same save, or resume from an earlier checkpoint\n",
                bad, n, bad_files);
        return EXIT_FAILED;
    }
    printf("ok: %d tensors, %lld pieces, %lld bytes verified%s\n", n, (long long)pieces,
           (long long)bytes,
           version < 2 ? " (format 1: no checkpoint id or digests to check; save it again to "
                         "write format 2)"
                       : ", every shard bound to metadata.h5, every value matching its digest");
    return EXIT_OK;
}

/* ---- diff ---- */

static const char *const usage_diff =
    "usage: fsdp-ckpt diff A B [--rtol R] [--atol T]\n"
    "Compares every tensor of A and B (whole global tensors, so any two layouts): prints the\n"
    "max absolute and max relative difference per tensor, and the tensors only one side has.\n"
    "An element differs when |a - b| > atol + rtol * |b|; with both 0 (the default) any bit\n"
    "differs. Exit 1 when a tensor differs, has another shape or dtype, or is missing.\n";

static float value_at(const void *buf, fsdp_dtype dtype, int64_t i) {
    if (dtype == FSDP_DTYPE_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return ((const float *)buf)[i];
}

typedef struct diff_result {
    double max_abs, max_rel;
    int64_t n_bad;
} diff_result;

static diff_result compare(const void *a, const void *b, fsdp_dtype dtype, int64_t n, double rtol,
                           double atol) {
    diff_result r = {0};
    size_t size = fsdp_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++) {
        if (!memcmp((const char *)a + i * (int64_t)size, (const char *)b + i * (int64_t)size, size))
            continue;
        double va = value_at(a, dtype, i), vb = value_at(b, dtype, i), d = fabs(va - vb);
        double rel = vb != 0.0 ? d / fabs(vb) : (d != 0.0 ? INFINITY : 0.0);
        if (isnan(d)) d = rel = INFINITY;
        r.max_abs = fmax(r.max_abs, d), r.max_rel = fmax(r.max_rel, rel);
        bool bitwise = rtol == 0.0 && atol == 0.0;
        if (bitwise || !(d <= atol + rtol * fabs(vb))) r.n_bad++;
    }
    return r;
}

/* One tensor of a against b; returns whether it matches. */
static bool diff_tensor(fsdp_ctx *ctx, fsdp_ckpt *a, fsdp_ckpt *b, int t, int width, double rtol,
                        double atol, bool *io_error) {
    fsdp_ckpt_tensor x, y;
    fsdp_ckpt_tensor_get(ctx, a, t, &x);
    int u = fsdp_ckpt_find(b, x.name);
    if (u < 0) return printf("%-*s  only in A\n", width, x.name), false;
    fsdp_ckpt_tensor_get(ctx, b, u, &y);
    char sa[128], sb[128];
    fsdp_shape_string(x.ndim, x.shape, sa, sizeof sa);
    fsdp_shape_string(y.ndim, y.shape, sb, sizeof sb);
    if (strcmp(sa, sb) || x.dtype != y.dtype) {
        printf("%-*s  differs: %s %s in A, %s %s in B\n", width, x.name, sa,
               fsdp_dtype_to_string(x.dtype), sb, fsdp_dtype_to_string(y.dtype));
        return false;
    }
    void *va = read_whole(ctx, a, t, &x), *vb = va ? read_whole(ctx, b, u, &y) : NULL;
    if (!vb) {
        fprintf(stderr, "fsdp-ckpt diff: %s\n  run `fsdp-ckpt verify` on both\n",
                fsdp_last_error(ctx));
        free(va);
        *io_error = true;
        return false;
    }
    diff_result r = compare(va, vb, x.dtype, tensor_numel(&x), rtol, atol);
    free(va);
    free(vb);
    printf("%-*s  %12.6g %12.6g  %s\n", width, x.name, r.max_abs, r.max_rel,
           r.n_bad ? "DIFFERS" : "ok");
    return r.n_bad == 0;
}

static bool parse_tol(const char *flag, const char *v, double *out) {
    char *end;
    *out = strtod(v, &end);
    if (*v && !*end && *out >= 0.0 && isfinite(*out)) return true;
    fprintf(stderr, "fsdp-ckpt diff: %s wants a number >= 0, e.g. %s 1e-6\n%s", flag, flag,
            usage_diff);
    return false;
}

static int cmd_diff(fsdp_ctx *ctx, int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *rtol_arg = "0", *atol_arg = "0";
    const opt_spec specs[] = {{.name = "rtol", .value = &rtol_arg},
                              {.name = "atol", .value = &atol_arg}};
    int parsed = ckpt_parse_args("diff", usage_diff, argc, argv, specs, COUNT(specs), pos, 2);
    if (parsed >= 0) return parsed;
    double rtol, atol;
    if (!parse_tol("--rtol", rtol_arg, &rtol) || !parse_tol("--atol", atol_arg, &atol))
        return EXIT_USAGE;
    const char *pa = pos[0], *pb = pos[1];
    if (!pb) return ckpt_usage_error("diff", usage_diff, "needs A and B");
    fsdp_ckpt *a = ckpt_open_arg(ctx, "diff", pa), *b = a ? ckpt_open_arg(ctx, "diff", pb) : NULL;
    if (!b) return fsdp_ckpt_close(a), EXIT_FAILED;
    int width = 4, differ = 0, missing = 0;
    bool io_error = false;
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < fsdp_ckpt_num_tensors(pass ? b : a); t++) {
            fsdp_ckpt_tensor x;
            fsdp_ckpt_tensor_get(ctx, pass ? b : a, t, &x);
            int len = (int)strlen(x.name);
            width = len > width ? len : width;
        }
    printf("%-*s  %12s %12s\n", width, "name", "max abs", "max rel");
    for (int t = 0; t < fsdp_ckpt_num_tensors(a) && !io_error; t++) {
        fsdp_ckpt_tensor x;
        fsdp_ckpt_tensor_get(ctx, a, t, &x);
        bool in_b = fsdp_ckpt_find(b, x.name) >= 0;
        if (!diff_tensor(ctx, a, b, t, width, rtol, atol, &io_error))
            *(in_b ? &differ : &missing) += 1;
    }
    for (int t = 0; t < fsdp_ckpt_num_tensors(b) && !io_error; t++) {
        fsdp_ckpt_tensor y;
        fsdp_ckpt_tensor_get(ctx, b, t, &y);
        if (fsdp_ckpt_find(a, y.name) < 0) printf("%-*s  only in B\n", width, y.name), missing++;
    }
    fsdp_ckpt_close(a);
    fsdp_ckpt_close(b);
    if (io_error) return EXIT_FAILED;
    printf("\n%s: %d tensors differ, %d in one checkpoint only (rtol %g, atol %g)\n",
           differ || missing ? "different" : "same", differ, missing, rtol, atol);
    return differ || missing ? EXIT_FAILED : EXIT_OK;
}

/* ---- export ---- */

static const char *const usage_export =
    "usage: fsdp-ckpt export DIR --out FILE.h5|FILE.safetensors [--compress none|zstd]\n"
    "                        [--with-optim]\n"
    "       fsdp-ckpt export --format hf DIR --out OUTDIR\n"
    "Writes the checkpoint as one unsharded file, one tensor at a time: by default the\n"
    "parameters and buffers, named as PyTorch's model.state_dict() names them; --with-optim\n"
    "adds the optimizer state (optim/<param>/<kind>).\n"
    "  .h5           one dataset per tensor with its global shape ('/' in a name makes\n"
    "                groups); f32 as float32, bf16 as uint16 with attribute dtype=bf16;\n"
    "                --compress none (default) or zstd: filter 32015 (others need libh5zstd.so)\n"
    "  .safetensors  the safetensors format (F32, BF16); no compression\n"
    "--format hf writes a Hugging Face model directory OUTDIR (created when missing):\n"
    "config.json and model.safetensors, which transformers' LlamaForCausalLM.from_pretrained\n"
    "(OUTDIR) loads; for a byte-level model (vocabulary 256) also tokenizer.json and\n"
    "tokenizer_config.json, its byte tokenizer for AutoTokenizer.from_pretrained(OUTDIR).\n"
    "The checkpoint must be of a Llama model saved with its configuration\n"
    "(fsdp_ckpt_meta.model_config; imported Hugging Face directories have it). --format h5 or\n"
    "safetensors is the same as the --out suffix.\n";

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int cmd_export(fsdp_ctx *ctx, int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *compress = "none", *format = NULL;
    bool with_optim = false;
    const opt_spec specs[] = {{.name = "out", .value = &out},
                              {.name = "compress", .value = &compress},
                              {.name = "format", .value = &format},
                              {.name = "with-optim", .flag = &with_optim}};
    int parsed = ckpt_parse_args("export", usage_export, argc, argv, specs, COUNT(specs), &dir, 1);
    if (parsed >= 0) return parsed;
    bool hf = format && !strcmp(format, "hf");
    bool h5 = !hf && out && (ends_with(out, ".h5") || ends_with(out, ".hdf5"));
    bool st = !hf && out && ends_with(out, ".safetensors");
    bool zstd = !strcmp(compress, "zstd");
    const char *problem =
        !dir   ? "needs DIR"
        : !out ? (hf ? "needs --out OUTDIR" : "needs --out FILE")
        : format && !hf && strcmp(format, "h5") && strcmp(format, "safetensors")
            ? "--format is hf, h5 or safetensors"
        : !hf && !h5 && !st ? "--out must end in .h5 or .safetensors (or give --format hf)"
        : format && !hf && (h5 ? strcmp(format, "h5") : strcmp(format, "safetensors"))
            ? "--format contradicts the suffix of --out"
        : strcmp(compress, "none") && !zstd ? "--compress is none or zstd"
        : !h5 && zstd                       ? "safetensors has no compression: drop --compress zstd"
        : hf && with_optim ? "a Hugging Face model holds no optimizer state: drop --with-optim"
                           : NULL;
    if (problem) return ckpt_usage_error("export", usage_export, problem);
    fsdp_ckpt *ck = ckpt_open_arg(ctx, "export", dir);
    if (!ck) return EXIT_FAILED;
    fsdp_ckpt_export_options o = {.with_optim = with_optim, .zstd_level = zstd ? 3 : 0};
    fsdp_status s = hf   ? fsdp_ckpt_export_hf(ctx, ck, out, NULL)
                    : h5 ? fsdp_ckpt_export_h5(ctx, ck, out, &o)
                         : fsdp_ckpt_export_safetensors(ctx, ck, out, &o);
    fsdp_ckpt_close(ck);
    if (s != FSDP_OK) return fprintf(stderr, "fsdp-ckpt export: %s\n", fsdp_last_error(ctx)), 1;
    if (hf)
        printf("wrote %s/config.json and %s/model.safetensors%s\n", out, out,
               ckpt_file_exists(out, "tokenizer.json") ? " and the byte tokenizer" : "");
    else
        printf("wrote %s\n", out);
    return EXIT_OK;
}

/* ---- import ---- */

static const char *const usage_import =
    "usage: fsdp-ckpt import SRC --out DIR [--step N] [--compress none|zstd] [--dtype f32|keep]\n"
    "Writes a PyTorch state dict as the checkpoint DIR/step-XXXXXXXX (N, default 0), one piece\n"
    "per tensor, that loads at any layout (fsdp-train, fsdp_ckpt_load) and that the other\n"
    "commands read. SRC is\n"
    "  .safetensors  safetensors.torch.save_file(model.state_dict(), SRC)\n"
    "  .h5           one dataset per tensor named by its state_dict key (h5py: f[k] =\n"
    "                v.numpy()); nested groups a/b/c name the tensor a.b.c\n"
    "  a directory   a Hugging Face model (save_pretrained): config.json and\n"
    "                model.safetensors, or the shards model.safetensors.index.json lists;\n"
    "                config.json is kept as the checkpoint's model configuration\n"
    "(a file's format is told by its content). --dtype f32 (default) keeps F32 and converts\n"
    "F16, BF16 and F64 to f32; --dtype keep keeps F32 and BF16 and refuses the others.\n"
    "Integer tensors are refused. --compress zstd (default) or none for the shard file.\n"
    "The checkpoint has no optimizer state: a run starting from it starts its optimizer anew.\n";

static int cmd_import(fsdp_ctx *ctx, int argc, char **argv) {
    const char *file = NULL, *out = NULL, *compress = "zstd", *dtype = "f32", *step = "0";
    const opt_spec specs[] = {{.name = "out", .value = &out},
                              {.name = "compress", .value = &compress},
                              {.name = "dtype", .value = &dtype},
                              {.name = "step", .value = &step}};
    int parsed = ckpt_parse_args("import", usage_import, argc, argv, specs, COUNT(specs), &file, 1);
    if (parsed >= 0) return parsed;
    char *end;
    long long n = strtoll(step, &end, 10);
    const char *problem =
        !file                                     ? "needs SRC"
        : !out                                    ? "needs --out DIR"
        : !*step || *end || n < 0 || n > 99999999 ? "--step wants a whole number in [0, 99999999]"
        : strcmp(compress, "none") && strcmp(compress, "zstd") ? "--compress is none or zstd"
        : strcmp(dtype, "f32") && strcmp(dtype, "keep")        ? "--dtype is f32 or keep"
                                                               : NULL;
    if (problem) return ckpt_usage_error("import", usage_import, problem);
    fsdp_ckpt_import_options o = {
        .step = n,
        .dtype = strcmp(dtype, "keep") ? FSDP_CKPT_IMPORT_TO_F32 : FSDP_CKPT_IMPORT_KEEP,
        .zstd_level = strcmp(compress, "none") ? 0 : FSDP_CKPT_NO_COMPRESSION};
    if (fsdp_ckpt_import(ctx, file, out, &o) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt import: %s\n", fsdp_last_error(ctx));
        return EXIT_FAILED;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/step-%08lld", out, n);
    fsdp_ckpt *ck = ckpt_open_arg(ctx, "import", path);
    if (!ck) return EXIT_FAILED;
    printf("wrote %s: %d tensors\n", path, fsdp_ckpt_num_tensors(ck));
    fsdp_ckpt_close(ck);
    return EXIT_OK;
}

/* rc, or EXIT_FAILED when what the command printed could not all be written (a full disk, a
 * closed pipe): a command whose output is lost has failed. */
static int flushed(int rc, const char *cmd) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr,
            "fsdp-ckpt %s: cannot write the output to stdout%s%s: check the disk or the "
            "pipe it goes to\n",
            cmd, errno ? ": " : "", errno ? strerror(errno) : "");
    return rc == EXIT_OK ? EXIT_FAILED : rc;
}

int main(int argc, char **argv) {
    tool_exit_begin();
    if (argc < 2) return fprintf(stderr, "fsdp-ckpt: needs a COMMAND\n%s", usage_main), EXIT_USAGE;
    if (ckpt_is_help(argv[1])) return printf("%s", usage_main), flushed(EXIT_OK, "--help");
    static const struct {
        const char *name;
        int (*run)(fsdp_ctx *, int, char **);
    } cmds[] = {{"inspect", cmd_inspect}, {"verify", cmd_verify}, {"diff", cmd_diff},
                {"export", cmd_export},   {"import", cmd_import}, {"generate", ckpt_cmd_generate},
                {"eval", ckpt_cmd_eval}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        fsdp_ctx *ctx = NULL;
        fsdp_ctx_options o = {.log_level = FSDP_LOG_WARN};
        if (fsdp_ctx_create(&o, &ctx) != FSDP_OK) {
            fprintf(stderr, "fsdp-ckpt: cannot create the context (out of memory?)\n");
            return EXIT_FAILED;
        }
        int rc = cmds[i].run(ctx, argc - 1, argv + 1);
        fsdp_ctx_free(ctx);
        /* a failed export or import may leave HDF5 holding a file it could not close */
        return tool_exit(flushed(rc, argv[1]), rc == EXIT_OK ? TOOL_END_CLEAN : TOOL_END_FAILED);
    }
    fprintf(stderr, "fsdp-ckpt: unknown command '%s'\n%s", argv[1], usage_main);
    return EXIT_USAGE;
}
