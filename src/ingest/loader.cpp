// The loader: N workers write samples straight into pinned batch slots; batches are handed out in order.
//
// Work. Batch g (counted over every epoch: epoch g / batches_per_epoch, batch g % batches_per_epoch)
// always lives in slot g % slots. Workers draw tickets from one atomic counter; ticket t is position
// t % batch_size of batch t / batch_size (positions past a short final batch are skipped). So the workers
// cooperate on the oldest batches, and a ticket whose slot still holds batch g - slots waits until the
// consumer releases it: the workers run at most `slots` batches ahead. Each slot counts the samples left
// to fill; the worker that writes the last one marks the batch ready.
//
// Synchronization. `free_for_[s]` (atomic, written under mu_) is the batch slot s may be filled with;
// `remaining_[s]` counts its unwritten samples. Sample bytes are published by the release/acquire chain
// of `remaining_` and then mu_, under which next() reads `ready_`. Every blocking wait (a worker's wait for
// its slot, next()'s wait for its batch) is on a condition variable of mu_ and wakes on close or failure.
#include <fmt/format.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/ingest/ingest.hpp"
#include "ferry/trace/timeline.hpp"
#include "layout.hpp"

namespace ferry::ingest {
namespace {

using steady = std::chrono::steady_clock;
constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

loader_options validated(const loader_options& o, bool has_fill) {
  FERRY_EXPECTS(has_fill, "ingest loader of an empty fill function: pass a callable that writes a sample");
  FERRY_EXPECTS(!o.fields.empty(),
                "ingest loader_options::fields is empty: a sample needs at least one field");
  for (std::size_t f = 0; f < o.fields.size(); ++f) {
    FERRY_EXPECTS(
        o.fields[f].sample_bytes > 0,
        fmt::format("ingest loader_options::fields[{}] ('{}') has sample_bytes 0: a field holds at least "
                    "1 byte per sample",
                    f, o.fields[f].name));
  }
  FERRY_EXPECTS(o.workers > 0, "ingest loader_options::workers is 0: at least one thread must fill samples");
  FERRY_EXPECTS(o.slots > 0,
                "ingest loader_options::slots is 0: the loader needs at least one pinned batch slot");
  return o;
}

}  // namespace

std::span<std::byte> host_batch::field(std::size_t f) const {
  const mem_view v = view(f);
  return {v.begin(), v.bytes};
}

mem_view host_batch::view(std::size_t f) const {
  FERRY_EXPECTS(
      f < fields_.size() && f < sample_bytes_.size(),
      fmt::format("ingest host_batch: field {} is out of range; a batch has {} fields", f, fields_.size()));
  return fields_[f].subview(0, samples * sample_bytes_[f]);
}

struct loader::impl {
  impl(device& dev, const loader_options& opts, fill_fn fill);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() { close(); }

  std::optional<host_batch> take(bool block);
  void release(const host_batch& b);
  void close() noexcept;
  void fail(std::exception_ptr e) noexcept;
  void work(std::size_t worker) noexcept;
  [[nodiscard]] std::size_t samples_of(std::uint64_t g) const {
    return sampler_.batch_samples(g % per_epoch_);
  }
  // Starts slot s's cycle for batch g (or marks it unused past the end); with mu_ held or before the
  // workers start.
  void open_slot(std::size_t s, std::uint64_t g) noexcept;
  [[nodiscard]] host_batch batch_of(std::uint64_t g) const;

  device& dev_;
  const loader_options opts_;
  const sampler sampler_;
  const fill_fn fill_;
  const detail::batch_layout layout_;
  const std::size_t per_epoch_ = sampler_.batches_per_epoch();
  const std::uint64_t total_;  // batches over every epoch; none: forever

  stats_registry stats_;
  stage_stats& fill_time_ = stats_.add_stage("fill");
  stage_stats& fill_cpu_ = stats_.add_stage("fill_cpu");
  stage_stats& wait_slot_ = stats_.add_stage("wait_slot");
  stage_stats& wait_batch_ = stats_.add_stage("wait_batch");

  buffer own_pool_;  // empty when the slots are the caller's (loader_options::pool)
  mem_view pool_;
  double pin_seconds_ = 0;
  std::vector<std::vector<mem_view>> slot_fields_;  // per slot, per field: the whole field region

  std::atomic<std::uint64_t> next_ticket_{0};
  std::unique_ptr<std::atomic<std::uint64_t>[]> free_for_;
  std::unique_ptr<std::atomic<std::size_t>[]> remaining_;
  std::atomic<bool> ended_{false};  // closed or failed: workers stop

  mutable std::mutex mu_;
  std::condition_variable slot_freed_;   // workers wait on it
  std::condition_variable batch_ready_;  // next() waits on it
  // Guarded by mu_:
  std::vector<std::uint64_t> ready_;  // per slot: the filled batch it holds, or none
  std::vector<std::uint64_t> lent_;   // per slot: the batch handed out and not yet released, or none
  std::uint64_t next_out_ = 0;
  bool closed_ = false;
  std::exception_ptr error_;

  std::mutex join_mu_;
  std::vector<std::thread> workers_;
};

namespace {
thread_local const void* current_worker_of = nullptr;
}  // namespace

loader::impl::impl(device& dev, const loader_options& opts, fill_fn fill)
    : dev_(dev),
      opts_(validated(opts, static_cast<bool>(fill))),
      sampler_(opts_.sampling),
      fill_(std::move(fill)),
      layout_(opts_.fields, opts_.sampling.batch_size),
      total_(opts_.epochs == 0 || opts_.epochs > none / per_epoch_ ? none : opts_.epochs * per_epoch_) {
  FERRY_EXPECTS(opts_.slots <= std::numeric_limits<std::size_t>::max() / layout_.slot_bytes,
                fmt::format("ingest loader: {} slots of {} overflow the address space", opts_.slots,
                            format_bytes(layout_.slot_bytes)));
  const auto pin_start = steady::now();
  const std::size_t pool_bytes = opts_.slots * layout_.slot_bytes;
  if (opts_.pool.bytes != 0) {
    FERRY_EXPECTS(opts_.pool.kind == memory_kind::pinned && opts_.pool.data != nullptr,
                  fmt::format("ingest loader_options::pool is {} memory; the slots must be pinned (register "
                              "the caller's memory with device::register_host)",
                              to_string(opts_.pool.kind)));
    FERRY_EXPECTS(opts_.pool.bytes >= pool_bytes,
                  fmt::format("ingest loader_options::pool holds {}; {} slots of {} need {}",
                              format_bytes(opts_.pool.bytes), opts_.slots, format_bytes(layout_.slot_bytes),
                              format_bytes(pool_bytes)));
    pool_ = opts_.pool;
  } else {
    own_pool_ = dev_.alloc_pinned(pool_bytes);
    pool_ = own_pool_.view();
  }
  pin_seconds_ = seconds_since(pin_start);

  const std::size_t n = opts_.slots;
  slot_fields_.resize(n);
  free_for_ = std::make_unique<std::atomic<std::uint64_t>[]>(n);
  remaining_ = std::make_unique<std::atomic<std::size_t>[]>(n);
  ready_.assign(n, none);
  lent_.assign(n, none);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t f = 0; f < opts_.fields.size(); ++f) {
      slot_fields_[s].push_back(
          pool_.subview(s * layout_.slot_bytes + layout_.offset[f], layout_.field_bytes[f]));
    }
    open_slot(s, s);
  }
  workers_.reserve(opts_.workers);
  try {
    for (std::size_t w = 0; w < opts_.workers; ++w) workers_.emplace_back([this, w] { work(w); });
  } catch (...) {
    close();
    throw;
  }
}

void loader::impl::open_slot(std::size_t s, std::uint64_t g) noexcept {
  if (g >= total_) {
    free_for_[s].store(none, std::memory_order_release);
    return;
  }
  remaining_[s].store(samples_of(g), std::memory_order_relaxed);
  free_for_[s].store(g, std::memory_order_release);
}

host_batch loader::impl::batch_of(std::uint64_t g) const {
  host_batch b;
  b.epoch = g / per_epoch_;
  b.batch = g % per_epoch_;
  b.samples = samples_of(g);
  b.slot = static_cast<std::size_t>(g % opts_.slots);
  b.fields_ = slot_fields_[b.slot];
  b.sample_bytes_ = layout_.sample_bytes;
  return b;
}

void loader::impl::work(std::size_t worker) noexcept {
  trace::name_this_thread(fmt::format("ingest-load-{}", worker));
  current_worker_of = this;
  const std::size_t bs = opts_.sampling.batch_size;
  const std::size_t nfields = opts_.fields.size();
  std::vector<std::span<std::byte>> out(nfields);  // reused for every sample
  sample s;
  s.worker = worker;
  try {
    while (!ended_.load(std::memory_order_acquire)) {
      const std::uint64_t t = next_ticket_.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t g = t / bs;
      const std::size_t pos = static_cast<std::size_t>(t % bs);
      if (g >= total_) return;
      const std::size_t slot = static_cast<std::size_t>(g % opts_.slots);
      if (free_for_[slot].load(std::memory_order_acquire) != g) {
        const auto t0 = steady::now();
        std::unique_lock lock(mu_);
        slot_freed_.wait(
            lock, [&] { return closed_ || error_ || free_for_[slot].load(std::memory_order_acquire) == g; });
        if (closed_ || error_) return;
        lock.unlock();
        wait_slot_.record(steady::now() - t0);
      }
      const std::size_t n = samples_of(g);
      if (pos >= n) continue;  // past a short final batch
      s.epoch = g / per_epoch_;
      s.batch = g % per_epoch_;
      s.position = pos;
      s.index = sampler_.index(s.epoch, static_cast<std::size_t>(s.batch), pos);
      s.seed = sample_seed(opts_.seed, s.epoch, s.index);
      std::size_t bytes = 0;
      for (std::size_t f = 0; f < nfields; ++f) {
        const std::size_t sb = layout_.sample_bytes[f];
        out[f] = std::span<std::byte>(slot_fields_[slot][f].begin() + pos * sb, sb);
        bytes += sb;
      }
      const auto t0 = steady::now();
      const std::uint64_t cpu0 = thread_cpu_ns();
      fill_(s, sample_fields(out));
      fill_cpu_.record(std::chrono::nanoseconds(thread_cpu_ns() - cpu0), 1, bytes);
      fill_time_.record(steady::now() - t0, 1, bytes);
      if (remaining_[slot].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        {
          const std::lock_guard lock(mu_);
          ready_[slot] = g;
        }
        batch_ready_.notify_all();
      }
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void loader::impl::fail(std::exception_ptr e) noexcept {
  {
    const std::lock_guard lock(mu_);
    if (!error_) error_ = std::move(e);
    ended_.store(true, std::memory_order_release);
  }
  slot_freed_.notify_all();
  batch_ready_.notify_all();
}

std::optional<host_batch> loader::impl::take(bool block) {
  std::unique_lock lock(mu_);
  std::optional<steady::time_point> t0;
  for (;;) {
    if (error_) std::rethrow_exception(error_);
    if (closed_) throw stopped_error("ingest loader is closed: it hands out no more batches");
    if (next_out_ >= total_) return std::nullopt;
    const std::size_t slot = static_cast<std::size_t>(next_out_ % opts_.slots);
    if (ready_[slot] == next_out_) {
      if (t0) wait_batch_.record(steady::now() - *t0);
      ready_[slot] = none;
      lent_[slot] = next_out_;
      return batch_of(next_out_++);
    }
    if (!block) return std::nullopt;
    if (!t0) t0 = steady::now();
    batch_ready_.wait(lock);
  }
}

void loader::impl::release(const host_batch& b) {
  {
    const std::lock_guard lock(mu_);
    const std::uint64_t g = b.epoch * per_epoch_ + b.batch;
    FERRY_EXPECTS(
        b.slot < opts_.slots && lent_[b.slot] == g,
        fmt::format("ingest loader release of batch {} of epoch {} in slot {}, which is not lent out "
                    "(released twice, or from another loader?)",
                    b.batch, b.epoch, b.slot));
    lent_[b.slot] = none;
    if (closed_ || error_) return;
    open_slot(b.slot, g + opts_.slots > g ? g + opts_.slots : none);
  }
  slot_freed_.notify_all();
}

void loader::impl::close() noexcept {
  {
    const std::lock_guard lock(mu_);
    closed_ = true;
    ended_.store(true, std::memory_order_release);
  }
  slot_freed_.notify_all();
  batch_ready_.notify_all();
  // A fill that closes its own loader cannot join itself; the destructor (on another thread) joins.
  if (current_worker_of == this) return;
  const std::lock_guard lock(join_mu_);
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

loader::loader(device& dev, const loader_options& opts, fill_fn fill)
    : impl_(std::make_unique<impl>(dev, opts, std::move(fill))) {}
loader::~loader() = default;
std::optional<host_batch> loader::next() { return impl_->take(true); }
std::optional<host_batch> loader::try_next() { return impl_->take(false); }
void loader::release(const host_batch& b) { impl_->release(b); }
bool loader::done() const {
  const std::lock_guard lock(impl_->mu_);
  return impl_->next_out_ >= impl_->total_;
}
void loader::close() { impl_->close(); }
bool loader::stopping() const noexcept { return impl_->ended_.load(std::memory_order_acquire); }
const loader_options& loader::options() const noexcept { return impl_->opts_; }
const sampler& loader::batches() const noexcept { return impl_->sampler_; }
std::size_t loader::batch_bytes() const noexcept { return impl_->layout_.batch_bytes; }
loader_stats loader::stats() const {
  loader_stats s;
  s.samples = impl_->fill_time_.items.load();
  s.bytes = impl_->fill_time_.bytes.load();
  s.pin_seconds = impl_->pin_seconds_;
  s.pinned_bytes = impl_->pool_.bytes;
  s.stages = impl_->stats_.snapshot();
  return s;
}
std::size_t loader::field_offset(std::size_t f) const {
  FERRY_EXPECTS(f < impl_->layout_.offset.size(),
                fmt::format("ingest loader: field {} is out of range; a sample has {} fields", f,
                            impl_->layout_.offset.size()));
  return impl_->layout_.offset[f];
}

}  // namespace ferry::ingest
