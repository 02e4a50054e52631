/* launch.c: how the sim operator table launches a CPU kernel: the arrays' device is checked
 * (a host pointer or another device's memory ends the process with a message, as a GPU
 * faults), their shadow addresses go into the closure, and the closure runs on the calling
 * thread's current stream of that device. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/sim/sim_impl.h"

static void die(const char *what, const void *p, int device) {
    int on = sim_device_of(p);
    if (on < 0)
        fprintf(stderr,
                "libfsdp: a kernel of sim:%d was given %p, which is not memory of any simulated "
                "device (%s): a GPU kernel would fault on it\n",
                device, p, what);
    else
        fprintf(stderr,
                "libfsdp: a kernel of sim:%d was given %p, which is memory of sim:%d (%s): "
                "arrays of one kernel live on one device\n",
                device, p, on, what);
    abort();
}

int sim_kernel_device(const void *p, const char *kernel) {
    int device = sim_device_of(p);
    if (device < 0) {
        fprintf(stderr,
                "libfsdp: the sim kernel %s was given %p, which is not memory of any simulated "
                "device (a host pointer?): a GPU kernel would fault on it\n",
                kernel, p);
        abort();
    }
    return device;
}

void *sim_kernel_ptr(int device, const void *p) {
    if (!p) return NULL;
    if (sim_device_of(p) != device) die("an array of the same kernel", p, device);
    return sim_shadow(p);
}

void sim_kernel_launch(int device, void (*run)(void *arg), const void *arg, size_t size) {
    sim_launch(sim_stream_of(device, sim_stream_current_handle(device)), run, arg, size);
}

void sim_kernel_call(int device, void (*run)(void *arg), const void *arg, size_t size) {
    sim_stream *s = sim_stream_of(device, sim_stream_current_handle(device));
    sim_launch(s, run, arg, size);
    sim_stream_sync(s);
}
