// The host backend over processes: one rank per process of a job, each on its own emulated device, the
// bytes of every collective crossing through the job's bootstrap (the caller's key-value store, or MPI).
// A collective is a host function on the rank's stream, as in the in-process group; here it waits for its
// turn (collectives run in issue order, one at a time, which is the order the bootstrap's own collectives
// need), exchanges the rank's bytes with one bootstrap all-gather (or broadcast) and reduces the gathered
// parts in rank order, so every process computes bitwise the same result.
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "elementwise.hpp"
#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "queued_communicator.hpp"
#include "rendezvous.hpp"

namespace ferry::comm {
namespace {

// What the collectives of one process share: the bootstrap and whose turn it is.
class process_state {
 public:
  process_state(std::shared_ptr<bootstrap> job, const comm_options& options)
      : job_(std::move(job)), timeout_(options.timeout) {}

  // Collective `seq` (issue order) on a stream thread; returns once its recv holds the result.
  // (`rank` is this process's: the job's rank.)
  void run(int /*rank*/, std::uint64_t seq, const host::request& r) {
    const int rank = job_->rank();
    const int size = job_->size();
    {
      std::unique_lock lock(mu_);
      const bool turn = cv_.wait_for(lock, timeout_, [&] { return next_ == seq || aborted_; });
      if (aborted_)
        throw comm_error(fmt::format("{} #{} on rank {} of {} failed: the group is aborted: {}",
                                     host::describe(r), seq, rank, size, reason_),
                         r.op, rank);
      if (!turn) {
        const std::string why =
            fmt::format("{} #{} on rank {} of {}: collective #{} of this process did not finish within {} ms",
                        host::describe(r), seq, rank, size, next_, timeout_.count());
        abort_locked(why);
        lock.unlock();
        job_->abort(why);
        throw comm_error(why + "; the group is aborted", r.op, rank);
      }
    }
    try {
      exchange(r);
    } catch (const std::exception& e) {
      const std::string why =
          fmt::format("{} #{} on rank {} of {} failed: {}", host::describe(r), seq, rank, size, e.what());
      abort(why);
      throw comm_error(why + "; the group is aborted", r.op, rank);
    }
    {
      const std::lock_guard lock(mu_);
      ++next_;
    }
    cv_.notify_all();
  }

  void abort(const std::string& why) noexcept {
    {
      const std::lock_guard lock(mu_);
      if (aborted_) return;
      abort_locked(why);
    }
    cv_.notify_all();
    job_->abort(why);
  }
  [[nodiscard]] bool aborted() const noexcept { return aborted_flag_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string reason() const {
    const std::lock_guard lock(mu_);
    return reason_;
  }

 private:
  void abort_locked(const std::string& why) noexcept {
    if (aborted_) return;
    aborted_ = true;
    aborted_flag_.store(true, std::memory_order_release);
    try {
      reason_ = why;
    } catch (...) {
      reason_.clear();
    }
  }

  void exchange(const host::request& r) {
    const std::size_t bytes = r.count * size_of(r.type);
    const auto n = static_cast<std::size_t>(job_->size());
    switch (r.op) {
      case collective::all_reduce: {
        const std::vector<std::byte> all = job_->all_gather({static_cast<const std::byte*>(r.send), bytes});
        std::vector<const void*> sends(n);
        for (std::size_t p = 0; p < n; ++p) sends[p] = all.data() + p * bytes;
        void* const recv = r.recv;
        host::reduce_range(r.type, r.reduction, sends, std::span(&recv, 1), 0, r.count);
        return;
      }
      case collective::all_gather: {
        const std::vector<std::byte> all = job_->all_gather({static_cast<const std::byte*>(r.send), bytes});
        std::memcpy(r.recv, all.data(), all.size());
        return;
      }
      case collective::broadcast: {
        std::vector<std::byte> data(bytes);
        if (job_->rank() == r.root) std::memcpy(data.data(), r.send, bytes);
        job_->broadcast(data, r.root);
        std::memcpy(r.recv, data.data(), bytes);
        return;
      }
      case collective::barrier: {
        const std::byte here{1};
        static_cast<void>(job_->all_gather(std::span(&here, 1)));
        return;
      }
    }
  }

  std::shared_ptr<bootstrap> job_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t next_ = 0;  // the collective whose turn it is
  bool aborted_ = false;
  std::atomic<bool> aborted_flag_{false};
  std::string reason_;
};

}  // namespace

std::unique_ptr<communicator> make_host_group(std::shared_ptr<bootstrap> job, device& dev,
                                              const comm_options& options) {
  FERRY_EXPECTS(job != nullptr, "make_host_group over a job: the bootstrap is null");
  FERRY_EXPECTS(options.timeout.count() > 0,
                fmt::format("comm_options::timeout = {} ms: must be positive", options.timeout.count()));
  FERRY_EXPECTS(dev.kind() == backend::host,
                fmt::format("make_host_group over a job: the device is on the {} backend; host ranks run on "
                            "emulated devices (make_host_device); use make_nccl_group for GPUs",
                            to_string(dev.kind())));
  const int rank = job->rank();
  const int size = job->size();
  auto state = std::make_shared<process_state>(std::move(job), options);
  return std::make_unique<host::queued_communicator<process_state>>(dev, rank, size, std::move(state));
}

}  // namespace ferry::comm
