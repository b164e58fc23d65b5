// The GPU part of ferry probe --topology in builds without CUDA: no GPUs, the host part only.
#include "ferry/probe/topology.hpp"

namespace ferry::probe::detail {

void discover_gpus(topology& t, const topology_options& /*opts*/, const progress_fn& /*progress*/) {
  t.gpu_note = "ferry was built without CUDA (FERRY_WITH_CUDA=OFF or no CUDA compiler)";
}

}  // namespace ferry::probe::detail
