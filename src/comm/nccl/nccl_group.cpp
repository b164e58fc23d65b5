#include "nccl_group.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <utility>

#include "../cuda/current_device.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm::nccl_backend {
namespace {

using detail::device_scope;

shim::nccl_data_type to_nccl(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return shim::nccl_data_type::float32;
    case dtype::f16: return shim::nccl_data_type::float16;
    case dtype::bf16: return shim::nccl_data_type::bfloat16;
    case dtype::i32: return shim::nccl_data_type::int32;
    case dtype::i64: return shim::nccl_data_type::int64;
    case dtype::u64: return shim::nccl_data_type::uint64;
  }
  return shim::nccl_data_type::float32;
}

shim::nccl_red_op to_nccl(reduce_op op) noexcept {
  return op == reduce_op::avg ? shim::nccl_red_op::avg : shim::nccl_red_op::sum;
}

}  // namespace

nccl_group::nccl_group(const shim::nccl_api& api, const std::vector<device*>& devices,
                       const std::vector<int>& ordinals, const comm_options& options,
                       const shim::nccl_unique_id& id, int first_rank, int world)
    : api_(api), options_(options), first_rank_(first_rank), world_(world) {
  const int n = static_cast<int>(devices.size());
  FERRY_EXPECTS(n > 0 && first_rank >= 0 && first_rank + n <= world,
                fmt::format("nccl_group: ranks {} to {} of this process do not fit in a group of {}",
                            first_rank, first_rank + n - 1, world));
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto rs = std::make_unique<rank_state>();
    rs->dev = devices[i];
    rs->ordinal = ordinals[i];
    rs->records.resize(records_per_rank);
    for (record& rec : rs->records) {
      rec.start = rs->dev->make_event();
      rec.end = rs->dev->make_event();
    }
    rs->scratch = rs->dev->alloc_device(sizeof(float));
    ranks_.push_back(std::move(rs));
  }

  // One thread creates every local rank's communicator, so the calls form one NCCL group (they wait for
  // one another, and for the other processes' ranks); nonblocking, so none of them can hang this thread.
  std::string failure;
  {
    device_scope on_rank(ordinals.front());
    shim::nccl_result r = api_.group_start();
    for (int k = 0; k < n && r == shim::nccl_success; ++k) {
      rank_state& rs = *ranks_[static_cast<std::size_t>(k)];
      on_rank.to(rs.ordinal);
      shim::nccl_config config = shim::nccl_config_initializer();
      config.blocking = 0;
      r = api_.comm_init_rank_config(&rs.comm, world_, id, global(k), &config);
      if (r == shim::nccl_in_progress) r = shim::nccl_success;
      if (r != shim::nccl_success)
        failure = fmt::format("ncclCommInitRankConfig of rank {} (GPU {}) failed: {}", global(k), rs.ordinal,
                              api_.error_string(r));
    }
    const shim::nccl_result end = api_.group_end();
    if (failure.empty() && end != shim::nccl_success && end != shim::nccl_in_progress)
      failure =
          fmt::format("ncclGroupEnd after creating the communicators failed: {}", api_.error_string(end));
  }
  if (failure.empty()) failure = settle_all("creating the communicators", clock::now() + options_.timeout);
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing in ferry changes the environment
  const char* keep = std::getenv("FERRY_NCCL_NONBLOCKING");
  const bool nonblocking = (keep != nullptr && std::string_view(keep) == "1") || api_.comm_split == nullptr;
  if (failure.empty() && !nonblocking) {
    try {
      failure = make_blocking(clock::now() + options_.timeout);
    } catch (const std::exception& e) {
      failure = fmt::format("making the blocking communicators: {}", e.what());
    }
  }
  if (!failure.empty()) {
    abort_communicators();
    throw comm_error(fmt::format("NCCL {} could not make a group of {} ranks ({} of them on GPUs of this "
                                 "process): {}",
                                 api_.version_string(), world_, n, failure),
                     collective::barrier, -1);
  }
  watchdog_ = std::thread([this] { watch(); });
}

nccl_group::~nccl_group() {
  bool pending = false;
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
    static_cast<void>(check_records(clock::now()));
    pending = in_flight_ > 0;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (pending) {
    // A collective still running would keep a finalize waiting: end it.
    abort_communicators();
    return;
  }
  // A clean end: finalize every communicator still alive, then destroy them. Nonblocking ones finish
  // together and any that does not finalize within the timeout is aborted instead; a blocking one (the
  // split ones) finalizes in its call, which flushes its own work (the suites' groups of 2 GPUs in one
  // process finalize so, one after the other).
  for (const auto& rs : ranks_) {
    if (rs->comm == nullptr) continue;
    const device_scope on(rs->ordinal);
    const shim::nccl_result r = api_.comm_finalize(rs->comm);
    FERRY_ASSERT_NOTHROW(
        r == shim::nccl_success || r == shim::nccl_in_progress,
        fmt::format("ncclCommFinalize of rank {} failed: {}", &rs - ranks_.data(), api_.error_string(r)));
  }
  const std::string failure = settle_all("finalizing the communicators", clock::now() + options_.timeout);
  if (!failure.empty()) {
    FERRY_ASSERT_NOTHROW(false, failure + "; aborting them instead");
    abort_communicators();
    return;
  }
  for (const auto& rs : ranks_) {
    if (rs->comm == nullptr) continue;
    const device_scope on(rs->ordinal);
    const shim::nccl_result r = api_.comm_destroy(rs->comm);
    FERRY_ASSERT_NOTHROW(r == shim::nccl_success, fmt::format("ncclCommDestroy of rank {} failed: {}",
                                                              &rs - ranks_.data(), api_.error_string(r)));
    rs->comm = nullptr;
  }
}

std::string nccl_group::settle_comms(const char* what, const std::vector<shim::nccl_comm>& comms,
                                     clock::time_point deadline) noexcept {
  std::chrono::microseconds backoff(10);
  for (;;) {
    bool busy = false;
    for (std::size_t k = 0; k < comms.size(); ++k) {
      if (comms[k] == nullptr) continue;
      shim::nccl_result state = shim::nccl_success;
      const shim::nccl_result r = api_.comm_get_async_error(comms[k], &state);
      if (r != shim::nccl_success) state = r;
      if (state == shim::nccl_in_progress) {
        busy = true;
      } else if (state != shim::nccl_success) {
        return fmt::format("{}: rank {} (GPU {}) reports {}", what, global(static_cast<int>(k)),
                           ranks_[k]->ordinal, api_.error_string(state));
      }
    }
    if (!busy) return {};
    if (clock::now() >= deadline)
      return fmt::format("{} did not finish within {} ms", what, options_.timeout.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::microseconds>(backoff * 2, poll_interval);
  }
}

std::string nccl_group::make_blocking(clock::time_point deadline) {
  const std::size_t n = ranks_.size();
  std::vector<shim::nccl_comm> parents(n);
  std::vector<shim::nccl_comm> children(n, nullptr);
  for (std::size_t k = 0; k < n; ++k) parents[k] = ranks_[k]->comm;
  std::string failure;
  {
    device_scope on_rank(ranks_.front()->ordinal);
    shim::nccl_result r = api_.group_start();
    for (std::size_t k = 0; k < n && r == shim::nccl_success; ++k) {
      on_rank.to(ranks_[k]->ordinal);
      shim::nccl_config config = shim::nccl_config_initializer();
      config.blocking = 1;
      r = api_.comm_split(parents[k], 0, global(static_cast<int>(k)), &children[k], &config);
      if (r == shim::nccl_in_progress) r = shim::nccl_success;
      if (r != shim::nccl_success)
        failure = fmt::format("ncclCommSplit of rank {} failed: {}", global(static_cast<int>(k)),
                              api_.error_string(r));
    }
    const shim::nccl_result end = api_.group_end();
    if (failure.empty() && end != shim::nccl_success && end != shim::nccl_in_progress)
      failure =
          fmt::format("ncclGroupEnd after splitting the communicators failed: {}", api_.error_string(end));
  }
  // The split runs on the nonblocking parents' side: both answer ncclInProgress until it is done.
  if (failure.empty()) failure = settle_comms("splitting the communicators", parents, deadline);
  if (failure.empty()) failure = settle_comms("splitting the communicators", children, deadline);
  if (!failure.empty()) {
    for (std::size_t k = 0; k < n; ++k) {
      if (children[k] == nullptr) continue;
      const device_scope on(ranks_[k]->ordinal);
      static_cast<void>(api_.comm_abort(children[k]));
    }
    return failure;  // the parents are still the ranks' communicators: the caller aborts them
  }
  // The parents are done with: finalized together (nonblocking), then destroyed.
  for (std::size_t k = 0; k < n; ++k) {
    const device_scope on(ranks_[k]->ordinal);
    static_cast<void>(api_.comm_finalize(parents[k]));
    ranks_[k]->comm = children[k];
  }
  failure = settle_comms("finalizing the nonblocking communicators", parents, deadline);
  for (std::size_t k = 0; k < n; ++k) {
    const device_scope on(ranks_[k]->ordinal);
    static_cast<void>(failure.empty() ? api_.comm_destroy(parents[k]) : api_.comm_abort(parents[k]));
  }
  if (!failure.empty()) return failure;
  return warm_up(deadline);
}

// Collectives of every kind the group issues, at sizes that take NCCL's usual algorithms, so each makes
// its connections now, while every rank is there, and never later inside a blocking enqueue.
std::string nccl_group::warm_up(clock::time_point deadline) {
  constexpr std::size_t largest = 8 * 1024 * 1024;  // floats: 32 MiB
  const std::size_t n = ranks_.size();
  const std::size_t gathered = std::max<std::size_t>(1, largest / static_cast<std::size_t>(world_));
  // Declared outside the attempt: on a failure the communicators are aborted (ending whatever still runs or
  // waits for a rank) before these buffers are freed, which would otherwise wait for that work.
  std::vector<buffer> data(n);
  std::vector<stream> streams;
  std::vector<event> done;
  const auto attempt = [&]() -> std::string {
    for (std::size_t k = 0; k < n; ++k) {
      device& dev = *ranks_[k]->dev;
      data[k] =
          dev.alloc_device(std::max(largest, gathered * static_cast<std::size_t>(world_)) * sizeof(float));
      streams.push_back(dev.make_stream());
      done.push_back(dev.make_event());
      dev.memset_async(data[k].view(), 0, streams.back().view());
    }
    std::vector<call> calls;
    for (std::size_t count = 1; count < largest; count *= 16)
      calls.push_back({collective::all_reduce, nullptr, nullptr, count, dtype::f32, reduce_op::sum, 0});
    calls.push_back({collective::all_reduce, nullptr, nullptr, largest, dtype::f32, reduce_op::sum, 0});
    calls.push_back({collective::all_gather, nullptr, nullptr, 1, dtype::f32, reduce_op::sum, 0});
    calls.push_back({collective::all_gather, nullptr, nullptr, gathered, dtype::f32, reduce_op::sum, 0});
    calls.push_back({collective::broadcast, nullptr, nullptr, 1, dtype::f32, reduce_op::sum, 0});
    calls.push_back({collective::broadcast, nullptr, nullptr, largest, dtype::f32, reduce_op::sum, 0});
    for (const call& proto : calls) {
      // Every local rank's part in one NCCL group: a blocking call of one rank may wait for the others.
      device_scope on_rank(ranks_.front()->ordinal);
      shim::nccl_result r = api_.group_start();
      for (std::size_t k = 0; k < n && r == shim::nccl_success; ++k) {
        on_rank.to(ranks_[k]->ordinal);
        call c = proto;
        c.recv = data[k].data();
        // An all-gather in place: this rank's part is its slot of the result.
        c.send = c.op == collective::all_gather
                     ? static_cast<void*>(static_cast<std::byte*>(c.recv) +
                                          static_cast<std::size_t>(global(static_cast<int>(k))) * c.count *
                                              sizeof(float))
                     : c.recv;
        r = issue(*ranks_[k], c, streams[k].view().native());
      }
      const shim::nccl_result end = api_.group_end();
      if (r != shim::nccl_success || end != shim::nccl_success)
        return fmt::format("the warm-up {} of {} elements failed: {}", to_string(proto.op), proto.count,
                           api_.error_string(r != shim::nccl_success ? r : end));
    }
    for (std::size_t k = 0; k < n; ++k) done[k].record(streams[k].view());
    std::chrono::microseconds backoff(10);
    for (std::size_t k = 0; k < n; ++k) {
      while (!done[k].query()) {
        if (clock::now() >= deadline)
          return fmt::format("the warm-up collectives did not finish within {} ms", options_.timeout.count());
        std::this_thread::sleep_for(backoff);
        backoff = std::min<std::chrono::microseconds>(backoff * 2, poll_interval);
      }
    }
    return {};
  };
  std::string failure;
  try {
    failure = attempt();
  } catch (const std::exception& e) {
    failure = fmt::format("the warm-up collectives: {}", e.what());
  }
  if (!failure.empty()) abort_communicators();
  return failure;
}

std::string nccl_group::settle_all(const char* what, clock::time_point deadline) noexcept {
  try {
    std::chrono::microseconds backoff(10);
    for (;;) {
      bool busy = false;
      for (std::size_t k = 0; k < ranks_.size(); ++k) {
        rank_state& rs = *ranks_[k];
        const std::lock_guard call(rs.call_mu);
        if (rs.comm == nullptr) continue;
        shim::nccl_result state = shim::nccl_success;
        const shim::nccl_result r = api_.comm_get_async_error(rs.comm, &state);
        if (r != shim::nccl_success) state = r;
        if (state == shim::nccl_in_progress) {
          busy = true;
        } else if (state != shim::nccl_success) {
          return fmt::format("{}: rank {} (GPU {}) reports {}", what, k, rs.ordinal,
                             api_.error_string(state));
        }
      }
      if (!busy) return {};
      if (clock::now() >= deadline)
        return fmt::format("{} did not finish within {} ms", what, options_.timeout.count());
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::microseconds>(backoff * 2, poll_interval);
    }
  } catch (...) {
    return fmt::format("{}: out of memory", what);
  }
}

std::string nccl_group::reason() const {
  const std::lock_guard lock(mu_);
  return reason_;
}

std::string nccl_group::not_issued(std::uint64_t seq) const {
  std::string ranks;
  int count = 0;
  for (std::size_t k = 0; k < ranks_.size(); ++k) {
    if (ranks_[k]->issued > seq) continue;
    ranks += fmt::format("{}{}", count == 0 ? "" : ", ", global(static_cast<int>(k)));
    ++count;
  }
  const std::string_view others =
      world_ > size_here() ? " (ranks of other processes are not seen from this one)" : "";
  if (count == 0) return fmt::format("every rank of this process had issued it{}", others);
  return fmt::format("{} {} had not issued it{}", count == 1 ? "rank" : "ranks", ranks, others);
}

void nccl_group::fail_aborted(int rank, collective op, std::uint64_t seq) const {
  const std::string why = reason();
  throw comm_error(fmt::format("{} #{} on rank {} of {} failed: the group was aborted ({})", to_string(op),
                               seq, global(rank), size(), why.empty() ? "no reason given" : why),
                   op, global(rank));
}

void nccl_group::fail(int rank, collective op, const std::string& why) {
  abort(why);
  throw comm_error(why + "; the group is aborted", op, global(rank));
}

nccl_group::record& nccl_group::acquire(int rank, collective op, std::uint64_t seq,
                                        std::unique_lock<std::mutex>& lock) {
  std::vector<record>& records = ranks_[static_cast<std::size_t>(rank)]->records;
  const auto free_one = [&] {
    return std::find_if(records.begin(), records.end(), [](const record& r) { return !r.busy; });
  };
  // Every record busy: the host is records_per_rank collectives ahead of the GPU. The issuing thread
  // retires what finished itself, oldest first, polling with the lock released: waiting for the watchdog's
  // next poll would let the GPU run dry (it would cap the rank at records_per_rank collectives a
  // poll_interval).
  const auto deadline = clock::now() + options_.timeout;
  std::chrono::microseconds backoff(2);
  for (auto it = free_one(); it == records.end(); it = free_one()) {
    if (aborted()) {
      lock.unlock();
      fail_aborted(rank, op, seq);
    }
    std::string problem;
    if (retire_finished(rank, problem)) continue;
    if (problem.empty() && clock::now() >= deadline)
      problem = fmt::format(
          "{} #{} on rank {} of {}: the rank's {} collectives in flight did not finish within "
          "{} ms",
          to_string(op), seq, global(rank), size(), records.size(), options_.timeout.count());
    if (!problem.empty()) {
      lock.unlock();
      fail(rank, op, problem);
    }
    lock.unlock();
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::microseconds(100));
    lock.lock();
  }
  return *free_one();
}

bool nccl_group::retire_finished(int rank, std::string& problem) {
  std::vector<record>& records = ranks_[static_cast<std::size_t>(rank)]->records;
  // Oldest first: on one stream a collective completes only after the ones before it.
  bool freed = false;
  while (true) {
    record* oldest = nullptr;
    for (record& r : records)
      if (r.busy && (oldest == nullptr || r.seq < oldest->seq)) oldest = &r;
    if (oldest == nullptr) return freed;
    try {
      if (!oldest->end.query()) return freed;
    } catch (const std::exception& e) {
      problem = fmt::format("{} #{} on rank {} of {} (GPU {}): asking whether it completed failed: {}",
                            to_string(oldest->op), oldest->seq, global(rank), size(),
                            ranks_[static_cast<std::size_t>(rank)]->ordinal, e.what());
      return freed;
    }
    oldest->busy = false;
    --in_flight_;
    freed = true;
  }
}

shim::nccl_result nccl_group::issue(rank_state& rs, const call& c, void* stream) const {
  const shim::nccl_data_type t = to_nccl(c.type);
  switch (c.op) {
    case collective::all_reduce:
      return api_.all_reduce(c.send, c.recv, c.count, t, to_nccl(c.reduction), rs.comm, stream);
    case collective::all_gather: return api_.all_gather(c.send, c.recv, c.count, t, rs.comm, stream);
    case collective::broadcast:
      // Only root's send is read; the others pass their recv, as an in-place broadcast does.
      return api_.broadcast(c.send != nullptr ? c.send : c.recv, c.recv, c.count, t, c.root, rs.comm, stream);
    case collective::barrier:
      return api_.all_reduce(rs.scratch.data(), rs.scratch.data(), 1, shim::nccl_data_type::float32,
                             shim::nccl_red_op::sum, rs.comm, stream);
  }
  return shim::nccl_invalid_argument;
}

// Note [Collectives in a CUDA graph]: a collective issued on a stream that a CUDA graph is capturing runs
// at each replay, where no host code runs: it has no completion record (the watchdog could not follow its
// replays, and querying an event recorded in a capture is refused), and it is enqueued as NCCL captures it.
// The watchdog itself runs in the relaxed capture mode, so its queries of collectives issued before the
// capture never invalidate a capture that another thread runs in the global mode (torch.cuda.graph's
// default).
bool nccl_group::capturing(stream_view s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(s.native()), &status) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

void nccl_group::run_captured(int rank, rank_state& rs, const call& c, stream_view s, std::uint64_t seq) {
  const std::lock_guard call_lock(rs.call_mu);
  if (rs.comm == nullptr) fail_aborted(rank, c.op, seq);
  const device_scope on(rs.ordinal);
  const shim::nccl_result r = issue(rs, c, s.native());
  if (r != shim::nccl_success) {
    const char* detail = api_.get_last_error != nullptr ? api_.get_last_error(rs.comm) : nullptr;
    throw comm_error(
        fmt::format("{} #{} on rank {} of {} (GPU {}), in a CUDA graph's capture: NCCL failed: "
                    "{}{}{} (the capture is not aborted: end it, and the group stays usable)",
                    to_string(c.op), seq, global(rank), size(), rs.ordinal, api_.error_string(r),
                    detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : ""),
        c.op, global(rank));
  }
}

void nccl_group::run(int rank, const call& c, stream_view s) {
  rank_state& rs = *ranks_[static_cast<std::size_t>(rank)];
  std::unique_lock lock(mu_);
  const std::uint64_t seq = rs.issued++;
  if (aborted()) {
    lock.unlock();
    fail_aborted(rank, c.op, seq);
  }
  lock.unlock();
  if (capturing(s)) {
    run_captured(rank, rs, c, s, seq);
    return;
  }
  lock.lock();
  record& rec = acquire(rank, c.op, seq, lock);
  lock.unlock();

  const auto deadline = clock::now() + options_.timeout;
  std::unique_lock call_lock(rs.call_mu);
  if (rs.comm == nullptr) {
    call_lock.unlock();
    fail_aborted(rank, c.op, seq);
  }
  const device_scope on(rs.ordinal);
  rec.start.record(s);
  shim::nccl_result r = issue(rs, c, s.native());
  // A nonblocking communicator may answer ncclInProgress (while it connects to its peers, say): the
  // collective is enqueued once ncclCommGetAsyncError says ncclSuccess. Polled with the lock released, so
  // abort() can end the wait.
  std::chrono::microseconds backoff(10);
  while (r == shim::nccl_in_progress) {
    call_lock.unlock();
    if (aborted()) fail_aborted(rank, c.op, seq);
    if (clock::now() >= deadline) {
      std::string why;
      {
        const std::lock_guard g(mu_);
        why = fmt::format("{} #{} on rank {} of {} (GPU {}) was not enqueued by NCCL within {} ms; {}",
                          to_string(c.op), seq, global(rank), size(), rs.ordinal, options_.timeout.count(),
                          not_issued(seq));
      }
      fail(rank, c.op, why);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::microseconds>(backoff * 2, poll_interval);
    call_lock.lock();
    if (rs.comm == nullptr) {
      call_lock.unlock();
      fail_aborted(rank, c.op, seq);
    }
    shim::nccl_result state = shim::nccl_success;
    r = api_.comm_get_async_error(rs.comm, &state);
    if (r == shim::nccl_success) r = state;
  }
  if (r != shim::nccl_success) {
    const char* detail = api_.get_last_error != nullptr ? api_.get_last_error(rs.comm) : nullptr;
    call_lock.unlock();
    fail(rank, c.op,
         fmt::format("{} #{} on rank {} of {} (GPU {}): NCCL failed: {}{}{}", to_string(c.op), seq,
                     global(rank), size(), rs.ordinal, api_.error_string(r),
                     detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : ""));
  }
  rec.end.record(s);
  call_lock.unlock();

  lock.lock();
  rec.busy = true;
  rec.started = false;
  rec.op = c.op;
  rec.seq = seq;
  // The watchdog sleeps while nothing is in flight and polls every poll_interval otherwise: only the first
  // collective in flight wakes it (waking it for each would have it query every record after every call).
  const bool was_idle = in_flight_++ == 0;
  lock.unlock();
  if (was_idle) cv_.notify_all();
}

void nccl_group::abort(const std::string& why) noexcept {
  {
    const std::lock_guard lock(mu_);
    if (!aborted_.load(std::memory_order_relaxed)) {
      try {
        reason_ = why;
      } catch (...) {
        // No memory for the reason: abort without it rather than not at all.
      }
      aborted_.store(true, std::memory_order_release);
    }
    // Collectives on the GPUs end with the communicators; nothing is followed any more.
    for (const auto& rs : ranks_)
      for (record& rec : rs->records) rec.busy = false;
    in_flight_ = 0;
  }
  cv_.notify_all();
  abort_communicators();
}

void nccl_group::abort_communicators() noexcept {
  for (std::size_t k = 0; k < ranks_.size(); ++k) {
    rank_state& rs = *ranks_[k];
    const std::lock_guard call(rs.call_mu);
    if (rs.comm == nullptr) continue;
    const device_scope on(rs.ordinal);
    const shim::nccl_result r = api_.comm_abort(rs.comm);
    FERRY_ASSERT_NOTHROW(r == shim::nccl_success,
                         fmt::format("ncclCommAbort of rank {} failed: {}", global(static_cast<int>(k)),
                                     api_.error_string(r)));
    rs.comm = nullptr;
  }
}

void nccl_group::close(int rank) noexcept {
  bool pending = false;
  {
    const std::lock_guard lock(mu_);
    try {
      static_cast<void>(check_records(clock::now()));
      if (!aborted_.load(std::memory_order_relaxed))
        reason_ = fmt::format("the communicator of rank {} was destroyed", global(rank));
    } catch (...) {
      // Formatting failed (no memory): the group still refuses later collectives.
    }
    aborted_.store(true, std::memory_order_release);
    pending = in_flight_ > 0;
  }
  if (pending) abort(reason());
}

std::string nccl_group::check_records(clock::time_point now) {
  std::string problem;
  for (std::size_t k = 0; k < ranks_.size(); ++k) {
    for (record& rec : ranks_[k]->records) {
      if (!rec.busy) continue;
      try {
        if (!rec.started && rec.start.query()) {
          rec.started = true;
          rec.started_at = now;
        }
        if (rec.started && rec.end.query()) {
          rec.busy = false;
          --in_flight_;
          continue;
        }
      } catch (const std::exception& e) {
        if (problem.empty())
          problem = fmt::format("{} #{} on rank {} of {} (GPU {}): asking whether it completed failed: {}",
                                to_string(rec.op), rec.seq, global(static_cast<int>(k)), size(),
                                ranks_[k]->ordinal, e.what());
        continue;
      }
      if (rec.started && now - rec.started_at > options_.timeout && problem.empty())
        problem = fmt::format("{} #{} on rank {} of {} (GPU {}) had not completed {} ms after it started; {}",
                              to_string(rec.op), rec.seq, global(static_cast<int>(k)), size(),
                              ranks_[k]->ordinal, options_.timeout.count(), not_issued(rec.seq));
    }
  }
  return problem;
}

std::string nccl_group::check_async_errors() noexcept {
  try {
    for (std::size_t k = 0; k < ranks_.size(); ++k) {
      rank_state& rs = *ranks_[k];
      // A rank inside an NCCL call sees its own errors; the watchdog does not wait for it.
      const std::unique_lock call(rs.call_mu, std::try_to_lock);
      if (!call.owns_lock() || rs.comm == nullptr) continue;
      shim::nccl_result state = shim::nccl_success;
      const shim::nccl_result r = api_.comm_get_async_error(rs.comm, &state);
      if (r != shim::nccl_success) state = r;
      if (state == shim::nccl_success || state == shim::nccl_in_progress) continue;
      const char* detail = api_.get_last_error != nullptr ? api_.get_last_error(rs.comm) : nullptr;
      return fmt::format("NCCL reported an asynchronous error on rank {} of {} (GPU {}): {}{}{}",
                         global(static_cast<int>(k)), size(), rs.ordinal, api_.error_string(state),
                         detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : "");
    }
  } catch (...) {
    return "out of memory while checking NCCL's asynchronous errors";
  }
  return {};
}

void nccl_group::watch() noexcept {
  // Note [Collectives in a CUDA graph]: this thread's event queries must not end another thread's capture.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode));
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (in_flight_ == 0) {
      // Nothing in flight: sleep until a collective is issued (no polling while idle).
      cv_.wait(lock, [&] { return stop_ || in_flight_ > 0; });
      continue;
    }
    cv_.wait_for(lock, poll_interval);
    if (stop_) break;
    std::string problem;
    try {
      problem = check_records(clock::now());
    } catch (...) {
      problem = "out of memory in the NCCL watchdog";
    }
    if (problem.empty() && in_flight_ > 0) {
      lock.unlock();
      problem = check_async_errors();
      lock.lock();
    }
    if (!problem.empty()) {
      lock.unlock();
      abort(problem);
      lock.lock();
    }
  }
}

}  // namespace ferry::comm::nccl_backend
