/* ckpt_generate.c: fsdp-ckpt generate (a Llama checkpoint continues a prompt, token by token,
 * through the key/value cache of fsdp_llama_decode) and fsdp-ckpt eval (its loss and
 * perplexity on a token file, computed as fsdp-train's evaluation computes it).
 * docs/checkpoint.md, "Using a trained Llama". */
#define _POSIX_C_SOURCE 200809L /* glob, strdup */
#include "ckpt_generate.h"

#include <errno.h>
#include <glob.h>
#include <ini.h> /* defines: ini_parse_string */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_cli.h"            // defines: ckpt_parse_args, ckpt_open_arg, opt_spec, EXIT_OK
#include "ckpt_eval_world.h"     // defines: ckpt_eval_batches, ckpt_eval_world
#include "tool_fs.h"             // defines: tool_make_scratch_dir, tool_remove_tree
#include "train_token_formats.h" // defines: train_token_layout_read, train_token_layout_id

#define BYTE_VOCAB 256 /* tools/text_to_tokens.py's byte tokenizer: one id per byte */

/* ---- the model of a checkpoint ---- */

/* A Llama loaded from a checkpoint, a run directory or a Hugging Face model directory. */
typedef struct loaded {
    fsdp_module *model;
    fsdp_llama_config cfg; /* resolved */
    char *config;          /* the checkpoint's training configuration text ("" when none) */
    char tmp[4200];        /* the import of a Hugging Face directory; "" when none */
    char path[4300];       /* the checkpoint read (a step directory) */
} loaded;

static void loaded_free(loaded *m) {
    fsdp_module_free(m->model);
    free(m->config);
    if (m->tmp[0]) tool_remove_tree(m->tmp);
    memset(m, 0, sizeof *m);
}

/* A Hugging Face model directory imported into a temporary checkpoint; *path is its step. */
static bool import_hf(fsdp_ctx *ctx, const char *cmd, const char *dir, loaded *m, char *path,
                      size_t size) {
    if (!tool_make_scratch_dir("fsdp-ckpt-hf", m->tmp, sizeof m->tmp)) {
        fprintf(stderr, "fsdp-ckpt %s: cannot make a temporary directory '%s' for the import: %s\n",
                cmd, m->tmp, strerror(errno));
        m->tmp[0] = '\0';
        return false;
    }
    fsdp_ckpt_import_options o = {.zstd_level = FSDP_CKPT_NO_COMPRESSION};
    if (fsdp_ckpt_import(ctx, dir, m->tmp, &o) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt %s: importing the Hugging Face directory '%s': %s\n", cmd, dir,
                fsdp_last_error(ctx));
        return false;
    }
    snprintf(path, size, "%s/step-00000000", m->tmp);
    return true;
}

/* Every parameter of the model is in the checkpoint (the shapes are checked by the load). */
static bool has_every_param(fsdp_ctx *ctx, const char *cmd, fsdp_ckpt *ck, const fsdp_state *st,
                            const char *arg) {
    for (int i = 0; i < fsdp_state_num_entries(st); i++) {
        fsdp_state_entry e;
        if (fsdp_state_entry_get(ctx, st, i, &e) != FSDP_OK) return false;
        if (fsdp_ckpt_find(ck, e.name) >= 0) continue;
        fprintf(stderr,
                "fsdp-ckpt %s: '%s' has no tensor '%s', which the Llama of its model "
                "configuration has: its tensors are not that Llama's; pass a checkpoint of "
                "fsdp-train's [model] kind = llama or a Hugging Face Llama directory\n",
                cmd, arg, e.name);
        return false;
    }
    return true;
}

/* Builds the Llama that ck's model configuration describes and loads its parameters. */
static bool load_llama(fsdp_ctx *ctx, const char *cmd, const char *arg, fsdp_ckpt *ck, loaded *m,
                       bool build) {
    const char *json = fsdp_ckpt_model_config(ck);
    if (!json[0]) {
        fprintf(stderr,
                "fsdp-ckpt %s: '%s' is not a Llama checkpoint: it holds no model configuration "
                "(a checkpoint of fsdp-train's [model] kind = llama and an imported Hugging Face "
                "Llama directory do); generate and eval need a Llama\n",
                cmd, arg);
        return false;
    }
    if (fsdp_llama_config_from_hf_json(ctx, json, &m->cfg) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt %s: '%s' is not a Llama this libfsdp builds: %s\n", cmd, arg,
                fsdp_last_error(ctx));
        return false;
    }
    if (!build) return true;
    fsdp_state *st = NULL;
    fsdp_ckpt_load_options lo = {.non_strict = true}; /* optimizer state and extras ignored */
    bool ok = fsdp_model_llama(ctx, &m->cfg, &m->model) == FSDP_OK &&
              fsdp_state_create(ctx, &(fsdp_state_sources){.model = m->model}, &st) == FSDP_OK;
    if (!ok) fprintf(stderr, "fsdp-ckpt %s: building its Llama: %s\n", cmd, fsdp_last_error(ctx));
    ok = ok && has_every_param(ctx, cmd, ck, st, arg);
    if (ok && fsdp_ckpt_load(ctx, ck, st, &lo) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt %s: loading '%s': %s\n", cmd, arg, fsdp_last_error(ctx));
        ok = false;
    }
    fsdp_state_free(st);
    return ok;
}

/* arg: a checkpoint, a directory of them (the newest) or a Hugging Face model directory. Without
 * build, only its configuration is read (m->model stays NULL) and m->path names the checkpoint,
 * for ranks that each build their part. */
static bool load_model(fsdp_ctx *ctx, const char *cmd, const char *arg, loaded *m, bool build) {
    memset(m, 0, sizeof *m);
    char *path = m->path;
    snprintf(path, sizeof m->path, "%s", arg);
    if (ckpt_file_exists(arg, "config.json") && !ckpt_file_exists(arg, "metadata.h5") &&
        !import_hf(ctx, cmd, arg, m, path, sizeof m->path))
        return loaded_free(m), false;
    fsdp_ckpt *ck = ckpt_open_arg(ctx, cmd, path);
    char *newest = NULL; /* a run's directory: its newest checkpoint, which ck is */
    if (ck && !ckpt_file_exists(path, "metadata.h5")) {
        if (fsdp_ckpt_latest(ctx, path, &newest) == FSDP_OK)
            snprintf(m->path, sizeof m->path, "%s", newest);
        else
            fsdp_clear_error(ctx); /* ck is there: the search's failure was none */
    }
    free(newest);
    bool ok = ck && load_llama(ctx, cmd, arg, ck, m, build);
    if (ok && !(m->config = strdup(fsdp_ckpt_config(ck)))) {
        fprintf(stderr, "fsdp-ckpt %s: out of memory\n", cmd);
        ok = false;
    }
    fsdp_ckpt_close(ck);
    if (!ok) loaded_free(m);
    return ok;
}

/* ---- numbers on the command line ---- */

static bool parse_i64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi,
                      int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "fsdp-ckpt %s: %s '%s' is not an integer in [%lld, %lld]\n", cmd, flag, v,
                (long long)lo, (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

/* ---- generate ---- */

static const char *const usage_generate =
    "usage: fsdp-ckpt generate DIR (--prompt TEXT | --prompt-ids IDS) [options]\n"
    "\n"
    "Continues a prompt with the Llama of DIR: a checkpoint of fsdp-train's [model] kind =\n"
    "llama, the directory a run saved into (its newest committed checkpoint), or a Hugging Face\n"
    "Llama directory (config.json and model.safetensors). The prompt is fed at once, then each\n"
    "new token one at a time through a key/value cache, and printed as it comes.\n"
    "\n"
    "  --prompt TEXT         the prompt's bytes as tokens: for a model of vocabulary 256, the\n"
    "                        byte tokenizer of tools/text_to_tokens.py (the generated bytes are\n"
    "                        printed as text)\n"
    "  --prompt-ids IDS      the prompt as token ids, \"15496,995\" (any vocabulary; for a\n"
    "                        GPT-2 model: python3 -c 'import tiktoken; print(tiktoken\n"
    "                        .get_encoding(\"gpt2\").encode(\"Hello\"))')\n"
    "  --max-new-tokens N    tokens to generate (default 64, or as many as fit); the prompt\n"
    "                        and them must fit the model's max_seq_len\n"
    "  --temperature T       0 (default): greedy, the most likely token; T > 0: draw from the\n"
    "                        softmax of logits / T\n"
    "  --top-k K             draw only among the K most likely tokens (default 0: all)\n"
    "  --seed S              the draws' seed (default 0): the same seed, the same tokens\n"
    "  --ids                 print token ids (space-separated) instead of text\n"
    "  --tp T, --world N     generate on a world of rank threads (N, default T; under mpirun its\n"
    "                        processes), the model split over tp with fsdp-train's Llama plan,\n"
    "                        each rank loading its part; every token from a full forward of the\n"
    "                        sequence so far (no key/value cache), the same tokens as one rank\n"
    "                        up to float32 rounding at near ties\n"
    "  --device D            where the ranks compute (default cpu): cuda (rank r on GPU r mod the\n"
    "                        GPU count) or sim (the simulated GPU); every token from a full\n"
    "                        forward as on a world (one rank unless --world or --tp say more);\n"
    "                        not under mpirun\n"
    "\n"
    "A model whose vocabulary is not 256 has no tokenizer in libfsdp: it takes --prompt-ids and\n"
    "prints token ids (decode them with the tokenizer it was trained with).\n";

typedef struct gen_args {
    const char *dir, *prompt, *prompt_ids;
    int64_t max_new, top_k, seed; /* max_new 0: 64, or as many as fit */
    double temperature;
    bool ids;
    ckpt_eval_layout lay; /* --world, --tp: on a world when lay.world > 0 or under mpirun */
    bool on_world;
} gen_args;

/* The prompt's tokens into *toks (malloc'ed), *n of them: its bytes, or the ids of
 * --prompt-ids; false (usage) when those are not a list of ids. */
static bool parse_prompt(const gen_args *g, int32_t **toks, int64_t *n) {
    size_t cap = g->prompt ? strlen(g->prompt) : strlen(g->prompt_ids) / 2 + 1;
    *n = 0;
    if (!(*toks = malloc((cap + 1) * sizeof **toks))) {
        fprintf(stderr, "fsdp-ckpt generate: out of memory for the prompt\n");
        return false;
    }
    if (g->prompt) {
        for (const unsigned char *p = (const unsigned char *)g->prompt; *p; p++)
            (*toks)[(*n)++] = *p;
        return true;
    }
    for (const char *p = g->prompt_ids; *p;) {
        char *end;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (end == p || errno || (*end && *end != ',') || id < 0 || id > INT32_MAX) {
            fprintf(stderr,
                    "fsdp-ckpt generate: --prompt-ids '%s' is not a list of token ids (integers "
                    ">= 0) separated by commas (\"15496,995\")\n",
                    g->prompt_ids);
            return false;
        }
        (*toks)[(*n)++] = (int32_t)id;
        p = *end ? end + 1 : end;
    }
    return true;
}

/* The prompt fits the model: text needs the byte vocabulary, ids must be below vocab, and it
 * is not empty. */
static bool check_prompt(const gen_args *g, int64_t vocab, const int32_t *toks, int64_t n) {
    if (g->prompt && vocab != BYTE_VOCAB) {
        fprintf(stderr,
                "fsdp-ckpt generate: --prompt TEXT is read with the byte tokenizer, but this "
                "model's vocabulary is %lld, not %d: it was trained on other tokens; pass the "
                "prompt as token ids with --prompt-ids\n",
                (long long)vocab, BYTE_VOCAB);
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if (toks[i] >= vocab) {
            fprintf(stderr,
                    "fsdp-ckpt generate: prompt token %d (at %lld) is not in the model's "
                    "vocabulary [0, %lld): the ids come from another tokenizer; use the one the "
                    "model was trained with\n",
                    toks[i], (long long)i, (long long)vocab);
            return false;
        }
    if (n == 0)
        fprintf(stderr, "fsdp-ckpt generate: the prompt is empty; generation continues a "
                        "prompt: give it at least one token\n");
    return n > 0;
}

/* --world and --tp: 0 ranks means one rank without a world (or, under mpirun, the job). */
static bool parse_layout(const char *cmd, const char *world, const char *tp, ckpt_eval_layout *l) {
    int64_t w = 0, t = 1;
    if (world && !parse_i64(cmd, "--world", world, 1, FSDP_LOCAL_MAX_RANKS, &w)) return false;
    if (tp && !parse_i64(cmd, "--tp", tp, 1, FSDP_LOCAL_MAX_RANKS, &t)) return false;
    if (ckpt_under_mpirun() && world) {
        fprintf(stderr,
                "fsdp-ckpt %s: under mpirun the ranks are mpirun's processes; leave out --world "
                "(and give -np)\n",
                cmd);
        return false;
    }
    if (w && w % t) {
        fprintf(stderr,
                "fsdp-ckpt %s: --tp %lld does not divide --world %lld; give a --tp that divides "
                "it (dp = world / tp)\n",
                cmd, (long long)t, (long long)w);
        return false;
    }
    if (!w && !ckpt_under_mpirun() && t > 1) w = t; /* --tp alone: a world of tp ranks */
    l->world = (int)w, l->tp = (int)t;
    return true;
}

/* --device of command cmd: cpu, cuda or sim, a kind this build and machine have, not under
 * mpirun. */
static bool parse_device(const char *cmd, const char *v, fsdp_device_type *out) {
    static const struct {
        const char *name;
        fsdp_device_type type;
    } kinds[] = {{"cpu", FSDP_DEVICE_CPU}, {"cuda", FSDP_DEVICE_CUDA}, {"sim", FSDP_DEVICE_SIM}};
    int i = 0;
    while (i < COUNT(kinds) && strcmp(v, kinds[i].name)) i++;
    if (i == COUNT(kinds)) {
        fprintf(stderr, "fsdp-ckpt %s: --device '%s': give cpu, cuda or sim\n", cmd, v);
        return false;
    }
    *out = kinds[i].type;
    if (*out != FSDP_DEVICE_CPU && ckpt_under_mpirun()) {
        fprintf(stderr,
                "fsdp-ckpt %s: --device %s under mpirun: the processes' collectives move host "
                "tensors; run rank threads instead (--world N, without mpirun), or leave out "
                "--device\n",
                cmd, v);
        return false;
    }
    if (fsdp_device_count(*out) == 0) {
        fprintf(stderr, "fsdp-ckpt %s: --device %s, but %s; use --device cpu%s\n", cmd, v,
                *out == FSDP_DEVICE_CUDA ? "no GPU is usable here (a build without CUDA, or the "
                                           "driver sees none)"
                                         : "FSDP_SIM_DEVICES = 0 leaves no simulated device",
                *out == FSDP_DEVICE_CUDA ? " or sim" : "");
        return false;
    }
    return true;
}

/* Prints one generated token as text (a byte) or an id, and flushes. */
static bool emit(const gen_args *g, bool bytes, int64_t i, int32_t tok) {
    if (bytes && !g->ids)
        putchar(tok);
    else
        printf("%s%d", i ? " " : "", tok);
    return fflush(stdout) == 0;
}

typedef struct emit_to {
    const gen_args *g;
    bool bytes;
} emit_to;

static bool emit_token(void *user, int64_t i, int32_t tok) {
    const emit_to *e = user;
    return emit(e->g, e->bytes, i, tok);
}

static int generate(fsdp_ctx *ctx, const gen_args *g, loaded *m, const int32_t *toks, int64_t n) {
    int64_t vocab = m->cfg.vocab_size, L = m->cfg.max_seq_len;
    fsdp_llama_cache *cache = NULL;
    int rc = EXIT_FAILED;
    if (!check_prompt(g, vocab, toks, n)) goto done;
    int64_t max_new = g->max_new ? g->max_new : (L - n < 64 ? L - n : 64);
    if (n + max_new > L || max_new < 1) {
        if (n < L)
            fprintf(stderr,
                    "fsdp-ckpt generate: the prompt's %lld tokens and --max-new-tokens %lld "
                    "exceed the model's max_seq_len %lld; lower --max-new-tokens to %lld\n",
                    (long long)n, (long long)max_new, (long long)L, (long long)(L - n));
        else
            fprintf(stderr,
                    "fsdp-ckpt generate: the prompt's %lld tokens leave no room for a new one in "
                    "the model's max_seq_len %lld; shorten the prompt to at most %lld tokens\n",
                    (long long)n, (long long)L, (long long)(L - 1));
        goto done;
    }
    bool bytes = vocab == BYTE_VOCAB;
    if (!bytes)
        fprintf(stderr,
                "fsdp-ckpt generate: printing token ids: libfsdp has no tokenizer for a "
                "vocabulary of %lld (decode them with the one the model was trained with)\n",
                (long long)vocab);
    fsdp_sample_options so = {
        .temperature = (float)g->temperature, .top_k = g->top_k, .seed = (uint64_t)g->seed};
    if (g->on_world) {
        ckpt_eval_layout lay = g->lay;
        lay.ckpt = m->path, lay.cfg = &m->cfg;
        emit_to e = {g, bytes};
        bool printer = true;
        rc = ckpt_generate_world(ctx, &lay, toks, n, max_new, &so, emit_token, &e, &printer);
        if (rc == EXIT_OK && printer) putchar('\n');
        goto done;
    }
    const float *logits;
    if (fsdp_llama_cache_create(ctx, m->model, 0, &cache) != FSDP_OK ||
        fsdp_llama_decode(ctx, cache, toks, n, &logits) != FSDP_OK)
        goto failed;
    for (int64_t i = 0; i < max_new; i++) {
        int32_t tok;
        if (fsdp_sample_logits(ctx, logits, vocab, &so, (uint64_t)i, &tok) != FSDP_OK) goto failed;
        if (!emit(g, bytes, i, tok)) break; /* the caller reports the lost output */
        if (i + 1 < max_new && fsdp_llama_decode(ctx, cache, &tok, 1, &logits) != FSDP_OK)
            goto failed;
    }
    putchar('\n');
    rc = EXIT_OK;
    goto done;
failed:
    fprintf(stderr, "fsdp-ckpt generate: %s\n", fsdp_last_error(ctx));
done:
    fsdp_llama_cache_free(cache);
    return rc;
}

int ckpt_cmd_generate(fsdp_ctx *ctx, int argc, char **argv) {
    gen_args g = {0};
    const char *max_new = NULL, *temp = NULL, *top_k = NULL, *seed = NULL, *world = NULL,
               *tp = NULL, *device = NULL;
    const opt_spec specs[] = {{"prompt", &g.prompt, NULL},
                              {"device", &device, NULL},
                              {"world", &world, NULL},
                              {"tp", &tp, NULL},
                              {"prompt-ids", &g.prompt_ids, NULL},
                              {"max-new-tokens", &max_new, NULL},
                              {"temperature", &temp, NULL},
                              {"top-k", &top_k, NULL},
                              {"seed", &seed, NULL},
                              {"ids", NULL, &g.ids}};
    int rc =
        ckpt_parse_args("generate", usage_generate, argc, argv, specs, COUNT(specs), &g.dir, 1);
    if (rc >= 0) return rc;
    if (!g.dir) return ckpt_usage_error("generate", usage_generate, "needs DIR");
    if (!g.prompt == !g.prompt_ids)
        return ckpt_usage_error(
            "generate", usage_generate,
            "needs the prompt: --prompt TEXT or --prompt-ids IDS (one of them)");
    if (max_new && !parse_i64("generate", "--max-new-tokens", max_new, 1, 1 << 24, &g.max_new))
        return EXIT_USAGE;
    if (top_k && !parse_i64("generate", "--top-k", top_k, 0, INT32_MAX, &g.top_k))
        return EXIT_USAGE;
    if (seed && !parse_i64("generate", "--seed", seed, 0, INT64_MAX, &g.seed)) return EXIT_USAGE;
    if (!parse_layout("generate", world, tp, &g.lay)) return EXIT_USAGE;
    if (device && !parse_device("generate", device, &g.lay.device)) return EXIT_USAGE;
    /* a device: the world's full forwards (the key/value cache is host memory), one rank */
    if (g.lay.device != FSDP_DEVICE_CPU && !g.lay.world) g.lay.world = 1;
    g.on_world = g.lay.world > 0 || ckpt_under_mpirun();
    g.lay.arg = g.dir;
    if (temp) {
        char *end;
        g.temperature = strtod(temp, &end);
        if (end == temp || *end || !(g.temperature >= 0) || !isfinite(g.temperature)) {
            fprintf(stderr,
                    "fsdp-ckpt generate: --temperature '%s' is not a number >= 0 (0: greedy)\n",
                    temp);
            return EXIT_USAGE;
        }
    }
    int32_t *toks = NULL;
    int64_t n = 0;
    loaded m;
    if (!parse_prompt(&g, &toks, &n))
        rc = toks ? EXIT_USAGE : EXIT_FAILED;
    else if (!load_model(ctx, "generate", g.dir, &m, !g.on_world))
        rc = EXIT_FAILED;
    else {
        rc = generate(ctx, &g, &m, toks, n);
        loaded_free(&m);
    }
    free(toks);
    return rc;
}

/* ---- eval ---- */

static const char *const usage_eval =
    "usage: fsdp-ckpt eval DIR TOKENS [--batch B] [--seq T] [--world N] [--tp T]\n"
    "                      [--autocast f32|bf16] [--device cpu|cuda|sim]\n"
    "\n"
    "The loss (mean cross-entropy of each next token, nats per token) and the perplexity\n"
    "(e^loss) of the Llama of DIR (a checkpoint, a run's directory or a Hugging Face Llama\n"
    "directory, as for generate) on TOKENS, read as fsdp-train reads [data] path: a token\n"
    "file (fsdp-train's own, written by tools/text_to_tokens.py, an llm.c .bin shard or a .npy\n"
    "array) or a quoted glob pattern ('data/shard_*.bin') whose files, sorted by name, are read\n"
    "as one stream. The tokens are cut into consecutive sequences of T + 1 tokens that\n"
    "share their last and first token (sequence j starts at token j * T), as fsdp-train cuts its\n"
    "held-out tokens, and scored B sequences at a time, whole batches only; the loss is the\n"
    "mean over the batches, summed as fsdp-train's evaluation sums it, so a file of a run's\n"
    "held-out tokens, as many as its evaluation scores (eval_batches x batch_size sequences),\n"
    "gives that run's evaluation loss.\n"
    "\n"
    "  --batch B   sequences per forward (default: the checkpoint's [data] batch_size, else 8)\n"
    "  --seq T     tokens per sequence (default: the model's max_seq_len; at most that)\n"
    "  --world N   run on N rank threads (default: one rank, no world); under mpirun the\n"
    "              ranks are its processes (-np N) and --world is left out\n"
    "  --tp T      tensor-parallel size (default 1; alone: a world of T ranks): the model is\n"
    "              split over tp with fsdp-train's Llama plan and loss parallel, the batches\n"
    "              dealt over dp = ranks / tp; each rank loads only its part of the checkpoint.\n"
    "              The loss equals one rank's to float32 rounding (docs/checkpoint.md)\n"
    "  --autocast P  f32 or bf16, the compute policy (default: the run's [model] autocast,\n"
    "              as its evaluation computed; f32 for a checkpoint without a configuration)\n"
    "  --device D  where the ranks compute (default cpu): cuda (a GPU; rank r on GPU r mod the\n"
    "              GPU count, so rank threads may share one) or sim (the simulated GPU, the\n"
    "              cpu's bits); not under mpirun, whose ranks move host tensors\n";

/* The [data] batch_size of a training configuration text (INI). */
static int batch_key(void *user, const char *section, const char *name, const char *value) {
    if (!strcmp(section, "data") && !strcmp(name, "batch_size")) {
        char *end;
        long long v = strtoll(value, &end, 10);
        if (end != value && !*end && v >= 1 && v <= INT32_MAX) *(int64_t *)user = v;
    }
    return 1;
}

/* [model] autocast = bf16 of a training configuration text: *(bool *)user. */
static int autocast_key(void *user, const char *section, const char *name, const char *value) {
    if (!strcmp(section, "model") && !strcmp(name, "autocast"))
        *(bool *)user = !strcmp(value, "bf16");
    return 1;
}

/* Appends the ids of one token file (any format of train_token_formats.h, told apart by its
 * first bytes) to *ids (*count of them, *cap allocated), every header field checked against
 * the file's size by train_token_layout_read and every id against vocab; false after printing
 * the problem and the fix. */
static bool read_token_file(const char *path, int64_t vocab, int32_t **ids, int64_t *count,
                            int64_t *cap) {
    struct stat sb;
    int missing = stat(path, &sb) != 0 ? errno : 0;
    if (missing || !S_ISREG(sb.st_mode)) { /* a FIFO would block forever: refused unopened */
        fprintf(stderr,
                "fsdp-ckpt eval: cannot read the token file '%s': %s; give the path of "
                "a token file (tools/text_to_tokens.py writes one)\n",
                path, missing ? strerror(missing) : "not a regular file");
        return false;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fsdp-ckpt eval: cannot open '%s': %s\n", path, strerror(errno));
        return false;
    }
    int64_t size = (int64_t)sb.st_size;
    unsigned char *raw = (uint64_t)size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    char name[PATH_MAX + 32], err[1024];
    snprintf(name, sizeof name, "token file '%s'", path);
    train_token_layout l = {0};
    const char *bad = NULL;
    if (!raw)
        bad = "it does not fit in memory";
    else if (fread(raw, 1, (size_t)size, f) != (size_t)size)
        bad = "it cannot be read";
    else if (train_token_layout_read(raw, (size_t)size, size, name, &l, err, sizeof err) != FSDP_OK)
        bad = err;
    else if (l.vocab > (uint64_t)vocab)
        bad = "its tokenizer's vocabulary (the header's vocab) is larger than the model's";
    else if (l.count > INT64_MAX - *count || *count + l.count > INT32_MAX)
        bad = "the files hold more than 2^31 tokens";
    fclose(f);
    if (!bad && *count + l.count > *cap) {
        int64_t want = *count + l.count;
        int32_t *grown = realloc(*ids, (size_t)want * sizeof **ids);
        if (grown)
            *ids = grown, *cap = want;
        else
            bad = "it does not fit in memory";
    }
    for (int64_t i = 0; !bad && i < l.count; i++) {
        int64_t id = train_token_layout_id(&l, raw + l.offset, i);
        if (id < 0 || id >= vocab) {
            fprintf(stderr,
                    "fsdp-ckpt eval: '%s': token %lld is %lld, not in the model's vocabulary "
                    "[0, %lld): the file was written with another tokenizer than the model's\n",
                    path, (long long)i, (long long)id, (long long)vocab);
            free(raw);
            return false;
        }
        (*ids)[*count + i] = (int32_t)id;
    }
    free(raw);
    if (bad == err)
        fprintf(stderr, "fsdp-ckpt eval: %s\n", err);
    else if (bad)
        fprintf(stderr,
                "fsdp-ckpt eval: '%s': %s (header vocab %llu, model vocab %lld); write it "
                "with tools/text_to_tokens.py and the model's tokenizer\n",
                path, bad, (unsigned long long)l.vocab, (long long)vocab);
    if (bad) return false;
    *count += l.count;
    return true;
}

/* Reads TOKENS whole into *ids (malloc'ed), *count of them: the file it names, or the
 * matches of a glob pattern (`*`, `?`, `[`; a path naming an existing file is that file)
 * sorted by name and read in order as one stream, as fsdp-train reads [data] path; false after
 * printing the problem and the fix. */
static bool read_tokens(const char *path, int64_t vocab, int32_t **ids, int64_t *count) {
    struct stat sb;
    glob_t g;
    bool pattern = strpbrk(path, "*?[") && stat(path, &sb) != 0, ok = true;
    int rc = pattern ? glob(path, 0, NULL, &g) : 0; /* sorted by name */
    if (rc != 0) {
        if (rc != GLOB_NOMATCH) globfree(&g);
        fprintf(stderr,
                "fsdp-ckpt eval: the pattern '%s' %s; give a token file, or a pattern that "
                "matches the shards (e.g. 'data/shard_*.bin')\n",
                path, rc == GLOB_NOMATCH ? "matches no file" : "cannot be expanded (a read error)");
        return false;
    }
    int64_t cap = 0;
    *ids = NULL, *count = 0;
    for (size_t i = 0; ok && i < (pattern ? g.gl_pathc : 1); i++)
        ok = read_token_file(pattern ? g.gl_pathv[i] : path, vocab, ids, count, &cap);
    if (pattern) globfree(&g);
    if (ok && *count == 0) {
        fprintf(stderr, "fsdp-ckpt eval: '%s' holds no tokens; give a file with tokens\n", path);
        ok = false;
    }
    if (!ok) free(*ids), *ids = NULL;
    return ok;
}

/* The mean loss over d's sequences on this one rank. */
static fsdp_status eval_loss(fsdp_ctx *ctx, fsdp_module *model, const ckpt_eval_data *d,
                             double *loss) {
    float *losses = calloc((size_t)(d->n_seq / d->B), sizeof *losses);
    if (!losses) return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    fsdp_status st = ckpt_eval_batches(ctx, model, d, 0, 1, losses);
    *loss = ckpt_eval_mean(d, losses);
    free(losses);
    return st;
}

int ckpt_cmd_eval(fsdp_ctx *ctx, int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *batch = NULL, *seq = NULL, *world = NULL, *tp = NULL,
               *device = NULL, *autocast = NULL;
    const opt_spec specs[] = {{"batch", &batch, NULL},   {"seq", &seq, NULL},
                              {"world", &world, NULL},   {"tp", &tp, NULL},
                              {"device", &device, NULL}, {"autocast", &autocast, NULL}};
    int rc = ckpt_parse_args("eval", usage_eval, argc, argv, specs, COUNT(specs), pos, 2);
    if (rc >= 0) return rc;
    if (!pos[1]) return ckpt_usage_error("eval", usage_eval, "needs DIR and TOKENS");
    int64_t B = 0, T = 0, count = 0;
    if (batch && !parse_i64("eval", "--batch", batch, 1, 1 << 20, &B)) return EXIT_USAGE;
    if (seq && !parse_i64("eval", "--seq", seq, 1, 1 << 24, &T)) return EXIT_USAGE;
    ckpt_eval_layout lay = {.arg = pos[0]};
    if (!parse_layout("eval", world, tp, &lay)) return EXIT_USAGE;
    if (device && !parse_device("eval", device, &lay.device)) return EXIT_USAGE;
    if (autocast && strcmp(autocast, "f32") && strcmp(autocast, "bf16")) {
        fprintf(stderr, "fsdp-ckpt eval: --autocast '%s': give f32 or bf16\n", autocast);
        return EXIT_USAGE;
    }
    bool on_world = lay.world > 0 || ckpt_under_mpirun(), printer = true;
    loaded m;
    if (!load_model(ctx, "eval", pos[0], &m, !on_world)) return EXIT_FAILED;
    /* the run's policy, so that its held-out tokens give its evaluation's loss */
    bool bf16 = false;
    if (autocast)
        bf16 = !strcmp(autocast, "bf16");
    else
        ini_parse_string(m.config, autocast_key, &bf16);
    if (bf16) m.cfg.compute_dtype = FSDP_DTYPE_BF16; /* the world's ranks build with it */
    if (!on_world && ((bf16 && fsdp_module_set_autocast(ctx, m.model, FSDP_DTYPE_BF16)) ||
                      ckpt_eval_to_device(ctx, lay.device, 0, m.model) != FSDP_OK)) {
        fprintf(stderr, "fsdp-ckpt eval: preparing the model: %s\n", fsdp_last_error(ctx));
        loaded_free(&m);
        return EXIT_FAILED;
    }
    int32_t *ids = NULL;
    rc = EXIT_FAILED;
    if (!B) ini_parse_string(m.config, batch_key, &B);
    if (!B) B = 8;
    if (!T) T = m.cfg.max_seq_len;
    if (T > m.cfg.max_seq_len) {
        fprintf(stderr,
                "fsdp-ckpt eval: --seq %lld is longer than the model's max_seq_len %lld; "
                "lower --seq\n",
                (long long)T, (long long)m.cfg.max_seq_len);
    } else if (read_tokens(pos[1], m.cfg.vocab_size, &ids, &count)) {
        int64_t windows = count >= T + 1 ? (count - 1) / T : 0, n = windows / B * B;
        double loss;
        ckpt_eval_data d = {.ids = ids, .n_seq = n, .B = B, .T = T};
        lay.ckpt = m.path, lay.cfg = &m.cfg;
        if (n == 0)
            fprintf(stderr,
                    "fsdp-ckpt eval: '%s' has %lld tokens: %lld sequences of --seq + 1 = %lld, "
                    "fewer than one batch of %lld; lower --batch or --seq, or use a longer file\n",
                    pos[1], (long long)count, (long long)windows, (long long)(T + 1), (long long)B);
        else if (on_world)
            rc = ckpt_eval_world(ctx, &lay, &d, &loss, &printer);
        else if (eval_loss(ctx, m.model, &d, &loss) != FSDP_OK)
            fprintf(stderr, "fsdp-ckpt eval: %s\n", fsdp_last_error(ctx));
        else
            rc = EXIT_OK;
        if (rc == EXIT_OK && printer) {
            printf("sequences %lld of %lld tokens, batch %lld (%lld of %lld tokens scored)\n",
                   (long long)n, (long long)T, (long long)B, (long long)(n * T), (long long)count);
            if (bf16) printf("bf16 compute (%s)\n", autocast ? "--autocast" : "the run's autocast");
            if (lay.device != FSDP_DEVICE_CPU) /* rank 0's device, as fsdp-train's banner */
                printf("on %s:0 (rank r on %s:(r mod %d))\n",
                       fsdp_device_to_string((fsdp_device){lay.device, 0}),
                       fsdp_device_to_string((fsdp_device){lay.device, 0}),
                       fsdp_device_count(lay.device));
            printf("loss %.9g nats per token\nperplexity %.9g\n", loss, exp(loss));
        }
    }
    free(ids);
    loaded_free(&m);
    return rc;
}
