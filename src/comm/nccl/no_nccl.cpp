// ferry built without the CUDA toolkit: no NCCL backend. The functions exist and say so, so code above
// links the same way on every machine.
#include <string>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm {

bool nccl_available(std::string* reason) {
  if (reason != nullptr) *reason = "ferry was built without the CUDA toolkit, so without its NCCL backend";
  return false;
}

std::vector<std::unique_ptr<communicator>> make_nccl_group(std::span<device* const> /*devices*/,
                                                           const comm_options& /*options*/) {
  FERRY_EXPECTS(false,
                "make_nccl_group: ferry was built without the CUDA toolkit, so without its NCCL backend; use "
                "make_host_group, or rebuild ferry with the toolkit");
  return {};
}

std::vector<std::unique_ptr<communicator>> make_nccl_group(bootstrap& job,
                                                           std::span<device* const> /*devices*/,
                                                           const comm_options& /*options*/) {
  // Every process fails the same way; agreeing first keeps a job that mixes builds from waiting.
  agree_ready(
      job, "make_nccl_group",
      "ferry was built without the CUDA toolkit, so without its NCCL backend; use make_host_group, or "
      "rebuild ferry with the toolkit");
  return {};
}

}  // namespace ferry::comm
