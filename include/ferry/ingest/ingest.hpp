// ferry::ingest: the host-to-device path. A loader runs N worker threads that write samples straight into
// their place in a pinned batch slot (no collate copy); a prefetcher copies finished batches to the device
// on its own copy stream, k batches ahead, and hands out device batches whose readiness is an event the
// consumer's stream waits on, so the consumer never blocks the host for a copy.
//
//   ingest::loader data(dev, opts, [](const ingest::sample& s, ingest::sample_fields out) { ... });
//   ingest::prefetcher gpu(dev, data, {.depth = 2});
//   for (ingest::device_batch& b : gpu.batches(compute)) {   // compute already waits for b's copy
//     train_step(b.field(0), b.field(1), compute);
//   }                                                          // each batch is released on `compute`
//
// Threads. A loader runs `workers` threads; they claim work one sample at a time in (epoch, batch,
// position) order, so all of them cooperate on the oldest batches whose slots are free. A prefetcher
// runs one copier thread that takes the loader's batches in order and queues their copies; the pinned
// slot of a batch goes back to the loader from a host function on the copy stream, queued after the copy
// (so only once the copy completed).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/stats.hpp"
#include "ferry/device/device.hpp"

namespace ferry::ingest {

/// One field of every sample (an image, a label), of a fixed size per sample. A batch stores each field
/// contiguously: field f of sample j lives at offset f's base + j * sample_bytes.
struct field {
  std::string name;
  std::size_t sample_bytes = 0;
};

/// Which samples make which batch. Deterministic: the same options give the same batches on every run.
struct sampler_options {
  std::uint64_t dataset_size = 0;  // samples in the dataset
  std::size_t batch_size = 0;
  bool shuffle = false;  // a seeded permutation per epoch
  std::uint64_t seed = 0;
  bool drop_last = true;  // drop a final short batch
};

/// The batches of each epoch. Thread-safe (const).
class sampler {
 public:
  /// Throws logic_error for a zero dataset or batch size, or drop_last with a dataset smaller than a batch.
  explicit sampler(const sampler_options& opts);
  [[nodiscard]] std::size_t batches_per_epoch() const noexcept;
  /// Samples in batch `batch` (batch_size, or fewer for a final short batch).
  [[nodiscard]] std::size_t batch_samples(std::size_t batch) const;
  /// Dataset index of position `position` of batch `batch` of epoch `epoch`.
  [[nodiscard]] std::uint64_t index(std::uint64_t epoch, std::size_t batch, std::size_t position) const;
  [[nodiscard]] const sampler_options& options() const noexcept;

 private:
  struct impl;
  std::shared_ptr<const impl> impl_;
};

/// The seed of the sample of dataset index `index` in epoch `epoch` of a loader seeded `seed`:
/// mix64(mix64(mix64(seed) + epoch) + index). A fill that derives its content from it produces the same
/// bytes whichever worker runs it.
[[nodiscard]] std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t epoch,
                                        std::uint64_t index) noexcept;

/// What a fill callback is asked to produce.
struct sample {
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;   // batch number within the epoch
  std::size_t position = 0;  // place within the batch
  std::uint64_t index = 0;   // dataset index (from the sampler)
  std::uint64_t seed = 0;    // reproducible per (loader seed, epoch, index), whatever worker runs it
  std::size_t worker = 0;    // the worker thread running the callback
};

/// Where a sample goes: one span per field, inside a pinned batch slot.
using sample_fields = std::span<const std::span<std::byte>>;

/// Writes one sample. Runs on the loader's worker threads, concurrently for different samples; an
/// exception fails the loader and reaches the consumer at its next call.
using fill_fn = std::function<void(const sample&, sample_fields)>;

/// Options of a loader. Memory bound: slots batches of pinned memory.
struct loader_options {
  std::vector<field> fields;
  sampler_options sampling;
  std::size_t workers = 4;
  std::size_t slots = 4;     // pinned batch slots (how far the workers may run ahead)
  std::uint64_t epochs = 1;  // 0: run until closed
  std::uint64_t seed = 0;    // the root of every sample's seed
  /// Pinned memory of the caller's for the slots (slot s at s * slot bytes), such as a shared mapping
  /// registered with device::register_host, valid until the loader is destroyed; empty (the default):
  /// the loader pins its own.
  mem_view pool{};
};

/// Counters and stage times of a loader; the same shape as egress::pipeline_stats and prefetch_stats.
struct loader_stats {
  std::uint64_t samples = 0;       // samples filled
  std::uint64_t bytes = 0;         // bytes filled
  double pin_seconds = 0;          // time spent pinning the slots at construction
  std::uint64_t pinned_bytes = 0;  // size of the slots
  /// "fill" (wall time per sample), "fill_cpu" (thread CPU time per sample, from
  /// CLOCK_THREAD_CPUTIME_ID), "wait_slot" (workers waiting for a free slot), "wait_batch" (next()
  /// waiting for a batch).
  std::vector<stage_snapshot> stages;
};

/// A filled batch in pinned host memory, lent to the caller until released. Cheap to copy: `fields_`
/// views the loader's per-slot field table (whole-slot views), valid while the loader lives.
struct host_batch {
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;
  std::size_t samples = 0;
  std::size_t slot = 0;
  /// The bytes of field `f` for this batch's samples (samples * sample_bytes). Throws logic_error for a
  /// field out of range.
  [[nodiscard]] std::span<std::byte> field(std::size_t f) const;
  /// As field(f), as pinned memory, for copies.
  [[nodiscard]] mem_view view(std::size_t f) const;
  std::span<const mem_view> fields_;           // per field: the slot's whole region of that field
  std::span<const std::size_t> sample_bytes_;  // per field
};

/// N worker threads filling pinned batch slots, batches handed out in order whatever the worker timing.
class loader {
 public:
  /// Throws logic_error for no fields, a zero-sized field, zero workers or slots, or an empty fill;
  /// out_of_memory when the slots cannot be pinned.
  loader(device& dev, const loader_options& opts, fill_fn fill);
  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;
  /// Stops and joins every worker (mid-epoch too); never throws.
  ~loader();

  /// The next batch in order; blocks while it is being filled; nullopt after the last epoch. Rethrows
  /// a fill error; throws stopped_error after close().
  [[nodiscard]] std::optional<host_batch> next();
  /// As next, but nullopt at once when the next batch is not filled yet (check done()).
  [[nodiscard]] std::optional<host_batch> try_next();
  /// Gives a batch's slot back for refilling. Only once nothing reads the slot any more (the prefetcher
  /// releases after the event of its copy completed).
  void release(const host_batch& b);
  /// True once every batch of every epoch was handed out.
  [[nodiscard]] bool done() const;
  /// Stops the workers (mid-epoch too) and wakes a blocked next(). Idempotent.
  void close();
  /// True once the loader was closed or failed: a fill that waits for something outside the loader
  /// polls it, so that close() (which joins the workers) never waits for that fill forever.
  [[nodiscard]] bool stopping() const noexcept;

  [[nodiscard]] const loader_options& options() const noexcept;
  [[nodiscard]] const sampler& batches() const noexcept;
  /// Total bytes of one full batch (all fields).
  [[nodiscard]] std::size_t batch_bytes() const noexcept;
  /// Counters, the pinning cost and stage times (loader_stats). Thread-safe.
  [[nodiscard]] loader_stats stats() const;
  /// Byte offset of field `f` within a slot (a multiple of 256), for slot layouts elsewhere.
  [[nodiscard]] std::size_t field_offset(std::size_t f) const;

 private:
  struct impl;
  // A slot_feed's loader has no workers: the feed's caller writes the slots and the feed marks them ready.
  friend class slot_feed;
  explicit loader(std::unique_ptr<impl> state) noexcept;
  std::unique_ptr<impl> impl_;
};

/// A batch on the device, lent to the consumer until released on the consumer's stream. Cheap to copy:
/// `fields_` views the prefetcher's per-slot table, valid while the prefetcher lives.
struct device_batch {
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;
  std::size_t samples = 0;
  std::size_t slot = 0;
  std::span<const mem_view> fields_;  // device memory, samples * sample_bytes per field
  /// Device bytes of field `f` for this batch's samples. Throws logic_error for a field out of range.
  [[nodiscard]] mem_view field(std::size_t f) const;
};

/// Options of a prefetcher. Memory bound: depth batches of device memory.
struct prefetch_options {
  std::size_t depth = 2;  // device batch slots: batches copied ahead of the consumer
};

/// Counters and stage times of a prefetcher; the same shape as egress::pipeline_stats and loader_stats.
struct prefetch_stats {
  std::uint64_t batches = 0;  // batches copied to the device (their events completed)
  std::uint64_t bytes = 0;    // bytes copied
  double copy_seconds = 0;    // sum of H2D copy times (timed with events on the copy stream)
  double h2d_gbps = 0;        // bytes / copy_seconds / 1e9: the achieved copy bandwidth
  /// Times the copier thread waited for the device: to read a copy's time it found the copy still
  /// running. 0 in a healthy pipeline (it reads the times of copies the loader already saw complete);
  /// each wait holds up the next copy and, on the cuda backend, busy-waits a core.
  std::uint64_t copier_waits = 0;
  /// "copy" (event-timed per batch, with items and bytes), "wait_batch" (next() waiting for the
  /// copier), "wait_slot" (the copier waiting for the consumer to release a device slot).
  std::vector<stage_snapshot> stages;
};

/// Copies the loader's batches to the device on its own stream, `depth` ahead of the consumer.
class prefetcher {
 public:
  /// Throws logic_error for depth 0; out_of_memory when the device slots cannot be had.
  prefetcher(device& dev, loader& source, const prefetch_options& opts = {});
  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  ~prefetcher();

  /// The next device batch; `consumer` has been made to wait (on the device) for its copy, so work the
  /// caller queues on `consumer` afterwards sees the batch. Blocks the host only while the loader has
  /// not produced it. nullopt at the end. Rethrows loader and copy errors.
  [[nodiscard]] std::optional<device_batch> next(stream_view consumer);
  /// Hands the device slot back: an event is recorded on `consumer`, and the slot is refilled only
  /// after it completes. Never blocks the host.
  void release(const device_batch& b, stream_view consumer);
  /// Stops copying and closes the loader; wakes a next() blocked on another thread (it throws
  /// stopped_error). Waits for the copies already queued. Batches still lent stay valid until the
  /// prefetcher is destroyed; the destructor waits for the release events recorded so far, so destroy it
  /// only after the consumer's work on unreleased batches is done. Idempotent; never throws.
  void close();

  /// Counters, the achieved copy bandwidth and stage times (prefetch_stats). Copies are counted once
  /// their events completed (all of them after close()). Thread-safe.
  [[nodiscard]] prefetch_stats stats() const;

  /// Range-for over the remaining batches on `consumer`; each batch is released on `consumer` when the
  /// iteration moves on (++ releases the current batch, then fetches the next). When a loop ends early
  /// (break, return, exception), the batch it held is released on `consumer` when the range object is
  /// destroyed (a range-for's range lives until the loop ends), so its slot returns to the ring. One
  /// iteration per range: begin() fetches the first batch once.
  class range;
  [[nodiscard]] range batches(stream_view consumer);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The batches of a prefetcher on one consumer stream. Holds the current batch, so that an iteration
/// that ends early still releases it (in the destructor, which never throws). Move-only.
class prefetcher::range {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = device_batch;
    using difference_type = std::ptrdiff_t;
    using pointer = device_batch*;
    using reference = device_batch&;
    iterator() = default;
    explicit iterator(range* r) : r_(r) {}
    device_batch& operator*() const { return *r_->current_; }
    device_batch* operator->() const { return &*r_->current_; }
    /// Releases the current batch on the consumer stream, then fetches the next (may block, may throw).
    iterator& operator++() {
      r_->advance();
      return *this;
    }
    bool operator==(std::default_sentinel_t) const noexcept {
      return r_ == nullptr || !r_->current_.has_value();
    }

   private:
    range* r_ = nullptr;
  };
  range(prefetcher& p, stream_view consumer) : p_(&p), consumer_(consumer) {}
  range(range&& other) noexcept
      : p_(std::exchange(other.p_, nullptr)),
        consumer_(other.consumer_),
        current_(std::exchange(other.current_, std::nullopt)),
        started_(other.started_) {}
  range& operator=(range&&) = delete;
  range(const range&) = delete;
  range& operator=(const range&) = delete;
  /// Releases the batch an unfinished iteration holds. Never throws.
  ~range();
  /// Fetches the first batch (once; later calls return an iterator at the current batch).
  iterator begin();
  std::default_sentinel_t end() { return {}; }

 private:
  void advance();
  prefetcher* p_;
  stream_view consumer_;
  std::optional<device_batch> current_;
  bool started_ = false;
};

}  // namespace ferry::ingest
