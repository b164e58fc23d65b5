#include "ferry/bench/ladder.hpp"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <tuple>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// "a, b or c": the known levels, for error messages.
std::string known_levels(const std::vector<level_info>& levels) {
  std::string out;
  for (std::size_t i = 0; i < levels.size(); ++i) {
    if (i > 0) out += i + 1 == levels.size() ? " or " : ", ";
    out += levels[i].name;
  }
  return out;
}

// One table cell, right-aligned to the column's width; "-" where the column does not apply to the row.
std::string cell(const ladder_column& c, const ladder_row& row) {
  if (c.applies && !c.applies(row)) return fmt::format("{:>{}}", "-", c.width);
  const double v = c.value(row);
  const std::string text =
      c.percent ? fmt::format("{:.{}f}%", v * 100, c.precision) : fmt::format("{:.{}f}", v, c.precision);
  return fmt::format("{:>{}}", text, c.width);
}

// The JSON name of a direction's link, in the keys earlier results used ("d2h_gbps").
std::string link_key(copy_direction d) {
  std::string name = link_name(d);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

// A row that moves no bytes (the ceiling) has no bandwidth and no share of the link.
bool moves_bytes(const ladder_row& r) { return r.bytes > 0; }
// A row that checked nothing (egress's ceiling: no output) has no count of wrong items.
bool checked_any(const ladder_row& r) { return r.checked > 0; }

// The pinned link of direction `d` in the emulator's options; 0 for a direction it does not model apart.
double pinned_gbps(const host_device_options& o, copy_direction d) {
  switch (d) {
    case copy_direction::host_to_device: return o.h2d_gbps;
    case copy_direction::device_to_host: return o.d2h_gbps;
    case copy_direction::device_to_device: return o.d2d_gbps;
    case copy_direction::host_to_host: return 0;
  }
  return 0;
}

}  // namespace

void ladder_row::set_extra(std::string_view name, double value, bool count) {
  for (auto& e : extras) {
    if (e.name == name) {
      e.value = value;
      e.count = count;
      return;
    }
  }
  extras.push_back({std::string(name), value, count});
}

double ladder_row::extra(std::string_view name) const noexcept {
  for (const auto& e : extras)
    if (e.name == name) return e.value;
  return 0;
}

std::vector<std::string> names_of(const std::vector<level_info>& levels) {
  std::vector<std::string> out;
  out.reserve(levels.size());
  for (const auto& l : levels) out.push_back(l.name);
  return out;
}

std::string link_name(copy_direction d) {
  switch (d) {
    case copy_direction::host_to_device: return "H2D";
    case copy_direction::device_to_host: return "D2H";
    case copy_direction::device_to_device: return "D2D";
    case copy_direction::host_to_host: return "H2H";
  }
  return "link";
}

std::vector<ladder_column> standard_columns(copy_direction d, std::vector<ladder_column> more) {
  std::vector<ladder_column> out{
      {"steps/s", 8, 3, false, [](const ladder_row& r) { return r.steps_per_s; }},
      {"x ideal", 8, 3, false, [](const ladder_row& r) { return r.ratio_to_ideal; }},
      {link_name(d) + " GB/s", 9, 2, false, [](const ladder_row& r) { return r.gbps; }, moves_bytes},
      {"% link", 7, 1, true, [](const ladder_row& r) { return r.link_fraction; }, moves_bytes},
      {"GPU idle", 8, 1, true, [](const ladder_row& r) { return r.gpu_idle; }},
  };
  for (auto& c : more) out.push_back(std::move(c));
  return out;
}

ladder_column extra_column(std::string header, int width, int precision, std::string name) {
  return {std::move(header), width, precision, false,
          [name = std::move(name)](const ladder_row& r) { return r.extra(name); }};
}

ladder_column wrong_column(int width) {
  return {"mismatch", width, 0, false, [](const ladder_row& r) { return static_cast<double>(r.wrong); },
          checked_any};
}

std::size_t level_index(const ladder_spec& spec, std::string_view level) {
  for (std::size_t i = 0; i < spec.levels.size(); ++i)
    if (spec.levels[i].name == level) return i;
  throw logic_error(
      fmt::format("unknown {} level \"{}\": expected {}", spec.name, level, known_levels(spec.levels)));
}

const ladder_row* ladder_result::find(std::string_view level) const noexcept {
  for (const auto& r : rows)
    if (r.level == level) return &r;
  return nullptr;
}

std::uint64_t ladder_result::wrong() const noexcept {
  std::uint64_t n = 0;
  for (const auto& r : rows) n += r.wrong;
  return n;
}

level_window::level_window(device& dev, const ladder_options& cfg, const std::string& ladder,
                           const std::string& level)
    : dev_(dev), warmup_(cfg.warmup), steps_(cfg.steps), tracer_(dev, cfg.trace, ladder, level) {
  for (int i = 0; i < total_steps(); ++i) {
    starts_.push_back(dev.make_timing_event());
    stops_.push_back(dev.make_timing_event());
  }
}

void level_window::compute_started(int step, stream_view s) {
  starts_[static_cast<std::size_t>(step)].record(s);
  if (!on_step_) return;
  // Several threads may start steps (a rank each): report each new highest step once.
  int seen = begun_.load();
  while (step + 1 > seen && !begun_.compare_exchange_weak(seen, step + 1)) {
  }
  if (step + 1 > seen) on_step_(step + 1);
}

void level_window::compute_done(int step, stream_view s) { stops_[static_cast<std::size_t>(step)].record(s); }

void level_window::begin() {
  dev_.synchronize();
  tracer_.begin();
  t0_ = steady_clock::now();
  cpu0_ = process_cpu_seconds();
}

void level_window::end(ladder_row& row) {
  dev_.synchronize();
  row.seconds = seconds_since(t0_);
  tracer_.end();
  row.set_extra("cpu_ms_per_step", (process_cpu_seconds() - cpu0_) * 1e3 / steps_);
  row.steps = steps_;
  row.steps_per_s = row.seconds > 0 ? steps_ / row.seconds : 0;
  double busy_ms = 0;
  for (int i = warmup_; i < total_steps(); ++i) {
    busy_ms += dev_.elapsed_ms(starts_[static_cast<std::size_t>(i)], stops_[static_cast<std::size_t>(i)]);
  }
  row.gpu_idle = row.seconds > 0 ? std::max(0.0, 1.0 - busy_ms * 1e-3 / row.seconds) : 0;
}

std::optional<level_trace> level_window::finish(double link_h2d_gbps, double link_d2h_gbps) {
  return tracer_.finish(link_h2d_gbps, link_d2h_gbps);
}

ladder_result run_ladder(device& dev, const ladder_spec& spec, const ladder_options& cfg,
                         std::uint64_t step_bytes, nlohmann::json own_config, const level_runner& run,
                         progress_fn progress) {
  FERRY_EXPECTS(cfg.steps >= 1,
                fmt::format("{} bench steps is {}; at least 1 timed step is needed", spec.name, cfg.steps));
  FERRY_EXPECTS(cfg.warmup >= 0,
                fmt::format("{} bench warmup is {}; it cannot be negative", spec.name, cfg.warmup));
  FERRY_EXPECTS(cfg.workers >= 1,
                fmt::format("{} bench workers is {}; at least 1 worker is needed", spec.name, cfg.workers));
  std::vector<std::size_t> order;
  for (const auto& level : cfg.levels) order.push_back(level_index(spec, level));

  ladder_result result;
  result.spec = &spec;
  result.device = dev.info();
  result.step_bytes = step_bytes;
  result.compute = cfg.compute;
  result.config_json = ladder_options_json(spec, cfg, std::move(own_config), step_bytes);
  result.probed_gbps = probe::pinned_ceiling(dev, spec.direction, step_bytes, cfg.probed_gbps, progress);
  if (cfg.emulator && dev.kind() == backend::host) {
    result.emulated_gbps = pinned_gbps(*cfg.emulator, spec.direction);
    result.reference_gbps = pinned_gbps(host_device_options{}, spec.direction);
  }
  const bool h2d = spec.direction == copy_direction::host_to_device;
  const bool d2h = spec.direction == copy_direction::device_to_host;

  const std::uint64_t level_steps =
      static_cast<std::uint64_t>(cfg.warmup) + static_cast<std::uint64_t>(cfg.steps);
  const std::uint64_t total_steps = level_steps * order.size();
  std::uint64_t steps_before = 0;  // of the levels run so far
  double ideal = 0;
  for (const std::size_t index : order) {
    if (cfg.stop != nullptr && cfg.stop->load()) {
      result.interrupted = true;
      break;
    }
    const level_info& level = spec.levels[index];
    if (progress) {
      progress(fmt::format("{}: {} warm-up + {} timed steps, {} {} per step", level.name, cfg.warmup,
                           cfg.steps, spec.step_bytes_name, format_bytes(step_bytes)));
    }
    FERRY_RANGE("bench level", trace::color::blue);
    ladder_row row;
    row.level = level.name;
    row.direction = spec.direction;
    std::optional<level_trace> traced;
    {
      level_window window(dev, cfg, spec.name, level.name);
      if (cfg.on_step) {
        window.on_step([&cfg, steps_before, total_steps](int begun) {
          cfg.on_step(steps_before + static_cast<std::uint64_t>(begun), total_steps);
        });
      }
      run(index, window, row);
      traced = window.finish(h2d ? result.probed_gbps : 0, d2h ? result.probed_gbps : 0);
    }
    std::tie(row.bottleneck, row.finding) = keep_trace(std::move(traced), result.traces);
    const bool is_ideal = level.name == spec.ceiling;
    row.bytes = is_ideal ? 0 : step_bytes * static_cast<std::uint64_t>(cfg.steps);
    row.gbps = gb_per_s(row.bytes, row.seconds);
    row.link_fraction = result.probed_gbps > 0 ? row.gbps / result.probed_gbps : 0;
    if (is_ideal) ideal = row.steps_per_s;
    result.rows.push_back(std::move(row));
    steps_before += level_steps;
  }
  for (auto& r : result.rows) r.ratio_to_ideal = ideal > 0 ? r.steps_per_s / ideal : 0;
  return result;
}

std::string format_table(const ladder_result& r) {
  FERRY_EXPECTS(r.spec != nullptr, "format_table of a ladder result that no ladder made (its spec is null)");
  const ladder_spec& spec = *r.spec;
  std::string out = fmt::format(
      "{} ladder on {} ({}): {} {} per step, compute {:.1f} ms per step, probed {} {:.2f} GB/s\n", spec.name,
      r.device.name, to_string(r.device.kind), spec.step_bytes_name, format_bytes(r.step_bytes),
      std::chrono::duration<double, std::milli>(r.compute).count(),
      spec.probed_name.empty() ? "pinned " + link_name(spec.direction) : spec.probed_name, r.probed_gbps);
  if (r.emulated_gbps > 0) {
    // The probe measured the emulator's model, not this machine's memory: say what the model is, and why
    // the ladders slow it down.
    const double slower = r.reference_gbps / r.emulated_gbps;
    const std::string dir = link_name(spec.direction);
    out += std::abs(slower - 1) < 1e-6
               ? fmt::format(
                     "emulated link: the emulator models pinned {} at {:.2f} GB/s (a PCIe gen5 x16 link)\n",
                     dir, r.emulated_gbps)
               : fmt::format(
                     "emulated link: the emulator models pinned {} at {:.2f} GB/s, a PCIe gen5 x16 link's "
                     "{:.1f} "
                     "GB/s slowed {:g} times, so that this small {} keeps the reference workload's "
                     "proportions of copy to compute\n",
                     dir, r.emulated_gbps, r.reference_gbps, slower, spec.step_bytes_name);
  }
  out += "\n";
  out += fmt::format("{:<{}}", "level", spec.level_width);
  for (const auto& c : spec.columns) out += fmt::format(" {:>{}}", c.header, c.width);
  out += "\n";
  for (const auto& row : r.rows) {
    out += fmt::format("{:<{}}", row.level, spec.level_width);
    for (const auto& c : spec.columns) out += " " + cell(c, row);
    out += "\n";
  }
  out += "\n";
  for (const auto& row : r.rows)
    for (const auto& l : spec.levels)
      if (l.name == row.level)
        out += fmt::format("{:<{}} {}; bound: {}\n", l.name, spec.level_width, l.what, l.bottleneck);
  out += format_findings(r.traces, spec.levels);
  return out;
}

run_stamp stamp_now(std::string command) {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  const std::size_t n = std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {std::string(date, n), std::move(command), std::string(ferry_version())};
}

nlohmann::json stamp_json(std::string_view tool, const run_stamp& stamp, const device_info& device) {
  return {{"tool", std::string(tool)},
          {"date", stamp.date},
          {"command", stamp.command},
          {"version", stamp.version},
          {"device", nlohmann::json::parse(to_json(device))}};
}

nlohmann::json ladder_options_json(const ladder_spec& spec, const ladder_options& cfg, nlohmann::json own,
                                   std::uint64_t step_bytes) {
  own.update({{"compute_ms", std::chrono::duration<double, std::milli>(cfg.compute).count()},
              {"warmup", cfg.warmup},
              {"steps", cfg.steps},
              {"workers", cfg.workers},
              {"check", cfg.check},
              {"levels", cfg.levels},
              {spec.step_bytes_name + "_bytes", step_bytes}});
  return own;
}

nlohmann::json ladder_json(const ladder_result& r, const run_stamp& stamp) {
  FERRY_EXPECTS(r.spec != nullptr, "ladder_json of a ladder result that no ladder made (its spec is null)");
  const ladder_spec& spec = *r.spec;
  const std::string link = link_key(spec.direction);
  // Old key -> shared key, for readers of results written before the ladders shared one row.
  std::vector<std::pair<std::string, std::string>> aliases{{link + "_gbps", "gbps"},
                                                           {"probed_" + link + "_gbps", "probed_gbps"},
                                                           {"mismatches", "wrong"},
                                                           {"checked_" + spec.checked_unit, "checked"}};
  aliases.insert(aliases.end(), spec.json_aliases.begin(), spec.json_aliases.end());
  auto add_aliases = [&aliases](nlohmann::json& j) {
    for (const auto& [old_key, key] : aliases)
      if (j.contains(key)) j[old_key] = j[key];
  };

  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    const bool moved = moves_bytes(row);
    nlohmann::json j{{"level", row.level},
                     {"steps", row.steps},
                     {"seconds", row.seconds},
                     {"steps_per_s", row.steps_per_s},
                     {"ratio_to_ideal", row.ratio_to_ideal},
                     {"direction", to_string(row.direction)},
                     {"bytes", row.bytes},
                     {"gbps", moved ? nlohmann::json(row.gbps) : nlohmann::json(nullptr)},
                     {"link_fraction", moved ? nlohmann::json(row.link_fraction) : nlohmann::json(nullptr)},
                     {"gpu_idle", row.gpu_idle},
                     {"checked", row.checked},
                     {"wrong", checked_any(row) ? nlohmann::json(row.wrong) : nlohmann::json(nullptr)},
                     {"bottleneck", row.bottleneck},
                     {"finding", row.finding}};
    for (const auto& e : row.extras) {
      if (e.count) {
        j[e.name] = static_cast<std::uint64_t>(e.value);
      } else {
        j[e.name] = e.value;
      }
    }
    add_aliases(j);
    rows.push_back(std::move(j));
  }
  nlohmann::json out = stamp_json("ferry bench " + spec.name, stamp, r.device);
  out["ladder"] = spec.name;
  out["direction"] = to_string(spec.direction);
  out["checked_unit"] = spec.checked_unit;
  out["config"] = r.config_json;
  out["probed_gbps"] = r.probed_gbps;
  out["emulated_link"] = r.emulated_gbps > 0
                             ? nlohmann::json{{"gbps", r.emulated_gbps},
                                              {"reference_gbps", r.reference_gbps},
                                              {"slowdown", r.reference_gbps / r.emulated_gbps}}
                             : nlohmann::json(nullptr);
  out["rows"] = std::move(rows);
  add_aliases(out);
  return out;
}

}  // namespace ferry::bench
