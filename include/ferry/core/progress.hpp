// Progress reporting for long operations (probes, benches): one line per step, for a human on stderr.
#pragma once

#include <functional>
#include <string>

namespace ferry {

/// Receives one line of progress per step. An empty function reports nothing. Called on the thread that
/// runs the operation.
using progress_fn = std::function<void(const std::string&)>;

}  // namespace ferry
