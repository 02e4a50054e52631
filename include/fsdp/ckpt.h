/* ckpt.h: a model's state by name (the state API) and sharded HDF5 checkpoints that load at any
 * layout. docs/checkpoint.md describes the format and the guarantees.
 *
 * The state of a model is a list of entries, one per parameter, buffer and optimizer state
 * tensor, each named as PyTorch's state_dict() would name it ("net1.weight",
 * "optim/net1.weight/exp_avg") with its global shape and dtype, and the regions of the global
 * tensor that this rank holds: under tensor parallelism the local block, under FSDP the part
 * of the block in this rank's flat shard (a flat range of the block, which is up to a few
 * boxes), under replicate or NO_SHARD the whole block. A checkpoint stores each held region
 * once (the lowest rank holding it writes it) and loading reads, for every region the loading
 * rank holds under its own layout, the overlapping parts of the saved pieces. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/llama.h"
#include "fsdp/optim.h"
#include "fsdp/wrap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the state API ---- */

typedef struct fsdp_state fsdp_state;

typedef enum fsdp_state_kind {
    FSDP_STATE_PARAM = 0, /* a parameter: "net1.weight" */
    FSDP_STATE_BUFFER,    /* a module buffer: "norm.running" */
    FSDP_STATE_OPTIM,     /* an optimizer state tensor: "optim/net1.weight/exp_avg" */
    FSDP_STATE_KIND_COUNT
} fsdp_state_kind;

const char *fsdp_state_kind_to_string(fsdp_state_kind kind); /* "param", "buffer", "optim" */

/* What the state is read from and written to. Pass what the run has: */
typedef struct fsdp_state_sources {
    fsdp_module *model; /* required: the root the names are relative to (the one FSDP wrapped) */
    /* The model's FSDP wrapping (fsdp_fully_shard on model), or NULL: then the parameters are
     * the model's own (plain, tensor-parallel or replicated). */
    fsdp_sharded *sharded;
    /* An optimizer over the model (or over fsdp_sharded_flat_params(sharded)), or NULL. Its
     * state tensors become FSDP_STATE_OPTIM entries and its step count is the state's. */
    fsdp_optimizer *optimizer;
} fsdp_state_sources;

/* Lists the state of this rank. Every rank of a run calls it with the same structure; the
 * entries come in the same order on every rank: parameters (named_parameters() order),
 * buffers, then the optimizer's state by parameter and kind. The sources must outlive *out,
 * which the caller owns (fsdp_state_free). Reads no values and makes no collective. */
fsdp_status fsdp_state_create(fsdp_ctx *ctx, const fsdp_state_sources *src, fsdp_state **out);
void fsdp_state_free(fsdp_state *st); /* NULL does nothing */

#define FSDP_STATE_NAME_MAX 256 /* bytes of an entry name, with the terminating NUL */

typedef struct fsdp_state_entry {
    const char *name;       /* owned by the state */
    const char *param_name; /* the parameter an FSDP_STATE_OPTIM entry belongs to; else name */
    fsdp_state_kind kind;
    fsdp_optim_state_kind optim_kind; /* FSDP_STATE_OPTIM only */
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global */
    int n_regions;                /* regions this rank holds (0 when it holds none) */
    int64_t numel_held;           /* elements over those regions */
} fsdp_state_entry;

/* A box of a global tensor: elements offset[d] .. offset[d] + count[d] - 1 along each dim.
 * Its values travel in row-major order of the box. */
typedef struct fsdp_state_region {
    int ndim;
    int64_t offset[FSDP_MAX_DIMS];
    int64_t count[FSDP_MAX_DIMS];
} fsdp_state_region;

int fsdp_state_num_entries(const fsdp_state *st);
/* Entry i (0 .. num_entries - 1). FSDP_ERR_INVALID_ARGUMENT when out of range. */
fsdp_status fsdp_state_entry_get(fsdp_ctx *ctx, const fsdp_state *st, int i, fsdp_state_entry *out);
/* The index of the entry called name, or -1. */
int fsdp_state_find(const fsdp_state *st, const char *name);
/* Region k (0 .. n_regions - 1) of entry i. */
fsdp_status fsdp_state_region_get(fsdp_ctx *ctx, const fsdp_state *st, int i, int k,
                                  fsdp_state_region *out);
/* Copies the values of region k of entry i to / from host memory (numel of the region
 * elements of the entry's dtype, row-major), wherever the tensor lives. */
fsdp_status fsdp_state_read_region(fsdp_ctx *ctx, const fsdp_state *st, int i, int k, void *dst);
fsdp_status fsdp_state_write_region(fsdp_ctx *ctx, const fsdp_state *st, int i, int k,
                                    const void *src);
/* Loads a whole global value into entry i by name: this rank takes the parts it holds, before
 * or after wrapping, with no collective. value has the entry's global shape and dtype, on any
 * device. */
fsdp_status fsdp_state_load_value(fsdp_ctx *ctx, const fsdp_state *st, const char *name,
                                  const fsdp_tensor *value);
/* The optimizer's step count (0 without an optimizer), and setting it (loading). */
int64_t fsdp_state_steps(const fsdp_state *st);
void fsdp_state_set_steps(fsdp_state *st, int64_t steps);

/* ---- checkpoints: saving ---- */

/* Format 2 binds a checkpoint's files together: a checkpoint id in metadata.h5 and every
 * shard, and a digest of every piece's values (docs/checkpoint.md). Format 1 still loads. */
#define FSDP_CKPT_FORMAT_VERSION 2
#define FSDP_CKPT_MAX_EXTRAS     64

/* What a checkpoint records beside the tensors. */
typedef struct fsdp_ckpt_meta {
    int64_t step;       /* the training step; names the directory "step-<8 digits>" */
    const char *layout; /* how the run was laid out, free text ("dp=2 tp=2 FULL_SHARD"), or NULL */
    const char *config; /* the run's configuration text, or NULL */
    /* Named integers the trainer needs to resume: the RNG seed and counters, the data
     * position. Names are [A-Za-z0-9_.]+, at most 63 bytes. */
    int n_extras;
    const char *const *extra_names;
    const int64_t *extra_values;
    /* The model's hyper-parameters as the text of a JSON object, or NULL: for a Llama model,
     * its Hugging Face config.json (fsdp_llama_config_to_hf_json), which `fsdp-ckpt export
     * --format hf` needs. At most 1 MiB. Stored as the optional dataset "model_config" of
     * metadata.h5 (readers before it ignore it: the format version is unchanged). */
    const char *model_config;
} fsdp_ckpt_meta;

typedef struct fsdp_ckpt_options {
    /* zstd level of every dataset, 1..19; default 0: 3. FSDP_CKPT_NO_COMPRESSION stores raw. */
    int zstd_level;
    /* Keep the newest `keep` committed checkpoints in the directory, deleting older ones after
     * each commit; 0 keeps all. */
    int keep;
    /* Async save: fsdp_ckpt_save blocks only while this rank's regions are copied to host
     * memory; a background thread writes the files while training goes on, and the commit
     * (every rank's files written, then the rename) happens at the next fsdp_ckpt_save,
     * fsdp_ckpt_writer_wait or fsdp_ckpt_writer_free. */
    bool async;
} fsdp_ckpt_options;

#define FSDP_CKPT_NO_COMPRESSION (-1)

typedef struct fsdp_ckpt_writer fsdp_ckpt_writer;

/* A writer of checkpoints into directory `dir` (created when missing), one sub-directory
 * "step-<8 digits>" per save. Every rank creates one with the same dir and options. opts
 * may be NULL for the defaults. The caller owns *out. */
fsdp_status fsdp_ckpt_writer_create(fsdp_ctx *ctx, const char *dir, const fsdp_ckpt_options *opts,
                                    fsdp_ckpt_writer **out);
/* Saves the state: every rank calls it, at the same step, with a state of the same entries.
 * Each rank writes the regions it holds that no lower rank holds to its shard file, rank 0 the
 * metadata, into "<dir>/.step-<8 digits>.tmp"; once every rank has written (a collective on
 * the world group), rank 0 renames it to "<dir>/step-<8 digits>". Memory beyond what the
 * rank holds: one region's values at a time (sync), every held region's values (async).
 * A failed save leaves the earlier checkpoints as they were; the temporary directory is
 * removed by the next save. */
fsdp_status fsdp_ckpt_save(fsdp_ctx *ctx, fsdp_ckpt_writer *w, const fsdp_state *st,
                           const fsdp_ckpt_meta *meta);
/* Async: waits for the save in flight and commits it (a collective). Returns its status. */
fsdp_status fsdp_ckpt_writer_wait(fsdp_ctx *ctx, fsdp_ckpt_writer *w);
/* The seconds the last fsdp_ckpt_save blocked the caller, and the path of the last committed
 * checkpoint ("" before the first). */
double fsdp_ckpt_writer_last_blocking_seconds(const fsdp_ckpt_writer *w);
const char *fsdp_ckpt_writer_last_path(const fsdp_ckpt_writer *w);
/* Waits for (and commits) a save in flight, then frees. NULL does nothing. Every rank calls it
 * when a save may be in flight, since the commit is a collective. */
void fsdp_ckpt_writer_free(fsdp_ctx *ctx, fsdp_ckpt_writer *w);

/* The newest committed checkpoint under dir ("<dir>/step-<8 digits>" with the highest step);
 * FSDP_ERR_NOT_FOUND when there is none. *out is malloc'ed; the caller frees it. */
fsdp_status fsdp_ckpt_latest(fsdp_ctx *ctx, const char *dir, char **out);

/* ---- checkpoints: reading ---- */

typedef struct fsdp_ckpt fsdp_ckpt;

/* Opens a committed checkpoint directory and reads and checks its metadata (format version,
 * every size and region against its tensor). Bad files fail naming the file and the problem.
 * The caller owns *out (fsdp_ckpt_close). Makes no collective. */
fsdp_status fsdp_ckpt_open(fsdp_ctx *ctx, const char *path, fsdp_ckpt **out);
void fsdp_ckpt_close(fsdp_ckpt *ck); /* NULL does nothing */

int64_t fsdp_ckpt_step(const fsdp_ckpt *ck);
int fsdp_ckpt_world_size(const fsdp_ckpt *ck);     /* ranks that saved it (shard files) */
const char *fsdp_ckpt_layout(const fsdp_ckpt *ck); /* "" when none was given */
const char *fsdp_ckpt_config(const fsdp_ckpt *ck); /* "" when none was given */
const char *fsdp_ckpt_library_version(const fsdp_ckpt *ck);
/* The model configuration JSON saved with fsdp_ckpt_meta.model_config (or taken from an
 * imported Hugging Face directory's config.json); "" when none was given. */
const char *fsdp_ckpt_model_config(const fsdp_ckpt *ck);
int64_t fsdp_ckpt_optim_steps(const fsdp_ckpt *ck); /* the optimizer's step count */
/* The format version it was written in (1: its files are not bound together, nothing to check
 * beyond the checksums). */
int fsdp_ckpt_format_version(const fsdp_ckpt *ck);
/* A named integer of fsdp_ckpt_meta; FSDP_ERR_NOT_FOUND when it was not saved. */
fsdp_status fsdp_ckpt_extra(fsdp_ctx *ctx, const fsdp_ckpt *ck, const char *name, int64_t *out);

typedef struct fsdp_ckpt_tensor {
    const char *name; /* owned by ck */
    fsdp_state_kind kind;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int n_pieces;
} fsdp_ckpt_tensor;

typedef struct fsdp_ckpt_piece {
    int file_rank; /* shard-<5 digits>.h5 holds it */
    int id;        /* dataset "<tensor name>/<id>" in that file */
    fsdp_state_region region;
} fsdp_ckpt_piece;

int fsdp_ckpt_num_tensors(const fsdp_ckpt *ck);
fsdp_status fsdp_ckpt_tensor_get(fsdp_ctx *ctx, const fsdp_ckpt *ck, int t, fsdp_ckpt_tensor *out);
fsdp_status fsdp_ckpt_piece_get(fsdp_ctx *ctx, const fsdp_ckpt *ck, int t, int k,
                                fsdp_ckpt_piece *out);
/* The index of the tensor called name, or -1. */
int fsdp_ckpt_find(const fsdp_ckpt *ck, const char *name);
/* Reads a region of tensor t into host memory (row-major, the tensor's dtype) from the pieces
 * that overlap it, checking each chunk's checksum; the first read of a piece (format 2) reads
 * it whole and checks its values against the digest metadata.h5 records, and opening a shard
 * checks that it belongs to this checkpoint. FSDP_ERR_IO when part of the region is in no
 * piece, or a file is missing, truncated, corrupt or from another save (naming the tensor and
 * the file). On failure dst holds no meaningful values. */
fsdp_status fsdp_ckpt_read(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, const fsdp_state_region *region,
                           void *dst);

/* Opens shard file `rank` (0 .. world size - 1) and checks that it is a regular file, an HDF5
 * file and (format 2) bound to this checkpoint as that rank: FSDP_ERR_IO naming the file, the
 * problem and the fix otherwise. `fsdp-ckpt verify` checks every shard this way, also those
 * that hold no piece. */
fsdp_status fsdp_ckpt_check_shard(fsdp_ctx *ctx, fsdp_ckpt *ck, int rank);

/* The bytes piece k of tensor t takes on disk: its dataset in its shard file after compression
 * and checksums (fsdp_ckpt_piece_get tells the file). FSDP_ERR_IO naming the file when the
 * file or the dataset cannot be opened. */
fsdp_status fsdp_ckpt_piece_stored_bytes(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, int k, int64_t *out);

typedef struct fsdp_ckpt_export_options {
    /* Default (false): parameters and buffers only, what PyTorch's model.state_dict() holds;
     * true adds the optimizer state ("optim/<param>/<kind>"). */
    bool with_optim;
    /* 0 (default): datasets stored raw; 1..19: zstd at that level (filter 32015, which other
     * HDF5 programs read through the plugin libh5zstd.so). */
    int zstd_level;
} fsdp_ckpt_export_options;

/* Writes the checkpoint as one unsharded HDF5 file at path (truncating): one dataset per
 * tensor, named as the tensor ('/' in a name makes groups: "optim/net1.weight/exp_avg"), with
 * its global shape; f32 as IEEE float32, bf16 as uint16 with the string attribute
 * dtype = "bf16". Reads one tensor at a time (memory: the largest tensor). opts may be NULL
 * for the defaults. On failure the partial file is removed. */
fsdp_status fsdp_ckpt_export_h5(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *path,
                                const fsdp_ckpt_export_options *opts);

/* Writes the checkpoint as one safetensors file at path (truncating): a JSON header with one
 * entry per tensor (dtype F32 or BF16, global shape, byte range) and "__metadata__" holding
 * format "pt", the step and the optimizer steps, then the values, one tensor at a time (memory:
 * the largest tensor). safetensors.torch.load_file reads it. opts may be NULL; its zstd_level
 * must be 0 (safetensors has no compression). On failure the partial file is removed. */
fsdp_status fsdp_ckpt_export_safetensors(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *path,
                                         const fsdp_ckpt_export_options *opts);

/* ---- Hugging Face interchange ---- */

#define FSDP_HF_CONFIG_MAX (1 << 20) /* bytes of a config.json text read or stored */

/* The config.json of a Hugging Face LlamaForCausalLM of cfg's shape (cfg resolved first:
 * architectures, model_type "llama", hidden_size, intermediate_size, num_attention_heads,
 * num_key_value_heads, num_hidden_layers, vocab_size, max_position_embeddings, rms_norm_eps,
 * rope_theta, rope_parameters, initializer_range, hidden_act "silu", head_dim, attention_bias
 * and mlp_bias false, tie_word_embeddings as cfg says (tied: no lm_head.weight in the export),
 * torch_dtype "float32"; with Llama 3's rope
 * scaling, rope_parameters and rope_scaling of rope_type "llama3" with factor, low_freq_factor,
 * high_freq_factor and original_max_position_embeddings). *out is malloc'ed; the caller frees it.
 */
fsdp_status fsdp_llama_config_to_hf_json(fsdp_ctx *ctx, const fsdp_llama_config *cfg, char **out);

/* Reads a Hugging Face config.json text (as fsdp_llama_config_to_hf_json writes, or from a
 * model on the Hub) into *out, resolved. Refused, naming the key and the fix: a model_type other
 * than "llama", a missing or out-of-range size, and what fsdp_model_llama does not build
 * (attention or MLP biases, an activation other than silu, a head_dim other
 * than hidden_size / num_attention_heads, a rope_scaling (or rope_parameters) rope_type other
 * than "default" and "llama3"). rope_scaling is read first, then rope_parameters; llama3's
 * original_max_position_embeddings defaults to max_position_embeddings as in transformers.
 * Unknown keys are ignored. */
fsdp_status fsdp_llama_config_from_hf_json(fsdp_ctx *ctx, const char *json, fsdp_llama_config *out);

/* Writes the checkpoint as a Hugging Face model directory dir (created when missing):
 * config.json, made from the checkpoint's model configuration (fsdp_ckpt_model_config, which
 * must describe a Llama), and model.safetensors with the parameters, so that
 * transformers.LlamaForCausalLM.from_pretrained(dir) loads it with no missing or unexpected
 * key. Before writing, the checkpoint's parameters must be exactly the Llama's, by name and
 * shape (the error names the first that differs); optimizer state is not written. A model of
 * vocabulary 256 (the byte tokenizer of tools/text_to_tokens.py) also gets tokenizer.json and
 * tokenizer_config.json: that tokenizer (a ByteLevel BPE without merges, token id = byte value)
 * for AutoTokenizer.from_pretrained(dir). torch_dtype
 * is "float32" (from_pretrained's default; bf16 parameters are stored as BF16 and upcast when
 * loaded). opts may be NULL; with_optim and zstd_level must be unset. */
fsdp_status fsdp_ckpt_export_hf(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *dir,
                                const fsdp_ckpt_export_options *opts);

/* ---- importing a PyTorch state dict ---- */

/* What happens to a tensor that is not f32. */
typedef enum fsdp_ckpt_import_dtype {
    /* Default: F32 kept; F16, BF16 and F64 converted to f32 (F16 and BF16 exactly, F64 rounded
     * to nearest; an F64 value beyond f32's range is an error naming the tensor). */
    FSDP_CKPT_IMPORT_TO_F32 = 0,
    /* F32 and BF16 kept as they are (libfsdp's two dtypes); F16 and F64 are refused. */
    FSDP_CKPT_IMPORT_KEEP,
} fsdp_ckpt_import_dtype;

typedef struct fsdp_ckpt_import_options {
    int64_t step;                 /* the checkpoint's step, 0..99999999; default 0 */
    fsdp_ckpt_import_dtype dtype; /* default FSDP_CKPT_IMPORT_TO_F32 */
    /* As fsdp_ckpt_options: 0 (default) zstd level 3, 1..19 that level,
     * FSDP_CKPT_NO_COMPRESSION stored raw. */
    int zstd_level;
} fsdp_ckpt_import_options;

/* Converts a state dict written by PyTorch into a committed checkpoint
 * "<dir>/step-<8 digits of opts->step>" (dir created when missing; a checkpoint of the same
 * step there is replaced), which fsdp_ckpt_open and fsdp_ckpt_load read at any layout. The
 * source is
 *   - a safetensors file (safetensors.torch.save_file(model.state_dict(), path)), or
 *   - an HDF5 file whose datasets are the tensors, named by their state_dict keys
 *     (h5py: f[k] = v.numpy() for each item), at the root or in nested groups ("a/b/c" is
 *     the tensor "a.b.c");
 * told apart by the HDF5 signature, or
 *   - a Hugging Face model directory (model.save_pretrained(dir, safe_serialization=True)):
 *     config.json and model.safetensors, or the shards model.safetensors.index.json lists
 *     (every tensor in the file its weight_map names, every file's tensors listed). The
 *     config.json text (a JSON object, at most FSDP_HF_CONFIG_MAX bytes) becomes the
 *     checkpoint's model configuration (fsdp_ckpt_model_config). Every tensor becomes one piece of
 * one shard file, of kind FSDP_STATE_PARAM, with its name and shape; the checkpoint has no
 * optimizer state (optimizer steps 0), so load it into a state made without the optimizer, or with
 * non_strict. Nothing in the file is trusted: the safetensors header (length, JSON, each dtype,
 * shape and byte range, which must tile the data up to the end of the file), names (unique,
 * printable, no
 * '/') and dtypes (floating point) are checked before anything is written, and each failure
 * names the file, the tensor and the fix. Integer and bool tensors are refused. Memory: one
 * tensor at a time. Makes no collective; one rank calls it. opts may be NULL (the defaults).
 * On failure nothing is committed. */
fsdp_status fsdp_ckpt_import(fsdp_ctx *ctx, const char *src_path, const char *dir,
                             const fsdp_ckpt_import_options *opts);

typedef struct fsdp_ckpt_load_options {
    /* Default (false, strict): a tensor of the state missing from the checkpoint, or one in
     * the checkpoint the state lacks, is an error naming it. Non-strict: missing tensors keep
     * their values and extra ones are ignored; each is logged. */
    bool non_strict;
} fsdp_ckpt_load_options;

/* Loads the checkpoint into the state under its current layout, whatever layout saved it:
 * for each region this rank holds, the overlapping parts of the saved pieces are read; the
 * optimizer's step count is restored. Shapes and dtypes must match (the error names the tensor
 * and both shapes). Before any value changes, every shard it reads is checked to belong to
 * this checkpoint and (format 2) every piece it reads is read whole and checked against its
 * digest, so a damaged or foreign file fails the load with the state as it was. Makes no
 * collective. opts may be NULL (strict). */
fsdp_status fsdp_ckpt_load(fsdp_ctx *ctx, fsdp_ckpt *ck, const fsdp_state *st,
                           const fsdp_ckpt_load_options *opts);

#ifdef __cplusplus
}
#endif
#endif
