/* train_config.c: fsdp-train's configuration keys: the sections, the common keys and the
 * model kinds' own joined into one list (train_config_register_kinds), and a configuration's
 * keys read back for messages: their text, origin and whether they were changed. */
#include "train_config.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const char *const g_level_names[] = {"debug", "info", "warn", "error", "off", NULL};
/* These enums are the index of the name: train_backend, train_mode, fsdp_sharding_strategy,
 * train_wrap. */
static const char *const g_backend_names[] = {"local", "mpi", "auto", "nccl", NULL};
static const char *const g_mode_names[] = {"fsdp", "replicate", NULL};
/* fsdp_device_type is the index of the name. */
static const char *const g_device_names[] = {"cpu", "cuda", "sim", NULL};
_Static_assert(FSDP_DEVICE_CPU == 0 && FSDP_DEVICE_CUDA == 1 && FSDP_DEVICE_SIM == 2 &&
                   sizeof(fsdp_device_type) == sizeof(int),
               "[parallel] device is stored as the index of its name");
static const char *const g_strategy_names[] = {"full_shard", "shard_grad_op", "no_shard",
                                               "hybrid_shard", NULL};
static const char *const g_wrap_names[] = {"none", "layer", NULL};
static const char *const g_data_kind_names[] = {"synthetic", "h5", "tokens", NULL};
static const char *const g_task_names[] = {"regression", "classification", NULL};
static const char *const g_optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const g_schedule_names[] = {"constant", "warmup", "cosine", NULL};
/* train_progress_style is the index of the name too. */
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

static bool parse_level(const char *text, int *value) {
    fsdp_log_level level;
    if (fsdp_log_level_parse(text, &level) != FSDP_OK) return false;
    *value = (int)level;
    return true;
}

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
_Static_assert(sizeof(train_model_kind) == sizeof(int) && TRAIN_DATA_TOKENS == 2,
               "enum keys are stored as int, the index of their name");
_Static_assert(sizeof(train_progress_style) == sizeof(int) && TRAIN_PROGRESS_LINES == 2,
               "enum keys are stored as int, the index of their name");
_Static_assert(TRAIN_BACKEND_AUTO == 2 && TRAIN_MODE_REPLICATE == 1 && TRAIN_WRAP_LAYER == 1 &&
                   FSDP_HYBRID_SHARD == 3,
               "the enums above are the index of their name");

/* The joined list of keys (train_config_register_kinds). */
static struct {
    pthread_once_t once;
    const train_kind_keys *kinds; /* registered */
    int n_kinds;
    const char *kind_names[TRAIN_MAX_KINDS + 1]; /* the [model] kind key's values */
    int n;
    const train_key *keys[TRAIN_MAX_KEYS];
    unsigned kind_mask[TRAIN_MAX_KEYS]; /* the kinds that declare each key */
} g_table = {.once = PTHREAD_ONCE_INIT};

static const char *kind_help(int c);

/* The common keys before the kinds' own [model] keys, ... */
static const train_key g_keys_first[] = {
    {.section = "model",
     .name = "kind",
     .type = KEY_ENUM,
     .offset = TRAIN_KEY_OFF(model.kind),
     .def = "mlp",
     .names = g_table.kind_names,
     .help_at = kind_help,
     .help = "the model"},
};

/* ... and after them. */
static const train_key g_keys_last[] = {
    STRING_KEY("model", "init", model.init, "random",
               "initial parameters: random (drawn from train.seed), or the path of a state to "
               "take them from: a checkpoint step directory (a run's directory: its newest "
               "checkpoint), a PyTorch state dict (.safetensors or HDF5) of the model's names "
               "(mlp: nn.Sequential's 0.weight, 0.bias, 2.weight, ...), or a Hugging Face "
               "model directory (config.json with model.safetensors or its shards; for llama "
               "its config.json gives the shape: dim, n_layers, n_heads, n_kv_heads, "
               "vocab_size, ffn_hidden, max_seq_len, norm_eps, rope_theta, tie_embeddings and "
               "the rope_scaling "
               "keys left unset take "
               "its values, set ones must agree, max_seq_len may be shorter). Parameters "
               "only: the optimizer starts fresh. Ignored when the run resumes"),
    STRING_KEY("model", "checkpoint_activations", model.checkpoint_activations, "",
               "comma-separated module name patterns (fnmatch) whose activations are "
               "recomputed in backward instead of kept (fsdp_checkpoint_wrap), e.g. 0,2 or *; "
               "each must match a module (llama: a decoder layer, model.layers.<i>: "
               "model.layers.* for every one). Same results, less memory, one more forward"),
    ENUM_KEY("parallel", "backend", parallel.backend, "auto", g_backend_names, NULL,
             "where the ranks run: local (rank threads in this process), mpi (one process per "
             "rank, started by mpirun), auto (mpi when started by mpirun, else local), nccl "
             "(NCCL moves the device tensors: rank threads, one device each, or under mpirun "
             "one process per rank and device; needs device = cuda, or sim with the stand-in "
             "NCCL in FSDP_NCCL_LIBRARY)"),
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
    BOOL_KEY("parallel", "comm_thread", parallel.comm_thread, "false",
             "backend = mpi: a communication thread per process that moves FSDP's started "
             "gathers and gradient reductions while the rank computes "
             "(fsdp_world_options.comm_thread); bitwise the same results"),
    ENUM_KEY("parallel", "device", parallel.device, "cpu", g_device_names, NULL,
             "where every rank computes: cpu, cuda (a GPU; rank r on GPU r mod the GPU count, "
             "so rank threads may share one) or sim (the simulated GPU: rank r on sim device r "
             "mod FSDP_SIM_DEVICES, bitwise the CPU's results). Not with backend = mpi. With "
             "backend = nccl one device per rank: rank r's (under mpirun: the node-local "
             "rank's)"),
    BOOL_KEY("parallel", "allow_tf32", parallel.allow_tf32, "false",
             "device = cuda: f32 GEMMs on TF32 tensor cores (fsdp_cuda_set_allow_tf32, PyTorch's "
             "torch.backends.cuda.matmul.allow_tf32), faster at 10 mantissa bits per product; "
             "false: exact f32. The cpu and sim compute exact f32 either way"),

    ENUM_KEY("data", "kind", data.kind, "synthetic", g_data_kind_names, NULL,
             "where the samples come from: synthetic (inputs from the counter RNG, targets from "
             "a fixed random teacher MLP; samples, seed, teacher_widths and noise describe it), "
             "h5 (datasets x and y of the HDF5 file path, held in memory by every rank) or "
             "tokens (the token file path, for [model] kind = llama: sequences of "
             "max_seq_len + 1 tokens at offsets drawn from seed)"),
    STRING_KEY("data", "path", data.path, "",
               "kind = h5: the HDF5 file; kind = tokens: a token file (written by "
               "tools/text_to_tokens.py), an llm.c .bin shard, a 1-D .npy array of ids, or a "
               "glob pattern of such shards read in name order; a path relative to the "
               "working directory"),
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
    INT_KEY("data", "seed", data.seed, "1", 0, TRAIN_KEY_BIG,
            "seed of the shuffle, (tokens) of the sequences' offsets and (synthetic) of the "
            "inputs, the teacher's parameters and the label noise"),
    LIST_KEY("data", "teacher_widths", data.teacher_widths, "64", 0, TRAIN_MAX_LIST - 2, 1,
             TRAIN_WIDTH_MAX,
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
    INT_KEY("optim", "warmup_steps", optim.warmup_steps, "0", 0, TRAIN_KEY_BIG,
            "warmup and cosine: steps of linear warmup (0: none); cosine needs fewer than "
            "[train] steps"),
    FLOAT_KEY("optim", "min_lr", optim.min_lr, "0", 0, INCL, HUGE_VAL, INCL,
              "cosine: the learning rate at the last step, at most lr"),

    INT_KEY("train", "steps", train.steps, "5000", 1, TRAIN_KEY_BIG, "optimizer steps to run"),
    INT_KEY("train", "seed", train.seed, "0", 0, TRAIN_KEY_BIG,
            "seed of the model's parameter initialisation"),
    INT_KEY("train", "log_every", train.log_every, "500", 1, TRAIN_KEY_BIG,
            "steps between progress lines and metrics records (the last step is always "
            "logged)"),
    INT_KEY("train", "eval_every", train.eval_every, "0", 0, TRAIN_KEY_BIG,
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
    INT_KEY("checkpoint", "every", checkpoint.every, "0", 0, TRAIN_KEY_BIG,
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
               "path of a JSON-lines file (its folders made when missing) to append one record "
               "per logged step to (with the steps' compute and communication seconds, rank 0's "
               "collectives per op and, on a device, its peak memory); empty for none"),
    STRING_KEY("log", "tensorboard", log.tensorboard, "",
               "directory (made when missing) of a TensorBoard event file that rank 0 writes the "
               "metrics records' scalars to, at the same steps: train/loss, train/lr, "
               "train/grad_norm, train/samples_per_s (tokens_per_s), eval/loss, eval/accuracy, "
               "eval/perplexity; empty for none"),
    BOOL_KEY("log", "comm_debug", log.comm_debug, "false",
             "print rank 0's collectives of one step (the run's second) as a table (op, group, "
             "phase, calls, bytes, module), from the comm-debug layer; the progress lines then "
             "split the steps' time into compute and comm"),
    FLOAT_KEY("log", "peak_tflops", log.peak_tflops, "0", 0, INCL, 1e6, INCL,
              "the dense peak TFLOP/s of one rank's device in the run's compute mode, which the "
              "progress lines' mfu (model-FLOP utilisation) is measured against; 0: the "
              "device's own figure (fsdp_device_get_properties: A100, H100, H200 and GH200 "
              "known), and no mfu on the cpu, sim or another card"),
    ENUM_KEY("log", "progress", log.progress, "auto", g_progress_names, NULL,
             "between the log lines: auto (a progress bar when stdout is a terminal and the "
             "ranks are threads, not under mpirun; nothing else), bar (always the bar, redrawn "
             "in place with \\r) or lines (only the log lines)"),
};

fsdp_mixed_precision train_config_mixed_precision(const train_config *cfg) {
    const fsdp_dtype *d = g_mp_dtypes[cfg->parallel.mixed_precision];
    return (fsdp_mixed_precision){.param_dtype = d[0], .reduce_dtype = d[1]};
}

int train_section_count(void) {
    return N_SECTIONS;
}
const char *train_section_name(int i) {
    return g_sections[i].name;
}
const char *train_section_help(int i) {
    return g_sections[i].help;
}

int train_section_find(const char *name) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (strcmp(g_sections[i].name, name) == 0) return i;
    return -1;
}

/* ---- the one list ---------------------------------------------------------------------------- */

/* A key that two kinds declare is one value: they must agree on all but the help. */
static bool same_key(const train_key *a, const train_key *b) {
    return a->type == b->type && a->offset == b->offset && strcmp(a->def, b->def) == 0 &&
           a->imin == b->imin && a->imax == b->imax && a->fmin == b->fmin && a->fmax == b->fmax &&
           a->fmin_open == b->fmin_open && a->fmax_open == b->fmax_open &&
           a->min_count == b->min_count && a->max_count == b->max_count && a->names == b->names &&
           a->parse_enum == b->parse_enum;
}

static void broken(const char *what, const train_key *k) {
    fprintf(stderr, "fsdp-train: broken key table: %s ([%s] %s)\n", what, k->section, k->name);
    abort();
}

static void add_key(const train_key *k, int kind) {
    for (int i = 0; i < g_table.n; i++) {
        const train_key *o = g_table.keys[i];
        if (strcmp(o->section, k->section) != 0 || strcmp(o->name, k->name) != 0) continue;
        if (kind < 0 || !g_table.kind_mask[i] || !same_key(o, k))
            broken("a key declared twice, differently", k);
        g_table.kind_mask[i] |= 1u << kind;
        return;
    }
    if (g_table.n == TRAIN_MAX_KEYS) broken("more keys than TRAIN_MAX_KEYS", k);
    g_table.kind_mask[g_table.n] = kind < 0 ? 0 : 1u << kind;
    g_table.keys[g_table.n++] = k;
}

static void build_table(void) {
    for (size_t i = 0; i < sizeof g_keys_first / sizeof g_keys_first[0]; i++)
        add_key(&g_keys_first[i], -1);
    for (int c = 0; c < g_table.n_kinds; c++) {
        g_table.kind_names[c] = g_table.kinds[c].name;
        for (int i = 0; i < g_table.kinds[c].n_keys; i++) add_key(&g_table.kinds[c].keys[i], c);
    }
    for (size_t i = 0; i < sizeof g_keys_last / sizeof g_keys_last[0]; i++)
        add_key(&g_keys_last[i], -1);
}

void train_config_register_kinds(const train_kind_keys *kinds, int n) {
    if (!g_table.kinds) { /* under train_kinds_register's pthread_once */
        g_table.kinds = kinds;
        g_table.n_kinds = n < TRAIN_MAX_KINDS ? n : TRAIN_MAX_KINDS;
    }
    pthread_once(&g_table.once, build_table);
}

/* The list, joined: a key is read only after the kinds registered (train_kinds_register). */
static void joined(void) {
    if (!g_table.kinds) {
        fprintf(stderr, "fsdp-train: the key table was read before the model kinds registered "
                        "(train_kinds_register)\n");
        abort();
    }
}

int train_key_count(void) {
    joined();
    return g_table.n;
}

const train_key *train_key_at(int i) {
    joined();
    return g_table.keys[i];
}

unsigned train_key_kinds(int i) {
    joined();
    return g_table.kind_mask[i];
}

const char *train_key_kind_name(int c) {
    joined();
    return c >= 0 && c < g_table.n_kinds ? g_table.kinds[c].name : NULL;
}

const char *train_key_kind_help(int i, int c) {
    joined();
    if (!(g_table.kind_mask[i] & 1u << c)) return NULL;
    const train_kind_keys *k = &g_table.kinds[c];
    for (int j = 0; j < k->n_keys; j++)
        if (strcmp(k->keys[j].section, g_table.keys[i]->section) == 0 &&
            strcmp(k->keys[j].name, g_table.keys[i]->name) == 0)
            return k->keys[j].help;
    return NULL;
}

static const char *kind_help(int c) {
    return c >= 0 && c < g_table.n_kinds ? g_table.kinds[c].help : NULL;
}

int train_key_find(const char *section, const char *name) {
    int n = train_key_count();
    for (int i = 0; i < n; i++)
        if (strcmp(g_table.keys[i]->section, section) == 0 &&
            strcmp(g_table.keys[i]->name, name) == 0)
            return i;
    return -1;
}

const char *train_config_key_text(const train_config *cfg, const char *section, const char *name,
                                  char *buf, size_t size) {
    int idx = train_key_find(section, name);
    char value[TRAIN_MAX_STRING + 64];
    train_key_format(cfg, train_key_at(idx), value, sizeof value);
    buf[0] = '\0';
    train_append(buf, size, "[%s] %s = %s (%s)", section, name, value, cfg->origin[idx]);
    return buf;
}

const char *train_config_value(const train_config *cfg, const char *section, const char *name,
                               char *buf, size_t size) {
    train_key_format(cfg, train_key_at(train_key_find(section, name)), buf, size);
    return buf;
}

/* Whether key [section] name holds a value other than its default. */
bool train_config_changed(const train_config *cfg, const char *section, const char *name) {
    int idx = train_key_find(section, name);
    char value[TRAIN_MAX_STRING + 64], def[TRAIN_MAX_STRING + 64];
    train_key_format(cfg, train_key_at(idx), value, sizeof value);
    train_config tmp;
    memset(&tmp, 0, sizeof tmp);
    char why[256];
    if (!train_key_parse(train_key_at(idx), train_key_at(idx)->def, &tmp, why, sizeof why))
        return true;
    train_key_format(&tmp, train_key_at(idx), def, sizeof def);
    return strcmp(value, def) != 0;
}

train_backend train_config_backend(const train_config *cfg) {
    bool mpirun = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE");
    if (cfg->parallel.backend == TRAIN_BACKEND_AUTO)
        return mpirun ? TRAIN_BACKEND_MPI : TRAIN_BACKEND_LOCAL;
    if (cfg->parallel.backend == TRAIN_BACKEND_NCCL)
        return mpirun ? TRAIN_BACKEND_NCCL_MPI : TRAIN_BACKEND_NCCL;
    return cfg->parallel.backend;
}

bool train_backend_processes(train_backend backend) {
    return backend == TRAIN_BACKEND_MPI || backend == TRAIN_BACKEND_NCCL_MPI;
}

fsdp_backend train_backend_world(train_backend backend) {
    switch (backend) {
    case TRAIN_BACKEND_MPI:
        return FSDP_BACKEND_MPI;
    case TRAIN_BACKEND_NCCL:
        return FSDP_BACKEND_NCCL;
    case TRAIN_BACKEND_NCCL_MPI:
        return FSDP_BACKEND_NCCL_MPI;
    default:
        return FSDP_BACKEND_LOCAL;
    }
}

const char *train_backend_name(train_backend backend) {
    return fsdp_backend_to_string(train_backend_world(backend));
}

int train_config_world_size(const train_config *cfg) {
    if (cfg->parallel.ranks > 0) return (int)cfg->parallel.ranks;
    return train_backend_processes(train_config_backend(cfg)) ? 0 : (int)cfg->parallel.tp;
}

bool train_config_key_not_for(const train_config *cfg, const char *section, const char *name,
                              bool applies, const char *to, const char *dsec, const char *dname,
                              char *err, size_t err_size) {
    if (applies || !train_config_changed(cfg, section, name)) return false;
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    snprintf(err, err_size, "%s applies to %s, but %s; remove it or change %s",
             train_config_key_text(cfg, section, name, a, sizeof a), to,
             train_config_key_text(cfg, dsec, dname, b, sizeof b), dname);
    return true;
}

const char *train_config_origin(const train_config *cfg, const char *section, const char *name) {
    int idx = train_key_find(section, name);
    return idx < 0 ? NULL : cfg->origin[idx];
}

void train_config_describe_world(const train_config *cfg, int world, char *buf, size_t size) {
    char k[TRAIN_KEY_TEXT_SIZE];
    buf[0] = '\0';
    if (cfg->parallel.ranks > 0)
        train_append(buf, size, "a world of %d ranks (%s)", world,
                     train_config_key_text(cfg, "parallel", "ranks", k, sizeof k));
    else if (train_backend_processes(train_config_backend(cfg)))
        train_append(buf, size, "a world of %d ranks (the processes of the MPI job)", world);
    else
        train_append(buf, size, "a world of %d ranks (%s: as many as tp)", world,
                     train_config_key_text(cfg, "parallel", "ranks", k, sizeof k));
}

int train_config_no_decay(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]) {
    return train_split_patterns(cfg->optim.no_decay, TRAIN_MAX_NO_DECAY, patterns);
}

int train_config_checkpoint_patterns(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]) {
    return train_split_patterns(cfg->model.checkpoint_activations, TRAIN_MAX_ACT_PATTERNS,
                                patterns);
}

fsdp_ctx_options train_config_ctx_options(const train_config *cfg) {
    return (fsdp_ctx_options){.seed = (uint64_t)cfg->train.seed, .log_level = cfg->log.level};
}
