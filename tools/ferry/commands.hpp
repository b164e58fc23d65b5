// Subcommands of the ferry command-line tool.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "ferry/cuda/cuda.hpp"
#include "ferry/device/device.hpp"

namespace ferry::cli {

/// Options every device-using subcommand takes.
struct device_options {
  std::string backend = "auto";  // auto, host, cuda
  int gpu = 0;
};

/// Adds --backend and --gpu to a subcommand.
void add_device_options(CLI::App& app, device_options& opts);

/// Makes the device the options ask for and says on stderr which backend it chose and why. `host`
/// configures the emulated device when that is the one made.
[[nodiscard]] std::unique_ptr<device> open_device(const device_options& opts,
                                                  const host_device_options& host = {});

/// The command line as a shell would take it back: arguments joined by spaces, those with characters a
/// shell reads quoted. JSON results record it.
[[nodiscard]] std::string command_line(int argc, const char* const argv[]);

/// Registers `ferry bench` and its ladders; the returned function runs the one parsed. `command` (the
/// command line) goes into every JSON result.
[[nodiscard]] std::function<int()> add_bench_command(CLI::App& app, std::string command);

/// Registers the device-to-device benches under `bench` (`ferry bench allreduce`); the returned function
/// runs the one parsed (0 when none of them was).
[[nodiscard]] std::function<int()> add_comm_bench_commands(CLI::App& bench_cmd, std::string command);

/// Registers `ferry analyze`; the returned function runs it after parsing.
[[nodiscard]] std::function<int()> add_analyze_command(CLI::App& app);

/// `ferry trace [options] -- CMD ARGS...`: records CMD and its process tree (trace_command.cpp).
[[nodiscard]] std::function<int()> add_trace_command(CLI::App& app);

/// Registers `ferry probe`; the returned function runs it after parsing. `command` (the command line)
/// goes into its JSON result.
[[nodiscard]] std::function<int()> add_probe_command(CLI::App& app, std::string command);

}  // namespace ferry::cli
