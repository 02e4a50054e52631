/* train_config.c: fsdp-train's key table and everything it drives: defaults, the INI parser,
 * --set, validation, --help, the command line and the check that MPI ranks agree on it. */
#define _POSIX_C_SOURCE 200809L // open flags, fstat

#include "train_config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h> // defines: open, O_NONBLOCK
#include <float.h>
#include <fnmatch.h> // defines: fnmatch
#include <ini.h>     // defines: ini_parse_stream, ini_reader, ini_handler
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: fstat, S_ISREG
#include <unistd.h>   // defines: read, close

/* ---- the key table ------------------------------------------------------------------------ */

typedef enum key_type {
    KEY_INT,
    KEY_FLOAT,
    KEY_BOOL,
    KEY_STRING,
    KEY_ENUM,
    KEY_INT_LIST,
    KEY_FLOAT_LIST
} key_type;

typedef struct key_def {
    const char *section;
    const char *name;
    key_type type;
    size_t offset;   /* of the value in train_config */
    const char *def; /* the default, parsed like a value from a file */
    int64_t imin;    /* int, int-list entries: inclusive range */
    int64_t imax;
    double fmin; /* float: range; fmin excluded when fmin_open, fmax when fmax_open */
    double fmax;
    bool fmin_open;
    bool fmax_open;
    int min_count; /* int-list, float-list: number of entries; a float list's entries lie in
                      the float range */
    int max_count;
    const char *const *names;                /* enum: allowed values, NULL-terminated */
    bool (*parse_enum)(const char *, int *); /* enum: text (one of names) -> value; NULL: the
                                                value is the name's index */
    const char *help;
} key_def;

typedef struct section_def {
    const char *name;
    const char *help;
} section_def;

static const section_def g_sections[] = {
    {"model", "the model: an MLP of Linear layers with an activation between them, or a "
              "Llama-style decoder (kind = llama) trained on a token file"},
    {"parallel", "the ranks and how they share the work: data parallelism (FSDP or replicas) "
                 "over dp ranks, tensor parallelism over tp ranks, world = dp * tp"},
    {"data", "the dataset, synthetic (a random teacher MLP), an HDF5 file or a token file, the "
             "task, the held-out split and the batches"},
    {"optim", "the optimizer (SGD, Adam, AdamW as in PyTorch), its learning rate schedule and "
              "gradient clipping"},
    {"train", "the training loop"},
    {"checkpoint", "sharded checkpoints of the run (parameters, optimizer state, data position), "
                   "resuming from them at any layout, and the save on SIGINT/SIGTERM"},
    {"log", "progress lines and the metrics file"},
};
#define N_SECTIONS ((int)(sizeof g_sections / sizeof g_sections[0]))

static const char *const g_activation_names[] = {"relu", "gelu", "sigmoid", NULL};
static const char *const g_level_names[] = {"debug", "info", "warn", "error", "off", NULL};
/* These enums are the index of the name: train_backend, train_mode, fsdp_sharding_strategy,
 * train_wrap. */
static const char *const g_backend_names[] = {"local", "mpi", "auto", NULL};
static const char *const g_mode_names[] = {"fsdp", "replicate", NULL};
static const char *const g_strategy_names[] = {"full_shard", "shard_grad_op", "no_shard",
                                               "hybrid_shard", NULL};
static const char *const g_wrap_names[] = {"none", "layer", NULL};
static const char *const g_data_kind_names[] = {"synthetic", "h5", "tokens", NULL};
static const char *const g_model_kind_names[] = {"mlp", "llama", NULL};
static const char *const g_task_names[] = {"regression", "classification", NULL};
static const char *const g_optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const g_schedule_names[] = {"constant", "warmup", "cosine", NULL};
/* train_norm and train_progress_style are the index of the name too. */
static const char *const g_norm_names[] = {"none", "rmsnorm", NULL};
static const char *const g_progress_names[] = {"auto", "bar", "lines", NULL};
/* [parallel] mixed_precision: "param" (reduce in the same dtype, PyTorch's default) or
 * "param,reduce", each row's dtypes below. */
static const char *const g_mp_names[] = {"none",    "bf16",     "f16",     "bf16,f32",
                                         "f16,f32", "f32,bf16", "f32,f16", NULL};
static const fsdp_dtype g_mp_dtypes[][2] = {
    {FSDP_DTYPE_F32, FSDP_DTYPE_F32}, {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16},
    {FSDP_DTYPE_F16, FSDP_DTYPE_F16}, {FSDP_DTYPE_BF16, FSDP_DTYPE_F32},
    {FSDP_DTYPE_F16, FSDP_DTYPE_F32}, {FSDP_DTYPE_F32, FSDP_DTYPE_BF16},
    {FSDP_DTYPE_F32, FSDP_DTYPE_F16}};
static const char *const g_hook_names[] = {"default", "bf16", "fp16", NULL};

static bool parse_activation(const char *text, int *value) {
    fsdp_activation act;
    if (fsdp_activation_parse(text, &act) != FSDP_OK) return false;
    *value = (int)act;
    return true;
}

static bool parse_level(const char *text, int *value) {
    fsdp_log_level level;
    if (fsdp_log_level_parse(text, &level) != FSDP_OK) return false;
    *value = (int)level;
    return true;
}

_Static_assert(sizeof(fsdp_activation) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(fsdp_log_level) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(train_backend) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(train_mode) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(fsdp_sharding_strategy) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(train_wrap) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(train_data_kind) == sizeof(int) && sizeof(train_task) == sizeof(int) &&
                   sizeof(train_optim_name) == sizeof(int) && sizeof(train_schedule) == sizeof(int),
               "enum keys are stored as int");
_Static_assert(TRAIN_DATA_H5 == 1 && TRAIN_TASK_CLASSIFICATION == 1 && TRAIN_OPTIM_ADAMW == 2 &&
                   TRAIN_SCHEDULE_COSINE == 2 && (int)FSDP_LR_COSINE == 2 &&
                   (int)FSDP_LR_LINEAR_WARMUP == 1,
               "the enums above are the index of their name (and the schedule the library's)");
_Static_assert(sizeof(train_model_kind) == sizeof(int) && TRAIN_MODEL_LLAMA == 1 &&
                   TRAIN_DATA_TOKENS == 2,
               "enum keys are stored as int, the index of their name");
_Static_assert(sizeof(train_norm) == sizeof(int) && sizeof(train_progress_style) == sizeof(int) &&
                   TRAIN_NORM_RMSNORM == 1 && TRAIN_PROGRESS_LINES == 2,
               "enum keys are stored as int, the index of their name");
_Static_assert(TRAIN_BACKEND_AUTO == 2 && TRAIN_MODE_REPLICATE == 1 && TRAIN_WRAP_LAYER == 1 &&
                   FSDP_HYBRID_SHARD == 3,
               "the enums above are the index of their name");

#define OFF(field) offsetof(train_config, field)
#define BIG        INT64_MAX
#define WIDTH_MAX  (INT64_C(1) << 20)
#define INCL       false /* a float range includes its bound */
#define EXCL       true  /* a float range excludes its bound */

/* One constructor per type; the int ranges are inclusive. */
#define INT_KEY(sec, key, field, dflt, lo, hi, text)                                               \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_INT, .offset = OFF(field), .def = dflt,           \
        .imin = lo, .imax = hi, .help = text                                                       \
    }
#define FLOAT_KEY(sec, key, field, dflt, lo, lo_open, hi, hi_open, text)                           \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_FLOAT, .offset = OFF(field), .def = dflt,         \
        .fmin = lo, .fmin_open = lo_open, .fmax = hi, .fmax_open = hi_open, .help = text           \
    }
#define BOOL_KEY(sec, key, field, dflt, text)                                                      \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_BOOL, .offset = OFF(field), .def = dflt,          \
        .help = text                                                                               \
    }
#define STRING_KEY(sec, key, field, dflt, text)                                                    \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_STRING, .offset = OFF(field), .def = dflt,        \
        .help = text                                                                               \
    }
#define ENUM_KEY(sec, key, field, dflt, allowed, parse, text)                                      \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_ENUM, .offset = OFF(field), .def = dflt,          \
        .names = allowed, .parse_enum = parse, .help = text                                        \
    }
#define LIST_KEY(sec, key, field, dflt, n_min, n_max, lo, hi, text)                                \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_INT_LIST, .offset = OFF(field), .def = dflt,      \
        .min_count = n_min, .max_count = n_max, .imin = lo, .imax = hi, .help = text               \
    }
#define FLOATS_KEY(sec, key, field, dflt, count, lo, lo_open, hi, hi_open, text)                   \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_FLOAT_LIST, .offset = OFF(field), .def = dflt,    \
        .min_count = count, .max_count = count, .fmin = lo, .fmin_open = lo_open, .fmax = hi,      \
        .fmax_open = hi_open, .help = text                                                         \
    }

static const key_def g_keys[] = {
    ENUM_KEY("model", "kind", model.kind, "mlp", g_model_kind_names, NULL,
             "the model: mlp (Linear layers over widths, with an activation between them) or "
             "llama (a Llama-style decoder with Hugging Face's names over dim, n_layers, "
             "n_heads, ...; needs [data] kind = tokens)"),
    LIST_KEY("model", "widths", model.widths, "32,64,64,8", 2, TRAIN_MAX_LIST, 1, WIDTH_MAX,
             "mlp: layer widths, input first and output last: 32,64,8 is Linear(32, 64), "
             "activation, Linear(64, 8)"),
    ENUM_KEY("model", "activation", model.activation, "relu", g_activation_names, parse_activation,
             "mlp: activation between the Linear layers (the teacher uses it too)"),
    STRING_KEY("model", "init", model.init, "random",
               "initial parameters: random (drawn from train.seed), or the path of a state to "
               "take them from: a checkpoint step directory (a run's directory: its newest "
               "checkpoint), a PyTorch state dict (.safetensors or HDF5) of the model's names "
               "(mlp: nn.Sequential's 0.weight, 0.bias, 2.weight, ...), or a Hugging Face "
               "model directory (config.json with model.safetensors or its shards). Parameters "
               "only: the optimizer starts "
               "fresh. Ignored when the run resumes"),
    ENUM_KEY("model", "norm", model.norm, "none", g_norm_names, NULL,
             "mlp: normalisation of the input: none, or rmsnorm (an RMSNorm over widths[0] before "
             "the first Linear, as nn.Sequential(RMSNorm(w0), Linear, ...): the module names "
             "shift by one, the Linear layers become 1, 3, 5, ...)"),
    STRING_KEY("model", "tp_plan", model.tp_plan, "",
               "mlp: tensor-parallel plan with tp > 1: comma-separated name=style pairs over the "
               "model's module names (fnmatch patterns allowed), style colwise or rowwise, "
               "e.g. 0=colwise,2=rowwise; a colwise Linear needs a rowwise one after it. Empty: "
               "the Megatron pairs (Linear 2k colwise, 2k+1 rowwise)"),
    STRING_KEY("model", "checkpoint_activations", model.checkpoint_activations, "",
               "comma-separated module name patterns (fnmatch) whose activations are "
               "recomputed in backward instead of kept (fsdp_checkpoint_wrap), e.g. 0,2 or *; "
               "each must match a module (llama: a decoder layer, model.layers.<i>: "
               "model.layers.* for every one). Same results, less memory, one more forward"),
    INT_KEY("model", "dim", model.dim, "64", 2, WIDTH_MAX,
            "llama: hidden size (Hugging Face's hidden_size); n_heads divides it into heads of "
            "an even size"),
    INT_KEY("model", "n_layers", model.n_layers, "2", 1, 1024,
            "llama: decoder layers (num_hidden_layers)"),
    INT_KEY("model", "n_heads", model.n_heads, "4", 1, 4096,
            "llama: query heads (num_attention_heads); tp must divide it"),
    INT_KEY("model", "n_kv_heads", model.n_kv_heads, "0", 0, 4096,
            "llama: key/value heads (num_key_value_heads), dividing n_heads (grouped-query "
            "attention); 0: n_heads. tp must divide it"),
    INT_KEY("model", "vocab_size", model.vocab_size, "256", 2, INT64_C(1) << 24,
            "llama: tokens of the vocabulary (256 for the byte tokenizer of "
            "tools/text_to_tokens.py); every id of the token file must be below it; the "
            "embedding and lm_head split it over tp (unevenly when tp does not divide it)"),
    INT_KEY("model", "ffn_hidden", model.ffn_hidden, "0", 0, INT64_C(1) << 24,
            "llama: SwiGLU width (intermediate_size); 0: Meta's rule, 8 dim / 3 rounded up to a "
            "multiple of 256. tp must divide it"),
    INT_KEY("model", "max_seq_len", model.max_seq_len, "64", 1, 65536,
            "llama: the sequence length trained on (max_position_embeddings): each sequence "
            "is max_seq_len + 1 tokens of the token file, inputs and next-token targets"),
    FLOAT_KEY("model", "norm_eps", model.norm_eps, "1e-06", 0, EXCL, 1, EXCL,
              "llama: RMSNorm epsilon (rms_norm_eps)"),
    FLOAT_KEY("model", "rope_theta", model.rope_theta, "10000", 1, EXCL, 1e30, INCL,
              "llama: base of the rotary embedding (rope_theta)"),

    ENUM_KEY("parallel", "backend", parallel.backend, "auto", g_backend_names, NULL,
             "where the ranks run: local (rank threads in this process), mpi (one process per "
             "rank, started by mpirun), auto (mpi when started by mpirun, else local)"),
    INT_KEY("parallel", "ranks", parallel.ranks, "0", 0, 4096,
            "number of ranks, dp * tp. local: the rank threads (at most 1024), 0 means tp (one "
            "dp rank). mpi: the process count decides; 0 or that count"),
    INT_KEY("parallel", "threads_per_rank", parallel.threads_per_rank, "0", 0, 1024,
            "threads of each rank (its kernels split over them); 0: the cores "
            "(OPENBLAS_NUM_THREADS when set) divided by the ranks on this machine, at least 1"),
    INT_KEY("parallel", "tp", parallel.tp, "1", 1, 4096,
            "tensor-parallel size: mlp, the Linear layers in Colwise/Rowwise pairs over tp ranks "
            "(with an odd count the output Linear stays whole on every tp rank), tp dividing "
            "the hidden width each pair splits; llama, torchtitan's plan with loss parallel, "
            "tp dividing n_heads, n_kv_heads and ffn_hidden"),
    ENUM_KEY("parallel", "mode", parallel.mode, "fsdp", g_mode_names, NULL,
             "data parallelism over the dp = ranks / tp ranks: fsdp (fully sharded, see "
             "strategy) or replicate (a whole replica per rank, gradients all_reduced, as DDP)"),
    ENUM_KEY("parallel", "strategy", parallel.strategy, "full_shard", g_strategy_names, NULL,
             "fsdp sharding strategy: full_shard, shard_grad_op (keep gathered parameters "
             "from forward to backward), no_shard (DDP-like), hybrid_shard (full_shard within "
             "a shard group, replicated across the replica groups)"),
    INT_KEY("parallel", "replicas", parallel.replicas, "0", 0, 4096,
            "hybrid_shard: number of replica groups, dividing dp; each shard group has dp / "
            "replicas ranks. 0 picks the smallest prime factor of dp"),
    BOOL_KEY("parallel", "offload", parallel.offload, "false",
             "fsdp: keep the parameter shards, their gradients and the optimizer step in host "
             "memory (CPUOffload(offload_params=True))"),
    ENUM_KEY("parallel", "wrap", parallel.wrap, "none", g_wrap_names, NULL,
             "fsdp units: none (the root only) or layer (mlp: one nested unit per hidden Linear, "
             "the root keeps the output Linear; llama: one per decoder layer, the root keeps "
             "the embedding, the final norm and lm_head)"),
    BOOL_KEY("parallel", "use_orig_params", parallel.use_orig_params, "false",
             "fsdp: the optimizer steps views of the original parameters instead of flat "
             "shards"),
    BOOL_KEY("parallel", "sync_module_states", parallel.sync_module_states, "false",
             "broadcast the parameters from rank 0 at setup: tp shards from tp rank 0, then "
             "fsdp or replicate from dp rank 0 (every rank initialises the same values from "
             "train.seed anyway)"),
    INT_KEY("parallel", "timeout_s", parallel.timeout_s, "300", 1, 86400,
            "seconds a rank waits in a collective before the run fails with a timeout (the "
            "environment variable FSDP_COMM_TRACE_DIR: where each failing rank writes its last "
            "collectives)"),
    ENUM_KEY("parallel", "mixed_precision", parallel.mixed_precision, "none", g_mp_names, NULL,
             "the dtypes forward and backward compute with and gradients are reduced in "
             "(MixedPrecision(param_dtype, reduce_dtype), FSDP's or DDP's), param or "
             "param,reduce: bf16 computes with bf16 parameters (fsdp: gathered in bf16) and "
             "reduces gradients in bf16; bf16,f32 reduces in f32; f32,bf16 only reduces in "
             "bf16. The parameters the optimizer steps stay f32. none: f32 throughout"),
    ENUM_KEY("parallel", "comm_hook", parallel.comm_hook, "default", g_hook_names, NULL,
             "how gradients are reduced over dp (register_comm_hook): default (the average in "
             "f32), bf16 or fp16 (bf16_compress_hook, fp16_compress_hook: cast, reduce in "
             "half the bytes, cast back); not with a mixed_precision that sets the "
             "reduce dtype"),
    FLOAT_KEY("parallel", "bucket_mb", parallel.bucket_mb, "0", 0, INCL, 1048576, INCL,
              "replicate: the gradient buckets' size cap in MiB (DDP's bucket_cap_mb); 0: DDP's "
              "default, 25 MiB with a first bucket of 1 MiB"),
    BOOL_KEY("parallel", "pin_threads", parallel.pin_threads, "false",
             "pin each rank thread (and its worker threads) to its own cores, in rank order"),

    ENUM_KEY("data", "kind", data.kind, "synthetic", g_data_kind_names, NULL,
             "where the samples come from: synthetic (inputs from the counter RNG, targets from "
             "a fixed random teacher MLP; samples, seed, teacher_widths and noise describe it), "
             "h5 (datasets x and y of the HDF5 file path, held in memory by every rank) or "
             "tokens (the token file path, for [model] kind = llama: sequences of "
             "max_seq_len + 1 tokens at offsets drawn from seed)"),
    STRING_KEY("data", "path", data.path, "",
               "kind = h5: the HDF5 file; kind = tokens: the token file (written by "
               "tools/text_to_tokens.py); a path relative to the working directory"),
    STRING_KEY("data", "x", data.x, "x",
               "kind = h5: the inputs' dataset, float (samples, widths[0])"),
    STRING_KEY("data", "y", data.y, "y",
               "kind = h5: the targets' dataset: regression float (samples, output width); "
               "classification integer class ids (samples,) in [0, output width)"),
    ENUM_KEY("data", "task", data.task, "regression", g_task_names, NULL,
             "regression (MSE loss) or classification (cross-entropy over the output width = "
             "the number of classes, accuracy reported; synthetic: the class is the argmax of "
             "the teacher's output)"),
    FLOAT_KEY("data", "eval_fraction", data.eval_fraction, "0", 0, INCL, 1, EXCL,
              "fraction of the samples held out for evaluation: the last "
              "floor(samples * eval_fraction) samples in file order (shuffle the file "
              "beforehand if it is sorted; kind = tokens: the last tokens of the file); 0: no "
              "held-out split"),
    BOOL_KEY("data", "shuffle", data.shuffle, "false",
             "visit the training samples in a new permutation every epoch, drawn from seed and "
             "the epoch by global index (the same batches on every layout); false: in order"),
    INT_KEY("data", "eval_batches", data.eval_batches, "4", 1, 1000000,
            "kind = tokens: batches of batch_size sequences an evaluation scores: the first "
            "ones of the held-out tokens, cut into sequences of max_seq_len + 1 tokens (as "
            "many as there are, up to this), and as many evenly spaced ones of the training "
            "tokens for the loss before and after training"),
    INT_KEY("data", "samples", data.samples, "4096", 1, 100000000,
            "synthetic: number of samples in the dataset; the batches cycle through them"),
    INT_KEY("data", "batch_size", data.batch_size, "64", 1, 10000000,
            "samples per step (kind = tokens: sequences, a multiple of dp)"),
    INT_KEY("data", "seed", data.seed, "1", 0, BIG,
            "seed of the shuffle, (tokens) of the sequences' offsets and (synthetic) of the "
            "inputs, the teacher's parameters and the label noise"),
    LIST_KEY("data", "teacher_widths", data.teacher_widths, "64", 0, TRAIN_MAX_LIST - 2, 1,
             WIDTH_MAX,
             "synthetic: hidden widths of the teacher MLP (its input and output widths are the "
             "model's); empty for a linear teacher"),
    FLOAT_KEY("data", "noise", data.noise, "0", 0, INCL, HUGE_VAL, INCL,
              "synthetic: standard deviation of Gaussian noise added to the targets "
              "(regression)"),

    ENUM_KEY("optim", "name", optim.name, "sgd", g_optim_names, NULL,
             "the optimizer, as PyTorch's: sgd, adam (weight_decay as L2 in the gradient) or "
             "adamw (decoupled weight decay)"),
    FLOAT_KEY("optim", "lr", optim.lr, "0.2", 0, EXCL, HUGE_VAL, INCL,
              "learning rate; with a schedule, its peak"),
    FLOAT_KEY("optim", "momentum", optim.momentum, "0.9", 0, INCL, 1, EXCL,
              "sgd: momentum factor (0: none)"),
    BOOL_KEY("optim", "nesterov", optim.nesterov, "false",
             "sgd: Nesterov momentum (needs momentum > 0)"),
    FLOATS_KEY("optim", "betas", optim.betas, "0.9,0.999", 2, 0, INCL, 1, EXCL,
               "adam, adamw: beta1,beta2, the decay rates of the moment estimates"),
    FLOAT_KEY("optim", "eps", optim.eps, "1e-08", 0, EXCL, 1, INCL,
              "adam, adamw: added to the denominator"),
    FLOAT_KEY("optim", "weight_decay", optim.weight_decay, "0", 0, INCL, HUGE_VAL, INCL,
              "sgd and adam: L2 penalty added to the gradient (weight_decay * parameter); "
              "adamw: decoupled decay (parameter *= 1 - lr * weight_decay)"),
    STRING_KEY("optim", "no_decay", optim.no_decay, "",
               "comma-separated parameter name patterns (fnmatch, * matches any text, dots "
               "too) whose parameters get weight_decay 0, e.g. *.bias; names are "
               "nn.Sequential's: 0.weight, 0.bias, 2.weight, ... Each pattern must match a "
               "parameter. Under mode = fsdp it needs use_orig_params = true"),
    FLOAT_KEY("optim", "clip_grad_norm", optim.clip_grad_norm, "0", 0, INCL, HUGE_VAL, INCL,
              "clip the gradients to this global L2 norm (over every shard and tp rank) before "
              "each update; 0: no clipping"),
    ENUM_KEY("optim", "schedule", optim.schedule, "constant", g_schedule_names, NULL,
             "learning rate schedule: constant (lr), warmup (lr * step / warmup_steps, then "
             "lr), cosine (the warmup, then cosine from lr down to min_lr at the last step)"),
    INT_KEY("optim", "warmup_steps", optim.warmup_steps, "0", 0, BIG,
            "warmup and cosine: steps of linear warmup (0: none); cosine needs fewer than "
            "[train] steps"),
    FLOAT_KEY("optim", "min_lr", optim.min_lr, "0", 0, INCL, HUGE_VAL, INCL,
              "cosine: the learning rate at the last step, at most lr"),

    INT_KEY("train", "steps", train.steps, "5000", 1, BIG, "optimizer steps to run"),
    INT_KEY("train", "seed", train.seed, "0", 0, BIG,
            "seed of the model's parameter initialisation"),
    INT_KEY("train", "log_every", train.log_every, "500", 1, BIG,
            "steps between progress lines and metrics records (the last step is always "
            "logged)"),
    INT_KEY("train", "eval_every", train.eval_every, "0", 0, BIG,
            "steps between evaluations on the held-out split ([data] eval_fraction > 0): its "
            "loss and, for classification, accuracy, printed and in the metrics; 0: after the "
            "last step only"),
    INT_KEY("train", "grad_accum", train.grad_accum, "1", 1, 1048576,
            "gradient accumulation: micro-batches per step, dividing [data] batch_size; each "
            "runs forward and backward on batch_size / grad_accum samples without reducing "
            "gradients (no_sync), and the last one reduces them all"),

    STRING_KEY("checkpoint", "dir", checkpoint.dir, "",
               "directory of the run's checkpoints, a step-<8 digits> directory per save; "
               "empty: no checkpoints, no resume = auto, no save on SIGINT/SIGTERM"),
    INT_KEY("checkpoint", "every", checkpoint.every, "0", 0, BIG,
            "steps between checkpoints; 0: only the final one (with dir set, one is always "
            "saved at the end of training and on SIGINT/SIGTERM)"),
    INT_KEY("checkpoint", "keep", checkpoint.keep, "0", 0, 1000000,
            "newest checkpoints kept in dir, older ones deleted after each save; 0 keeps all"),
    STRING_KEY("checkpoint", "resume", checkpoint.resume, "auto",
               "auto: continue from the newest complete checkpoint in dir, or start fresh "
               "when there is none; none: start fresh; or the path of a checkpoint step "
               "directory to continue from. The model, data and optim keys must be the "
               "checkpoint's; the parallel layout may differ"),
    BOOL_KEY("checkpoint", "async", checkpoint.async, "false",
             "write checkpoints in a background thread while training goes on (a step waits "
             "only while the values are copied)"),

    ENUM_KEY("log", "level", log.level, "info", g_level_names, parse_level,
             "debug and info print progress lines (debug also the effective config); warn, "
             "error and off print only problems"),
    STRING_KEY("log", "metrics", log.metrics, "",
               "path of a JSON-lines file to append one record per logged step to (with the "
               "steps' compute and communication seconds and rank 0's collectives per op); "
               "empty for none"),
    BOOL_KEY("log", "comm_debug", log.comm_debug, "false",
             "print rank 0's collectives of one step (the run's second) as a table (op, group, "
             "phase, calls, bytes, module), from the comm-debug layer; the progress lines then "
             "split the steps' time into compute and comm"),
    ENUM_KEY("log", "progress", log.progress, "auto", g_progress_names, NULL,
             "between the log lines: auto (a progress bar when stdout is a terminal, nothing "
             "else), bar (always the bar, redrawn in place with \\r) or lines (only the log "
             "lines)"),
};
#define N_KEYS ((int)(sizeof g_keys / sizeof g_keys[0]))
_Static_assert(sizeof g_keys / sizeof g_keys[0] <= TRAIN_MAX_KEYS, "raise TRAIN_MAX_KEYS");

static int find_section(const char *name) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (strcmp(g_sections[i].name, name) == 0) return i;
    return -1;
}

static int find_key(const char *section, const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(g_keys[i].section, section) == 0 && strcmp(g_keys[i].name, name) == 0) return i;
    return -1;
}

/* ---- describing keys: one text serves --help and the error messages ---------------------- */

/* Appends printf-style text to buf (size bytes), keeping it NUL-terminated. */
void train_append(char *buf, size_t size, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
}

static void describe_int_range(const key_def *k, char *buf, size_t size) {
    if (k->imax == BIG)
        train_append(buf, size, ">= %lld", (long long)k->imin);
    else
        train_append(buf, size, "in [%lld, %lld]", (long long)k->imin, (long long)k->imax);
}

static void describe_float_range(const key_def *k, char *buf, size_t size) {
    train_append(buf, size, "%s %g", k->fmin_open ? ">" : ">=", k->fmin);
    if (isfinite(k->fmax))
        train_append(buf, size, " and %s %g", k->fmax_open ? "<" : "<=", k->fmax);
}

/* What a value of key k must be: "a float > 0", "one of relu, gelu, sigmoid", ... */
static void describe_expected(const key_def *k, char *buf, size_t size) {
    buf[0] = '\0';
    switch (k->type) {
    case KEY_INT:
        train_append(buf, size, "an integer ");
        describe_int_range(k, buf, size);
        break;
    case KEY_FLOAT:
        train_append(buf, size, "a float ");
        describe_float_range(k, buf, size);
        break;
    case KEY_BOOL:
        train_append(buf, size, "true or false (or yes/no, on/off, 1/0)");
        break;
    case KEY_STRING:
        train_append(buf, size, "a string of at most %d characters", TRAIN_MAX_STRING - 1);
        break;
    case KEY_ENUM:
        train_append(buf, size, "one of ");
        for (int i = 0; k->names[i]; i++)
            train_append(buf, size, "%s%s", i ? ", " : "", k->names[i]);
        break;
    case KEY_INT_LIST:
        if (k->min_count == 0)
            train_append(buf, size, "a comma-separated list of up to %d integers ", k->max_count);
        else
            train_append(buf, size, "a comma-separated list of %d to %d integers ", k->min_count,
                         k->max_count);
        describe_int_range(k, buf, size);
        if (k->min_count == 0) train_append(buf, size, ", or nothing");
        break;
    case KEY_FLOAT_LIST:
        train_append(buf, size, "%d comma-separated floats, each ", k->min_count);
        describe_float_range(k, buf, size);
        break;
    }
}

static const char *type_name(const key_def *k) {
    switch (k->type) {
    case KEY_INT:
        return "int";
    case KEY_FLOAT:
        return "float";
    case KEY_BOOL:
        return "bool";
    case KEY_STRING:
        return "string";
    case KEY_ENUM:
        return "enum";
    case KEY_INT_LIST:
        return "int list";
    case KEY_FLOAT_LIST:
        return "float list";
    }
    return "?";
}

static void list_keys(const char *section, char *buf, size_t size) {
    int n = 0;
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(g_keys[i].section, section) == 0)
            train_append(buf, size, "%s%s", n++ ? ", " : "", g_keys[i].name);
}

static void list_sections(char *buf, size_t size) {
    for (int i = 0; i < N_SECTIONS; i++)
        train_append(buf, size, "%s[%s]", i ? ", " : "", g_sections[i].name);
}

/* ---- parsing values ----------------------------------------------------------------------- */

/* Parses a decimal integer: returns 0, or 1 when text is not one, or 2 when it overflows. */
static int parse_int(const char *text, int64_t *out) {
    if (!*text) return 1;
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (*end) return 1;
    if (errno == ERANGE) return 2;
    *out = (int64_t)v;
    return 0;
}

static bool parse_bool(const char *text, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(text, yes[i]) == 0) return *out = true, true;
        if (strcmp(text, no[i]) == 0) return *out = false, true;
    }
    return false;
}

/* Parses a float in key k's range: returns 0, or 1 when text is not a number, 2 when it
 * overflows a double, 3 when it is not finite, 4 when it is out of range. */
static int parse_float(const key_def *k, const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end) return 1;
    if (errno == ERANGE && isinf(v)) return 2; /* an underflow (to 0 or a subnormal) is a value */
    if (!isfinite(v)) return 3;
    bool low = k->fmin_open ? v <= k->fmin : v < k->fmin;
    bool high = k->fmax_open ? v >= k->fmax : v > k->fmax;
    if (low || high) return 4;
    *out = v;
    return 0;
}

static const char *float_problem(int bad) {
    return bad == 2   ? "overflows a double (the largest is 1.79769e+308)"
           : bad == 3 ? "not a finite number"
                      : "out of range";
}

/* One item of a comma-separated list: len bytes at text, the white space around it removed. */
typedef struct list_item {
    const char *text;
    size_t len;
} list_item;

/* Splits text at its commas into items (white space around each removed); a blank text has
 * none, and a comma at the end leaves an empty last item. Returns their number, or -1 when
 * there are more than max (items holds max). Every list of the configuration is split here. */
static int split_list(const char *text, int max, list_item *items) {
    const char *p = text;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return 0;
    for (int n = 0;; n++) {
        size_t len = strcspn(p, ","), b = 0, e = len;
        if (n == max) return -1;
        while (b < e && (p[b] == ' ' || p[b] == '\t')) b++;
        while (e > b && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
        items[n] = (list_item){p + b, e - b};
        p += len;
        if (!*p) return n + 1;
        p++; /* the comma */
    }
}

/* Copies an item into buf (size bytes) as a string; false when it does not fit (cut). */
static bool item_text(const list_item *item, char *buf, size_t size) {
    snprintf(buf, size, "%.*s", (int)item->len, item->text);
    return item->len < size;
}

/* The comma-separated patterns of a string key's value into patterns (at most max): their
 * number (0 for a blank value), or -1 when one is empty or there are more than max. */
static int split_patterns(const char *value, int max, char (*patterns)[TRAIN_MAX_STRING]) {
    list_item items[TRAIN_MAX_LIST];
    int n = split_list(value, max < TRAIN_MAX_LIST ? max : TRAIN_MAX_LIST, items);
    for (int i = 0; i < n; i++)
        if (!items[i].len || !item_text(&items[i], patterns[i], TRAIN_MAX_STRING)) return -1;
    return n;
}

/* Parses text as a value of key k into cfg; on failure writes what is wrong after "bad value
 * 'text' for [section] key: " into why. */
static bool parse_value(const key_def *k, const char *text, train_config *cfg, char *why,
                        size_t why_size) {
    char expected[256];
    describe_expected(k, expected, sizeof expected);
    void *field = (char *)cfg + k->offset;
    why[0] = '\0';
    switch (k->type) {
    case KEY_INT: {
        int64_t v;
        int bad = parse_int(text, &v);
        if (bad == 1) break;
        if (bad || v < k->imin || v > k->imax) {
            snprintf(why, why_size, "out of range; expected %s", expected);
            return false;
        }
        *(int64_t *)field = v;
        return true;
    }
    case KEY_FLOAT: {
        double v;
        int bad = parse_float(k, text, &v);
        if (bad == 1) break;
        if (bad) {
            snprintf(why, why_size, "%s; expected %s", float_problem(bad), expected);
            return false;
        }
        *(double *)field = v;
        return true;
    }
    case KEY_FLOAT_LIST: {
        train_float_list list = {0};
        list_item items[TRAIN_MAX_FLOAT_LIST];
        list.n = split_list(text, k->max_count, items);
        if (list.n < 0) {
            snprintf(why, why_size, "more than %d entries; expected %s", k->max_count, expected);
            return false;
        }
        for (int i = 0; i < list.n; i++) {
            char item[64];
            int bad =
                item_text(&items[i], item, sizeof item) ? parse_float(k, item, &list.v[i]) : 1;
            if (bad) {
                snprintf(why, why_size, "entry %d '%s' is %s; expected %s", i + 1, item,
                         bad == 1 ? "not a number" : float_problem(bad), expected);
                return false;
            }
        }
        if (list.n < k->min_count) {
            snprintf(why, why_size, "%d entr%s; expected %s", list.n, list.n == 1 ? "y" : "ies",
                     expected);
            return false;
        }
        *(train_float_list *)field = list;
        return true;
    }
    case KEY_BOOL: {
        bool v;
        if (!parse_bool(text, &v)) break;
        *(bool *)field = v;
        return true;
    }
    case KEY_STRING:
        if (strlen(text) >= TRAIN_MAX_STRING) break;
        memcpy(field, text, strlen(text) + 1);
        return true;
    case KEY_ENUM:
        for (int i = 0; k->names[i]; i++) {
            int v = i;
            if (strcmp(text, k->names[i]) == 0 && (!k->parse_enum || k->parse_enum(text, &v))) {
                memcpy(field, &v, sizeof v);
                return true;
            }
        }
        break;
    case KEY_INT_LIST: {
        train_int_list list = {0};
        list_item items[TRAIN_MAX_LIST];
        list.n = split_list(text, k->max_count, items);
        if (list.n < 0) {
            snprintf(why, why_size, "more than %d entries; expected %s", k->max_count, expected);
            return false;
        }
        for (int i = 0; i < list.n; i++) {
            char item[64];
            if (i > 0 && i == list.n - 1 && items[i].len == 0) {
                snprintf(why, why_size, "trailing comma; expected %s", expected);
                return false;
            }
            int bad = item_text(&items[i], item, sizeof item) ? parse_int(item, &list.v[i]) : 2;
            if (bad == 1) {
                snprintf(why, why_size, "entry %d '%s' is not an integer; expected %s", i + 1, item,
                         expected);
                return false;
            }
            if (bad || list.v[i] < k->imin || list.v[i] > k->imax) {
                snprintf(why, why_size, "entry %d (%s) is out of range; expected %s", i + 1, item,
                         expected);
                return false;
            }
        }
        if (list.n < k->min_count) {
            snprintf(why, why_size, "%d entr%s; expected %s", list.n, list.n == 1 ? "y" : "ies",
                     expected);
            return false;
        }
        *(train_int_list *)field = list;
        return true;
    }
    }
    snprintf(why, why_size, "expected %s", expected);
    return false;
}

/* The shortest "%g" text of v, up to 17 digits, that reads back as v: "0.2", not
 * "0.20000000000000001", yet two different doubles never print the same. */
static void format_double(double v, char *buf, size_t size) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Writes key k's current value as it would appear in a file: the canonical text, equal for
 * equal values only. */
static void format_value(const train_config *cfg, const key_def *k, char *buf, size_t size) {
    const void *field = (const char *)cfg + k->offset;
    buf[0] = '\0';
    switch (k->type) {
    case KEY_INT:
        train_append(buf, size, "%lld", (long long)*(const int64_t *)field);
        break;
    case KEY_FLOAT:
        format_double(*(const double *)field, buf, size);
        break;
    case KEY_BOOL:
        train_append(buf, size, "%s", *(const bool *)field ? "true" : "false");
        break;
    case KEY_STRING:
        train_append(buf, size, "%s", (const char *)field);
        break;
    case KEY_ENUM: {
        int v, want;
        memcpy(&want, field, sizeof want);
        for (int i = 0; k->names[i]; i++)
            if ((k->parse_enum ? k->parse_enum(k->names[i], &v) : (v = i, true)) && v == want)
                train_append(buf, size, "%s", k->names[i]);
        break;
    }
    case KEY_INT_LIST: {
        const train_int_list *list = field;
        for (int i = 0; i < list->n; i++)
            train_append(buf, size, "%s%lld", i ? "," : "", (long long)list->v[i]);
        break;
    }
    case KEY_FLOAT_LIST: {
        const train_float_list *list = field;
        for (int i = 0; i < list->n; i++) {
            char v[64];
            format_double(list->v[i], v, sizeof v);
            train_append(buf, size, "%s%s", i ? "," : "", v);
        }
        break;
    }
    }
}

/* Sets key `idx` from text; on failure writes "<where>: bad value ..." into err. */
static bool set_key(train_config *cfg, int idx, const char *text, const char *where, char *err,
                    size_t err_size) {
    const key_def *k = &g_keys[idx];
    char why[512];
    if (!parse_value(k, text, cfg, why, sizeof why)) {
        snprintf(err, err_size, "%s: bad value '%s' for [%s] %s: %s", where, text, k->section,
                 k->name, why);
        return false;
    }
    /* keep the end of an overlong origin: it holds the line number */
    size_t n = strlen(where), keep = TRAIN_MAX_ORIGIN - 4;
    if (n < TRAIN_MAX_ORIGIN) {
        memcpy(cfg->origin[idx], where, n + 1);
    } else {
        memcpy(cfg->origin[idx], "...", 3);
        memcpy(cfg->origin[idx] + 3, where + n - keep, keep + 1);
    }
    return true;
}

/* Resolves [section] name; on failure writes "<where>: unknown ..." into err. */
static int lookup(const char *section, const char *name, const char *where, char *err,
                  size_t err_size) {
    char allowed[512] = "";
    if (find_section(section) < 0) {
        list_sections(allowed, sizeof allowed);
        if (!*section)
            snprintf(err, err_size, "%s: key '%s' is outside any section; allowed sections: %s",
                     where, name, allowed);
        else
            snprintf(err, err_size, "%s: unknown section [%s]; allowed sections: %s", where,
                     section, allowed);
        return -1;
    }
    int idx = find_key(section, name);
    if (idx < 0) {
        list_keys(section, allowed, sizeof allowed);
        snprintf(err, err_size, "%s: unknown key '%s' in section [%s]; allowed keys: %s", where,
                 name, section, allowed);
    }
    return idx;
}

void train_config_init(train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_KEYS; i++) {
        char err[TRAIN_ERROR_SIZE];
        if (!set_key(cfg, i, g_keys[i].def, "default", err, sizeof err)) {
            fprintf(stderr, "fsdp-train: broken default in the key table: %s\n", err);
            abort();
        }
    }
}

const char *train_config_origin(const train_config *cfg, const char *section, const char *name) {
    int idx = find_key(section, name);
    return idx < 0 ? NULL : cfg->origin[idx];
}

/* ---- the INI file ------------------------------------------------------------------------- */

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "neither a file nor a directory";
}

/* Reads the regular file at path whole into *text (size bytes; the caller frees it). Anything
 * else is refused before a byte is read: a FIFO would block and a device may never end. So is
 * a file of more than TRAIN_MAX_CONFIG_BYTES bytes, however its size was reported. */
static fsdp_status read_config_file(const char *path, char **text, size_t *size, char *err,
                                    size_t err_size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); /* a FIFO: no wait */
    if (fd < 0) {
        snprintf(err, err_size, "cannot open config '%s': %s", path, strerror(errno));
        return FSDP_ERR_IO;
    }
    struct stat sb;
    bool stat_ok = fstat(fd, &sb) == 0;
    if (!stat_ok || !S_ISREG(sb.st_mode)) {
        if (!stat_ok)
            snprintf(err, err_size, "cannot read config '%s': %s", path, strerror(errno));
        else
            snprintf(err, err_size,
                     "cannot read config '%s': not a regular file (%s); give the path of an INI "
                     "file",
                     path, file_kind(sb.st_mode));
        close(fd);
        return FSDP_ERR_IO;
    }
    size_t cap = TRAIN_MAX_CONFIG_BYTES, n = 0;
    char *buf = malloc(cap + 1); /* one byte more tells a file over the cap */
    while (buf && n <= cap) {
        ssize_t got = read(fd, buf + n, cap + 1 - n);
        if (got == 0) break;
        if (got > 0) {
            n += (size_t)got;
        } else if (errno != EINTR) {
            snprintf(err, err_size, "cannot read config '%s': %s", path, strerror(errno));
            free(buf);
            close(fd);
            return FSDP_ERR_IO;
        }
    }
    close(fd);
    if (!buf) {
        snprintf(err, err_size, "cannot read config '%s': out of memory", path);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    if (n > cap) {
        snprintf(err, err_size,
                 "cannot read config '%s': larger than the limit of %d bytes (1 MiB); a config "
                 "file is a few lines of text",
                 path, TRAIN_MAX_CONFIG_BYTES);
        free(buf);
        return FSDP_ERR_CONFIG;
    }
    *text = buf;
    *size = n;
    return FSDP_OK;
}

typedef struct ini_state {
    train_config *cfg;
    const char *path;
    const char *text; /* the whole file, size bytes, no NUL among them */
    size_t size;
    size_t pos;    /* where the next line starts */
    int line;      /* lines handed to libinih so far: the one it is parsing */
    bool indented; /* that line starts with white space */
    int last_key;  /* key set by the previous handler call, -1 after a section line */
    int key_line[TRAIN_MAX_KEYS]; /* line that set each key in this file, 0 if none */
    int err_line;                 /* line of the first error, 0 while none */
    char *err;
    size_t err_size;
} ini_state;

static void ini_fail(ini_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ini_fail(ini_state *st, const char *fmt, ...) {
    int n = snprintf(st->err, st->err_size, "%s:%d: ", st->path, st->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < st->err_size) vsnprintf(st->err + n, st->err_size - n, fmt, ap);
    va_end(ap);
    st->err_line = st->line;
}

/* Checks a "[section]" line, which libinih never shows the handler when the section is empty:
 * the section must exist and nothing but white space or a comment (" ;...") may follow the
 * ']' (libinih ignores the rest). The ']' is found as libinih finds it; a line without one is
 * left to libinih's syntax error. */
static bool check_section_line(ini_state *st, const char *line) {
    while (isspace((unsigned char)*line)) line++;
    if (*line != '[') return true;
    const char *end = line + 1;
    bool space = false;
    while (*end && *end != ']' && !(space && *end == ';')) space = isspace((unsigned char)*end++);
    if (*end != ']') return true;
    int len = (int)(end - line - 1);
    char name[128];
    snprintf(name, sizeof name, "%.*s", len, line + 1);
    if (len >= (int)sizeof name || find_section(name) < 0) {
        char allowed[256] = "";
        list_sections(allowed, sizeof allowed);
        ini_fail(st, "unknown section [%.*s]; allowed sections: %s", len, line + 1, allowed);
        return false;
    }
    const char *rest = end + 1, *text = rest;
    while (isspace((unsigned char)*text)) text++;
    if (*text && !(text > rest && *text == ';')) {
        size_t n = strlen(text);
        while (n && isspace((unsigned char)text[n - 1])) n--;
        ini_fail(st,
                 "text after ']' in the section header [%s]: '%.*s'; only a comment (' ; ...') "
                 "may follow it",
                 name, (int)n, text);
        return false;
    }
    return true;
}

/* libinih's reader: hands it the next line of the file, read whole beforehand, into its
 * buffer of num bytes. Counts lines as libinih does, refuses a line longer than TRAIN_MAX_LINE
 * characters (or than libinih's buffer holds, were that less) instead of letting it be cut,
 * and checks section headers. */
static char *ini_read(char *str, int num, void *stream) {
    ini_state *st = stream;
    if (st->err_line || st->pos >= st->size) return NULL; /* stop at the first error */
    const char *s = st->text + st->pos;
    const char *nl = memchr(s, '\n', st->size - st->pos);
    size_t len = nl ? (size_t)(nl - s) : st->size - st->pos; /* without the newline */
    st->pos += len + (nl != NULL);
    st->line++;
    if (st->line == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3, len -= 3; /* BOM */
    size_t limit = num - 2 < TRAIN_MAX_LINE ? (size_t)num - 2 : TRAIN_MAX_LINE;
    if (len > limit) {
        ini_fail(st, "line is longer than %zu characters (it has %zu)", limit, len);
        return NULL;
    }
    memcpy(str, s, len);
    str[len] = '\0';
    st->indented = isspace((unsigned char)str[0]);
    if (!(st->indented && st->last_key >= 0)) { /* else libinih takes it as a continuation */
        if (!check_section_line(st, str)) return NULL;
        if (str[strspn(str, " \t\r\v\f")] == '[') st->last_key = -1;
    }
    return str;
}

static int ini_handle(void *user, const char *section, const char *name, const char *value) {
    ini_state *st = user;
    if (st->err_line) return 0;
    char where[1024]; /* origins keep TRAIN_MAX_ORIGIN bytes of it */
    snprintf(where, sizeof where, "%s:%d", st->path, st->line);
    if (st->indented && st->last_key >= 0 && strcmp(g_keys[st->last_key].section, section) == 0 &&
        strcmp(g_keys[st->last_key].name, name) == 0) {
        ini_fail(st,
                 "indented line continues the value of [%s] %s (a multi-line value, which is "
                 "not supported); remove the indentation",
                 section, name);
        return 0;
    }
    int idx = lookup(section, name, where, st->err, st->err_size);
    if (idx < 0) {
        st->err_line = st->line;
        return 0;
    }
    if (st->key_line[idx]) {
        ini_fail(st, "[%s] %s is set twice (first on line %d)", section, name, st->key_line[idx]);
        return 0;
    }
    if (!set_key(st->cfg, idx, value, where, st->err, st->err_size)) {
        st->err_line = st->line;
        return 0;
    }
    st->key_line[idx] = st->line;
    st->last_key = idx;
    return 1;
}

fsdp_status train_config_load(train_config *cfg, const char *path, char *err, size_t err_size) {
    char *text = NULL;
    size_t size = 0;
    fsdp_status status = read_config_file(path, &text, &size, err, err_size);
    if (status != FSDP_OK) return status;
    const char *nul = memchr(text, '\0', size);
    if (nul) { /* libinih would end the line there and read what follows as another line */
        size_t offset = (size_t)(nul - text);
        int line = 1;
        for (const char *p = text; (p = memchr(p, '\n', (size_t)(nul - p))); p++) line++;
        snprintf(err, err_size,
                 "%s:%d: NUL byte at byte offset %zu; a config file is text without NUL bytes "
                 "(is this the right file?)",
                 path, line, offset);
        free(text);
        return FSDP_ERR_CONFIG;
    }
    ini_state st = {.cfg = cfg,
                    .path = path,
                    .text = text,
                    .size = size,
                    .last_key = -1,
                    .err = err,
                    .err_size = err_size};
    int rc = ini_parse_stream(ini_read, &st, ini_handle, &st);
    free(text);
    if (rc > 0 && (st.err_line == 0 || rc < st.err_line)) {
        snprintf(err, err_size,
                 "%s:%d: syntax error: expected '[section]', 'key = value' or a comment "
                 "(starting with ; or #)",
                 path, rc);
        return FSDP_ERR_CONFIG;
    }
    if (rc < 0) {
        snprintf(err, err_size, "cannot parse config '%s': out of memory", path);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    return st.err_line ? FSDP_ERR_CONFIG : FSDP_OK;
}

/* ---- --set, checks, help ------------------------------------------------------------------ */

/* Copies s[0, n) without surrounding white space into buf, cut to fit; returns its length
 * uncut. */
static size_t copy_trimmed(char *buf, size_t size, const char *s, size_t n) {
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    snprintf(buf, size, "%.*s", (int)n, s);
    return n;
}

fsdp_status train_config_set(train_config *cfg, const char *assignment, char *err,
                             size_t err_size) {
    char where[1024]; /* origins keep TRAIN_MAX_ORIGIN bytes of it */
    snprintf(where, sizeof where, "--set %s", assignment);
    const char *eq = strchr(assignment, '=');
    const char *dot = eq ? memchr(assignment, '.', (size_t)(eq - assignment)) : NULL;
    if (!eq || !dot) {
        snprintf(err, err_size, "bad --set '%s': expected section.key=value, e.g. optim.lr=0.1",
                 assignment);
        return FSDP_ERR_CONFIG;
    }
    /* a section or key name cut to 63 bytes matches no key: it is reported unknown */
    char section[64], name[64], value[TRAIN_MAX_VALUE + 1];
    copy_trimmed(section, sizeof section, assignment, (size_t)(dot - assignment));
    copy_trimmed(name, sizeof name, dot + 1, (size_t)(eq - dot - 1));
    size_t len = copy_trimmed(value, sizeof value, eq + 1, strlen(eq + 1));
    int idx = lookup(section, name, where, err, err_size);
    if (idx < 0) return FSDP_ERR_CONFIG;
    if (len > TRAIN_MAX_VALUE) {
        snprintf(err, err_size,
                 "--set %.*s%.40s...: the value of [%s] %s has %zu characters, longer than the "
                 "limit of %d characters",
                 (int)(eq + 1 - assignment), assignment, eq + 1, section, name, len,
                 TRAIN_MAX_VALUE);
        return FSDP_ERR_CONFIG;
    }
    return set_key(cfg, idx, value, where, err, err_size) ? FSDP_OK : FSDP_ERR_CONFIG;
}

#define KEY_TEXT_SIZE 768 /* enough for most; a longer one is truncated */

const char *train_config_key_text(const train_config *cfg, const char *section, const char *name,
                                  char *buf, size_t size) {
    int idx = find_key(section, name);
    char value[TRAIN_MAX_STRING + 64];
    format_value(cfg, &g_keys[idx], value, sizeof value);
    buf[0] = '\0';
    train_append(buf, size, "[%s] %s = %s (%s)", section, name, value, cfg->origin[idx]);
    return buf;
}

/* Whether key [section] name holds a value other than its default. */
static bool is_changed(const train_config *cfg, const char *section, const char *name) {
    int idx = find_key(section, name);
    char value[TRAIN_MAX_STRING + 64], def[TRAIN_MAX_STRING + 64];
    format_value(cfg, &g_keys[idx], value, sizeof value);
    train_config tmp;
    memset(&tmp, 0, sizeof tmp);
    char why[256];
    if (!parse_value(&g_keys[idx], g_keys[idx].def, &tmp, why, sizeof why)) return true;
    format_value(&tmp, &g_keys[idx], def, sizeof def);
    return strcmp(value, def) != 0;
}

train_backend train_config_backend(const train_config *cfg) {
    if (cfg->parallel.backend != TRAIN_BACKEND_AUTO) return cfg->parallel.backend;
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ? TRAIN_BACKEND_MPI
                                                                : TRAIN_BACKEND_LOCAL;
}

fsdp_mixed_precision train_config_mixed_precision(const train_config *cfg) {
    const fsdp_dtype *d = g_mp_dtypes[cfg->parallel.mixed_precision];
    return (fsdp_mixed_precision){.param_dtype = d[0], .reduce_dtype = d[1]};
}

int train_config_world_size(const train_config *cfg) {
    if (cfg->parallel.ranks > 0) return (int)cfg->parallel.ranks;
    return train_config_backend(cfg) == TRAIN_BACKEND_LOCAL ? (int)cfg->parallel.tp : 0;
}

static int smallest_prime_factor(int n) {
    for (int p = 2; p * p <= n; p++)
        if (n % p == 0) return p;
    return n;
}

/* Where the world size comes from, for messages. */
static void describe_world(const train_config *cfg, int world, char *buf, size_t size) {
    char k[KEY_TEXT_SIZE];
    buf[0] = '\0';
    if (cfg->parallel.ranks > 0)
        train_append(buf, size, "a world of %d ranks (%s)", world,
                     train_config_key_text(cfg, "parallel", "ranks", k, sizeof k));
    else if (train_config_backend(cfg) == TRAIN_BACKEND_MPI)
        train_append(buf, size, "a world of %d ranks (the processes of the MPI job)", world);
    else
        train_append(buf, size, "a world of %d ranks (%s: as many as tp)", world,
                     train_config_key_text(cfg, "parallel", "ranks", k, sizeof k));
}

fsdp_status train_layout_resolve(const train_config *cfg, int world, train_layout *out, char *err,
                                 size_t err_size) {
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE], w[KEY_TEXT_SIZE + 64];
    int tp = (int)cfg->parallel.tp;
    describe_world(cfg, world, w, sizeof w);
    if (world < 1 || world % tp != 0) {
        snprintf(err, err_size,
                 "%s does not divide %s; world = dp * tp: use a multiple of %d ranks or "
                 "another tp",
                 train_config_key_text(cfg, "parallel", "tp", a, sizeof a), w, tp);
        return FSDP_ERR_CONFIG;
    }
    train_layout l = {.backend = train_config_backend(cfg),
                      .world = world,
                      .dp = world / tp,
                      .tp = tp,
                      .replicas = 1,
                      .shard = world / tp};
    int64_t micro = cfg->data.batch_size / cfg->train.grad_accum;
    if (cfg->train.grad_accum > 1 && micro < l.dp) {
        snprintf(err, err_size,
                 "%s split into %s micro-batches of %lld samples is smaller than the %d "
                 "data-parallel ranks (dp = world / tp, %s and tp %d); each dp rank trains on "
                 "its slice of every micro-batch: raise batch_size to at least %lld, or lower "
                 "grad_accum, or use fewer ranks",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a),
                 train_config_key_text(cfg, "train", "grad_accum", b, sizeof b), (long long)micro,
                 l.dp, w, tp, (long long)l.dp * cfg->train.grad_accum);
        return FSDP_ERR_CONFIG;
    }
    if (cfg->data.batch_size < l.dp) {
        snprintf(err, err_size,
                 "%s is smaller than the %d data-parallel ranks (dp = world / tp, %s and tp "
                 "%d); each dp rank trains on its slice of every batch: raise batch_size to at "
                 "least %d, or use fewer ranks",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a), l.dp, w, tp, l.dp);
        return FSDP_ERR_CONFIG;
    }
    if (cfg->model.kind == TRAIN_MODEL_LLAMA && micro % l.dp != 0) {
        snprintf(err, err_size,
                 "%s (in micro-batches of %lld, %s) does not split evenly over the %d "
                 "data-parallel ranks (dp = world / tp, %s and tp %d); a Llama run gives every "
                 "dp rank the same number of sequences: use a multiple of %lld",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a), (long long)micro,
                 train_config_key_text(cfg, "train", "grad_accum", b, sizeof b), l.dp, w, tp,
                 (long long)l.dp * cfg->train.grad_accum);
        return FSDP_ERR_CONFIG;
    }
    bool hybrid =
        cfg->parallel.mode == TRAIN_MODE_FSDP && cfg->parallel.strategy == FSDP_HYBRID_SHARD;
    if (hybrid && l.dp < 2) {
        snprintf(err, err_size,
                 "%s needs at least 2 data-parallel ranks to split into replicas and shards, but "
                 "dp = world / tp = 1 (%s and tp %d); add ranks or use full_shard",
                 train_config_key_text(cfg, "parallel", "strategy", a, sizeof a), w, tp);
        return FSDP_ERR_CONFIG;
    }
    if (hybrid) {
        int r = cfg->parallel.replicas ? (int)cfg->parallel.replicas : smallest_prime_factor(l.dp);
        if (l.dp % r != 0) {
            snprintf(err, err_size,
                     "%s does not divide the %d data-parallel ranks (dp = world / tp, %s and "
                     "tp %d); hybrid_shard splits dp into replicas x shard: use a divisor of %d, "
                     "or 0 to pick one",
                     train_config_key_text(cfg, "parallel", "replicas", b, sizeof b), l.dp, w, tp,
                     l.dp);
            return FSDP_ERR_CONFIG;
        }
        l.replicas = r;
        l.shard = l.dp / r;
    }
    if (out) *out = l;
    return FSDP_OK;
}

void train_layout_describe(const train_config *cfg, const train_layout *l, char *buf, size_t size) {
    buf[0] = '\0';
    train_append(buf, size, "%d rank%s (%s): dp %d x tp %d, ", l->world, l->world == 1 ? "" : "s",
                 l->backend == TRAIN_BACKEND_MPI ? "mpi" : "local", l->dp, l->tp);
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE) {
        train_append(buf, size, "replicate");
    } else {
        train_append(buf, size, "fsdp %s", g_strategy_names[cfg->parallel.strategy]);
        if (cfg->parallel.strategy == FSDP_HYBRID_SHARD)
            train_append(buf, size, " (%d replicas x shard %d)", l->replicas, l->shard);
        if (cfg->parallel.wrap == TRAIN_WRAP_LAYER) train_append(buf, size, ", wrap layer");
        if (cfg->parallel.offload) train_append(buf, size, ", offload");
        if (cfg->parallel.use_orig_params) train_append(buf, size, ", use_orig_params");
        if (cfg->parallel.mixed_precision)
            train_append(buf, size, ", mixed_precision %s",
                         g_mp_names[cfg->parallel.mixed_precision]);
    }
    if (cfg->parallel.comm_hook != FSDP_COMM_HOOK_DEFAULT)
        train_append(buf, size, ", %s comm hook", g_hook_names[cfg->parallel.comm_hook]);
    if (cfg->parallel.sync_module_states) train_append(buf, size, ", sync_module_states");
}

/* Fails naming [section] name when it was changed from its default although `applies`
 * (a condition described by `to`, with the key that decides it) does not hold. */
static bool key_not_for(const train_config *cfg, const char *section, const char *name,
                        bool applies, const char *to, const char *dsec, const char *dname,
                        char *err, size_t err_size) {
    if (applies || !is_changed(cfg, section, name)) return false;
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE];
    snprintf(err, err_size, "%s applies to %s, but %s; remove it or change %s",
             train_config_key_text(cfg, section, name, a, sizeof a), to,
             train_config_key_text(cfg, dsec, dname, b, sizeof b), dname);
    return true;
}

/* The [parallel] rules that do not depend on the world size. */
static fsdp_status check_parallel(const train_config *cfg, char *err, size_t err_size) {
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE], c[KEY_TEXT_SIZE];
    static const char *const fsdp_only[] = {"strategy", "offload", "wrap", "use_orig_params",
                                            "replicas"};
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE)
        for (size_t i = 0; i < sizeof fsdp_only / sizeof fsdp_only[0]; i++)
            if (is_changed(cfg, "parallel", fsdp_only[i])) {
                snprintf(err, err_size,
                         "%s applies to mode = fsdp, but %s; remove it or set mode = fsdp",
                         train_config_key_text(cfg, "parallel", fsdp_only[i], a, sizeof a),
                         train_config_key_text(cfg, "parallel", "mode", b, sizeof b));
                return FSDP_ERR_CONFIG;
            }
    if (key_not_for(cfg, "parallel", "bucket_mb", cfg->parallel.mode == TRAIN_MODE_REPLICATE,
                    "mode = replicate (FSDP reduces each unit's gradient whole)", "parallel",
                    "mode", err, err_size))
        return FSDP_ERR_CONFIG;
    if (cfg->parallel.comm_hook != FSDP_COMM_HOOK_DEFAULT &&
        train_config_mixed_precision(cfg).reduce_dtype != FSDP_DTYPE_F32) {
        snprintf(err, err_size,
                 "%s and %s both choose the dtype gradients are reduced in; keep one (a "
                 "mixed_precision that reduces in f32, such as bf16,f32, or comm_hook = default)",
                 train_config_key_text(cfg, "parallel", "comm_hook", a, sizeof a),
                 train_config_key_text(cfg, "parallel", "mixed_precision", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if (cfg->parallel.replicas && cfg->parallel.mode == TRAIN_MODE_FSDP &&
        cfg->parallel.strategy != FSDP_HYBRID_SHARD) {
        snprintf(err, err_size, "%s is for strategy = hybrid_shard, but %s; remove it",
                 train_config_key_text(cfg, "parallel", "replicas", a, sizeof a),
                 train_config_key_text(cfg, "parallel", "strategy", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    int64_t tp = cfg->model.kind == TRAIN_MODEL_MLP ? cfg->parallel.tp : 1; /* llama: below */
    int n_linear = cfg->model.widths.n - 1;
    train_tp_style styles[TRAIN_MAX_LIST];
    fsdp_status st = train_config_tp_plan(cfg, styles, err, err_size);
    if (st != FSDP_OK) return st;
    if (key_not_for(cfg, "model", "tp_plan", tp > 1, "tp > 1", "parallel", "tp", err, err_size))
        return FSDP_ERR_CONFIG;
    if (tp > 1 && n_linear < 2) {
        snprintf(err, err_size,
                 "%s needs at least two Linear layers to pair (Colwise, then Rowwise), but %s "
                 "has one; add a hidden width or set tp = 1",
                 train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
                 train_config_key_text(cfg, "model", "widths", c, sizeof c));
        return FSDP_ERR_CONFIG;
    }
    for (int i = 0; tp > 1 && i + 1 < n_linear; i++) { /* a colwise Linear i, rowwise i + 1 */
        int64_t width = cfg->model.widths.v[i + 1];
        if (styles[i] == TRAIN_TP_COLWISE && width % tp != 0) {
            snprintf(err, err_size,
                     "%s must divide the hidden width %lld (entry %d of %s), which Linear %d "
                     "(Colwise) and Linear %d (Rowwise) split over the tp ranks; use a tp that "
                     "divides it or another width",
                     train_config_key_text(cfg, "parallel", "tp", a, sizeof a), (long long)width,
                     i + 2, train_config_key_text(cfg, "model", "widths", c, sizeof c), i, i + 1);
            return FSDP_ERR_CONFIG;
        }
    }
    int world = train_config_world_size(cfg);
    if (train_config_backend(cfg) == TRAIN_BACKEND_LOCAL && world > FSDP_LOCAL_MAX_RANKS) {
        snprintf(err, err_size,
                 "%s asks for %d rank threads, but the local backend runs at most %d "
                 "(FSDP_LOCAL_MAX_RANKS); use at most %d ranks, or run one process per rank "
                 "under mpirun (backend = mpi)",
                 cfg->parallel.ranks > 0
                     ? train_config_key_text(cfg, "parallel", "ranks", a, sizeof a)
                     : train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
                 world, FSDP_LOCAL_MAX_RANKS, FSDP_LOCAL_MAX_RANKS);
        return FSDP_ERR_CONFIG;
    }
    if (train_config_backend(cfg) == TRAIN_BACKEND_MPI &&
        !fsdp_backend_available(FSDP_BACKEND_MPI)) {
        if (cfg->parallel.backend == TRAIN_BACKEND_MPI)
            snprintf(err, err_size,
                     "%s, but this build has no MPI backend (CMake found no MPI); use backend "
                     "= local, or install an MPI (Debian: libopenmpi-dev openmpi-bin) and "
                     "rebuild",
                     train_config_key_text(cfg, "parallel", "backend", a, sizeof a));
        else
            snprintf(err, err_size,
                     "started by mpirun (%s), but this build has no MPI backend (CMake found no "
                     "MPI): every process would train alone; install an MPI and rebuild, or "
                     "run without mpirun",
                     train_config_key_text(cfg, "parallel", "backend", a, sizeof a));
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [data] rules that join keys. */
static fsdp_status check_data(const train_config *cfg, char *err, size_t err_size) {
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE];
    bool h5 = cfg->data.kind == TRAIN_DATA_H5, tokens = cfg->data.kind == TRAIN_DATA_TOKENS;
    bool synthetic = cfg->data.kind == TRAIN_DATA_SYNTHETIC;
    static const char *const synthetic_only[] = {"samples", "teacher_widths", "noise"};
    static const char *const h5_only[] = {"x", "y"};
    for (int i = 0; i < 3; i++)
        if (key_not_for(cfg, "data", synthetic_only[i], synthetic, "kind = synthetic", "data",
                        "kind", err, err_size) ||
            (i < 2 &&
             key_not_for(cfg, "data", h5_only[i], h5, "kind = h5", "data", "kind", err, err_size)))
            return FSDP_ERR_CONFIG;
    if (key_not_for(cfg, "data", "path", h5 || tokens, "kind = h5 or tokens", "data", "kind", err,
                    err_size) ||
        key_not_for(cfg, "data", "task", !tokens, "kind = synthetic or h5", "data", "kind", err,
                    err_size) ||
        key_not_for(cfg, "data", "shuffle", !tokens,
                    "kind = synthetic or h5 (kind = tokens "
                    "draws every sequence's offset from seed)",
                    "data", "kind", err, err_size) ||
        key_not_for(cfg, "data", "eval_batches", tokens, "kind = tokens", "data", "kind", err,
                    err_size))
        return FSDP_ERR_CONFIG;
    if ((h5 || tokens) && !cfg->data.path[0]) {
        snprintf(err, err_size, "%s needs [data] path, the %s to read; set it",
                 train_config_key_text(cfg, "data", "kind", a, sizeof a),
                 h5 ? "HDF5 file (with datasets x and y)"
                    : "token file (tools/text_to_tokens.py writes one)");
        return FSDP_ERR_CONFIG;
    }
    bool llama = cfg->model.kind == TRAIN_MODEL_LLAMA;
    if (llama != tokens) {
        snprintf(err, err_size, "%s and %s do not go together: %s",
                 train_config_key_text(cfg, "model", "kind", a, sizeof a),
                 train_config_key_text(cfg, "data", "kind", b, sizeof b),
                 llama ? "a Llama model trains on a token file; set [data] kind = tokens and "
                         "[data] path"
                       : "a token file trains a Llama model; set [model] kind = llama (or "
                         "another [data] kind)");
        return FSDP_ERR_CONFIG;
    }
    bool classify = cfg->data.task == TRAIN_TASK_CLASSIFICATION;
    int64_t classes = cfg->model.widths.v[cfg->model.widths.n - 1];
    if (!llama && classify && classes < 2) {
        snprintf(err, err_size,
                 "%s needs an output width of at least 2 (the number of classes), but %s ends "
                 "in %lld; set the last width to the number of classes",
                 train_config_key_text(cfg, "data", "task", a, sizeof a),
                 train_config_key_text(cfg, "model", "widths", b, sizeof b), (long long)classes);
        return FSDP_ERR_CONFIG;
    }
    if (key_not_for(cfg, "data", "noise", !classify, "task = regression", "data", "task", err,
                    err_size))
        return FSDP_ERR_CONFIG;
    if (synthetic && cfg->data.eval_fraction > 0) {
        int64_t n_eval = (int64_t)floor((double)cfg->data.samples * cfg->data.eval_fraction);
        if (n_eval < 1 || n_eval >= cfg->data.samples) {
            snprintf(err, err_size,
                     "%s holds out %lld of the %lld samples (%s); both the held-out and the "
                     "training part need at least one: change eval_fraction or samples",
                     train_config_key_text(cfg, "data", "eval_fraction", a, sizeof a),
                     (long long)n_eval, (long long)cfg->data.samples,
                     train_config_key_text(cfg, "data", "samples", b, sizeof b));
            return FSDP_ERR_CONFIG;
        }
    }
    if (cfg->train.eval_every > 0 && cfg->data.eval_fraction == 0) {
        snprintf(err, err_size,
                 "%s evaluates on the held-out split, but %s holds out nothing; set "
                 "eval_fraction (e.g. 0.2) or eval_every = 0",
                 train_config_key_text(cfg, "train", "eval_every", a, sizeof a),
                 train_config_key_text(cfg, "data", "eval_fraction", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [optim] rules that join keys. */
static fsdp_status check_optim(const train_config *cfg, char *err, size_t err_size) {
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE], c[KEY_TEXT_SIZE];
    bool sgd = cfg->optim.name == TRAIN_OPTIM_SGD;
    if (key_not_for(cfg, "optim", "momentum", sgd, "name = sgd", "optim", "name", err, err_size) ||
        key_not_for(cfg, "optim", "nesterov", sgd, "name = sgd", "optim", "name", err, err_size) ||
        key_not_for(cfg, "optim", "betas", !sgd, "name = adam or adamw", "optim", "name", err,
                    err_size) ||
        key_not_for(cfg, "optim", "eps", !sgd, "name = adam or adamw", "optim", "name", err,
                    err_size))
        return FSDP_ERR_CONFIG;
    if (cfg->optim.nesterov && cfg->optim.momentum <= 0) {
        snprintf(err, err_size,
                 "[optim] nesterov = true (%s) needs [optim] momentum > 0, but momentum is %g "
                 "(%s)",
                 train_config_origin(cfg, "optim", "nesterov"), cfg->optim.momentum,
                 train_config_origin(cfg, "optim", "momentum"));
        return FSDP_ERR_CONFIG;
    }
    train_schedule sched = cfg->optim.schedule;
    if (key_not_for(cfg, "optim", "warmup_steps", sched != TRAIN_SCHEDULE_CONSTANT,
                    "schedule = warmup or cosine", "optim", "schedule", err, err_size) ||
        key_not_for(cfg, "optim", "min_lr", sched == TRAIN_SCHEDULE_COSINE, "schedule = cosine",
                    "optim", "schedule", err, err_size))
        return FSDP_ERR_CONFIG;
    if (sched == TRAIN_SCHEDULE_COSINE && cfg->optim.warmup_steps >= cfg->train.steps) {
        snprintf(err, err_size,
                 "%s leaves no steps for the cosine decay of %s: warmup_steps must be below %s",
                 train_config_key_text(cfg, "optim", "warmup_steps", a, sizeof a),
                 train_config_key_text(cfg, "optim", "schedule", b, sizeof b),
                 train_config_key_text(cfg, "train", "steps", c, sizeof c));
        return FSDP_ERR_CONFIG;
    }
    if (sched == TRAIN_SCHEDULE_COSINE && cfg->optim.min_lr > cfg->optim.lr) {
        snprintf(err, err_size, "%s is above %s; the cosine schedule decays from lr to min_lr",
                 train_config_key_text(cfg, "optim", "min_lr", a, sizeof a),
                 train_config_key_text(cfg, "optim", "lr", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if (cfg->optim.no_decay[0]) {
        char patterns[TRAIN_MAX_NO_DECAY][TRAIN_MAX_STRING];
        if (train_config_no_decay(cfg, patterns) < 0) {
            snprintf(err, err_size,
                     "%s: expected up to %d comma-separated non-empty patterns, e.g. *.bias",
                     train_config_key_text(cfg, "optim", "no_decay", a, sizeof a),
                     TRAIN_MAX_NO_DECAY);
            return FSDP_ERR_CONFIG;
        }
        if (cfg->parallel.mode == TRAIN_MODE_FSDP && !cfg->parallel.use_orig_params) {
            snprintf(err, err_size,
                     "%s needs the parameters' own names, which FSDP's optimizer sees only with "
                     "use_orig_params = true, but %s; set it to true (or use mode = replicate)",
                     train_config_key_text(cfg, "optim", "no_decay", a, sizeof a),
                     train_config_key_text(cfg, "parallel", "use_orig_params", b, sizeof b));
            return FSDP_ERR_CONFIG;
        }
    }
    return FSDP_OK;
}

int train_config_no_decay(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]) {
    return split_patterns(cfg->optim.no_decay, TRAIN_MAX_NO_DECAY, patterns);
}

int train_config_checkpoint_patterns(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]) {
    return split_patterns(cfg->model.checkpoint_activations, TRAIN_MAX_ACT_PATTERNS, patterns);
}

int train_config_modules(const train_config *cfg, train_module_info *m) {
    static const char *const activation[] = {"ReLU", "GELU", "Sigmoid", "Identity"};
    int n = 0, n_linear = cfg->model.widths.n - 1;
    if (cfg->model.norm == TRAIN_NORM_RMSNORM) m[n++] = (train_module_info){.kind = "RMSNorm"};
    for (int i = 0; i < n_linear; i++) {
        m[n++] = (train_module_info){.kind = "Linear", .linear = i + 1};
        if (i + 1 < n_linear)
            m[n++] = (train_module_info){
                .kind = activation[cfg->model.activation <= FSDP_ACT_NONE ? cfg->model.activation
                                                                          : FSDP_ACT_NONE]};
    }
    for (int i = 0; i < n; i++) {
        snprintf(m[i].name, sizeof m[i].name, "%d", i);
        m[i].linear--; /* 0: not a Linear, so -1 */
    }
    return n;
}

/* "0 (Linear), 1 (ReLU), ..." for messages. */
static void describe_modules(const train_module_info *m, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++)
        train_append(buf, size, "%s%s (%s)", i ? ", " : "", m[i].name, m[i].kind);
}

/* Module index of Linear i. */
static const char *linear_name(const train_module_info *m, int n, int linear) {
    for (int i = 0; i < n; i++)
        if (m[i].linear == linear) return m[i].name;
    return "?";
}

static const char *const g_style_names[] = {"none", "colwise", "rowwise"};

/* Reads one "name=style" entry of tp_plan into styles; on failure the message after the key. */
static bool plan_entry(const list_item *item, int entry, const train_module_info *m, int n_mod,
                       train_tp_style *styles, int *from, char *why, size_t why_size) {
    char text[TRAIN_MAX_STRING], modules[512];
    item_text(item, text, sizeof text);
    char *eq = strchr(text, '=');
    if (!eq || eq == text) {
        train_append(why, why_size,
                     "entry %d '%s' is not name=style; write e.g. 0=colwise,2=rowwise", entry,
                     text);
        return false;
    }
    *eq = '\0';
    char *name = text, *style = eq + 1;
    size_t len = strlen(name);
    while (len && (name[len - 1] == ' ' || name[len - 1] == '\t')) name[--len] = '\0';
    while (*style == ' ' || *style == '\t') style++;
    int sty = 0;
    while (sty < 3 && strcmp(style, g_style_names[sty]) != 0) sty++;
    if (sty == 0 || sty == 3) {
        train_append(why, why_size, "entry %d '%s=%s': unknown style '%s'; use colwise or rowwise",
                     entry, name, style, style);
        return false;
    }
    int matched = 0;
    for (int i = 0; i < n_mod; i++) {
        if (fnmatch(name, m[i].name, 0) != 0) continue;
        matched++;
        if (m[i].linear < 0) {
            train_append(
                why, why_size,
                "entry %d '%s=%s' names module %s, a %s; a style applies to a Linear layer", entry,
                name, style, m[i].name, m[i].kind);
            return false;
        }
        if (styles[m[i].linear] != TRAIN_TP_NONE) {
            train_append(why, why_size, "module %s gets a style from entry %d and from entry %d",
                         m[i].name, from[m[i].linear], entry);
            return false;
        }
        styles[m[i].linear] = (train_tp_style)sty;
        from[m[i].linear] = entry;
    }
    if (matched) return true;
    describe_modules(m, n_mod, modules, sizeof modules);
    train_append(why, why_size, "entry %d: '%s' matches no module of the model; its modules are %s",
                 entry, name, modules);
    return false;
}

/* The activations between the Linear layers flow: Replicate into a colwise layer, its output
 * sharded into the rowwise one after it, Replicate out of that; the output replicated. */
static bool plan_flows(const train_tp_style *styles, int n_linear, const train_module_info *m,
                       int n_mod, char *why, size_t why_size) {
    bool sharded = false;
    for (int i = 0; i < n_linear; i++) {
        const char *name = linear_name(m, n_mod, i);
        const char *style = styles[i] ? g_style_names[styles[i]] : "not in the plan";
        if (sharded && styles[i] != TRAIN_TP_ROWWISE) {
            train_append(why, why_size,
                         "module %s (Linear %d) is %s, but its input is sharded over tp by the "
                         "colwise module %s before it: make module %s rowwise",
                         name, i, style, linear_name(m, n_mod, i - 1), name);
            return false;
        }
        if (!sharded && styles[i] == TRAIN_TP_ROWWISE) {
            train_append(
                why, why_size,
                "module %s (Linear %d) is rowwise, but its input is not sharded: a rowwise "
                "Linear takes the output of a colwise one; ",
                name, i);
            if (i > 0)
                train_append(why, why_size, "make module %s colwise", linear_name(m, n_mod, i - 1));
            else
                train_append(why, why_size, "the first Linear can be colwise, not rowwise");
            return false;
        }
        sharded = styles[i] == TRAIN_TP_COLWISE;
    }
    if (!sharded) return true;
    train_append(
        why, why_size,
        "module %s, the last Linear, is colwise: the model's output would stay sharded over "
        "tp; leave it out of the plan",
        linear_name(m, n_mod, n_linear - 1));
    return false;
}

fsdp_status train_config_tp_plan(const train_config *cfg, train_tp_style *styles, char *err,
                                 size_t err_size) {
    int n_linear = cfg->model.widths.n - 1, from[TRAIN_MAX_LIST] = {0};
    for (int i = 0; i < TRAIN_MAX_LIST; i++) styles[i] = TRAIN_TP_NONE;
    list_item items[TRAIN_MAX_MODULES];
    int n = split_list(cfg->model.tp_plan, TRAIN_MAX_MODULES, items);
    if (n == 0) { /* the Megatron pairs */
        for (int i = 0; i + 1 < n_linear; i += 2)
            styles[i] = TRAIN_TP_COLWISE, styles[i + 1] = TRAIN_TP_ROWWISE;
        return FSDP_OK;
    }
    train_module_info m[TRAIN_MAX_MODULES];
    int n_mod = train_config_modules(cfg, m);
    char why[768] = "", key[KEY_TEXT_SIZE];
    bool ok = n > 0;
    if (!ok) snprintf(why, sizeof why, "more than %d entries", TRAIN_MAX_MODULES);
    for (int i = 0; ok && i < n; i++)
        ok = plan_entry(&items[i], i + 1, m, n_mod, styles, from, why, sizeof why);
    if (ok) ok = plan_flows(styles, n_linear, m, n_mod, why, sizeof why);
    if (ok) return FSDP_OK;
    snprintf(err, err_size, "%s: %s",
             train_config_key_text(cfg, "model", "tp_plan", key, sizeof key), why);
    return FSDP_ERR_CONFIG;
}

bool train_config_llama_checkpointed(const train_config *cfg, int64_t layer, int pattern) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], name[32];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    snprintf(name, sizeof name, "model.layers.%lld", (long long)layer);
    for (int p = 0; p < n; p++)
        if ((pattern < 0 || p == pattern) && fnmatch(patterns[p], name, 0) == 0) return true;
    return false;
}

/* llama: every checkpoint_activations pattern matches a decoder layer. */
static fsdp_status check_llama_checkpointing(const train_config *cfg, char *err, size_t err_size) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], key[KEY_TEXT_SIZE];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    for (int p = 0; p < n; p++) {
        bool matched = false;
        for (int64_t i = 0; i < cfg->model.n_layers && !matched; i++)
            matched = train_config_llama_checkpointed(cfg, i, p);
        if (matched) continue;
        snprintf(err, err_size,
                 "%s: pattern '%s' matches no decoder layer of the Llama; they are "
                 "model.layers.0 to model.layers.%lld: use model.layers.* for every one",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 patterns[p], (long long)cfg->model.n_layers - 1);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [model] rules: every checkpoint_activations pattern matches a module. */
static fsdp_status check_model(const train_config *cfg, char *err, size_t err_size) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], key[KEY_TEXT_SIZE], modules[512];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    if (n < 0) {
        snprintf(err, err_size,
                 "%s: expected up to %d comma-separated non-empty module name patterns, e.g. 0,2",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 TRAIN_MAX_ACT_PATTERNS);
        return FSDP_ERR_CONFIG;
    }
    if (cfg->model.kind == TRAIN_MODEL_LLAMA) return check_llama_checkpointing(cfg, err, err_size);
    train_module_info m[TRAIN_MAX_MODULES];
    int n_mod = train_config_modules(cfg, m);
    for (int p = 0; p < n; p++) {
        int matched = 0;
        for (int i = 0; i < n_mod; i++) matched += fnmatch(patterns[p], m[i].name, 0) == 0;
        if (matched) continue;
        describe_modules(m, n_mod, modules, sizeof modules);
        snprintf(err, err_size,
                 "%s: pattern '%s' matches no module of the model; its modules are %s",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 patterns[p], modules);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [train] rules: grad_accum divides the batch. */
static fsdp_status check_train(const train_config *cfg, char *err, size_t err_size) {
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE];
    if (cfg->data.batch_size % cfg->train.grad_accum == 0) return FSDP_OK;
    snprintf(err, err_size,
             "%s does not divide %s: a step splits its batch into grad_accum micro-batches of "
             "equal size; use a divisor of %lld",
             train_config_key_text(cfg, "train", "grad_accum", a, sizeof a),
             train_config_key_text(cfg, "data", "batch_size", b, sizeof b),
             (long long)cfg->data.batch_size);
    return FSDP_ERR_CONFIG;
}

/* tp must divide the count a Llama key names (heads, key/value heads, the SwiGLU width). */
static bool llama_tp_divides(const train_config *cfg, const char *name, int64_t count,
                             const char *what, char *err, size_t err_size) {
    int64_t tp = cfg->parallel.tp;
    if (count % tp == 0) return false;
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE];
    snprintf(err, err_size,
             "%s must divide %s: %lld %s, which the tensor-parallel ranks split between them; "
             "use a tp that divides %lld, or change %s",
             train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
             train_config_key_text(cfg, "model", name, b, sizeof b), (long long)count, what,
             (long long)count, name);
    return true;
}

/* The [model] rules: keys of the other kind are not set; a Llama's heads and tp fit. */
static fsdp_status check_model_kind(const train_config *cfg, char *err, size_t err_size) {
    static const char *const mlp_only[] = {"widths", "activation", "norm", "tp_plan"};
    static const char *const llama_only[] = {"dim",         "n_layers",   "n_heads",
                                             "n_kv_heads",  "vocab_size", "ffn_hidden",
                                             "max_seq_len", "norm_eps",   "rope_theta"};
    bool llama = cfg->model.kind == TRAIN_MODEL_LLAMA;
    for (size_t i = 0; i < sizeof mlp_only / sizeof mlp_only[0]; i++)
        if (key_not_for(cfg, "model", mlp_only[i], !llama, "kind = mlp", "model", "kind", err,
                        err_size))
            return FSDP_ERR_CONFIG;
    for (size_t i = 0; i < sizeof llama_only / sizeof llama_only[0]; i++)
        if (key_not_for(cfg, "model", llama_only[i], llama, "kind = llama", "model", "kind", err,
                        err_size))
            return FSDP_ERR_CONFIG;
    if (!llama) return FSDP_OK;
    char a[KEY_TEXT_SIZE], b[KEY_TEXT_SIZE];
    int64_t dim = cfg->model.dim, heads = cfg->model.n_heads;
    if (dim % heads != 0 || (dim / heads) % 2 != 0) {
        snprintf(err, err_size,
                 "%s must divide %s into heads of an even size (the rotary embedding rotates "
                 "pairs of a head's dimensions), but %lld / %lld is %s; pick n_heads so that "
                 "dim / n_heads is an even integer",
                 train_config_key_text(cfg, "model", "n_heads", a, sizeof a),
                 train_config_key_text(cfg, "model", "dim", b, sizeof b), (long long)dim,
                 (long long)heads, dim % heads ? "not an integer" : "odd");
        return FSDP_ERR_CONFIG;
    }
    int64_t kv = cfg->model.n_kv_heads ? cfg->model.n_kv_heads : heads;
    if (heads % kv != 0) {
        snprintf(err, err_size,
                 "%s must divide %s: each key/value head serves n_heads / n_kv_heads query "
                 "heads; use a divisor of %lld (or 0 for n_heads)",
                 train_config_key_text(cfg, "model", "n_kv_heads", a, sizeof a),
                 train_config_key_text(cfg, "model", "n_heads", b, sizeof b), (long long)heads);
        return FSDP_ERR_CONFIG;
    }
    int64_t ffn = cfg->model.ffn_hidden ? cfg->model.ffn_hidden : (8 * dim / 3 + 255) / 256 * 256;
    if (llama_tp_divides(cfg, "n_heads", heads, "query heads", err, err_size) ||
        llama_tp_divides(cfg, "n_kv_heads", kv, "key/value heads", err, err_size) ||
        llama_tp_divides(cfg, "ffn_hidden", ffn, "SwiGLU width", err, err_size))
        return FSDP_ERR_CONFIG;
    return FSDP_OK;
}

fsdp_status train_config_check(const train_config *cfg, char *err, size_t err_size) {
    fsdp_status st = check_model_kind(cfg, err, err_size);
    if (st == FSDP_OK) st = check_data(cfg, err, err_size);
    if (st == FSDP_OK) st = check_optim(cfg, err, err_size);
    if (st == FSDP_OK) st = check_model(cfg, err, err_size);
    if (st == FSDP_OK) st = check_train(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    st = check_parallel(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    int world = train_config_world_size(cfg);
    return world > 0 ? train_layout_resolve(cfg, world, NULL, err, err_size) : FSDP_OK;
}

/* Writes text word-wrapped to 80 columns: the first line indented by `first` spaces, the others
 * by `rest`. */
static void print_wrapped(FILE *f, int first, int rest, const char *text) {
    int col = fprintf(f, "%*s", first, ""), start = col;
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > start && col + 1 + (int)word > 80) {
            fputc('\n', f);
            col = start = fprintf(f, "%*s", rest, "");
        } else if (col > start) {
            col += fprintf(f, " ");
        }
        col += fprintf(f, "%.*s", (int)word, text);
        text += word;
        while (*text == ' ') text++;
    }
    fputc('\n', f);
}

void train_config_print_help(FILE *f) {
    fprintf(f,
            "usage: fsdp-train --config FILE [--set section.key=value ...]\n"
            "       fsdp-train --help | --version\n\n"
            "Trains the model a config file describes and prints its progress.\n\n"
            "options:\n"
            "  --config FILE            the run's configuration, an INI file\n"
            "  --set section.key=value  overrides one key after the file is read;\n"
            "                           repeatable, applied in order\n"
            "  --help                   prints this help\n"
            "  --version                prints the version\n\n"
            "exit status: 0 success; 1 the run failed (a library call, a loss that is\n"
            "not finite, output that cannot be written, MPI ranks with different\n"
            "configurations); 2 bad command line or config\n\n"
            "limits: a config file is a regular file of at most %d bytes,\n"
            "without NUL bytes, of lines of at most %d characters (the newline not\n"
            "counted); a --set value has at most %d characters\n\n"
            "config keys, by section (key = default (type), meaning, allowed values):\n",
            TRAIN_MAX_CONFIG_BYTES, TRAIN_MAX_LINE, TRAIN_MAX_VALUE);
    for (int s = 0; s < N_SECTIONS; s++) {
        char text[512];
        snprintf(text, sizeof text, "[%s]: %s", g_sections[s].name, g_sections[s].help);
        fputc('\n', f);
        print_wrapped(f, 0, 4, text);
        for (int i = 0; i < N_KEYS; i++) {
            const key_def *k = &g_keys[i];
            if (strcmp(k->section, g_sections[s].name) != 0) continue;
            if (*k->def)
                fprintf(f, "  %s = %s  (%s)\n", k->name, k->def, type_name(k));
            else
                fprintf(f, "  %s =  (%s, empty by default)\n", k->name, type_name(k));
            print_wrapped(f, 6, 6, k->help);
            snprintf(text, sizeof text, "allowed: ");
            describe_expected(k, text + strlen(text), sizeof text - strlen(text));
            print_wrapped(f, 6, 6, text);
        }
    }
}

void train_config_write(const train_config *cfg, FILE *f) {
    for (int s = 0; s < N_SECTIONS; s++) {
        fprintf(f, "%s[%s]\n", s ? "\n" : "", g_sections[s].name);
        for (int i = 0; i < N_KEYS; i++) {
            if (strcmp(g_keys[i].section, g_sections[s].name) != 0) continue;
            char value[TRAIN_MAX_STRING + 64];
            format_value(cfg, &g_keys[i], value, sizeof value);
            fprintf(f, "%s = %s  ; %s\n", g_keys[i].name, value, cfg->origin[i]);
        }
    }
}

/* ---- a configuration saved as text (a checkpoint's) -------------------------------------- */

/* Finds "name = value  ; origin" in [section] of saved: the value and the origin (without the
 * comment mark), each cut to its buffer. */
static bool saved_entry(const char *saved, const char *section, const char *name, char *value,
                        size_t value_size, char *origin, size_t origin_size) {
    bool in_section = false;
    size_t name_len = strlen(name);
    for (const char *line = saved; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (line[0] == '[') {
            const char *close = memchr(line, ']', len);
            in_section = close && (size_t)(close - line - 1) == strlen(section) &&
                         strncmp(line + 1, section, strlen(section)) == 0;
        } else if (in_section && len > name_len + 3 && strncmp(line, name, name_len) == 0 &&
                   strncmp(line + name_len, " = ", 3) == 0) {
            const char *v = line + name_len + 3, *line_end = line + len, *mark = v;
            while (mark + 4 <= line_end && strncmp(mark, "  ; ", 4) != 0) mark++;
            if (mark + 4 > line_end) mark = line_end;
            snprintf(value, value_size, "%.*s", (int)(mark - v), v);
            if (origin)
                snprintf(origin, origin_size, "%.*s",
                         mark == line_end ? 0 : (int)(line_end - mark - 4), mark + 4);
            return true;
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

bool train_config_saved_value(const char *saved, const char *section, const char *name, char *value,
                              size_t size) {
    return saved_entry(saved, section, name, value, size, NULL, 0);
}

static bool in_list(const char *const *list, const char *section, const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", section, name);
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], key) == 0) return true;
    return false;
}

fsdp_status train_config_compare_saved(const train_config *cfg, const char *saved,
                                       const char *const *sections, const char *const *except,
                                       char *err, size_t err_size) {
    for (int i = 0; i < N_KEYS; i++) {
        const key_def *k = &g_keys[i];
        bool wanted = false;
        for (int s = 0; sections[s]; s++) wanted |= strcmp(sections[s], k->section) == 0;
        if (!wanted || in_list(except, k->section, k->name)) continue;
        char mine[TRAIN_MAX_STRING + 64], theirs[TRAIN_MAX_STRING + 64], origin[TRAIN_MAX_ORIGIN];
        format_value(cfg, k, mine, sizeof mine);
        if (!saved_entry(saved, k->section, k->name, theirs, sizeof theirs, origin,
                         sizeof origin)) {
            /* saved before the key existed: it had the default's value */
            train_config tmp;
            memset(&tmp, 0, sizeof tmp);
            char why[256];
            if (!parse_value(k, k->def, &tmp, why, sizeof why)) continue;
            format_value(&tmp, k, theirs, sizeof theirs);
            snprintf(origin, sizeof origin, "default, not in the saved configuration");
        }
        if (strcmp(mine, theirs) == 0) continue;
        snprintf(err, err_size, "[%s] %s = %s (%s) here, but %s (%s) in the saved configuration",
                 k->section, k->name, mine, cfg->origin[i], theirs, origin);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* ---- the ranks agree on one configuration ----------------------------------------------- */

#define FNV_BASIS UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

/* Key i's canonical text, "section.name=value" and its NUL, folded into the FNV-1a hash h. */
static uint64_t hash_key(const train_config *cfg, int i, uint64_t h) {
    char text[TRAIN_MAX_STRING + 128];
    snprintf(text, sizeof text, "%s.%s=", g_keys[i].section, g_keys[i].name);
    format_value(cfg, &g_keys[i], text + strlen(text), sizeof text - strlen(text));
    for (size_t j = 0, n = strlen(text) + 1; j < n; j++)
        h = (h ^ (unsigned char)text[j]) * FNV_PRIME;
    return h;
}

uint64_t train_config_hash(const train_config *cfg) {
    uint64_t h = FNV_BASIS;
    for (int i = 0; i < N_KEYS; i++) h = hash_key(cfg, i, h);
    return h;
}

#define SHARED_TEXT_SIZE (TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 8) /* "value (origin)" */

/* Group rank root's text (SHARED_TEXT_SIZE bytes) on every rank, a byte per f32. */
static fsdp_status share_text(fsdp_ctx *ctx, fsdp_group *group, int root, char *text) {
    fsdp_tensor *t = NULL;
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){SHARED_TEXT_SIZE}, &t);
    if (st == FSDP_OK) {
        float *p = fsdp_tensor_f32(t);
        for (int i = 0; i < SHARED_TEXT_SIZE; i++) p[i] = (float)(unsigned char)text[i];
        st = fsdp_broadcast(ctx, group, t, root);
        for (int i = 0; st == FSDP_OK && i < SHARED_TEXT_SIZE; i++) text[i] = (char)(int)p[i];
        text[SHARED_TEXT_SIZE - 1] = '\0';
    }
    fsdp_tensor_free(t);
    return st;
}

/* The message of a mismatch, the same on every rank: the first key (in table order) that
 * differs, with its value and origin on group rank 0 and on the first rank that differs. */
static fsdp_status describe_mismatch(fsdp_ctx *ctx, fsdp_group *group, const train_config *cfg,
                                     const uint64_t *all, char *err, size_t err_size) {
    int n = fsdp_group_size(group), key = -1, other = -1, more = 0;
    for (int i = 0; i < N_KEYS; i++) {
        int r = 1;
        while (r < n && all[r * N_KEYS + i] == all[i]) r++;
        if (r == n) continue;
        if (key < 0)
            key = i, other = r;
        else
            more++;
    }
    if (key < 0) { /* the whole hashes differ while every key's agrees: a collision */
        snprintf(err, err_size,
                 "the ranks were started with different configurations (their hashes differ); "
                 "give every rank the same config file and --set options");
        return FSDP_ERR_STATE;
    }
    const key_def *k = &g_keys[key];
    char text[2][SHARED_TEXT_SIZE], value[TRAIN_MAX_STRING]; /* the longest: a string key */
    format_value(cfg, k, value, sizeof value);
    for (int side = 0; side < 2; side++) {
        snprintf(text[side], SHARED_TEXT_SIZE, "%s (%s)", value, cfg->origin[key]);
        fsdp_status st = share_text(ctx, group, side ? other : 0, text[side]);
        if (st != FSDP_OK) return st;
    }
    snprintf(err, err_size,
             "the ranks were started with different configurations: [%s] %s = %s on rank %d, "
             "but %s on rank %d",
             k->section, k->name, text[0], fsdp_group_world_rank(group, 0), text[1],
             fsdp_group_world_rank(group, other));
    if (more)
        train_append(err, err_size, " (and %d more key%s differ%s)", more, more == 1 ? "" : "s",
                     more == 1 ? "s" : "");
    train_append(err, err_size, "; give every rank the same config file and --set options");
    return FSDP_ERR_STATE;
}

fsdp_status train_config_agree(fsdp_ctx *ctx, fsdp_group *group, const train_config *cfg, char *err,
                               size_t err_size) {
    if (!group) group = fsdp_ctx_world_group(ctx);
    int n = fsdp_group_size(group);
    err[0] = '\0';
    if (n <= 1) return FSDP_OK;
    uint64_t mine[TRAIN_MAX_KEYS], *all = malloc((size_t)n * N_KEYS * sizeof *all);
    if (!all) {
        snprintf(err, err_size, "comparing the ranks' configurations: out of memory");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    mine[0] = train_config_hash(cfg);
    fsdp_status st = fsdp_all_gather_u64(ctx, group, mine, 1, all);
    int r = 1;
    while (st == FSDP_OK && r < n && all[r] == all[0]) r++;
    if (st == FSDP_OK && r < n) { /* every rank sees the same hashes and takes this branch */
        for (int i = 0; i < N_KEYS; i++) mine[i] = hash_key(cfg, i, FNV_BASIS);
        st = fsdp_all_gather_u64(ctx, group, mine, N_KEYS, all);
        if (st == FSDP_OK) st = describe_mismatch(ctx, group, cfg, all, err, err_size);
    }
    if (st != FSDP_OK && !err[0])
        snprintf(err, err_size, "comparing the ranks' configurations: %s", fsdp_last_error(ctx));
    free(all);
    return st;
}

/* ---- the command line ----------------------------------------------------------------------- */

/* The option's value: "--opt=VALUE" or the next argument. NULL (and err) when missing. */
static const char *option_value(int argc, char **argv, int *i, const char *opt, char *err,
                                size_t err_size) {
    size_t n = strlen(opt);
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (*i + 1 < argc) return argv[++*i];
    snprintf(err, err_size, "%s needs a value; see fsdp-train --help", opt);
    return NULL;
}

static bool is_option(const char *arg, const char *opt) {
    size_t n = strlen(opt);
    return strncmp(arg, opt, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

fsdp_status train_cli_parse(int argc, char **argv, train_config *cfg, train_cli_action *action,
                            char *err, size_t err_size) {
    *action = TRAIN_CLI_RUN;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *action = TRAIN_CLI_HELP;
            return FSDP_OK;
        }
        if (strcmp(argv[i], "--version") == 0) *action = TRAIN_CLI_VERSION;
    }
    if (*action == TRAIN_CLI_VERSION) return FSDP_OK;

    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        if (is_option(argv[i], "--config")) {
            const char *v = option_value(argc, argv, &i, "--config", err, err_size);
            if (!v) return FSDP_ERR_CONFIG;
            if (config) {
                snprintf(err, err_size, "--config given twice ('%s' and '%s')", config, v);
                return FSDP_ERR_CONFIG;
            }
            config = v;
        } else if (is_option(argv[i], "--set")) {
            if (!option_value(argc, argv, &i, "--set", err, err_size)) return FSDP_ERR_CONFIG;
        } else {
            snprintf(err, err_size, "unknown argument '%s'; see fsdp-train --help", argv[i]);
            return FSDP_ERR_CONFIG;
        }
    }
    if (!config) {
        snprintf(err, err_size, "missing --config FILE; see fsdp-train --help");
        return FSDP_ERR_CONFIG;
    }
    train_config_init(cfg);
    fsdp_status st = train_config_load(cfg, config, err, err_size);
    if (st != FSDP_OK) return st;
    for (int i = 1; i < argc; i++) {
        if (is_option(argv[i], "--config")) {
            option_value(argc, argv, &i, "--config", err, err_size);
        } else if (is_option(argv[i], "--set")) {
            const char *v = option_value(argc, argv, &i, "--set", err, err_size);
            st = train_config_set(cfg, v, err, err_size);
            if (st != FSDP_OK) return st;
        }
    }
    return train_config_check(cfg, err, err_size);
}

fsdp_ctx_options train_config_ctx_options(const train_config *cfg) {
    return (fsdp_ctx_options){.seed = (uint64_t)cfg->train.seed, .log_level = cfg->log.level};
}
