/* train_tensorboard.h: a TensorBoard event file writer for scalars (loss, learning rate, ...):
 * TFRecord framing and hand-encoded Event and Summary protocol buffers, no TensorFlow, no
 * protobuf library. */
#ifndef FSDP_TOOLS_TRAIN_TENSORBOARD_H
#define FSDP_TOOLS_TRAIN_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/status.h" // defines: fsdp_status

#ifdef __cplusplus
extern "C" {
#endif

/* The file: DIR/events.out.tfevents.<seconds since 1970>.<host name> (".1", ".2", ... appended
 * when a writer of the same second already made that name), a sequence of TFRecords:
 *   u64 length (little-endian), u32 masked CRC-32C of those 8 bytes, `length` bytes of data,
 *   u32 masked CRC-32C of the data;
 * masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, as TensorFlow's record writer. Each data is
 * a serialized tensorboard.Event (tensorboard/compat/proto/event.proto):
 *   wall_time = 1 (double, seconds since 1970), step = 2 (int64),
 *   file_version = 3 (string; the first record's: "brain.Event:2"),
 *   summary = 5 (Summary: repeated Value value = 1; Value: tag = 1 (string),
 *   simple_value = 2 (float)).
 * TensorBoard (`tensorboard --logdir DIR`) shows each tag as a scalar plot over the steps. */
#define TB_FILE_VERSION "brain.Event:2"
#define TB_MAX_TAG      256 /* bytes of a tag, its NUL excluded */

typedef struct tb_writer tb_writer;

/* Creates dir (and its missing parents) when needed, opens a new event file in it and writes
 * the file_version record. On success *w is the writer (close it with tb_close); on failure
 * returns FSDP_ERR_IO (the directory or file cannot be made) or FSDP_ERR_INVALID_ARGUMENT (no
 * directory given) with a message naming the path and the problem in err, and *w is NULL. */
fsdp_status tb_open(const char *dir, tb_writer **w, char *err, size_t err_size);

/* Appends one Event of one scalar: tag (1 to TB_MAX_TAG bytes; '/' groups tags in TensorBoard,
 * "train/loss"), step, value (stored as float, as TensorBoard's simple_value; NaN and infinities
 * are written as they are), wall_time now. Buffered: tb_flush or tb_close writes it out. Returns
 * FSDP_ERR_INVALID_ARGUMENT for a bad tag, FSDP_ERR_IO when writing fails (the message:
 * tb_last_error). One writer per thread at a time. */
fsdp_status tb_scalar(tb_writer *w, const char *tag, int64_t step, double value);

/* tb_scalar with a given wall time (seconds since 1970). */
fsdp_status tb_scalar_at(tb_writer *w, const char *tag, int64_t step, double value,
                         double wall_time);

/* Writes the buffered records to the file (fflush); FSDP_ERR_IO when that fails. */
fsdp_status tb_flush(tb_writer *w);

/* Flushes, closes the file and frees w; FSDP_ERR_IO when the last writes fail (the file is
 * closed and w freed all the same). tb_close(NULL) does nothing and returns FSDP_OK. */
fsdp_status tb_close(tb_writer *w);

/* The event file's path, and the message of the last failure ("" when none); both owned by w. */
const char *tb_path(const tb_writer *w);
const char *tb_last_error(const tb_writer *w);

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of n bytes, and its TFRecord mask. */
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_masked_crc(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
