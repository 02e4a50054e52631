/* hf_llama_driver.c: the C side of tools/check_hf_export.py, which compares libfsdp's Llama with
 * transformers' LlamaForCausalLM through Hugging Face directories.
 *
 *   hf_llama_driver train OUTDIR [--ranks N]
 *     builds a small Llama (non-default rope_theta and rms_norm_eps, grouped key/value heads),
 *     trains 3 AdamW steps under FSDP FULL_SHARD on N rank threads (default 2, one unit per
 *     decoder layer), saves OUTDIR/ckpt with the model's config.json as its model configuration,
 *     and writes the logits of a fixed evaluation batch: OUTDIR/tokens.i32 (B, T),
 *     OUTDIR/logits.f32 (B, T, vocab), OUTDIR/shape.txt ("B T vocab").
 *   hf_llama_driver logits CKPT TOKENS B T OUT
 *     builds the Llama that CKPT's model configuration describes, loads CKPT strictly, and
 *     writes the logits of the (B, T) int32 tokens in file TOKENS to OUT (float32).
 * Exit status 0 on success, 1 on failure (with the message), 2 on a bad command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"

#define B_TRAIN 4
#define T_TRAIN 12
#define B_EVAL  2
#define T_EVAL  10
#define STEPS   3

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)) != FSDP_OK) goto done;                                                      \
    } while (0)

static const fsdp_llama_config model_cfg = {.dim = 48,
                                            .n_layers = 2,
                                            .n_heads = 6,
                                            .n_kv_heads = 2,
                                            .vocab_size = 80,
                                            .ffn_hidden = 72,
                                            .max_seq_len = 32,
                                            .norm_eps = 1e-5f,
                                            .rope_theta = 500000.0f};

typedef struct job {
    const char *out;
    int ranks;
    int32_t train[B_TRAIN * T_TRAIN], target[B_TRAIN * T_TRAIN], eval[B_EVAL * T_EVAL];
} job;

/* Token ids from a fixed linear congruential sequence. */
static void fill_tokens(int32_t *ids, int n, uint32_t seed, int vocab) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
}

static fsdp_status write_file(fsdp_ctx *ctx, const char *dir, const char *name, const void *data,
                              size_t bytes) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, bytes, f) == bytes;
    if (f) ok = fclose(f) == 0 && ok;
    return ok ? FSDP_OK : fsdp_ctx_set_error(ctx, FSDP_ERR_IO, "cannot write '%s'", path);
}

static fsdp_status train_rank(fsdp_ctx *ctx, int rank, void *user) {
    const job *jb = user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *tokens = NULL, *eval = NULL, *dlogits = NULL;
    fsdp_state *state = NULL;
    fsdp_ckpt_writer *w = NULL;
    char *config = NULL;
    fsdp_status st;
    TRY(fsdp_model_llama(ctx, &model_cfg, &m));
    const char *const kinds[] = {"LlamaDecoderLayer"};
    TRY(fsdp_fully_shard(ctx, m,
                         &(fsdp_fully_shard_options){
                             .strategy = FSDP_FULL_SHARD, .wrap_kinds = kinds, .n_wrap_kinds = 1},
                         &sh));
    TRY(fsdp_adamw_create(ctx, fsdp_sharded_flat_params(sh),
                          &(fsdp_adam_options){.lr = 1e-2, .weight_decay = 0.01}, &opt));
    /* This rank's rows of the training batch (B_TRAIN divides evenly over 1, 2 or 4 ranks). */
    int rows = B_TRAIN / jb->ranks;
    const int32_t *ids = jb->train + rank * rows * T_TRAIN;
    const int32_t *tgt = jb->target + rank * rows * T_TRAIN;
    TRY(fsdp_tensor_from_blob(ctx, (void *)ids, FSDP_DTYPE_I32, FSDP_CPU, 2,
                              (int64_t[]){rows, T_TRAIN}, &tokens));
    for (int step = 0; step < STEPS; step++) {
        const fsdp_tensor *logits;
        float loss;
        TRY(fsdp_optimizer_zero_grad(ctx, opt));
        TRY(fsdp_module_forward(ctx, m, tokens, &logits));
        if (!dlogits) TRY(fsdp_tensor_create_like(ctx, logits, &dlogits));
        TRY(fsdp_loss_cross_entropy_ignore(ctx, logits, tgt, FSDP_IGNORE_INDEX, &loss, dlogits));
        TRY(fsdp_module_backward(ctx, m, dlogits, NULL));
        TRY(fsdp_optimizer_step(ctx, opt));
        if (rank == 0) printf("step %d  loss (rank 0's rows) %.6f\n", step, loss);
    }
    TRY(fsdp_llama_config_to_hf_json(ctx, &model_cfg, &config));
    TRY(fsdp_state_create(ctx, &(fsdp_state_sources){.model = m, .sharded = sh, .optimizer = opt},
                          &state));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ckpt", jb->out);
    TRY(fsdp_ckpt_writer_create(ctx, dir, NULL, &w));
    char layout[64];
    snprintf(layout, sizeof layout, "dp=%d FULL_SHARD", jb->ranks);
    TRY(fsdp_ckpt_save(ctx, w, state,
                       &(fsdp_ckpt_meta){.step = STEPS, .layout = layout, .model_config = config}));
    /* Every rank runs the evaluation batch (FSDP gathers the parameters); rank 0 writes it. */
    const fsdp_tensor *logits;
    TRY(fsdp_tensor_from_blob(ctx, (void *)jb->eval, FSDP_DTYPE_I32, FSDP_CPU, 2,
                              (int64_t[]){B_EVAL, T_EVAL}, &eval));
    TRY(fsdp_module_forward(ctx, m, eval, &logits));
    if (rank == 0) {
        char shape[64];
        snprintf(shape, sizeof shape, "%d %d %lld\n", B_EVAL, T_EVAL,
                 (long long)model_cfg.vocab_size);
        TRY(write_file(ctx, jb->out, "shape.txt", shape, strlen(shape)));
        TRY(write_file(ctx, jb->out, "tokens.i32", jb->eval, sizeof jb->eval));
        TRY(write_file(ctx, jb->out, "logits.f32", fsdp_tensor_f32(logits),
                       sizeof(float) * (size_t)fsdp_tensor_numel(logits)));
        printf("saved %s\n", fsdp_ckpt_writer_last_path(w));
    }
done:
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(state);
    free(config);
    fsdp_tensor_free(dlogits);
    fsdp_tensor_free(eval);
    fsdp_tensor_free(tokens);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static int cmd_train(const char *out, int ranks) {
    static job jb;
    jb.out = out, jb.ranks = ranks;
    fill_tokens(jb.train, B_TRAIN * T_TRAIN, 7, (int)model_cfg.vocab_size);
    fill_tokens(jb.eval, B_EVAL * T_EVAL, 11, (int)model_cfg.vocab_size);
    for (int b = 0; b < B_TRAIN; b++) /* Hugging Face's shift: predict the next token */
        for (int t = 0; t < T_TRAIN; t++)
            jb.target[b * T_TRAIN + t] =
                t + 1 < T_TRAIN ? jb.train[b * T_TRAIN + t + 1] : FSDP_IGNORE_INDEX;
    fsdp_ctx *ctx = NULL;
    fsdp_world *world = NULL;
    fsdp_status st = fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1234}, &ctx);
    if (st == FSDP_OK)
        st = fsdp_world_create(ctx, &(fsdp_world_options){.nranks = ranks, .ctx = {.seed = 1234}},
                               &world);
    if (st == FSDP_OK) st = fsdp_world_run(ctx, world, train_rank, &jb);
    if (st != FSDP_OK) fprintf(stderr, "hf_llama_driver train: %s\n", fsdp_last_error(ctx));
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    return st == FSDP_OK ? 0 : 1;
}

static int cmd_logits(const char *ckpt, const char *tokens_path, int64_t b, int64_t t,
                      const char *out) {
    fsdp_ctx *ctx = NULL;
    fsdp_ckpt *ck = NULL;
    fsdp_module *m = NULL;
    fsdp_state *state = NULL;
    fsdp_tensor *tokens = NULL;
    int32_t *ids = malloc((size_t)(b * t) * sizeof *ids);
    FILE *f = fopen(tokens_path, "rb");
    bool read = ids && f && fread(ids, sizeof *ids, (size_t)(b * t), f) == (size_t)(b * t);
    if (f) fclose(f);
    fsdp_status st = fsdp_ctx_create(NULL, &ctx);
    if (st != FSDP_OK) return free(ids), 1;
    if (!read) {
        st = fsdp_ctx_set_error(ctx, FSDP_ERR_IO, "cannot read %lld token ids from '%s'",
                                (long long)(b * t), tokens_path);
        goto done;
    }
    fsdp_llama_config cfg;
    const fsdp_tensor *logits;
    TRY(fsdp_ckpt_open(ctx, ckpt, &ck));
    TRY(fsdp_llama_config_from_hf_json(ctx, fsdp_ckpt_model_config(ck), &cfg));
    TRY(fsdp_model_llama(ctx, &cfg, &m));
    TRY(fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &state));
    TRY(fsdp_ckpt_load(ctx, ck, state, NULL));
    TRY(fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){b, t}, &tokens));
    TRY(fsdp_module_forward(ctx, m, tokens, &logits));
    f = fopen(out, "wb");
    size_t n = (size_t)fsdp_tensor_numel(logits);
    bool ok = f && fwrite(fsdp_tensor_f32(logits), sizeof(float), n, f) == n;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) st = fsdp_ctx_set_error(ctx, FSDP_ERR_IO, "cannot write '%s'", out);
done:
    if (st != FSDP_OK) fprintf(stderr, "hf_llama_driver logits: %s\n", fsdp_last_error(ctx));
    fsdp_tensor_free(tokens);
    fsdp_state_free(state);
    fsdp_module_free(m);
    fsdp_ckpt_close(ck);
    fsdp_ctx_free(ctx);
    free(ids);
    return st == FSDP_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "train")) {
        int ranks = argc == 5 && !strcmp(argv[3], "--ranks") ? atoi(argv[4]) : 2;
        if ((argc == 3 || argc == 5) && (ranks == 1 || ranks == 2 || ranks == 4))
            return cmd_train(argv[2], ranks);
    } else if (argc == 7 && !strcmp(argv[1], "logits")) {
        int64_t b = atoll(argv[4]), t = atoll(argv[5]);
        if (b > 0 && t > 0 && b * t <= 1 << 20) return cmd_logits(argv[2], argv[3], b, t, argv[6]);
    }
    fprintf(stderr, "usage: hf_llama_driver train OUTDIR [--ranks 1|2|4]\n"
                    "       hf_llama_driver logits CKPT TOKENS B T OUT\n");
    return 2;
}
