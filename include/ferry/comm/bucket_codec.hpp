// ferry::comm bucket codecs: how one bucket of a plan travels, as one open interface (PyTorch c10d's
// comm hook is the model).
//
// A bucket_codec is made once per bucket of a plan, when the plan takes effect, and runs that bucket's
// whole exchange on the communication stream each step: the element-wise codecs (none, fp16, bf16;
// codec.hpp) encode into a wire buffer, all-reduce it and decode it back; PowerSGD (powersgd.hpp) runs
// its two all-reduces and keeps its error feedback and warm-start Q in its codec object between steps.
// The reducer knows nothing else of a codec: it lends every bucket's codec one shared scratch buffer (the
// buckets run one after another on the communication stream, so they never use it at once) of the
// largest scratch_bytes() among them, and marks timing around the call.
//
// Codecs are registered, keyed by codec_kind (the identifier that plans, the broadcast plan words, the C
// ABI and the CLI use) and by name. The built-in codecs are one table of src/comm/codec_registry.cpp, each
// implemented in its own file; a new codec is one new file and one line of that table, or, outside the
// library, one register_codec call before the reducers that use it are made (a test does so). The reducer,
// the automatic plan's candidates (entries marked `automatic`), parse_codec and to_string read the
// registry and need no edit.
//
// Threads: register_codec and the look-ups below take one lock and may be called from any thread;
// entries are never removed, so the references and names they hand out stay valid for the program's life.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/comm/codec.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/powersgd.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

/// What a codec's factory gets for one bucket of a plan. The spans are valid during the call only.
struct bucket_setup {
  codec_kind kind;                       // the codec being made
  communicator& comm;                    // the group; it outlives the codec
  std::size_t elements = 0;              // 4-byte slots of the bucket (padding included): its f32 elements
  std::span<const matrix_shape> shapes;  // the bucket's parameters, in the bucket's order
  std::span<const std::size_t> offsets;  // their element offsets within the bucket
  const powersgd_options& powersgd;      // options of the codecs that take some (reducer_options)
  /// The gradients' type (reducer_options::grad_type) and the type none averages them in. A codec other
  /// than none is made for f32 gradients only (make_bucket_codec refuses the others).
  dtype grad = dtype::f32;
  dtype reduce = dtype::f32;
};

/// The timing points a codec marks on the communication stream around its all-reduce(s) (bucket_timing's
/// reduce_start/reduce_end). Without timing both are null and the calls do nothing.
class reduce_marks {
 public:
  reduce_marks() = default;
  reduce_marks(event* start, event* end) noexcept : start_(start), end_(end) {}
  /// Records the start of the codec's (first) all-reduce on `s`.
  void reduce_start(stream_view s);
  /// Records the end of the codec's (last) all-reduce on `s`.
  void reduce_end(stream_view s);
  [[nodiscard]] bool started() const noexcept { return started_; }
  [[nodiscard]] bool ended() const noexcept { return ended_; }

 private:
  event* start_ = nullptr;
  event* end_ = nullptr;
  bool started_ = false;
  bool ended_ = false;
};

/// One bucket's exchange. See the header's comment.
class bucket_codec {
 public:
  explicit bucket_codec(codec_kind kind) noexcept : kind_(kind) {}
  bucket_codec(const bucket_codec&) = delete;
  bucket_codec& operator=(const bucket_codec&) = delete;
  /// Codecs whose queued work points at them wait for it here; never throws.
  virtual ~bucket_codec() = default;

  /// Replaces `bucket` (setup.elements fp32 values, device memory of the communicator's device) with the
  /// average over ranks (exact for none, approximate for lossy codecs), on `s` (the communication stream),
  /// without blocking the host or allocating. `scratch` holds at least scratch_bytes() and may be shared
  /// with other buckets' codecs, which run before or after on `s`. Every rank calls it in the same
  /// collective order. Throws logic_error before queuing work on misuse; comm_error from a collective.
  virtual void reduce_async(mem_view bucket, mem_view scratch, stream_view s, reduce_marks& marks) = 0;
  /// Bytes this rank hands to its all-reduce(s) per reduce_async (the stats' wire_bytes).
  [[nodiscard]] virtual std::size_t wire_bytes() const noexcept = 0;
  /// Bytes of the reducer's shared scratch the codec needs (0: none).
  [[nodiscard]] virtual std::size_t scratch_bytes() const noexcept { return 0; }
  /// State a codec keeps between steps in the bucket's layout (PowerSGD's error feedback); an empty view
  /// for stateless codecs. Read it after the stream passed the reduce that wrote it.
  [[nodiscard]] virtual mem_view error_feedback() const noexcept { return {}; }

  [[nodiscard]] codec_kind kind() const noexcept { return kind_; }
  /// Whether the codec loses precision (the registry's entry).
  [[nodiscard]] bool lossy() const noexcept { return comm::lossy(kind_); }

 private:
  codec_kind kind_;
};

/// An element-wise codec's parts: encode (fp32 bucket -> wire, scaled by 1/world_size), an all-reduce
/// (sum) of `wire` elements, decode (wire -> fp32 bucket). The registry makes its bucket codec from them,
/// and the automatic plan measures and models them.
struct elementwise_parts {
  dtype wire = dtype::f32;
  std::function<void(mem_view bucket, mem_view wire, std::size_t count, int world_size, stream_view s)>
      encode;
  std::function<void(mem_view wire, mem_view bucket, std::size_t count, stream_view s)> decode;
};

using codec_factory = std::function<std::unique_ptr<bucket_codec>(const bucket_setup&)>;

/// A registered codec.
struct codec_entry {
  std::string name;                  // what parse_codec reads and to_string writes
  std::vector<std::string> aliases;  // other names parse_codec reads
  bool lossy = true;                 // a caller must allow it explicitly
  /// A candidate of the automatic plan (under its lossy policy when lossy); needs `elementwise`.
  bool automatic = false;
  std::optional<elementwise_parts> elementwise;
  /// Makes the codec of one bucket; empty for an element-wise codec made from `elementwise`.
  codec_factory make;
};

/// Registers `entry` under the next free codec_kind value and returns it. Throws logic_error for an empty
/// name, a name or alias already registered, neither a factory nor element-wise parts (or parts without
/// encode and decode), `automatic` without element-wise parts, or when all 256 values are taken.
codec_kind register_codec(codec_entry entry);
/// Whether `c` names a registered codec.
[[nodiscard]] bool registered(codec_kind c) noexcept;
/// The entry of `c`. Throws logic_error when `c` is not registered.
[[nodiscard]] const codec_entry& codec_info(codec_kind c);
/// Every registered codec, in codec_kind order.
[[nodiscard]] std::vector<codec_kind> registered_codecs();
/// The automatic plan's candidates (entries marked automatic), in registration order.
[[nodiscard]] std::vector<codec_kind> automatic_codecs();
/// Makes the bucket codec of setup.kind. Throws logic_error when it is not registered, when a codec other
/// than none is asked for 16-bit gradients, or what the codec's factory throws.
[[nodiscard]] std::unique_ptr<bucket_codec> make_bucket_codec(const bucket_setup& setup);

}  // namespace ferry::comm
