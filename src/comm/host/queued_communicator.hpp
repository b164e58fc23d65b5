// The host backend's communicator (private to src/comm/host), shared by its two groups: the ranks of one
// process (rendezvous.hpp) and the processes of a job (process_group.cpp). A collective is a request,
// numbered in issue order (which matches the ranks' collectives to one another, whatever stream each runs
// on), run by the group as a host function on the caller's stream.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "../group_abort.hpp"
#include "ferry/comm/communicator.hpp"
#include "rendezvous.hpp"

namespace ferry::comm::host {

/// Group: what the ranks share; run(rank, seq, request) on a stream thread, abort(why) (never throws),
/// aborted(), reason().
template <class Group>
class queued_communicator final : public communicator {
 public:
  queued_communicator(device& dev, int rank, int size, std::shared_ptr<Group> group) noexcept
      : communicator(dev, rank, size), group_(std::move(group)) {}
  queued_communicator(const queued_communicator&) = delete;
  queued_communicator& operator=(const queued_communicator&) = delete;

  // The other ranks' pending and later collectives fail at once instead of waiting for this rank. This
  // rank's own collectives still queued on its stream (they hold the group) fail the same way.
  ~queued_communicator() override {
    group_->abort(fmt::format("the communicator of rank {} was destroyed", rank()));
  }

  [[nodiscard]] std::string_view backend_name() const noexcept override { return "host"; }

  void abort(const std::string& why) noexcept override { detail::abort_group(*group_, rank(), why); }
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
  void submit(const request& r, stream_view s) {
    const std::uint64_t seq = issued_.fetch_add(1, std::memory_order_relaxed);
    dev().launch_host_func(s, [group = group_, rank = rank(), seq, r] { group->run(rank, seq, r); });
  }

  std::shared_ptr<Group> group_;
  std::atomic<std::uint64_t> issued_{0};
};

}  // namespace ferry::comm::host
