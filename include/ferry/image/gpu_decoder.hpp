// The GPU decode of a batch of JPEGs into a fixed-size, normalised output batch: nvJPEG (opened at run time
// through ferry::shim) decodes each image whole into the decoder's scratch planes, then one kernel crops each
// sample's box, resizes it to size x size (Pillow's BILINEAR: a triangle filter whose support widens with
// the downscale factor, the same fixed-point arithmetic and 8-bit rounding as PIL's crop + resize), flips it
// and writes the batch as uint8, or as (x / 255 - mean) / std in float32, bfloat16 or float16, NCHW or NHWC.
//
// Note [GPU decode: streams, events and buffers]:
// - Which decode: with the hardware backend (the GPU's JPEG engines, nvJPEG's NVJPEG_BACKEND_HARDWARE) every
//   image nvjpegDecodeBatchedSupported accepts goes into one nvjpegDecodeBatched call per part; the others
//   (progressive JPEGs, grayscale ones, decoded as luma alone, and any the batched call refused) are decoded
//   one by one with nvjpegDecode (nvJPEG's default backend: Huffman decode on the host). Without hardware
//   engines, or with gpu_backend::software, every image takes the one-by-one path. nvJPEG parses each
//   header once (nvjpegJpegStreamParseHeader: its frame size is checked against jpeg_info's, and the
//   parsed stream answers nvjpegDecodeBatchedSupported).
// - Refused by sample: what jpeg_info's undecodable_reason() refuses (not a JPEG, CMYK/YCCK, lossless,
//   arithmetic-coded, 12-bit), and images nvJPEG fails on. With a status span those samples are written as
//   zeros and their status says why; without one the batch fails naming the first.
// - Threads: a call's batch is split into up to `threads` contiguous parts (of at least 8 samples), whose
//   host work (nvJPEG's header parse, nvjpegDecodeBatchedSupported, nvjpegDecodeBatched's and nvjpegDecode's
//   host side) runs concurrently: part 0 on the calling thread, the others on the decoder's own persistent
//   threads; the call returns once every part has. Each part has its own nvJPEG states in every scratch set
//   (a state serves one thread at a time), its own nvJPEG handle (part 0: the decoder's; one handle shared
//   by the threads failed on an H200), its own hardware batch and its own CUDA stream; the parts write
//   disjoint planes. The split fails on an H200 (nvJPEG 13.0.1: NVJPEG_STATUS_ALLOCATOR_FAILURE in every part
//   but the first, also with a handle per part), cause not found: the default is one thread, and more is not
//   for use yet. Refusals and failures are reported by sample index as with one thread: the first in the
//   batch's order is the one named.
// - Streams: each part's nvJPEG work goes on that part's stream, and every part's stream joins the
//   decoder's decode stream (an event) before the table copy and the decode event; the kernel runs on the
//   consumer stream after a device-side wait for the decode, so the output batch (which the caller
//   allocated for the consumer stream, as torch's caching allocator does) is written on that stream only
//   (torchvision#9606 wrote it on another).
// - Buffers: `buffers` scratch sets used in turn (batch k uses set k % buffers), each with its nvJPEG
//   states, decoded planes and the kernel's sample table. A set's planes and table are rewritten only after
//   the event recorded on the consumer stream after the kernel that read them: the decode stream waits for
//   it on the device (so do the parts' streams), and for a batch with hardware samples the host waits for
//   it too, because the hardware engines start writing when nvjpegDecodeBatched is called, not when the
//   stream reaches it (a device-side wait does not gate them: measured on H100 with nvJPEG 12.3 to 13.2,
//   meta-pytorch/torchcodec#1634). That kernel is `buffers` batches old, so the wait is back-pressure only
//   when the host runs that far ahead of the consumer stream. The set's host-side table and nvJPEG states
//   are reused after the host saw the set's previous decode complete. Planes grow to the largest batch
//   seen and never shrink; growing waits on the host for the set's last kernel before freeing the old ones.
// - Host bytes: nvJPEG reads the JPEG bytes during decode() and may copy from them asynchronously until the
//   decode stream passes this batch: keep them unchanged until the `inputs_done` event decode() can record
//   completes. The consumer stream waits for that event before the kernel, so any event the caller records
//   on the consumer stream after decode() completes later and covers it too. A call that throws reads none
//   of its bytes once it has returned; and once `buffers` later calls have returned, none of a call's.
// - No host synchronization on the hot path beyond the waits above and what nvJPEG does itself (its
//   one-by-one decode parses and Huffman-decodes on the part's thread).
//
// Host-only C++; the implementation needs ferry built with CUDA (src/image/cuda/), and without it the
// constructor throws logic_error saying so.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/device/device.hpp"
#include "ferry/image/crop_box.hpp"
#include "ferry/image/jpeg_decode.hpp"

namespace ferry::image {

/// The element type of the output batch.
enum class output_dtype : std::int32_t {
  uint8 = 0,     // the resized 8-bit values, no normalisation
  float32 = 1,   // (x / 255 - mean) / std, in float32
  bfloat16 = 2,  // the float32 value rounded to nearest even
  float16 = 3
};

/// Bytes per element of `t`; logic_error for a value outside the enum.
[[nodiscard]] std::size_t element_bytes(output_dtype t);
/// "uint8", "float32", "bfloat16", "float16".
[[nodiscard]] const char* to_string(output_dtype t) noexcept;

/// Which nvJPEG decode the decoder may use.
enum class gpu_backend : std::int32_t {
  automatic = 0,  // the hardware engines where the GPU has them and an image suits them, else one by one
  hardware = 1,   // as automatic, but the constructor fails when the GPU has no hardware engines
  software = 2    // every image one by one through nvJPEG's default backend (never the engines)
};

/// The most threads a decoder's options may ask for.
inline constexpr int max_decode_threads = 64;

/// How a decoder is made.
struct gpu_decoder_options {
  gpu_backend backend = gpu_backend::automatic;
  /// Scratch sets used in turn (1..8): with 2, batch k + 1 decodes while batch k's kernel runs.
  int buffers = 2;
  /// Host threads one decode() call's nvJPEG host work runs on (1..max_decode_threads; the calling thread
  /// is one of them); 0: 1 (see default_threads() in the source: more is not yet verified on a GPU).
  int threads = 0;
  /// Folders to look for libnvjpeg in before the others (shim::nvjpeg_library_names).
  std::vector<std::string> library_dirs;
};

/// What happened to one sample (the status span of decode()).
enum class sample_status : std::int32_t {
  ok = 0,
  undecodable = 1,  // refused before decoding: not a JPEG, or a kind ferry does not decode (CMYK, ...)
  failed = 2        // nvJPEG could not decode it
};

/// One batch for decode(): n = data.size() samples (1..65535), sample i of lengths[i] bytes at data[i], its
/// crop box boxes[i] in the image's pixels (validated against the image's size).
struct gpu_decode_batch {
  std::span<const void* const> data;
  std::span<const std::size_t> lengths;
  std::span<const crop_box> boxes;
  /// The output side: each sample becomes 3 x size x size elements (1..max_output_size).
  std::int32_t size = 224;
  output_dtype dtype = output_dtype::uint8;
  /// chw: NCHW, sample i's plane c row y at ((i * 3 + c) * size + y) * size; hwc: NHWC (channels_last),
  /// ((i * size + y) * size + x) * 3 + c.
  pixel_layout layout = pixel_layout::chw;
  /// For the float dtypes: out = (x / 255 - mean[c]) / std[c] in float32 (std > 0); unused for uint8.
  std::array<float, 3> mean{0.0F, 0.0F, 0.0F};
  std::array<float, 3> std{1.0F, 1.0F, 1.0F};
  /// Device memory of the decoder's GPU, n * 3 * size * size elements of dtype, dense in `layout`.
  void* out = nullptr;
  /// Empty: the first sample that cannot be decoded fails the batch (input_error naming it). Else n
  /// entries receive each sample's sample_status, and the samples that are not ok are written as zeros.
  std::span<std::int32_t> status;
};

/// The size of one decoded image (last_image()).
struct decoded_image {
  std::int32_t height = 0;
  std::int32_t width = 0;
  std::int32_t channels = 0;  // 3 (RGB planes), 1 (a grayscale JPEG's luma), 0 (not decoded)
};

/// Decodes JPEG batches on one GPU (Note [GPU decode: streams, events and buffers]). One call at a time
/// (calls from several threads are serialised). Destroying it waits for its work.
class gpu_jpeg_decoder {
 public:
  /// A decoder on `dev`, which must be a cuda device. Throws logic_error naming what to install when nvJPEG
  /// is missing, for a host device, or for options out of range (or a build without CUDA), and cuda_error
  /// when nvJPEG or the runtime fails.
  gpu_jpeg_decoder(device& dev, const gpu_decoder_options& options);
  ~gpu_jpeg_decoder();
  gpu_jpeg_decoder(const gpu_jpeg_decoder&) = delete;
  gpu_jpeg_decoder& operator=(const gpu_jpeg_decoder&) = delete;
  gpu_jpeg_decoder(gpu_jpeg_decoder&&) noexcept;
  gpu_jpeg_decoder& operator=(gpu_jpeg_decoder&&) noexcept;

  /// Decodes `batch` and writes its output on `consumer` (ordered after the consumer's queued work and
  /// before its later work). When `inputs_done` is not null it receives an event that completes once nvJPEG
  /// no longer reads the batch's host bytes. Throws logic_error naming the argument or sample that is out of
  /// range (nothing queued), input_error for an undecodable sample without a status span, cuda_error when
  /// nvJPEG or the runtime fails.
  void decode(const gpu_decode_batch& batch, stream_view consumer, event* inputs_done = nullptr);

  /// For tests: the whole decoded image of sample `index` of the last decode() (its planes as nvJPEG wrote
  /// them: channels x height x width bytes), copied into `host` when it has room (an empty span asks the size
  /// only). Blocks until that decode is done. logic_error when there was no decode or index is out of range.
  decoded_image last_image(std::size_t index, std::span<std::uint8_t> host);

  /// Counters as JSON: batches, images, hardware and one-by-one decodes (and why), refused samples,
  /// scratch bytes, host seconds, the nvJPEG library, its version and backend.
  [[nodiscard]] std::string stats_json() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// nvJPEG as this process finds it, as JSON: {"available", "path", "version", "error", "tried"} (the names
/// tried, in order), after looking in `library_dirs` first. Never throws for a missing library.
[[nodiscard]] std::string nvjpeg_library_json(const std::vector<std::string>& library_dirs);

}  // namespace ferry::image
