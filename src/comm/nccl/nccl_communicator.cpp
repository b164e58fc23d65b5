// The NCCL backend of ferry::comm: ranks on GPUs of this process (one nonblocking NCCL communicator each,
// created together), NCCL opened at run time through ferry::shim. nccl_group.hpp keeps them from hanging.
#include <fmt/format.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "ferry/shim/nccl.hpp"
#include "nccl_group.hpp"

namespace ferry::comm {
namespace {

using nccl_backend::call;
using nccl_backend::nccl_group;

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(device& dev, int rank, int size, std::shared_ptr<nccl_group> group) noexcept
      : communicator(dev, rank, size), group_(std::move(group)) {}
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() override { group_->close(rank()); }

  [[nodiscard]] std::string_view backend_name() const noexcept override { return "nccl"; }

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
    group_->run(rank(), {collective::all_reduce, send, recv, count, type, op, 0}, s);
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, dtype type, stream_view s) override {
    group_->run(rank(), {collective::all_gather, send, recv, count, type, reduce_op::sum, 0}, s);
  }
  void do_broadcast(const void* send, void* recv, std::size_t count, dtype type, int root,
                    stream_view s) override {
    group_->run(rank(), {collective::broadcast, send, recv, count, type, reduce_op::sum, root}, s);
  }
  void do_barrier(stream_view s) override { group_->run(rank(), call{}, s); }

 private:
  std::shared_ptr<nccl_group> group_;
};

}  // namespace

bool nccl_available(std::string* reason) {
  const shim::nccl_api& api = shim::nccl();
  if (reason != nullptr) *reason = api.ok() ? std::string() : api.error;
  return api.ok();
}

std::vector<std::unique_ptr<communicator>> make_nccl_group(std::span<device* const> devices,
                                                           const comm_options& options) {
  FERRY_EXPECTS(!devices.empty(), "make_nccl_group of no devices: a group has at least one rank");
  FERRY_EXPECTS(options.timeout.count() > 0,
                fmt::format("comm_options::timeout = {} ms: must be positive", options.timeout.count()));
  std::vector<device*> devs;
  std::vector<int> ordinals;
  std::set<int> seen;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    device* d = devices[i];
    FERRY_EXPECTS(d != nullptr, fmt::format("make_nccl_group: device {} (rank {}) is null", i, i));
    FERRY_EXPECTS(
        d->kind() == backend::cuda,
        fmt::format("make_nccl_group: device {} (rank {}) is on the {} backend; NCCL ranks run on GPUs "
                    "(make_cuda_device); use make_host_group for emulated devices",
                    i, i, to_string(d->kind())));
    const int ordinal = d->info().ordinal;
    FERRY_EXPECTS(
        seen.insert(ordinal).second,
        fmt::format("make_nccl_group: device {} (rank {}) is GPU {}, which an earlier rank already uses; "
                    "NCCL needs one GPU per rank",
                    i, i, ordinal));
    devs.push_back(d);
    ordinals.push_back(ordinal);
  }
  const shim::nccl_api& api = shim::nccl();
  if (!api.ok()) throw comm_error("make_nccl_group: " + api.error, collective::barrier, -1);
  auto group = std::make_shared<nccl_group>(api, devs, ordinals, options);
  const int size = static_cast<int>(devs.size());
  std::vector<std::unique_ptr<communicator>> ranks;
  ranks.reserve(devs.size());
  for (int r = 0; r < size; ++r)
    ranks.push_back(std::make_unique<nccl_communicator>(*devs[static_cast<std::size_t>(r)], r, size, group));
  return ranks;
}

}  // namespace ferry::comm
