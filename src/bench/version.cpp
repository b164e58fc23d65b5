// The only file that includes the generated version header, so a new commit recompiles this file alone.
#include "ferry/bench/ladder.hpp"
#include "ferry_version.hpp"

namespace ferry::bench {

std::string_view ferry_version() noexcept { return FERRY_VERSION; }

}  // namespace ferry::bench
