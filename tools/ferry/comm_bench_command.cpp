// `ferry bench allreduce` and `ferry bench ddp`: the device-to-device benches, over a group of ranks
// (ferry::comm). The benches live in ferry_bench; this file maps flags onto their options and makes the
// group: one emulated device per rank on the host backend (the in-process host communicator over a modelled
// link), or one GPU per rank on cuda (NCCL, one thread per rank): every GPU of this process, or under
// mpirun (--bootstrap mpi) one GPU per process, the process's local rank on its host.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exit_status.hpp"
#include "ferry/bench/allreduce_bench.hpp"
#include "ferry/bench/ddp_bench.hpp"
#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/group.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "ferry/cuda/cuda.hpp"
#include "flags.hpp"
#include "level_traces.hpp"
#include "run_control.hpp"

namespace ferry::cli {
namespace {

constexpr std::int64_t max_ranks = 64;

// Flags every device-to-device bench takes: where its ranks run.
struct group_flags {
  std::string backend = "auto";
  std::string bootstrap = "auto";
  int ranks = 2;  // host backend
  int gpus = 2;   // cuda
  std::string link = "nvlink";
  bool json = false;
  std::string output;
};

void add_group_flags(CLI::App& app, group_flags& f) {
  app.add_option(
         "--backend", f.backend,
         "cuda (one GPU per rank, NCCL), host (emulated devices, the in-process host communicator), or "
         "auto (cuda when GPUs and NCCL are there)")
      ->check(CLI::IsMember({"auto", "host", "cuda"}))
      ->capture_default_str();
  app.add_option("--bootstrap", f.bootstrap,
                 "How the processes of the job find one another: single (this process drives every rank), "
                 "mpi (a job started by mpirun, Open MPI: one GPU per process, its local rank on the host; "
                 "rank 0's process prints), or auto (mpi when started by mpirun)")
      ->check(CLI::IsMember({"auto", "single", "mpi"}))
      ->capture_default_str();
  add_int_flag(
      app, "--ranks", f.ranks, 1, max_ranks,
      fmt::format("Ranks on the host backend, one emulated device each (default {})", group_flags{}.ranks));
  add_int_flag(app, "--gpus", f.gpus, 1, max_ranks,
               fmt::format("GPUs on cuda in one process, ordinals 0..N-1, one rank each (default {})",
                           group_flags{}.gpus));
  app.add_option(
         "--link", f.link,
         "The host backend's modelled link: nvlink (about 330 GB/s bus) or host-memory (about 27 GB/s, "
         "as NCCL_P2P_DISABLE=1)")
      ->check(CLI::IsMember({"nvlink", "host-memory"}))
      ->capture_default_str();
  app.add_flag("--json", f.json, "Print JSON on stdout instead of the table");
  app.add_option("--output,-o", f.output,
                 "Write the table (or with --json the JSON) to this file instead of stdout; it appears only "
                 "once complete");
}

// The devices and the group of communicators over them; the communicators die first.
struct rank_group {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<comm::communicator>> comms;
  std::vector<comm::communicator*> ranks;
  std::string link;  // the host backend's modelled link, for the report
  rank_group() = default;
  rank_group(const rank_group&) = delete;
  rank_group& operator=(const rank_group&) = delete;
  rank_group(rank_group&&) = default;
  ~rank_group() { comms.clear(); }
};

// This process's GPU in a job of several processes: its local rank on its host (comm::local_gpu). The
// host backend's ranks model a link inside one process, so over several processes it is refused, by every
// process at once.
int gpu_of_process(comm::bootstrap& job, const group_flags& f) {
  if (f.backend == "host")
    comm::agree_ready(job, "ferry bench (choosing each process's GPU)",
                      fmt::format("--backend host with --bootstrap {} over {} processes: the host backend's "
                                  "ranks live in one process; give --backend cuda (or run one process)",
                                  job.name(), job.size()));
  return comm::local_gpu(job);
}

// `host_link`: the host backend's link, from the preset --link names.
rank_group open_group(const group_flags& f, const std::shared_ptr<comm::bootstrap>& shared_job,
                      const host_device_options& host,
                      const std::function<comm::comm_link(const comm::comm_link&)>& host_link = {}) {
  comm::bootstrap& job = *shared_job;
  rank_group g;
  std::vector<device*> raw;
  if (job.size() > 1) {
    const int ordinal = gpu_of_process(job, f);
    g.devices.push_back(make_cuda_device(ordinal));
    g.comms.push_back(comm::open_group(shared_job, *g.devices.back()));
    if (job.rank() == 0)
      fmt::print(stderr, "ferry: backend cuda ({} processes over {}, one GPU each: {})\n", job.size(),
                 job.transport(), g.devices.front()->info().name);
    for (auto& c : g.comms) g.ranks.push_back(c.get());
    return g;
  }
  std::string nccl_reason;
  bool cuda = f.backend == "cuda";
  if (f.backend == "auto") {
    cuda = cuda_available() && comm::nccl_available(&nccl_reason);
    if (!cuda) {
      fmt::print(stderr, "ferry: backend host ({} ranks over emulated devices: {})\n", f.ranks,
                 cuda_available() ? nccl_reason : cuda_unavailable_reason());
    }
  }
  if (cuda) {
    // auto runs on the GPUs there are (one GPU measures the reducer's local cost); --backend cuda asks for
    // exactly --gpus and is refused before any work when fewer are visible.
    const int visible = cuda_device_count();
    int gpus = f.gpus;
    if (gpus > visible) {
      FERRY_EXPECTS(visible > 0, fmt::format("--backend cuda: no GPU ({})", cuda_unavailable_reason()));
      FERRY_EXPECTS(f.backend == "auto", fmt::format("--gpus {}: the CUDA runtime sees {} GPU{}, at most {}",
                                                     gpus, visible, visible == 1 ? "" : "s", visible));
      fmt::print(stderr, "ferry: --gpus {}, but the CUDA runtime sees {}: running on {}\n", gpus, visible,
                 visible);
      gpus = visible;
    }
    for (int r = 0; r < gpus; ++r) {
      g.devices.push_back(make_cuda_device(r));
      raw.push_back(g.devices.back().get());
    }
    g.comms = comm::make_nccl_group(raw);
    fmt::print(stderr, "ferry: backend cuda ({} GPUs, NCCL: {})\n", gpus, g.devices.front()->info().name);
  } else {
    comm::comm_options o;
    o.link = f.link == "host-memory" ? comm::comm_link::host_memory() : comm::comm_link::nvlink();
    if (host_link) o.link = host_link(o.link);
    for (int r = 0; r < f.ranks; ++r) {
      g.devices.push_back(make_host_device(host));
      raw.push_back(g.devices.back().get());
    }
    g.comms = comm::make_host_group(raw, o);
    g.link = fmt::format("{}, {:g} GB/s bus, {} us latency", o.link.name, o.link.bus_gbps,
                         std::chrono::duration<double, std::micro>(o.link.latency).count());
    if (f.backend != "auto") fmt::print(stderr, "ferry: backend host ({} ranks, as asked)\n", f.ranks);
  }
  for (auto& c : g.comms) g.ranks.push_back(c.get());
  return g;
}

// "fp32,bf16" -> codecs; a name that is not a codec is a flag error.
std::vector<comm::codec_kind> parse_codecs(const std::string& text) {
  std::vector<comm::codec_kind> out;
  std::stringstream in(text);
  std::string name;
  while (std::getline(in, name, ',')) {
    try {
      out.push_back(comm::parse_codec(name));
    } catch (const logic_error& e) {
      throw flag_error(fmt::format("--codec {}: {}", escape_control(text), escape_control(e.what())));
    }
    if (!comm::has_error_bound(out.back()))
      throw flag_error(
          fmt::format("--codec {}: {} runs in the reducer only (bench ddp); expected fp32, bf16 or "
                      "fp16",
                      escape_control(text), comm::to_string(out.back())));
  }
  if (out.empty()) throw flag_error("--codec: empty; expected a list such as fp32,bf16,fp16");
  return out;
}

struct allreduce_flags : group_flags {
  std::uint64_t min_bytes = 0;
  std::uint64_t max_bytes = 0;
  std::uint64_t step_factor = 0;
  int iters = 0;
  int warmup = -1;
  std::string codecs = "fp32";
  bool no_check = false;
  bool check = false;
};

int run_allreduce(const allreduce_flags& f, const std::string& command) {
  check_output(f.output, "--output");
  bench::allreduce_options o;
  if (f.min_bytes != 0) o.min_bytes = f.min_bytes;
  if (f.max_bytes != 0) o.max_bytes = f.max_bytes;
  if (f.min_bytes != 0 && f.max_bytes == 0) o.max_bytes = std::max(o.min_bytes, o.max_bytes);
  if (f.step_factor != 0) o.step_factor = f.step_factor;
  if (f.iters != 0) o.iters = f.iters;
  if (f.warmup >= 0) o.warmup = f.warmup;
  o.codecs = parse_codecs(f.codecs);
  if (f.check && f.no_check) throw flag_error("--check and --no-check contradict each other; give one");
  o.check = !f.no_check;
  if (o.min_bytes > o.max_bytes)
    throw flag_error(fmt::format("-b/--min-bytes {} is above -e/--max-bytes {}", format_bytes(o.min_bytes),
                                 format_bytes(o.max_bytes)));
  static_cast<void>(bench::allreduce_sizes(o));  // the options' checks, before any device is opened
  const bench::run_stamp stamp = bench::stamp_now(command);
  host_device_options host;
  host.model_link = false;  // the communicator models the link between ranks
  const std::shared_ptr<comm::bootstrap> job = comm::make_bootstrap(f.bootstrap);
  rank_group g = open_group(f, job, host);
  status_line status;
  const bench::allreduce_result r = [&] {
    const auto progress = [&status](const std::string& line) {
      status.line("bench: " + line);
      status.set("bench: " + line);
    };
    bench::allreduce_result x = job->size() > 1 ? bench::run_allreduce(*job, g.ranks, o, progress)
                                                : bench::run_allreduce(g.ranks, o, progress);
    x.link = g.link;
    return x;
  }();
  // Every process holds the group's result; rank 0's prints it.
  if (job->rank() == 0) {
    emit(f.output,
         f.json ? bench::to_json(r, o, stamp).dump(2) + "\n" : escape_control(bench::format_text(r), true));
  }
  return r.wrong() == 0 ? exit_status::ok : exit_status::wrong_data;
}

struct ddp_flags : group_flags {
  double step_ms = -1;
  double scale = -1;
  int steps = 0;
  int warmup = -1;
  int learn_steps = 0;
  std::string levels;
  trace_flags trace;
};

int run_ddp(const ddp_flags& f, const std::string& command) {
  check_output(f.output, "--output");
  const bool cuda =
      f.backend == "cuda" || (f.backend == "auto" && cuda_available() && comm::nccl_available());
  bench::ddp_options cfg = bench::default_ddp_options(cuda ? backend::cuda : backend::host);
  if (f.step_ms >= 0) cfg.compute = std::chrono::nanoseconds(static_cast<std::int64_t>(f.step_ms * 1e6));
  if (f.scale > 0) cfg.scale = f.scale;
  if (f.steps != 0) cfg.steps = f.steps;
  if (f.warmup >= 0) cfg.warmup = f.warmup;
  if (f.learn_steps != 0) cfg.learn_steps = f.learn_steps;
  cfg.stop = &interrupt_flag();
  if (!f.levels.empty()) {
    cfg.levels.clear();
    std::stringstream in(f.levels);
    std::string level;
    while (std::getline(in, level, ',')) {
      try {
        static_cast<void>(bench::level_index(bench::ddp_spec(), level));
      } catch (const logic_error& e) {
        throw flag_error(fmt::format("--levels: {}", escape_control(e.what())));
      }
      cfg.levels.push_back(level);
    }
  }
  if (cfg.warmup < 1)
    throw flag_error("--warmup 0: ddp needs at least 1 warm-up step (the first builds the plan)");
  apply_trace_flags(f.trace, cfg.trace);
  check_trace_outputs(f.trace, cfg.levels);
  const bench::run_stamp stamp = bench::stamp_now(command);
  host_device_options host;
  host.model_link = false;
  // Under mpirun every process runs its own GPU's rank; rank 0's process times the steps, traces and
  // prints, and every process checks the whole group's gradients (and exits with the same status).
  const std::shared_ptr<comm::bootstrap> job = comm::make_bootstrap(f.bootstrap);
  const bool reports = job->rank() == 0;
  if (!reports) cfg.trace = {};
  rank_group g = open_group(f, job, host, [&cfg](const comm::comm_link& preset) {
    return bench::ddp_host_link(preset, cfg.scale, cfg.compute);
  });
  status_line status;
  graceful_interrupts(true);
  bench::progress_fn progress;
  if (reports) {
    progress = [&status](const std::string& line) {
      status.line("bench: " + line);
      status.set("bench: " + line);
    };
    cfg.on_step = [&status](std::uint64_t begun, std::uint64_t total) { status.steps(begun, total); };
  }
  bench::ddp_result r = bench::run_ddp(g.ranks, cfg, progress);
  const bool interrupted = r.interrupted || interrupt_flag().load();
  const int status_code = interrupted      ? exit_status::interrupted
                          : r.wrong() == 0 ? exit_status::ok
                                           : exit_status::wrong_data;
  if (!reports) return status_code;
  const std::string processes =
      job->size() > 1 ? fmt::format(" over {} processes ({})", job->size(), job->transport()) : "";
  std::string head =
      fmt::format("{} ranks{}, {} communicator{}; model scale {:g} ({} of gradients per step)\n", r.ranks,
                  processes, r.comm_backend, g.link.empty() ? "" : fmt::format(", modelled link {}", g.link),
                  cfg.scale, format_bytes(cfg.gradient_bytes()));
  if (f.json) {
    nlohmann::json j = bench::ladder_json(r, stamp);
    j["ranks"] = r.ranks;
    j["processes"] = job->size();
    j["comm_backend"] = r.comm_backend;
    j["link"] = g.link;
    if (interrupted) j["interrupted"] = true;
    if (!f.trace.file.empty()) j["traces"] = write_level_traces(r.traces, f.trace, r.spec->levels, true);
    emit(f.output, j.dump(2) + "\n");
  } else {
    emit(f.output, escape_control(head + bench::format_table(r), true));
    if (!f.trace.file.empty())
      static_cast<void>(write_level_traces(r.traces, f.trace, r.spec->levels, false));
  }
  return status_code;
}

}  // namespace

std::function<int()> add_comm_bench_commands(CLI::App& bench_cmd, std::string command) {
  auto a = std::make_shared<allreduce_flags>();
  const bench::allreduce_options d;
  CLI::App* ar = bench_cmd.add_subcommand(
      "allreduce", "All-reduce bandwidth over sizes (nccl-tests' columns), fp32 and the 16-bit codecs");
  add_group_flags(*ar, *a);
  add_bytes_flag(*ar, "-b,--min-bytes", a->min_bytes, 4, std::uint64_t{1} << 40,
                 fmt::format("Smallest size, fp32 bytes (default {})", format_bytes(d.min_bytes)));
  add_bytes_flag(
      *ar, "-e,--max-bytes", a->max_bytes, 4, std::uint64_t{1} << 40,
      fmt::format("Largest size (default {}, or -b when -b is larger)", format_bytes(d.max_bytes)));
  add_int_flag(*ar, "-f,--step-factor", a->step_factor, 2, 1024,
               fmt::format("Each size is the previous one times this (default {})", d.step_factor));
  add_int_flag(
      *ar, "-n,--iters", a->iters, 1, max_count,
      fmt::format("Timed operations per size, out of place and in place each (default {})", d.iters));
  add_int_flag(*ar, "-w,--warmup", a->warmup, 0, max_count,
               fmt::format("Untimed operations per size and codec (default {})", d.warmup));
  ar->add_option("--codec", a->codecs, "Comma-separated codecs: fp32, bf16, fp16 (default fp32)");
  ar->add_flag("--check", a->check, "Compare every element with the exact mean over ranks (the default)");
  ar->add_flag("--no-check", a->no_check, "Skip the comparison (#wrong reads N/A)");

  auto df = std::make_shared<ddp_flags>();
  const bench::ddp_options dc = bench::default_ddp_options(backend::cuda);
  const bench::ddp_options dh = bench::default_ddp_options(backend::host);
  CLI::App* ddp = bench_cmd.add_subcommand(
      "ddp",
      "Data-parallel ladder on a synthetic ViT-L/32: single, one bucket, 25/100 MB, fp16, bf16, ferry auto");
  add_group_flags(*ddp, *df);
  add_double_flag(
      *ddp, "--step-ms", df->step_ms, 0.001, 3'600'000,
      fmt::format("One GPU's step (forward, backward, optimizer) in ms (default {:g} on cuda, {:g} on host)",
                  std::chrono::duration<double, std::milli>(dc.compute).count(),
                  std::chrono::duration<double, std::milli>(dh.compute).count()));
  add_double_flag(
      *ddp, "--scale", df->scale, 1e-6, 1,
      fmt::format("The model's parameters times this (default {:g} on cuda, {:g} on host; the host link "
                  "scales with it)",
                  dc.scale, dh.scale));
  add_int_flag(*ddp, "--steps", df->steps, 1, max_count,
               fmt::format("Timed steps per level (default {} on cuda, {} on host)", dc.steps, dh.steps));
  add_int_flag(*ddp, "--warmup", df->warmup, 1, max_count,
               fmt::format("Untimed steps per level (default {} on cuda, {} on host)", dc.warmup, dh.warmup));
  add_int_flag(*ddp, "--learn-steps", df->learn_steps, 1, 1000,
               fmt::format("Auto levels: steps the gradient-ready timeline is learned from (default {})",
                           dc.learn_steps));
  ddp->add_option("--levels", df->levels,
                  fmt::format("Comma-separated levels (default {})", fmt::join(dc.levels, ",")));
  add_trace_flags(*ddp, df->trace, std::to_string(dc.trace.capacity));
  return [a, ar, df, ddp, command]() -> int {
    if (ar->parsed()) return run_allreduce(*a, command);
    if (ddp->parsed()) return run_ddp(*df, command);
    return 0;
  };
}

}  // namespace ferry::cli
