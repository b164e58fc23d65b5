// ferry: keeps GPUs fed and drained. Subcommands: probe (what the link can do), bench (the ladders),
// analyze (what a trace says bounds a workload).
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "exit_status.hpp"
#include "ferry/bench/ladder.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "flags.hpp"
#include "run_control.hpp"

namespace ferry::cli {

void add_device_options(CLI::App& app, device_options& opts) {
  app.add_option(
         "--backend", opts.backend,
         "Device backend: cuda (a GPU), host (the emulated device), or auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"auto", "host", "cuda"}))
      ->capture_default_str();
  add_int_flag(app, "--gpu", opts.gpu, 0, max_gpu_ordinal,
               fmt::format("GPU ordinal for the cuda backend (default {})", device_options{}.gpu));
}

std::string command_line(int argc, const char* const argv[]) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i > 0) out += ' ';
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_./=:,+@%") == std::string_view::npos;
    if (plain) {
      out += arg;
      continue;
    }
    out += '\'';
    for (const char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

std::unique_ptr<device> open_device(const device_options& opts, const host_device_options& host) {
  if (opts.backend == "auto") {
    if (!cuda_available()) {
      fmt::print(stderr, "ferry: backend host (using the emulated host device: {})\n",
                 cuda_unavailable_reason());
      return make_host_device(host);
    }
    std::string reason;
    auto dev = make_default_device(&reason);
    fmt::print(stderr, "ferry: backend {} ({})\n", to_string(dev->kind()), reason);
    return dev;
  }
  const backend b = parse_backend(opts.backend);
  if (b == backend::cuda) {
    auto dev = make_cuda_device(opts.gpu);
    fmt::print(stderr, "ferry: backend cuda ({}, as asked)\n", dev->info().name);
    return dev;
  }
  fmt::print(stderr, "ferry: backend host (emulated device, as asked)\n");
  return make_host_device(host);
}

}  // namespace ferry::cli

namespace {

// Refuses a subcommand name that does not exist, naming it and the valid ones, before CLI11 reads it as
// a stray argument: walks argv down the subcommand tree until an option or a leaf.
void check_subcommands(const CLI::App& root, int argc, const char* const argv[]) {
  const CLI::App* app = &root;
  for (int i = 1; i < argc; ++i) {
    const std::string_view tok = argv[i];
    if (tok.empty() || tok[0] == '-') return;
    const auto subs = app->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return;
    const CLI::App* next = nullptr;
    std::string valid;
    for (const CLI::App* s : subs) {
      if (s->get_name() == tok) next = s;
      valid += (valid.empty() ? "" : ", ") + s->get_name();
    }
    if (next == nullptr) {
      const std::string where = app == &root ? "ferry" : "ferry " + app->get_name();
      throw ferry::cli::flag_error(fmt::format("unknown subcommand \"{}\" of {}; valid: {}",
                                               ferry::escape_control(tok), where, valid));
    }
    app = next;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry: keeps GPUs fed and drained, and measures where they still wait"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("ferry {}", ferry::bench::ferry_version()),
                       "Print ferry's version and exit");
  const std::string command = ferry::cli::command_line(argc, argv);  // JSON results record it
  std::function<int()> run_probe = ferry::cli::add_probe_command(app, command);
  std::function<int()> run_bench = ferry::cli::add_bench_command(app, command);
  std::function<int()> run_analyze = ferry::cli::add_analyze_command(app);
  std::function<int()> run_trace = ferry::cli::add_trace_command(app);
  // Usage errors (an unknown subcommand, a flag out of range) are one line and exit status 2, before
  // any work. Every status is in exit_status.hpp.
  try {
    check_subcommands(app, argc, argv);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
      fmt::print(stderr, "ferry: error: {}\n", ferry::escape_control(e.what()));
      return ferry::cli::exit_status::usage;
    }
    ferry::cli::check_flags();
  } catch (const ferry::cli::flag_error& e) {
    fmt::print(stderr, "ferry: error: {}\n", e.what());
    return ferry::cli::exit_status::usage;
  }
  ferry::cli::install_interrupt_handlers();
  try {
    if (app.got_subcommand("probe")) return run_probe();
    if (app.got_subcommand("bench")) return run_bench();
    if (app.got_subcommand("analyze")) return run_analyze();
    if (app.got_subcommand("trace")) return run_trace();
  } catch (const ferry::cli::flag_error& e) {
    fmt::print(stderr, "ferry: error: {}\n", e.what());
    return ferry::cli::exit_status::usage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry: error: {}\n", ferry::escape_control(e.what()));
    return ferry::cli::exit_status::error;
  }
  return ferry::cli::exit_status::ok;
}
