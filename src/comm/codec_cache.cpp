// codec_cache (codec_cache.hpp): a short list searched in order; a DDP model has a few bucket sizes.
#include "ferry/comm/codec_cache.hpp"

#include <fmt/format.h>

#include "ferry/core/error.hpp"

namespace ferry::comm {

codec_cache::codec_cache(communicator& comm, std::size_t capacity) : comm_(&comm), capacity_(capacity) {
  FERRY_EXPECTS(capacity > 0, "codec_cache of capacity 0: it must keep at least one codec");
  codecs_.reserve(capacity);
}

bucket_codec& codec_cache::get(codec_kind kind, std::size_t elements) {
  for (const kept& k : codecs_) {
    if (k.kind == kind && k.elements == elements) return *k.codec;
  }
  FERRY_EXPECTS(registered(kind),
                fmt::format("codec {} is not registered (register_codec)", static_cast<int>(kind)));
  FERRY_EXPECTS(stateless(kind),
                fmt::format("codec {} keeps state between steps (per bucket of a reducer's plan), so one "
                            "object cannot serve loose buckets; it runs in the reducer (the stateless "
                            "codecs: {})",
                            to_string(kind), codec_names(stateless)));
  std::unique_ptr<bucket_codec> made = make_bucket_codec({kind, *comm_, elements, {}, {}});
  if (codecs_.size() == capacity_) codecs_.clear();
  codecs_.push_back({kind, elements, std::move(made)});
  ++made_;
  return *codecs_.back().codec;
}

}  // namespace ferry::comm
