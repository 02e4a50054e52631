/* train_data.h: fsdp-train's samples: an HDF5 file's datasets read and checked once per
 * process, the held-out split, and the order in which the training samples are visited. */
#ifndef FSDP_TOOLS_TRAIN_DATA_H
#define FSDP_TOOLS_TRAIN_DATA_H

#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most bytes of x and y together that [data] kind = h5 reads: every rank thread holds a
 * copy, so the dataset must fit in memory several times over. */
#define TRAIN_MAX_DATA_BYTES (INT64_C(1) << 30) /* 1 GiB */

/* A dataset in host memory. */
typedef struct train_data {
    int64_t n;       /* samples */
    int64_t in, out; /* widths: model.widths' first and last */
    float *x;        /* (n, in) */
    float *y;        /* (n, out): regression targets; NULL for classification */
    int32_t *labels; /* (n): class ids in [0, out); NULL for regression */
} train_data;

/* Reads [data] path's datasets x and y as [data] task and [model] widths say, checking every
 * size before it is used: x float (N, widths[0]); y float (N, out) (or (N,) when out is 1) for
 * regression, integer (N,) (or (N, 1)) with every id in [0, out) for classification; no NaN
 * or infinity in x or y; at most TRAIN_MAX_DATA_BYTES bytes; both parts of the held-out split
 * non-empty. On failure returns FSDP_ERR_IO (the file cannot be read) or FSDP_ERR_CONFIG (the
 * data does not fit the configuration) and writes a message naming the file, the dataset and
 * the fix into err. The caller owns d (train_data_free). */
fsdp_status train_data_load(const train_config *cfg, train_data *d, char *err, size_t err_size);
void train_data_free(train_data *d); /* frees the arrays and zeroes d */

/* The held-out samples of n: floor(n * [data] eval_fraction), the last ones. */
int64_t train_data_eval_count(const train_config *cfg, int64_t n);

/* The order in which the first n_train samples are visited: position k of the sample stream
 * (k = (step - 1) * batch_size + row) is sample k % n_train of epoch k / n_train, in order or,
 * with [data] shuffle, through a permutation drawn from [data] seed and the epoch. The same on
 * every rank; each rank keeps its own (it caches one epoch's permutation). */
typedef struct train_order {
    int64_t n;     /* training samples */
    bool shuffle;  /* [data] shuffle */
    uint64_t seed; /* [data] seed */
    int64_t epoch; /* the epoch perm holds, -1 when none */
    int64_t *perm; /* (n) with shuffle, else NULL */
} train_order;

/* FSDP_ERR_OUT_OF_MEMORY when the permutation cannot be allocated. */
fsdp_status train_order_init(train_order *o, const train_config *cfg, int64_t n_train);
int64_t train_order_sample(train_order *o, int64_t k);
void train_order_free(train_order *o);

#ifdef __cplusplus
}
#endif
#endif
