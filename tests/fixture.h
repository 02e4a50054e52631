/* fixture.h: reads the PyTorch reference fixtures written by tools/gen_fixtures.py
 * (format: tests/fixtures/README.md) and moves their tensors in and out of fsdp_tensors. */
#ifndef FSDP_TEST_FIXTURE_H
#define FSDP_TEST_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

#define FIXTURE_MAX_DIMS 4

typedef enum fixture_dtype { FIXTURE_F32 = 0, FIXTURE_I32 = 1, FIXTURE_F64 = 2 } fixture_dtype;

typedef struct fixture_tensor {
    char *name; /* NUL-terminated */
    int dtype;  /* fixture_dtype */
    int ndim;   /* 0 (a scalar) .. FIXTURE_MAX_DIMS */
    int64_t shape[FIXTURE_MAX_DIMS];
    int64_t numel;
    void *data; /* numel floats, int32s or doubles */
} fixture_tensor;

typedef struct fixture {
    int n;
    fixture_tensor *tensors; /* in file order */
} fixture;

/* Reads the fixture file at path into *out, which the caller releases with fixture_free.
 * Returns 0 on success; otherwise prints on stderr what is wrong with which file, leaves
 * *out empty and returns nonzero. */
int fixture_load(const char *path, fixture *out);
/* The message of the most recent failure of a function of this file ("" when fixture_load
 * last succeeded). Also printed on stderr when it happens. */
const char *fixture_last_error(void);
/* Loads FSDP_FIXTURE_DIR "/<name>.bin". */
int fixture_load_named(const char *name, fixture *out);
void fixture_free(fixture *f); /* frees what f holds and empties it; NULL does nothing */

/* The tensor called name, or NULL. */
const fixture_tensor *fixture_get(const fixture *f, const char *name);
/* Like fixture_get, and also checks the dtype; prints why on stderr and returns NULL when
 * the tensor is missing or has another dtype. */
const fixture_tensor *fixture_require(const fixture *f, const char *name, fixture_dtype dtype);

/* Formats t's shape as "(2, 3, 7)" into buf; returns buf. */
const char *fixture_shape_string(const fixture_tensor *t, char *buf, size_t size);
/* Whether an fsdp_tensor has exactly t's shape. */
bool fixture_shape_equal(const fixture_tensor *t, const fsdp_tensor *x);

/* A new f32 CPU fsdp_tensor (owned by the caller) holding a copy of the f32 tensor t;
 * NULL on failure (with a message on stderr). */
fsdp_tensor *fixture_to_tensor(fsdp_ctx *ctx, const fixture_tensor *t);
/* Copies the f32 tensor t into dst after checking that the shapes match exactly. Returns
 * 0, or nonzero with a message on stderr naming both shapes. */
int fixture_copy_into(fsdp_ctx *ctx, const fixture_tensor *t, fsdp_tensor *dst);

/* Parameters: the tensors <p> for which the fixture also holds "grad.<p>", in file order
 * (which the generator makes PyTorch's named_parameters() order). */
int fixture_num_params(const fixture *f);
/* The i-th parameter tensor (0 <= i < fixture_num_params), or NULL. */
const fixture_tensor *fixture_param(const fixture *f, int i);

#endif
