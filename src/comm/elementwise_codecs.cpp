// The element-wise bucket codecs: none (the exact average, in place or widened to f32) and any codec given as
// element-wise parts (encode into the reducer's scratch, all-reduce with sum, decode), fp16 and bf16 among
// them over codec.hpp's encode_async/decode_async.
#include <fmt/format.h>

#include <memory>
#include <utility>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm {

void reduce_marks::reduce_start(stream_view s) {
  if (start_ != nullptr) start_->record(s);
  started_ = true;
}

void reduce_marks::reduce_end(stream_view s) {
  if (end_ != nullptr) end_->record(s);
  ended_ = true;
}

namespace {

// none: the exact average. f32 and 16-bit gradients averaged in place in their own type (reduce_op::avg,
// no wire buffer); 16-bit gradients with reduce f32 widened into the scratch, averaged in f32 and rounded
// back once (codec.hpp's decode and encode of that type, the latter saturating as the codecs do).
class plain_codec final : public bucket_codec {
 public:
  explicit plain_codec(const bucket_setup& setup)
      : bucket_codec(setup.kind),
        comm_(&setup.comm),
        grad_(setup.grad),
        reduce_(setup.reduce),
        count_(setup.elements * sizeof(float) / size_of(setup.grad)) {
    FERRY_EXPECTS(
        grad_ == reduce_ || (reduce_ == dtype::f32 && (grad_ == dtype::bf16 || grad_ == dtype::f16)),
        fmt::format("codec none: {} gradients averaged in {}; expected their own type, or f32 for "
                    "bf16 and f16 gradients",
                    to_string(grad_), to_string(reduce_)));
  }

  void reduce_async(mem_view bucket, mem_view scratch, stream_view s, reduce_marks& marks) override {
    if (grad_ == reduce_) {
      marks.reduce_start(s);
      static_cast<void>(comm_->all_reduce(bucket, bucket, count_, grad_, reduce_op::avg, s));
      marks.reduce_end(s);
      return;
    }
    FERRY_EXPECTS(scratch.bytes >= scratch_bytes(),
                  fmt::format("codec none: a scratch of {} bytes cannot hold the bucket's {} f32 values ({} "
                              "bytes)",
                              scratch.bytes, count_, scratch_bytes()));
    const codec_kind half = grad_ == dtype::f16 ? codec_kind::fp16 : codec_kind::bf16;
    const mem_view wide = scratch.subview(0, scratch_bytes());
    decode_async(half, bucket, wide, count_, s);
    marks.reduce_start(s);
    static_cast<void>(comm_->all_reduce(wide, wide, count_, dtype::f32, reduce_op::avg, s));
    marks.reduce_end(s);
    encode_async(half, wide, bucket, count_, 1, s);
  }
  [[nodiscard]] std::size_t wire_bytes() const noexcept override { return count_ * size_of(reduce_); }
  [[nodiscard]] std::size_t scratch_bytes() const noexcept override {
    return grad_ == reduce_ ? 0 : count_ * sizeof(float);
  }

 private:
  communicator* comm_;
  dtype grad_;
  dtype reduce_;
  std::size_t count_;  // elements of grad_
};

// Encode into the scratch, all-reduce it with sum, decode: the bucket then holds the mean over ranks.
class elementwise_codec final : public bucket_codec {
 public:
  elementwise_codec(const bucket_setup& setup, const elementwise_parts& parts)
      : bucket_codec(setup.kind),
        comm_(&setup.comm),
        elements_(setup.elements),
        parts_(&parts),
        wire_bytes_(setup.elements * size_of(parts.wire)) {}

  void reduce_async(mem_view bucket, mem_view scratch, stream_view s, reduce_marks& marks) override {
    FERRY_EXPECTS(scratch.bytes >= wire_bytes_,
                  fmt::format("codec {}: a scratch of {} bytes cannot hold the bucket's {} wire bytes",
                              to_string(kind()), scratch.bytes, wire_bytes_));
    const mem_view wire = scratch.subview(0, wire_bytes_);
    parts_->encode(bucket, wire, elements_, comm_->size(), s);
    marks.reduce_start(s);
    static_cast<void>(comm_->all_reduce(wire, wire, elements_, parts_->wire, reduce_op::sum, s));
    marks.reduce_end(s);
    parts_->decode(wire, bucket, elements_, s);
  }
  [[nodiscard]] std::size_t wire_bytes() const noexcept override { return wire_bytes_; }
  [[nodiscard]] std::size_t scratch_bytes() const noexcept override { return wire_bytes_; }

 private:
  communicator* comm_;
  std::size_t elements_;
  const elementwise_parts* parts_;  // the registry's entry: never removed
  std::size_t wire_bytes_;
};

// encode_async/decode_async of one of codec.hpp's element-wise codecs.
template <codec_kind C>
elementwise_parts table_parts() {
  return elementwise_parts{wire_type(C),
                           [](mem_view bucket, mem_view wire, std::size_t count, int world_size,
                              stream_view s) { encode_async(C, bucket, wire, count, world_size, s); },
                           [](mem_view wire, mem_view bucket, std::size_t count, stream_view s) {
                             decode_async(C, wire, bucket, count, s);
                           }};
}

}  // namespace

namespace detail {

std::unique_ptr<bucket_codec> make_elementwise_codec(const bucket_setup& setup,
                                                     const elementwise_parts& parts) {
  return std::make_unique<elementwise_codec>(setup, parts);
}

codec_entry none_codec_entry() {
  codec_entry e;
  e.name = "none";
  e.aliases = {"fp32", "f32"};
  e.lossy = false;
  e.stateless = true;
  e.make = [](const bucket_setup& setup) { return std::make_unique<plain_codec>(setup); };
  return e;
}

codec_entry fp16_codec_entry() {
  codec_entry e;
  e.name = "fp16";
  e.aliases = {"f16", "half"};
  e.automatic = true;
  e.elementwise = table_parts<codec_kind::fp16>();
  return e;
}

codec_entry bf16_codec_entry() {
  codec_entry e;
  e.name = "bf16";
  e.automatic = true;
  e.elementwise = table_parts<codec_kind::bf16>();
  return e;
}

}  // namespace detail
}  // namespace ferry::comm
