#include "ferry/trace/timeline.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/fork.hpp"

namespace ferry::trace {

namespace {

constexpr std::array activity_names{"kernel", "memcpy", "memset", "sync", "api", "range", "stage"};
constexpr std::array copy_names{"none", "h2d", "d2h", "d2d", "h2h", "p2p"};
constexpr std::array mem_names{"unknown", "pageable", "pinned", "device", "managed"};
constexpr std::array sync_names{"none", "event", "stream", "device", "stream_wait", "copy"};

template <class Enum, std::size_t N>
Enum parse_word(std::string_view text, const std::array<const char*, N>& words, std::string_view what) {
  for (std::size_t i = 0; i < N; ++i)
    if (text == words[i]) return static_cast<Enum>(i);
  std::string accepted;
  for (std::size_t i = 0; i < N; ++i) accepted += fmt::format("{}{}", i == 0 ? "" : ", ", words[i]);
  throw input_error(fmt::format("unknown {} \"{}\": expected one of {}", what, text, accepted));
}

std::atomic<recorder*> g_current{nullptr};
std::atomic<std::uint64_t> g_recorders{0};

}  // namespace

std::string_view to_string(activity a) noexcept { return activity_names.at(static_cast<std::size_t>(a)); }
std::string_view to_string(copy_kind k) noexcept { return copy_names.at(static_cast<std::size_t>(k)); }
std::string_view to_string(mem_kind k) noexcept { return mem_names.at(static_cast<std::size_t>(k)); }
std::string_view to_string(sync_kind k) noexcept { return sync_names.at(static_cast<std::size_t>(k)); }
activity parse_activity(std::string_view text) {
  return parse_word<activity>(text, activity_names, "activity");
}
copy_kind parse_copy_kind(std::string_view text) {
  return parse_word<copy_kind>(text, copy_names, "copy kind");
}
mem_kind parse_mem_kind(std::string_view text) {
  return parse_word<mem_kind>(text, mem_names, "memory kind");
}
sync_kind parse_sync_kind(std::string_view text) {
  return parse_word<sync_kind>(text, sync_names, "sync kind");
}

string_table::string_table() {
  strings_.emplace_back();
  ids_.emplace(strings_.back(), 0);
}

string_table::string_table(const string_table& other) : strings_(other.strings_) {
  ids_.reserve(strings_.size());
  for (std::size_t i = 0; i < strings_.size(); ++i) ids_.emplace(strings_[i], static_cast<std::uint32_t>(i));
}

string_table& string_table::operator=(const string_table& other) {
  if (this != &other) *this = string_table(other);
  return *this;
}

std::uint32_t string_table::intern(std::string_view text) {
  if (auto it = ids_.find(text); it != ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(strings_.size());
  strings_.emplace_back(text);
  ids_.emplace(strings_.back(), id);
  return id;
}

std::string_view string_table::operator[](std::uint32_t id) const {
  FERRY_EXPECTS(id < strings_.size(),
                fmt::format("string id {} is out of range: the table holds {} strings", id, strings_.size()));
  return strings_[id];
}

void timeline::sort() {
  // Equivalent to a stable sort by start, without stable_sort's buffer of as many events: sort (start,
  // position) keys, then move each event to its place along the permutation's cycles.
  const auto by_start = [](const event& a, const event& b) { return a.start_ns < b.start_ns; };
  if (std::is_sorted(events.begin(), events.end(), by_start)) return;
  struct key {
    std::int64_t start;
    std::size_t from;
  };
  std::vector<key> keys(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) keys[i] = {events[i].start_ns, i};
  std::sort(keys.begin(), keys.end(), [](const key& a, const key& b) {
    return a.start != b.start ? a.start < b.start : a.from < b.from;
  });
  constexpr std::size_t done = ~std::size_t{0};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].from == done) continue;
    // Position i takes the event at keys[i].from, which takes the one at its keys[].from, ... back to i.
    const event first = events[i];
    std::size_t at = i;
    while (true) {
      const std::size_t from = keys[at].from;
      keys[at].from = done;
      if (from == i) {
        events[at] = first;
        break;
      }
      events[at] = events[from];
      at = from;
    }
  }
}

std::uint64_t this_thread_id() noexcept {
  // A fork child's one thread has a new id but the forking thread's thread_locals.
  thread_local std::uint64_t id = 0;
  thread_local std::uint64_t generation = 0;
  const std::uint64_t now = fork_generation();
  if (id == 0 || generation != now) {
    id = static_cast<std::uint64_t>(::syscall(SYS_gettid));
    generation = now;
  }
  return id;
}

void name_this_thread(std::string_view name) noexcept {
  char buf[16] = {};
  name.copy(buf, sizeof buf - 1);
  static_cast<void>(::pthread_setname_np(::pthread_self(), buf));
}

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

recorder::recorder(std::size_t capacity) : capacity_(capacity), serial_(++g_recorders) {
  FERRY_EXPECTS(capacity >= 1 && capacity <= (std::size_t{1} << 26),
                fmt::format("recorder capacity {} events: expected 1 to {}", capacity, std::size_t{1} << 26));
  events_.reserve(capacity);
  ferry_domain_ = meta_.strings.intern("ferry");
}

void recorder::start() noexcept {
  std::lock_guard lock(mu_);
  capturing_ = true;
}

void recorder::stop() noexcept {
  std::lock_guard lock(mu_);
  capturing_ = false;
}

bool recorder::capturing() const noexcept {
  std::lock_guard lock(mu_);
  return capturing_;
}

void recorder::keep(const event& e) noexcept {
  if (events_.size() < capacity_)
    events_.push_back(e);  // reserved: never reallocates
  else
    ++dropped_;
}

void recorder::record(const event& e) noexcept {
  std::lock_guard lock(mu_);
  if (capturing_) keep(e);
}

void recorder::record_late(const event& e) noexcept {
  std::lock_guard lock(mu_);
  keep(e);
}

void recorder::count_dropped(std::uint64_t n) noexcept {
  std::lock_guard lock(mu_);
  dropped_ += n;
}

std::uint32_t recorder::intern(std::string_view text) {
  std::lock_guard lock(mu_);
  return meta_.strings.intern(text);
}

void recorder::name_thread(std::uint64_t thread, std::string name) {
  std::lock_guard lock(mu_);
  meta_.thread_names[thread] = std::move(name);
}

void recorder::name_stream(std::uint64_t stream, std::string name) {
  std::lock_guard lock(mu_);
  meta_.stream_names[stream] = std::move(name);
}

void recorder::set_metadata(std::string key, std::string value) {
  std::lock_guard lock(mu_);
  meta_.metadata[std::move(key)] = std::move(value);
}

std::size_t recorder::size() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

std::uint64_t recorder::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

timeline recorder::take(std::string source, std::string device_name) {
  timeline t;
  {
    std::lock_guard lock(mu_);
    t.strings = meta_.strings;  // ids stay valid for events recorded later
    t.thread_names = meta_.thread_names;
    t.stream_names = meta_.stream_names;
    t.metadata = meta_.metadata;
    t.events.assign(events_.begin(), events_.end());
    t.dropped = dropped_;
    events_.clear();
    dropped_ = 0;
  }
  t.source = std::move(source);
  t.device_name = std::move(device_name);
  // Threads nobody named keep their OS name (pthread_setname_np), while they still run.
  for (const event& e : t.events) {
    if (e.thread == 0 || t.thread_names.contains(e.thread)) continue;
    std::ifstream comm(fmt::format("/proc/self/task/{}/comm", e.thread));
    std::string name;
    if (comm && std::getline(comm, name) && !name.empty()) t.thread_names[e.thread] = name;
  }
  t.sort();
  return t;
}

recorder* current_recorder() noexcept { return g_current.load(std::memory_order_acquire); }

recording_scope::recording_scope(recorder& r) noexcept
    : previous_(g_current.exchange(&r, std::memory_order_acq_rel)) {}

recording_scope::~recording_scope() { g_current.store(previous_, std::memory_order_release); }

void record_stage(const char* name, std::int64_t start_ns) noexcept {
  recorder* r = current_recorder();
  if (r == nullptr) return;  // record() drops the span when the recorder is not capturing: one lock, not two
  // Stage names are string literals: cache each pointer's id per thread, so a span interns only once.
  thread_local std::vector<std::pair<const char*, std::uint32_t>> cache;
  thread_local std::uint64_t cache_owner = 0;
  if (cache_owner != r->serial()) {
    cache.clear();
    cache_owner = r->serial();
  }
  std::uint32_t id = 0;
  auto it = std::find_if(cache.begin(), cache.end(), [name](const auto& p) { return p.first == name; });
  try {
    if (it != cache.end()) {
      id = it->second;
    } else {
      id = r->intern(name);
      cache.emplace_back(name, id);
    }
  } catch (...) {
    return;  // out of memory while interning: the span is not recorded
  }
  event e;
  e.kind = activity::stage;
  e.start_ns = start_ns;
  e.end_ns = now_ns();
  e.name = id;
  e.domain = r->ferry_domain();
  e.thread = this_thread_id();
  r->record(e);
}

}  // namespace ferry::trace
