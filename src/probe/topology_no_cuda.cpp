// The GPU part of ferry probe --topology in builds without CUDA: no GPUs, the host part only.
#include "ferry/probe/topology.hpp"

namespace ferry::probe::detail {

void discover_gpus(topology& t, const topology_options& /*opts*/, void (*/*progress*/)(const std::string&)) {
  t.gpu_note = "ferry was built without CUDA (FERRY_WITH_CUDA=OFF or no CUDA compiler)";
}

}  // namespace ferry::probe::detail
