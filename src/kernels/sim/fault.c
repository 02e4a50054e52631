/* fault.c: the sim device's live allocations and the fault handler that reads them. A host
 * instruction that touches device memory faults at once (the device half of the window is never
 * readable); the handler names the device, the allocation (size, offset) and the call stack that
 * made it, then aborts. Faults elsewhere go to the handler that was there before. */
#define _GNU_SOURCE /* sigaction, SA_ONSTACK, backtrace */
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/sim/sim_impl.h"

typedef struct site_node {
    sim_alloc_site site;
    struct site_node *next;
} site_node;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static site_node *sites; // the live allocations, newest first
static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
static struct sigaction previous;

static void say(const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, text, n);
        if (w <= 0) return;
        text += w;
        n -= (size_t)w;
    }
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    const void *addr = info->si_addr;
    int device = sim_device_of(addr);
    if (device < 0) { // not ours: what was installed before decides
        if (previous.sa_flags & SA_SIGINFO) {
            previous.sa_sigaction(sig, info, context);
        } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL) {
            previous.sa_handler(sig);
        } else {
            signal(sig, SIG_DFL); // the faulting instruction runs again and ends the process
        }
        return;
    }
    char line[512];
    snprintf(line, sizeof line,
             "libfsdp: the host touched memory of the simulated device sim:%d at %p: device "
             "memory is not host memory (copy it to a cpu tensor first, e.g. fsdp_tensor_copy)\n",
             device, addr);
    say(line);
    // The allocator's lock may be held by this very thread: look only if it is free.
    if (pthread_mutex_trylock(&mu) == 0) {
        const site_node *hit = NULL;
        for (const site_node *n = sites; n && !hit; n = n->next)
            if ((const char *)addr >= (const char *)n->site.ptr &&
                (const char *)addr < (const char *)n->site.ptr + n->site.size)
                hit = n;
        if (hit) {
            snprintf(line, sizeof line,
                     "libfsdp: it lies %zu bytes into an allocation of %zu bytes at %p on "
                     "sim:%d, made by:\n",
                     (size_t)((const char *)addr - (const char *)hit->site.ptr), hit->site.asked,
                     hit->site.ptr, hit->site.device);
            say(line);
            backtrace_symbols_fd((void *const *)hit->site.frames, hit->site.nframes, STDERR_FILENO);
        } else {
            say("libfsdp: no live allocation holds it (freed already, or never handed out)\n");
        }
        pthread_mutex_unlock(&mu);
    }
    signal(SIGABRT, SIG_DFL);
    abort();
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous);
}

void sim_fault_track(const void *ptr, size_t size, size_t asked, int device) {
    pthread_once(&handler_once, install);
    site_node *n = calloc(1, sizeof *n);
    FSDP_ASSERT(n); // a few bytes of bookkeeping
    n->site = (sim_alloc_site){.ptr = ptr, .size = size, .asked = asked, .device = device};
    n->site.nframes = backtrace(n->site.frames, SIM_FRAMES);
    pthread_mutex_lock(&mu);
    n->next = sites;
    sites = n;
    pthread_mutex_unlock(&mu);
}

void sim_fault_print_site(const sim_alloc_site *site) {
    backtrace_symbols_fd((void *const *)site->frames, site->nframes, STDERR_FILENO);
}

void sim_fault_untrack(const void *ptr, sim_alloc_site *site) {
    pthread_mutex_lock(&mu);
    site_node *gone = NULL;
    for (site_node **at = &sites; *at; at = &(*at)->next)
        if ((*at)->site.ptr == ptr) {
            gone = *at;
            *at = gone->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    FSDP_ASSERT(gone); // every block handed out is tracked
    *site = gone->site;
    free(gone);
}

int sim_fault_report_live(void) {
    pthread_mutex_lock(&mu);
    int count = 0;
    size_t bytes = 0;
    const site_node *first = NULL;
    for (const site_node *n = sites; n; n = n->next) {
        count++;
        bytes += n->site.size;
        first = n; // the oldest
    }
    if (count) {
        fprintf(stderr,
                "libfsdp: sim: %d device allocation(s) of %zu bytes in all were never freed; "
                "the oldest, %zu bytes on sim:%d, was made by:\n",
                count, bytes, first->site.size, first->site.device);
        fflush(stderr);
        backtrace_symbols_fd((void *const *)first->site.frames, first->site.nframes, STDERR_FILENO);
    }
    pthread_mutex_unlock(&mu);
    return count;
}

void sim_fault_release(void) {
    pthread_mutex_lock(&mu);
    while (sites) {
        site_node *n = sites;
        sites = n->next;
        free(n);
    }
    pthread_mutex_unlock(&mu);
}
