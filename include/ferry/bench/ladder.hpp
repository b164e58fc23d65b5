// The harness every `ferry bench` ladder shares. A ladder is a table of levels (what each does, what
// bounds it, the analyzer's expected finding, and the function that runs it) measured against "ideal",
// the same compute with no transfer. The harness checks the settings, probes the link, times each level's
// steps, computes GPU idle, bandwidth and the ratio to ideal, keeps each level's trace, and writes the one
// row shape every ladder reports, as a text table and as JSON stamped with date, device, command and
// ferry's version. A ladder brings its workload and its levels' GPU work, nothing else.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/bench/bench_trace.hpp"
#include "ferry/core/progress.hpp"
#include "ferry/device/device.hpp"

namespace ferry::bench {

using ferry::progress_fn;  // progress lines, for stderr (ferry/core/progress.hpp)

/// The level every ladder is measured against: the same compute steps with no transfer.
inline constexpr std::string_view ideal_level = "ideal";

/// Settings every ladder shares; each ladder's config adds its workload's shape and pipeline sizes.
struct ladder_options {
  std::chrono::nanoseconds compute{};  // per step: the reference workload's rate
  int warmup = 2;                      // untimed steps per level
  int steps = 10;                      // timed steps per level
  std::size_t workers = 8;             // host threads of the levels that have them
  bool check = true;                   // verify what arrived
  std::vector<std::string> levels;     // run in this order; by default every level of the ladder
  double probed_gbps = 0;              // the pinned link of the ladder's direction; 0: measure it first
  trace_options trace;                 // record and analyze each level's timed steps
  /// When set (by a Ctrl-C handler, say), the ladder runs no further level: the level under way
  /// finishes and the result holds the levels that finished, with `interrupted` set. Null: never.
  const std::atomic<bool>* stop = nullptr;
  /// Called as each step's compute is queued with the steps begun so far and the run's total (every
  /// level's warm-up and timed steps), from the thread that runs the step: a status line's count and
  /// time left. A level whose host does not wait for its steps (ideal) queues them all at once. Empty:
  /// never.
  std::function<void(std::uint64_t begun, std::uint64_t total)> on_step;
  /// The options the emulated device was made with, when the ladder runs on one (ladder_host_options):
  /// the table and the JSON show the link it models beside the probed one, and how it is scaled.
  std::optional<host_device_options> emulator;

  ladder_options() = default;
  /// A ladder's defaults: the reference workload's compute per step, and every level of the ladder.
  ladder_options(std::chrono::nanoseconds compute_per_step, std::vector<std::string> all_levels)
      : compute(compute_per_step), levels(std::move(all_levels)) {}
};

/// A figure only some ladders report (CPU ms per step, pinning seconds, worker threads), by name.
struct ladder_extra {
  std::string name;
  double value = 0;
  bool count = false;  // a whole number: JSON writes it as one
};

/// One row of a ladder: the same fields for every ladder.
struct ladder_row {
  std::string level;
  int steps = 0;       // timed steps
  double seconds = 0;  // wall time of the timed steps, until what they moved was checked
  double steps_per_s = 0;
  double ratio_to_ideal = 0;  // steps_per_s / ideal's (0 when ideal was not run)
  copy_direction direction = copy_direction::host_to_device;  // of the bytes the ladder moves
  std::uint64_t bytes = 0;                                    // moved in the timed steps (0 for ideal)
  double gbps = 0;                                            // gb_per_s(bytes, seconds)
  double link_fraction = 0;                                   // gbps / the probed pinned link of `direction`
  double gpu_idle = 0;                                        // 1 - compute-stream busy time / wall time
  std::uint64_t checked = 0;  // what was verified, in the ladder's unit (ladder_spec::checked_unit)
  std::uint64_t wrong = 0;    // of those, how many held a wrong byte
  std::string bottleneck;     // with tracing: the analyzer's first finding (its rule id)
  std::string finding;        // and its title
  std::vector<ladder_extra> extras;

  /// Sets (or adds) the extra figure `name`.
  void set_extra(std::string_view name, double value, bool count = false);
  /// The extra figure `name`; 0 when the level did not set it.
  [[nodiscard]] double extra(std::string_view name) const noexcept;
};

/// A row of a ladder's table of levels: what the level is, and the function that runs its steps.
template <class Run>
struct ladder_level {
  level_info info;
  Run run;
};

/// What a level's run function works with: the device, the ladder's config, its workload for the level
/// and the row to fill.
template <class Config, class Workload>
struct level_context {
  device& dev;
  const Config& cfg;
  Workload& w;
  ladder_row& row;
};

/// A ladder's table of levels, each run by a function of `Context`.
template <class Context>
using level_table_of = std::vector<ladder_level<void (*)(const Context&)>>;

/// The level_info of every entry of `table`, in table order.
template <class Run>
[[nodiscard]] std::vector<level_info> infos_of(const std::vector<ladder_level<Run>>& table) {
  std::vector<level_info> out;
  out.reserve(table.size());
  for (const auto& l : table) out.push_back(l.info);
  return out;
}

/// The names of `levels`, in order: a ladder's default level list.
[[nodiscard]] std::vector<std::string> names_of(const std::vector<level_info>& levels);

/// One column of a ladder's text table after the level: header, width, and how a row's value prints.
struct ladder_column {
  std::string header;
  int width = 8;
  int precision = 3;     // digits after the point; 0 for counts
  bool percent = false;  // a fraction printed as a percentage ("12.3%")
  std::function<double(const ladder_row&)> value;
  /// Whether the column means anything for a row ("-" where it does not); empty: for every row.
  std::function<bool(const ladder_row&)> applies = {};
};

/// The columns every ladder's table starts with: steps/s, x ideal, <link> GB/s, % link, GPU idle; then
/// `more`, the ladder's own. The link columns print "-" for a row that moves no bytes (the ceiling).
[[nodiscard]] std::vector<ladder_column> standard_columns(copy_direction d,
                                                          std::vector<ladder_column> more = {});

/// A column of the extra figure `name` (ladder_row::extra).
[[nodiscard]] ladder_column extra_column(std::string header, int width, int precision, std::string name);

/// The column of wrong items ("mismatch"); "-" for a row that checked nothing.
[[nodiscard]] ladder_column wrong_column(int width);

/// "H2D", "D2H", "D2D", "H2H": a direction as the tables name its link.
[[nodiscard]] std::string link_name(copy_direction d);

/// What makes a ladder besides its workload: its levels and how its results read.
struct ladder_spec {
  std::string name;                    // "ingest": in messages, the table's title and the JSON
  copy_direction direction{};          // the link its levels load
  std::string step_bytes_name;         // "batch", "output": what one step moves
  std::string checked_unit;            // "batches", "bytes": the unit of ladder_row::checked
  std::vector<level_info> levels;      // every level the ladder knows, in ladder order
  int level_width = 7;                 // the table's first column
  std::vector<ladder_column> columns;  // the table's columns after the level
  /// JSON keys earlier results used that the shared vocabulary renamed: {old key, shared key}. The
  /// writer adds `<link>_gbps`, `probed_<link>_gbps`, `mismatches` and `checked_<unit>` itself.
  std::vector<std::pair<std::string, std::string>> json_aliases;
  /// The level the others are measured against (ladder_row::ratio_to_ideal), which moves no bytes:
  /// "ideal", or the ladder's own name for it ("single": one GPU with no communication).
  std::string ceiling = std::string(ideal_level);
  /// What the table's headline calls the link rows are compared with; empty: "pinned <link>" (the
  /// pinned copy probe::pinned_ceiling measures).
  std::string probed_name = {};
};

/// The index of `level` in `spec.levels`. Throws logic_error naming the level and every known one.
[[nodiscard]] std::size_t level_index(const ladder_spec& spec, std::string_view level);

/// A full ladder run.
struct ladder_result {
  const ladder_spec* spec = nullptr;  // the ladder's (static) spec
  device_info device;
  std::uint64_t step_bytes = 0;  // moved per step by every level but ideal
  std::chrono::nanoseconds compute{};
  double probed_gbps = 0;  // the pinned link rows are compared with
  std::vector<ladder_row> rows;
  std::vector<level_trace> traces;  // with tracing: one per level, in order
  nlohmann::json config_json;       // the ladder's config as run, as JSON
  bool interrupted = false;         // ladder_options::stop ended the run early: rows hold what finished
  /// On the emulated device (ladder_options::emulator): the pinned link it models in the ladder's
  /// direction, and the same link of the unscaled emulator (a PCIe gen5 x16 host link); 0 elsewhere.
  double emulated_gbps = 0;
  double reference_gbps = 0;
  /// The row of `level`, or null.
  [[nodiscard]] const ladder_row* find(std::string_view level) const noexcept;
  /// Wrong items over every row: a run is good when this is 0.
  [[nodiscard]] std::uint64_t wrong() const noexcept;
};

/// One level's timed window: timing events around each step's compute (for GPU idle), the wall clock,
/// the process's CPU time, and the level's trace recording.
class level_window {
 public:
  level_window(device& dev, const ladder_options& cfg, const std::string& ladder, const std::string& level);
  level_window(const level_window&) = delete;
  level_window& operator=(const level_window&) = delete;
  ~level_window() = default;

  /// Warm-up plus timed steps.
  [[nodiscard]] int total_steps() const noexcept { return warmup_ + steps_; }
  /// Step `step`'s compute begins (and ends) here on `s`: GPU idle counts the time between as busy.
  /// compute_started also reports the steps begun (on_step).
  void compute_started(int step, stream_view s);
  void compute_done(int step, stream_view s);
  /// Opens the window after the warm-up: synchronizes the device, starts tracing and the clocks.
  void begin();
  /// Closes it once the last step's output was processed: synchronizes the device, then fills the row's
  /// steps, seconds, steps/s, GPU idle and the extra "cpu_ms_per_step".
  void end(ladder_row& row);
  /// The recorded timeline, with the link ceilings it is compared with, analyzed (tracing only).
  [[nodiscard]] std::optional<level_trace> finish(double link_h2d_gbps, double link_d2h_gbps);
  /// Calls `fn` with the steps of this window begun so far (1 + the highest step started) each time
  /// that grows; from the thread that starts the step.
  void on_step(std::function<void(int begun)> fn) { on_step_ = std::move(fn); }

 private:
  device& dev_;
  int warmup_;
  int steps_;
  std::function<void(int)> on_step_;
  std::atomic<int> begun_{0};
  level_tracer tracer_;
  std::vector<event> starts_, stops_;
  std::chrono::steady_clock::time_point t0_{};
  double cpu0_ = 0;
};

/// Runs one level: builds the ladder's workload over `window`, runs the level `spec.levels[index]`, and
/// fills what only the ladder knows (checked, wrong, extras).
using level_runner = std::function<void(std::size_t index, level_window& window, ladder_row& row)>;

/// Checks the settings every ladder shares and the levels, probes the pinned link of the spec's
/// direction (unless cfg.probed_gbps is given), runs each level of cfg.levels in order, and fills every
/// row's shared fields. `own_config`: the ladder's own settings as JSON, for the result's config. Throws
/// logic_error for an unknown level or a setting out of range.
[[nodiscard]] ladder_result run_ladder(device& dev, const ladder_spec& spec, const ladder_options& cfg,
                                       std::uint64_t step_bytes, nlohmann::json own_config,
                                       const level_runner& run, progress_fn progress = {});

/// run_ladder for a ladder whose result type (derived from ladder_result) keeps its typed config; the
/// config's own JSON fields come from the to_json its ladder defines.
template <class Result, class Config>
[[nodiscard]] Result run_ladder_as(device& dev, const ladder_spec& spec, const Config& cfg,
                                   std::uint64_t step_bytes, const level_runner& run, progress_fn progress) {
  Result result;
  static_cast<ladder_result&>(result) =
      run_ladder(dev, spec, cfg, step_bytes, nlohmann::json(cfg), run, progress);
  result.config = cfg;
  return result;
}

/// The text table of a ladder run: a headline, a row per level, what each level does and what bounds it,
/// and with tracing each level's first finding.
[[nodiscard]] std::string format_table(const ladder_result& r);

/// When, where and how a result was measured: every JSON result carries it.
struct run_stamp {
  std::string date;     // UTC, ISO 8601, when the command started
  std::string command;  // the command line
  std::string version;  // ferry's version
};

/// A stamp for a command starting now, with this build's version.
[[nodiscard]] run_stamp stamp_now(std::string command);

/// ferry's version: `git describe --always --dirty` of the source tree at build time, or the project
/// version where the source was not a git checkout.
[[nodiscard]] std::string_view ferry_version() noexcept;

/// The fields every JSON result starts with: tool, date, command, version and device.
[[nodiscard]] nlohmann::json stamp_json(std::string_view tool, const run_stamp& stamp,
                                        const device_info& device);

/// A ladder's config as JSON: `own` (the ladder's own fields), the settings every ladder shares, and
/// "<step_bytes_name>_bytes": the bytes one step moves.
[[nodiscard]] nlohmann::json ladder_options_json(const ladder_spec& spec, const ladder_options& cfg,
                                                 nlohmann::json own, std::uint64_t step_bytes);

/// A ladder run as JSON: the stamp, the ladder and its direction, its config, the probed link, the
/// emulated link (null on a GPU) and the rows (the shared fields, the extras, and the keys earlier
/// results used). A row that moves no bytes (the ceiling) has null link figures (gbps, link_fraction),
/// and one that checked nothing a null count of wrong items (wrong).
[[nodiscard]] nlohmann::json ladder_json(const ladder_result& r, const run_stamp& stamp);

}  // namespace ferry::bench
