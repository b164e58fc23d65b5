// ferry::ingest::feed: a loader whose batches come from the caller instead of a fill function. The caller
// pushes each batch as a list of host byte ranges (ordinary pageable memory, such as a framework's CPU
// tensors) and the place of each in the batch; the loader's worker threads copy them into a pinned slot,
// chunk by chunk and in parallel, and a prefetcher takes the filled batches to the device like any
// loader's.
//
//   ingest::feed in(dev, {.batch_bytes = 64 << 20});
//   ingest::prefetcher gpu(dev, in.source(), {.depth = 2});
//   in.push(pieces_of(batch0));                // returns at once; the workers copy
//   auto b = gpu.next(compute);                // batch 0 on the device, `compute` waits for its copy
//
// Batch k of the feed is the k-th push. Every batch occupies a slot of batch_bytes (its pieces may cover
// less; the rest of the slot holds whatever an earlier batch left there).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "ferry/device/device.hpp"
#include "ferry/ingest/ingest.hpp"

namespace ferry::ingest {

/// One host byte range of a pushed batch, copied to `offset` within the batch.
struct feed_piece {
  const void* data = nullptr;
  std::size_t bytes = 0;
  std::size_t offset = 0;
};

/// Options of a feed. Memory bound: slots * slot_bytes() of pinned memory.
struct feed_options {
  std::size_t batch_bytes = 0;  // the largest batch; at least 1
  /// The unit of work of one worker: a batch is copied as ceil(batch_bytes / chunk_bytes) chunks. 0
  /// picks one that gives every worker about four chunks per batch (at least 256 KiB, a multiple of 256).
  std::size_t chunk_bytes = 0;
  std::size_t workers = 4;  // threads copying pieces into pinned slots
  std::size_t slots = 4;    // pinned batch slots
};

/// Host batches pushed by the caller, copied into pinned slots by worker threads. Thread-safe.
class feed {
 public:
  /// Throws logic_error for zero batch bytes, workers or slots; out_of_memory when the slots cannot be
  /// pinned.
  feed(device& dev, const feed_options& opts);
  feed(const feed&) = delete;
  feed& operator=(const feed&) = delete;
  /// close()s; never throws.
  ~feed();

  /// Queues the next batch and returns its number (0 for the first push) without waiting: the workers
  /// copy its pieces once its pinned slot is free. The pieces' memory must stay valid and unchanged until
  /// source().next() has handed the batch out (a prefetcher's next() returned it), or until close().
  /// Throws logic_error naming the piece when one reaches past batch_bytes, and stopped_error after
  /// close().
  std::uint64_t push(std::span<const feed_piece> pieces);
  /// Number of batches pushed so far.
  [[nodiscard]] std::uint64_t pushed() const;
  /// The loader that hands out the pushed batches in push order (for a prefetcher). It runs until
  /// closed: a consumer must not ask it for a batch that was never pushed unless another thread will
  /// push it or close the feed (or the loader, or a prefetcher over it).
  [[nodiscard]] loader& source() noexcept;
  /// Bytes of one pinned slot (batch_bytes rounded up to whole chunks).
  [[nodiscard]] std::size_t slot_bytes() const noexcept;
  [[nodiscard]] std::size_t chunk_bytes() const noexcept;
  /// Stops the workers (waking those waiting for a batch not yet pushed) and closes the loader; a
  /// consumer blocked on a batch that will never come wakes with stopped_error. Idempotent.
  void close() noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Options of a slot_feed. Memory: the caller's `pool` of slots * slot_bytes.
struct slot_feed_options {
  mem_view pool{};             // pinned (device::register_host), slot s at s * slot_bytes
  std::size_t slot_bytes = 0;  // a multiple of 256
  std::size_t slots = 0;
};

/// Batches written in place by the caller (other processes, say) into pinned slots it owns, handed to a
/// prefetcher with no host copy: batch k lives in slot k % slots. The caller waits until batch k's slot
/// is writable (the batch `slots` before it was copied to the device), writes it, and marks it ready; the
/// prefetcher copies ready batches in order. Thread-safe.
///
///   ingest::slot_feed in(dev, {.pool = registered.view(), .slot_bytes = b, .slots = 4});
///   ingest::prefetcher gpu(dev, in.source(), {.depth = 2});
///   if (in.wait_writable(0, 1s)) { write(in.slot(0)); in.ready(0); }
///   auto batch = gpu.next(compute);
class slot_feed {
 public:
  /// Throws logic_error for a pool that is not pinned or too small, a slot size that is 0 or not a
  /// multiple of 256, or 0 slots.
  slot_feed(device& dev, const slot_feed_options& opts);
  slot_feed(const slot_feed&) = delete;
  slot_feed& operator=(const slot_feed&) = delete;
  /// close()s; never throws.
  ~slot_feed();
  /// Waits up to `timeout` until batch k's slot may be written; true when it may. Throws stopped_error
  /// after close() and logic_error for a batch already marked ready.
  bool wait_writable(std::uint64_t k, std::chrono::milliseconds timeout);
  /// The bytes of batch k's slot.
  [[nodiscard]] std::span<std::byte> slot(std::uint64_t k) const;
  /// Batch k is written: the prefetcher may copy it. Throws logic_error when its slot was not writable
  /// (wait_writable did not return true for it) or it was marked ready already.
  void ready(std::uint64_t k);
  /// An eventfd that becomes readable whenever a slot became writable (read it to reset it), for a
  /// caller that waits on it beside other descriptors; -1 where eventfd is unavailable.
  [[nodiscard]] int event_fd() const noexcept;
  [[nodiscard]] loader& source() noexcept;
  /// Closes the loader and wakes every wait (stopped_error). Idempotent.
  void close() noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ferry::ingest
