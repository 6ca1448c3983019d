/* TensorBoard event files written without TensorFlow or protobuf: each record is framed as TFRecord
 * (u64 LE length, masked CRC32C of the length, data, masked CRC32C of the data) and carries a hand-encoded
 * Event protobuf. Only what scalar plots need is encoded: wall_time, step, file_version, summary values
 * with a tag and a simple_value. */
#ifndef FSDP_COMMON_TFEVENTS_H
#define FSDP_COMMON_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

struct tfevents_writer;

/* Worst-case framing overhead of one record: 8 length + 4 + 4 CRCs. */
#define TFEVENTS_FRAME_OVERHEAD 16

/* Encodes an Event with `n` scalar values (all at one step) into buf; returns the byte count, or a
 * negative fsdp_error if cap is too small. */
int tfevents_encode_scalars(uint8_t *buf, size_t cap, double wall_time, int64_t step, size_t n,
                            const char *const *tags, const float *values);
/* Encodes an Event carrying SessionLog{status: START} at `step`: TensorBoard's readers then drop every
 * record of an earlier file whose step is >= step (the steps a crashed run logged after its last checkpoint,
 * which the resumed run logs again). */
int tfevents_encode_session_start(uint8_t *buf, size_t cap, double wall_time, int64_t step);
/* Encodes the first Event of every file: wall_time and file_version "brain.Event:2". */
int tfevents_encode_version(uint8_t *buf, size_t cap, double wall_time);
/* Frames `len` bytes of data as one record into out (cap >= len + TFEVENTS_FRAME_OVERHEAD); returns the
 * record length or a negative fsdp_error. */
int tfevents_frame_record(uint8_t *out, size_t cap, const uint8_t *data, size_t len);

/* Creates dir/events.out.tfevents.<unix time>.<hostname> (with .<pid>.<n> appended if that name
 * is taken)
 * and writes the file_version record. Each later record goes out in one write(2), so a crash loses
 * nothing already written. */
int tfevents_open(const char *dir, struct tfevents_writer **out);
/* The path of the file (owned by the writer). */
const char *tfevents_path(const struct tfevents_writer *w);
int tfevents_write_scalars(struct tfevents_writer *w, double wall_time, int64_t step, size_t n,
                           const char *const *tags, const float *values);
static inline int tfevents_write_scalar(struct tfevents_writer *w, double wall_time, int64_t step,
                                        const char *tag, float value)
{
    return tfevents_write_scalars(w, wall_time, step, 1, &tag, &value);
}
/* Writes the SessionLog START record (tfevents_encode_session_start). */
int tfevents_write_session_start(struct tfevents_writer *w, double wall_time, int64_t step);
void tfevents_close(struct tfevents_writer *w);

#endif
