// ferry::comm PowerSGD as a bucket codec (bucket_codec.hpp): codec_kind::powersgd makes, per bucket, a
// codec that owns the bucket's powersgd object (powersgd.hpp: its error feedback and warm-start Q) for as
// long as the bucket keeps that codec.
#pragma once

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/powersgd.hpp"

namespace ferry::comm {

/// The PowerSGD state of a bucket codec (its matrices' compression, its error feedback), or nullptr when
/// `c` is not PowerSGD's. Valid as long as `c` is.
[[nodiscard]] const powersgd* powersgd_state(const bucket_codec& c) noexcept;

}  // namespace ferry::comm
