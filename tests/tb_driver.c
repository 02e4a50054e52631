/* tb_driver.c: writes a TensorBoard event file with tools/train_tensorboard.c for
 * tools/check_tensorboard.py to read with TensorBoard itself: `tb_driver DIR` writes the tags
 * "train/loss" (steps 1..50, 4 / step), "lr" (steps 0..49, 0.001 * (step + 1)) and "eval/loss"
 * (steps 10, 20, ..., 50, 3 / step + 0.25) and prints the file's path. */
#include <stdio.h>

#include "train_tensorboard.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tb_driver DIR\n");
        return 2;
    }
    char err[512];
    tb_writer *w = NULL;
    if (tb_open(argv[1], &w, err, sizeof err) != FSDP_OK) {
        fprintf(stderr, "tb_driver: %s\n", err);
        return 1;
    }
    fsdp_status st = FSDP_OK;
    for (int step = 1; step <= 50 && st == FSDP_OK; step++) {
        st = tb_scalar(w, "train/loss", step, 4.0 / step);
        if (st == FSDP_OK) st = tb_scalar(w, "lr", step - 1, 0.001 * step);
        if (st == FSDP_OK && step % 10 == 0)
            st = tb_scalar(w, "eval/loss", step, 3.0 / step + 0.25);
    }
    if (st != FSDP_OK) fprintf(stderr, "tb_driver: %s\n", tb_last_error(w));
    printf("%s\n", tb_path(w));
    if (tb_close(w) != FSDP_OK || st != FSDP_OK) return 1;
    return 0;
}
