/* The carpool C ABI (libcarpool.so): the C++ client (carpool/client.h) behind opaque handles, for
 * ctypes and other FFIs. Every function that can fail returns a carpool_status (0 = OK, otherwise
 * a carpool::StatusCode value) and leaves a message for carpool_last_error() on that thread.
 *
 * Lifetime: each handle is freed by its own *_free/close function, in any order; a batch may
 * outlive its job (its memory stays mapped until the batch is freed). Pointers returned by
 * carpool_batch_* stay valid until carpool_batch_free. Strings returned in *out_json are freed
 * with carpool_string_free.
 * Threads: a client handle is thread-safe; a job handle must be used by one thread at a time;
 * batches may be freed on any thread. */
#ifndef CARPOOL_CARPOOL_H_
#define CARPOOL_CARPOOL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t carpool_status; /* 0 OK; 8 unavailable; see carpool::StatusCode */
#define CARPOOL_OK 0
#define CARPOOL_UNAVAILABLE 8

typedef struct carpool_client carpool_client;
typedef struct carpool_job carpool_job;
typedef struct carpool_batch carpool_batch;

typedef struct carpool_job_options {
  const char* dataset;   /* required */
  uint32_t batch_size;   /* required, > 0 */
  uint32_t epochs;       /* 0 means 1 */
  const char* transform; /* NULL means none */
  const char* device;    /* NULL means "cpu" */
  uint32_t prefetch;     /* 0 means 4 */
  int32_t drop_last;     /* 0 or 1 */
  uint64_t seed;
  uint32_t silence_timeout_ms; /* 0 means 10000 */
  /* Data-parallel jobs: world_size ranks with one job_key form one job (global batch world_size x
     batch_size, rank r gets slice r of each). world_size 0 or 1: a job of its own. */
  const char* job_key;   /* NULL means none */
  uint32_t rank;
  uint32_t world_size;
  uint32_t node;         /* a job spanning `nodes` nodes: this node's part (0 or 1 node: all) */
  uint32_t nodes;
  /* Start where a checkpoint left off: bytes from carpool_job_position of an earlier job on this
     dataset (NULL/0: a fresh start). */
  const void* resume;
  size_t resume_bytes;
} carpool_job_options;

typedef struct carpool_job_info {
  uint64_t job_id;
  uint64_t dataset_size;
  uint64_t batches_per_epoch;
  uint32_t epochs;
  uint32_t sample_rank;        /* entries used in sample_shape */
  int64_t sample_shape[4];
  int32_t dtype;               /* 1 uint8, 2 float16, 3 float32 */
  int32_t layout;              /* 1 nhwc, 2 nchw, 3 raw */
  int32_t device;              /* CUDA device of the batches, or -1 for host memory */
  uint32_t start_epoch;        /* where the job starts: 0, or a resumed checkpoint's epoch */
  uint64_t start_batch;        /* and the index of its first batch in that epoch */
} carpool_job_info;

/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
const char* carpool_last_error(void);

carpool_status carpool_connect(const char* socket_path, carpool_client** out);
void carpool_client_free(carpool_client* client);
carpool_status carpool_client_stats(carpool_client* client, char** out_json);

carpool_status carpool_job_create(carpool_client* client, const carpool_job_options* options,
                                  carpool_job** out);
void carpool_job_free(carpool_job* job); /* says bye */
carpool_status carpool_job_info_get(const carpool_job* job, carpool_job_info* out);
/* Blocks for the next batch. At the end of all epochs returns CARPOOL_OK with *out == NULL. */
carpool_status carpool_job_next(carpool_job* job, carpool_batch** out);
carpool_status carpool_job_stats(carpool_job* job, char** out_json);
/* The job's position for a checkpoint (carpool::JobPosition::Serialize): the epoch in progress and
 * the samples of it in every batch carpool_job_next returned, or all but the latest with
 * exclude_latest != 0. *out (binary, *out_bytes long) is freed with carpool_string_free. */
carpool_status carpool_job_position(const carpool_job* job, int32_t exclude_latest, char** out,
                                    size_t* out_bytes);
/* A position's fields as JSON: dataset, epochs, epoch, batches, samples, taken (a count). */
carpool_status carpool_position_describe(const void* bytes, size_t n, char** out_json);

/* Releases the batch slot (one credit back to the server) and frees the handle. */
void carpool_batch_free(carpool_batch* batch);
/* Releases the batch slot (one credit back to the server) but keeps the handle: its pointers stay
 * mapped until carpool_batch_free, though the server may already be writing a later batch there.
 * Lets a binding return the credit at the next step while views of the old batch still exist
 * (their reads see other data, but never fault). Idempotent; carpool_batch_free still required. */
void carpool_batch_release(carpool_batch* batch);
const void* carpool_batch_images(const carpool_batch* batch);
size_t carpool_batch_image_bytes(const carpool_batch* batch);
/* Writes up to max_rank dims ({samples, sample dims...}) and returns the rank. */
uint32_t carpool_batch_image_shape(const carpool_batch* batch, int64_t* dims, uint32_t max_rank);
uint32_t carpool_batch_size(const carpool_batch* batch);
const int32_t* carpool_batch_labels(const carpool_batch* batch);
const uint32_t* carpool_batch_sample_ids(const carpool_batch* batch);
uint32_t carpool_batch_epoch(const carpool_batch* batch);
uint64_t carpool_batch_index(const carpool_batch* batch);
uint32_t carpool_batch_skipped(const carpool_batch* batch);
/* GPU jobs: the CUDA device of carpool_batch_images (device memory, writable by this job), and
 * the labels as int64 in device memory; -1 and NULL for a CPU job. Release a GPU batch only after
 * the GPU work reading it has finished: the server overwrites the slot after the release. */
int32_t carpool_batch_device(const carpool_batch* batch);
int64_t* carpool_batch_device_labels(const carpool_batch* batch);

void carpool_string_free(char* s);

#ifdef __cplusplus
}
#endif

#endif /* CARPOOL_CARPOOL_H_ */
