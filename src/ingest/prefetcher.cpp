// The prefetcher: one copier thread takes the loader's batches in order and queues their H2D copies on
// the prefetcher's copy stream, into device slots used in rotation (batch k in slot k % depth).
//
// The device slots are a slot_ring, in order and rotating (batch k is acquisition k, in slot k % depth):
// the copier acquires a slot (back-pressure: it waits while the consumer holds the batch depth before),
// queues the copy and marks the slot ready at once (the copy's completion is an event the consumer's
// stream waits on, not a host wait); next() takes slots in order and release() frees them. The copier
// stops the ring at the loader's end (next() drains what was queued, then returns nullopt); close() and
// errors fail it, so that next() throws even when batches are queued, as before.
//
// Per device slot d, a completion event `released_[d]`, recorded on the consumer's stream by release().
// Per copy, a pair of timing events around it, from a ring of depth + loader-slots pairs (copy k uses
// pair k % ring): `start_[p]` and `ready_[p]`. A copy into d is queued only once the consumer released
// d's previous batch on the host (release() is called as soon as the consumer queued its last use, so
// this is a hand-off, not a wait for the device), and the copy stream waits on `released_[d]` on the
// device before it writes. next() makes the consumer's stream wait on the batch's `ready_` event. After
// the copy a host function on the copy stream gives the pinned slot back to the loader: it runs only once
// the copy completed, so a pinned slot is never refilled early.
//
// The copier never waits for the device. A pair is reused (and its copy's time read) ring copies later;
// the copier then holds a batch whose pinned slot the loader refilled, which it could only do after the
// copy `loader slots` batches back completed, so that copy's events are complete and reading them does
// not block. (Reading a pair only `depth` copies back would make the copier wait, busy on the cuda
// backend, for a copy queued behind the consumer's compute: most of a step's CPU time.) A read that finds
// its copy still running is counted in prefetch_stats::copier_waits.
//
#include <fmt/format.h>

#include <utility>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "ferry/core/error.hpp"
#include "ferry/core/slot_ring.hpp"
#include "ferry/core/units.hpp"
#include "ferry/ingest/ingest.hpp"
#include "ferry/trace/timeline.hpp"
#include "layout.hpp"
#include "ring_waits.hpp"

namespace ferry::ingest {

mem_view device_batch::field(std::size_t f) const {
  FERRY_EXPECTS(
      f < fields_.size(),
      fmt::format("ingest device_batch: field {} is out of range; a batch has {} fields", f, fields_.size()));
  return fields_[f];
}

struct prefetcher::impl {
  impl(device& dev, loader& source, const prefetch_options& opts);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl();

  std::optional<device_batch> next(stream_view consumer);
  void release(const device_batch& b, stream_view consumer);
  void close() noexcept;
  void copier() noexcept;
  void fail(std::exception_ptr e) noexcept;
  // Adds the copy timed by pair p to the "copy" stage; blocks (counted in copier_waits_) when its timing
  // event has not completed.
  void harvest(std::size_t p);
  void harvest_all() noexcept;

  device& dev_;
  loader& source_;
  const prefetch_options opts_;
  const detail::batch_layout layout_;

  stats_registry stats_;
  stage_stats& copy_ = stats_.add_stage("copy");
  stage_stats& wait_batch_ = stats_.add_stage("wait_batch");
  stage_stats& wait_slot_ = stats_.add_stage("wait_slot");

  buffer pool_;
  std::vector<std::vector<mem_view>> slot_fields_;  // per device slot, per field: the whole region
  // Per device slot, filled by the copier before it marks the slot ready; read after take_ready().
  std::vector<std::vector<mem_view>> lent_fields_;  // per slot, per field: samples * sample_bytes
  std::vector<event> released_;                     // per device slot
  std::vector<event> start_;                        // per timing pair
  std::vector<event> ready_;                        // per timing pair
  std::vector<std::uint64_t> copied_bytes_;  // per timing pair: bytes of the copy not yet harvested (0: none)
  std::atomic<std::uint64_t> copier_waits_{0};
  // Per loader slot: the host batch whose copy is in flight (written by the copier, read by the host
  // function that returns it; the loader's hand-out orders the two).
  std::vector<host_batch> held_;

  slot_ring ring_;
  // Per device slot, written by the copier before mark_ready and read after take_ready (the ring orders
  // them): the batch it holds (a stale release of an earlier occupant is refused by its epoch and batch)
  // and the timing pair of its copy.
  std::vector<device_batch> held_batch_;
  std::vector<std::size_t> ready_pair_;
  std::atomic<bool> closing_{false};

  std::mutex close_mu_;
  bool closed_ = false;  // guarded by close_mu_
  stream copy_stream_;   // after the events and pool: destroyed (finishing its work) first
  std::thread thread_;
};

prefetcher::impl::impl(device& dev, loader& source, const prefetch_options& opts)
    : dev_(dev),
      source_(source),
      opts_(opts),
      layout_(source.options().fields, source.options().sampling.batch_size),
      ring_(opts.depth == 0 ? 1 : opts.depth, delivery::in_order, placement::rotating) {
  FERRY_EXPECTS(opts.depth > 0,
                "ingest prefetch_options::depth is 0: the prefetcher needs at least one device slot");
  FERRY_EXPECTS(opts.depth <= std::numeric_limits<std::size_t>::max() / layout_.slot_bytes,
                fmt::format("ingest prefetcher: depth {} of {} overflows the address space", opts.depth,
                            format_bytes(layout_.slot_bytes)));
  const std::size_t n = opts.depth;
  const std::size_t nfields = layout_.offset.size();
  pool_ = dev_.alloc_device(n * layout_.slot_bytes);
  slot_fields_.resize(n);
  lent_fields_.assign(n, std::vector<mem_view>(nfields));
  for (std::size_t d = 0; d < n; ++d) {
    for (std::size_t f = 0; f < nfields; ++f) {
      slot_fields_[d].push_back(
          pool_.view(d * layout_.slot_bytes + layout_.offset[f], layout_.field_bytes[f]));
    }
    released_.push_back(dev_.make_event());
  }
  const std::size_t pairs = n + source.options().slots;
  for (std::size_t p = 0; p < pairs; ++p) {
    start_.push_back(dev_.make_timing_event());
    ready_.push_back(dev_.make_timing_event());
  }
  copied_bytes_.assign(pairs, 0);
  ready_pair_.assign(n, 0);
  held_.resize(source.options().slots);
  held_batch_.resize(n);
  copy_stream_ = dev_.make_stream();
  thread_ = std::thread([this] { copier(); });
}

prefetcher::impl::~impl() {
  close();
  // The consumer may still be reading slots it released; wait for its release events before the device
  // slots are freed.
  for (auto& e : released_) {
    try {
      if (e.recorded()) e.synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot report a device error better
    }
  }
}

void prefetcher::impl::fail(std::exception_ptr e) noexcept {
  try {
    ring_.fail(std::move(e));
  } catch (...) {  // NOLINT(bugprone-empty-catch): only for a null error, which a catch never passes
  }
}

void prefetcher::impl::harvest(std::size_t p) {
  if (copied_bytes_[p] == 0) return;
  if (!ready_[p].query()) {
    copier_waits_.fetch_add(1, std::memory_order_relaxed);
    ready_[p].synchronize();
  }
  const double ms = dev_.elapsed_ms(start_[p], ready_[p]);
  copy_.record(std::chrono::nanoseconds(static_cast<std::int64_t>(ms * 1e6)), 1, copied_bytes_[p]);
  copied_bytes_[p] = 0;
}

void prefetcher::impl::harvest_all() noexcept {
  for (std::size_t d = 0; d < copied_bytes_.size(); ++d) {
    try {
      harvest(d);
    } catch (...) {
      copied_bytes_[d] = 0;
    }
  }
}

void prefetcher::impl::copier() noexcept {
  trace::name_this_thread("ingest-copier");
  const std::size_t nfields = layout_.offset.size();
  std::uint64_t k = 0;
  std::optional<host_batch> hb;
  try {
    for (;; ++k) {
      hb = source_.next();
      if (!hb) {
        ring_.stop();  // the end: next() hands out what was queued, then nullopt
        return;
      }
      std::optional<std::size_t> slot;
      try {
        slot = detail::timed_if_waiting(
            wait_slot_, [&] { return ring_.try_acquire(); },
            [&] { return std::optional<std::size_t>(ring_.acquire()); });
      } catch (...) {
        if (!ring_.stopped()) throw;
        break;  // closed or failed meanwhile
      }
      const std::size_t d = *slot;  // k % depth
      const std::size_t p = static_cast<std::size_t>(k % start_.size());
      harvest(p);  // the copy that last used pair p (ring copies ago: complete, see above)
      if (released_[d].recorded()) copy_stream_.wait(released_[d]);
      start_[p].record(copy_stream_);
      std::uint64_t bytes = 0;
      for (std::size_t f = 0; f < nfields; ++f) {
        const mem_view src = hb->view(f);
        const mem_view dst = slot_fields_[d][f].subview(0, src.bytes);
        dev_.copy_async(dst, src, copy_stream_);
        lent_fields_[d][f] = dst;
        bytes += src.bytes;
      }
      ready_[p].record(copy_stream_);
      copied_bytes_[p] = bytes;
      const std::size_t ls = hb->slot;
      held_[ls] = *hb;
      hb.reset();
      // Queued after the copy: runs once it completed, so the pinned slot is refilled only then.
      dev_.launch_host_func(copy_stream_, [this, ls] {
        try {
          source_.release(held_[ls]);
        } catch (...) {
          fail(std::current_exception());
        }
      });
      device_batch& b = held_batch_[d];
      b.epoch = held_[ls].epoch;
      b.batch = held_[ls].batch;
      b.samples = held_[ls].samples;
      b.slot = d;
      b.fields_ = lent_fields_[d];
      ready_pair_[d] = p;
      ring_.mark_ready(d);
    }
  } catch (const stopped_error&) {
    // Closed by close(): nothing to report. Closed by someone else: the consumer must hear of it, or its
    // next() would wait for a batch that never comes.
    if (!closing_.load(std::memory_order_acquire)) fail(std::current_exception());
  } catch (...) {
    fail(std::current_exception());
  }
  if (hb) {
    try {
      source_.release(*hb);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the loader is closing or failed already
    }
  }
}

std::optional<device_batch> prefetcher::impl::next(stream_view consumer) {
  std::optional<std::size_t> slot;
  try {
    slot = detail::timed_if_waiting(
        wait_batch_, [&] { return ring_.try_take_ready(); },
        [&] { return std::optional<std::size_t>(ring_.take_ready()); });
  } catch (const stopped_error&) {
    if (ring_.failed()) throw;  // closed (or the loader's stopped_error): as it is
    return std::nullopt;        // stopped without a failure: the loader ended and every batch was taken
  }
  // Recorded by the copier before it marked the slot ready, and not again before the slot is released
  // (the pair is reused ring > depth copies later).
  consumer.wait(ready_[ready_pair_[*slot]]);
  return held_batch_[*slot];
}

void prefetcher::impl::release(const device_batch& b, stream_view consumer) {
  FERRY_EXPECTS(
      b.slot < opts_.depth && ring_.state(b.slot) == slot_state::in_use &&
          held_batch_[b.slot].epoch == b.epoch && held_batch_[b.slot].batch == b.batch &&
          b.fields_.data() == lent_fields_[b.slot].data(),
      fmt::format("ingest prefetcher release of batch {} of epoch {} in device slot {}, which is not "
                  "lent out (released twice, or from another prefetcher?)",
                  b.batch, b.epoch, b.slot));
  // The copier reads released_[slot] only after it acquired the slot again, which the ring orders after
  // this release: the record comes first.
  released_[b.slot].record(consumer);
  ring_.release(b.slot);
}

void prefetcher::impl::close() noexcept {
  const std::lock_guard close_lock(close_mu_);
  if (closed_) return;
  closed_ = true;
  closing_.store(true, std::memory_order_release);
  detail::fail_closed(ring_, "ingest prefetcher is closed: it hands out no more batches");
  source_.close();  // wakes the copier in loader::next()
  if (thread_.joinable()) thread_.join();
  try {
    copy_stream_.synchronize();  // every copy done and every pinned slot given back
  } catch (...) {  // NOLINT(bugprone-empty-catch): close never throws; the error was the copier's to report
  }
  harvest_all();
}

prefetcher::prefetcher(device& dev, loader& source, const prefetch_options& opts)
    : impl_(std::make_unique<impl>(dev, source, opts)) {}
prefetcher::~prefetcher() = default;
std::optional<device_batch> prefetcher::next(stream_view consumer) { return impl_->next(consumer); }
void prefetcher::release(const device_batch& b, stream_view consumer) { impl_->release(b, consumer); }
void prefetcher::close() { impl_->close(); }
prefetch_stats prefetcher::stats() const {
  prefetch_stats s;
  s.batches = impl_->copy_.items.load();
  s.bytes = impl_->copy_.bytes.load();
  s.copy_seconds = static_cast<double>(impl_->copy_.time.sum_ns()) / 1e9;
  s.h2d_gbps = gb_per_s(s.bytes, s.copy_seconds);
  s.copier_waits = impl_->copier_waits_.load();
  s.stages = impl_->stats_.snapshot();
  return s;
}
prefetcher::range prefetcher::batches(stream_view consumer) { return {*this, consumer}; }

prefetcher::range::~range() {
  if (p_ == nullptr || !current_) return;
  try {
    p_->release(*current_, consumer_);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor never throws
  }
}

prefetcher::range::iterator prefetcher::range::begin() {
  if (!started_) {
    started_ = true;
    current_ = p_->next(consumer_);
  }
  return iterator(this);
}

void prefetcher::range::advance() {
  if (current_) {
    const device_batch b = *std::exchange(current_, std::nullopt);
    p_->release(b, consumer_);
  }
  current_ = p_->next(consumer_);
}

}  // namespace ferry::ingest
