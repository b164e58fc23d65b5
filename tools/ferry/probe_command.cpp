// `ferry probe`: measures the host-device link and prints a table, or JSON with --json.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "ferry/bench/ladder.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/probe/topology.hpp"
#include "flags.hpp"
#include "memory_check.hpp"
#include "run_control.hpp"

namespace ferry::cli {
namespace {

struct probe_flags {
  device_options dev;
  std::uint64_t bytes = 0;
  std::uint64_t pin_bytes = 0;
  int iterations = 0;
  int warmup = 0;
  bool json = false;
  std::string output;
  bool no_check = false;
  bool no_pin_cost = false;
  bool topology = false;
  bool no_p2p = false;
};

// The probe's own JSON (probe::to_json) under the run stamp every bench result carries.
std::string to_json(const probe::result& r, const bench::run_stamp& stamp) {
  nlohmann::json j = bench::stamp_json("ferry probe", stamp, r.device);
  j.update(nlohmann::json::parse(probe::to_json(r)));
  return j.dump(2);
}

// Ranges of probe's flags.
constexpr std::int64_t max_iterations = 1'000'000;
constexpr std::uint64_t min_copy_bytes = 8;  // one pattern word

progress_fn progress_to(status_line& status) {
  return [&status](const std::string& line) {
    status.line("probe: " + line);
    status.set("probe: " + line);
  };
}

// `ferry probe --topology`: every GPU of the machine (not only --gpu), so no device is opened; the
// backend option only decides whether GPUs are looked for.
int run_topology(const probe_flags& flags, int iterations, int warmup) {
  backend b = backend::host;
  if (flags.dev.backend == "cuda") {
    FERRY_EXPECTS(cuda_available(), fmt::format("--backend cuda: {}", cuda_unavailable_reason()));
    b = backend::cuda;
  } else if (flags.dev.backend != "host") {
    b = backend::cuda;  // auto: the GPU part says why it finds none (no GPU, or a build without CUDA)
  }
  probe::topology_options opts;
  opts.measure_p2p = !flags.no_p2p;
  if (flags.bytes != 0) opts.p2p_bytes = flags.bytes;
  if (iterations > 0) opts.p2p_iterations = iterations;
  if (warmup >= 0) opts.p2p_warmup = warmup;
  status_line status;
  const probe::topology t = probe::discover_topology(b, opts, progress_to(status));
  emit(flags.output, flags.json ? probe::to_json(t) + "\n" : probe::format_table(t));
  return 0;
}

// "A on cuda, B on host", or "A" where both backends' defaults agree.
std::string per_backend(const std::string& cuda, const std::string& host) {
  return cuda == host ? cuda : fmt::format("{} on cuda, {} on host", cuda, host);
}

}  // namespace

std::function<int()> add_probe_command(CLI::App& app, std::string command) {
  const probe::options cuda = probe::default_options(backend::cuda);
  const probe::options host = probe::default_options(backend::host);
  const probe::topology_options topo;
  auto flags = std::make_shared<probe_flags>();
  CLI::App* sub =
      app.add_subcommand("probe", "Measure the host-device link: the ceilings benches compare to");
  add_device_options(*sub, flags->dev);
  add_bytes_flag(*sub, "--bytes", flags->bytes, min_copy_bytes, max_host_buffer_bytes(),
                 fmt::format("Bytes per copy, e.g. 256MiB (default: {})",
                             per_backend(format_bytes(cuda.copy_bytes), format_bytes(host.copy_bytes))));
  CLI::Option* iterations = add_int_flag(
      *sub, "--iterations", flags->iterations, 1, max_iterations,
      fmt::format("Timed copies per link (default: {})",
                  per_backend(std::to_string(cuda.iterations), std::to_string(host.iterations))));
  CLI::Option* warmup =
      add_int_flag(*sub, "--warmup", flags->warmup, 0, max_iterations,
                   fmt::format("Untimed copies per link before timing (default: {})",
                               per_backend(std::to_string(cuda.warmup), std::to_string(host.warmup))));
  add_bytes_flag(*sub, "--pin-bytes", flags->pin_bytes, 1, max_host_buffer_bytes(),
                 fmt::format("Pinned allocation timed for the cost of pinning (default {})",
                             per_backend(format_bytes(cuda.pin_bytes), format_bytes(host.pin_bytes))));
  sub->add_flag("--no-pin-cost", flags->no_pin_cost, "Skip timing the cost of pinning");
  sub->add_flag("--no-check", flags->no_check, "Skip verifying the copied bytes");
  sub->add_flag("--json", flags->json, "Print JSON on stdout instead of the table");
  sub->add_option("--output,-o", flags->output,
                  "Write the table (or with --json the JSON) to this file instead of stdout; it appears "
                  "only once complete");
  sub->add_flag(
      "--topology", flags->topology,
      fmt::format("Print how CPUs, NUMA nodes and GPUs connect (like nvidia-smi topo -m), each GPU's "
                  "PCIe link and the GPU-to-GPU bandwidth, instead of the link probe; --bytes, "
                  "--iterations and --warmup then size the P2P copies (default {}, {}, {})",
                  format_bytes(topo.p2p_bytes), topo.p2p_iterations, topo.p2p_warmup));
  sub->add_flag("--no-p2p", flags->no_p2p, "With --topology: skip measuring GPU-to-GPU bandwidth");
  return [flags, iterations, warmup, command] {
    if (flags->topology) {
      check_output(flags->output, "--output");
      return run_topology(*flags, iterations->count() > 0 ? flags->iterations : 0,
                          warmup->count() > 0 ? flags->warmup : -1);
    }
    check_output(flags->output, "--output");
    const bench::run_stamp stamp = bench::stamp_now(command);
    auto dev = open_device(flags->dev);
    probe::options opts = probe::default_options(dev->kind());
    if (flags->bytes != 0) opts.copy_bytes = flags->bytes;
    if (flags->pin_bytes != 0) opts.pin_bytes = flags->pin_bytes;
    if (iterations->count() > 0) opts.iterations = flags->iterations;
    if (warmup->count() > 0) opts.warmup = flags->warmup;
    opts.check = !flags->no_check;
    opts.measure_pin_cost = !flags->no_pin_cost;
    check_probe_memory(*dev, opts);
    status_line status;
    const probe::result r = probe::run(*dev, opts, progress_to(status));
    emit(flags->output, flags->json ? to_json(r, stamp) + "\n" : probe::format_table(r));
    return 0;
  };
}

}  // namespace ferry::cli
