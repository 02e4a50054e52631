/* gpu_peaks.c: NVIDIA's data-sheet figures, dense (the sparse figures halved), for the cards
 * libfsdp is measured on. SXM parts of one generation share their peaks whatever their memory
 * (H100 SXM with HBM3, H200 and GH200 with HBM3e); PCIe and NVL parts run other clocks, so
 * they have other figures (H100 PCIe's are kept; NVL's are not, and get zeros). */
#include "kernels/gpu_peaks.h"

#include <stddef.h>
#include <string.h>

typedef struct gpu_peak {
    const char *has, *also; /* the name contains `has` and, unless NULL, `also` */
    double f32, tf32, bf16;
} gpu_peak;

/* The first row that matches wins: the exceptions before the family. */
static const gpu_peak table[] = {
    {"H100", "PCIe", 51.2, 378.0, 756.0},
    {"NVL", NULL, 0.0, 0.0, 0.0}, /* H100 NVL, H200 NVL: no figure kept */
    {"H100", NULL, 66.9, 494.7, 989.0},
    {"H200", NULL, 66.9, 494.7, 989.0}, /* also GH200 */
    {"A100", NULL, 19.5, 156.0, 312.0}, /* SXM and PCIe alike */
};

void fsdp_gpu_peaks(const char *name, double *f32, double *tf32, double *bf16) {
    *f32 = *tf32 = *bf16 = 0.0;
    if (!name) return;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const gpu_peak *p = &table[i];
        if (strstr(name, p->has) && (!p->also || strstr(name, p->also))) {
            *f32 = p->f32;
            *tf32 = p->tf32;
            *bf16 = p->bf16;
            return;
        }
    }
}
