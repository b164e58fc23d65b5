// The egress pipeline: submitters queue slot-sized D2H copies on the pipeline's own stream, one completion
// thread waits for each copy's event in queue order and marks its slot ready, sink workers consume ready
// slots and return them to the pool.
//
// Accounting. A slot's cycle is the slot_ring's: free -> in_flight (a submitter holds it, then its copy is
// queued) -> ready (its copy's event completed) -> in_use (a worker consumes it) -> free. Every queued
// chunk gets a ticket, its position in the egress stream; flush waits for the tickets it saw, close for
// every slot to be free. The pipeline mutex `mu_` guards the completion queue, the tickets and the
// failure, and every transition that frees a slot happens under it, so a submitter or flusher that checks
// its condition under `mu_` cannot miss the wake-up.
//
// Failure. fail() keeps the first error, fails the ring (workers stop taking slots, so nothing is consumed
// after the error except what was already taken) and, under `mu_`, returns every ready slot to the pool.
// From then on the completion thread returns each slot whose copy completes instead of marking it ready,
// and workers release the slots they hold when their consume returns: the pool becomes full again.
//
// Lock order: close_mu_ -> the submitters' turn -> mu_ -> the ring's own lock; flush_mu_ is taken with
// none of the others held but close_mu_ and the turn.
#include "ferry/egress/egress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <stop_token>
#include <utility>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/core/worker_pool.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::egress {
namespace {

using steady = std::chrono::steady_clock;

constexpr std::uint64_t no_ticket = std::numeric_limits<std::uint64_t>::max();

// How submit waits for slots.
enum class wait_mode { block, none, until };

std::string describe_options(const options& o) {
  return fmt::format("slots {}, slot_bytes {}, sink_workers {}", o.slots, o.slot_bytes, o.sink_workers);
}

}  // namespace

struct pipeline::impl {
  impl(device& dev, std::shared_ptr<sink> out, const egress::options& opts);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() = default;

  event submit(mem_view data, stream_view producer, std::uint64_t tag, wait_mode mode,
               std::chrono::nanoseconds timeout);
  void flush();
  // close() without the rethrow: never throws; what goes wrong becomes the pipeline's error.
  void close_quietly() noexcept;
  void rethrow_error();
  void report_uncollected() noexcept;
  [[nodiscard]] pipeline_stats stats() const;
  [[nodiscard]] const egress::options& config() const noexcept { return opts_; }
  [[nodiscard]] std::size_t free_slots() const { return ring_.count(slot_state::free); }
  [[nodiscard]] bool on_sink_worker() const noexcept;

 private:
  static egress::options validated(const egress::options& o, bool has_sink);
  [[nodiscard]] std::size_t chunks_of(std::size_t bytes) const noexcept {
    return bytes / opts_.slot_bytes + (bytes % opts_.slot_bytes != 0 ? 1 : 0);
  }
  [[nodiscard]] std::byte* slot_bytes(std::size_t slot) const noexcept {
    return static_cast<std::byte*>(pool_.data()) + slot * opts_.slot_bytes;
  }
  void expect_submittable(const mem_view& data, const stream_view& producer, std::size_t chunks,
                          wait_mode mode) const;
  // Waits (under mu_) until a slot is free or the pipeline ended; false when it ended. Adds the time it
  // blocked to `waited`.
  bool wait_for_free_slot(std::chrono::nanoseconds& waited);
  // Queues the copy of one chunk into `slot` (held in_flight by the caller) and hands it to the
  // completion thread.
  void queue_chunk(std::size_t slot, const mem_view& data, std::uint64_t offset, std::uint64_t sequence,
                   std::uint64_t tag, std::uint32_t chunk, std::uint32_t chunks);
  // Rethrow the failure (marking it collected); the _locked forms run with mu_ held.
  void rethrow_error_locked();
  // Throws the failure or stopped_error when the pipeline ended; called with mu_ held.
  void throw_if_ended_locked();
  void throw_if_ended();
  void fail(std::exception_ptr error) noexcept;
  [[nodiscard]] std::uint64_t oldest_ticket_locked() const noexcept;
  // Returns `slot` (done with: consumed, or never to be delivered) to the pool; with mu_ held.
  void free_slot_locked(std::size_t slot, bool in_use);

  // The submitters' turn: held while an output's chunks are queued (and while waiting for their slots).
  // A flag under a mutex rather than a std::timed_mutex, whose timed lock ThreadSanitizer cannot follow.
  class turn;
  bool take_turn(wait_mode mode, steady::time_point deadline);
  void give_turn() noexcept;

  void completion_loop(std::stop_token stop);
  void sink_loop(std::stop_token stop);

  device& dev_;
  std::shared_ptr<sink> sink_;
  const egress::options opts_;  // validated before anything below is built from it
  const std::size_t pool_bytes_ = opts_.slots * opts_.slot_bytes;

  stats_registry stats_;
  stage_stats& wait_slot_ = stats_.add_stage("wait_slot");
  stage_stats& copy_ = stats_.add_stage("copy");
  stage_stats& consume_ = stats_.add_stage("sink");
  counter outputs_;
  counter dropped_;

  slot_ring ring_{opts_.slots, opts_.order};
  // What each slot holds: written by the submitter holding it in_flight, read by the completion thread
  // and the worker that takes it; the ring's and mu_'s locks order those accesses.
  std::vector<output_chunk> held_ = std::vector<output_chunk>(opts_.slots);

  mutable std::mutex mu_;
  std::condition_variable slot_freed_;  // submitters and flushers wait on it
  std::condition_variable queued_;      // the completion thread waits on it
  // Guarded by mu_:
  std::vector<std::uint64_t> ticket_ = std::vector<std::uint64_t>(opts_.slots, no_ticket);
  std::vector<std::size_t> completion_queue_ =
      std::vector<std::size_t>(opts_.slots);  // a ring, in queue order
  std::size_t queue_head_ = 0;
  std::size_t queue_count_ = 0;
  std::uint64_t next_ticket_ = 0;
  bool closing_ = false;
  bool stop_completion_ = false;
  std::exception_ptr error_;
  bool error_collected_ = false;

  std::mutex turn_mu_;
  std::condition_variable turn_free_;
  bool turn_taken_ = false;          // guarded by turn_mu_
  std::uint64_t next_sequence_ = 0;  // guarded by the turn
  std::mutex flush_mu_;              // serializes sink::flush
  std::mutex close_mu_;
  bool closed_ = false;  // guarded by close_mu_

  // Device objects, destroyed in reverse order: the stream (which finishes its work) before the events
  // and the pinned pool it uses.
  buffer pool_;
  double pin_seconds_ = 0;
  std::vector<event> started_;  // per slot: timing event recorded before its copy
  std::vector<event> copied_;   // per slot: timing event recorded after its copy; the completion event
  // Per slot: where the producer was when the output whose first chunk the slot holds was submitted.
  // One event per slot, not one per pipeline: an event is recorded again only after the egress stream
  // has passed the wait on its previous record (the slot's copy, queued after that wait, completed), so
  // a wait never depends on which of several producer streams reaches its record first.
  std::vector<event> marks_;
  stream egress_;

  std::optional<worker_pool> completion_;
  std::optional<worker_pool> workers_;
};

namespace {
// The pipeline whose sink worker this thread is, so that flush and close can refuse to wait for
// themselves.
thread_local const void* current_sink_worker = nullptr;
}  // namespace

egress::options pipeline::impl::validated(const egress::options& o, bool has_sink) {
  FERRY_EXPECTS(has_sink, "egress pipeline of a null sink: pass a sink (null_sink discards everything)");
  FERRY_EXPECTS(o.slots > 0, fmt::format("egress options::slots is 0 ({}): the pool needs at least one slot",
                                         describe_options(o)));
  FERRY_EXPECTS(o.slot_bytes > 0,
                fmt::format("egress options::slot_bytes is 0 ({}): a slot must hold at least "
                            "8 bytes",
                            describe_options(o)));
  FERRY_EXPECTS(o.slot_bytes % 8 == 0,
                fmt::format("egress options::slot_bytes = {} is not a multiple of 8: chunks must start on an "
                            "8-byte word of the output; use {}",
                            o.slot_bytes, (o.slot_bytes / 8 + 1) * 8));
  FERRY_EXPECTS(o.sink_workers > 0,
                fmt::format("egress options::sink_workers is 0 ({}): at least one thread must "
                            "call the sink",
                            describe_options(o)));
  FERRY_EXPECTS(
      o.slots <= std::numeric_limits<std::size_t>::max() / o.slot_bytes,
      fmt::format("egress pool of {} slots of {} bytes overflows the address space", o.slots, o.slot_bytes));
  return o;
}

pipeline::impl::impl(device& dev, std::shared_ptr<sink> out, const egress::options& opts)
    : dev_(dev), sink_(std::move(out)), opts_(validated(opts, sink_ != nullptr)) {
  const auto pin_start = steady::now();
  pool_ = dev_.alloc_pinned(pool_bytes_);
  pin_seconds_ = seconds_since(pin_start);
  started_.reserve(opts_.slots);
  copied_.reserve(opts_.slots);
  marks_.reserve(opts_.slots);
  for (std::size_t i = 0; i < opts_.slots; ++i) {
    started_.push_back(dev_.make_timing_event());
    copied_.push_back(dev_.make_timing_event());
    marks_.push_back(dev_.make_event());
  }
  egress_ = dev_.make_stream();
  // Bodies stop through their stop_token (see the loops), so a pool that fails to start every thread
  // can stop and join the ones it started.
  completion_.emplace(1, [this](std::stop_token st, std::size_t) { completion_loop(std::move(st)); });
  try {
    workers_.emplace(opts_.sink_workers,
                     [this](std::stop_token st, std::size_t) { sink_loop(std::move(st)); });
  } catch (...) {
    completion_.reset();
    throw;
  }
}

bool pipeline::impl::on_sink_worker() const noexcept { return current_sink_worker == this; }

void pipeline::impl::expect_submittable(const mem_view& data, const stream_view& producer, std::size_t chunks,
                                        wait_mode mode) const {
  FERRY_EXPECTS(
      data.data != nullptr && data.bytes > 0,
      fmt::format("egress submit of an empty {} view ({} bytes at {}): an output holds at least 1 byte",
                  to_string(data.kind), data.bytes, fmt::ptr(data.data)));
  FERRY_EXPECTS(data.kind == memory_kind::device,
                fmt::format("egress submit of a {} view of {}: egress copies device memory to the host; pass "
                            "a device buffer or device_view",
                            to_string(data.kind), format_bytes(data.bytes)));
  FERRY_EXPECTS(&producer.dev() == &dev_,
                "egress submit: the producer stream belongs to another device than the pipeline's");
  FERRY_EXPECTS(chunks <= std::numeric_limits<std::uint32_t>::max(),
                fmt::format("egress output of {} would be {} chunks of {} bytes, more than 2^32 - 1; raise "
                            "slot_bytes",
                            format_bytes(data.bytes), chunks, opts_.slot_bytes));
  FERRY_EXPECTS(mode == wait_mode::block || chunks <= opts_.slots,
                fmt::format("egress {}: an output of {} is {} chunks of slot_bytes {}, which can never find "
                            "free slots at once in a pool of {} slots; use submit (it streams the chunks) or "
                            "raise slots or slot_bytes",
                            mode == wait_mode::none ? "try_submit" : "submit_for", format_bytes(data.bytes),
                            chunks, format_bytes(opts_.slot_bytes), opts_.slots));
}

void pipeline::impl::rethrow_error_locked() {
  if (!error_) return;
  error_collected_ = true;
  std::rethrow_exception(error_);
}

void pipeline::impl::throw_if_ended_locked() {
  rethrow_error_locked();
  if (closing_) throw stopped_error("egress pipeline is closed: it takes no more outputs");
}

void pipeline::impl::throw_if_ended() {
  const std::lock_guard lock(mu_);
  throw_if_ended_locked();
}

void pipeline::impl::rethrow_error() {
  const std::lock_guard lock(mu_);
  rethrow_error_locked();
}

class pipeline::impl::turn {
 public:
  turn(impl& owner, wait_mode mode, steady::time_point deadline)
      : owner_(owner), taken_(owner.take_turn(mode, deadline)) {}
  turn(const turn&) = delete;
  turn& operator=(const turn&) = delete;
  ~turn() {
    if (taken_) owner_.give_turn();
  }
  [[nodiscard]] bool taken() const noexcept { return taken_; }

 private:
  impl& owner_;
  bool taken_;
};

bool pipeline::impl::take_turn(wait_mode mode, steady::time_point deadline) {
  std::unique_lock lock(turn_mu_);
  const auto free = [&] { return !turn_taken_; };
  switch (mode) {
    case wait_mode::block: turn_free_.wait(lock, free); break;
    case wait_mode::none:
      if (!free()) return false;
      break;
    case wait_mode::until:
      if (!turn_free_.wait_until(lock, deadline, free)) return false;
      break;
  }
  turn_taken_ = true;
  return true;
}

void pipeline::impl::give_turn() noexcept {
  {
    const std::lock_guard lock(turn_mu_);
    turn_taken_ = false;
  }
  turn_free_.notify_one();
}

event pipeline::impl::submit(mem_view data, stream_view producer, std::uint64_t tag, wait_mode mode,
                             std::chrono::nanoseconds timeout) {
  const std::size_t chunks = chunks_of(data.bytes);
  expect_submittable(data, producer, chunks, mode);
  const steady::time_point deadline =
      mode == wait_mode::until ? deadline_after(timeout) : steady::time_point{};

  // One submitter queues at a time, so an output's chunks take consecutive slots in the ring (the
  // in_order delivery order) and consecutive places on the egress stream and the completion queue.
  const turn held(*this, mode, deadline);
  if (!held.taken()) {
    throw_if_ended();
    return {};
  }

  std::chrono::nanoseconds waited{0};
  {
    std::unique_lock lock(mu_);
    throw_if_ended_locked();
    if (mode != wait_mode::block) {
      // Only the turn's holder takes slots, so once enough are free they stay free until taken below.
      const auto enough = [&] { return error_ || closing_ || ring_.count(slot_state::free) >= chunks; };
      if (mode == wait_mode::none && !enough()) return {};
      if (mode == wait_mode::until) {
        const auto wait_start = steady::now();
        if (!slot_freed_.wait_until(lock, deadline, enough)) return {};
        waited = steady::now() - wait_start;
      }
      throw_if_ended_locked();
    }
  }
  // The output will be queued now: the sink may still refuse it (a tag it was given before), and its
  // refusal leaves the pipeline as it was. Under the turn, so outputs are admitted in sequence order.
  sink_->admit(tag, data.bytes);

  event done = dev_.make_event();
  std::size_t queued = 0;
  bool ended = false;
  // After this, an exception is the device's: the pipeline fails with it.
  try {
    const std::uint64_t sequence = next_sequence_++;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (!wait_for_free_slot(waited)) {
        ended = true;
        break;
      }
      std::optional<std::size_t> slot;
      try {
        slot = ring_.try_acquire();
      } catch (...) {
        // The ring failed between the check and here; the failure is the pipeline's error already.
      }
      if (!slot) {
        ended = true;
        break;
      }
      try {
        if (c == 0) {
          // The copies start once the producer reaches this point.
          marks_[*slot].record(producer);
          egress_.wait(marks_[*slot]);
        }
        queue_chunk(*slot, data, std::uint64_t{c} * opts_.slot_bytes, sequence, tag,
                    static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(chunks));
      } catch (...) {
        // Its copy was not queued, so nothing writes the slot: it goes straight back.
        {
          const std::lock_guard lock(mu_);
          ring_.cancel(*slot);
        }
        slot_freed_.notify_all();
        throw;
      }
      ++queued;
    }
    if (!ended) done.record(egress_);
  } catch (...) {
    fail(std::current_exception());
    ended = true;
  }
  if (ended) {
    // A streamed output cut short: the caller may reuse `data` once submit has thrown.
    if (queued > 0) {
      try {
        egress_.synchronize();
      } catch (...) {
        fail(std::current_exception());
      }
    }
    throw_if_ended();
    // Not reached: a submit ends early only when the pipeline failed or is closing.
    throw stopped_error("egress submit ended early");
  }
  wait_slot_.record(waited, chunks, data.bytes);
  outputs_.add();
  return done;
}

bool pipeline::impl::wait_for_free_slot(std::chrono::nanoseconds& waited) {
  std::unique_lock lock(mu_);
  const auto can_go = [&] { return error_ || closing_ || ring_.count(slot_state::free) > 0; };
  if (!can_go()) {
    const auto wait_start = steady::now();
    slot_freed_.wait(lock, can_go);
    waited += steady::now() - wait_start;
  }
  return !error_ && !closing_;
}

void pipeline::impl::queue_chunk(std::size_t slot, const mem_view& data, std::uint64_t offset,
                                 std::uint64_t sequence, std::uint64_t tag, std::uint32_t chunk,
                                 std::uint32_t chunks) {
  const auto bytes = static_cast<std::size_t>(std::min<std::uint64_t>(opts_.slot_bytes, data.bytes - offset));
  output_chunk& d = held_[slot];
  d.sequence = sequence;
  d.tag = tag;
  d.offset = offset;
  d.total_bytes = data.bytes;
  d.chunk = chunk;
  d.chunks = chunks;
  d.bytes = std::span<const std::byte>(slot_bytes(slot), bytes);
  started_[slot].record(egress_);
  dev_.copy_async(mem_view{slot_bytes(slot), bytes, memory_kind::pinned},
                  data.subview(static_cast<std::size_t>(offset), bytes), bytes, egress_);
  copied_[slot].record(egress_);
  {
    const std::lock_guard lock(mu_);
    ticket_[slot] = next_ticket_++;
    completion_queue_[(queue_head_ + queue_count_) % completion_queue_.size()] = slot;
    ++queue_count_;
  }
  queued_.notify_one();
}

void pipeline::impl::completion_loop(std::stop_token stop) {
  trace::name_this_thread("egress-complete");
  // close() stops this thread once every slot is free, so the queue is empty by then.
  const std::stop_callback on_stop(stop, [this] {
    {
      const std::lock_guard lock(mu_);
      stop_completion_ = true;
    }
    queued_.notify_all();
  });
  for (;;) {
    std::size_t slot = 0;
    {
      std::unique_lock lock(mu_);
      queued_.wait(lock, [&] { return queue_count_ > 0 || stop_completion_; });
      if (queue_count_ == 0) return;
      slot = completion_queue_[queue_head_];
      queue_head_ = (queue_head_ + 1) % completion_queue_.size();
      --queue_count_;
    }
    // One egress stream completes its copies in queue order, so waiting in that order never waits
    // behind a copy that finishes later than one after it.
    try {
      copied_[slot].synchronize();
      const double ms = dev_.elapsed_ms(started_[slot], copied_[slot]);
      copy_.record(std::chrono::nanoseconds(std::llround(std::max(0.0, ms) * 1e6)), 1,
                   held_[slot].bytes.size());
    } catch (...) {
      fail(std::current_exception());
    }
    bool dropped = false;
    {
      const std::lock_guard lock(mu_);
      if (error_) {
        free_slot_locked(slot, false);
        dropped = true;
      } else {
        ring_.mark_ready(slot);
      }
    }
    if (dropped) slot_freed_.notify_all();
  }
}

void pipeline::impl::sink_loop(std::stop_token stop) {
  trace::name_this_thread("egress-sink");
  current_sink_worker = this;
  // close() stops the ring once every slot is free; take_ready then throws stopped_error.
  const std::stop_callback on_stop(stop, [this] { ring_.stop(); });
  for (;;) {
    std::size_t slot = 0;
    try {
      slot = ring_.take_ready();
    } catch (...) {
      // Stopped by close, or failed: the failure is the pipeline's error already.
      return;
    }
    const output_chunk& d = held_[slot];
    const auto start = steady::now();
    bool consumed = false;
    try {
      sink_->consume(d);
      consumed = true;
    } catch (...) {
      fail(std::current_exception());
    }
    if (consumed) consume_.record(steady::now() - start, 1, d.bytes.size());
    {
      const std::lock_guard lock(mu_);
      if (!consumed) dropped_.add();
      free_slot_locked(slot, true);
    }
    slot_freed_.notify_all();
  }
}

void pipeline::impl::free_slot_locked(std::size_t slot, bool in_use) {
  ticket_[slot] = no_ticket;
  if (in_use) {
    ring_.release(slot);
  } else {
    dropped_.add();
    ring_.cancel(slot);
  }
}

void pipeline::impl::fail(std::exception_ptr error) noexcept {
  {
    const std::lock_guard lock(mu_);
    if (!error_) error_ = std::move(error);
    try {
      ring_.fail(error_);
      // No slot becomes ready after this (the completion thread checks error_ under mu_) and none is
      // taken (take_ready rethrows), so the ready ones would never leave the ring: return them now.
      for (std::size_t s = 0; s < ring_.size(); ++s) {
        if (ring_.state(s) == slot_state::ready) free_slot_locked(s, false);
      }
    } catch (...) {
      // Only a broken invariant throws here; the error kept above is what the caller needs to see.
    }
  }
  slot_freed_.notify_all();
}

std::uint64_t pipeline::impl::oldest_ticket_locked() const noexcept {
  return *std::min_element(ticket_.begin(), ticket_.end());
}

void pipeline::impl::flush() {
  FERRY_EXPECTS(!on_sink_worker(),
                "egress pipeline::flush called from its own sink (inside consume): it would "
                "wait for the delivery that called it");
  {
    std::unique_lock lock(mu_);
    throw_if_ended_locked();
    const std::uint64_t target = next_ticket_;
    slot_freed_.wait(lock, [&] { return error_ || oldest_ticket_locked() >= target; });
    // A close() that began meanwhile delivered what this flush waited for: only a failure ends it.
    rethrow_error_locked();
  }
  try {
    const std::lock_guard lock(flush_mu_);
    sink_->flush();
  } catch (...) {
    fail(std::current_exception());
    rethrow_error();
  }
}

void pipeline::impl::close_quietly() noexcept {
  try {
    const std::lock_guard close_lock(close_mu_);
    if (closed_) return;
    {
      const std::lock_guard lock(mu_);
      closing_ = true;
    }
    slot_freed_.notify_all();
    // Blocked submitters wake and throw stopped_error; once the turn is ours no submit is queuing.
    const turn held(*this, wait_mode::block, {});
    ring_.wait_all_free();
    completion_->request_stop();
    workers_->request_stop();
    completion_->join();
    workers_->join();
    try {
      egress_.synchronize();
    } catch (...) {
      fail(std::current_exception());
    }
    bool failed = false;
    {
      const std::lock_guard lock(mu_);
      failed = error_ != nullptr;
    }
    if (!failed) {
      try {
        const std::lock_guard lock(flush_mu_);
        sink_->flush();
      } catch (...) {
        fail(std::current_exception());
      }
    }
    closed_ = true;
  } catch (...) {
    fail(std::current_exception());
  }
}

void pipeline::impl::report_uncollected() noexcept {
  std::exception_ptr error;
  {
    const std::lock_guard lock(mu_);
    if (error_collected_) return;
    error = error_;
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    FERRY_ASSERT_NOTHROW(false, fmt::format("egress pipeline destroyed with an error nobody collected (call "
                                            "close() to see it): {}",
                                            e.what()));
  } catch (...) {
    FERRY_ASSERT_NOTHROW(false, "egress pipeline destroyed with an error of unknown type nobody collected");
  }
}

pipeline_stats pipeline::impl::stats() const {
  pipeline_stats s;
  s.outputs = outputs_.load();
  s.deliveries = consume_.items.load();
  s.bytes = consume_.bytes.load();
  s.copy_seconds = static_cast<double>(copy_.time.sum_ns()) / 1e9;
  s.d2h_gbps = gb_per_s(copy_.bytes.load(), s.copy_seconds);
  s.pin_seconds = pin_seconds_;
  s.pinned_bytes = pool_bytes_;
  s.dropped = dropped_.load();
  s.stages = stats_.snapshot();
  return s;
}

// ---- pipeline ----------------------------------------------------------------------------------

pipeline::pipeline(device& dev, std::shared_ptr<sink> out, const egress::options& opts)
    : impl_(std::make_unique<impl>(dev, std::move(out), opts)) {}

pipeline::~pipeline() {
  impl_->close_quietly();
  impl_->report_uncollected();
}

event pipeline::submit(mem_view data, stream_view producer, std::uint64_t tag) {
  return impl_->submit(data, producer, tag, wait_mode::block, {});
}

event pipeline::try_submit(mem_view data, stream_view producer, std::uint64_t tag) {
  return impl_->submit(data, producer, tag, wait_mode::none, {});
}

event pipeline::submit_for(mem_view data, stream_view producer, std::uint64_t tag,
                           std::chrono::nanoseconds timeout) {
  return impl_->submit(data, producer, tag, wait_mode::until, timeout);
}

void pipeline::flush() { impl_->flush(); }

void pipeline::close() {
  FERRY_EXPECTS(!impl_->on_sink_worker(),
                "egress pipeline::close called from its own sink (inside consume): it "
                "would wait for the delivery that called it");
  impl_->close_quietly();
  impl_->rethrow_error();
}

pipeline_stats pipeline::stats() const { return impl_->stats(); }

const egress::options& pipeline::options() const noexcept { return impl_->config(); }

std::size_t pipeline::free_slots() const { return impl_->free_slots(); }

}  // namespace ferry::egress
