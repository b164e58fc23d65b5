// Per-process trace files: what `ferry trace -- CMD` records. Every process of the recorded program (the
// command, its forked workers, exec'd children, torchrun's ranks) appends its own file to the session
// directory as it runs, so a process killed with SIGKILL loses at most one flush interval, and no
// process ever writes another's file. `ferry analyze DIR` and `ferry trace` merge the files into one
// timeline with a process table.
//
// The file is text, one record per line, fields separated by one space and free text last after a tab
// (with \\, \t, \n and \r escaped):
//
//   ferry-process-trace 1
//   P <pid> <ppid> <start ticks> <monotonic ns> <realtime ns> <exec|fork> <exe>\t<command line>
//   S <id>\t<text>                       a string, before the first line that names its id
//   T <tid>\t<name>                      a thread's name (again when it changes)
//   N <stream>\t<name>                   a stream's name
//   E <kind> <start> <end> <thread> <stream> <device> <correlation> <bytes> <name> <domain> <copy> <src>
//     <dst> <sync> <async>              an event; enums as their numbers in timeline.hpp
//   M <key>\t<value>                     a note: "cupti", "cupti_handover", "nvtx", "clock", ...
//   D <count>                            events lost so far (buffer full, CUPTI's drops)
//   X <monotonic ns> <exit status>       the process exited through exit() or _exit()
//
// A line is complete only with its newline: a file cut in the middle of a line (a process killed while
// writing) reads up to its last complete line.
//
// Host only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "ferry/trace/timeline.hpp"
#include "ferry/trace/trace_io.hpp"

namespace ferry::trace {

/// The first line of every process file.
inline constexpr std::string_view process_file_magic = "ferry-process-trace 1";
/// The name every process file ends with: <pid>-<start ticks>-<image>.ferry-proc.
inline constexpr std::string_view process_file_suffix = ".ferry-proc";

/// Who a process is, as its file's P line says.
struct process_header {
  std::uint64_t pid = 0;
  std::uint64_t ppid = 0;
  std::uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22: with the pid, names one process of a boot
  std::int64_t monotonic_ns = 0;  // CLOCK_MONOTONIC and CLOCK_REALTIME read together when the file opened
  std::int64_t realtime_ns = 0;
  std::string started;  // "exec" (a new program image) or "fork" (a copy of its parent)
  std::string exe;      // /proc/self/exe
  std::string command;  // the command line, arguments separated by spaces
};

/// The fields of /proc/<pid>/stat (or /proc/<pid>/task/<tid>/stat) that ferry trace reads.
struct proc_stat {
  char state = 0;                 // R, S, D, ...
  std::uint64_t ppid = 0;         // field 4
  std::uint64_t cpu_ticks = 0;    // utime + stime, fields 14 and 15, in clock ticks
  std::uint64_t threads = 0;      // field 20
  std::uint64_t start_ticks = 0;  // field 22
};
/// Parses the text of a stat file (the command name in parentheses may hold spaces and parentheses); false
/// when it is not one. Allocates nothing.
[[nodiscard]] bool parse_proc_stat(std::string_view text, proc_stat& out) noexcept;

/// The P line (with the magic line before it) that opens a process file.
[[nodiscard]] std::string format_process_header(const process_header& h);
/// An M line.
[[nodiscard]] std::string format_process_note(std::string_view key, std::string_view value);
/// An X line.
[[nodiscard]] std::string format_process_exit(std::int64_t monotonic_ns, int status);

/// Turns what a process recorded into lines of its file, a batch at a time: each batch is a timeline
/// taken from the process's recorder (recorder::take keeps string ids valid across takes), and only the
/// strings, thread and stream names not written before go out ahead of its events. One per process file.
class process_file_writer {
 public:
  /// Appends the lines of `t` to `out`.
  void append(const timeline& t, std::string& out);

 private:
  std::size_t strings_written_ = 1;  // id 0 is the empty string, never written
  std::map<std::uint64_t, std::string> threads_;
  std::map<std::uint64_t, std::string> streams_;
  std::uint64_t dropped_ = 0;
};

/// A process file read back.
struct process_file {
  process_header header;
  timeline events;  // the file's events with its own string ids; thread and stream names; notes as metadata
  bool exited = false;
  std::int64_t exit_ns = 0;
  int exit_status = 0;
  bool truncated = false;  // the last line had no newline (the process was killed while writing)
};

/// Parses one process file. Input that is not one, or a malformed complete line, throws input_error
/// naming `origin`, the line number and what was expected; a cut last line is ignored (truncated).
[[nodiscard]] process_file parse_process_file(std::string_view text, std::string_view origin,
                                              const read_limits& limits = {});

/// True when `dir` is a directory holding at least one process file.
[[nodiscard]] bool is_process_trace_dir(const std::filesystem::path& dir);

/// Reads every process file in `dir` into one timeline: timeline::processes lists each process (the
/// successive program images of one pid are one process), CPU events keep their OS thread ids,
/// GPU streams and correlation ids are made unique per process, and launcher.ferry-proc's samples (the
/// launcher's /proc sampler) become timeline::cpu_samples. A pid reused by a later process is told apart
/// by its start time. Throws input_error naming the file when one cannot be read or parsed, and when the
/// directory holds none.
[[nodiscard]] timeline read_process_traces(const std::filesystem::path& dir, const read_limits& limits = {});

}  // namespace ferry::trace
