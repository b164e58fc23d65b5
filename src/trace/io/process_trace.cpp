// Per-process trace files (process_trace.hpp): the lines `ferry trace`'s injection library appends, their
// parser, and the merge of a session directory into one timeline with a process table.
#include "ferry/trace/process_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"

namespace ferry::trace {

namespace {

void append_escaped(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      default: out += c;
    }
  }
}

std::string unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    switch (s[++i]) {
      case 't': out += '\t'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      default: out += s[i];
    }
  }
  return out;
}

// Reads the lines of one file; every failure names the file and the line.
class line_parser {
 public:
  line_parser(std::string_view origin, std::size_t line) : origin_(origin), line_(line) {}

  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw input_error(fmt::format("{} line {}: {}", escape_control(origin_), line_,
                                  fmt::format(f, std::forward<Args>(args)...)));
  }

  // The fields before the tab (split on spaces) and the text after it.
  void split(std::string_view line) {
    fields_.clear();
    const std::size_t tab = line.find('\t');
    text_ = tab == std::string_view::npos ? std::string_view{} : line.substr(tab + 1);
    has_text_ = tab != std::string_view::npos;
    std::string_view head = line.substr(0, tab);
    while (!head.empty()) {
      const std::size_t sp = head.find(' ');
      fields_.push_back(head.substr(0, sp));
      if (sp == std::string_view::npos) break;
      head.remove_prefix(sp + 1);
    }
  }
  void expect_fields(std::size_t n, std::string_view form) const {
    if (fields_.size() != n) fail("expected {}, got {} fields", form, fields_.size());
  }
  void expect_text(std::string_view form) const {
    if (!has_text_) fail("expected {} (a tab before the text)", form);
  }
  template <class T>
  T number(std::size_t i, std::string_view what) const {
    T v{};
    const std::string_view f = fields_.at(i);
    const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec != std::errc{} || p != f.data() + f.size())
      fail("{} \"{}\" is not a number of its range", what, escape_control(f));
    return v;
  }
  template <class E>
  E word(std::size_t i, std::string_view what, E last) const {
    const auto v = number<unsigned>(i, what);
    if (v > static_cast<unsigned>(last))
      fail("{} {} is out of range (0..{})", what, v, static_cast<unsigned>(last));
    return static_cast<E>(v);
  }
  [[nodiscard]] std::string_view field(std::size_t i) const { return fields_.at(i); }
  [[nodiscard]] std::string text() const { return unescape(text_); }

 private:
  std::string_view origin_;
  std::size_t line_;
  std::vector<std::string_view> fields_;
  std::string_view text_;
  bool has_text_ = false;
};

struct file_ref {
  std::filesystem::path path;
  std::uint64_t pid = 0;
  std::uint64_t start_ticks = 0;
  unsigned image = 0;
};

// <pid>-<start ticks>-<image>.ferry-proc; false for any other name.
bool parse_file_name(const std::filesystem::path& p, file_ref& out) {
  const std::string name = p.filename().string();
  if (!name.ends_with(process_file_suffix)) return false;
  const std::string_view stem(name.data(), name.size() - process_file_suffix.size());
  std::uint64_t vals[3] = {};
  std::size_t pos = 0;
  for (int k = 0; k < 3; ++k) {
    const std::size_t end = k < 2 ? stem.find('-', pos) : stem.size();
    if (end == std::string_view::npos) return false;
    const auto [q, ec] = std::from_chars(stem.data() + pos, stem.data() + end, vals[k]);
    if (ec != std::errc{} || q != stem.data() + end) return false;
    pos = end + 1;
  }
  out.path = p;
  out.pid = vals[0];
  out.start_ticks = vals[1];
  out.image = static_cast<unsigned>(vals[2]);
  return true;
}

std::string read_file(const std::filesystem::path& p, std::uint64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(p, ec);
  if (ec) throw input_error(fmt::format("{}: cannot read it: {}", escape_control(p.string()), ec.message()));
  if (size > max_bytes)
    throw input_error(fmt::format("{}: {} bytes is over the limit of {} bytes", escape_control(p.string()),
                                  size, max_bytes));
  std::ifstream in(p, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: cannot open it", escape_control(p.string())));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A short name for the viewers: the program and its first argument ("python3 train.py").
std::string short_name(const std::string& command, const std::string& exe) {
  std::vector<std::string_view> words;
  std::string_view rest = command;
  while (!rest.empty() && words.size() < 2) {
    const std::size_t sp = rest.find(' ');
    if (sp != 0) words.push_back(rest.substr(0, sp));
    if (sp == std::string_view::npos) break;
    rest.remove_prefix(sp + 1);
  }
  if (words.empty()) return exe.empty() ? "process" : std::filesystem::path(exe).filename().string();
  std::string out = std::filesystem::path(std::string(words[0])).filename().string();
  if (words.size() > 1 && !words[1].starts_with('-'))
    out += " " + std::filesystem::path(std::string(words[1])).filename().string();
  return out;
}

}  // namespace

bool parse_proc_stat(std::string_view text, proc_stat& out) noexcept {
  const std::size_t paren = text.rfind(')');
  if (paren == std::string_view::npos || paren + 2 >= text.size()) return false;
  text.remove_prefix(paren + 2);  // field 3, the state, on
  out.state = text.front();
  std::int64_t v[20] = {};  // fields 4 to 22; some are signed (tpgid is -1 without a terminal)
  std::size_t at = 1;
  for (std::int64_t& field : v) {
    while (at < text.size() && text[at] == ' ') ++at;
    const auto [p, ec] = std::from_chars(text.data() + at, text.data() + text.size(), field);
    if (ec != std::errc{}) return false;
    at = static_cast<std::size_t>(p - text.data());
  }
  const auto u = [](std::int64_t x) { return x > 0 ? static_cast<std::uint64_t>(x) : 0; };
  out.ppid = u(v[0]);
  out.cpu_ticks = u(v[10]) + u(v[11]);
  out.threads = u(v[16]);
  out.start_ticks = u(v[18]);
  return true;
}

std::string format_process_header(const process_header& h) {
  std::string out(process_file_magic);
  fmt::format_to(std::back_inserter(out), "\nP {} {} {} {} {} {} ", h.pid, h.ppid, h.start_ticks,
                 h.monotonic_ns, h.realtime_ns, h.started == "fork" ? "fork" : "exec");
  // The exe path is a field, which a space would split: spaces in it are written as '_'.
  std::string exe;
  for (const char c : h.exe) exe += c == ' ' ? '_' : c;
  append_escaped(out, exe.empty() ? "?" : exe);
  out += '\t';
  append_escaped(out, h.command);
  out += '\n';
  return out;
}

std::string format_process_note(std::string_view key, std::string_view value) {
  std::string out = "M ";
  for (const char c : key) out += c == ' ' || c == '\t' || c == '\n' ? '_' : c;
  out += '\t';
  append_escaped(out, value);
  out += '\n';
  return out;
}

std::string format_process_exit(std::int64_t monotonic_ns, int status) {
  return fmt::format("X {} {}\n", monotonic_ns, status);
}

void process_file_writer::append(const timeline& t, std::string& out) {
  auto it = std::back_inserter(out);
  for (; strings_written_ < t.strings.size(); ++strings_written_) {
    fmt::format_to(it, "S {}\t", strings_written_);
    append_escaped(out, t.strings[static_cast<std::uint32_t>(strings_written_)]);
    out += '\n';
  }
  for (const auto& [tid, name] : t.thread_names) {
    auto [w, inserted] = threads_.try_emplace(tid, name);
    if (!inserted && w->second == name) continue;
    w->second = name;
    fmt::format_to(it, "T {}\t", tid);
    append_escaped(out, name);
    out += '\n';
  }
  for (const auto& [stream, name] : t.stream_names) {
    auto [w, inserted] = streams_.try_emplace(stream, name);
    if (!inserted && w->second == name) continue;
    w->second = name;
    fmt::format_to(it, "N {}\t", stream);
    append_escaped(out, name);
    out += '\n';
  }
  for (const event& e : t.events) {
    fmt::format_to(it, "E {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n", static_cast<unsigned>(e.kind),
                   e.start_ns, e.end_ns, e.thread, e.stream, e.device, e.correlation, e.bytes, e.name,
                   e.domain, static_cast<unsigned>(e.copy), static_cast<unsigned>(e.src),
                   static_cast<unsigned>(e.dst), static_cast<unsigned>(e.sync), e.async ? 1 : 0);
  }
  if (t.dropped != 0) {
    dropped_ += t.dropped;
    fmt::format_to(it, "D {}\n", dropped_);
  }
}

process_file parse_process_file(std::string_view text, std::string_view origin, const read_limits& limits) {
  process_file out;
  timeline& t = out.events;
  // File string ids -> ids of t.strings (the same, unless a file repeats or skips ids).
  std::unordered_map<std::uint32_t, std::uint32_t> ids;  // a map: a file's ids need not be dense
  std::size_t line_no = 0;
  bool header = false;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      out.truncated = true;  // cut while the process wrote it
      break;
    }
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    line_parser p(origin, line_no);
    if (line_no == 1) {
      if (line != process_file_magic)
        p.fail("not a ferry process trace: expected \"{}\" as the first line", process_file_magic);
      continue;
    }
    if (line.size() < 2 || line[1] != ' ') p.fail("expected a record (P, S, T, N, E, M, D or X and a space)");
    p.split(line.substr(2));
    const char kind = line[0];
    if (kind != 'P' && !header) p.fail("expected the P line first");
    switch (kind) {
      case 'P': {
        if (header) p.fail("a second P line");
        p.expect_fields(7, "P pid ppid start_ticks monotonic_ns realtime_ns exec|fork exe");
        p.expect_text("the command line");
        process_header& h = out.header;
        h.pid = p.number<std::uint64_t>(0, "pid");
        h.ppid = p.number<std::uint64_t>(1, "ppid");
        h.start_ticks = p.number<std::uint64_t>(2, "start ticks");
        h.monotonic_ns = p.number<std::int64_t>(3, "monotonic ns");
        h.realtime_ns = p.number<std::int64_t>(4, "realtime ns");
        if (p.field(5) != "exec" && p.field(5) != "fork")
          p.fail("expected exec or fork, got \"{}\"", escape_control(p.field(5)));
        h.started = std::string(p.field(5));
        h.exe = unescape(p.field(6));
        h.command = p.text();
        header = true;
        break;
      }
      case 'S': {
        p.expect_fields(1, "S id");
        p.expect_text("the string");
        const auto id = p.number<std::uint32_t>(0, "string id");
        if (id == 0 || id > (1u << 26)) p.fail("string id {} is out of range (1..{})", id, 1u << 26);
        ids[id] = t.strings.intern(p.text());
        break;
      }
      case 'T':
      case 'N': {
        p.expect_fields(1, kind == 'T' ? "T tid" : "N stream");
        p.expect_text("the name");
        (kind == 'T' ? t.thread_names : t.stream_names)[p.number<std::uint64_t>(0, "id")] = p.text();
        break;
      }
      case 'E': {
        p.expect_fields(15, "E and 15 fields");
        if (t.events.size() >= limits.max_events)
          p.fail("more than {} events (the limit)", limits.max_events);
        event e;
        e.kind = p.word(0, "kind", activity::stage);
        e.start_ns = p.number<std::int64_t>(1, "start");
        e.end_ns = p.number<std::int64_t>(2, "end");
        if (e.end_ns < e.start_ns) p.fail("end {} is before start {}", e.end_ns, e.start_ns);
        e.thread = p.number<std::uint64_t>(3, "thread");
        e.stream = p.number<std::uint64_t>(4, "stream");
        e.device = p.number<std::int32_t>(5, "device");
        if (e.device < -1 || e.device > 1023) p.fail("device {} is out of range (-1..1023)", e.device);
        e.correlation = p.number<std::uint64_t>(6, "correlation");
        e.bytes = p.number<std::uint64_t>(7, "bytes");
        for (int k = 0; k < 2; ++k) {
          const auto id =
              p.number<std::uint32_t>(8 + static_cast<std::size_t>(k), k == 0 ? "name" : "domain");
          const auto found = ids.find(id);
          if (id != 0 && found == ids.end()) p.fail("string id {} was not defined before", id);
          (k == 0 ? e.name : e.domain) = id == 0 ? 0 : found->second;
        }
        e.copy = p.word(10, "copy kind", copy_kind::p2p);
        e.src = p.word(11, "memory kind", mem_kind::managed);
        e.dst = p.word(12, "memory kind", mem_kind::managed);
        e.sync = p.word(13, "sync kind", sync_kind::copy);
        e.async = p.word(14, "async", 1u) != 0;
        t.events.push_back(e);
        break;
      }
      case 'M': {
        p.expect_fields(1, "M key");
        p.expect_text("the value");
        t.metadata[std::string(p.field(0))] = p.text();
        break;
      }
      case 'D':
        p.expect_fields(1, "D count");
        t.dropped = p.number<std::uint64_t>(0, "dropped");
        break;
      case 'X':
        p.expect_fields(2, "X monotonic_ns status");
        out.exited = true;
        out.exit_ns = p.number<std::int64_t>(0, "exit time");
        out.exit_status = p.number<int>(1, "exit status");
        break;
      default: p.fail("unknown record \"{}\"", escape_control(line.substr(0, 1)));
    }
  }
  if (!header) line_parser(origin, line_no).fail("no P line: not a complete process trace");
  return out;
}

bool is_process_trace_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    file_ref r;
    if (parse_file_name(entry.path(), r)) return true;
  }
  return false;
}

timeline read_process_traces(const std::filesystem::path& dir, const read_limits& limits) {
  std::vector<file_ref> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    file_ref r;
    if (parse_file_name(entry.path(), r)) files.push_back(std::move(r));
  }
  if (ec)
    throw input_error(fmt::format("{}: cannot list it: {}", escape_control(dir.string()), ec.message()));
  if (files.empty())
    throw input_error(
        fmt::format("{}: no process traces (<pid>-<start>-<image>{}) in it; record one with "
                    "`ferry trace -o {} -- CMD`",
                    escape_control(dir.string()), process_file_suffix, escape_control(dir.string())));
  // By process (pid, start), then image: the images of one process in the order they ran.
  std::sort(files.begin(), files.end(), [](const file_ref& a, const file_ref& b) {
    return std::tie(a.start_ticks, a.pid, a.image) < std::tie(b.start_ticks, b.pid, b.image);
  });

  timeline t;
  t.source = "ferry trace";
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> keys;  // (pid, start) -> process key
  std::set<std::uint64_t> used;
  std::map<std::uint64_t, std::uint64_t> ppid_of;  // key -> parent pid (resolved to a key below)
  std::uint64_t ordinal = 0;                       // renumbers streams and correlations per process
  std::uint64_t total = 0;
  constexpr std::uint64_t reuse_step = std::uint64_t{1} << 22;  // above Linux's largest pid_max
  for (const file_ref& f : files) {
    process_file pf;
    try {
      pf = parse_process_file(read_file(f.path, limits.max_bytes), f.path.string(), limits);
    } catch (const input_error& e) {
      // One unreadable file (a disk that filled, a bug) leaves the others readable: it is named instead.
      t.skipped[e.what()] += 1;
      continue;
    }
    total += pf.events.events.size();
    if (total > limits.max_events)
      throw input_error(fmt::format("{}: more than {} events in the session (the limit)",
                                    escape_control(dir.string()), limits.max_events));
    auto [kit, is_new] = keys.try_emplace({f.pid, f.start_ticks}, 0);
    if (is_new) {
      // A pid, or a thread id, that an earlier process of the session had: this process's ids move up by
      // a multiple of 2^22 until none is taken.
      std::vector<std::uint64_t> tids{f.pid};
      for (const auto& [tid, name] : pf.events.thread_names) tids.push_back(tid);
      for (const event& e : pf.events.events)
        if (e.thread != 0) tids.push_back(e.thread);
      const auto taken = [&](std::uint64_t k) {
        if (used.contains(k)) return true;
        return std::any_of(tids.begin(), tids.end(),
                           [&](std::uint64_t tid) { return t.thread_processes.contains(tid + (k - f.pid)); });
      };
      std::uint64_t key = f.pid;
      while (taken(key)) key += reuse_step;
      used.insert(key);
      kit->second = key;
    }
    const std::uint64_t key = kit->second;
    const std::uint64_t tid_offset = key - f.pid;
    ++ordinal;
    process_info& p = t.processes[key];
    if (is_new) {
      p.pid = f.pid;
      p.start_ns = pf.header.monotonic_ns;
      p.started = pf.header.started;
      ppid_of[key] = pf.header.ppid;
    }
    // A later image (exec) names the process.
    p.command = pf.header.command;
    p.name = short_name(pf.header.command, pf.header.exe);
    for (const auto& [k, v] : pf.events.metadata) p.notes[k] = v;
    p.end_ns = std::max(p.end_ns, pf.header.monotonic_ns);
    if (pf.exited) {
      p.ended = pf.exit_status >= 0 ? fmt::format("exit {}", pf.exit_status) : "exit (status not seen)";
      p.end_ns = std::max(p.end_ns, pf.exit_ns);
    } else {
      p.ended = pf.truncated ? "no exit record (killed while writing)" : "no exit record (killed?)";
    }
    t.dropped += pf.events.dropped;
    t.thread_processes[f.pid + tid_offset] = key;
    for (const auto& [tid, name] : pf.events.thread_names) {
      t.thread_names[tid + tid_offset] = name;
      t.thread_processes[tid + tid_offset] = key;
    }
    const std::uint64_t gpu_base = ordinal << 32;
    for (const auto& [stream, name] : pf.events.stream_names) t.stream_names[gpu_base | stream] = name;
    for (event e : pf.events.events) {
      e.name = e.name != 0 ? t.strings.intern(pf.events.strings[e.name]) : 0;
      e.domain = e.domain != 0 ? t.strings.intern(pf.events.strings[e.domain]) : 0;
      if (e.correlation != 0) e.correlation |= gpu_base;
      if (e.on_gpu() || e.kind == activity::sync) {
        const std::uint64_t own = e.stream & 0xffffffffu;
        e.stream = gpu_base | own;
        if (e.on_gpu()) {
          p.gpu = true;
          t.stream_processes[e.stream] = key;
          t.stream_names.try_emplace(e.stream, fmt::format("stream {}", own));  // its id in its process
        }
      }
      if (e.thread != 0) {
        e.thread += tid_offset;
        t.thread_processes.try_emplace(e.thread, key);
      }
      p.end_ns = std::max(p.end_ns, e.end_ns);
      t.events.push_back(e);
    }
  }
  // Parents: the key of the recorded process with the parent's pid that started before the child.
  for (auto& [key, p] : t.processes) {
    const std::uint64_t ppid = ppid_of[key];
    std::uint64_t best = 0;
    std::int64_t best_start = 0;
    for (const auto& [k2, q] : t.processes) {
      if (q.pid == ppid && q.start_ns <= p.start_ns && (best == 0 || q.start_ns > best_start)) {
        best = k2;
        best_start = q.start_ns;
      }
    }
    p.parent = best;
  }
  // A forked Python child whose ranges say which DataLoader worker it was is named after it.
  for (const event& e : t.events) {
    if (e.kind != activity::range) continue;
    const std::string_view name = t.name_of(e);
    const std::size_t at = name.find("(worker ");
    if (!name.starts_with("DataLoader fetch") || at == std::string_view::npos) continue;
    const auto pit = t.thread_processes.find(e.thread);
    if (pit == t.thread_processes.end()) continue;
    process_info& p = t.processes[pit->second];
    if (p.started != "fork" || p.name.starts_with("DataLoader worker")) continue;
    std::string_view n = name.substr(at + 8);
    n = n.substr(0, n.find(')'));
    p.name = fmt::format("DataLoader worker {}", n);
  }
  // The launcher's /proc samples.
  const std::filesystem::path samples = dir / "samples.ferry-cpu";
  if (std::filesystem::exists(samples, ec)) {
    const std::string text = read_file(samples, limits.max_bytes);
    std::string_view rest = text;
    std::size_t line_no = 0;
    while (!rest.empty()) {
      const std::size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) break;
      const std::string_view line = rest.substr(0, nl);
      rest.remove_prefix(nl + 1);
      line_parser p(samples.string(), ++line_no);
      if (line_no == 1) {
        if (line != "ferry-cpu-samples 1") p.fail("expected \"ferry-cpu-samples 1\" as the first line");
        continue;
      }
      if (line.starts_with("L ")) {  // the launcher's own CPU use, in thousandths of a core
        p.split(line.substr(2));
        p.expect_fields(1, "L millicores");
        t.metadata["launcher_cpu_cores"] =
            fmt::format("{:.3f}", p.number<std::uint32_t>(0, "millicores") / 1000.0);
        continue;
      }
      if (!line.starts_with("C ")) p.fail("expected a C or L record");
      p.split(line.substr(2));
      p.expect_fields(6, "C t_ns pid start_ticks millicores running threads");
      cpu_sample s;
      s.t_ns = p.number<std::int64_t>(0, "time");
      const auto k =
          keys.find({p.number<std::uint64_t>(1, "pid"), p.number<std::uint64_t>(2, "start ticks")});
      if (k == keys.end()) continue;  // a process that wrote no file (not injected: a static binary)
      s.process = k->second;
      s.cores = static_cast<float>(p.number<std::uint32_t>(3, "millicores")) / 1000.0f;
      s.running = p.number<std::uint32_t>(4, "running");
      s.threads = p.number<std::uint32_t>(5, "threads");
      t.cpu_samples.push_back(s);
      if (t.cpu_samples.size() > limits.max_events)
        p.fail("more than {} samples (the limit)", limits.max_events);
    }
  }
  t.metadata["processes"] = std::to_string(t.processes.size());
  t.sort();
  return t;
}

}  // namespace ferry::trace
