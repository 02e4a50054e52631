/* train_keys.c: one configuration key's value: what it must be, its parser and its canonical
 * text, and the lists of the configuration split at their commas. */
#include "train_keys.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends printf-style text to buf (size bytes), keeping it NUL-terminated. */
void train_append(char *buf, size_t size, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
}

/* Value i of an enum key, NULL past the last. */
static const char *enum_name(const train_key *k, int i) {
    return k->names[i];
}

static void describe_int_range(const train_key *k, char *buf, size_t size) {
    if (k->imax == TRAIN_KEY_BIG)
        train_append(buf, size, ">= %lld", (long long)k->imin);
    else
        train_append(buf, size, "in [%lld, %lld]", (long long)k->imin, (long long)k->imax);
}

static void describe_float_range(const train_key *k, char *buf, size_t size) {
    train_append(buf, size, "%s %g", k->fmin_open ? ">" : ">=", k->fmin);
    if (isfinite(k->fmax))
        train_append(buf, size, " and %s %g", k->fmax_open ? "<" : "<=", k->fmax);
}

/* What a value of key k must be: "a float > 0", "one of relu, gelu, sigmoid", ... */
void train_key_describe_expected(const train_key *k, char *buf, size_t size) {
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
        for (int i = 0; enum_name(k, i); i++)
            train_append(buf, size, "%s%s", i ? ", " : "", enum_name(k, i));
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

const char *train_key_type_name(const train_key *k) {
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
static int parse_float(const train_key *k, const char *text, double *out) {
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

/* Splits text at its commas into items (white space around each removed); a blank text has
 * none, and a comma at the end leaves an empty last item. Returns their number, or -1 when
 * there are more than max (items holds max). Every list of the configuration is split here. */
int train_split_list(const char *text, int max, train_list_item *items) {
    const char *p = text;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return 0;
    for (int n = 0;; n++) {
        size_t len = strcspn(p, ","), b = 0, e = len;
        if (n == max) return -1;
        while (b < e && (p[b] == ' ' || p[b] == '\t')) b++;
        while (e > b && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
        items[n] = (train_list_item){p + b, e - b};
        p += len;
        if (!*p) return n + 1;
        p++; /* the comma */
    }
}

/* Copies an item into buf (size bytes) as a string; false when it does not fit (cut). */
bool train_item_text(const train_list_item *item, char *buf, size_t size) {
    snprintf(buf, size, "%.*s", (int)item->len, item->text);
    return item->len < size;
}

/* The comma-separated patterns of a string key's value into patterns (at most max): their
 * number (0 for a blank value), or -1 when one is empty or there are more than max. */
int train_split_patterns(const char *value, int max, char (*patterns)[TRAIN_MAX_STRING]) {
    train_list_item items[TRAIN_MAX_LIST];
    int n = train_split_list(value, max < TRAIN_MAX_LIST ? max : TRAIN_MAX_LIST, items);
    for (int i = 0; i < n; i++)
        if (!items[i].len || !train_item_text(&items[i], patterns[i], TRAIN_MAX_STRING)) return -1;
    return n;
}

/* Parses text as a value of key k into cfg; on failure writes what is wrong after "bad value
 * 'text' for [section] key: " into why. */
bool train_key_parse(const train_key *k, const char *text, void *cfg, char *why, size_t why_size) {
    char expected[256];
    train_key_describe_expected(k, expected, sizeof expected);
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
        train_list_item items[TRAIN_MAX_FLOAT_LIST];
        list.n = train_split_list(text, k->max_count, items);
        if (list.n < 0) {
            snprintf(why, why_size, "more than %d entries; expected %s", k->max_count, expected);
            return false;
        }
        for (int i = 0; i < list.n; i++) {
            char item[64];
            int bad = train_item_text(&items[i], item, sizeof item)
                          ? parse_float(k, item, &list.v[i])
                          : 1;
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
        for (int i = 0; enum_name(k, i); i++) {
            int v = i;
            if (strcmp(text, enum_name(k, i)) == 0 && (!k->parse_enum || k->parse_enum(text, &v))) {
                memcpy(field, &v, sizeof v);
                return true;
            }
        }
        break;
    case KEY_INT_LIST: {
        train_int_list list = {0};
        train_list_item items[TRAIN_MAX_LIST];
        list.n = train_split_list(text, k->max_count, items);
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
            int bad =
                train_item_text(&items[i], item, sizeof item) ? parse_int(item, &list.v[i]) : 2;
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
void train_key_format(const void *cfg, const train_key *k, char *buf, size_t size) {
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
        for (int i = 0; enum_name(k, i); i++)
            if ((k->parse_enum ? k->parse_enum(enum_name(k, i), &v) : (v = i, true)) && v == want)
                train_append(buf, size, "%s", enum_name(k, i));
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
