// The loader: N workers write samples straight into pinned batch slots; batches are handed out in order.
// Its state, slots, work and synchronization are described atop loader_impl.hpp.
#include <fmt/format.h>
#include <time.h>

#include <atomic>
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
#include "loader_impl.hpp"
#include "ring_waits.hpp"

namespace ferry::ingest {
namespace {

using steady = std::chrono::steady_clock;
constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count();
}

loader_options validated(const loader_options& o, bool has_fill, bool external) {
  FERRY_EXPECTS(has_fill || external,
                "ingest loader of an empty fill function: pass a callable that writes a sample");
  FERRY_EXPECTS(!o.fields.empty(),
                "ingest loader_options::fields is empty: a sample needs at least one field");
  for (std::size_t f = 0; f < o.fields.size(); ++f) {
    FERRY_EXPECTS(
        o.fields[f].sample_bytes > 0,
        fmt::format("ingest loader_options::fields[{}] ('{}') has sample_bytes 0: a field holds at least "
                    "1 byte per sample",
                    f, o.fields[f].name));
  }
  FERRY_EXPECTS(o.workers > 0 || external,
                "ingest loader_options::workers is 0: at least one thread must fill samples");
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

namespace {
thread_local const void* current_worker_of = nullptr;
}  // namespace

loader::impl::impl(device& dev, const loader_options& opts, fill_fn fill)
    : impl(dev, opts, std::move(fill), false) {}

loader::impl::impl(device& dev, const loader_options& opts, external_fill) : impl(dev, opts, {}, true) {}

loader::impl::impl(device& dev, const loader_options& opts, fill_fn fill, bool external)
    : dev_(dev),
      opts_(validated(opts, static_cast<bool>(fill), external)),
      sampler_(opts_.sampling),
      fill_(std::move(fill)),
      layout_(opts_.fields, opts_.sampling.batch_size),
      total_(opts_.epochs == 0 || opts_.epochs > none / per_epoch_ ? none : opts_.epochs * per_epoch_),
      ring_(opts_.slots, delivery::in_order, placement::rotating) {
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
  filled_ = std::make_unique<std::atomic<std::size_t>[]>(n);
  claimed_at_ = std::make_unique<std::atomic<std::int64_t>[]>(n);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t f = 0; f < opts_.fields.size(); ++f) {
      slot_fields_[s].push_back(
          pool_.subview(s * layout_.slot_bytes + layout_.offset[f], layout_.field_bytes[f]));
    }
  }
  if (external) return;
  workers_.reserve(opts_.workers);
  try {
    for (std::size_t w = 0; w < opts_.workers; ++w) workers_.emplace_back([this, w] { work(w); });
  } catch (...) {
    close();
    throw;
  }
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

std::optional<std::size_t> loader::impl::slot_for(std::uint64_t g) {
  try {
    return detail::timed_if_waiting(
        wait_slot_, [&] { return ring_.try_acquire_nth(g); },
        [&] { return std::optional<std::size_t>(ring_.acquire_nth(g)); });
  } catch (...) {
    if (ring_.stopped()) return std::nullopt;  // closed or failed: the worker's work is over
    throw;
  }
}

void loader::impl::filled(std::size_t slot, std::uint64_t g) {
  if (filled_[slot].fetch_add(1, std::memory_order_acq_rel) + 1 != samples_of(g)) return;
  filled_[slot].store(0, std::memory_order_relaxed);  // for its next batch, handed out after mark_ready
  ring_.mark_ready(slot);
}

void loader::impl::work(std::size_t worker) noexcept {
  trace::name_this_thread(fmt::format("ingest-load-{}", worker));
  current_worker_of = this;
  const std::size_t bs = opts_.sampling.batch_size;
  const std::size_t nfields = opts_.fields.size();
  std::vector<std::span<std::byte>> out(nfields);  // reused for every sample
  sample s;
  s.worker = worker;
  // The batch this worker wrote its last sample into: a later position of it needs no ring call, since
  // the batch cannot be complete (and its slot reused) while this worker holds one of its positions.
  std::uint64_t joined = none;
  try {
    while (!ended_.load(std::memory_order_acquire)) {
      const std::uint64_t t = next_ticket_.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t g = t / bs;
      const std::size_t pos = static_cast<std::size_t>(t % bs);
      if (g >= total_) return;
      // Past a short final batch: skipped before joining, so that nobody joins a batch once it is ready.
      if (pos >= samples_of(g)) continue;
      const std::size_t slot = static_cast<std::size_t>(g % opts_.slots);
      if (joined != g) {
        if (!slot_for(g)) return;
        joined = g;
      }
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
      filled(slot, g);
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void loader::impl::fail(std::exception_ptr e) noexcept {
  ended_.store(true, std::memory_order_release);
  try {
    ring_.fail(std::move(e));
  } catch (...) {  // NOLINT(bugprone-empty-catch): only for a null error, which a catch never passes
  }
}

std::optional<host_batch> loader::impl::take(bool block) {
  std::optional<std::size_t> slot;
  try {
    slot = block ? detail::timed_if_waiting(
                       wait_batch_, [&] { return ring_.try_take_ready(); },
                       [&] { return std::optional<std::size_t>(ring_.take_ready()); })
                 : ring_.try_take_ready();
    if (!slot) return std::nullopt;
  } catch (const stopped_error&) {
    if (ring_.failed()) throw;  // closed (or a fill's stopped_error): as it is
    return std::nullopt;        // stopped without a failure: every batch was handed out
  }
  const std::uint64_t g = ring_.sequence(*slot);
  if (g + 1 == total_) {
    finished_.store(true, std::memory_order_release);
    ring_.stop();  // a consumer waiting for a batch after the last one wakes to nullopt
  }
  return batch_of(g);
}

void loader::impl::release(const host_batch& b) {
  const std::uint64_t g = b.epoch * per_epoch_ + b.batch;
  FERRY_EXPECTS(
      b.slot < opts_.slots && ring_.state(b.slot) == slot_state::in_use && ring_.sequence(b.slot) == g,
      fmt::format("ingest loader release of batch {} of epoch {} in slot {}, which is not lent out "
                  "(released twice, or from another loader?)",
                  b.batch, b.epoch, b.slot));
  ring_.release(b.slot);
  if (on_release_) on_release_();
}

std::optional<std::size_t> loader::impl::claim(std::uint64_t g, std::chrono::nanoseconds timeout) {
  std::optional<std::size_t> slot = ring_.try_acquire_nth(g);
  if (!slot && timeout > std::chrono::nanoseconds::zero()) {
    const auto t0 = steady::now();
    slot = ring_.acquire_nth_for(g, timeout);
    if (slot) wait_slot_.record(steady::now() - t0);
  }
  if (slot) {
    std::int64_t unclaimed = 0;
    claimed_at_[*slot].compare_exchange_strong(unclaimed, steady_ns(), std::memory_order_relaxed);
  }
  return slot;
}

void loader::impl::finish(std::size_t slot) {
  const std::int64_t since = claimed_at_[slot].exchange(0, std::memory_order_relaxed);
  ring_.mark_ready(slot);
  fill_time_.record(std::chrono::nanoseconds(since == 0 ? 0 : steady_ns() - since), 1, layout_.batch_bytes);
}

void loader::impl::close() noexcept {
  ended_.store(true, std::memory_order_release);
  detail::fail_closed(ring_, "ingest loader is closed: it hands out no more batches");
  // A fill that closes its own loader cannot join itself; the destructor (on another thread) joins.
  if (current_worker_of == this) return;
  const std::lock_guard lock(join_mu_);
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

loader::loader(device& dev, const loader_options& opts, fill_fn fill)
    : impl_(std::make_unique<impl>(dev, opts, std::move(fill))) {}
loader::loader(std::unique_ptr<impl> state) noexcept : impl_(std::move(state)) {}
loader::~loader() = default;
std::optional<host_batch> loader::next() { return impl_->take(true); }
std::optional<host_batch> loader::try_next() { return impl_->take(false); }
void loader::release(const host_batch& b) { impl_->release(b); }
bool loader::done() const { return impl_->finished_.load(std::memory_order_acquire); }
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
