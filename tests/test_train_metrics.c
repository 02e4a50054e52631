/* test_train_metrics: fsdp-train's metrics records (tools/train_metrics.c, written by jansson):
 * the exact text of a record (", " and ": " between keys, in their order, the rates and
 * seconds at the decimals they had), every float32 read back exactly from its 9 digits, the
 * collectives' maps, and non-finite values written as null, so that every line is JSON. */
#define _POSIX_C_SOURCE 200809L // open_memstream
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "train_metrics.h" // defines: train_metrics_write, train_report, train_comm

/* The record of (step, r, per_sample) as text (malloc'ed). */
static char *record(int64_t step, const train_report *r, int64_t per_sample) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(train_metrics_write(f, step, r, per_sample), 0);
    CU_ASSERT_EQUAL(fclose(f), 0);
    return text;
}

/* The record parsed back by jansson; fails the case when it is not one JSON object per line. */
static json_t *parsed(const char *text) {
    size_t n = strlen(text);
    CU_ASSERT_FATAL(n > 0 && text[n - 1] == '\n' && strchr(text, '\n') == text + n - 1);
    json_error_t err;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!j) printf("\n    not JSON: %s (%s)", text, err.text);
    CU_ASSERT_FATAL(json_is_object(j));
    return j;
}

/* The text readers match (test_train's sscanf patterns, test_tensorboard's "\"key\": "): the
 * same bytes the former printf wrote for these values. */
static void test_text(void) {
    train_report r = {.progress = true,
                      .loss = 0.5,
                      .samples_per_s = 1234.56,
                      .elapsed = 1.2345678,
                      .lr = 0.1,
                      .grad_norm = NAN,
                      .eval_accuracy = NAN};
    char *t = record(10, &r, 0);
    CU_ASSERT_STRING_EQUAL(
        t, "{\"step\": 10, \"loss\": 0.5, \"samples_per_s\": 1234.6, \"time_s\": 1.234568, "
           "\"lr\": 0.1}\n");
    free(t);
    r = (train_report){.eval = true, .eval_loss = 2.25, .eval_accuracy = 0.75, .grad_norm = NAN};
    t = record(15, &r, 0);
    CU_ASSERT_STRING_EQUAL(t, "{\"step\": 15, \"eval_loss\": 2.25, \"eval_accuracy\": 0.75}\n");
    free(t);
    r = (train_report){.progress = true,
                       .eval = true,
                       .loss = 3,
                       .samples_per_s = 10,
                       .elapsed = 2,
                       .lr = 1e-4,
                       .grad_norm = 0.125,
                       .eval_loss = 0,
                       .eval_accuracy = NAN};
    t = record(20, &r, 64);
    /* A whole number is written as a real ("3.0", not "3"), so readers keep its type. */
    CU_ASSERT_STRING_EQUAL(t, "{\"step\": 20, \"loss\": 3.0, \"samples_per_s\": 10.0, \"time_s\": "
                              "2.0, \"tokens_per_s\": 640.0, \"lr\": 0.0001, \"grad_norm\": 0.125, "
                              "\"eval_loss\": 0.0, \"eval_perplexity\": 1.0}\n");
    free(t);
}

/* 9 significant digits read back every float32 exactly (FLT_DECIMAL_DIG is 9): 20000 finite
 * floats of every exponent, drawn from their bit patterns. */
static void test_float32_round_trip(void) {
    uint64_t x = 88172645463325252ull;
    int exact = 0, n = 0;
    while (n < 20000) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        uint32_t bits = (uint32_t)x;
        float v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v)) continue;
        n++;
        train_report r = {.progress = true, .loss = v, .lr = v, .grad_norm = NAN};
        char *t = record(1, &r, 0);
        json_t *j = parsed(t);
        float loss = (float)json_real_value(json_object_get(j, "loss"));
        float lr = (float)json_number_value(json_object_get(j, "lr"));
        exact += memcmp(&loss, &v, sizeof v) == 0 && memcmp(&lr, &v, sizeof v) == 0;
        if (loss != v) printf("\n    %.9g written as %s", (double)v, t);
        json_decref(j);
        free(t);
    }
    CU_ASSERT_EQUAL(exact, n);
}

/* The collectives: compute and communication seconds, then calls and bytes per op in order. */
static void test_comm(void) {
    train_comm c = {.step_seconds = 1.5};
    c.seconds[FSDP_COMM_ALL_GATHER] = 0.25;
    c.seconds[FSDP_COMM_REDUCE_SCATTER] = 0.25;
    c.count[FSDP_COMM_ALL_GATHER] = (fsdp_comm_count){.calls = 4, .bytes = 1024};
    c.count[FSDP_COMM_ALL_TO_ALL] = (fsdp_comm_count){.calls = 1, .bytes = 3};
    train_report r = {.progress = true, .loss = 1, .lr = 1, .grad_norm = NAN, .comm = &c};
    char *t = record(2, &r, 0);
    const char *want = "\"compute_s\": 1.0, \"comm_s\": 0.5, \"comm_calls\": {\"all_gather\": 4, "
                       "\"reduce_scatter\": 0, \"all_reduce\": 0, \"broadcast\": 0, "
                       "\"all_to_all\": 1}, \"comm_bytes\": {\"all_gather\": 1024, "
                       "\"reduce_scatter\": 0, \"all_reduce\": 0, \"broadcast\": 0, "
                       "\"all_to_all\": 3}}\n";
    CU_ASSERT_PTR_NOT_NULL(strstr(t, want));
    json_decref(parsed(t));
    free(t);
}

/* JSON has no NaN or infinity: a diverged loss is null, and the line stays JSON. */
static void test_non_finite(void) {
    train_report r = {.progress = true,
                      .eval = true,
                      .loss = NAN,
                      .samples_per_s = INFINITY,
                      .lr = 0.5,
                      .grad_norm = INFINITY,
                      .eval_loss = INFINITY,
                      .eval_accuracy = NAN};
    char *t = record(7, &r, 8);
    json_t *j = parsed(t);
    const char *nulls[] = {"loss",      "samples_per_s", "tokens_per_s",
                           "grad_norm", "eval_loss",     "eval_perplexity"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
        json_t *v = json_object_get(j, nulls[i]);
        if (!json_is_null(v)) printf("\n    %s is not null in %s", nulls[i], t);
        CU_ASSERT_TRUE(json_is_null(v));
    }
    CU_ASSERT_EQUAL(json_real_value(json_object_get(j, "lr")), 0.5);
    CU_ASSERT_PTR_NULL(json_object_get(j, "eval_accuracy")); /* NaN accuracy: regression */
    json_decref(j);
    free(t);
}

/* A failed write is reported (the trainer then names the file). */
static void test_write_fails(void) {
    FILE *f = fopen("/dev/full", "w");
    if (!f) {
        fsdp_test_skip("/dev/full cannot be opened here");
        return;
    }
    setvbuf(f, NULL, _IONBF, 0); /* unbuffered: the write itself fails */
    train_report r = {.progress = true, .loss = 1, .lr = 1, .grad_norm = NAN};
    CU_ASSERT_EQUAL(train_metrics_write(f, 1, &r, 0), -1);
    CU_ASSERT_TRUE(ferror(f));
    fclose(f);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"text", test_text},
        {"float32_round_trip", test_float32_round_trip},
        {"comm", test_comm},
        {"non_finite", test_non_finite},
        {"write_fails", test_write_fails},
    };
    return fsdp_test_run(argc, argv, "train_metrics", cases, (int)(sizeof cases / sizeof cases[0]));
}
