// The C ABI's egress functions: sinks and the pipeline.
#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>

#include "api.hpp"
#include "ferry/core/error.hpp"
#include "ferry/egress/egress.hpp"
#include "interop.hpp"

struct ferry_sink {
  std::shared_ptr<ferry::egress::sink> sink;
  ferry::egress::checksum_sink* checksum = nullptr;  // set for a checksum sink
};

namespace ferry::c_api {

// The sink the pipeline is given: the caller's, behind a gate that ferry_egress_abort shuts. Once shut,
// every consume throws, which fails the pipeline; a failed pipeline drops what no worker has taken yet
// and returns its slots, so a close() then waits only for the deliveries under way (an interpreter's
// second Ctrl-C), and a file sink renames none of the dropped outputs to its final name.
class abort_gate final : public egress::sink {
 public:
  explicit abort_gate(std::shared_ptr<egress::sink> inner) : inner_(std::move(inner)) {}
  void consume(const egress::output_chunk& d) override {
    if (shut_.load(std::memory_order_acquire)) {
      throw stopped_error(fmt::format(
          "egress aborted: output {} (tag {}) not delivered, nor any queued with it", d.sequence, d.tag));
    }
    inner_->consume(d);
  }
  // The caller's sink refuses what it cannot take (a file sink's repeated tag) at submit.
  void admit(std::uint64_t tag, std::uint64_t total_bytes) override { inner_->admit(tag, total_bytes); }
  void flush() override { inner_->flush(); }
  void shut() noexcept { shut_.store(true, std::memory_order_release); }

 private:
  std::shared_ptr<egress::sink> inner_;
  std::atomic<bool> shut_{false};
};

}  // namespace ferry::c_api

struct ferry_egress {
  std::shared_ptr<ferry::c_api::device_state> state;
  std::shared_ptr<ferry::egress::sink> sink;
  std::shared_ptr<ferry::c_api::abort_gate> gate;     // in front of `sink`
  std::unique_ptr<ferry::egress::pipeline> pipeline;  // last: closed before the device goes
};

using ferry::c_api::checked;
using ferry::c_api::expect_out;
using ferry::c_api::guard;

namespace {

ferry::egress::checksum_sink& checksum_of_sink(ferry_sink* s, const char* fn) {
  auto* c = checked(s, fn).checksum;
  FERRY_EXPECTS(c != nullptr, fmt::format("{}: the sink is not a checksum sink", fn));
  return *c;
}

}  // namespace

extern "C" {

int ferry_sink_null(ferry_sink** out) {
  return guard([&] {
    expect_out(out, "ferry_sink_null");
    *out = new ferry_sink{std::make_shared<ferry::egress::null_sink>()};
  });
}

int ferry_sink_checksum(ferry_sink** out) {
  return guard([&] {
    expect_out(out, "ferry_sink_checksum");
    auto s = std::make_shared<ferry::egress::checksum_sink>();
    auto* raw = s.get();
    *out = new ferry_sink{std::move(s), raw};
  });
}

int ferry_sink_checksum_get(ferry_sink* s, uint64_t tag, uint64_t* out) {
  return guard([&] {
    expect_out(out, "ferry_sink_checksum_get");
    *out = checksum_of_sink(s, "ferry_sink_checksum_get").checksum(tag);
  });
}

int ferry_sink_checksum_completed(ferry_sink* s, uint64_t* out) {
  return guard([&] {
    expect_out(out, "ferry_sink_checksum_completed");
    *out = checksum_of_sink(s, "ferry_sink_checksum_completed").completed();
  });
}

int ferry_sink_raw_file(const char* dir, const char* prefix, ferry_sink** out) {
  return guard([&] {
    expect_out(out, "ferry_sink_raw_file");
    FERRY_EXPECTS(dir != nullptr, "ferry_sink_raw_file: the directory is NULL");
    *out = new ferry_sink{std::make_shared<ferry::egress::raw_file_sink>(dir, prefix ? prefix : "output_")};
  });
}

int ferry_sink_npy(const char* dir, const size_t* shape, size_t ndim, const char* dtype, const char* prefix,
                   ferry_sink** out) {
  return guard([&] {
    expect_out(out, "ferry_sink_npy");
    FERRY_EXPECTS(dir != nullptr && dtype != nullptr, "ferry_sink_npy: the directory or dtype is NULL");
    FERRY_EXPECTS(shape != nullptr || ndim == 0, "ferry_sink_npy: the shape is NULL");
    std::vector<std::size_t> dims(shape, shape + ndim);
    *out = new ferry_sink{
        std::make_shared<ferry::egress::npy_sink>(dir, std::move(dims), dtype, prefix ? prefix : "output_")};
  });
}

int ferry_sink_callback(ferry_chunk_fn fn, void* user, ferry_sink** out) {
  return guard([&] {
    expect_out(out, "ferry_sink_callback");
    FERRY_EXPECTS(fn != nullptr, "ferry_sink_callback: the function is NULL");
    auto call = [fn, user](const ferry::egress::output_chunk& d) {
      const ferry_chunk c{d.sequence, d.tag,    d.offset,       d.total_bytes,
                          d.chunk,    d.chunks, d.bytes.data(), d.bytes.size()};
      if (const int rc = fn(user, &c); rc != 0) {
        throw ferry::c_api::callback_failed(
            fmt::format("the sink callback returned {} for output {} (tag {}), chunk {} of {}", rc,
                        d.sequence, d.tag, d.chunk + 1, d.chunks));
      }
    };
    *out = new ferry_sink{std::make_shared<ferry::egress::callback_sink>(std::move(call))};
  });
}

void ferry_sink_destroy(ferry_sink* s) { delete s; }

int ferry_egress_create(ferry_device* dev, ferry_sink* sink, size_t slot_bytes, size_t slots, size_t workers,
                        int ordered, ferry_egress** out) {
  return guard([&] {
    expect_out(out, "ferry_egress_create");
    auto& st = checked(dev, "ferry_egress_create").state;
    auto s = checked(sink, "ferry_egress_create").sink;
    ferry::egress::options o;
    o.slot_bytes = slot_bytes;
    o.slots = slots;
    o.sink_workers = workers;
    o.order = ordered != 0 ? ferry::delivery::in_order : ferry::delivery::as_completed;
    auto gate = std::make_shared<ferry::c_api::abort_gate>(s);
    auto p = std::make_unique<ferry::egress::pipeline>(*st->dev, gate, o);
    *out = new ferry_egress{st, std::move(s), std::move(gate), std::move(p)};
  });
}

int ferry_egress_submit(ferry_egress* e, void* data, size_t bytes, uintptr_t producer_stream, uint64_t tag,
                        ferry_event** out) {
  return guard([&] {
    expect_out(out, "ferry_egress_submit");
    auto& h = checked(e, "ferry_egress_submit");
    const ferry::stream_view producer = ferry::c_api::producer_view(*h.state, producer_stream);
    ferry::event copied = h.pipeline->submit(ferry::device_view(data, bytes), producer, tag);
    *out = new ferry_event{h.state, std::move(copied)};
  });
}

int ferry_egress_flush(ferry_egress* e) {
  return guard([&] { checked(e, "ferry_egress_flush").pipeline->flush(); });
}

int ferry_egress_close(ferry_egress* e) {
  return guard([&] { checked(e, "ferry_egress_close").pipeline->close(); });
}

int ferry_egress_abort(ferry_egress* e) {
  return guard([&] { checked(e, "ferry_egress_abort").gate->shut(); });
}

int ferry_egress_free_slots(ferry_egress* e, size_t* out) {
  return guard([&] {
    expect_out(out, "ferry_egress_free_slots");
    *out = checked(e, "ferry_egress_free_slots").pipeline->free_slots();
  });
}

int ferry_egress_stats_json(ferry_egress* e, char** out) {
  return guard([&] {
    expect_out(out, "ferry_egress_stats_json");
    const ferry::egress::pipeline_stats s = checked(e, "ferry_egress_stats_json").pipeline->stats();
    nlohmann::json j = {
        {"outputs", s.outputs},           {"deliveries", s.deliveries}, {"bytes", s.bytes},
        {"copy_seconds", s.copy_seconds}, {"d2h_gbps", s.d2h_gbps},     {"pin_seconds", s.pin_seconds},
        {"pinned_bytes", s.pinned_bytes}, {"dropped", s.dropped}};
    auto& stages = j["stages"] = nlohmann::json::array();
    for (const auto& st : s.stages) {
      stages.push_back({{"name", st.name},
                        {"count", st.count},
                        {"bytes", st.bytes},
                        {"p50_ns", st.p50_ns},
                        {"p99_ns", st.p99_ns},
                        {"max_ns", st.max_ns},
                        {"total_ns", st.total_ns}});
    }
    *out = ferry::c_api::dup_string(j.dump());
  });
}

void ferry_egress_destroy(ferry_egress* e) { delete e; }

}  // extern "C"
