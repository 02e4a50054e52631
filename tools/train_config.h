/* train_config.h: fsdp-train's configuration. One description of the keys (train_keys.h: the
 * common ones and each model kind's own) drives the INI parser (libinih), --set overrides,
 * validation and --help, so they cannot drift apart. */
#ifndef FSDP_TOOLS_TRAIN_CONFIG_H
#define FSDP_TOOLS_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/fsdp.h"
#include "train_keys.h" // defines: train_key, train_int_list, train_append

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_MAX_KEYS   96   /* keys in the table */
#define TRAIN_MAX_ORIGIN 160  /* bytes of one origin text */
#define TRAIN_ERROR_SIZE 1024 /* a good size for the err buffers below */
/* Limits of the input, stated by --help and the error messages: */
#define TRAIN_MAX_VALUE        (TRAIN_MAX_STRING - 1) /* characters of a --set value */
#define TRAIN_MAX_LINE         198     /* characters of a config line, its newline not counted */
#define TRAIN_MAX_CONFIG_BYTES 1048576 /* bytes of a config file (1 MiB) */

/* [model] kind: which model, the index of its entry in the table of model kinds
 * (train_kind.h, train_kinds.c); the first two are named here. */
typedef enum train_model_kind {
    TRAIN_MODEL_MLP = 0, /* fsdp_model_mlp over [model] widths (kind_mlp.c) */
    TRAIN_MODEL_LLAMA,   /* fsdp_model_llama over [model] dim, n_layers, ... (kind_llama.c) */
} train_model_kind;

/* [data] kind: where the samples come from. */
typedef enum train_data_kind {
    TRAIN_DATA_SYNTHETIC = 0, /* inputs from the counter RNG, targets from a random teacher */
    TRAIN_DATA_H5,            /* datasets x and y of an HDF5 file */
    TRAIN_DATA_TOKENS,        /* a token file (train_tokens.h) for kind = llama */
} train_data_kind;

/* [data] task: the loss. */
typedef enum train_task {
    TRAIN_TASK_REGRESSION = 0, /* MSE against float targets (N, out) */
    TRAIN_TASK_CLASSIFICATION, /* cross-entropy against class ids (N,) in [0, out) */
} train_task;

/* [optim] name. */
typedef enum train_optim_name {
    TRAIN_OPTIM_SGD = 0,
    TRAIN_OPTIM_ADAM,
    TRAIN_OPTIM_ADAMW,
} train_optim_name;

/* [optim] schedule: the library's fsdp_lr_schedule_kind, by the same index. */
typedef enum train_schedule {
    TRAIN_SCHEDULE_CONSTANT = 0,
    TRAIN_SCHEDULE_WARMUP,
    TRAIN_SCHEDULE_COSINE,
} train_schedule;

/* [parallel] backend: where the ranks run. */
typedef enum train_backend {
    TRAIN_BACKEND_LOCAL = 0, /* rank threads in this process */
    TRAIN_BACKEND_MPI,       /* one process per rank under mpirun */
    TRAIN_BACKEND_AUTO,      /* mpi when started by mpirun, else local */
    /* rank threads on GPUs (or sim devices) with NCCL moving device tensors; under mpirun it
     * resolves to TRAIN_BACKEND_NCCL_MPI */
    TRAIN_BACKEND_NCCL,
    TRAIN_BACKEND_NCCL_MPI /* resolved only (no key value): one process per rank and GPU */
} train_backend;

/* [parallel] mode: how the data-parallel ranks hold the model. */
typedef enum train_mode {
    TRAIN_MODE_FSDP = 0,  /* fsdp_fully_shard with [parallel] strategy */
    TRAIN_MODE_REPLICATE, /* fsdp_replicate_apply (DDP): a whole replica per dp rank */
} train_mode;

/* [parallel] wrap: the FSDP units. */
typedef enum train_wrap {
    TRAIN_WRAP_NONE = 0, /* one unit: the root */
    TRAIN_WRAP_LAYER,    /* one nested unit per hidden Linear; the root keeps the output one */
} train_wrap;

/* [model] norm: a normalisation of the MLP's input. */
typedef enum train_norm {
    TRAIN_NORM_NONE = 0, /* nn.Sequential(Linear, act, Linear, ...) */
    TRAIN_NORM_RMSNORM,  /* nn.Sequential(RMSNorm(widths[0]), Linear, act, Linear, ...) */
} train_norm;

/* [log] progress: how rank 0 shows progress between the log lines. */
typedef enum train_progress_style {
    TRAIN_PROGRESS_AUTO = 0, /* a bar when the output is a terminal, else lines */
    TRAIN_PROGRESS_BAR,      /* a bar redrawn in place (\r), whatever the output */
    TRAIN_PROGRESS_LINES,    /* the log lines only */
} train_progress_style;

/* The values of every key (see train_config_print_help for their meaning and defaults). */
typedef struct train_config {
    /* [model]: the kind, and the values of every kind's own keys (each kind's file lists its
     * keys: a key only its kind may set) */
    struct {
        train_model_kind kind;
        train_int_list widths; /* mlp: input, hidden..., output */
        fsdp_activation activation;
        char init[TRAIN_MAX_STRING];    /* "random", or the path of a state to start from */
        train_norm norm;                /* mlp */
        char tp_plan[TRAIN_MAX_STRING]; /* mlp: "name=style,...", "" for the Megatron pairs */
        /* module name patterns, "" for none (llama: matched against model.layers.<i>) */
        char checkpoint_activations[TRAIN_MAX_STRING];
        /* llama: fsdp_llama_config's fields (0 for n_kv_heads and ffn_hidden: its default) */
        int64_t dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_hidden, max_seq_len;
        double norm_eps, rope_theta;
        /* llama: Llama 3's rope scaling (fsdp_llama_rope_scaling): 0 none, 1 llama3 */
        int rope_scaling;
        double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
        int64_t rope_original_max_len;
        bool tie_embeddings; /* llama: lm_head shares the embedding's weight */
        int autocast;        /* llama: the compute policy, 0 f32, 1 bf16 (compute_dtype) */
    } model;
    struct {
        train_backend backend;
        int64_t ranks;            /* 0: the MPI job's size under mpi, tp under local */
        int64_t threads_per_rank; /* threads of each rank; 0: cores shared out */
        int64_t tp;
        train_mode mode;
        fsdp_sharding_strategy strategy;
        int64_t replicas; /* hybrid_shard: replica groups; 0 picks one */
        bool offload;
        train_wrap wrap;
        bool use_orig_params;
        bool sync_module_states;
        int64_t timeout_s;
        int mixed_precision;           /* fsdp: an entry of train_mixed_precision's table */
        fsdp_comm_hook_kind comm_hook; /* DEFAULT, BF16 or FP16 */
        double bucket_mb;              /* replicate: bucket cap in MiB; 0: DDP's default */
        bool pin_threads;
        bool comm_thread;        /* the mpi backend's communication thread */
        bool allow_tf32;         /* cuda: f32 GEMMs on TF32 tensor cores */
        fsdp_device_type device; /* the kind of device every rank computes on (train_device.h) */
    } parallel;
    struct {
        train_data_kind kind;
        char path[TRAIN_MAX_STRING]; /* h5: the file */
        char x[TRAIN_MAX_STRING];    /* h5: the inputs' dataset */
        char y[TRAIN_MAX_STRING];    /* h5: the targets' dataset */
        train_task task;
        double eval_fraction; /* the held-out tail of the samples */
        bool shuffle;         /* a seeded permutation of the training samples per epoch */
        int64_t samples;
        int64_t batch_size;
        int64_t seed;
        train_int_list teacher_widths; /* hidden widths only */
        double noise;
        int64_t eval_batches; /* tokens: batches of held-out (and probe) sequences evaluated */
    } data;
    struct {
        train_optim_name name;
        double lr;
        double momentum;
        bool nesterov;
        train_float_list betas; /* adam, adamw: beta1, beta2 */
        double eps;
        double weight_decay;
        char no_decay[TRAIN_MAX_STRING]; /* comma-separated fnmatch patterns, "" for none */
        double clip_grad_norm;           /* 0: no clipping */
        train_schedule schedule;
        int64_t warmup_steps;
        double min_lr;
    } optim;
    struct {
        int64_t steps;
        int64_t seed;
        int64_t log_every;
        int64_t eval_every; /* 0: only after the last step */
        int64_t grad_accum; /* micro-batches per step, dividing data.batch_size */
    } train;
    struct {
        char dir[TRAIN_MAX_STRING];    /* "" for no checkpoints */
        int64_t every;                 /* steps between saves; 0: only at the end */
        int64_t keep;                  /* newest kept; 0: all */
        char resume[TRAIN_MAX_STRING]; /* "auto", "none" or a checkpoint step directory */
        bool async;
    } checkpoint;
    struct {
        fsdp_log_level level;
        char metrics[TRAIN_MAX_STRING];     /* "" for none */
        char tensorboard[TRAIN_MAX_STRING]; /* event file directory; "" for none */
        bool comm_debug;                    /* print rank 0's collectives of a step */
        double peak_tflops;                 /* one device's peak for mfu; 0: its own figure */
        train_progress_style progress;
    } log;
    /* Where each key's value came from, by table index: "default", "run.ini:12" or
     * "--set optim.lr=0.1". */
    char origin[TRAIN_MAX_KEYS][TRAIN_MAX_ORIGIN];
} train_config;

/* ---- the one list of keys ---- */

/* A model kind's part of the list: its name, help and own [model] keys (train_kind.h). */
typedef struct train_kind_keys {
    const char *name;
    const char *help;
    const train_key *keys;
    int n_keys;
} train_kind_keys;

#define TRAIN_MAX_KINDS 32

/* Joins the common keys with the kinds' (n at most TRAIN_MAX_KINDS, by [model] kind's value),
 * once: the first call wins (train_kinds_register makes it, before any key is read); kinds
 * stays the caller's. A key that two kinds declare must be declared alike (all but the help):
 * else, or with more than TRAIN_MAX_KEYS keys, the table is broken and this aborts. */
void train_config_register_kinds(const train_kind_keys *kinds, int n);

/* The sections, in the order the help and the written configuration show them. */
int train_section_count(void);
const char *train_section_name(int i);
const char *train_section_help(int i);
int train_section_find(const char *name); /* -1 when unknown */

/* Every key once, by index: the common [model] kind, then the kinds' own [model] keys (a key
 * that several kinds declare is one key), then the other common keys. */
int train_key_count(void);
const train_key *train_key_at(int i);
int train_key_find(const char *section, const char *name); /* -1 when unknown */
/* The model kinds that declare key i, as a bit mask of their indices; 0 for a common key. */
unsigned train_key_kinds(int i);
/* The kinds' own help for key i (of kind c), or NULL when kind c does not declare it. */
const char *train_key_kind_help(int i, int c);
/* The registered kinds' names, by index: NULL past the last. */
const char *train_key_kind_name(int c);

/* Sets every key to its default. */
void train_config_init(train_config *cfg);

/* Reads an INI file over cfg. The file is read whole first: it must be a regular file (a FIFO
 * or a device is refused without reading it) of at most TRAIN_MAX_CONFIG_BYTES bytes, without
 * NUL bytes, and its lines at most TRAIN_MAX_LINE characters. On failure returns FSDP_ERR_IO
 * (the file cannot be opened or read, or is not a regular file) or FSDP_ERR_CONFIG and writes
 * "FILE:LINE: what is wrong; what is allowed" into err; cfg then holds the keys read before
 * the bad line. */
fsdp_status train_config_load(train_config *cfg, const char *path, char *err, size_t err_size);

/* Applies one "section.key=value" override, validated like a line of the file; the value is
 * at most TRAIN_MAX_VALUE characters (white space around it not counted). An error names the
 * argument. Returns FSDP_ERR_CONFIG on failure. */
fsdp_status train_config_set(train_config *cfg, const char *assignment, char *err, size_t err_size);

/* Checks rules that join several keys (nesterov needs momentum, tp must divide the sharded
 * widths, FSDP-only keys need mode = fsdp, keys of another [data] kind or task, another
 * optimizer or schedule are not set, kind = h5 has a path, no_decay under fsdp has
 * use_orig_params, cosine's warmup_steps < steps and min_lr <= lr, eval_every has a held-out
 * split, ...) and, when the world size follows from the
 * configuration (train_config_world_size), the layout (train_layout_resolve).
 * FSDP_ERR_CONFIG on failure. */
fsdp_status train_config_check(const train_config *cfg, char *err, size_t err_size);

#define TRAIN_MAX_NO_DECAY 8 /* patterns of [optim] no_decay */

/* Splits [optim] no_decay at its commas into patterns (white space around each removed):
 * returns their number (0 for none), or -1 when one is empty or there are more than
 * TRAIN_MAX_NO_DECAY. */
int train_config_no_decay(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]);

/* The modules of the model [model] describes, walked from the module tree its kind builds (at
 * the smallest sizes): every module under the root in pre-order, by its fully qualified name
 * ("0", "1", ... for the MLP's nn.Sequential; "layers.0.net1" for MLPStacked), with its kind
 * ("Linear", "ReLU", "GELU", "Sigmoid", "RMSNorm", ...) and, for a Linear, its index among the
 * Linear layers (else -1). Returns their number (at most TRAIN_MAX_MODULES; 0 when the model
 * cannot be built). */
#define TRAIN_MAX_MODULES (2 * TRAIN_MAX_LIST)
typedef struct train_module_info {
    char name[64]; /* fsdp_module_fqn */
    const char *kind;
    int linear; /* Linear i of the MLP, or -1 */
} train_module_info;
int train_config_modules(const train_config *cfg, train_module_info *modules);

/* A Linear layer's tensor-parallel style ([model] tp_plan). */
typedef enum train_tp_style {
    TRAIN_TP_NONE = 0, /* whole on every tp rank */
    TRAIN_TP_COLWISE,  /* ColwiseParallel: Replicate input, output sharded on its last dim */
    TRAIN_TP_ROWWISE,  /* RowwiseParallel: input sharded on its last dim, Replicate output */
} train_tp_style;

/* The style of each Linear layer (styles[i] for Linear i, TRAIN_MAX_LIST entries) under
 * [model] tp_plan: its "name=style" pairs (a name may be an fnmatch pattern), or when it is
 * empty the Megatron pairs (Linear 2k colwise, 2k+1 rowwise; with an odd count the last one
 * none). Checks that every name matches a Linear layer of the model, that no layer gets two
 * styles, and that the activations flow (a colwise layer is followed by a rowwise one, with only
 * element-wise modules between). FSDP_ERR_CONFIG with a message naming the key on failure. */
fsdp_status train_config_tp_plan(const train_config *cfg, train_tp_style *styles, char *err,
                                 size_t err_size);

#define TRAIN_MAX_ACT_PATTERNS 8 /* patterns of [model] checkpoint_activations */

/* Splits [model] checkpoint_activations into patterns, as train_config_no_decay does. */
int train_config_checkpoint_patterns(const train_config *cfg, char (*patterns)[TRAIN_MAX_STRING]);

/* [parallel] backend with auto and nccl resolved: when the process was started by mpirun
 * (OMPI_COMM_WORLD_SIZE, or PMI_SIZE of MPICH's launchers, is set) auto is TRAIN_BACKEND_MPI
 * and nccl TRAIN_BACKEND_NCCL_MPI, else TRAIN_BACKEND_LOCAL and TRAIN_BACKEND_NCCL. */
train_backend train_config_backend(const train_config *cfg);

/* Whether a resolved backend runs one process per rank (mpi, nccl-mpi) rather than rank
 * threads of this process (local, nccl). */
bool train_backend_processes(train_backend backend);

/* The library's backend of a resolved one, and its name ("local", "mpi", "nccl", "nccl-mpi"). */
fsdp_backend train_backend_world(train_backend backend);
const char *train_backend_name(train_backend backend);

/* The number of ranks the configuration asks for: ranks, or under local with ranks = 0, tp.
 * 0 under mpi with ranks = 0: the job's size decides, known once the world exists. */
/* [parallel] mixed_precision as FSDP's option (param_dtype, reduce_dtype). */
fsdp_mixed_precision train_config_mixed_precision(const train_config *cfg);

int train_config_world_size(const train_config *cfg);

/* How a world of ranks is laid out: world = dp * tp, world rank = row-major index of
 * (dp index, tp index); with hybrid_shard dp = replicas * shard and the dp index is
 * (replica, shard) row-major. */
typedef struct train_layout {
    train_backend backend; /* resolved: local, mpi, nccl or nccl-mpi */
    int world;
    int dp;
    int tp;
    int replicas; /* hybrid_shard: replica groups (mesh dim "replicate"); else 1 */
    int shard;    /* hybrid_shard: ranks per shard group (mesh dim "shard"); else dp */
} train_layout;

/* Where the world size comes from, for messages: "a world of 4 ranks ([parallel] ranks = 4
 * (run.ini:9))". */
void train_config_describe_world(const train_config *cfg, int world, char *buf, size_t size);

/* Lays out a world of `world` ranks as cfg says and checks it: tp divides the world, each dp
 * rank gets samples (batch_size >= dp), hybrid_shard has dp >= 2 and replicas dividing dp.
 * FSDP_ERR_CONFIG with a message naming the keys and their origins on failure. */
fsdp_status train_layout_resolve(const train_config *cfg, int world, train_layout *out, char *err,
                                 size_t err_size);

/* "4 ranks (local): dp 2 x tp 2" and the mode: "fsdp full_shard, wrap layer". */
void train_layout_describe(const train_config *cfg, const train_layout *layout, char *buf,
                           size_t size);

/* Sets [section] name from text as if read at `where` (its origin from now on): the key's
 * parser checks the value; FSDP_ERR_CONFIG with "<where>: bad value ..." otherwise. */
fsdp_status train_config_set_from(train_config *cfg, const char *section, const char *name,
                                  const char *text, const char *where, char *err, size_t err_size);

/* The kind's adopt_init (train_kind.h): [model] keys from the shape [model] init describes
 * (a Hugging Face config.json); *changed when a key took a value. fsdp-train's command line
 * and train_run call it before train_config_check. */
fsdp_status train_config_adopt_init(train_config *cfg, bool *changed, char *err, size_t err_size);

/* The origin text of a key ("default", "run.ini:12", ...), or NULL for an unknown key. */
const char *train_config_origin(const train_config *cfg, const char *section, const char *name);

/* The value of [section] name as a file would hold it ("full_shard", "0.2"); returns buf. */
const char *train_config_value(const train_config *cfg, const char *section, const char *name,
                               char *buf, size_t size);

/* Whether key [section] name holds a value other than its default. */
bool train_config_changed(const train_config *cfg, const char *section, const char *name);

/* Fails naming [section] name when it was changed from its default although `applies` (a
 * condition described by `to`, with the key dsec.dname that decides it) does not hold: writes
 * "[section] name = value (origin) applies to <to>, but <dsec dname>; remove it or change
 * <dname>" into err and returns true. */
bool train_config_key_not_for(const train_config *cfg, const char *section, const char *name,
                              bool applies, const char *to, const char *dsec, const char *dname,
                              char *err, size_t err_size);

#define TRAIN_KEY_TEXT_SIZE 768 /* enough for most key texts; a longer one is truncated */

/* "[section] name = value (origin)" of a key of the table, for messages; returns buf. */
const char *train_config_key_text(const train_config *cfg, const char *section, const char *name,
                                  char *buf, size_t size);

/* The effective configuration's fingerprint: a 64-bit FNV-1a hash of the canonical text of
 * every key's value (as train_config_write writes it; floats in the shortest text that reads
 * back to the same double). Where the values came from does not count. */
uint64_t train_config_hash(const train_config *cfg);

/* Checks that every rank of `group` (NULL: the world group of ctx) has the same configuration:
 * one all_gather of train_config_hash (the 64 bits as three f32 integers of 22, 22 and 20 bits,
 * which the backends move exactly). Every rank of the group calls it, inside fsdp_world_run.
 * When they differ, the ranks exchange a hash per key and the values of the first key (in
 * table order) that differs, and every rank returns FSDP_ERR_STATE with the same message in
 * err: the key, its value and origin on the group's rank 0 and on the first rank that differs
 * (world ranks), and how many more keys differ. A failed collective returns its status, its
 * message (fsdp_last_error) in err. */
fsdp_status train_config_agree(fsdp_ctx *ctx, fsdp_group *group, const train_config *cfg, char *err,
                               size_t err_size);

/* Writes the effective configuration as an INI file, each key followed by a comment naming
 * where its value came from. */
void train_config_write(const train_config *cfg, FILE *f);

/* The value of [section] name in `saved`, a configuration as train_config_write writes it (the
 * text a checkpoint keeps), into value: true when found. */
bool train_config_saved_value(const char *saved, const char *section, const char *name, char *value,
                              size_t size);

/* Compares every key of the NULL-terminated `sections` but those of `except`
 * ("section.name" entries, NULL-terminated; may be NULL) with its value in `saved` (as
 * train_config_write writes it; a key missing there counts as its default). On the first key
 * that differs, in table order, returns FSDP_ERR_CONFIG and writes "[section] name = value
 * (origin) here, but <saved value> (<saved origin>) in the saved configuration" into err. */
fsdp_status train_config_compare_saved(const train_config *cfg, const char *saved,
                                       const char *const *sections, const char *const *except,
                                       char *err, size_t err_size);

/* Writes the usage, the options and every section and key with type, default and meaning. */
void train_config_print_help(FILE *f);

/* Writes the usage lines alone (the first lines of the help), for a bad command line. */
void train_config_print_usage(FILE *f);

typedef enum train_cli_action {
    TRAIN_CLI_RUN = 0,
    TRAIN_CLI_HELP,
    TRAIN_CLI_VERSION,
    TRAIN_CLI_PLAN,      /* --plan: the estimate of the run (train_estimate.h), no training */
    TRAIN_CLI_PLAN_JSON, /* --plan --json */
    TRAIN_CLI_BAD_USAGE  /* the error is the command line's (fsdp-train prints the usage) */
} train_cli_action;

/* Parses fsdp-train's arguments (argv[0] is the program): --config FILE, --set A (repeatable,
 * applied after the file in the order given), --plan [--json], --help, --version. For
 * TRAIN_CLI_RUN and the plans, cfg holds the checked configuration. Errors (FSDP_ERR_CONFIG or
 * FSDP_ERR_IO) are written into err; *action is TRAIN_CLI_BAD_USAGE when the command line
 * itself is wrong (an unknown argument, a missing value or --config, --json without --plan). */
fsdp_status train_cli_parse(int argc, char **argv, train_config *cfg, train_cli_action *action,
                            char *err, size_t err_size);

/* Context options for a run: seed = train.seed, log level = log.level. */
fsdp_ctx_options train_config_ctx_options(const train_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
