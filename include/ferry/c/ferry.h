/* ferry's C ABI: the whole library through opaque handles and plain C types, for Python (ctypes) and any
 * other language. It wraps the C++ API and adds nothing of its own.
 *
 * Conventions:
 * - Every function that can fail returns an int status (FERRY_OK or one of ferry_status) and, on
 *   failure, sets a thread-local message that ferry_last_error() returns until the thread's next failing
 *   call. No C++ exception or type crosses this boundary.
 * - Handles are created by ferry_*_create (or the sink constructors) and released by the matching
 *   ferry_*_destroy, which accepts NULL. A device outlives nothing by accident: everything made from it
 *   keeps it alive, so handles may be destroyed in any order.
 * - Streams cross as uintptr_t: a cudaStream_t on the cuda backend (0, 1 and 2, the legacy and
 *   per-thread default streams, are accepted where a function says so: ferry bridges them with events
 *   and never queues its own work there), or a handle from ferry_stream_handle on either backend.
 * - Functions that wait (submit with a full pool, flush, close, next, synchronize) block the calling
 *   thread only; ferry's threads call back only into a callback sink's function.
 * - Strings returned through char** are freed with ferry_string_free; const char* results stay valid as
 *   the function says.
 */
#ifndef FERRY_C_FERRY_H
#define FERRY_C_FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_C_API __attribute__((visibility("default")))

/* Bumped when a declaration below changes incompatibly; bindings check it at load time. */
#define FERRY_C_ABI_VERSION 1

enum ferry_status {
  FERRY_OK = 0,
  FERRY_ERROR_INVALID = 1,       /* misuse or bad argument (ferry::logic_error) */
  FERRY_ERROR_CUDA = 2,          /* the CUDA runtime failed (ferry::cuda_error) */
  FERRY_ERROR_OUT_OF_MEMORY = 3, /* device or pinned memory could not be had */
  FERRY_ERROR_STOPPED = 4,       /* the object was closed (ferry::stopped_error) */
  FERRY_ERROR_INPUT = 5,         /* a file's content was refused (ferry::input_error) */
  FERRY_ERROR_SYSTEM = 6,        /* the operating system refused (a file, a directory) */
  FERRY_ERROR_CALLBACK = 7,      /* a callback sink's function returned non-zero */
  FERRY_ERROR_INTERNAL = 8       /* anything else */
};

typedef struct ferry_device ferry_device;
typedef struct ferry_stream ferry_stream;
typedef struct ferry_event ferry_event;
typedef struct ferry_analysis ferry_analysis;
typedef struct ferry_sink ferry_sink;
typedef struct ferry_egress ferry_egress;
typedef struct ferry_prefetch ferry_prefetch;
typedef struct ferry_batch ferry_batch;

/* One delivery to a callback sink: a whole output, or one chunk of an output larger than a slot. `data`
 * is pinned host memory valid only until the callback returns. */
typedef struct ferry_chunk {
  uint64_t sequence;    /* submission number of the output, from 0 */
  uint64_t tag;         /* the tag given to ferry_egress_submit */
  uint64_t offset;      /* byte offset of this chunk within the output */
  uint64_t total_bytes; /* size of the whole output */
  uint32_t chunk;       /* chunk index within the output */
  uint32_t chunks;      /* number of chunks of the output */
  const void* data;
  size_t bytes;
} ferry_chunk;

/* Called on a sink worker thread for every delivery; return 0, or non-zero to fail the pipeline (the
 * caller then gets FERRY_ERROR_CALLBACK at its next submit, flush or close). */
typedef int (*ferry_chunk_fn)(void* user, const ferry_chunk* chunk);

/* ---- library ------------------------------------------------------------------------------------ */
/* ferry's version (git describe at build time); static storage. */
FERRY_C_API const char* ferry_version(void);
/* FERRY_C_ABI_VERSION of the library. */
FERRY_C_API int ferry_abi_version(void);
/* The message of this thread's last failing call ("" if none); valid until this thread's next call. */
FERRY_C_API const char* ferry_last_error(void);
FERRY_C_API void ferry_string_free(char* s);
/* ferry's checksum of `bytes` bytes taken as one whole output (the checksum sink's). */
FERRY_C_API uint64_t ferry_checksum_of(const void* data, size_t bytes);

/* ---- devices, streams, events ------------------------------------------------------------------- */
/* backend: "auto" (cuda when a GPU is visible, else host), "cuda" or "host". */
FERRY_C_API int ferry_device_create(const char* backend, int ordinal, ferry_device** out);
FERRY_C_API void ferry_device_destroy(ferry_device* dev);
/* The device as JSON: backend, name, ordinal, memory_bytes, pci_bus_id, copy_engines, reason. */
FERRY_C_API int ferry_device_info_json(ferry_device* dev, char** out);
FERRY_C_API int ferry_device_synchronize(ferry_device* dev);
/* A new stream owned by ferry (the host backend's streams are only these). */
FERRY_C_API int ferry_stream_create(ferry_device* dev, ferry_stream** out);
FERRY_C_API uintptr_t ferry_stream_handle(ferry_stream* s);
FERRY_C_API void ferry_stream_destroy(ferry_stream* s);
/* Blocks until the work queued on `stream` is done (default streams accepted on cuda). */
FERRY_C_API int ferry_stream_synchronize(ferry_device* dev, uintptr_t stream);
/* `stream` waits on the device for `e` (default streams accepted on cuda); never blocks the host. */
FERRY_C_API int ferry_stream_wait_event(ferry_device* dev, uintptr_t stream, ferry_event* e);
/* *done = 1 when the event completed, else 0. */
FERRY_C_API int ferry_event_query(ferry_event* e, int* done);
FERRY_C_API int ferry_event_synchronize(ferry_event* e);
FERRY_C_API void ferry_event_destroy(ferry_event* e);

/* ---- probe and analyze -------------------------------------------------------------------------- */
/* Measures the device's links (ferry probe); zeros take the backend's defaults. JSON result. */
FERRY_C_API int ferry_probe_run(ferry_device* dev, size_t copy_bytes, int warmup, int iterations,
                                size_t pin_bytes, char** out);
/* Reads a trace (ferry's or a PyTorch profiler export) and analyzes it (ferry analyze). step_prefix
 * may be NULL or "" (the default); zeros for the link figures take the trace's own. */
FERRY_C_API int ferry_analyze_file(const char* path, const char* step_prefix, double idle_threshold,
                                   double link_h2d_gbps, double link_d2h_gbps, ferry_analysis** out);
/* The analysis as JSON (ferry analyze --json) and as text; valid while the analysis lives. */
FERRY_C_API const char* ferry_analysis_json(ferry_analysis* a);
FERRY_C_API const char* ferry_analysis_text(ferry_analysis* a);
/* Writes the standalone HTML report (ferry analyze --html). */
FERRY_C_API int ferry_analysis_write_html(ferry_analysis* a, const char* path);
FERRY_C_API void ferry_analysis_destroy(ferry_analysis* a);

/* ---- egress: sinks ------------------------------------------------------------------------------ */
FERRY_C_API int ferry_sink_null(ferry_sink** out);
FERRY_C_API int ferry_sink_checksum(ferry_sink** out);
/* The checksum of the output submitted with `tag`, once all its chunks were consumed. */
FERRY_C_API int ferry_sink_checksum_get(ferry_sink* s, uint64_t tag, uint64_t* out);
FERRY_C_API int ferry_sink_checksum_completed(ferry_sink* s, uint64_t* out);
/* dir/<prefix><tag>.bin; the directory must exist. */
FERRY_C_API int ferry_sink_raw_file(const char* dir, const char* prefix, ferry_sink** out);
/* dir/<prefix><tag>.npy of the given shape and dtype descriptor (such as "<f4"). */
FERRY_C_API int ferry_sink_npy(const char* dir, const size_t* shape, size_t ndim, const char* dtype,
                               const char* prefix, ferry_sink** out);
FERRY_C_API int ferry_sink_callback(ferry_chunk_fn fn, void* user, ferry_sink** out);
FERRY_C_API void ferry_sink_destroy(ferry_sink* s);

/* ---- egress: the pipeline ----------------------------------------------------------------------- */
/* ordered: 1 delivers in submission order, 0 as completed. */
FERRY_C_API int ferry_egress_create(ferry_device* dev, ferry_sink* sink, size_t slot_bytes, size_t slots,
                                    size_t workers, int ordered, ferry_egress** out);
/* Copies `bytes` bytes of device memory at `data` once `producer_stream` reaches this point (default
 * streams accepted on cuda); returns at once unless the pool is full. *out completes when the copy out of
 * `data` is done: `data` must not be freed or rewritten before. */
FERRY_C_API int ferry_egress_submit(ferry_egress* e, void* data, size_t bytes, uintptr_t producer_stream,
                                    uint64_t tag, ferry_event** out);
FERRY_C_API int ferry_egress_flush(ferry_egress* e);
FERRY_C_API int ferry_egress_close(ferry_egress* e);
/* Abandons what is queued: no output is handed to the sink after this call (a file sink leaves none of
 * them under its final name); deliveries under way finish. Returns at once; any thread, also while
 * another is in submit, flush or close, which then return FERRY_ERROR_STOPPED once the deliveries under
 * way are done (close still stops the threads). */
FERRY_C_API int ferry_egress_abort(ferry_egress* e);
FERRY_C_API int ferry_egress_free_slots(ferry_egress* e, size_t* out);
/* Counters and stage times as JSON. */
FERRY_C_API int ferry_egress_stats_json(ferry_egress* e, char** out);
/* Closes (reporting, not returning, an uncollected error) and releases the handle. */
FERRY_C_API void ferry_egress_destroy(ferry_egress* e);

/* ---- ingest: host batches pushed by the caller, prefetched to the device ------------------------- */
/* batch_bytes: the largest batch; chunk_bytes 0 picks one; workers copy into `slots` pinned slots;
 * `depth` device slots. */
FERRY_C_API int ferry_prefetch_create(ferry_device* dev, size_t batch_bytes, size_t chunk_bytes,
                                      size_t workers, size_t slots, size_t depth, ferry_prefetch** out);
FERRY_C_API int ferry_prefetch_slot_bytes(ferry_prefetch* p, size_t* out);
/* Queues the next batch: `count` host ranges copied to their offsets by the workers. The memory must stay
 * valid until ferry_prefetch_next has returned the batch. *number receives the batch's number. */
FERRY_C_API int ferry_prefetch_push(ferry_prefetch* p, const void* const* data, const size_t* bytes,
                                    const size_t* offsets, size_t count, uint64_t* number);
/* The next batch on the device; `consumer_stream` waits for its copy (default streams accepted on
 * cuda). Blocks while it is being copied. The batch is lent: it returns to ferry, through an event
 * recorded on `consumer_stream`, once ferry_batch_release and the deleter of every DLPack tensor made
 * from it have run. */
FERRY_C_API int ferry_prefetch_next(ferry_prefetch* p, uintptr_t consumer_stream, ferry_batch** out);
/* *out = 1 when batch `number` was released (or never lent), else 0. */
FERRY_C_API int ferry_prefetch_released(ferry_prefetch* p, uint64_t number, int* out);
FERRY_C_API int ferry_prefetch_stats_json(ferry_prefetch* p, char** out);
/* Stops copying; batches still lent stay valid. */
FERRY_C_API int ferry_prefetch_close(ferry_prefetch* p);
FERRY_C_API void ferry_prefetch_destroy(ferry_prefetch* p);
FERRY_C_API void* ferry_batch_data(ferry_batch* b);
FERRY_C_API uint64_t ferry_batch_number(ferry_batch* b);
/* A DLPack DLManagedTensor (unversioned, as void*) viewing `offset` of the batch as a C-contiguous
 * tensor of `ndim` dims and the DLPack dtype (code, bits, lanes); it holds the batch until its deleter
 * runs (from any thread). Device kDLCUDA on the cuda backend, kDLCPU on the host backend. */
FERRY_C_API int ferry_batch_dlpack(ferry_batch* b, size_t offset, int32_t ndim, const int64_t* shape,
                                   uint8_t code, uint8_t bits, uint16_t lanes, void** out);
/* Runs the deleter of a DLManagedTensor nobody consumed. */
FERRY_C_API void ferry_dlpack_delete(void* managed);
/* Drops the caller's hold on the batch (see ferry_prefetch_next). */
FERRY_C_API void ferry_batch_release(ferry_batch* b);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_C_FERRY_H */
