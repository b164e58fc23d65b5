// ferry::comm bucket codecs: how one bucket of a plan travels, as one open interface (PyTorch c10d's
// comm hook is the model). The design and its reasons: docs/COMM.md, Note [Codecs are registry entries]
// and Note [One scratch for every bucket].
//
// A bucket_codec is made once per bucket of a plan, when the plan takes effect, and runs that bucket's
// whole exchange on the communication stream each step. Codecs are registered, keyed by codec_kind (the
// value that plans, the broadcast plan words, the C ABI and the CLI use) and by name; an entry carries
// everything a caller may ask of a codec (its factory, its options' defaults and check, whether it is
// lossy, stateless or a candidate of the automatic plan), so that no caller names a codec. The built-in
// codecs are one table of src/comm/codec_registry.cpp, each implemented in its own file; a new codec is
// one new file and one line of that table, or, outside the library, one register_codec call before the
// reducers that use it are made.
//
// Threads: register_codec and the look-ups below take one lock and may be called from any thread;
// entries are never removed, so the references and names they hand out stay valid for the program's life.
#pragma once

#include <any>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/comm/codec.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

/// The 2-D shape of a gradient as a codec sees it, a row-major rows x cols matrix (a 1-D tensor of n
/// elements is {n, 1}; a higher-dimensional one {first dimension, the product of the others}).
struct matrix_shape {
  std::size_t rows = 0;
  std::size_t cols = 0;
  [[nodiscard]] std::size_t elements() const noexcept { return rows * cols; }
};

/// What a codec's factory gets for one bucket of a plan. The spans and `options` are valid during the
/// call only.
struct bucket_setup {
  codec_kind kind;                       // the codec being made
  communicator& comm;                    // the group; it outlives the codec
  std::size_t elements = 0;              // 4-byte slots of the bucket (padding included): its f32 elements
  std::span<const matrix_shape> shapes;  // the bucket's parameters, in the bucket's order
  std::span<const std::size_t> offsets;  // their element offsets within the bucket
  /// The codec's options (a value of its entry's options type), or null for its entry's defaults;
  /// make_bucket_codec checks them and hands the factory the ones that apply, never null.
  const std::any* options = nullptr;
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
  /// for codecs that keep none there. Read it after the stream passed the reduce that wrote it.
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
  /// The codec keeps nothing between reduce_async calls and reads neither setup.shapes nor setup.offsets,
  /// so one object made for a bucket size serves every bucket of that size, in any order (codec_cache).
  /// Codecs made from `elementwise` are stateless whatever this says.
  bool stateless = false;
  /// The options the factory reads when its caller gives none (setup.options): a copyable value of the
  /// codec's own options type; empty for a codec that takes none. Options given must be of this type.
  std::any options;
  /// Throws logic_error, naming the field and its limit, for options of that type the codec cannot
  /// take; empty when every value is valid.
  std::function<void(const std::any& options)> check_options;
  /// The codec's options from named fields (numbers and booleans as doubles), the defaults for fields not
  /// named: how a caller without the options type gives them (the C ABI's "codec_options"). Throws
  /// logic_error naming a field the codec does not have; empty for a codec that takes no options.
  std::function<std::any(const std::vector<std::pair<std::string, double>>& fields)> options_from_fields;
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
/// Whether `c` is registered and stateless (codec_entry::stateless, or made from element-wise parts).
[[nodiscard]] bool stateless(codec_kind c) noexcept;
/// The registered codecs for which `has` holds, by name in codec_kind order ("none, fp16 and bf16"), for
/// messages that say what a caller takes.
[[nodiscard]] std::string codec_names(bool (*has)(codec_kind) noexcept);
/// Checks `options` for codec `c`: throws logic_error when c is not registered, takes no options, or
/// `options` are of another type than its entry's, or what its check_options throws.
void check_codec_options(codec_kind c, const std::any& options);
/// Makes the bucket codec of setup.kind. Throws logic_error when it is not registered, when a codec other
/// than none is asked for 16-bit gradients, for options check_codec_options refuses, or what the codec's
/// factory throws.
[[nodiscard]] std::unique_ptr<bucket_codec> make_bucket_codec(const bucket_setup& setup);

}  // namespace ferry::comm
