/* names.c: the names of the comm enums (collective, reduction, phase), for messages, the
 * comm-debug table and callers. Below every other file of src/comm: it calls nothing. */
#include "fsdp/comm.h"

const char *fsdp_comm_op_to_string(fsdp_comm_op op) {
    static const char *const names[FSDP_COMM_OP_COUNT] = {
        "any", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier"};
    return (int)op >= 0 && op < FSDP_COMM_OP_COUNT ? names[op] : "unknown";
}

const char *fsdp_reduce_op_to_string(fsdp_reduce_op op) {
    static const char *const names[FSDP_REDUCE_OP_COUNT] = {"sum", "avg", "max"};
    return (int)op >= 0 && op < FSDP_REDUCE_OP_COUNT ? names[op] : "unknown";
}

const char *fsdp_comm_phase_to_string(fsdp_comm_phase phase) {
    switch (phase) {
    case FSDP_COMM_PHASE_ANY:
        return "any";
    case FSDP_COMM_PHASE_NONE:
        return "none";
    case FSDP_COMM_PHASE_FORWARD:
        return "forward";
    case FSDP_COMM_PHASE_BACKWARD:
        return "backward";
    default:
        return "unknown";
    }
}
