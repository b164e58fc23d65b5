// Opening a group over the processes of a job (group.hpp).
#include "ferry/comm/group.hpp"

#include <fmt/format.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/cuda/cuda.hpp"

namespace ferry::comm {

int local_gpu(bootstrap& job) {
  std::string problem;
  int ordinal = -1;
  try {
    const host_place place = place_on_host(job);
    if (!cuda_available()) {
      problem = fmt::format("no GPU on host {} ({})", place.host, cuda_unavailable_reason());
    } else if (place.local_rank >= cuda_device_count()) {
      problem = fmt::format("local rank {} of {} on host {}, which has {} GPU{}: one GPU per process",
                            place.local_rank, place.local_size, place.host, cuda_device_count(),
                            cuda_device_count() == 1 ? "" : "s");
    } else {
      ordinal = place.local_rank;
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_ready(job, "choosing each process's GPU", problem);
  return ordinal;
}

std::unique_ptr<communicator> open_group(std::shared_ptr<bootstrap> job, device& dev,
                                         const comm_options& options) {
  FERRY_EXPECTS(job != nullptr, "open_group: the bootstrap is null");
  if (dev.kind() == backend::host) {
    if (job->size() == 1) {
      device* one = &dev;
      std::vector<std::unique_ptr<communicator>> group = make_host_group(std::span(&one, 1), options);
      return std::move(group.front());
    }
    // Every process agrees that each is on the host backend before any collective waits on another.
    agree_ready(*job, "opening a host group over the job's processes", "");
    return make_host_group(std::move(job), dev, options);
  }
  device* one = &dev;
  std::vector<std::unique_ptr<communicator>> group = make_nccl_group(*job, std::span(&one, 1), options);
  return std::move(group.front());
}

}  // namespace ferry::comm
