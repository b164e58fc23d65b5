// ferry::comm codec_cache: stateless bucket codecs made once per codec and bucket size, for a caller that
// reduces loose buckets rather than a reducer's plan (the C ABI's ferry_comm_all_reduce_mean, which DDP's
// comm hook calls once per bucket per step). See docs/COMM.md, Note [Loose buckets reuse their codec].
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/communicator.hpp"

namespace ferry::comm {

/// Up to `capacity` stateless codecs over one communicator, keyed by codec and bucket size. Not
/// thread-safe: its owner serialises the calls (as it must serialise the codecs' use of one scratch).
class codec_cache {
 public:
  /// Codecs over `comm`, which must outlive the cache. Throws logic_error for a capacity of 0.
  explicit codec_cache(communicator& comm, std::size_t capacity = 64);
  codec_cache(const codec_cache&) = delete;
  codec_cache& operator=(const codec_cache&) = delete;

  /// The codec of `kind` for buckets of `elements` f32 values, made (make_bucket_codec, f32 gradients,
  /// the entry's options) at the first call for that pair; when `capacity` codecs are kept already, the
  /// cache is emptied first. Valid until the next call. Throws logic_error when `kind` is not registered
  /// or not stateless (naming it and the stateless codecs), or what make_bucket_codec throws (the cache
  /// is unchanged then).
  [[nodiscard]] bucket_codec& get(codec_kind kind, std::size_t elements);
  /// Codecs kept.
  [[nodiscard]] std::size_t size() const noexcept { return codecs_.size(); }
  /// Codecs made since construction (a call that found its codec made none).
  [[nodiscard]] std::size_t made() const noexcept { return made_; }

 private:
  struct kept {
    codec_kind kind;
    std::size_t elements;
    std::unique_ptr<bucket_codec> codec;
  };

  communicator* comm_;
  std::size_t capacity_;
  std::vector<kept> codecs_;
  std::size_t made_ = 0;
};

}  // namespace ferry::comm
