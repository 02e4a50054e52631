/* stream.c: the sim device's streams and events. A stream is a worker thread running a FIFO of
 * closures (copied at launch, as a launch copies its arguments); an event is a marker queued on
 * a stream, complete when the worker passes it. In DEFERRED mode a worker runs only up to the
 * work somebody waits for, so a missing wait reads stale data every time. One lock guards every
 * queue; it is hidden from ThreadSanitizer, which sees only the real edges (sim_impl.h). */
#define _GNU_SOURCE /* usleep, rand_r */
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/sim/sim_impl.h"

typedef enum op_kind { OP_RUN, OP_MARK, OP_WAIT } op_kind;

typedef struct op {
    struct op *next;
    uint64_t seq; // 1, 2, ... per stream
    op_kind kind;
    void (*run)(void *arg); // OP_RUN
    sim_event *event;       // OP_MARK: the event it completes; OP_WAIT: the one it awaits
    uint64_t gen;           // the event's record it completes or awaits
    sim_stream *on;         // OP_WAIT: the stream of the awaited record
    uint64_t on_seq;        //          and its marker there
    char launch;            // TSan: the launch -> work edge
    alignas(max_align_t) unsigned char arg[];
} op;

struct sim_stream {
    int device;
    pthread_t thread;
    pthread_cond_t wake;
    op *head, *tail;
    uint64_t queued, done, demand;
    bool stopping;
    unsigned jitter;
    uint64_t serial;         // never reused, unlike the address after a free
    sim_stream *prev, *next; // the live streams
};

struct sim_event {
    int device;
    int refs;          // the owner's, plus one per queued marker or wait
    sim_stream *on;    // where the latest record was queued (NULL: never recorded)
    uint64_t on_seq;   // its marker there
    uint64_t recorded; // records so far
    /* The records queued and not yet passed. An event recorded again on another stream can
     * complete its later record before its earlier one, and a wait queued between them awaits
     * the earlier one (as CUDA's does): completion is per record, not the highest passed. */
    uint64_t few[4];   // where they are held while they fit (no allocation per record)
    uint64_t *pending; // few, or a larger heap array (NULL before the first record)
    int n_pending, cap_pending;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; // any op finished, or demand rose
static sim_stream *live;
static _Atomic bool shut; // after sim_streams_release: work runs at once on the caller
static _Atomic uint64_t serials;

/* ---- the mode ---- */

static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
static _Atomic int mode = FSDP_SIM_DEFERRED;
static unsigned jitter_seed = 1;

static void read_mode(void) {
    const char *m = getenv("FSDP_SIM_MODE");
    if (m && *m) {
        if (!strcmp(m, "eager"))
            mode = FSDP_SIM_EAGER;
        else if (!strcmp(m, "deferred"))
            mode = FSDP_SIM_DEFERRED;
        else if (!strcmp(m, "jitter"))
            mode = FSDP_SIM_JITTER;
        else
            fprintf(stderr,
                    "libfsdp: FSDP_SIM_MODE=%s is not one of eager, deferred, jitter; using "
                    "deferred\n",
                    m);
    }
    const char *seed = getenv("FSDP_SIM_SEED");
    if (seed && *seed) jitter_seed = (unsigned)strtoul(seed, NULL, 10);
}

fsdp_sim_mode fsdp_sim_mode_get(void) {
    pthread_once(&mode_once, read_mode);
    return (fsdp_sim_mode)mode;
}

void fsdp_sim_mode_set(fsdp_sim_mode m) {
    pthread_once(&mode_once, read_mode);
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    mode = m;
    for (sim_stream *s = live; s; s = s->next) pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
}

/* ---- the worker (called with mu held) ---- */

static bool runnable(const sim_stream *s) {
    if (!s->head) return false;
    return mode != FSDP_SIM_DEFERRED || s->stopping || s->head->seq <= s->demand;
}

/* Asks stream s to run up to seq (DEFERRED: it runs nothing more on its own). */
static void demand(sim_stream *s, uint64_t seq) {
    if (s->demand < seq) {
        s->demand = seq;
        pthread_cond_signal(&s->wake);
    }
}

static void event_unref(sim_event *e) {
    if (--e->refs > 0) return;
    if (e->pending != e->few) free(e->pending);
    free(e);
}

/* Whether record `gen` of e has been passed (0, never recorded: at once). Under mu. */
static bool passed(const sim_event *e, uint64_t gen) {
    for (int i = 0; i < e->n_pending; i++)
        if (e->pending[i] == gen) return false;
    return true;
}

/* Record `gen` of e was passed. Under mu. */
static void pass(sim_event *e, uint64_t gen) {
    for (int i = 0; i < e->n_pending; i++)
        if (e->pending[i] == gen) {
            e->pending[i] = e->pending[--e->n_pending];
            break;
        }
}

static void jitter(sim_stream *s) {
    if (mode != FSDP_SIM_JITTER) return;
    unsigned r = (unsigned)rand_r(&s->jitter);
    if (r & 1) usleep(r % 200);
}

static void *worker(void *arg) {
    sim_stream *s = arg;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!runnable(s) && !(s->stopping && !s->head)) pthread_cond_wait(&s->wake, &mu);
        if (!s->head) break; // stopping, and all ran
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        if (o->kind == OP_WAIT)
            while (!passed(o->event, o->gen)) {
                demand(o->on, o->on_seq);
                pthread_cond_wait(&progress, &mu);
            }
        pthread_mutex_unlock(&mu);
        SIM_HIDE_END();

        SIM_OBSERVE(&o->launch);
        if (o->kind == OP_RUN) {
            jitter(s);
            o->run(o->arg);
        } else if (o->kind == OP_WAIT) {
            SIM_OBSERVE(o->event);
        } else {
            SIM_PUBLISH(o->event);
        }

        SIM_HIDE_BEGIN();
        pthread_mutex_lock(&mu);
        if (o->kind == OP_MARK) pass(o->event, o->gen);
        if (o->kind != OP_RUN) event_unref(o->event);
        s->done = o->seq;
        free(o);
        pthread_cond_broadcast(&progress);
    }
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    return NULL;
}

/* ---- streams ---- */

sim_stream *sim_stream_new(int device) {
    pthread_once(&mode_once, read_mode);
    sim_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->device = device;
    s->serial = ++serials;
    pthread_cond_init(&s->wake, NULL);
    s->jitter = jitter_seed * 2654435761u + (unsigned)(uintptr_t)s;
    bool ok = pthread_create(&s->thread, NULL, worker, s) == 0;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    if (ok) {
        s->next = live;
        if (live) live->prev = s;
        live = s;
    }
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    if (!ok) {
        pthread_cond_destroy(&s->wake);
        free(s);
        return NULL;
    }
    return s;
}

void sim_stream_free(sim_stream *s) {
    if (!s) return;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    s->stopping = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    pthread_join(s->thread, NULL); // a real edge: the host sees all the stream did
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        live = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    pthread_cond_destroy(&s->wake);
    free(s);
}

int sim_stream_device(const sim_stream *s) {
    return s->device;
}

uint64_t sim_stream_serial(const sim_stream *s) {
    return s->serial;
}

/* Queues o on s, or runs it at once after the streams were released at exit. */
static void enqueue(sim_stream *s, op *o) {
    SIM_PUBLISH(&o->launch);
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    o->seq = ++s->queued;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    if (mode != FSDP_SIM_DEFERRED) pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
}

static op *op_new(op_kind kind, size_t size) {
    op *o = calloc(1, sizeof *o + size);
    FSDP_ASSERT(o); // a launch has no status to return, as a kernel launch has none
    o->kind = kind;
    return o;
}

void sim_launch(sim_stream *s, void (*run)(void *arg), const void *arg, size_t size) {
    if (s) sim_count_launch(s->device);
    sim_launch_unseen(s, run, arg, size);
}

void sim_launch_unseen(sim_stream *s, void (*run)(void *arg), const void *arg, size_t size) {
    if (!s) { // after exit released the streams
        unsigned char *copy = malloc(size ? size : 1);
        FSDP_ASSERT(copy);
        memcpy(copy, arg, size);
        run(copy);
        free(copy);
        return;
    }
    op *o = op_new(OP_RUN, size);
    o->run = run;
    memcpy(o->arg, arg, size);
    enqueue(s, o);
}

/* ---- events ---- */

sim_event *sim_event_new(int device) {
    sim_event *e = calloc(1, sizeof *e);
    if (e) {
        e->device = device;
        e->refs = 1;
    }
    return e;
}

void sim_event_free(sim_event *e) {
    if (!e) return;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    event_unref(e);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
}

void sim_event_record(sim_event *e, sim_stream *s) {
    if (!s) return;
    op *o = op_new(OP_MARK, 0);
    o->event = e;
    SIM_PUBLISH(&o->launch);
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    e->refs++;
    if (!e->pending) {
        e->pending = e->few;
        e->cap_pending = (int)(sizeof e->few / sizeof e->few[0]);
    }
    if (e->n_pending == e->cap_pending) { // records far ahead of the stream (deferred mode)
        int cap = 2 * e->cap_pending;
        uint64_t *grown = malloc((size_t)cap * sizeof *grown);
        FSDP_ASSERT(grown); // a record has no status to return, as cudaEventRecord's launch
        memcpy(grown, e->pending, (size_t)e->n_pending * sizeof *grown);
        if (e->pending != e->few) free(e->pending);
        e->pending = grown;
        e->cap_pending = cap;
    }
    o->gen = ++e->recorded;
    e->pending[e->n_pending++] = o->gen;
    o->seq = ++s->queued;
    e->on = s;
    e->on_seq = o->seq;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    if (mode != FSDP_SIM_DEFERRED) pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
}

void sim_stream_wait_event(sim_stream *s, sim_event *e) {
    if (!s) return;
    op *o = op_new(OP_WAIT, 0);
    o->event = e;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    e->refs++;
    o->gen = e->recorded; // the latest record; 0 (never recorded) is met at once
    o->on = e->on;
    o->on_seq = e->on_seq;
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    enqueue(s, o);
}

void sim_event_sync(sim_event *e) {
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    sim_count_host_wait(e->device);
    uint64_t gen = e->recorded;
    while (!passed(e, gen)) {
        demand(e->on, e->on_seq);
        pthread_cond_wait(&progress, &mu);
    }
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    SIM_OBSERVE(e);
}

/* A query asks for the work as a wait does (DEFERRED would otherwise never finish it), but
 * does not wait. */
bool sim_event_done(sim_event *e) {
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    bool done = passed(e, e->recorded);
    if (!done) demand(e->on, e->on_seq);
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    if (done) SIM_OBSERVE(e);
    return done;
}

void sim_stream_sync(sim_stream *s) {
    if (!s) return;
    sim_event e = {.device = s->device, .refs = 1};
    sim_event_record(&e, s);
    sim_event_sync(&e);
    // The marker dropped its reference before the wait returned; e never reaches 0 refs here.
}

/* ---- the threads' current and default streams ---- */

typedef struct thread_streams {
    sim_stream *fallback[SIM_MAX_DEVICES]; // the default streams, made on first use
    sim_stream *current[SIM_MAX_DEVICES];  // NULL: the default
} thread_streams;

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static _Thread_local thread_streams *mine;

/* At thread exit: its default streams finish their work and go. */
static void thread_exit(void *arg) {
    thread_streams *t = arg;
    SIM_HIDE_BEGIN();
    pthread_mutex_lock(&mu);
    bool released = shut; // the exit freed every stream already
    pthread_mutex_unlock(&mu);
    SIM_HIDE_END();
    for (int d = 0; d < SIM_MAX_DEVICES && !released; d++) sim_stream_free(t->fallback[d]);
    free(t);
}

static void make_key(void) {
    FSDP_ASSERT(pthread_key_create(&key, thread_exit) == 0);
}

static thread_streams *this_thread(void) {
    if (mine) return mine;
    pthread_once(&key_once, make_key);
    thread_streams *t = calloc(1, sizeof *t);
    FSDP_ASSERT(t);
    FSDP_ASSERT(pthread_setspecific(key, t) == 0);
    mine = t;
    return t;
}

sim_stream *sim_stream_of(int device, void *handle) {
    FSDP_ASSERT(device >= 0 && device < SIM_MAX_DEVICES);
    if (handle) return handle;
    if (shut) return NULL;
    thread_streams *t = this_thread();
    if (t->current[device]) return t->current[device];
    if (!t->fallback[device]) {
        t->fallback[device] = sim_stream_new(device);
        FSDP_ASSERT(t->fallback[device]); // cannot start a thread: nothing can run
    }
    return t->fallback[device];
}

void *sim_stream_current_handle(int device) {
    return this_thread()->current[device];
}

void sim_stream_set_current_handle(int device, void *handle) {
    this_thread()->current[device] = handle;
}

void sim_streams_release(void) {
    for (;;) {
        SIM_HIDE_BEGIN();
        pthread_mutex_lock(&mu);
        sim_stream *s = live;
        shut = true;
        pthread_mutex_unlock(&mu);
        SIM_HIDE_END();
        if (!s) break;
        sim_stream_free(s);
    }
    if (mine) { // the exiting thread's own; other threads' are theirs to free
        free(mine);
        mine = NULL;
        pthread_setspecific(key, NULL);
    }
}
