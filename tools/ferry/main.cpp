// ferry: keeps GPUs fed and drained. Subcommands: probe (what the link can do), bench (the ladders),
// analyze (what a trace says bounds a workload).
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "ferry/core/error.hpp"

namespace ferry::cli {

void add_device_options(CLI::App& app, device_options& opts) {
  app.add_option(
         "--backend", opts.backend,
         "Device backend: cuda (a GPU), host (the emulated device), or auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"auto", "host", "cuda"}))
      ->capture_default_str();
  app.add_option("--gpu", opts.gpu, "GPU ordinal for the cuda backend")->capture_default_str();
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

int main(int argc, char** argv) {
  CLI::App app{"ferry: keeps GPUs fed and drained, and measures where they still wait"};
  app.require_subcommand(1);
  const std::string command = ferry::cli::command_line(argc, argv);  // JSON results record it
  std::function<int()> run_probe = ferry::cli::add_probe_command(app, command);
  std::function<int()> run_bench = ferry::cli::add_bench_command(app, command);
  std::function<int()> run_analyze = ferry::cli::add_analyze_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("probe")) return run_probe();
    if (app.got_subcommand("bench")) return run_bench();
    if (app.got_subcommand("analyze")) return run_analyze();
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
