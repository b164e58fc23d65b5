// The C ABI's comm functions: a group over the job's processes (a bootstrap of MPI, of this process
// alone, or of the caller's key-value store) and the reducer over it, with the flat gradient buffer lent
// to the caller as DLPack.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "api.hpp"
#include "dlpack.hpp"
#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/codec_cache.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/group.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/core/error.hpp"
#include "interop.hpp"

namespace ferry::c_api {
namespace {

// The caller's key-value store behind ferry::comm's interface. A function that fails throws: the store
// bootstrap reports it with the key and the collective.
class c_store final : public comm::key_value_store {
 public:
  explicit c_store(const ferry_kv_store& fns) : fns_(fns) {}
  void set(const std::string& key, std::span<const std::byte> value) override {
    if (fns_.set(fns_.user, key.c_str(), value.data(), value.size()) != 0)
      throw std::runtime_error(
          fmt::format("the store's set of key '{}' ({} bytes) failed", key, value.size()));
  }
  bool get(const std::string& key, std::span<std::byte> out, std::chrono::milliseconds wait) override {
    const int rc = fns_.get(fns_.user, key.c_str(), out.data(), out.size(), wait.count());
    if (rc == 0) return true;
    if (rc == 1) return false;
    throw std::runtime_error(fmt::format("the store's get of key '{}' ({} bytes expected) failed (status {})",
                                         key, out.size(), rc));
  }
  void erase(const std::string& key) override {
    if (fns_.erase != nullptr) static_cast<void>(fns_.erase(fns_.user, key.c_str()));
  }

 private:
  ferry_kv_store fns_;
};

std::chrono::milliseconds timeout_of(double seconds, const char* fn) {
  FERRY_EXPECTS(std::isfinite(seconds) && seconds > 0 && seconds <= 86400.0 * 365,
                fmt::format("{}: timeout {} s must be a positive number of seconds", fn, seconds));
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000)));
}

}  // namespace

/// A group's rank in this process: the communicator and what it runs on.
struct comm_state {
  std::shared_ptr<device_state> dev;
  std::unique_ptr<comm::communicator> comm;
  std::string backend;
  // ferry_comm_all_reduce_mean's codecs (one per codec and bucket size, kept: Note [Loose buckets reuse
  // their codec] in docs/COMM.md), their wire buffer, and the end of its last use (a call on another
  // stream waits for it before it writes the buffer again); all under wire_mu.
  std::mutex wire_mu;
  std::unique_ptr<comm::codec_cache> codecs;
  buffer wire;
  event wire_free;
  ~comm_state() {
    codecs.reset();
    comm.reset();
    wire_free = event();
    wire = buffer();
  }
};

/// What a framework's gradient hooks (ferry_reducer_grad_hook) have told the reducer in a step: Note
/// [Gradient hooks in C] in docs/COMM.md. The phase moves closed -> open (begin_step) -> armed (the caller
/// saw its backward start) -> closed (finish). A hook while closed is a gradient made outside a step (under
/// no_sync) and is only noted; one while open came before the backward reached the module's outputs.
struct hook_counts {
  enum class phase : std::uint8_t { closed, open, armed };
  std::mutex mu;
  phase at = phase::closed;
  std::uintptr_t stream = 0;                      // where the step's gradients are produced (from arm)
  std::vector<std::uint8_t> marked;               // per gradient, this step
  std::vector<std::uint8_t> unsynced;             // per gradient: hooked outside a step since the last read
  std::vector<std::size_t> left;                  // per bucket: gradients still to come (outside learning)
  std::vector<std::vector<std::size_t>> counted;  // per bucket: hooked, not yet told the reducer
  std::size_t marks = 0;
  std::int64_t twice = -1;  // the first gradient hooked twice in the step
  std::int64_t early = -1;  // the first gradient hooked before arm
  std::string error;        // the first failure of the reducer under a hook
};

/// A reducer and the group it reduces over (kept alive by it).
struct reducer_state {
  std::shared_ptr<comm_state> group;
  std::unique_ptr<comm::reducer> red;
  hook_counts hooks;
  ~reducer_state() { red.reset(); }
};

}  // namespace ferry::c_api

struct ferry_comm {
  std::shared_ptr<ferry::c_api::comm_state> state;
};

struct ferry_reducer {
  std::shared_ptr<ferry::c_api::reducer_state> state;
};

using ferry::c_api::checked;
using ferry::c_api::expect_out;
using ferry::c_api::guard;

namespace {

ferry_comm* make_comm(ferry_device* dev, std::shared_ptr<ferry::comm::bootstrap> job, double timeout_s,
                      const char* fn) {
  auto& d = checked(dev, fn);
  ferry::comm::comm_options o;
  o.timeout = ferry::c_api::timeout_of(timeout_s, fn);
  auto st = std::make_shared<ferry::c_api::comm_state>();
  st->dev = d.state;
  st->comm = ferry::comm::open_group(std::move(job), *d.state->dev, o);
  st->codecs = std::make_unique<ferry::comm::codec_cache>(*st->comm);
  st->backend = std::string(st->comm->backend_name());
  return new ferry_comm{std::move(st)};
}

ferry::comm::dtype dtype_of(const char* name, const char* fn) {
  FERRY_EXPECTS(name != nullptr, fmt::format("{}: the dtype is NULL", fn));
  return ferry::comm::parse_dtype(name);
}

// A view of `count` elements of `type` at `p` on the group's device.
ferry::mem_view view_of(const ferry::c_api::comm_state& st, const void* p, std::size_t count,
                        ferry::comm::dtype type) {
  const std::size_t bytes = count * ferry::comm::size_of(type);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): collectives only read a send view
  return ferry::device_view(const_cast<void*>(p), bytes);
}

ferry::comm::reducer_options reducer_options_of(const char* json, int world) {
  ferry::comm::reducer_options o;
  if (json == nullptr || *json == '\0') return o;
  const nlohmann::json j = nlohmann::json::parse(json);
  FERRY_EXPECTS(j.is_object(), fmt::format("ferry_reducer_create: options {} are not a JSON object", json));
  for (const auto& [key, value] : j.items()) {
    if (key == "plan") {
      const std::string plan = value.get<std::string>();
      FERRY_EXPECTS(plan == "auto" || plan == "fixed",
                    fmt::format("ferry_reducer_create: plan '{}': expected \"auto\" or \"fixed\"", plan));
      o.automatic.enabled = plan == "auto";
    } else if (key == "lossy") {
      o.automatic.policy =
          value.get<bool>() ? ferry::comm::codec_policy::lossy_allowed : ferry::comm::codec_policy::lossless;
    } else if (key == "first_bucket_bytes") {
      o.plan.first_bucket_bytes = value.get<std::size_t>();
    } else if (key == "bucket_cap_bytes") {
      o.plan.bucket_cap_bytes = value.get<std::size_t>();
    } else if (key == "codec") {
      o.codec = ferry::comm::parse_codec(value.get<std::string>());
    } else if (key == "rebuild") {
      o.rebuild = value.get<bool>();
    } else if (key == "learn_steps") {
      o.automatic.learn_steps = value.get<int>();
    } else if (key == "timing") {
      o.timing = value.get<bool>();
    } else if (key == "codec_options") {
      // {"<codec>": {"<field>": number or boolean, ...}, ...}: each codec reads its own fields (its
      // registry entry's options_from_fields), so no codec is named here.
      FERRY_EXPECTS(value.is_object(),
                    "ferry_reducer_create: codec_options must be an object of codec names");
      for (const auto& [name, fields] : value.items()) {
        const ferry::comm::codec_kind kind = ferry::comm::parse_codec(name);
        const auto& entry = ferry::comm::codec_info(kind);
        FERRY_EXPECTS(static_cast<bool>(entry.options_from_fields),
                      fmt::format("ferry_reducer_create: codec_options: codec '{}' takes no options", name));
        FERRY_EXPECTS(fields.is_object(),
                      fmt::format("ferry_reducer_create: codec_options.{} must be an object "
                                  "of its fields",
                                  name));
        std::vector<std::pair<std::string, double>> named;
        for (const auto& [field, v] : fields.items()) {
          FERRY_EXPECTS(v.is_number() || v.is_boolean(),
                        fmt::format("ferry_reducer_create: codec_options.{}.{} = {}: expected a number or a "
                                    "boolean",
                                    name, field, v.dump()));
          named.emplace_back(field, v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>());
        }
        o.codec_options[kind] = entry.options_from_fields(named);
      }
    } else if (key == "grad_dtype") {
      o.grad_type = ferry::comm::parse_dtype(value.get<std::string>());
    } else if (key == "reduce_dtype") {
      if (!value.is_null()) o.reduce_type = ferry::comm::parse_dtype(value.get<std::string>());
    } else {
      throw ferry::logic_error(
          fmt::format("ferry_reducer_create: option '{}' is not one of plan, lossy, first_bucket_bytes, "
                      "bucket_cap_bytes, codec, codec_options, rebuild, learn_steps, timing, grad_dtype, "
                      "reduce_dtype",
                      key));
    }
  }
  static_cast<void>(world);
  return o;
}

}  // namespace

extern "C" {

int ferry_comm_open(ferry_device* dev, const char* bootstrap, double timeout_s, ferry_comm** out) {
  return guard([&] {
    expect_out(out, "ferry_comm_open");
    *out = nullptr;
    std::shared_ptr<ferry::comm::bootstrap> job =
        ferry::comm::make_bootstrap(bootstrap == nullptr ? "auto" : bootstrap);
    *out = make_comm(dev, std::move(job), timeout_s, "ferry_comm_open");
  });
}

int ferry_comm_open_store(ferry_device* dev, const ferry_kv_store* store, const char* prefix, int rank,
                          int size, double timeout_s, ferry_comm** out) {
  return guard([&] {
    expect_out(out, "ferry_comm_open_store");
    *out = nullptr;
    FERRY_EXPECTS(store != nullptr && store->set != nullptr && store->get != nullptr,
                  "ferry_comm_open_store: the store and its set and get functions must not be NULL");
    FERRY_EXPECTS(prefix != nullptr, "ferry_comm_open_store: the key prefix is NULL");
    const auto timeout = ferry::c_api::timeout_of(timeout_s, "ferry_comm_open_store");
    std::shared_ptr<ferry::comm::bootstrap> job = ferry::comm::make_store_bootstrap(
        std::make_shared<ferry::c_api::c_store>(*store), rank, size, prefix, timeout);
    *out = make_comm(dev, std::move(job), timeout_s, "ferry_comm_open_store");
  });
}

int ferry_comm_rank(ferry_comm* c, int* rank, int* size) {
  return guard([&] {
    const auto& st = *checked(c, "ferry_comm_rank").state;
    if (rank != nullptr) *rank = st.comm->rank();
    if (size != nullptr) *size = st.comm->size();
  });
}

const char* ferry_comm_backend(ferry_comm* c) { return c == nullptr ? "" : c->state->backend.c_str(); }

int ferry_comm_all_reduce(ferry_comm* c, const void* send, void* recv, size_t count, const char* dtype,
                          const char* op, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(c, "ferry_comm_all_reduce").state;
    const ferry::comm::dtype t = dtype_of(dtype, "ferry_comm_all_reduce");
    const std::string o = op == nullptr ? "sum" : op;
    FERRY_EXPECTS(o == "sum" || o == "avg",
                  fmt::format("ferry_comm_all_reduce: op '{}': expected sum or avg", o));
    const ferry::stream_view s = ferry::c_api::producer_view(*st.dev, stream);
    const ferry::event done =
        st.comm->all_reduce(view_of(st, send, count, t), view_of(st, recv, count, t), count, t,
                            o == "avg" ? ferry::comm::reduce_op::avg : ferry::comm::reduce_op::sum, s);
    ferry::c_api::wait_event(*st.dev, stream, done);
  });
}

int ferry_comm_broadcast(ferry_comm* c, const void* send, void* recv, size_t count, const char* dtype,
                         int root, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(c, "ferry_comm_broadcast").state;
    const ferry::comm::dtype t = dtype_of(dtype, "ferry_comm_broadcast");
    const ferry::stream_view s = ferry::c_api::producer_view(*st.dev, stream);
    const ferry::mem_view from = st.comm->rank() == root ? view_of(st, send, count, t) : ferry::mem_view{};
    const ferry::event done = st.comm->broadcast(from, view_of(st, recv, count, t), count, t, root, s);
    ferry::c_api::wait_event(*st.dev, stream, done);
  });
}

int ferry_comm_all_reduce_mean(ferry_comm* c, void* data, size_t count, const char* codec, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(c, "ferry_comm_all_reduce_mean").state;
    FERRY_EXPECTS(codec != nullptr, "ferry_comm_all_reduce_mean: the codec is NULL");
    const ferry::comm::codec_kind k = ferry::comm::parse_codec(codec);
    FERRY_EXPECTS(
        ferry::comm::stateless(k),
        fmt::format("ferry_comm_all_reduce_mean: {} keeps state per bucket of a reducer's plan, so "
                    "it runs in the reducer (DataParallel(lossy=True)), not per bucket (the stateless "
                    "codecs: {})",
                    ferry::comm::to_string(k), ferry::comm::codec_names(ferry::comm::stateless)));
    const ferry::mem_view bucket = view_of(st, data, count, ferry::comm::dtype::f32);
    const ferry::stream_view s = ferry::c_api::producer_view(*st.dev, stream);
    const std::lock_guard lock(st.wire_mu);
    // The reducer's own per-bucket exchange (bucket_codec.hpp), made at the first call for this codec and
    // size and kept (Note [Loose buckets reuse their codec]).
    ferry::comm::bucket_codec& exchange = st.codecs->get(k, count);
    const std::size_t bytes = exchange.scratch_bytes();
    const bool used = !st.wire_free.empty() && st.wire_free.recorded();
    if (st.wire.size() < bytes) {
      if (used) st.wire_free.synchronize();
      st.wire = st.dev->dev->alloc_device(bytes);
    } else if (used && bytes > 0) {
      s.wait(st.wire_free);
    }
    ferry::comm::reduce_marks marks;
    exchange.reduce_async(bucket, bytes > 0 ? st.wire.view(0, bytes) : ferry::mem_view{}, s, marks);
    if (st.wire_free.empty()) st.wire_free = st.dev->dev->make_event();
    st.wire_free.record(s);
    // The caller's stream waits for the exchange through the same event (a wait takes the record it sees).
    ferry::c_api::wait_event(*st.dev, stream, st.wire_free);
  });
}

int ferry_comm_codecs_json(char** out) {
  return guard([&] {
    expect_out(out, "ferry_comm_codecs_json");
    nlohmann::json list = nlohmann::json::array();
    for (const ferry::comm::codec_kind k : ferry::comm::registered_codecs()) {
      const auto& e = ferry::comm::codec_info(k);
      list.push_back({{"name", e.name},
                      {"aliases", e.aliases},
                      {"lossy", e.lossy},
                      {"stateless", ferry::comm::stateless(k)},
                      {"automatic", e.automatic},
                      {"options", static_cast<bool>(e.options_from_fields)}});
    }
    *out = ferry::c_api::dup_string(list.dump());
  });
}

int ferry_comm_abort(ferry_comm* c, const char* why) {
  return guard([&] { checked(c, "ferry_comm_abort").state->comm->abort(why == nullptr ? "abort" : why); });
}

void ferry_comm_destroy(ferry_comm* c) { delete c; }

int ferry_reducer_create(ferry_comm* c, const int64_t* rows, const int64_t* cols, size_t params,
                         const char* options_json, ferry_reducer** out) {
  return guard([&] {
    expect_out(out, "ferry_reducer_create");
    *out = nullptr;
    auto& h = checked(c, "ferry_reducer_create");
    FERRY_EXPECTS(params > 0 && rows != nullptr && cols != nullptr,
                  "ferry_reducer_create: give at least one parameter (rows and cols not NULL)");
    std::vector<ferry::comm::matrix_shape> shapes(params);
    for (size_t p = 0; p < params; ++p) {
      FERRY_EXPECTS(
          rows[p] > 0 && cols[p] > 0,
          fmt::format("ferry_reducer_create: parameter {} has shape {} x {}; every dimension must be "
                      "positive",
                      p, rows[p], cols[p]));
      shapes[p] = {static_cast<std::size_t>(rows[p]), static_cast<std::size_t>(cols[p])};
    }
    auto st = std::make_shared<ferry::c_api::reducer_state>();
    st->group = h.state;
    st->red = std::make_unique<ferry::comm::reducer>(*h.state->comm, shapes,
                                                     reducer_options_of(options_json, h.state->comm->size()));
    st->hooks.marked.assign(params, 0);
    st->hooks.unsynced.assign(params, 0);
    *out = new ferry_reducer{std::move(st)};
  });
}

int ferry_reducer_layout(ferry_reducer* r, uint64_t* generation, int* pending) {
  return guard([&] {
    const auto& red = *checked(r, "ferry_reducer_layout").state->red;
    if (generation != nullptr) *generation = red.generation();
    if (pending != nullptr) *pending = red.plan_pending() || red.rebuild_due() ? 1 : 0;
  });
}

int ferry_reducer_begin_step(ferry_reducer* r) {
  return guard([&] {
    auto& st = *checked(r, "ferry_reducer_begin_step").state;
    st.red->begin_step();
    const std::lock_guard lock(st.hooks.mu);
    st.hooks.at = ferry::c_api::hook_counts::phase::open;
    std::fill(st.hooks.marked.begin(), st.hooks.marked.end(), std::uint8_t{0});
    st.hooks.marks = 0;
    st.hooks.twice = st.hooks.early = -1;
    st.hooks.error.clear();
  });
}

int ferry_reducer_hooks_arm(ferry_reducer* r, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(r, "ferry_reducer_hooks_arm").state;
    auto& h = st.hooks;
    const std::lock_guard lock(h.mu);
    // Armed again only before any gradient: a backward that accumulated none (the caller's next backward
    // is the step's).
    FERRY_EXPECTS(
        h.at == ferry::c_api::hook_counts::phase::open ||
            (h.at == ferry::c_api::hook_counts::phase::armed && h.marks == 0),
        h.at == ferry::c_api::hook_counts::phase::armed
            ? fmt::format("ferry_reducer_hooks_arm: armed again after {} gradients of the step", h.marks)
            : std::string("ferry_reducer_hooks_arm outside a step: call ferry_reducer_begin_step first"));
    // Validate the stream now, where an error can be returned (a hook cannot return one). A default
    // stream needs no check, and its view is a bridge join: made once a bucket, not here too.
    if (!ferry::c_api::is_default_stream(*st.group->dev, stream))
      static_cast<void>(ferry::c_api::producer_view(*st.group->dev, stream));
    const auto& places = st.red->plan().places;
    std::size_t buckets = 0;
    for (const auto& pl : places) buckets = std::max(buckets, pl.bucket + 1);
    h.left.assign(buckets, 0);
    h.counted.resize(buckets);
    for (auto& c : h.counted) c.clear();
    for (const auto& pl : places) ++h.left[pl.bucket];
    h.stream = stream;
    h.at = ferry::c_api::hook_counts::phase::armed;
  });
}

void ferry_reducer_grad_hook(ferry_reducer* r, size_t p, void* /*hook_argument*/) {
  using phase = ferry::c_api::hook_counts::phase;
  if (r == nullptr || !r->state) return;
  auto& st = *r->state;
  auto& h = st.hooks;
  const std::lock_guard lock(h.mu);
  if (p >= h.marked.size()) {
    if (h.error.empty())
      h.error = fmt::format("a gradient hook for parameter {} of a reducer of {}", p, h.marked.size());
    return;
  }
  if (h.at == phase::closed) {
    h.unsynced[p] = 1;
    return;
  }
  if (h.at == phase::open) {
    if (h.early < 0) h.early = static_cast<std::int64_t>(p);
    return;
  }
  if (h.twice >= 0 || !h.error.empty()) return;
  if (h.marked[p] != 0) {
    h.twice = static_cast<std::int64_t>(p);
    return;
  }
  h.marked[p] = 1;
  ++h.marks;
  try {
    auto& dev = *st.group->dev;
    if (st.red->learning()) {
      // The automatic plan times each gradient's readiness: every mark on its own.
      st.red->mark_ready(p, ferry::c_api::producer_view(dev, h.stream));
      return;
    }
    // One stream view (on a default stream: one bridge) a bucket, once it is full.
    const std::size_t b = st.red->plan().places[p].bucket;
    h.counted[b].push_back(p);
    if (--h.left[b] != 0) return;
    const ferry::stream_view s = ferry::c_api::producer_view(dev, h.stream);
    for (const std::size_t q : h.counted[b]) st.red->mark_ready(q, s);
    h.counted[b].clear();
  } catch (const std::exception& e) {
    h.error = e.what();
  } catch (...) {
    h.error = "an unknown exception";
  }
}

void ferry_reducer_grad_node_hook(ferry_reducer* r, size_t p, void* /*grad_inputs*/, void* /*grad_outputs*/) {
  ferry_reducer_grad_hook(r, p, nullptr);
}

int ferry_reducer_hooks_state(ferry_reducer* r, size_t* marks, int64_t* twice, int64_t* early, char** error) {
  return guard([&] {
    auto& h = checked(r, "ferry_reducer_hooks_state").state->hooks;
    const std::lock_guard lock(h.mu);
    if (marks != nullptr) *marks = h.marks;
    if (twice != nullptr) *twice = h.twice;
    if (early != nullptr) *early = h.early;
    if (error != nullptr) *error = h.error.empty() ? nullptr : ferry::c_api::dup_string(h.error);
  });
}

int ferry_reducer_hooks_flags(ferry_reducer* r, uint8_t* marked, uint8_t* unsynced, size_t n) {
  return guard([&] {
    auto& h = checked(r, "ferry_reducer_hooks_flags").state->hooks;
    const std::lock_guard lock(h.mu);
    FERRY_EXPECTS(n == h.marked.size(),
                  fmt::format("ferry_reducer_hooks_flags: {} entries asked of a reducer "
                              "of {} parameters",
                              n, h.marked.size()));
    if (marked != nullptr) std::copy(h.marked.begin(), h.marked.end(), marked);
    if (unsynced != nullptr) {
      std::copy(h.unsynced.begin(), h.unsynced.end(), unsynced);
      std::fill(h.unsynced.begin(), h.unsynced.end(), std::uint8_t{0});
    }
  });
}

int ferry_reducer_flat_dlpack(ferry_reducer* r, void** out) {
  return guard([&] {
    expect_out(out, "ferry_reducer_flat_dlpack");
    auto& st = *checked(r, "ferry_reducer_flat_dlpack").state;
    const ferry::mem_view flat = st.red->flat();
    struct holder {
      ferry::c_api::dl_managed_tensor managed{};
      std::int64_t shape = 0;
      std::int64_t stride = 1;
    };
    auto h = std::make_unique<holder>();
    const ferry::comm::dtype type = st.red->grad_type();
    const std::size_t size = ferry::comm::size_of(type);
    h->shape = static_cast<std::int64_t>(flat.bytes / size);
    const auto& dev = *st.group->dev;
    const bool cuda = dev.dev->kind() == ferry::backend::cuda;
    auto& t = h->managed.dl_tensor;
    t.data = flat.data;
    t.device = {cuda ? ferry::c_api::kdl_cuda : ferry::c_api::kdl_cpu, cuda ? dev.ordinal : 0};
    t.ndim = 1;
    t.dtype = {type == ferry::comm::dtype::bf16 ? ferry::c_api::kdl_bfloat : ferry::c_api::kdl_float,
               static_cast<std::uint8_t>(8 * size), 1};
    t.shape = &h->shape;
    t.strides = &h->stride;
    t.byte_offset = 0;
    h->managed.manager_ctx = h.get();
    h->managed.deleter = [](ferry::c_api::dl_managed_tensor* m) {
      delete static_cast<holder*>(m->manager_ctx);
    };
    *out = &h.release()->managed;
  });
}

int ferry_reducer_place(ferry_reducer* r, size_t p, size_t* offset, size_t* elements) {
  return guard([&] {
    const auto& red = *checked(r, "ferry_reducer_place").state->red;
    FERRY_EXPECTS(p < red.param_count(), fmt::format("ferry_reducer_place: parameter {} of {} (0..{})", p,
                                                     red.param_count(), red.param_count() - 1));
    const ferry::mem_view g = red.grad(p);
    const ferry::mem_view flat = red.flat();
    const std::size_t size = ferry::comm::size_of(red.grad_type());
    if (offset != nullptr) *offset = (g.begin() - flat.begin()) / size;
    if (elements != nullptr) *elements = g.bytes / size;
  });
}

int ferry_reducer_mark_ready(ferry_reducer* r, size_t p, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(r, "ferry_reducer_mark_ready").state;
    st.red->mark_ready(p, ferry::c_api::producer_view(*st.group->dev, stream));
  });
}

int ferry_reducer_mark_ready_many(ferry_reducer* r, const size_t* ps, size_t n, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(r, "ferry_reducer_mark_ready_many").state;
    FERRY_EXPECTS(n == 0 || ps != nullptr, "ferry_reducer_mark_ready_many: the parameter list is NULL");
    if (n == 0) return;
    const ferry::stream_view s = ferry::c_api::producer_view(*st.group->dev, stream);
    for (size_t i = 0; i < n; ++i) st.red->mark_ready(ps[i], s);
  });
}

int ferry_reducer_buckets(ferry_reducer* r, size_t* out, size_t n, int* learning) {
  return guard([&] {
    const auto& red = *checked(r, "ferry_reducer_buckets").state->red;
    FERRY_EXPECTS(out != nullptr || n == 0, "ferry_reducer_buckets: the output array is NULL");
    FERRY_EXPECTS(n <= red.param_count(),
                  fmt::format("ferry_reducer_buckets: {} entries asked of a reducer of {} "
                              "parameters",
                              n, red.param_count()));
    for (size_t p = 0; p < n; ++p) out[p] = red.plan().places[p].bucket;
    if (learning != nullptr) *learning = red.learning() ? 1 : 0;
  });
}

int ferry_reducer_finish(ferry_reducer* r, uintptr_t stream) {
  return guard([&] {
    auto& st = *checked(r, "ferry_reducer_finish").state;
    auto& dev = *st.group->dev;
    if (ferry::c_api::is_default_stream(dev, stream)) {
      // The default stream waits for the last bucket through the bridge.
      const ferry::stream_view bridge = ferry::c_api::producer_view(dev, stream);
      st.red->finish(bridge);
      ferry::c_api::join_into(dev, stream, bridge);
    } else {
      st.red->finish(ferry::c_api::producer_view(dev, stream));
    }
    const std::lock_guard lock(st.hooks.mu);
    st.hooks.at = ferry::c_api::hook_counts::phase::closed;
  });
}

int ferry_reducer_stats_json(ferry_reducer* r, char** out) {
  return guard([&] {
    expect_out(out, "ferry_reducer_stats_json");
    const auto& red = *checked(r, "ferry_reducer_stats_json").state->red;
    const ferry::comm::reducer_stats s = red.stats();
    nlohmann::json j;
    j["steps"] = s.steps;
    j["buckets_launched"] = s.buckets_launched;
    j["wire_bytes"] = s.wire_bytes;
    j["gradient_bytes"] = s.gradient_bytes;
    j["plan_changes"] = s.plan_changes;
    j["generation"] = red.generation();
    j["grad_dtype"] = std::string(ferry::comm::to_string(red.grad_type()));
    j["buckets"] = red.plan().buckets.size();
    std::vector<std::string> codecs;
    for (const ferry::comm::codec_kind k : red.codecs()) codecs.emplace_back(ferry::comm::to_string(k));
    j["codecs"] = codecs;
    std::vector<std::size_t> bucket_bytes;
    for (const auto& b : red.plan().buckets) bucket_bytes.push_back(b.bytes());
    j["bucket_bytes"] = bucket_bytes;
    j["learning"] = red.learning();
    const auto& decided = red.auto_result();
    if (decided) {
      j["decided"] = {{"buckets", decided->buckets},
                      {"first_bucket_bytes", decided->first_bucket_bytes},
                      {"bucket_cap_bytes", decided->bucket_cap_bytes},
                      {"lossy_buckets", decided->lossy_buckets},
                      {"predicted_exposed_ms", decided->predicted_exposed_s * 1e3},
                      {"backward_ms", decided->backward_s * 1e3},
                      {"per_bucket_compute_us", decided->per_bucket_compute_us},
                      {"decided_at_step", decided->decided_at_step}};
    } else {
      j["decided"] = nullptr;
    }
    j["backend"] = std::string(red.comm().backend_name());
    j["rank"] = red.comm().rank();
    j["world_size"] = red.comm().size();
    *out = ferry::c_api::dup_string(j.dump());
  });
}

void ferry_reducer_destroy(ferry_reducer* r) { delete r; }

}  // extern "C"
