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
#define FERRY_C_ABI_VERSION 3

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
typedef struct ferry_comm ferry_comm;
typedef struct ferry_reducer ferry_reducer;

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
/* A prefetcher over `slots` batch slots of the caller's memory (slot s at memory + s * slot_bytes; memory
 * page-aligned, slot_bytes a multiple of 256), written in place (by other processes that map the same
 * shared memory, say) and copied to `depth` device slots with no host copy. The memory is registered as
 * pinned here (cudaHostRegister, verified; the host backend locks it) and unregistered by
 * ferry_prefetch_close: keep it mapped until then. Batch k lives in slot k % slots; write it only once
 * ferry_prefetch_slot_wait said so, then mark it with ferry_prefetch_slot_ready. */
FERRY_C_API int ferry_prefetch_create_slots(ferry_device* dev, void* memory, size_t slot_bytes, size_t slots,
                                            size_t depth, ferry_prefetch** out);
/* Copies the array at `src` of `ndim` sizes `shape`, element (i0, i1, ...) at byte offset
 * sum(ik * strides[k]) and `item_bytes` long, into `dst` densely in C order: how a process writes a sample
 * into its place in a slot. Strides may be zero or negative; at most 32 dimensions. A channels-first view
 * of channels-last bytes (an image's permute(2, 0, 1)) is deinterleaved with vector shuffles. */
FERRY_C_API int ferry_copy_strided(void* dst, const void* src, size_t ndim, const int64_t* shape,
                                   const int64_t* strides, size_t item_bytes);
/* Waits up to timeout_ms until batch `batch`'s slot may be written: *writable = 1, else 0. */
FERRY_C_API int ferry_prefetch_slot_wait(ferry_prefetch* p, uint64_t batch, int64_t timeout_ms,
                                         int* writable);
/* Batch `batch` is written: ferry copies it to the device in batch order. */
FERRY_C_API int ferry_prefetch_slot_ready(ferry_prefetch* p, uint64_t batch);
/* *offset = where batch `batch`'s slot starts in the memory given to ferry_prefetch_create_slots, in bytes
 * (the feed owns the rule; a writer asks it rather than restating it). */
FERRY_C_API int ferry_prefetch_slot_offset(ferry_prefetch* p, uint64_t batch, size_t* offset);
/* An eventfd readable whenever a slot became writable (read 8 bytes to reset it); -1 if none. */
FERRY_C_API int ferry_prefetch_slot_event_fd(ferry_prefetch* p, int* fd);
/* Queues the next batch: `count` host ranges copied to their offsets by the workers. The memory must stay
 * valid until ferry_prefetch_next has returned the batch. *number receives the batch's number. */
FERRY_C_API int ferry_prefetch_push(ferry_prefetch* p, const void* const* data, const size_t* bytes,
                                    const size_t* offsets, size_t count, uint64_t* number);
/* The next batch on the device; `consumer_stream` waits for its copy (default streams accepted on
 * cuda). Blocks while it is being copied. The batch is lent: it returns to ferry, through an event
 * recorded on `consumer_stream`, once ferry_batch_release and the deleter of every DLPack tensor made
 * from it have run. */
FERRY_C_API int ferry_prefetch_next(ferry_prefetch* p, uintptr_t consumer_stream, ferry_batch** out);
/* *out = 1 when batch `number` was released (or never lent), else 0. In a fork child it reads the child's
 * copy of an inherited prefetcher without waiting (FERRY_ERROR_INVALID if the parent held its lock at the
 * fork). */
FERRY_C_API int ferry_prefetch_released(ferry_prefetch* p, uint64_t number, int* out);
FERRY_C_API int ferry_prefetch_stats_json(ferry_prefetch* p, char** out);
/* Stops copying; batches still lent stay valid. Only the process that made a prefetcher uses it: in a
 * fork child, every other ferry_prefetch_* call on an inherited one (close, next, push, the slot calls,
 * stats) fails with FERRY_ERROR_INVALID, and destroy leaves the child's copy as it is (its threads run in the
 * parent only, and their locks may have been held at the fork), as freeing an inherited batch does. */
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

/* ---- comm: gradient reduction between the processes of a job (one device each) ------------------- */
/* A key-value store the job's processes share (torch.distributed's Store is one), through which their
 * ferry groups find one another (only the setup on GPUs, the NCCL unique id and readiness; every
 * collective's bytes on the host backend). Called from ferry's threads, one call at a time per group:
 * set stores `bytes` bytes under `key` and returns 0 (non-zero: it failed); get fills `out` with exactly
 * `bytes` bytes of `key` and returns 0 once the key is there, 1 when it is not after waiting up to
 * `wait_ms` milliseconds, another value when it failed (a value of another length is a failure); erase
 * (may be NULL) removes a key ferry no longer needs. `user` is passed back. */
typedef int (*ferry_kv_set_fn)(void* user, const char* key, const void* value, size_t bytes);
typedef int (*ferry_kv_get_fn)(void* user, const char* key, void* out, size_t bytes, int64_t wait_ms);
typedef int (*ferry_kv_erase_fn)(void* user, const char* key);
typedef struct ferry_kv_store {
  void* user;
  ferry_kv_set_fn set;
  ferry_kv_get_fn get;
  ferry_kv_erase_fn erase;
} ferry_kv_store;

/* This process's rank of a group over the job's processes, on `dev` (NCCL for a cuda device, the host
 * backend for an emulated one). `bootstrap`: "single" (a job of this process), "mpi" (mpirun) or "auto".
 * A collective not done within timeout_s seconds aborts the group on every process. Collective: every
 * process of the job calls it. */
FERRY_C_API int ferry_comm_open(ferry_device* dev, const char* bootstrap, double timeout_s, ferry_comm** out);
/* The same over a key-value store: this process is `rank` of `size` (torchrun's RANK and WORLD_SIZE),
 * its keys start with `prefix` (the same on every process, unique per group). The store's functions must
 * stay callable until ferry_comm_destroy returns. */
FERRY_C_API int ferry_comm_open_store(ferry_device* dev, const ferry_kv_store* store, const char* prefix,
                                      int rank, int size, double timeout_s, ferry_comm** out);
FERRY_C_API int ferry_comm_rank(ferry_comm* c, int* rank, int* size);
/* "host" or "nccl" (owned by the handle). */
FERRY_C_API const char* ferry_comm_backend(ferry_comm* c);
/* recv = op over every rank's send (`count` elements of dtype "f32", "f16", "bf16", "i32", "i64",
 * "u64"; op "sum" or "avg"), ordered after `stream`'s queued work and before its later work (default
 * streams accepted on cuda). Device memory of the group's device; send may equal recv. */
FERRY_C_API int ferry_comm_all_reduce(ferry_comm* c, const void* send, void* recv, size_t count,
                                      const char* dtype, const char* op, uintptr_t stream);
/* recv on every rank = send of `root`, ordered as ferry_comm_all_reduce. */
FERRY_C_API int ferry_comm_broadcast(ferry_comm* c, const void* send, void* recv, size_t count,
                                     const char* dtype, int root, uintptr_t stream);
/* The mean over ranks of `count` fp32 elements at `data` (device memory, in place), through `codec`:
 * "none" (an fp32 average), "bf16" or "fp16" (scaled by 1/world size, cast, summed on the wire in that
 * type, cast back: half the bytes, the error bound of ferry/comm/codec.hpp). Ordered on `stream` as
 * ferry_comm_all_reduce; the wire buffer is the handle's own, grown to the largest call. What a DDP comm
 * hook runs per bucket. */
FERRY_C_API int ferry_comm_all_reduce_mean(ferry_comm* c, void* data, size_t count, const char* codec,
                                           uintptr_t stream);
/* The registered codecs as JSON, for ferry_string_free: [{"name", "aliases", "lossy", "stateless" (what
 * ferry_comm_all_reduce_mean takes), "automatic" (a candidate of the automatic plan), "options" (takes
 * codec_options)}, ...], in registration order. */
FERRY_C_API int ferry_comm_codecs_json(char** out);
/* Aborts the group: every process's pending and later collectives fail, naming `why`. */
FERRY_C_API int ferry_comm_abort(ferry_comm* c, const char* why);
/* Destroys the handle (aborting the group for processes still in it); reducers made from it keep the
 * group alive until they are destroyed. */
FERRY_C_API void ferry_comm_destroy(ferry_comm* c);

/* A reducer of `params` gradients of shapes rows[i] x cols[i] (a 1-D tensor of n elements is n x 1;
 * a higher-dimensional one its first dimension x the rest), in the group of `c`. `options_json` (NULL for
 * the defaults): {"plan": "auto" | "fixed", "lossy": false, "first_bucket_bytes": N, "bucket_cap_bytes":
 * N, "codec": "none" | "fp16" | "bf16" | "powersgd", "codec_options": {"<codec>": {"<field>": number or
 * boolean}} (each codec's own fields, e.g. {"powersgd": {"rank": 4}}; ferry_comm_codecs_json says which
 * codecs take options), "rebuild": true, "learn_steps": 3, "timing": false, "grad_dtype": "f32" | "bf16" |
 * "f16", "reduce_dtype": null | "f32"}.
 * "auto" learns the backward over the first 1 + 3 * learn_steps steps and then sets its own plan;
 * "lossy" allows it bf16 and fp16 buckets (f32 gradients only). bf16/f16 gradients are averaged in their
 * own type, or in f32 with "reduce_dtype": "f32" (widened, rounded back once). Collective. */
FERRY_C_API int ferry_reducer_create(ferry_comm* c, const int64_t* rows, const int64_t* cols, size_t params,
                                     const char* options_json, ferry_reducer** out);
/* *pending = 1 when the next ferry_reducer_begin_step will lay the gradients out anew (their memory moves:
 * keep what they hold before it, if needed), else 0. *generation counts the layouts so far. */
FERRY_C_API int ferry_reducer_layout(ferry_reducer* r, uint64_t* generation, int* pending);
/* Opens a step (applying a new plan: a host sync, once per plan change). */
FERRY_C_API int ferry_reducer_begin_step(ferry_reducer* r);
/* The flat gradient buffer as a DLPack DLManagedTensor (as void*): 1-D, of the gradients' type, every
 * gradient and the padding between them; gradient p is elements [offset, offset + elements) of it
 * (ferry_reducer_place, in elements of that type).
 * Borrowed: valid until the layout changes or the reducer is destroyed; its deleter frees the struct only. */
FERRY_C_API int ferry_reducer_flat_dlpack(ferry_reducer* r, void** out);
FERRY_C_API int ferry_reducer_place(ferry_reducer* r, size_t p, size_t* offset, size_t* elements);
/* Gradient p is complete on `stream` (default streams accepted on cuda); launches the buckets that can go. */
FERRY_C_API int ferry_reducer_mark_ready(ferry_reducer* r, size_t p, uintptr_t stream);
/* The same for the `n` gradients ps[0..n), in order, all complete on `stream` (one call, one bridge of a
 * default stream): what a caller that counts a bucket's gradients itself sends once the bucket is full. */
FERRY_C_API int ferry_reducer_mark_ready_many(ferry_reducer* r, const size_t* ps, size_t n, uintptr_t stream);
/* out[p] = the bucket of gradient p in the current layout, for p < n (n = the parameter count);
 * *learning = 1 while the automatic plan learns (it needs every gradient's own mark, when it is ready). */
FERRY_C_API int ferry_reducer_buckets(ferry_reducer* r, size_t* out, size_t n, int* learning);
/* Gradient hooks: for a framework that calls a function as each gradient completes (PyTorch's
 * post-accumulate-grad hooks, called through ctypes), so that the caller runs none of its own code per
 * gradient. ferry_reducer_begin_step opens the step's hooks; ferry_reducer_hooks_arm says its backward
 * started, with the gradients produced on `stream`; from then ferry_reducer_grad_hook(r, p, _) counts
 * gradient p, and tells the reducer a bucket's gradients once the bucket is full (while the automatic plan
 * learns, each at once); ferry_reducer_finish closes them. A hook never fails and ignores its last
 * argument(s) (the framework's: the tensor, or a node hook's two tuples): a hook outside a step notes the
 * gradient as made outside one (ferry_reducer_hooks_flags' `unsynced`, cleared as read), a hook before arm
 * or a second one for a gradient in the step is kept for ferry_reducer_hooks_state (*early, *twice: the
 * first such gradient, else -1), as is the reducer's first failure under a hook (*error: NULL when none,
 * else a string for ferry_string_free). FERRY_ERROR_INVALID from arm outside a step, after a gradient of
 * the step was counted (arming again before any is allowed: a backward that accumulated none), or for a
 * stream of another device. */
FERRY_C_API int ferry_reducer_hooks_arm(ferry_reducer* r, uintptr_t stream);
FERRY_C_API void ferry_reducer_grad_hook(ferry_reducer* r, size_t p, void* tensor);
FERRY_C_API void ferry_reducer_grad_node_hook(ferry_reducer* r, size_t p, void* grad_inputs,
                                              void* grad_outputs);
FERRY_C_API int ferry_reducer_hooks_state(ferry_reducer* r, size_t* marks, int64_t* twice, int64_t* early,
                                          char** error);
/* marked[p] = 1 if gradient p was hooked in this step; unsynced[p] = 1 if it was hooked outside a
 * step since the last call; either may be NULL; n must be the parameter count. */
FERRY_C_API int ferry_reducer_hooks_flags(ferry_reducer* r, uint8_t* marked, uint8_t* unsynced, size_t n);
/* Closes the step: `stream` waits for the last bucket. FERRY_ERROR_INVALID names the gradients never
 * marked (the step stays open). */
FERRY_C_API int ferry_reducer_finish(ferry_reducer* r, uintptr_t stream);
/* {"steps", "buckets", "codecs", "first_bucket_bytes", "bucket_cap_bytes", "learning", "decided", ...}. */
FERRY_C_API int ferry_reducer_stats_json(ferry_reducer* r, char** out);
/* Waits for the reducer's work and destroys it. */
FERRY_C_API void ferry_reducer_destroy(ferry_reducer* r);

/* ---- image: JPEG samples (header parse, crop boxes, the CPU decode) ------------------------------ */
/* The header of the JPEG of `size` bytes at `bytes`, read from its markers (no decode; never reads past
 * `size`): out[0..8] = {status, height, width, components, process, precision, adobe_transform, decodable,
 * offset}. status 0 ok, else 1 not a JPEG, 2 truncated, 3 bad marker, 4 bad frame, 5 width or height 0,
 * 6 no frame header; process 0 baseline, 1 extended, 2 progressive, 3 lossless, 4 arithmetic-coded,
 * 5 hierarchical; adobe_transform -1 without an Adobe marker; decodable 1 when ferry's decoders take it
 * (8-bit Huffman sequential or progressive, 1 or 3 components); offset where the parser stopped (the frame
 * marker when ok). Fails (FERRY_ERROR_INVALID) only for NULL pointers: content is reported, not refused. */
FERRY_C_API int ferry_jpeg_info(const void* bytes, size_t size, int32_t* out);
/* Why ferry's decoders refuse the JPEG at `bytes` ("a CMYK JPEG (4 components)", "truncated before the end
 * of its frame header", ...; static storage), or NULL when they take it. */
FERRY_C_API const char* ferry_jpeg_refusal(const void* bytes, size_t size);
/* Crop boxes of n samples, sample i of heights[i] x widths[i] pixels, drawn from seeds[i]: boxes[5 * i ..]
 * = {top, left, height, width, flip}. mode 0 random-resized (torchvision RandomResizedCrop + horizontal
 * flip), 1 center (the largest centered square times crop_fraction), 2 full. params: NULL for the defaults,
 * else {scale_min, scale_max, ratio_min, ratio_max, flip_probability, crop_fraction}
 * (0.08, 1, 3/4, 4/3, 0.5, 224/256). The generator and draw order: include/ferry/image/crop_box.hpp. */
FERRY_C_API int ferry_image_boxes(size_t n, const int32_t* heights, const int32_t* widths,
                                  const uint64_t* seeds, int mode, const double* params, int32_t* boxes);
/* Decodes the JPEG at `bytes` on this thread, crops box[0..4] (as ferry_image_boxes writes it, in the
 * image's pixels), resizes to out_size x out_size (antialiased bilinear, as PIL's BILINEAR) and flips when
 * box[4] is 1, writing 3 * out_size * out_size uint8 at `out` (out_bytes of room): layout 0 CHW (planes R,
 * G, B), 1 HWC. Grayscale comes out as three equal channels. FERRY_ERROR_INVALID names what the JPEG is
 * when ferry does not decode it (CMYK, lossless, arithmetic-coded, not a JPEG, ...), a box outside the
 * image, or a missing libjpeg and what to install; FERRY_ERROR_INPUT carries libjpeg's message for data it
 * cannot decode. */
FERRY_C_API int ferry_jpeg_decode_crop(const void* bytes, size_t size, const int32_t* box, int32_t out_size,
                                       int layout, void* out, size_t out_bytes);
/* ferry_jpeg_decode_crop of n samples on `threads` threads of its own (0: one per core, at most n), sample
 * i from data[i] (sizes[i] bytes) with boxes[5 * i ..] into out + i * out_stride (out_stride >= 3 *
 * out_size * out_size). Returns when all are done; a failure names the first failing sample by index, and
 * the other samples are still decoded. */
FERRY_C_API int ferry_jpeg_decode_crop_batch(size_t n, const void* const* data, const size_t* sizes,
                                             const int32_t* boxes, int32_t out_size, int layout, void* out,
                                             size_t out_stride, int threads);

/* ---- image: the GPU JPEG decoder (nvJPEG, opened at run time) ------------------------------------ */
typedef struct ferry_jpeg_decoder ferry_jpeg_decoder;
/* Where nvJPEG is, as JSON for ferry_string_free: {"available", "path", "version", "error" (why not, and what
 * to install), "tried" (the names tried, in order)}. options_json: NULL, or {"library_dirs": [folder, ...]},
 * looked in first. Needs no GPU; fails only for bad options. */
FERRY_C_API int ferry_jpeg_gpu_library_json(const char* options_json, char** out);
/* A GPU JPEG decoder on `dev`, a cuda device. options_json: NULL for the defaults, or {"backend": "auto" (the
 * GPU's JPEG engines for the images they take, nvJPEG's one-by-one decode for the rest) | "hardware" (the
 * same, but fails without engines) | "software" (one by one only), "buffers": 2 (scratch sets used in turn,
 * 1..8), "threads": N (host threads a decode call's nvJPEG work runs on, the caller's among them, 1..64;
 * default 1; more fails on an H200 with nvJPEG 13.0.1, NVJPEG_STATUS_ALLOCATOR_FAILURE in every part but the
 * first: not for use yet), "library_dirs": [folder, ...]}. FERRY_ERROR_INVALID names a bad option, a missing
 * nvJPEG and what to install, a host device, or a build without CUDA. */
FERRY_C_API int ferry_jpeg_decoder_create(ferry_device* dev, const char* options_json,
                                          ferry_jpeg_decoder** out);
/* Decodes n JPEGs (data[i] of lengths[i] bytes, host memory) on the decoder's GPU, crops boxes[5 * i ..] (as
 * ferry_image_boxes writes them, in the image's pixels), resizes to size x size (PIL's BILINEAR, the same
 * rounding as PIL's crop + resize), flips when the box says so and writes the batch at `out` (device memory,
 * n * 3 * size * size elements, dense): dtype 0 uint8, 1 float32, 2 bfloat16, 3 float16, the floats being
 * (x / 255 - mean[c]) / std[c] (mean and std: NULL for 0 and 1); layout 0 NCHW, 1 NHWC (channels_last).
 * The output is written on `consumer_stream` only (default streams accepted), after its queued work; the
 * host does not wait for the decode. status: NULL, or n int32 receiving each sample's outcome (0 ok, 1
 * refused: not a JPEG, or a kind ferry does not decode, such as CMYK; 2 nvJPEG failed), the samples not ok
 * written as zeros; with NULL the first such sample fails the call (FERRY_ERROR_INPUT naming its index).
 * inputs_done: NULL, or receives an event that completes once nvJPEG no longer reads the host bytes: keep
 * them unchanged until then (an event recorded on consumer_stream after this call completes later still).
 * FERRY_ERROR_INVALID names a bad argument or a box outside its image; nothing is queued then. */
FERRY_C_API int ferry_jpeg_decoder_decode(ferry_jpeg_decoder* d, size_t n, const void* const* data,
                                          const size_t* lengths, const int32_t* boxes, int32_t size,
                                          void* out, int dtype, int layout, const float* mean,
                                          const float* std, uintptr_t consumer_stream, int32_t* status,
                                          ferry_event** inputs_done);
/* For tests: the whole decoded image of sample `index` of the last decode, channels x height x width bytes
 * (R, G, B planes; one luma plane for a grayscale JPEG; channels 0 when it was not decoded), copied into
 * `out` (out_bytes of room; out NULL asks the sizes only). Blocks until that decode is done. */
FERRY_C_API int ferry_jpeg_decoder_image(ferry_jpeg_decoder* d, size_t index, uint8_t* out, size_t out_bytes,
                                         int32_t* height, int32_t* width, int32_t* channels);
/* {"library", "version", "backend", "batches", "images", "hardware_images", "single_images", ...}. */
FERRY_C_API int ferry_jpeg_decoder_stats_json(ferry_jpeg_decoder* d, char** out);
/* Waits for the decoder's work and destroys it. */
FERRY_C_API void ferry_jpeg_decoder_destroy(ferry_jpeg_decoder* d);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_C_FERRY_H */
