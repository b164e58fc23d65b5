// The host backend of ferry::comm: in-process ranks over emulated devices (make_host_device). A collective is
// a host function on the rank's stream that meets the other ranks' in a shared rendezvous (rendezvous.hpp),
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
#include "rendezvous.hpp"

namespace ferry::comm {
namespace {

class host_communicator final : public communicator {
 public:
  host_communicator(device& dev, int rank, int size, std::shared_ptr<host::rendezvous> group) noexcept
      : communicator(dev, rank, size), group_(std::move(group)) {}
  host_communicator(const host_communicator&) = delete;
  host_communicator& operator=(const host_communicator&) = delete;

  // The other ranks' pending and later collectives fail at once instead of waiting for this rank. This
  // rank's own collectives still queued on its stream (they hold the rendezvous) fail the same way.
  ~host_communicator() override {
    group_->abort(fmt::format("the communicator of rank {} was destroyed", rank()));
  }

  [[nodiscard]] std::string_view backend_name() const noexcept override { return "host"; }

  void abort(const std::string& why) noexcept override {
    try {
      group_->abort(fmt::format("abort() on rank {}: {}", rank(), why));
    } catch (...) {
      group_->abort(why);  // formatting failed (no memory)
    }
  }
  [[nodiscard]] bool aborted() const noexcept override { return group_->aborted(); }
  [[nodiscard]] std::string abort_reason() const override { return group_->reason(); }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                     stream_view s) override {
    submit({collective::all_reduce, count, type, op, 0, send, recv}, s);
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, dtype type, stream_view s) override {
    submit({collective::all_gather, count, type, reduce_op::sum, 0, send, recv}, s);
  }
  void do_broadcast(const void* send, void* recv, std::size_t count, dtype type, int root,
                    stream_view s) override {
    submit({collective::broadcast, count, type, reduce_op::sum, root, send, recv}, s);
  }
  void do_barrier(stream_view s) override { submit({}, s); }

 private:
  // Numbers the collective in issue order (which matches the ranks' collectives to one another, whatever
  // stream each runs on) and queues its part of the rendezvous on `s`.
  void submit(const host::request& r, stream_view s) {
    const std::uint64_t seq = issued_.fetch_add(1, std::memory_order_relaxed);
    dev().launch_host_func(s, [group = group_, rank = rank(), seq, r] { group->run(rank, seq, r); });
  }

  std::shared_ptr<host::rendezvous> group_;
  std::atomic<std::uint64_t> issued_{0};
};

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
