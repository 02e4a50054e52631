/* train_keys.h: how fsdp-train describes a configuration key (section, name, type, default,
 * bounds, help), parses a value of it and writes it back, below the configuration itself: the
 * common keys (train_config.c) and each model kind's own [model] keys (train_kind.h) are
 * train_key entries, and parsing, formatting, validation and --help all read them. */
#ifndef FSDP_TOOLS_TRAIN_KEYS_H
#define FSDP_TOOLS_TRAIN_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_MAX_LIST   16  /* entries of an int-list key */
#define TRAIN_MAX_STRING 512 /* bytes of a string key, with its terminating NUL */

typedef struct train_int_list {
    int n;
    int64_t v[TRAIN_MAX_LIST];
} train_int_list;

#define TRAIN_MAX_FLOAT_LIST 4 /* entries of a float-list key */

typedef struct train_float_list {
    int n;
    double v[TRAIN_MAX_FLOAT_LIST];
} train_float_list;

/* Appends printf-style text to the NUL-terminated buf of `size` bytes, truncating. */
void train_append(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef enum train_key_type {
    KEY_INT,
    KEY_FLOAT,
    KEY_BOOL,
    KEY_STRING,
    KEY_ENUM,
    KEY_INT_LIST,
    KEY_FLOAT_LIST
} train_key_type;

typedef struct train_key {
    const char *section;
    const char *name;
    train_key_type type;
    size_t offset;   /* of the value in the configuration (train_config) */
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
    const char *(*help_at)(int i);           /* enum (optional): each value's help, for --help */
    const char *help;
} train_key;

#define TRAIN_KEY_OFF(field) offsetof(train_config, field)
#define TRAIN_KEY_BIG        INT64_MAX
#define TRAIN_WIDTH_MAX      (INT64_C(1) << 20)
#define INCL                 false /* a float range includes its bound */
#define EXCL                 true  /* a float range excludes its bound */

/* One constructor per type; the int ranges are inclusive. */
#define INT_KEY(sec, key, field, dflt, lo, hi, text)                                               \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_INT, .offset = TRAIN_KEY_OFF(field), .def = dflt, \
        .imin = lo, .imax = hi, .help = text                                                       \
    }
#define FLOAT_KEY(sec, key, field, dflt, lo, lo_open, hi, hi_open, text)                           \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_FLOAT, .offset = TRAIN_KEY_OFF(field),            \
        .def = dflt, .fmin = lo, .fmin_open = lo_open, .fmax = hi, .fmax_open = hi_open,           \
        .help = text                                                                               \
    }
#define BOOL_KEY(sec, key, field, dflt, text)                                                      \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_BOOL, .offset = TRAIN_KEY_OFF(field),             \
        .def = dflt, .help = text                                                                  \
    }
#define STRING_KEY(sec, key, field, dflt, text)                                                    \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_STRING, .offset = TRAIN_KEY_OFF(field),           \
        .def = dflt, .help = text                                                                  \
    }
#define ENUM_KEY(sec, key, field, dflt, allowed, parse, text)                                      \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_ENUM, .offset = TRAIN_KEY_OFF(field),             \
        .def = dflt, .names = allowed, .parse_enum = parse, .help = text                           \
    }
#define LIST_KEY(sec, key, field, dflt, n_min, n_max, lo, hi, text)                                \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_INT_LIST, .offset = TRAIN_KEY_OFF(field),         \
        .def = dflt, .min_count = n_min, .max_count = n_max, .imin = lo, .imax = hi, .help = text  \
    }
#define FLOATS_KEY(sec, key, field, dflt, count, lo, lo_open, hi, hi_open, text)                   \
    {                                                                                              \
        .section = sec, .name = key, .type = KEY_FLOAT_LIST, .offset = TRAIN_KEY_OFF(field),       \
        .def = dflt, .min_count = count, .max_count = count, .fmin = lo, .fmin_open = lo_open,     \
        .fmax = hi, .fmax_open = hi_open, .help = text                                             \
    }

/* What a value of the key must be: "a float > 0", "one of relu, gelu, sigmoid", ... */
void train_key_describe_expected(const train_key *k, char *buf, size_t size);
const char *train_key_type_name(const train_key *k);

/* Parses text as a value of key k into the configuration at cfg (a train_config); on failure
 * writes what is wrong after "bad value 'text' for [section] key: " into why. */
bool train_key_parse(const train_key *k, const char *text, void *cfg, char *why, size_t why_size);
/* Writes key k's value in the configuration at cfg as it would appear in a file: the canonical
 * text, equal for equal values only. */
void train_key_format(const void *cfg, const train_key *k, char *buf, size_t size);

/* One item of a comma-separated list: len bytes at text, the white space around it removed. */
typedef struct train_list_item {
    const char *text;
    size_t len;
} train_list_item;

/* Splits text at its commas into items (white space around each removed); a blank text has
 * none, and a comma at the end leaves an empty last item. Returns their number, or -1 when
 * there are more than max (items holds max). Every list of the configuration is split here. */
int train_split_list(const char *text, int max, train_list_item *items);
/* Copies an item into buf (size bytes) as a string; false when it does not fit (cut). */
bool train_item_text(const train_list_item *item, char *buf, size_t size);
/* The comma-separated patterns of a string value into patterns (at most max): their number (0
 * for a blank value), or -1 when one is empty or there are more than max. */
int train_split_patterns(const char *value, int max, char (*patterns)[TRAIN_MAX_STRING]);

#ifdef __cplusplus
}
#endif
#endif
