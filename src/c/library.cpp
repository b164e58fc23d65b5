// The C ABI's library, device, stream, event, probe and analyze functions.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>

#include "api.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/cuda/cuda.hpp"
#include "ferry/egress/egress.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/report/report_html.hpp"
#include "ferry/trace/trace_io.hpp"
#include "ferry_version.hpp"
#include "interop.hpp"

namespace ferry::c_api {
namespace {
thread_local std::string last_error;
}  // namespace

void set_last_error(std::string what) noexcept {
  try {
    last_error = std::move(what);
  } catch (...) {
    last_error.clear();
  }
}

int status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const callback_failed& e) {
    set_last_error(e.what());
    return FERRY_ERROR_CALLBACK;
  } catch (const stopped_error& e) {
    set_last_error(e.what());
    return FERRY_ERROR_STOPPED;
  } catch (const out_of_memory& e) {
    set_last_error(e.what());
    return FERRY_ERROR_OUT_OF_MEMORY;
  } catch (const cuda_error& e) {
    set_last_error(e.what());
    return FERRY_ERROR_CUDA;
  } catch (const input_error& e) {
    set_last_error(e.what());
    return FERRY_ERROR_INPUT;
  } catch (const std::system_error& e) {
    set_last_error(e.what());
    return FERRY_ERROR_SYSTEM;
  } catch (const std::logic_error& e) {
    set_last_error(e.what());
    return FERRY_ERROR_INVALID;
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return FERRY_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return FERRY_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("unknown exception");
    return FERRY_ERROR_INTERNAL;
  }
}

char* dup_string(const std::string& s) {
  auto* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace ferry::c_api

using ferry::c_api::checked;
using ferry::c_api::dup_string;
using ferry::c_api::expect_out;
using ferry::c_api::guard;

struct ferry_analysis {
  ferry::trace::timeline timeline;
  ferry::trace::analysis analysis;
  std::string json;
  std::string text;
};

extern "C" {

const char* ferry_version(void) { return FERRY_VERSION; }

int ferry_abi_version(void) { return FERRY_C_ABI_VERSION; }

const char* ferry_last_error(void) { return ferry::c_api::last_error.c_str(); }

void ferry_string_free(char* s) { std::free(s); }

uint64_t ferry_checksum_of(const void* data, size_t bytes) {
  if (data == nullptr) return ferry::egress::checksum_of({});
  return ferry::egress::checksum_of({static_cast<const std::byte*>(data), bytes});
}

int ferry_device_create(const char* backend, int ordinal, ferry_device** out) {
  return guard([&] {
    expect_out(out, "ferry_device_create");
    const std::string b = backend == nullptr ? "auto" : backend;
    auto st = std::make_shared<ferry::c_api::device_state>();
    if (b == "auto") {
      FERRY_EXPECTS(
          ordinal == 0 || ferry::cuda_available(),
          fmt::format("device(\"auto\", {}): no GPU is visible, so only the host device 0 exists", ordinal));
      st->dev = ordinal == 0 ? ferry::make_default_device(&st->reason) : ferry::make_cuda_device(ordinal);
    } else if (b == "cuda") {
      st->dev = ferry::make_cuda_device(ordinal);
    } else if (b == "host") {
      FERRY_EXPECTS(ordinal == 0,
                    fmt::format("device(\"host\", {}): the host backend has one device, 0", ordinal));
      st->dev = ferry::make_host_device();
    } else {
      throw ferry::logic_error(
          fmt::format("device backend '{}': expected \"auto\", \"cuda\" or \"host\"", b));
    }
    st->ordinal = st->dev->info().ordinal;
    *out = new ferry_device{std::move(st)};
  });
}

void ferry_device_destroy(ferry_device* dev) { delete dev; }

int ferry_device_info_json(ferry_device* dev, char** out) {
  return guard([&] {
    expect_out(out, "ferry_device_info_json");
    const auto& st = *checked(dev, "ferry_device_info_json").state;
    // device_info's one shape, and why "auto" took the device it did.
    nlohmann::json j = nlohmann::json::parse(ferry::to_json(st.dev->info()));
    j["reason"] = st.reason;
    *out = dup_string(j.dump());
  });
}

int ferry_device_synchronize(ferry_device* dev) {
  return guard([&] { checked(dev, "ferry_device_synchronize").state->dev->synchronize(); });
}

int ferry_stream_create(ferry_device* dev, ferry_stream** out) {
  return guard([&] {
    expect_out(out, "ferry_stream_create");
    auto& st = checked(dev, "ferry_stream_create").state;
    *out = new ferry_stream{st, st->dev->make_stream()};
  });
}

uintptr_t ferry_stream_handle(ferry_stream* s) {
  return s == nullptr ? 0 : reinterpret_cast<uintptr_t>(s->s.view().native());
}

void ferry_stream_destroy(ferry_stream* s) { delete s; }

int ferry_stream_synchronize(ferry_device* dev, uintptr_t stream) {
  return guard([&] { ferry::c_api::synchronize(*checked(dev, "ferry_stream_synchronize").state, stream); });
}

int ferry_stream_wait_event(ferry_device* dev, uintptr_t stream, ferry_event* e) {
  return guard([&] {
    ferry::c_api::wait_event(*checked(dev, "ferry_stream_wait_event").state, stream,
                             checked(e, "ferry_stream_wait_event").e);
  });
}

int ferry_event_query(ferry_event* e, int* done) {
  return guard([&] {
    expect_out(done, "ferry_event_query");
    *done = checked(e, "ferry_event_query").e.query() ? 1 : 0;
  });
}

int ferry_event_synchronize(ferry_event* e) {
  return guard([&] { checked(e, "ferry_event_synchronize").e.synchronize(); });
}

void ferry_event_destroy(ferry_event* e) { delete e; }

int ferry_probe_run(ferry_device* dev, size_t copy_bytes, int warmup, int iterations, size_t pin_bytes,
                    char** out) {
  return guard([&] {
    expect_out(out, "ferry_probe_run");
    ferry::device& d = *checked(dev, "ferry_probe_run").state->dev;
    ferry::probe::options o = ferry::probe::default_options(d.kind());
    if (copy_bytes > 0) o.copy_bytes = copy_bytes;
    if (warmup > 0) o.warmup = warmup;
    if (iterations > 0) o.iterations = iterations;
    if (pin_bytes > 0) o.pin_bytes = pin_bytes;
    const ferry::probe::result r = ferry::probe::run(d, o);
    // The probe's one shape (what `ferry probe --json` prints, less its run stamp) and the CLI's table.
    nlohmann::json j = nlohmann::json::parse(ferry::probe::to_json(r));
    j["table"] = ferry::probe::format_table(r);
    *out = dup_string(j.dump());
  });
}

int ferry_analyze_file(const char* path, const char* step_prefix, double idle_threshold, double link_h2d_gbps,
                       double link_d2h_gbps, ferry_analysis** out) {
  return guard([&] {
    expect_out(out, "ferry_analyze_file");
    FERRY_EXPECTS(path != nullptr, "ferry_analyze_file: the path is NULL");
    FERRY_EXPECTS(idle_threshold >= 0 && idle_threshold <= 1,
                  fmt::format("analyze: idle_threshold {} is outside [0, 1]", idle_threshold));
    auto a = std::make_unique<ferry_analysis>();
    a->timeline = ferry::trace::read_trace(path);
    ferry::trace::analyze_options o;
    if (step_prefix != nullptr) o.step_prefix = step_prefix;
    o.idle_threshold = idle_threshold;
    o.link_h2d_gbps = link_h2d_gbps;
    o.link_d2h_gbps = link_d2h_gbps;
    a->analysis = ferry::trace::analyze(a->timeline, o);
    a->json = ferry::trace::to_json(a->analysis);
    a->text = ferry::trace::format_text(a->analysis);
    *out = a.release();
  });
}

const char* ferry_analysis_json(ferry_analysis* a) { return a == nullptr ? "" : a->json.c_str(); }

const char* ferry_analysis_text(ferry_analysis* a) { return a == nullptr ? "" : a->text.c_str(); }

int ferry_analysis_write_html(ferry_analysis* a, const char* path) {
  return guard([&] {
    FERRY_EXPECTS(path != nullptr, "ferry_analysis_write_html: the path is NULL");
    const auto& h = checked(a, "ferry_analysis_write_html");
    ferry::trace::write_html_report(h.timeline, h.analysis, path);
  });
}

void ferry_analysis_destroy(ferry_analysis* a) { delete a; }

}  // extern "C"
