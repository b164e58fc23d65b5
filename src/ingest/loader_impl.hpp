// The loader's state, in a header of its own because the slot feed (feed.cpp) drives a loader with no
// workers: its caller writes each batch in place and the feed marks it ready on the loader's ring.
//
// Slots. A slot_ring of `slots` slots, delivered in order and placed in rotation, so batch g (counted over
// every epoch: epoch g / batches_per_epoch, batch g % batches_per_epoch) is the ring's acquisition g and
// lives in slot g % slots, as host_batch::slot and the slot feed promise. The ring holds all the waiting:
// a producer's for its batch's slot (back-pressure: at most `slots` batches ahead of the consumer),
// next()'s for the next batch in order, and the wake-up of both on close or a failure.
//
// Work. Workers draw tickets from one atomic counter; ticket t is position t % batch_size of batch
// t / batch_size (positions past a short final batch are skipped). So the workers cooperate on the oldest
// batches: every worker holding a position of batch g calls acquire_nth(g), the first of them makes the
// acquisition once slot g % slots is free and the others join it. `filled_[s]` counts the samples written
// into slot s; the worker that writes the last one resets it and marks the slot ready. A worker holds a
// position of batch g until it has written it, so nobody joins g after g was marked ready.
//
// Synchronization. Sample bytes are published by the release/acquire chain of `filled_` to the last
// writer and then by the ring's mutex (mark_ready, take_ready). A slot's next occupant is written only
// after the ring handed the slot out again, which follows the consumer's release.
//
// End and close. When the last batch is handed out the loader stops the ring (a consumer waiting for more
// wakes and gets nullopt: the ring stopped without a failure). close() fails the ring with stopped_error
// and a fill's exception fails it with that exception: either way every wait wakes and every later call
// rethrows it, even when batches are ready; the first of the two is kept.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ferry/core/slot_ring.hpp"
#include "ferry/core/stats.hpp"
#include "ferry/ingest/ingest.hpp"
#include "layout.hpp"

namespace ferry::ingest {

struct loader::impl {
  /// Filled by `opts.workers` threads calling `fill`.
  impl(device& dev, const loader_options& opts, fill_fn fill);
  /// Filled by its owner through claim() and finish() (opts.workers is 0): no threads.
  struct external_fill {};
  impl(device& dev, const loader_options& opts, external_fill);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  impl(impl&&) = delete;
  impl& operator=(impl&&) = delete;
  ~impl() { close(); }

  std::optional<host_batch> take(bool block);
  void release(const host_batch& b);
  void close() noexcept;
  void fail(std::exception_ptr e) noexcept;

  // The owner's side of an external fill. claim(): batch g's slot once it may be written, waiting up to
  // `timeout` (std::nullopt on timeout); throws as slot_ring::acquire_nth. finish(): the slot's batch is
  // written. on_release_ (set before any batch is out) runs after every release, when a slot may have
  // become claimable.
  std::optional<std::size_t> claim(std::uint64_t g, std::chrono::nanoseconds timeout);
  void finish(std::size_t slot);
  std::function<void()> on_release_;

  device& dev_;
  const loader_options opts_;
  const sampler sampler_;
  const fill_fn fill_;
  const detail::batch_layout layout_;
  const std::size_t per_epoch_ = sampler_.batches_per_epoch();
  const std::uint64_t total_;  // batches over every epoch; the uint64 maximum: forever

  stats_registry stats_;
  stage_stats& fill_time_ = stats_.add_stage("fill");
  stage_stats& fill_cpu_ = stats_.add_stage("fill_cpu");
  stage_stats& wait_slot_ = stats_.add_stage("wait_slot");
  stage_stats& wait_batch_ = stats_.add_stage("wait_batch");

  buffer own_pool_;  // empty when the slots are the caller's (loader_options::pool)
  mem_view pool_;
  double pin_seconds_ = 0;
  std::vector<std::vector<mem_view>> slot_fields_;  // per slot, per field: the whole field region

  slot_ring ring_;
  std::atomic<std::uint64_t> next_ticket_{0};
  std::unique_ptr<std::atomic<std::size_t>[]> filled_;  // per slot: samples written of its batch
  // External fill, per slot: when its batch was first claimed (steady ns; 0: not claimed), for "fill".
  std::unique_ptr<std::atomic<std::int64_t>[]> claimed_at_;
  std::atomic<bool> ended_{false};     // closed or failed: workers stop, fills that wait poll it
  std::atomic<bool> finished_{false};  // the last batch was handed out

  std::mutex join_mu_;
  std::vector<std::thread> workers_;

 private:
  impl(device& dev, const loader_options& opts, fill_fn fill, bool external);
  void work(std::size_t worker) noexcept;
  // Batch g's slot for a worker; std::nullopt when the ring stopped (closed or failed).
  std::optional<std::size_t> slot_for(std::uint64_t g);
  void filled(std::size_t slot, std::uint64_t g);
  [[nodiscard]] std::size_t samples_of(std::uint64_t g) const {
    return sampler_.batch_samples(g % per_epoch_);
  }
  [[nodiscard]] host_batch batch_of(std::uint64_t g) const;
};

}  // namespace ferry::ingest
