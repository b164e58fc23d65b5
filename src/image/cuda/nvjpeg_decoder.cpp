// The GPU JPEG decoder on the cuda backend: nvJPEG (through ferry::shim) into the scratch sets, then the
// crop-resize kernel (resize_kernel.cu) on the consumer stream. Streams, events and buffer reuse follow
// Note [GPU decode: streams, events and buffers] in ferry/image/gpu_decoder.hpp.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"
#include "ferry/image/gpu_decoder.hpp"
#include "ferry/image/jpeg_info.hpp"
#include "ferry/shim/nvjpeg.hpp"
#include "part_pool.hpp"
#include "resize_kernel.hpp"

namespace ferry::image {
namespace {

using cuda_kernels::sample_desc;
using shim::nvjpeg_status;

constexpr std::size_t plane_alignment = 256;  // each plane starts on a 256-byte boundary
constexpr std::size_t pitch_alignment = 64;

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

void nvjpeg_try(nvjpeg_status s, const char* call) {
  if (s != shim::nvjpeg_success)
    throw cuda_error(s, fmt::format("{} failed: {}", call, shim::nvjpeg_api::error_string(s)));
}

// Makes GPU `ordinal` current on the calling thread (nvJPEG allocates and launches on the current device).
void make_current(int ordinal) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) static_cast<void>(cudaGetLastError());
  if (current != ordinal) FERRY_CUDA_TRY(cudaSetDevice(ordinal));
}

// How one sample of a batch is decoded, and why one by one (the counters).
enum class route : std::uint8_t { none, hardware, single_rgb, single_y };
enum class single_reason : std::uint8_t { none, progressive, grayscale, unsupported };

// What one sample is and how it is decoded: written by the part of the call that holds the sample.
struct sample_plan {
  route how = route::none;
  single_reason why_single = single_reason::none;
  std::int32_t height = 0;
  std::int32_t width = 0;
  std::int32_t channels = 0;
  std::size_t pitch = 0;
  std::size_t plane_bytes = 0;
  std::size_t offset = 0;  // into the set's planes
  // Not ok: the sample is not decoded, `problem` says why. bad_box: the call is refused (logic_error).
  sample_status status = sample_status::ok;
  bool bad_box = false;
  std::string problem;
};

// The nvJPEG states of one part of a call in one scratch set (a state serves one thread at a time).
struct part_states {
  shim::nvjpeg_jpeg_state hw_state = nullptr;
  shim::nvjpeg_jpeg_state sw_state = nullptr;
  int hw_batch = -1;  // the batch size hw_state was initialised for; -1: initialise before the next use
};

// One set of scratch buffers and nvJPEG states (the Note's "scratch set").
struct scratch_set {
  buffer planes;      // device: the decoded planes of a batch
  buffer table;       // device: sample_desc[table_capacity]
  buffer table_host;  // pinned: the table as the host writes it
  std::size_t table_capacity = 0;
  std::vector<part_states> parts;  // one per thread
  event decoded;                   // on the decode stream, after the set's last nvJPEG calls and table copy
  event consumed;                  // on the consumer stream, after the kernel that read the set
};

// What part k of every call uses besides the set's states: its own nvJPEG handle (lane 0: the decoder's;
// one handle shared by threads gave wrong header statuses and NVJPEG_STATUS_ALLOCATOR_FAILURE on nvJPEG
// 13.0 with the hardware backend, H200, 2026-12-02), a jpeg stream for the header parse (host only), the
// CUDA stream its nvJPEG work goes on, and the event that joins that stream into the decode stream.
struct lane {
  shim::nvjpeg_handle handle = nullptr;  // owned by lanes 1.. (lane 0's is impl::handle)
  shim::nvjpeg_jpeg_stream parsed = nullptr;
  stream work;
  event done;
};

// What one part's decode did.
struct part_result {
  std::uint64_t hardware = 0;
  std::uint64_t hardware_refused = 0;  // nvjpegDecodeBatched failed them; retried one by one
  std::uint64_t single = 0;
  std::vector<std::size_t> failed;  // samples nvjpegDecode failed (their plans say why), in order
};

struct counters {
  std::uint64_t batches = 0;
  std::uint64_t images = 0;
  std::uint64_t hardware = 0;
  std::uint64_t single = 0;
  std::uint64_t single_progressive = 0;
  std::uint64_t single_grayscale = 0;
  std::uint64_t single_unsupported =
      0;  // the hardware engines do not take them (nvjpegDecodeBatchedSupported)
  std::uint64_t hardware_refused =
      0;  // images of hardware batches nvjpegDecodeBatched failed, retried singly
  std::uint64_t undecodable = 0;
  std::uint64_t failed = 0;
  std::uint64_t grows = 0;
  double host_seconds = 0;
};

// A part smaller than this costs more in hand-off and in one more nvjpegDecodeBatched call than it saves.
constexpr std::size_t min_part_samples = 8;

// The default of gpu_decoder_options::threads.
// One: the split (threads > 1) gave wrong statuses and NVJPEG_STATUS_ALLOCATOR_FAILURE with one shared handle
// on an H200 (nvJPEG 13.0.1, 2026-12-02); its fix, a handle per thread, has not run on a GPU yet.
std::size_t default_threads() { return 1; }

shim::nvjpeg_image image_of(const sample_plan& p, unsigned char* base) {
  shim::nvjpeg_image img{};
  for (int c = 0; c < p.channels; ++c) {
    img.channel[c] = base + p.offset + static_cast<std::size_t>(c) * p.plane_bytes;
    img.pitch[c] = p.pitch;
  }
  return img;
}

// Rethrows the first part's exception, if any.
void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

struct gpu_jpeg_decoder::impl {
  device* dev = nullptr;
  gpu_decoder_options options;
  std::shared_ptr<const shim::nvjpeg_api> api;
  shim::nvjpeg_handle handle = nullptr;
  bool hardware = false;
  std::string hardware_absent;  // why the hardware backend is not used
  unsigned engines = 0;
  unsigned cores_per_engine = 0;
  stream decode_stream;  // the parts' streams join here; the table copy and the set's events
  std::vector<lane> lanes;
  std::vector<scratch_set> sets;
  std::uint64_t next_batch = 0;
  counters count;
  // The last decode, for last_image().
  std::size_t last_set = 0;
  std::vector<sample_plan> last_plans;
  bool has_last = false;
  mutable std::mutex mu;
  std::unique_ptr<part_pool> pool;  // last: its workers are joined first

  impl(device& d, const gpu_decoder_options& o);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  void decode(const gpu_decode_batch& batch, stream_view consumer, event* inputs_done);
  void check(const gpu_decode_batch& batch, stream_view consumer) const;
  [[nodiscard]] sample_plan plan(const gpu_decode_batch& b, std::size_t i, const lane& l) const;
  part_result decode_part(const gpu_decode_batch& b, std::vector<sample_plan>& plans, std::size_t first,
                          std::size_t last, part_states& states, const lane& l, unsigned char* base) const;
  void reserve(scratch_set& set, std::size_t plane_bytes, std::size_t samples);
  // Destroys the nvJPEG objects (after their work: the caller waited).
  void release() noexcept;
};

gpu_jpeg_decoder::impl::impl(device& d, const gpu_decoder_options& o) : dev(&d), options(o) {
  FERRY_EXPECTS(o.buffers >= 1 && o.buffers <= 8,
                fmt::format("GPU JPEG decoder: buffers = {}; it must be 1..8 (2 overlaps one batch's decode "
                            "with the previous batch's kernel)",
                            o.buffers));
  FERRY_EXPECTS(o.threads >= 0 && o.threads <= max_decode_threads,
                fmt::format("GPU JPEG decoder: threads = {}; it must be 1..{} (0: the default, 1)", o.threads,
                            max_decode_threads));
  FERRY_EXPECTS(o.backend == gpu_backend::automatic || o.backend == gpu_backend::hardware ||
                    o.backend == gpu_backend::software,
                fmt::format("GPU JPEG decoder: backend {} is not automatic (0), hardware (1) or software (2)",
                            static_cast<int>(o.backend)));
  api = shim::nvjpeg(o.library_dirs);
  FERRY_EXPECTS(api->ok(), "the GPU JPEG decoder needs nvJPEG: " + api->error);
  FERRY_EXPECTS(d.kind() == backend::cuda,
                fmt::format("the GPU JPEG decoder needs a cuda device; device {} is a {} device", d.ordinal(),
                            to_string(d.kind())));
  make_current(d.ordinal());
  if (o.backend != gpu_backend::software) {
    const nvjpeg_status s = api->create_ex(shim::nvjpeg_backend::hardware, nullptr, nullptr, 0, &handle);
    if (s == shim::nvjpeg_success) {
      hardware = true;
    } else {
      handle = nullptr;
      hardware_absent = fmt::format("nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) returned {}",
                                    shim::nvjpeg_api::error_string(s));
      FERRY_EXPECTS(
          o.backend != gpu_backend::hardware,
          fmt::format("GPU JPEG decoder: backend \"hardware\", but this GPU's JPEG engines cannot be "
                      "used: {} (use \"auto\" to decode without them)",
                      hardware_absent));
    }
  } else {
    hardware_absent = "backend \"software\" asked for";
  }
  const std::size_t threads = o.threads == 0 ? default_threads() : static_cast<std::size_t>(o.threads);
  try {
    if (!hardware)
      nvjpeg_try(api->create_ex(shim::nvjpeg_backend::default_backend, nullptr, nullptr, 0, &handle),
                 "nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT)");
    if (hardware && api->get_hardware_decoder_info != nullptr &&
        api->get_hardware_decoder_info(handle, &engines, &cores_per_engine) != shim::nvjpeg_success) {
      engines = cores_per_engine = 0;
    }
    decode_stream = d.make_stream();
    lanes.resize(threads);
    for (std::size_t k = 0; k < lanes.size(); ++k) {
      lane& l = lanes[k];
      if (k == 0) {
        l.handle = handle;
      } else {
        nvjpeg_try(
            api->create_ex(hardware ? shim::nvjpeg_backend::hardware : shim::nvjpeg_backend::default_backend,
                           nullptr, nullptr, 0, &l.handle),
            "nvjpegCreateEx (a part's handle)");
      }
      nvjpeg_try(api->jpeg_stream_create(l.handle, &l.parsed), "nvjpegJpegStreamCreate");
      l.work = d.make_stream();
      l.done = d.make_event();
    }
    sets.resize(static_cast<std::size_t>(o.buffers));
    for (scratch_set& set : sets) {
      set.parts.resize(threads);
      for (std::size_t k = 0; k < set.parts.size(); ++k) {
        part_states& p = set.parts[k];
        if (hardware)
          nvjpeg_try(api->jpeg_state_create(lanes[k].handle, &p.hw_state), "nvjpegJpegStateCreate");
        nvjpeg_try(api->jpeg_state_create(lanes[k].handle, &p.sw_state), "nvjpegJpegStateCreate");
      }
      set.decoded = d.make_event();
      set.consumed = d.make_event();
    }
    pool = std::make_unique<part_pool>(threads);
  } catch (...) {
    release();
    throw;
  }
}

gpu_jpeg_decoder::impl::~impl() {
  pool.reset();
  // The kernels may still read the planes and nvJPEG may still write them: wait before freeing.
  try {
    make_current(dev->ordinal());
    for (scratch_set& set : sets) {
      if (set.consumed.recorded()) set.consumed.synchronize();
    }
    for (lane& l : lanes) l.work.synchronize();
    decode_stream.synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing; the runtime may be gone
  }
  release();
}

void gpu_jpeg_decoder::impl::release() noexcept {
  for (scratch_set& set : sets) {
    for (part_states& p : set.parts) {
      if (p.hw_state != nullptr) static_cast<void>(api->jpeg_state_destroy(p.hw_state));
      if (p.sw_state != nullptr) static_cast<void>(api->jpeg_state_destroy(p.sw_state));
      p = part_states{};
    }
  }
  for (lane& l : lanes) {
    if (l.parsed != nullptr) static_cast<void>(api->jpeg_stream_destroy(l.parsed));
    l.parsed = nullptr;
    if (l.handle != nullptr && l.handle != handle) static_cast<void>(api->destroy(l.handle));
    l.handle = nullptr;
  }
  if (handle != nullptr) static_cast<void>(api->destroy(handle));
  handle = nullptr;
}

void gpu_jpeg_decoder::impl::check(const gpu_decode_batch& b, stream_view consumer) const {
  const std::size_t n = b.data.size();
  FERRY_EXPECTS(n >= 1 && n <= cuda_kernels::max_samples,
                fmt::format("GPU JPEG decode: a batch of {} samples; it must have 1..{}", n,
                            cuda_kernels::max_samples));
  FERRY_EXPECTS(b.lengths.size() == n && b.boxes.size() == n,
                fmt::format("GPU JPEG decode: {} samples but {} lengths and {} boxes", n, b.lengths.size(),
                            b.boxes.size()));
  FERRY_EXPECTS(b.status.empty() || b.status.size() == n,
                fmt::format("GPU JPEG decode: {} samples but {} status entries", n, b.status.size()));
  FERRY_EXPECTS(b.size >= 1 && b.size <= max_output_size,
                fmt::format("GPU JPEG decode: size = {}; it must be 1..{}", b.size, max_output_size));
  static_cast<void>(element_bytes(b.dtype));
  FERRY_EXPECTS(
      b.layout == pixel_layout::chw || b.layout == pixel_layout::hwc,
      fmt::format("GPU JPEG decode: layout {} is not NCHW (0) or NHWC (1)", static_cast<int>(b.layout)));
  FERRY_EXPECTS(b.out != nullptr, "GPU JPEG decode: the output pointer is NULL");
  if (b.dtype != output_dtype::uint8) {
    for (int c = 0; c < 3; ++c) {
      FERRY_EXPECTS(
          std::isfinite(b.mean[c]) && std::isfinite(b.std[c]) && b.std[c] > 0.0F,
          fmt::format("GPU JPEG decode: mean[{}] = {} and std[{}] = {}; both must be finite and std "
                      "> 0",
                      c, b.mean[c], c, b.std[c]));
    }
  }
  FERRY_EXPECTS(&consumer.dev() == dev, "GPU JPEG decode: the consumer stream belongs to another device");
  for (std::size_t i = 0; i < n; ++i) {
    FERRY_EXPECTS(b.data[i] != nullptr && b.lengths[i] > 0,
                  fmt::format("GPU JPEG decode: sample {} has {} bytes at {}", i, b.lengths[i], b.data[i]));
  }
}

void gpu_jpeg_decoder::impl::reserve(scratch_set& set, std::size_t plane_bytes, std::size_t samples) {
  const bool planes_small = set.planes.empty() || set.planes.size() < plane_bytes;
  const bool table_small = set.table_capacity < samples;
  if (!planes_small && !table_small) return;
  // The buffers about to be freed may still be read by the set's last kernel (its table and planes); the
  // host-side table and the last decode were waited for by the caller.
  if (set.consumed.recorded()) set.consumed.synchronize();
  if (planes_small) {
    const std::size_t grown =
        set.planes.empty() ? plane_bytes : std::max(plane_bytes, set.planes.size() / 2 * 3);
    set.planes = buffer();
    set.planes = dev->alloc_device(round_up(grown, plane_alignment));
    ++count.grows;
  }
  if (table_small) {
    const std::size_t capacity = std::max(samples, set.table_capacity * 2);
    set.table = buffer();
    set.table_host = buffer();
    set.table = dev->alloc_device(capacity * sizeof(sample_desc));
    set.table_host = dev->alloc_pinned(capacity * sizeof(sample_desc));
    set.table_capacity = capacity;
  }
}

sample_plan gpu_jpeg_decoder::impl::plan(const gpu_decode_batch& b, std::size_t i, const lane& l) const {
  shim::nvjpeg_jpeg_stream const parsed = l.parsed;
  shim::nvjpeg_handle const handle = l.handle;  // this part's (struct lane)
  sample_plan p;
  const jpeg_info info = read_jpeg_info({static_cast<const std::byte*>(b.data[i]), b.lengths[i]});
  if (const char* why = undecodable_reason(info); why != nullptr) {
    p.status = sample_status::undecodable;
    p.problem = why;
    return p;
  }
  try {
    validate(b.boxes[i], info.height, info.width);
  } catch (const std::logic_error& e) {
    p.bad_box = true;
    p.problem = e.what();
    return p;
  }
  // nvJPEG parses the header once: its frame size must be the one the planes are sized for, and the
  // hardware engines' check reads the parsed stream.
  const auto* const data = static_cast<const unsigned char*>(b.data[i]);
  unsigned width = 0;
  unsigned height = 0;
  unsigned components = 0;
  nvjpeg_status s = api->jpeg_stream_parse_header(handle, data, b.lengths[i], parsed);
  const char* call = "nvjpegJpegStreamParseHeader";
  if (s == shim::nvjpeg_success) {
    s = api->jpeg_stream_get_frame_dimensions(parsed, &width, &height);
    call = "nvjpegJpegStreamGetFrameDimensions";
  }
  if (s == shim::nvjpeg_success) {
    s = api->jpeg_stream_get_components_num(parsed, &components);
    call = "nvjpegJpegStreamGetComponentsNum";
  }
  if (s != shim::nvjpeg_success) {
    p.status = sample_status::failed;
    p.problem = fmt::format("{} failed: {}", call, shim::nvjpeg_api::error_string(s));
    return p;
  }
  if (std::cmp_not_equal(width, info.width) || std::cmp_not_equal(height, info.height)) {
    p.status = sample_status::failed;
    p.problem = fmt::format("nvJPEG reads it as {}x{}, its frame header says {}x{} (width x height)", width,
                            height, info.width, info.height);
    return p;
  }
  p.height = info.height;
  p.width = info.width;
  p.channels = components == 1 ? 1 : 3;
  if (p.channels == 1) {
    p.how = route::single_y;
    p.why_single = single_reason::grayscale;
  } else if (info.progressive()) {
    p.how = route::single_rgb;
    p.why_single = single_reason::progressive;
  } else if (hardware) {
    int unsupported = 1;
    if (api->decode_batched_supported(handle, parsed, &unsupported) == shim::nvjpeg_success &&
        unsupported == 0) {
      p.how = route::hardware;
    } else {
      p.how = route::single_rgb;
      p.why_single = single_reason::unsupported;
    }
  } else {
    p.how = route::single_rgb;
  }
  return p;
}

part_result gpu_jpeg_decoder::impl::decode_part(const gpu_decode_batch& b, std::vector<sample_plan>& plans,
                                                std::size_t first, std::size_t last, part_states& states,
                                                const lane& l, unsigned char* base) const {
  make_current(dev->ordinal());
  auto* const native = static_cast<cudaStream_t>(l.work.view().native());
  shim::nvjpeg_handle const handle = l.handle;  // this part's (struct lane)
  const auto bytes_of = [&](std::size_t i) { return static_cast<const unsigned char*>(b.data[i]); };
  part_result r;
  // The hardware engines: every sample of the part they take, in one call. If they refuse the part, its
  // samples are decoded one by one below.
  std::vector<std::size_t> hw;
  for (std::size_t i = first; i < last; ++i)
    if (plans[i].how == route::hardware) hw.push_back(i);
  if (!hw.empty()) {
    const int count_hw = static_cast<int>(hw.size());
    nvjpeg_status s = shim::nvjpeg_success;
    if (states.hw_batch != count_hw) {
      s = api->decode_batched_initialize(handle, states.hw_state, count_hw, 1,
                                         shim::nvjpeg_output_format::rgb);
      states.hw_batch = s == shim::nvjpeg_success ? count_hw : -1;
    }
    if (s == shim::nvjpeg_success) {
      std::vector<const unsigned char*> ptrs;
      std::vector<std::size_t> lens;
      std::vector<shim::nvjpeg_image> images;
      for (const std::size_t i : hw) {
        ptrs.push_back(bytes_of(i));
        lens.push_back(b.lengths[i]);
        images.push_back(image_of(plans[i], base));
      }
      s = api->decode_batched(handle, states.hw_state, ptrs.data(), lens.data(), images.data(), native);
    }
    if (s == shim::nvjpeg_success) {
      r.hardware = hw.size();
    } else {
      states.hw_batch = -1;  // nvJPEG: a failed batch needs nvjpegDecodeBatchedInitialize again
      r.hardware_refused = hw.size();
      for (const std::size_t i : hw) plans[i].how = route::single_rgb;
    }
  }
  // One by one: progressive, grayscale and what the engines do not take.
  for (std::size_t i = first; i < last; ++i) {
    sample_plan& p = plans[i];
    if (p.how != route::single_rgb && p.how != route::single_y) continue;
    shim::nvjpeg_image img = image_of(p, base);
    const auto format =
        p.how == route::single_y ? shim::nvjpeg_output_format::y : shim::nvjpeg_output_format::rgb;
    const nvjpeg_status s =
        api->decode(handle, states.sw_state, bytes_of(i), b.lengths[i], format, &img, native);
    if (s != shim::nvjpeg_success) {
      p.problem = "nvjpegDecode failed: " + shim::nvjpeg_api::error_string(s);
      r.failed.push_back(i);
      continue;
    }
    ++r.single;
  }
  return r;
}

void gpu_jpeg_decoder::impl::decode(const gpu_decode_batch& b, stream_view consumer, event* inputs_done) {
  const auto started = std::chrono::steady_clock::now();
  check(b, consumer);
  const std::size_t n = b.data.size();
  const bool with_status = !b.status.empty();
  if (with_status) std::fill(b.status.begin(), b.status.end(), static_cast<std::int32_t>(sample_status::ok));
  std::vector<sample_plan> plans(n);
  std::uint64_t refused_undecodable = 0;
  std::uint64_t refused_failed = 0;
  const auto refuse = [&](std::size_t i, sample_status why) {
    plans[i].how = route::none;
    plans[i].channels = 0;
    if (!with_status)
      throw input_error(fmt::format("GPU JPEG decode: sample {} of the batch: {}", i, plans[i].problem));
    b.status[i] = static_cast<std::int32_t>(why);
    ++(why == sample_status::undecodable ? refused_undecodable : refused_failed);
  };
  // The batch in contiguous parts, one per thread (Note [GPU decode: streams, events and buffers]).
  const std::size_t parts = std::clamp<std::size_t>(n / min_part_samples, 1, pool->threads());
  const auto first_of = [&](std::size_t k) { return n * k / parts; };

  // 1. The headers, on the host: what each sample is and how it is decoded. Nothing is queued yet, so a
  //    refusal here leaves no work behind; the first sample refused (in the batch's order) is the one named.
  make_current(dev->ordinal());
  rethrow_first(pool->run(parts, [&](std::size_t k) {
    make_current(dev->ordinal());
    for (std::size_t i = first_of(k); i < first_of(k + 1); ++i) plans[i] = plan(b, i, lanes[k]);
  }));
  std::uint64_t n_progressive = 0;
  std::uint64_t n_gray = 0;
  std::uint64_t n_unsupported = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const sample_plan& p = plans[i];
    if (p.bad_box) throw logic_error(fmt::format("GPU JPEG decode: sample {}: {}", i, p.problem));
    if (p.status != sample_status::ok) refuse(i, p.status);
    n_progressive += p.why_single == single_reason::progressive ? 1 : 0;
    n_gray += p.why_single == single_reason::grayscale ? 1 : 0;
    n_unsupported += p.why_single == single_reason::unsupported ? 1 : 0;
  }

  // 2. The set, once the host saw its previous decode complete (its pinned table and nvJPEG states are
  //    about to be reused), grown to this batch's planes.
  const std::size_t set_index = next_batch % sets.size();
  scratch_set& set = sets[set_index];
  if (set.decoded.recorded()) set.decoded.synchronize();
  std::size_t total = 0;
  for (sample_plan& p : plans) {
    if (p.how == route::none) continue;
    p.pitch = round_up(static_cast<std::size_t>(p.width), pitch_alignment);
    p.plane_bytes = round_up(p.pitch * static_cast<std::size_t>(p.height), plane_alignment);
    p.offset = total;
    total += p.plane_bytes * static_cast<std::size_t>(p.channels);
  }
  reserve(set, std::max<std::size_t>(total, plane_alignment), n);
  ++next_batch;
  has_last = false;
  const stream_view ds = decode_stream.view();
  // The planes and the device table are rewritten only after the set's last kernel read them: in stream
  // order for nvjpegDecode and the table's copy, but on the host before the hardware engines, which start
  // writing when nvjpegDecodeBatched is called whatever the stream waits for (Note [GPU decode: streams,
  // events and buffers]).
  const bool any_hardware =
      std::any_of(plans.begin(), plans.end(), [](const sample_plan& p) { return p.how == route::hardware; });
  if (set.consumed.recorded()) {
    if (any_hardware) set.consumed.synchronize();
    ds.wait(set.consumed);
    for (std::size_t k = 0; k < parts; ++k) lanes[k].work.wait(set.consumed);
  }
  auto* const base = static_cast<unsigned char*>(set.planes.data());

  std::vector<part_result> results(parts);
  // Work is queued on the parts' streams from here. A failure joins them into the decode stream and waits
  // for it before rethrowing (so that no host byte of a failed call is read after it returns), and records
  // the set's decode event after it (so that the set's next use and reserve()'s frees wait for it too).
  try {
    // 3. Each part's samples: the hardware engines' in one call, then the others one by one, on the part's
    //    stream with the set's states of that part; then every part's stream joins the decode stream.
    const std::vector<std::exception_ptr> errors = pool->run(parts, [&](std::size_t k) {
      results[k] = decode_part(b, plans, first_of(k), first_of(k + 1), set.parts[k], lanes[k], base);
    });
    for (std::size_t k = 0; k < parts; ++k) {
      lanes[k].done.record(lanes[k].work.view());
      ds.wait(lanes[k].done);
    }
    rethrow_first(errors);
    for (const part_result& r : results)
      for (const std::size_t i : r.failed) refuse(i, sample_status::failed);

    // 4. The kernel's table, copied on the decode stream after the decodes; then the decode is complete.
    auto* const table = reinterpret_cast<sample_desc*>(set.table_host.host_bytes());
    for (std::size_t i = 0; i < n; ++i) {
      const sample_plan& p = plans[i];
      sample_desc d{};
      if (p.how != route::none) {
        const crop_box& box = b.boxes[i];
        d.planes = base + p.offset;
        d.plane_bytes = p.plane_bytes;
        d.pitch = static_cast<std::int32_t>(p.pitch);
        d.channels = p.channels;
        d.top = box.top;
        d.left = box.left;
        d.height = box.height;
        d.width = box.width;
        d.flip = box.flip;
      }
      table[i] = d;
    }
    dev->copy_async(set.table.view(), set.table_host.view(), n * sizeof(sample_desc), ds);
    set.decoded.record(ds);
    if (inputs_done != nullptr) {
      *inputs_done = dev->make_event();
      inputs_done->record(ds);
    }

    // 5. The output, on the consumer stream only, after the decode.
    consumer.wait(set.decoded);
    cuda_kernels::output_desc o;
    o.out = b.out;
    o.size = b.size;
    o.dtype = static_cast<std::int32_t>(b.dtype);
    o.layout = static_cast<std::int32_t>(b.layout);
    for (int c = 0; c < 3; ++c) {
      o.mean[c] = b.mean[c];
      o.std[c] = b.std[c];
    }
    FERRY_CUDA_TRY(cuda_kernels::launch_crop_resize(static_cast<const sample_desc*>(set.table.data()),
                                                    static_cast<std::uint32_t>(n), o,
                                                    static_cast<cudaStream_t>(consumer.native())));
    set.consumed.record(consumer);
  } catch (...) {
    try {
      for (std::size_t k = 0; k < parts; ++k) {
        lanes[k].done.record(lanes[k].work.view());
        ds.wait(lanes[k].done);
      }
      set.decoded.record(ds);
      ds.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first failure is the one to report
    }
    throw;
  }

  last_set = set_index;
  last_plans = std::move(plans);
  has_last = true;
  ++count.batches;
  count.images += n;
  for (const part_result& r : results) {
    count.hardware += r.hardware;
    count.hardware_refused += r.hardware_refused;
    count.single += r.single;
  }
  count.single_progressive += n_progressive;
  count.single_grayscale += n_gray;
  count.single_unsupported += n_unsupported;
  count.undecodable += refused_undecodable;
  count.failed += refused_failed;
  count.host_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

gpu_jpeg_decoder::gpu_jpeg_decoder(device& dev, const gpu_decoder_options& options)
    : impl_(std::make_unique<impl>(dev, options)) {}

gpu_jpeg_decoder::~gpu_jpeg_decoder() = default;
gpu_jpeg_decoder::gpu_jpeg_decoder(gpu_jpeg_decoder&&) noexcept = default;
gpu_jpeg_decoder& gpu_jpeg_decoder::operator=(gpu_jpeg_decoder&&) noexcept = default;

void gpu_jpeg_decoder::decode(const gpu_decode_batch& batch, stream_view consumer, event* inputs_done) {
  FERRY_EXPECTS(impl_ != nullptr, "GPU JPEG decode on a moved-from decoder");
  const std::lock_guard lock(impl_->mu);
  impl_->decode(batch, consumer, inputs_done);
}

decoded_image gpu_jpeg_decoder::last_image(std::size_t index, std::span<std::uint8_t> host) {
  FERRY_EXPECTS(impl_ != nullptr, "last_image on a moved-from decoder");
  impl& d = *impl_;
  const std::lock_guard lock(d.mu);
  FERRY_EXPECTS(d.has_last, "last_image: no batch was decoded (or the last one failed)");
  FERRY_EXPECTS(index < d.last_plans.size(),
                fmt::format("last_image: sample {} of a batch of {}", index, d.last_plans.size()));
  const sample_plan& p = d.last_plans[index];
  decoded_image out{p.height, p.width, p.how == route::none ? 0 : p.channels};
  const std::size_t dense = static_cast<std::size_t>(out.channels) * static_cast<std::size_t>(out.height) *
                            static_cast<std::size_t>(out.width);
  if (host.empty() || out.channels == 0) return out;
  FERRY_EXPECTS(host.size() >= dense, fmt::format("last_image: sample {} needs {} bytes, the buffer has {}",
                                                  index, dense, host.size()));
  scratch_set& set = d.sets[d.last_set];
  make_current(d.dev->ordinal());
  set.decoded.synchronize();
  const auto* src = static_cast<const unsigned char*>(set.planes.data()) + p.offset;
  // On the decode stream (never the legacy default stream), into pageable memory: returns when copied.
  auto* const ds = static_cast<cudaStream_t>(d.decode_stream.view().native());
  const auto w = static_cast<std::size_t>(out.width);
  const auto h = static_cast<std::size_t>(out.height);
  for (int c = 0; c < out.channels; ++c) {
    const auto plane = static_cast<std::size_t>(c);
    FERRY_CUDA_TRY(cudaMemcpy2DAsync(host.data() + plane * h * w, w, src + plane * p.plane_bytes, p.pitch, w,
                                     h, cudaMemcpyDeviceToHost, ds));
  }
  FERRY_CUDA_TRY(cudaStreamSynchronize(ds));
  return out;
}

std::string gpu_jpeg_decoder::stats_json() const {
  FERRY_EXPECTS(impl_ != nullptr, "stats_json on a moved-from decoder");
  const impl& d = *impl_;
  const std::lock_guard lock(d.mu);
  std::size_t scratch = 0;
  for (const scratch_set& s : d.sets) scratch += s.planes.empty() ? 0 : s.planes.size();
  const counters& c = d.count;
  nlohmann::json j = {
      {"library", d.api->library.path()},
      {"version", d.api->version_string()},
      {"backend", d.hardware ? "hardware" : "software"},
      {"hardware_absent", d.hardware_absent},
      {"hardware_engines", d.engines},
      {"hardware_cores_per_engine", d.cores_per_engine},
      {"buffers", d.sets.size()},
      {"threads", d.lanes.size()},
      {"batches", c.batches},
      {"images", c.images},
      {"hardware_images", c.hardware},
      {"single_images", c.single},
      {"single_progressive", c.single_progressive},
      {"single_grayscale", c.single_grayscale},
      {"single_unsupported", c.single_unsupported},
      {"hardware_refused", c.hardware_refused},
      {"undecodable", c.undecodable},
      {"failed", c.failed},
      {"scratch_bytes", scratch},
      {"scratch_grows", c.grows},
      {"host_seconds", c.host_seconds},
  };
  return j.dump();
}

}  // namespace ferry::image
