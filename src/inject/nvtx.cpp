// NVTX: the library is the process's NVTX tool. At the first NVTX call of each NVTX instance in the
// process (torch's, the `nvtx` package's, ferry's own), NVTX dlopens NVTX_INJECTION64_PATH and calls
// InitializeInjectionNvtx2, which fills NVTX's callback tables with the handlers below. They record
// push/pop and start/end ranges and marks in any domain, and thread names, on the process's recorder:
// in every process, CUDA or not (DataLoader workers, post-processing workers).
//
// NVTX's tool interface is a stable C ABI (nvtx3's nvtxDetail/nvtxTypes.h); the few types and ids the
// handlers need are declared here, so the library builds without the CUDA toolkit's headers.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "ferry/trace/timeline.hpp"
#include "state.hpp"

namespace ferry::inject {
namespace {

// nvtx3/nvtxDetail/nvtxTypes.h and nvToolsExt.h.
using function_pointer = void (*)();
using function_table = function_pointer**;
struct export_table_callbacks {
  std::size_t struct_size;
  int (*get_module_function_table)(int module, function_table* table, unsigned* size);
};
using get_export_table_fn = const void* (*)(std::uint32_t id);
constexpr std::uint32_t etid_callbacks = 1;
constexpr int module_core = 1;
constexpr int module_core2 = 5;
enum core_cbid : unsigned {
  core_mark_ex = 1,
  core_mark_a = 2,
  core_range_start_ex = 4,
  core_range_start_a = 5,
  core_range_end = 7,
  core_range_push_ex = 8,
  core_range_push_a = 9,
  core_range_pop = 11,
  core_name_os_thread_a = 14,
};
enum core2_cbid : unsigned {
  core2_mark_ex = 1,
  core2_range_start_ex = 2,
  core2_range_end = 3,
  core2_range_push_ex = 4,
  core2_range_pop = 5,
  core2_register_string_a = 10,
  core2_domain_create_a = 12,
};
constexpr int message_ascii = 1;
constexpr int message_registered = 3;
struct event_attributes {  // nvtxEventAttributes_v2
  std::uint16_t version;
  std::uint16_t size;
  std::uint32_t category;
  std::int32_t color_type;
  std::uint32_t color;
  std::int32_t payload_type;
  std::int32_t reserved0;
  std::uint64_t payload;
  std::int32_t message_type;
  const void* message;  // const char*, const wchar_t*, or a registered string handle
};
static_assert(sizeof(event_attributes) == 48);

// Domains and registered strings are handles the program keeps for its lifetime, across forks too: each
// is a leaked copy of its text, interned into the recorder of whichever process uses it.
struct named {
  std::string text;
};
using domain_handle = const named*;

std::mutex g_names_mu;
std::unordered_map<std::string, const named*>& names() {
  static auto* m = new std::unordered_map<std::string, const named*>;  // leaked, like the handles
  return *m;
}

const named* keep_name(const char* text) {
  if (text == nullptr) return nullptr;
  const own_call own;
  const std::lock_guard lock(g_names_mu);
  auto& m = names();
  auto it = m.find(text);
  if (it != m.end()) return it->second;
  const named* n = new named{text};
  m.emplace(n->text, n);
  return n;
}

std::string_view message_of(const event_attributes* a) {
  if (a == nullptr || a->message == nullptr) return {};
  if (a->message_type == message_ascii) return static_cast<const char*>(a->message);
  if (a->message_type == message_registered) return static_cast<const named*>(a->message)->text;
  return "(unicode NVTX message)";
}

// Ranges open on this thread (push/pop): a fixed stack, so recording allocates nothing per range.
struct open_range {
  std::int64_t start;
  std::uint32_t name;
  std::uint32_t domain;
  bool trigger = false;  // the range that opened the capture window (--capture-range=nvtx): its pop closes it
};

// The range `ferry trace --capture-range=nvtx --nvtx-capture NAME[@DOMAIN]` captures inside.
bool is_trigger(domain_handle d, std::string_view message) {
  const settings& c = config();
  if (c.nvtx_capture.empty() || message != c.nvtx_capture) return false;
  return c.nvtx_capture_domain.empty() || (d != nullptr && d->text == c.nvtx_capture_domain);
}
constexpr int max_depth = 128;
thread_local open_range t_stack[max_depth];
thread_local int t_depth = 0;  // may exceed max_depth: the ranges above it are not recorded

// Start/end ranges may end on another thread: by id.
std::mutex g_started_mu;
// Replaced (the old one leaked) in a fork child, whose ids would name the parent's strings.
// NOLINTNEXTLINE(cert-err58-cpp): at load, out of memory ends the process
std::unordered_map<std::uint64_t, open_range>* g_started = new std::unordered_map<std::uint64_t, open_range>;
std::unordered_map<std::uint64_t, open_range>& started() { return *g_started; }
std::atomic<std::uint64_t> g_next_id{1};

std::uint32_t domain_id(domain_handle d) { return d != nullptr ? intern(d->text) : 0; }

void emit(std::int64_t start, std::int64_t end, std::uint32_t name, std::uint32_t domain) {
  trace::event e;
  e.kind = trace::activity::range;
  e.start_ns = start;
  e.end_ns = end;
  e.thread = trace::this_thread_id();
  e.name = name;
  e.domain = domain;
  record(e);
}

int push(domain_handle d, std::string_view message) {
  if (in_ferry() || state() == nullptr) return t_depth;
  const bool trigger = is_trigger(d, message);
  if (trigger) set_capture(true);
  const int depth = t_depth++;
  if (depth < max_depth) t_stack[depth] = open_range{now_ns(), intern(message), domain_id(d), trigger};
  return depth;
}

int pop() {
  if (t_depth == 0) return -1;
  const int depth = --t_depth;
  if (depth < max_depth && !in_ferry() && state() != nullptr) {
    const open_range& o = t_stack[depth];
    emit(o.start, now_ns(), o.name, o.domain);
    if (o.trigger) set_capture(false);
  }
  return depth;
}

void mark(domain_handle d, std::string_view message) {
  if (in_ferry() || state() == nullptr) return;
  const std::int64_t t = now_ns();
  emit(t, t, intern(message), domain_id(d));
}

std::uint64_t start(domain_handle d, std::string_view message) {
  if (in_ferry() || state() == nullptr) return 0;
  const std::uint64_t id = g_next_id.fetch_add(1);
  const open_range o{now_ns(), intern(message), domain_id(d)};
  try {
    const own_call own;
    const std::lock_guard lock(g_started_mu);
    started()[id] = o;
  } catch (...) {
    return 0;
  }
  return id;
}

void end(std::uint64_t id) {
  if (id == 0) return;
  open_range o{};
  {
    const own_call own;
    const std::lock_guard lock(g_started_mu);
    auto it = started().find(id);
    if (it == started().end()) return;
    o = it->second;
    started().erase(it);
  }
  if (state() != nullptr) emit(o.start, now_ns(), o.name, o.domain);
}

// The handlers, with NVTX's signatures.
void mark_ex(const event_attributes* a) { mark(nullptr, message_of(a)); }
void mark_a(const char* m) { mark(nullptr, m != nullptr ? m : ""); }
std::uint64_t range_start_ex(const event_attributes* a) { return start(nullptr, message_of(a)); }
std::uint64_t range_start_a(const char* m) { return start(nullptr, m != nullptr ? m : ""); }
void range_end(std::uint64_t id) { end(id); }
int range_push_ex(const event_attributes* a) { return push(nullptr, message_of(a)); }
int range_push_a(const char* m) { return push(nullptr, m != nullptr ? m : ""); }
int range_pop() { return pop(); }
void name_os_thread_a(std::uint32_t tid, const char* name) {
  process_state* s = state();
  if (s == nullptr || name == nullptr) return;
  try {
    const own_call own;
    s->rec.name_thread(tid, name);
  } catch (...) {
  }
}
void domain_mark_ex(domain_handle d, const event_attributes* a) { mark(d, message_of(a)); }
std::uint64_t domain_range_start_ex(domain_handle d, const event_attributes* a) {
  return start(d, message_of(a));
}
void domain_range_end(domain_handle, std::uint64_t id) { end(id); }
int domain_range_push_ex(domain_handle d, const event_attributes* a) { return push(d, message_of(a)); }
int domain_range_pop(domain_handle) { return pop(); }
const named* domain_register_string_a(domain_handle, const char* text) {
  try {
    return keep_name(text);
  } catch (...) {
    return nullptr;
  }
}
domain_handle domain_create_a(const char* name) {
  try {
    return keep_name(name);
  } catch (...) {
    return nullptr;
  }
}

template <class F>
void put(function_table table, unsigned size, unsigned id, F* handler) {
  if (id < size && table[id] != nullptr) *table[id] = reinterpret_cast<function_pointer>(handler);
}

}  // namespace

void nvtx_after_fork() noexcept {
  // The child's one thread: its open ranges hold the parent's string ids, and a lock another thread
  // held at the fork would stay held.
  t_depth = 0;
  new (&g_names_mu) std::mutex;
  new (&g_started_mu) std::mutex;
  g_started = new (std::nothrow) std::unordered_map<std::uint64_t, open_range>;
  if (g_started == nullptr) std::abort();
}

}  // namespace ferry::inject

/// NVTX's entry point into its tool (nvtxInitImpl): fills the CORE and CORE2 tables. Returns 1; 0 (NVTX
/// stays a no-op) when the process does not record or NVTX offers no tables.
FERRY_INJECT_EXPORT int InitializeInjectionNvtx2(ferry::inject::get_export_table_fn get_export_table) {
  using namespace ferry::inject;
  if (!config().active || get_export_table == nullptr) return 0;
  const auto* cb = static_cast<const export_table_callbacks*>(get_export_table(etid_callbacks));
  if (cb == nullptr || cb->get_module_function_table == nullptr) return 0;
  function_table core = nullptr;
  unsigned core_size = 0;
  if (cb->get_module_function_table(module_core, &core, &core_size) == 0 || core == nullptr) return 0;
  put(core, core_size, core_mark_ex, &mark_ex);
  put(core, core_size, core_mark_a, &mark_a);
  put(core, core_size, core_range_start_ex, &range_start_ex);
  put(core, core_size, core_range_start_a, &range_start_a);
  put(core, core_size, core_range_end, &range_end);
  put(core, core_size, core_range_push_ex, &range_push_ex);
  put(core, core_size, core_range_push_a, &range_push_a);
  put(core, core_size, core_range_pop, &range_pop);
  put(core, core_size, core_name_os_thread_a, &name_os_thread_a);
  function_table core2 = nullptr;
  unsigned core2_size = 0;
  if (cb->get_module_function_table(module_core2, &core2, &core2_size) != 0 && core2 != nullptr) {
    put(core2, core2_size, core2_mark_ex, &domain_mark_ex);
    put(core2, core2_size, core2_range_start_ex, &domain_range_start_ex);
    put(core2, core2_size, core2_range_end, &domain_range_end);
    put(core2, core2_size, core2_range_push_ex, &domain_range_push_ex);
    put(core2, core2_size, core2_range_pop, &domain_range_pop);
    put(core2, core2_size, core2_register_string_a, &domain_register_string_a);
    put(core2, core2_size, core2_domain_create_a, &domain_create_a);
  }
  note("nvtx", "ferry records NVTX ranges in this process");
  return 1;
}
