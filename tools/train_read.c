/* train_read.c: fsdp-train's configuration read from its sources: defaults, the INI file,
 * --set and the command line, each value parsed by its key (train_keys.h) and remembered with
 * where it came from. */
#define _POSIX_C_SOURCE 200809L // open flags, fstat

#include "train_config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h> // defines: open, O_NONBLOCK
#include <ini.h>   // defines: ini_parse_stream, ini_reader, ini_handler
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: fstat, S_ISREG
#include <unistd.h>   // defines: read, close

#include "train_kind.h" // defines: train_kinds_register

/* ---- naming keys ---------------------------------------------------------------------------- */

static void list_keys(const char *section, char *buf, size_t size) {
    int n = 0;
    for (int i = 0; i < train_key_count(); i++)
        if (strcmp(train_key_at(i)->section, section) == 0)
            train_append(buf, size, "%s%s", n++ ? ", " : "", train_key_at(i)->name);
}

static void list_sections(char *buf, size_t size) {
    for (int i = 0; i < train_section_count(); i++)
        train_append(buf, size, "%s[%s]", i ? ", " : "", train_section_name(i));
}

/* Sets key `idx` from text; on failure writes "<where>: bad value ..." into err. */
static bool set_key(train_config *cfg, int idx, const char *text, const char *where, char *err,
                    size_t err_size) {
    const train_key *k = train_key_at(idx);
    char why[512];
    if (!train_key_parse(k, text, cfg, why, sizeof why)) {
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
    if (train_section_find(section) < 0) {
        list_sections(allowed, sizeof allowed);
        if (!*section)
            snprintf(err, err_size, "%s: key '%s' is outside any section; allowed sections: %s",
                     where, name, allowed);
        else
            snprintf(err, err_size, "%s: unknown section [%s]; allowed sections: %s", where,
                     section, allowed);
        return -1;
    }
    int idx = train_key_find(section, name);
    if (idx < 0) {
        list_keys(section, allowed, sizeof allowed);
        snprintf(err, err_size, "%s: unknown key '%s' in section [%s]; allowed keys: %s", where,
                 name, section, allowed);
    }
    return idx;
}

void train_config_init(train_config *cfg) {
    train_kinds_register(); /* the kinds' keys join the list */
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < train_key_count(); i++) {
        char err[TRAIN_ERROR_SIZE];
        if (!set_key(cfg, i, train_key_at(i)->def, "default", err, sizeof err)) {
            fprintf(stderr, "fsdp-train: broken default in the key table: %s\n", err);
            abort();
        }
    }
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
    if (len >= (int)sizeof name || train_section_find(name) < 0) {
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
    if (st->indented && st->last_key >= 0 &&
        strcmp(train_key_at(st->last_key)->section, section) == 0 &&
        strcmp(train_key_at(st->last_key)->name, name) == 0) {
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

fsdp_status train_config_set_from(train_config *cfg, const char *section, const char *name,
                                  const char *text, const char *where, char *err, size_t err_size) {
    int idx = train_key_find(section, name);
    if (idx < 0) {
        snprintf(err, err_size, "%s: no key [%s] %s", where, section, name);
        return FSDP_ERR_CONFIG;
    }
    return set_key(cfg, idx, text, where, err, err_size) ? FSDP_OK : FSDP_ERR_CONFIG;
}

fsdp_status train_config_adopt_init(train_config *cfg, bool *changed, char *err, size_t err_size) {
    const train_kind *kind = train_kind_of(cfg);
    *changed = false;
    return kind->adopt_init ? kind->adopt_init(cfg, changed, err, err_size) : FSDP_OK;
}

/* ---- the command line ----------------------------------------------------------------------- */

/* The option's value: "--opt=VALUE" or the next argument, which may not be an option ("--..."
 * or "-h": a forgotten value, as in --config --plan; --help and -h anywhere print the help
 * before this runs). file: the value names a file (the message says how to name one that
 * starts with '-'), else it is section.key=value. NULL (and err) when missing or an option. */
static const char *option_value(int argc, char **argv, int *i, const char *opt, bool file,
                                char *err, size_t err_size) {
    size_t n = strlen(opt);
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (*i + 1 >= argc) {
        snprintf(err, err_size, "%s needs a value; see fsdp-train --help", opt);
        return NULL;
    }
    const char *v = argv[*i + 1];
    if (strncmp(v, "--", 2) && strcmp(v, "-h")) return argv[++*i];
    if (file)
        snprintf(err, err_size,
                 "%s needs a FILE, got the option '%s'; to name a file that starts with '-', "
                 "write ./%s",
                 opt, v, v);
    else
        snprintf(err, err_size, "%s needs section.key=value, got the option '%s'", opt, v);
    return NULL;
}

static bool is_option(const char *arg, const char *opt) {
    size_t n = strlen(opt);
    return strncmp(arg, opt, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* A command line that is wrong in itself: fsdp-train adds the usage to the error. */
static fsdp_status bad_usage(train_cli_action *action) {
    *action = TRAIN_CLI_BAD_USAGE;
    return FSDP_ERR_CONFIG;
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
    bool plan = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plan") == 0) {
            plan = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (is_option(argv[i], "--config")) {
            const char *v = option_value(argc, argv, &i, "--config", true, err, err_size);
            if (!v) return bad_usage(action);
            if (config) {
                snprintf(err, err_size, "--config given twice ('%s' and '%s')", config, v);
                return bad_usage(action);
            }
            config = v;
        } else if (is_option(argv[i], "--set")) {
            if (!option_value(argc, argv, &i, "--set", false, err, err_size))
                return bad_usage(action);
        } else {
            snprintf(err, err_size, "unknown argument '%s'; see fsdp-train --help", argv[i]);
            return bad_usage(action);
        }
    }
    if (!config) {
        snprintf(err, err_size, "missing --config FILE; see fsdp-train --help");
        return bad_usage(action);
    }
    if (json && !plan) {
        snprintf(err, err_size, "--json goes with --plan (the plan as JSON); add --plan");
        return bad_usage(action);
    }
    if (plan) *action = json ? TRAIN_CLI_PLAN_JSON : TRAIN_CLI_PLAN;
    train_config_init(cfg);
    fsdp_status st = train_config_load(cfg, config, err, err_size);
    if (st != FSDP_OK) return st;
    for (int i = 1; i < argc; i++) {
        if (is_option(argv[i], "--config")) {
            option_value(argc, argv, &i, "--config", true, err, err_size);
        } else if (is_option(argv[i], "--set")) {
            const char *v = option_value(argc, argv, &i, "--set", false, err, err_size);
            st = train_config_set(cfg, v, err, err_size);
            if (st != FSDP_OK) return st;
        }
    }
    bool adopted;
    st = train_config_adopt_init(cfg, &adopted, err, err_size);
    return st == FSDP_OK ? train_config_check(cfg, err, err_size) : st;
}
