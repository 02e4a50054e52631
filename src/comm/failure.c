/* failure.c: the text of the failures both backends report when a wait ends badly (members
 * that did not arrive by the deadline, a data step without progress, a member whose function
 * returned, a group that failed earlier), and of the note a long wait logs, so local and mpi
 * say the same thing the same way. */
#include <stdio.h>

#include "comm/comm_impl.h"
#include "core/error.h"

/* One item of a rank list: a rank, or a run of at least 4 consecutive ones as "first-last". */
static int rank_item(char *buf, size_t size, int first, int last) {
    if (last - first >= 3) return snprintf(buf, size, "%d-%d", first, last);
    int len = 0;
    for (int r = first; r <= last; r++)
        len += snprintf(buf + len, size - (size_t)len, "%s%d", r > first ? "," : "", r);
    return len;
}

int fsdp_comm_rank_list(const int *ranks, const bool *mask, int n, bool want, char *buf,
                        size_t size) {
    size_t used = 0;
    int count = 0;
    bool cut = false;
    buf[0] = '\0';
    for (int m = 0; m < n; m++) {
        if (mask[m] != want) continue;
        int first = ranks ? ranks[m] : m, last = first;
        count++;
        while (m + 1 < n && mask[m + 1] == want && (ranks ? ranks[m + 1] : m + 1) == last + 1)
            m++, last++, count++;
        if (cut) continue;
        char item[48];
        size_t len = (size_t)rank_item(item, sizeof item, first, last) + (used ? 1 : 0);
        /* whole items only, and room for ",..." after the last one that fits */
        if (used + len + 4 >= size) {
            cut = true;
            if (used + 4 < size) snprintf(buf + used, size - used, "%s...", used ? "," : "");
            continue;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? "," : "", item);
    }
    return count;
}

fsdp_status fsdp_comm_fail_poisoned(fsdp_ctx *ctx, const fsdp_group *g, int op,
                                    fsdp_status poison_status, const char *poison_msg) {
    char msg[FSDP_ERROR_MAX];
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_POISONED,
                           .op = op,
                           .group_desc = g->desc,
                           .poison_status = poison_status,
                           .poison_msg = poison_msg};
    fsdp_status st = fsdp_comm_failure_format(&f, msg, sizeof msg);
    return FSDP_FAIL(ctx, st, "%s", msg);
}

fsdp_status fsdp_comm_failure_format(const fsdp_comm_failure *f, char *msg, size_t size) {
    const char *op = fsdp_call_op_name(f->op);
    char missing[256] = "", arrived[256] = "";
    int n = 0;
    if (f->missing) {
        n = fsdp_comm_rank_list(f->ranks, f->missing, f->n_members, true, missing, sizeof missing);
        fsdp_comm_rank_list(f->ranks, f->missing, f->n_members, false, arrived, sizeof arrived);
    }
    const char *s = n > 1 ? "s" : "";
    switch (f->kind) {
    case FSDP_FAILURE_ARRIVAL:
        if (f->forensics && f->forensics[0]) {
            snprintf(msg, size,
                     "%s on group %s timed out after %d ms: rank%s %s did not arrive (arrived: "
                     "%s).%s If the wait is expected, raise fsdp_world_options.timeout_ms",
                     op, f->group_desc, f->timeout_ms, s, missing, arrived, f->forensics);
            return FSDP_ERR_TIMEOUT;
        }
        snprintf(msg, size,
                 "%s on group %s timed out after %d ms: rank%s %s did not arrive (arrived: %s). "
                 "Every rank of a group must make the same collectives in the same order; a "
                 "rank that skipped this one, failed before it or is busy elsewhere never "
                 "arrives. If the wait is expected, raise fsdp_world_options.timeout_ms",
                 op, f->group_desc, f->timeout_ms, s, missing, arrived);
        return FSDP_ERR_TIMEOUT;
    case FSDP_FAILURE_DATA:
        if (n > 0 && f->unsent)
            snprintf(msg, size,
                     "%s on group %s timed out after %d ms without progress while moving data "
                     "(every rank had arrived, and this rank had its data): rank%s %s did not "
                     "take this rank's data. If a transfer may stall that long, raise "
                     "fsdp_world_options.timeout_ms",
                     op, f->group_desc, f->timeout_ms, s, missing);
        else if (n > 0)
            snprintf(msg, size,
                     "%s on group %s timed out after %d ms without progress while moving data "
                     "(every rank had arrived): nothing more came from rank%s %s. If a transfer "
                     "may stall that long, raise fsdp_world_options.timeout_ms",
                     op, f->group_desc, f->timeout_ms, s, missing);
        else
            snprintf(msg, size,
                     "%s on group %s timed out after %d ms without progress while moving data "
                     "(every rank had arrived): the peers did not take this rank's data. If a "
                     "transfer may stall that long, raise fsdp_world_options.timeout_ms",
                     op, f->group_desc, f->timeout_ms);
        return FSDP_ERR_TIMEOUT;
    case FSDP_FAILURE_GONE: {
        const fsdp_rank_result *res = f->gone;
        const bool failed = res->status != FSDP_OK;
        /* Where it stopped on this group, from its flight recorder's counts. */
        char where[160] = "without making this call";
        for (int k = 0; k < res->calls.n && f->group_seq > 0; k++) {
            if (res->calls.id[k] != f->group_id || res->calls.calls[k] >= f->group_seq) continue;
            snprintf(where, sizeof where,
                     "after its call #%llu on this group, without making this rank's call #%llu",
                     (unsigned long long)res->calls.calls[k], (unsigned long long)f->group_seq);
        }
        snprintf(msg, size,
                 "%s on group %s: rank %d will never arrive: its function returned %s%s%.1200s%s "
                 "%s",
                 op, f->group_desc, f->gone_rank, fsdp_status_to_string(res->status),
                 failed ? " (\"" : "", failed ? res->message : "", failed ? "\")" : "", where);
        return FSDP_ERR_COMM;
    }
    case FSDP_FAILURE_POISONED:
    default:
        snprintf(msg, size,
                 "%s on group %s refused: the group failed earlier and cannot be used (create a "
                 "new world); the failure: %.1600s",
                 op, f->group_desc, f->poison_msg);
        return f->poison_status;
    }
}

void fsdp_comm_wait_log(fsdp_ctx *ctx, int op, const char *group_desc, int n_members,
                        const int *ranks, const bool *missing, fsdp_wait_log_kind kind,
                        double waited_s, int timeout_ms, const char *forensics) {
    char late[256] = "", arrived[256] = "";
    int n = fsdp_comm_rank_list(ranks, missing, n_members, true, late, sizeof late);
    fsdp_comm_rank_list(ranks, missing, n_members, false, arrived, sizeof arrived);
    const char *s = n > 1 ? "s" : "";
    if (kind == FSDP_WAIT_LOG_DATA)
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "%s on group %s: waiting for data from rank%s %s for %.1f s (every rank "
                 "arrived); it fails after %d ms without progress",
                 fsdp_call_op_name(op), group_desc, s, late, waited_s, timeout_ms);
    else if (kind == FSDP_WAIT_LOG_UNSENT)
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "%s on group %s: waiting for rank%s %s to take this rank's data for %.1f s "
                 "(every rank arrived, and this rank has its data); it fails after %d ms "
                 "without progress",
                 fsdp_call_op_name(op), group_desc, s, late, waited_s, timeout_ms);
    else
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "%s on group %s: waiting for rank%s %s (arrived: %s) for %.1f s; it fails "
                 "after %d ms.%s",
                 fsdp_call_op_name(op), group_desc, s, late, arrived, waited_s, timeout_ms,
                 forensics ? forensics : "");
}
