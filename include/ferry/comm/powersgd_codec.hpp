// ferry::comm PowerSGD as a bucket codec (bucket_codec.hpp): powersgd_kind makes, per bucket, a codec that
// owns the bucket's powersgd object (powersgd.hpp: its error feedback and warm-start Q) for as long as the
// bucket keeps that codec. It is not stateless, takes powersgd_options (reducer_options::codec_options),
// and has no element-wise bound (docs/COMM.md, Note [PowerSGD is one more codec]).
#pragma once

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/powersgd.hpp"

namespace ferry::comm {

/// PowerSGD's codec_kind, registered as "powersgd"; a fixed value, since plans broadcast it.
inline constexpr codec_kind powersgd_kind{3};

/// The PowerSGD state of a bucket codec (its matrices' compression, its error feedback), or nullptr when
/// `c` is not PowerSGD's. Valid as long as `c` is.
[[nodiscard]] const powersgd* powersgd_state(const bucket_codec& c) noexcept;

}  // namespace ferry::comm
