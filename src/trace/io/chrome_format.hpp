// What ferry's Chrome trace writer and reader agree on (private to ferry::trace).
#pragma once

namespace ferry::trace::detail {

/// The version written in the top-level "ferry" object; the reader refuses newer ones.
inline constexpr int format_version = 1;

}  // namespace ferry::trace::detail
