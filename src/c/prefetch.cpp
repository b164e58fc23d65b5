// The C ABI's ingest functions: a feed (batches pushed by the caller) prefetched to the device, and the
// lending of device batches to DLPack tensors.
//
// A lent batch is held by the caller (until ferry_batch_release) and by every DLPack tensor made from
// it (until its deleter runs, on any thread, perhaps without any interpreter lock). When the last hold
// goes, the batch is released to the prefetcher on the consumer stream given at next(): an event recorded
// there, after which the device slot may be refilled. Each hold also keeps the prefetcher alive, so a
// tensor may outlive the handle. A fork child inherits such tensors but none of ferry's threads: there,
// dropping a hold does nothing (drop_hold).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "api.hpp"
#include "dlpack.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/fork.hpp"
#include "ferry/core/strided_copy.hpp"
#include "ferry/ingest/feed.hpp"
#include "ferry/ingest/ingest.hpp"
#include "interop.hpp"

namespace ferry::c_api {

struct prefetch_state {
  // A feed: batches pushed as host ranges, copied into ferry's pinned slots.
  prefetch_state(std::shared_ptr<device_state> st, const ingest::feed_options& fo, std::size_t depth)
      : dev(std::move(st)), feed(std::make_unique<ingest::feed>(*dev->dev, fo)) {
    pf = std::make_unique<ingest::prefetcher>(*dev->dev, feed->source(),
                                              ingest::prefetch_options{.depth = depth});
  }
  // Slots: the caller's memory, registered here, written in place by the caller.
  prefetch_state(std::shared_ptr<device_state> st, void* memory, std::size_t slot_bytes, std::size_t slots,
                 std::size_t depth)
      : dev(std::move(st)), slot_size(slot_bytes) {
    FERRY_EXPECTS(slots > 0 && slot_bytes > 0 && slot_bytes <= SIZE_MAX / slots,
                  fmt::format("prefetch slots: {} slots of {} bytes", slots, slot_bytes));
    registration = dev->dev->register_host(memory, slots * slot_bytes);
    slot_feed = std::make_unique<ingest::slot_feed>(
        *dev->dev,
        ingest::slot_feed_options{.pool = registration.view(), .slot_bytes = slot_bytes, .slots = slots});
    pf = std::make_unique<ingest::prefetcher>(*dev->dev, slot_feed->source(),
                                              ingest::prefetch_options{.depth = depth});
  }
  ~prefetch_state() { close(); }
  void close() noexcept {
    closed.store(true, std::memory_order_release);
    if (feed) feed->close();  // first: wakes workers waiting for a batch never pushed
    if (slot_feed) slot_feed->close();
    if (pf) pf->close();  // waits for the copies under way: the caller's slots are read no more
    const std::lock_guard lock(mu);
    registration = ferry::buffer();  // unregistered before the caller unmaps its memory
  }
  ingest::loader& source() { return feed ? feed->source() : slot_feed->source(); }
  ingest::slot_feed& slots_of(const char* fn) {
    FERRY_EXPECTS(slot_feed != nullptr,
                  fmt::format("{}: this prefetcher takes pushed batches (ferry_prefetch_create); slots are "
                              "written in place only in one made by ferry_prefetch_create_slots",
                              fn));
    return *slot_feed;
  }

  std::shared_ptr<device_state> dev;
  std::size_t slot_size = 0;   // slots mode
  ferry::buffer registration;  // slots mode: the caller's memory, registered
  std::unique_ptr<ingest::feed> feed;
  std::unique_ptr<ingest::slot_feed> slot_feed;
  std::unique_ptr<ingest::prefetcher> pf;  // after its source: destroyed first
  std::mutex mu;
  std::set<std::uint64_t> lent;  // batch numbers lent and not yet released
  std::atomic<bool> closed{false};
  // The process it was made in: a fork child holds a copy of this state without its threads.
  const std::uint64_t fork_generation = ferry::fork_generation();
};

}  // namespace ferry::c_api

struct ferry_prefetch {
  std::shared_ptr<ferry::c_api::prefetch_state> state;
};

struct ferry_batch {
  std::shared_ptr<ferry::c_api::prefetch_state> state;
  ferry::ingest::device_batch batch;
  uintptr_t consumer = 0;
  std::atomic<int> holds{1};
};

using ferry::c_api::checked;
using ferry::c_api::expect_out;
using ferry::c_api::guard;

namespace {

// Drops one hold; the last one releases the batch on its consumer stream. Never throws: it runs in DLPack
// deleters. A failure to release is reported (the slot then stays lent; the prefetcher still closes).
void drop_hold(ferry_batch* b) noexcept {
  // In a fork child (a DataLoader's or a Loader's worker, any multiprocessing child) that frees a tensor
  // it inherited, perhaps in a garbage collection: the batch is the parent's, and releasing it here would
  // take the prefetcher's locks, which a thread of the parent may have held at the fork (held forever
  // in the child: it would hang). The child's copy is left as it is; the parent's is untouched.
  if (b->state->fork_generation != ferry::fork_generation()) return;
  if (b->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  auto& st = *b->state;
  try {
    if (ferry::c_api::is_default_stream(*st.dev, b->consumer)) {
      // The slot's release event must follow the default stream's use of the batch: bridge first.
      const ferry::stream_view bridge = ferry::c_api::producer_view(*st.dev, b->consumer);
      st.pf->release(b->batch, bridge);
    } else {
      st.pf->release(b->batch, st.dev->dev->adopt_stream(reinterpret_cast<void*>(b->consumer)));
    }
  } catch (const std::exception& e) {
    // A closed prefetcher refills no slot, so a release that fails there loses nothing: typically its
    // consumer stream is gone already, as when an interpreter frees a batch kept in a global after the
    // device and its streams (ferry/_runtime.py closes every prefetcher before either goes).
    if (!st.closed.load(std::memory_order_acquire)) {
      ferry::detail::report_destructor_error(
          fmt::format("ferry: releasing batch {}: {}", b->batch.epoch, e.what()),
          std::source_location::current());
    }
  }
  {
    const std::lock_guard lock(st.mu);
    st.lent.erase(b->batch.epoch);
  }
  delete b;
}

struct managed_holder {
  ferry::c_api::dl_managed_tensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  ferry_batch* batch = nullptr;
};

void delete_managed(ferry::c_api::dl_managed_tensor* m) {
  auto* h = static_cast<managed_holder*>(m->manager_ctx);
  ferry_batch* b = h->batch;
  delete h;
  drop_hold(b);
}

// The handle `p` for a call named `fn`, as checked() gives it, and made by this process. A fork child's copy
// has none of the parent's threads, and the locks they take may have been held at the fork (held forever in
// the child): any call on it would hang, so each is refused, naming the call.
ferry_prefetch& owned(ferry_prefetch* p, const char* fn) {
  auto& h = checked(p, fn);
  FERRY_EXPECTS(h.state->fork_generation == ferry::fork_generation(),
                fmt::format("{}: this prefetcher was made by the parent of this fork child; only the process "
                            "that made it can use it (its threads run there)",
                            fn));
  return h;
}

}  // namespace

extern "C" {

int ferry_prefetch_create(ferry_device* dev, size_t batch_bytes, size_t chunk_bytes, size_t workers,
                          size_t slots, size_t depth, ferry_prefetch** out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_create");
    auto& st = checked(dev, "ferry_prefetch_create").state;
    FERRY_EXPECTS(depth > 0, "prefetch: depth is 0; at least one device slot is needed");
    ferry::ingest::feed_options fo;
    fo.batch_bytes = batch_bytes;
    fo.chunk_bytes = chunk_bytes;
    fo.workers = workers;
    fo.slots = slots;
    *out = new ferry_prefetch{std::make_shared<ferry::c_api::prefetch_state>(st, fo, depth)};
  });
}

int ferry_prefetch_create_slots(ferry_device* dev, void* memory, size_t slot_bytes, size_t slots,
                                size_t depth, ferry_prefetch** out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_create_slots");
    auto& st = checked(dev, "ferry_prefetch_create_slots").state;
    FERRY_EXPECTS(depth > 0, "prefetch: depth is 0; at least one device slot is needed");
    *out = new ferry_prefetch{
        std::make_shared<ferry::c_api::prefetch_state>(st, memory, slot_bytes, slots, depth)};
  });
}

int ferry_copy_strided(void* dst, const void* src, size_t ndim, const int64_t* shape, const int64_t* strides,
                       size_t item_bytes) {
  return guard([&] {
    FERRY_EXPECTS(ndim == 0 || (shape != nullptr && strides != nullptr),
                  "ferry_copy_strided: shape or strides is NULL");
    FERRY_EXPECTS(ndim <= ferry::kMaxStridedDims,
                  fmt::format("ferry_copy_strided: {} dimensions; at most {}", ndim, ferry::kMaxStridedDims));
    FERRY_EXPECTS(dst != nullptr && src != nullptr, "ferry_copy_strided: dst or src is NULL");
    ferry::copy_strided(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src),
                        std::span<const int64_t>(shape, ndim), std::span<const int64_t>(strides, ndim),
                        item_bytes);
  });
}

int ferry_prefetch_slot_wait(ferry_prefetch* p, uint64_t batch, int64_t timeout_ms, int* writable) {
  return guard([&] {
    expect_out(writable, "ferry_prefetch_slot_wait");
    auto& f = owned(p, "ferry_prefetch_slot_wait").state->slots_of("ferry_prefetch_slot_wait");
    *writable = f.wait_writable(batch, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0))) ? 1 : 0;
  });
}

int ferry_prefetch_slot_ready(ferry_prefetch* p, uint64_t batch) {
  return guard([&] {
    owned(p, "ferry_prefetch_slot_ready").state->slots_of("ferry_prefetch_slot_ready").ready(batch);
  });
}

int ferry_prefetch_slot_offset(ferry_prefetch* p, uint64_t batch, size_t* offset) {
  return guard([&] {
    expect_out(offset, "ferry_prefetch_slot_offset");
    auto& st = *owned(p, "ferry_prefetch_slot_offset").state;
    const auto& slots = st.slots_of("ferry_prefetch_slot_offset");
    *offset = static_cast<std::size_t>(slots.slot(batch).data() - slots.slot(0).data());
  });
}

int ferry_prefetch_slot_event_fd(ferry_prefetch* p, int* fd) {
  return guard([&] {
    expect_out(fd, "ferry_prefetch_slot_event_fd");
    *fd = owned(p, "ferry_prefetch_slot_event_fd").state->slots_of("ferry_prefetch_slot_event_fd").event_fd();
  });
}

int ferry_prefetch_slot_bytes(ferry_prefetch* p, size_t* out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_slot_bytes");
    auto& st = *owned(p, "ferry_prefetch_slot_bytes").state;
    *out = st.feed ? st.feed->slot_bytes() : st.slot_size;
  });
}

int ferry_prefetch_push(ferry_prefetch* p, const void* const* data, const size_t* bytes,
                        const size_t* offsets, size_t count, uint64_t* number) {
  return guard([&] {
    expect_out(number, "ferry_prefetch_push");
    auto& st = *owned(p, "ferry_prefetch_push").state;
    FERRY_EXPECTS(count == 0 || (data != nullptr && bytes != nullptr && offsets != nullptr),
                  "ferry_prefetch_push: a piece array is NULL");
    std::vector<ferry::ingest::feed_piece> pieces(count);
    for (std::size_t i = 0; i < count; ++i) pieces[i] = {data[i], bytes[i], offsets[i]};
    *number = st.feed->push(pieces);
  });
}

int ferry_prefetch_next(ferry_prefetch* p, uintptr_t consumer_stream, ferry_batch** out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_next");
    auto& h = owned(p, "ferry_prefetch_next");
    auto& st = *h.state;
    const ferry::stream_view consumer = ferry::c_api::producer_view(*st.dev, consumer_stream);
    std::optional<ferry::ingest::device_batch> b = st.pf->next(consumer);
    FERRY_EXPECTS(b.has_value(), "prefetch: the loader ended");  // a feed runs until closed
    // A default stream waits for the bridge, which now waits for the copy.
    if (ferry::c_api::is_default_stream(*st.dev, consumer_stream)) {
      ferry::c_api::join_into(*st.dev, consumer_stream, consumer);
    }
    {
      const std::lock_guard lock(st.mu);
      st.lent.insert(b->epoch);
    }
    auto* batch = new ferry_batch{h.state, *b, consumer_stream};
    *out = batch;
  });
}

int ferry_prefetch_released(ferry_prefetch* p, uint64_t number, int* out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_released");
    auto& st = *checked(p, "ferry_prefetch_released").state;
    // A query of this process's copy, which never waits in a fork child: there the lock is only tried (a
    // thread of the parent may have held it at the fork, held forever in the child).
    std::unique_lock lock(st.mu, std::defer_lock);
    if (st.fork_generation == ferry::fork_generation()) {
      lock.lock();
    } else {
      FERRY_EXPECTS(
          lock.try_lock(),
          "ferry_prefetch_released: this prefetcher was made by the parent of this fork child, and a "
          "thread of the parent held its lock at the fork");
    }
    *out = st.lent.count(number) == 0 ? 1 : 0;
  });
}

int ferry_prefetch_stats_json(ferry_prefetch* p, char** out) {
  return guard([&] {
    expect_out(out, "ferry_prefetch_stats_json");
    auto& st = *owned(p, "ferry_prefetch_stats_json").state;
    const ferry::ingest::prefetch_stats s = st.pf->stats();
    const ferry::ingest::loader_stats l = st.source().stats();
    nlohmann::json j = {{"batches", s.batches},           {"bytes", s.bytes},
                        {"copy_seconds", s.copy_seconds}, {"h2d_gbps", s.h2d_gbps},
                        {"pin_seconds", l.pin_seconds},   {"pinned_bytes", l.pinned_bytes},
                        {"staged_bytes", l.bytes}};
    auto& stages = j["stages"] = nlohmann::json::array();
    for (const auto* list : {&l.stages, &s.stages}) {
      for (const auto& x : *list) {
        stages.push_back({{"name", x.name},
                          {"count", x.count},
                          {"bytes", x.bytes},
                          {"p50_ns", x.p50_ns},
                          {"p99_ns", x.p99_ns},
                          {"total_ns", x.total_ns}});
      }
    }
    *out = ferry::c_api::dup_string(j.dump());
  });
}

int ferry_prefetch_close(ferry_prefetch* p) {
  return guard([&] { owned(p, "ferry_prefetch_close").state->close(); });
}

void ferry_prefetch_destroy(ferry_prefetch* p) {
  // In a fork child the copy is left as it is (as drop_hold leaves inherited batches): destroying it would
  // join threads that do not exist in the child. The parent's prefetcher is untouched either way.
  if (p != nullptr && p->state->fork_generation != ferry::fork_generation()) return;
  delete p;
}

void* ferry_batch_data(ferry_batch* b) { return b == nullptr ? nullptr : b->batch.field(0).data; }

uint64_t ferry_batch_number(ferry_batch* b) { return b == nullptr ? 0 : b->batch.epoch; }

int ferry_batch_dlpack(ferry_batch* b, size_t offset, int32_t ndim, const int64_t* shape, uint8_t code,
                       uint8_t bits, uint16_t lanes, void** out) {
  return guard([&] {
    expect_out(out, "ferry_batch_dlpack");
    auto& h = checked(b, "ferry_batch_dlpack");
    FERRY_EXPECTS(ndim >= 0 && (ndim == 0 || shape != nullptr), "ferry_batch_dlpack: bad shape");
    FERRY_EXPECTS(bits % 8 == 0 && bits > 0 && lanes > 0,
                  fmt::format("ferry_batch_dlpack: dtype of {} bits x {} lanes", bits, lanes));
    std::uint64_t bytes = std::uint64_t{bits} / 8 * lanes;
    for (int32_t i = 0; i < ndim; ++i) {
      FERRY_EXPECTS(shape[i] >= 0, fmt::format("ferry_batch_dlpack: dimension {} is {}", i, shape[i]));
      bytes *= static_cast<std::uint64_t>(shape[i]);
    }
    const ferry::mem_view field = h.batch.field(0);
    FERRY_EXPECTS(offset <= field.bytes && bytes <= field.bytes - offset,
                  fmt::format("ferry_batch_dlpack: {} bytes at offset {} do not fit the batch of {}", bytes,
                              offset, field.bytes));
    auto holder = std::make_unique<managed_holder>();
    holder->shape.assign(shape, shape + ndim);
    holder->strides.assign(static_cast<std::size_t>(ndim), 1);
    for (int32_t i = ndim - 1; i > 0; --i)
      holder->strides[i - 1] = holder->strides[i] * std::max<std::int64_t>(shape[i], 1);
    const bool cuda = h.state->dev->dev->kind() == ferry::backend::cuda;
    auto& t = holder->managed.dl_tensor;
    t.data = field.begin() + offset;
    t.device = {cuda ? ferry::c_api::kdl_cuda : ferry::c_api::kdl_cpu, cuda ? h.state->dev->ordinal : 0};
    t.ndim = ndim;
    t.dtype = {code, bits, lanes};
    t.shape = holder->shape.data();
    t.strides = holder->strides.data();
    t.byte_offset = 0;
    holder->managed.manager_ctx = holder.get();
    holder->managed.deleter = delete_managed;
    holder->batch = &h;
    h.holds.fetch_add(1, std::memory_order_acq_rel);
    *out = &holder.release()->managed;
  });
}

void ferry_dlpack_delete(void* managed) {
  auto* m = static_cast<ferry::c_api::dl_managed_tensor*>(managed);
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

void ferry_batch_release(ferry_batch* b) {
  if (b != nullptr) drop_hold(b);
}

}  // extern "C"
