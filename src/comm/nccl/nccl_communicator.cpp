// The NCCL backend of ferry::comm: ranks on GPUs of this process (one nonblocking NCCL communicator each,
// created together), alone or with the ranks of other processes of a job (a bootstrap), NCCL opened at
// run time through ferry::shim. nccl_group.hpp keeps them from hanging.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../group_abort.hpp"
#include "ferry/comm/bootstrap.hpp"
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
  // This process's rank `local` of `group` (rank group->first_rank() + local of the group).
  nccl_communicator(device& dev, int local, std::shared_ptr<nccl_group> group) noexcept
      : communicator(dev, group->first_rank() + local, group->size()),
        local_(local),
        group_(std::move(group)) {}
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() override { group_->close(local_); }

  [[nodiscard]] std::string_view backend_name() const noexcept override { return "nccl"; }

  void abort(const std::string& why) noexcept override { detail::abort_group(*group_, rank(), why); }
  [[nodiscard]] bool aborted() const noexcept override { return group_->aborted(); }
  [[nodiscard]] std::string abort_reason() const override { return group_->reason(); }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                     stream_view s) override {
    group_->run(local_, {collective::all_reduce, send, recv, count, type, op, 0}, s);
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, dtype type, stream_view s) override {
    group_->run(local_, {collective::all_gather, send, recv, count, type, reduce_op::sum, 0}, s);
  }
  void do_broadcast(const void* send, void* recv, std::size_t count, dtype type, int root,
                    stream_view s) override {
    group_->run(local_, {collective::broadcast, send, recv, count, type, reduce_op::sum, root}, s);
  }
  void do_barrier(stream_view s) override { group_->run(local_, call{}, s); }

 private:
  int local_;
  std::shared_ptr<nccl_group> group_;
};

}  // namespace

bool nccl_available(std::string* reason) {
  const shim::nccl_api& api = shim::nccl();
  if (reason != nullptr) *reason = api.ok() ? std::string() : api.error;
  return api.ok();
}

namespace {

// This process's GPUs for NCCL ranks, in rank order.
struct local_gpus {
  std::vector<device*> devs;
  std::vector<int> ordinals;
};

// The checks every make_nccl_group makes of its arguments: throws logic_error naming the bad value.
local_gpus expect_gpus(std::span<device* const> devices, const comm_options& options) {
  FERRY_EXPECTS(!devices.empty(), "make_nccl_group of no devices: a group has at least one rank");
  FERRY_EXPECTS(options.timeout.count() > 0,
                fmt::format("comm_options::timeout = {} ms: must be positive", options.timeout.count()));
  local_gpus gpus;
  std::set<int> seen;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    device* d = devices[i];
    FERRY_EXPECTS(d != nullptr, fmt::format("make_nccl_group: device {} is null", i));
    FERRY_EXPECTS(d->kind() == backend::cuda,
                  fmt::format("make_nccl_group: device {} is on the {} backend; NCCL ranks run on GPUs "
                              "(make_cuda_device); use make_host_group for emulated devices",
                              i, to_string(d->kind())));
    const int ordinal = d->info().ordinal;
    FERRY_EXPECTS(seen.insert(ordinal).second,
                  fmt::format("make_nccl_group: device {} is GPU {}, which an earlier device of this process "
                              "already uses; NCCL needs one GPU per rank",
                              i, ordinal));
    gpus.devs.push_back(d);
    gpus.ordinals.push_back(ordinal);
  }
  return gpus;
}

std::vector<std::unique_ptr<communicator>> make_ranks(const std::shared_ptr<nccl_group>& group,
                                                      const local_gpus& gpus) {
  std::vector<std::unique_ptr<communicator>> ranks;
  ranks.reserve(gpus.devs.size());
  for (int k = 0; k < group->size_here(); ++k)
    ranks.push_back(std::make_unique<nccl_communicator>(*gpus.devs[static_cast<std::size_t>(k)], k, group));
  return ranks;
}

shim::nccl_unique_id new_unique_id(const shim::nccl_api& api, std::string* problem) {
  shim::nccl_unique_id id{};
  const shim::nccl_result r = api.get_unique_id(&id);
  if (r != shim::nccl_success) {
    const std::string why = fmt::format("ncclGetUniqueId failed: {}", api.error_string(r));
    if (problem == nullptr) throw comm_error(why, collective::barrier, -1);
    *problem = why;
  }
  return id;
}

std::span<std::byte> bytes_of(shim::nccl_unique_id& id) noexcept {
  return std::as_writable_bytes(std::span(id.internal));
}

}  // namespace

std::vector<std::unique_ptr<communicator>> make_nccl_group(std::span<device* const> devices,
                                                           const comm_options& options) {
  const local_gpus gpus = expect_gpus(devices, options);
  const shim::nccl_api& api = shim::nccl();
  if (!api.ok()) throw comm_error("make_nccl_group: " + api.error, collective::barrier, -1);
  const shim::nccl_unique_id id = new_unique_id(api, nullptr);
  const int size = static_cast<int>(gpus.devs.size());
  return make_ranks(std::make_shared<nccl_group>(api, gpus.devs, gpus.ordinals, options, id, 0, size), gpus);
}

std::vector<std::unique_ptr<communicator>> make_nccl_group(bootstrap& job, std::span<device* const> devices,
                                                           const comm_options& options) {
  // Every process says whether it can take part before any of them waits for the others in NCCL.
  local_gpus gpus;
  std::string problem;
  try {
    gpus = expect_gpus(devices, options);
    std::string why;
    if (!nccl_available(&why)) problem = why;
  } catch (const std::logic_error& e) {
    problem = e.what();
  }
  agree_ready(job, "make_nccl_group", problem);
  const shim::nccl_api& api = shim::nccl();

  // Ranks: this process's GPUs follow every earlier process's.
  const auto here = static_cast<std::int32_t>(gpus.devs.size());
  const std::vector<std::byte> counts_raw = job.all_gather(std::as_bytes(std::span(&here, 1)));
  std::vector<std::int32_t> counts(static_cast<std::size_t>(job.size()));
  std::memcpy(counts.data(), counts_raw.data(), counts_raw.size());
  const auto before = counts.begin() + job.rank();
  const int first_rank = std::accumulate(counts.begin(), before, 0);
  const int world = std::accumulate(counts.begin(), counts.end(), 0);

  // The group's id: made by process 0, passed to the others.
  shim::nccl_unique_id id{};
  problem.clear();
  if (job.rank() == 0) id = new_unique_id(api, &problem);
  agree_ready(job, "make_nccl_group (the unique id)", problem);
  job.broadcast(bytes_of(id), 0);

  std::shared_ptr<nccl_group> group;
  try {
    group = std::make_shared<nccl_group>(api, gpus.devs, gpus.ordinals, options, id, first_rank, world);
  } catch (const comm_error& e) {
    problem = e.what();
  }
  // A process whose ranks did not connect fails every process (its group, if it has one, is aborted).
  try {
    agree_ready(job, "make_nccl_group (connecting the ranks)", problem);
  } catch (const comm_error&) {
    if (group) group->abort("another process failed to connect its ranks");
    throw;
  }
  return make_ranks(group, gpus);
}

}  // namespace ferry::comm
