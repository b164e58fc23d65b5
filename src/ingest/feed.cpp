// The feed: a loader of one field whose "samples" are the chunks of a batch. Batch k of the feed is epoch
// k of a one-batch-per-epoch loader that runs until closed, so the loader's workers, slots, ordering and
// failure handling carry over unchanged; the fill of chunk p of batch k copies the parts of batch k's
// pieces that fall in [p * chunk, (p + 1) * chunk), waiting until batch k has been pushed.
//
// mu_ guards the pushed batches (their piece lists, by batch number), the per-batch count of chunks still
// to copy, and the closed flag. A fill reads its batch's pieces outside the lock: the entry is erased
// only after its last chunk was copied.
//
// Why a mutex and a condition variable of its own, not a slot_ring: the slots (back-pressure, order,
// close) are the loader's ring already; what the feed adds is the list of pushed batches, and that is not
// a fixed set of slots. push() never blocks and any number of batches may be pushed ahead of the slots,
// so it is an unbounded queue keyed by batch number, and a fill waits for "batch k was pushed", which no
// ring state stands for. That wait polls the loader's stopping() too, because a close of the loader
// alone (a prefetcher's close() closes its source) does not reach the feed's condition variable.
#include "ferry/ingest/feed.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include <sys/eventfd.h>
#include <unistd.h>

#include "ferry/core/error.hpp"
#include "ferry/core/unique_handle.hpp"
#include "ferry/core/units.hpp"
#include "loader_impl.hpp"

namespace ferry::ingest {
namespace {

constexpr std::size_t chunk_alignment = 256;

struct fd_traits {
  using handle_type = int;
  static constexpr int null() noexcept { return -1; }
  static bool is_null(int fd) noexcept { return fd < 0; }
  static void close(int fd) noexcept { ::close(fd); }
};
using unique_fd = unique_handle<fd_traits>;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

feed_options validated(feed_options o) {
  FERRY_EXPECTS(o.batch_bytes > 0, "ingest feed: batch_bytes is 0; give the size of the largest batch");
  FERRY_EXPECTS(o.workers > 0, "ingest feed: workers is 0; at least one thread must copy");
  FERRY_EXPECTS(o.slots > 0, "ingest feed: slots is 0; at least one pinned slot is needed");
  if (o.chunk_bytes == 0) {
    o.chunk_bytes = std::max<std::size_t>(256 << 10, o.batch_bytes / (4 * o.workers));
  }
  o.chunk_bytes = round_up(std::min(o.chunk_bytes, o.batch_bytes), chunk_alignment);
  return o;
}

}  // namespace

struct feed::impl {
  impl(device& dev, const feed_options& opts);
  void fill(const sample& s, sample_fields out);

  const feed_options opts_;
  const std::size_t chunks_;

  std::mutex mu_;
  std::condition_variable pushed_cv_;
  std::map<std::uint64_t, std::vector<feed_piece>> batches_;  // pushed, not yet fully copied
  std::map<std::uint64_t, std::size_t> remaining_;            // chunks still to copy, per batch
  std::uint64_t pushed_ = 0;
  bool closed_ = false;

  // Last: its workers call fill(), which uses the members above, so it is destroyed first.
  std::unique_ptr<loader> loader_;
};

feed::impl::impl(device& dev, const feed_options& opts)
    : opts_(validated(opts)), chunks_((opts_.batch_bytes + opts_.chunk_bytes - 1) / opts_.chunk_bytes) {
  loader_options lo;
  lo.fields = {{"batch", opts_.chunk_bytes}};
  lo.sampling.dataset_size = chunks_;
  lo.sampling.batch_size = chunks_;
  lo.workers = opts_.workers;
  lo.slots = opts_.slots;
  lo.epochs = 0;  // one batch per epoch, until closed
  // The loader's workers start inside its constructor and read loader_ in fill() under mu_: publish it
  // under mu_ too.
  auto made = std::make_unique<loader>(dev, lo, [this](const sample& s, sample_fields out) { fill(s, out); });
  const std::lock_guard lock(mu_);
  loader_ = std::move(made);
}

void feed::impl::fill(const sample& s, sample_fields out) {
  const std::uint64_t k = s.epoch;
  const std::vector<feed_piece>* pieces = nullptr;
  {
    std::unique_lock lock(mu_);
    // The loader may be closed directly (a prefetcher's close() closes it and joins the workers), so the
    // wait also polls the loader; a push or the feed's close wakes it at once.
    while (!closed_ && k >= pushed_) {
      if (loader_ && loader_->stopping()) break;
      pushed_cv_.wait_for(lock, std::chrono::milliseconds(2));
    }
    if (k >= pushed_) throw stopped_error(fmt::format("ingest feed: closed while batch {} was awaited", k));
    pieces = &batches_.at(k);
  }
  const std::span<std::byte> dst = out[0];
  const std::size_t begin = s.position * opts_.chunk_bytes;
  const std::size_t end = begin + dst.size();
  for (const feed_piece& p : *pieces) {
    const std::size_t lo = std::max(begin, p.offset);
    const std::size_t hi = std::min(end, p.offset + p.bytes);
    if (lo >= hi) continue;
    std::memcpy(dst.data() + (lo - begin), static_cast<const std::byte*>(p.data) + (lo - p.offset), hi - lo);
  }
  const std::lock_guard lock(mu_);
  if (--remaining_.at(k) == 0) {
    remaining_.erase(k);
    batches_.erase(k);
  }
}

feed::feed(device& dev, const feed_options& opts) : impl_(std::make_unique<impl>(dev, opts)) {}

feed::~feed() {
  close();
  impl_->loader_.reset();
}

std::uint64_t feed::push(std::span<const feed_piece> pieces) {
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const feed_piece& p = pieces[i];
    FERRY_EXPECTS(p.data != nullptr || p.bytes == 0, fmt::format("ingest feed: piece {} has no data", i));
    FERRY_EXPECTS(p.offset <= impl_->opts_.batch_bytes && p.bytes <= impl_->opts_.batch_bytes - p.offset,
                  fmt::format("ingest feed: piece {} ({} at offset {}) reaches past the batch of {}; "
                              "make the feed's batch_bytes at least the largest batch",
                              i, format_bytes(p.bytes), p.offset, format_bytes(impl_->opts_.batch_bytes)));
  }
  std::uint64_t k = 0;
  {
    const std::lock_guard lock(impl_->mu_);
    if (impl_->closed_) throw stopped_error("ingest feed: push after close()");
    k = impl_->pushed_;
    impl_->batches_.emplace(k, std::vector<feed_piece>(pieces.begin(), pieces.end()));
    impl_->remaining_.emplace(k, impl_->chunks_);
    impl_->pushed_ = k + 1;
  }
  impl_->pushed_cv_.notify_all();
  return k;
}

std::uint64_t feed::pushed() const {
  const std::lock_guard lock(impl_->mu_);
  return impl_->pushed_;
}

loader& feed::source() noexcept { return *impl_->loader_; }

std::size_t feed::slot_bytes() const noexcept { return impl_->chunks_ * impl_->opts_.chunk_bytes; }

std::size_t feed::chunk_bytes() const noexcept { return impl_->opts_.chunk_bytes; }

void feed::close() noexcept {
  {
    const std::lock_guard lock(impl_->mu_);
    impl_->closed_ = true;
  }
  impl_->pushed_cv_.notify_all();
  if (impl_->loader_) impl_->loader_->close();
}

// The slot feed: a loader of one field (the whole slot) and one sample per batch, with no workers: the
// caller is the producer, on the loader's ring (loader_impl.hpp). Batch k is the ring's acquisition k, in
// slot k % slots: wait_writable(k) makes it (once batch k - slots was released) or finds it made, ready(k)
// finds it and marks it ready, and the loader's next() and release() do the rest. So no thread waits on
// the caller's writing, and close() (the feed's, the loader's or a prefetcher's) wakes every wait through
// the ring. The bytes are the caller's, already in the slot: nothing is copied.
struct slot_feed::impl {
  explicit impl(const slot_feed_options& opts)
      : opts_(opts), event_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  void signal() const noexcept {
    if (event_fd_.get() < 0) return;
    const std::uint64_t one = 1;
    // A full counter (never in practice) only means the reader is already due to wake.
    [[maybe_unused]] const ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
  }

  slot_feed_options opts_;
  unique_fd event_fd_;
  std::unique_ptr<loader> loader_;
  loader::impl* state_ = nullptr;  // loader_'s
};

slot_feed::slot_feed(device& dev, const slot_feed_options& opts) : impl_(std::make_unique<impl>(opts)) {
  const slot_feed_options& o = impl_->opts_;
  FERRY_EXPECTS(o.slots > 0, "ingest slot_feed: 0 slots; at least one is needed");
  FERRY_EXPECTS(o.slot_bytes > 0 && o.slot_bytes % chunk_alignment == 0,
                fmt::format("ingest slot_feed: slot_bytes {} must be a positive multiple of {}", o.slot_bytes,
                            chunk_alignment));
  FERRY_EXPECTS(o.pool.kind == memory_kind::pinned && o.pool.data != nullptr,
                fmt::format("ingest slot_feed: the pool is {} memory; register it with device::register_host",
                            to_string(o.pool.kind)));
  FERRY_EXPECTS(o.pool.bytes / o.slots >= o.slot_bytes,
                fmt::format("ingest slot_feed: a pool of {} holds fewer than {} slots of {}",
                            format_bytes(o.pool.bytes), o.slots, format_bytes(o.slot_bytes)));
  loader_options lo;
  lo.fields = {{"slot", o.slot_bytes}};
  lo.sampling.dataset_size = 1;
  lo.sampling.batch_size = 1;
  lo.workers = 0;  // the caller writes
  lo.slots = o.slots;
  lo.epochs = 0;
  lo.pool = o.pool;
  auto state = std::make_unique<loader::impl>(dev, lo, loader::impl::external_fill{});
  // A release frees a slot: the batch `slots` after it may be writable now.
  state->on_release_ = [feed = impl_.get()] { feed->signal(); };
  impl_->state_ = state.get();
  impl_->loader_.reset(new loader(std::move(state)));  // NOLINT(cppcoreguidelines-owning-memory): private
  impl_->signal();                                     // every slot is writable now
}

slot_feed::~slot_feed() {
  close();
  impl_->loader_.reset();
}

bool slot_feed::wait_writable(std::uint64_t k, std::chrono::milliseconds timeout) {
  try {
    return impl_->state_->claim(k, timeout).has_value();
  } catch (const stopped_error&) {
    throw stopped_error(fmt::format("ingest slot_feed: closed while batch {} waited for its slot", k));
  } catch (const logic_error&) {
    FERRY_EXPECTS(false, fmt::format("ingest slot_feed: batch {} was marked ready already", k));
    throw;  // not reached
  }
}

std::span<std::byte> slot_feed::slot(std::uint64_t k) const {
  const mem_view v = impl_->opts_.pool.subview(
      static_cast<std::size_t>(k % impl_->opts_.slots) * impl_->opts_.slot_bytes, impl_->opts_.slot_bytes);
  return {v.begin(), v.bytes};
}

void slot_feed::ready(std::uint64_t k) {
  std::optional<std::size_t> slot;
  try {
    // Batch k may be marked ready whenever its slot is writable, even if wait_writable was not asked.
    slot = impl_->state_->claim(k, std::chrono::nanoseconds::zero());
  } catch (const stopped_error&) {
    throw stopped_error(fmt::format("ingest slot_feed: batch {} ready after close()", k));
  } catch (const logic_error&) {
    slot.reset();  // marked ready already: refused below
  }
  FERRY_EXPECTS(slot.has_value(),
                fmt::format("ingest slot_feed: batch {} marked ready, but its slot was not writable (wait "
                            "until wait_writable({}) returns true; each batch is marked ready once)",
                            k, k));
  impl_->state_->finish(*slot);
}

int slot_feed::event_fd() const noexcept { return impl_->event_fd_.get(); }

loader& slot_feed::source() noexcept { return *impl_->loader_; }

void slot_feed::close() noexcept {
  if (impl_->loader_) impl_->loader_->close();
  impl_->signal();
}

}  // namespace ferry::ingest
