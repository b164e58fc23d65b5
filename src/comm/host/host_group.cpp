// The host backend of ferry::comm: in-process ranks over emulated devices (make_host_device). A collective is
// a host function on the rank's stream (queued_communicator.hpp) that meets the other ranks' in a shared
// rendezvous (rendezvous.hpp),
// which really reduces or copies the bytes (device memory of the host backend is host memory) and lasts the
// modelled time of comm_options::link.
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "queued_communicator.hpp"
#include "rendezvous.hpp"

namespace ferry::comm {
namespace {

using host_communicator = host::queued_communicator<host::rendezvous>;

}  // namespace

std::vector<std::unique_ptr<communicator>> make_host_group(std::span<device* const> devices,
                                                           const comm_options& options) {
  FERRY_EXPECTS(!devices.empty(), "make_host_group of no devices: a group has at least one rank");
  FERRY_EXPECTS(options.timeout.count() > 0,
                fmt::format("comm_options::timeout = {} ms: must be positive", options.timeout.count()));
  if (options.link.model) {
    FERRY_EXPECTS(std::isfinite(options.link.bus_gbps) && options.link.bus_gbps > 0,
                  fmt::format("comm_link \"{}\": bus_gbps = {} must be a positive finite number (or set "
                              "model = false)",
                              options.link.name, options.link.bus_gbps));
    FERRY_EXPECTS(options.link.latency.count() >= 0,
                  fmt::format("comm_link \"{}\": latency = {} ns must not be negative", options.link.name,
                              options.link.latency.count()));
  }
  std::set<const device*> seen;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const device* d = devices[i];
    FERRY_EXPECTS(d != nullptr, fmt::format("make_host_group: device {} (rank {}) is null", i, i));
    FERRY_EXPECTS(d->kind() == backend::host,
                  fmt::format("make_host_group: device {} (rank {}) is on the {} backend; host ranks run on "
                              "emulated devices (make_host_device); use make_nccl_group for GPUs",
                              i, i, to_string(d->kind())));
    FERRY_EXPECTS(seen.insert(d).second,
                  fmt::format("make_host_group: device {} (rank {}) is already an earlier rank's; each rank "
                              "needs its own device",
                              i, i));
  }
  const int size = static_cast<int>(devices.size());
  auto group = std::make_shared<host::rendezvous>(size, options);
  std::vector<std::unique_ptr<communicator>> ranks;
  ranks.reserve(devices.size());
  for (int r = 0; r < size; ++r)
    ranks.push_back(
        std::make_unique<host_communicator>(*devices[static_cast<std::size_t>(r)], r, size, group));
  return ranks;
}

}  // namespace ferry::comm
