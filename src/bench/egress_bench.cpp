#include "ferry/bench/egress_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "ferry/core/bounded_queue.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/core/worker_pool.hpp"
#include "ferry/egress/egress.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Step i's output carries seed i + 1, so an output delivered for the wrong step fails its check.
std::uint64_t seed_of(int step) { return static_cast<std::uint64_t>(step) + 1; }

// The host work every level does on every delivered byte: the check against the pattern, or a checksum
// when checking is off. Counts checked bytes and wrong outputs; safe from many threads.
class processor {
 public:
  processor(bool check, double extra_ms_per_mib) : check_(check), extra_ms_per_mib_(extra_ms_per_mib) {}

  void process(std::span<const std::byte> bytes, std::uint64_t seed, std::uint64_t offset) {
    FERRY_RANGE("process output", trace::color::orange);
    if (extra_ms_per_mib_ > 0) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(
          static_cast<std::int64_t>(extra_ms_per_mib_ * 1e6 * static_cast<double>(bytes.size()) / (1 << 20))));
    }
    if (check_) {
      if (find_pattern_mismatch(bytes, seed, offset)) mismatches_.fetch_add(1, std::memory_order_relaxed);
    } else {
      sink_.fetch_xor(egress::checksum_of(bytes), std::memory_order_relaxed);
    }
    checked_.fetch_add(bytes.size(), std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t checked() const noexcept { return checked_.load(); }
  [[nodiscard]] std::uint64_t mismatches() const noexcept { return mismatches_.load(); }

 private:
  bool check_;
  double extra_ms_per_mib_;
  std::atomic<std::uint64_t> checked_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> sink_{0};  // keeps the checksums observable, so they are computed
};

// The synthetic model and the accounting shared by every level: two device output buffers (the model
// writes step i into out[i % 2]), timing events around each step's compute, and the timed window.
class workload {
 public:
  workload(device& dev, const egress_config& cfg, const std::string& level)
      : dev_(dev),
        cfg_(cfg),
        tracer_(dev, cfg.trace, "egress", level),
        compute_(dev.make_stream()),
        input_(dev.alloc_device(cfg.input_bytes())) {
    for (auto& o : out_) o = dev.alloc_device(cfg.output_bytes());
    for (auto& f : out_free_) f = dev.make_event();
    const int total = cfg.warmup + cfg.steps;
    for (int i = 0; i < total; ++i) {
      starts_.push_back(dev.make_timing_event());
      stops_.push_back(dev.make_timing_event());
    }
    dev.fill_pattern_async(input_, 0, compute_);
    compute_.synchronize();
  }

  [[nodiscard]] stream_view compute_stream() const { return compute_.view(); }
  [[nodiscard]] const buffer& output(int step) const { return out_[step % 2]; }
  [[nodiscard]] int total_steps() const { return cfg_.warmup + cfg_.steps; }

  /// Queues step `step` of the model on the compute stream: it first waits until the output buffer it
  /// overwrites has been copied out (when the level said so with output_copied).
  void compute(int step) {
    FERRY_RANGE("model step", trace::color::green);
    stream_view s = compute_.view();
    event& freed = out_free_[step % 2];
    if (freed.recorded()) s.wait(freed);
    starts_[step].record(s);
    dev_.spin_async(cfg_.compute, s);
    dev_.fill_pattern_async(out_[step % 2], seed_of(step), s);
    stops_[step].record(s);
  }

  /// The level's copy out of step `step`'s buffer is queued on `s`: the model waits for it before
  /// writing that buffer again.
  void output_copied(int step, stream_view s) { out_free_[step % 2].record(s); }
  /// As above, with an event that completes when the copy is done (egress::pipeline::submit's).
  void output_copied(int step, event copied) { out_free_[step % 2] = std::move(copied); }

  void begin_timing() {
    dev_.synchronize();
    tracer_.begin();
    t0_ = clock_type::now();
  }

  /// Closes the window and fills the row's times; call after the last output was processed.
  void end_timing(egress_row& row) {
    dev_.synchronize();
    row.seconds = seconds_since(t0_);
    tracer_.end();
    row.steps = cfg_.steps;
    row.steps_per_s = row.seconds > 0 ? cfg_.steps / row.seconds : 0;
    double busy_ms = 0;
    for (int i = cfg_.warmup; i < total_steps(); ++i) busy_ms += dev_.elapsed_ms(starts_[i], stops_[i]);
    row.gpu_idle = row.seconds > 0 ? std::max(0.0, 1.0 - busy_ms * 1e-3 / row.seconds) : 0;
  }

  [[nodiscard]] bool timed(int step) const { return step >= cfg_.warmup; }
  [[nodiscard]] level_tracer& tracer() noexcept { return tracer_; }

 private:
  device& dev_;
  const egress_config& cfg_;
  level_tracer tracer_;
  stream compute_;
  buffer input_;
  buffer out_[2];
  event out_free_[2];
  std::vector<event> starts_, stops_;
  clock_type::time_point t0_{};
};

// A whole output handed from the main thread (or a monitor thread) to the workers.
struct work_item {
  int step = 0;
  std::size_t pool_index = 0;  // the pool buffer holding it (L2..L4)
  buffer fresh;                // or a buffer allocated for it alone (L1)
  event copied;                // where a monitor must wait for the copy first (L3, L4)
};

// A queue served by worker threads, that can be drained (every pushed item processed) between the
// warm-up and the timed steps. A worker's exception fails the queue and is rethrown by push and drain.
class worker_stage {
 public:
  worker_stage(const char* name, std::size_t workers, std::size_t capacity, std::function<void(work_item&)> fn)
      : queue_(capacity),
        fn_(std::move(fn)),
        pool_(
            workers,
            [this, name](std::stop_token, std::size_t) {
              trace::name_this_thread(name);
              while (auto item = queue_.pop()) {
                fn_(*item);
                std::lock_guard lock(mu_);
                ++done_;
                cv_.notify_all();
              }
            },
            [this](std::exception_ptr e) {
              queue_.fail(e);
              std::lock_guard lock(mu_);
              failed_ = true;
              cv_.notify_all();
            }) {}
  worker_stage(const worker_stage&) = delete;
  worker_stage& operator=(const worker_stage&) = delete;
  ~worker_stage() { queue_.close(); }

  void push(work_item item) {
    {
      std::lock_guard lock(mu_);
      ++pushed_;
    }
    queue_.push(std::move(item));
  }

  void drain() {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return done_ == pushed_ || failed_; });
    }
    pool_.rethrow_if_failed();
  }

 private:
  bounded_queue<work_item> queue_;
  std::function<void(work_item&)> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t pushed_ = 0;
  std::uint64_t done_ = 0;
  bool failed_ = false;
  worker_pool pool_;  // last: its threads stop before the members they use are destroyed
};

// ferry's pipeline as the bench configures it: delivery as completed, since the checks are independent.
egress::options ferry_options(const egress_config& cfg) {
  egress::options opts;
  opts.slot_bytes = cfg.slot_bytes;
  opts.slots = cfg.slots;
  opts.sink_workers = cfg.workers;
  opts.order = delivery::as_completed;
  return opts;
}

// The pinned D2H bandwidth rows are compared with: given, or measured now on this device.
double probed_d2h(device& dev, const egress_config& cfg, progress_fn progress) {
  return probe::pinned_ceiling(dev, copy_direction::device_to_host, cfg.output_bytes(), cfg.probed_d2h_gbps,
                               progress);
}

void run_ideal(const egress_config& cfg, workload& w, egress_row& row) {
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
  }
  w.end_timing(row);
}

// L0: compute, a blocking copy into a freshly allocated pageable buffer, and processing inline.
void run_l0(device& dev, const egress_config& cfg, workload& w, egress_row& row, processor& proc) {
  const std::uint64_t n = cfg.output_bytes();
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
    w.compute_stream().synchronize();
    buffer fresh = dev.alloc_pageable(n);
    dev.copy(fresh, w.output(step), w.compute_stream());
    proc.process({fresh.host_bytes(), n}, seed_of(step), 0);
  }
  w.end_timing(row);
}

// L1: as L0, but N workers process (and free) the fresh buffers while the main thread goes on.
void run_l1(device& dev, const egress_config& cfg, workload& w, egress_row& row, processor& proc) {
  const std::uint64_t n = cfg.output_bytes();
  worker_stage workers("bench-worker", cfg.workers, cfg.workers, [&](work_item& item) {
    proc.process({item.fresh.host_bytes(), n}, seed_of(item.step), 0);
    item.fresh = buffer{};
  });
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) {
      workers.drain();
      w.begin_timing();
    }
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
    w.compute_stream().synchronize();
    work_item item{step, 0, dev.alloc_pageable(n), {}};
    dev.copy(item.fresh, w.output(step), w.compute_stream());
    workers.push(std::move(item));
  }
  workers.drain();
  w.end_timing(row);
}

enum class pool_level { l2, l3, l4 };

// L2..L4: a pool of whole-output host buffers behind a free list. L2 copies with a blocking copy; L3
// queues the copy on the compute stream and a monitor thread waits on its event before handing the
// buffer to a worker; L4 copies on an egress stream that waits on the compute stream. `pinned` picks
// real pinned memory; without it the pool is pageable, as the reference's pool became after
// share_memory_() silently dropped its pinning, which turns every "asynchronous" copy into a blocking one.
void run_pool(device& dev, const egress_config& cfg, workload& w, egress_row& row, processor& proc, pool_level level,
              bool pinned) {
  const std::uint64_t n = cfg.output_bytes();
  std::vector<buffer> pool;
  const auto t_pin = clock_type::now();
  for (std::size_t i = 0; i < cfg.pool_buffers; ++i) {
    pool.push_back(pinned ? dev.alloc_pinned(n) : dev.alloc_pageable(n));
    std::memset(pool.back().host_bytes(), 0, n);  // fault the pages in before timing, as a real pool would
  }
  if (pinned) row.pin_seconds = seconds_since(t_pin);
  bounded_queue<std::size_t> free_list(cfg.pool_buffers);
  for (std::size_t i = 0; i < cfg.pool_buffers; ++i) free_list.push(i);

  worker_stage workers("bench-worker", cfg.workers, cfg.pool_buffers, [&](work_item& item) {
    proc.process({pool[item.pool_index].host_bytes(), n}, seed_of(item.step), 0);
    free_list.push(item.pool_index);
  });
  worker_stage monitor("bench-monitor", 1, cfg.pool_buffers, [&](work_item& item) {
    item.copied.synchronize();
    workers.push(std::move(item));
  });
  stream egress = dev.make_stream();
  event computed = dev.make_event();

  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) {
      monitor.drain();
      workers.drain();
      w.begin_timing();
    }
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
    const std::size_t idx = [&] {
      FERRY_RANGE("wait for a free buffer", trace::color::red);
      return *free_list.pop();
    }();
    switch (level) {
      case pool_level::l2:
        w.compute_stream().synchronize();
        dev.copy(pool[idx], w.output(step), w.compute_stream());
        workers.push({step, idx, {}, {}});
        break;
      case pool_level::l3: {
        event copied = dev.make_event();
        dev.copy_async(pool[idx], w.output(step), w.compute_stream());
        copied.record(w.compute_stream());
        monitor.push({step, idx, {}, std::move(copied)});
        break;
      }
      case pool_level::l4: {
        computed.record(w.compute_stream());
        egress.wait(computed);
        event copied = dev.make_event();
        dev.copy_async(pool[idx], w.output(step), egress);
        copied.record(egress);
        w.output_copied(step, egress);
        monitor.push({step, idx, {}, std::move(copied)});
        break;
      }
    }
  }
  monitor.drain();
  workers.drain();
  w.end_timing(row);
}

// ferry: the egress pipeline, its sink doing the same processing on every chunk as it arrives.
void run_ferry(device& dev, const egress_config& cfg, workload& w, egress_row& row, processor& proc) {
  const egress::options opts = ferry_options(cfg);
  auto sink = std::make_shared<egress::callback_sink>(
      [&proc](const egress::output_chunk& c) { proc.process(c.bytes, seed_of(static_cast<int>(c.tag)), c.offset); });
  egress::pipeline out(dev, sink, opts);
  row.pin_seconds = out.stats().pin_seconds;
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) {
      out.flush();
      w.begin_timing();
    }
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
    w.output_copied(step, out.submit(w.output(step), w.compute_stream(), static_cast<std::uint64_t>(step)));
  }
  out.flush();
  w.end_timing(row);
  out.close();
}

}  // namespace

host_device_options ladder_host_options() {
  host_device_options o;
  constexpr double slower = 24;
  o.h2d_gbps /= slower;
  o.d2h_gbps /= slower;
  o.pageable_h2d_gbps /= slower;
  o.pageable_d2h_gbps /= slower;
  o.duplex_gbps /= slower;
  o.d2d_gbps /= slower;
  return o;
}

egress_config default_egress_config(backend b) {
  egress_config c;
  if (b == backend::host) {
    c.batch = 4;
    c.height = 128;
    c.width = 128;                       // 5.25 MiB per output
    c.compute = std::chrono::milliseconds(20);
    c.workers = 8;  // they mostly sleep (process_ms_per_mib): as many as on cuda
    c.pool_buffers = 3;
    c.slot_bytes = 1 * MiB;
    c.slots = 16;
    c.steps = 10;
    // With the ladder link (ladder_host_options), processing one output on one thread costs a third of a
    // step's compute and the blocking pageable copy about half a step, the order of the cuda ladder on the
    // H200 machine (checking a 1.41 GB output: 233 ms; copying it into fresh pageable memory: 876 ms;
    // compute: 165 ms).
    c.process_ms_per_mib = 1.15;
  }
  return c;
}

const std::vector<level_info>& egress_levels() {
  static const std::vector<level_info> levels{
      {"ideal", "compute only: the same model steps with no output transfer", "the ceiling",
       "compute_bound"},
      {"L0", "compute; blocking copy into a fresh pageable buffer; process inline",
       "first the blocking copy into fresh pageable memory (876 ms per step on the H200), then the inline "
       "processing the GPU idles through (233 ms), which the next level moves to workers",
       "sync_copy"},
      {"L1", "as L0, processing on N worker threads",
       "each step still allocates a fresh buffer (page faults) and copies it with a blocking pageable copy",
       "sync_copy"},
      {"L2", "pool of reusable host buffers behind a free list; blocking copy",
       "the copy is pageable and blocking, so copy and compute run one after the other",
       "sync_copy"},
      {"L3", "asynchronous copy on the compute stream + event + monitor thread, pool not really pinned",
       "the pool lost its pinning (as the reference's share_memory_()), so each copy is a blocking pageable "
       "copy serialized with compute",
       "pageable_async_copy"},
      {"L4", "copy on an egress stream that waits on the compute stream, pool not really pinned",
       "still pageable: the host blocks in every copy, so step N+1 is queued only after copy N",
       "pageable_async_copy"},
      {"L4-pinned", "L4 with the pool really pinned (the reference's fix)",
       "compute in steady state; but whole-output buffers are processed only once all of an output arrived, "
       "so the last outputs' processing trails the last step, and the pool pins whole outputs up front",
       "compute_bound"},
      {"ferry", "ferry::egress: slot-sized chunks on an egress stream into a pinned slot ring, N sink workers",
       "the compute time itself when the sink keeps up; else the sink",
       "compute_bound"},
  };
  return levels;
}

const egress_row* egress_result::find(const std::string& level) const noexcept {
  for (const auto& r : rows)
    if (r.level == level) return &r;
  return nullptr;
}

egress_result run_egress(device& dev, const egress_config& cfg, progress_fn progress) {
  FERRY_EXPECTS(cfg.output_bytes() > 0, "egress bench shape has a zero dimension; every dimension must be >= 1");
  FERRY_EXPECTS(cfg.steps >= 1, fmt::format("egress bench steps is {}; at least 1 timed step is needed", cfg.steps));
  FERRY_EXPECTS(cfg.warmup >= 0, fmt::format("egress bench warmup is {}; it cannot be negative", cfg.warmup));
  FERRY_EXPECTS(cfg.workers >= 1 && cfg.pool_buffers >= 1,
                fmt::format("egress bench needs at least 1 worker and 1 pool buffer (got {} and {})", cfg.workers,
                            cfg.pool_buffers));
  for (const auto& level : cfg.levels) {
    const auto& known = egress_levels();
    FERRY_EXPECTS(std::any_of(known.begin(), known.end(), [&](const level_info& l) { return l.name == level; }),
                  fmt::format("unknown egress level \"{}\": expected ideal, L0, L1, L2, L3, L4, L4-pinned or ferry",
                              level));
  }
  auto say = [&](const std::string& line) {
    if (progress != nullptr) progress(line);
  };

  egress_result result;
  result.device = dev.info();
  result.config = cfg;
  result.probed_d2h_gbps = probed_d2h(dev, cfg, progress);

  double ideal = 0;
  for (const auto& level : cfg.levels) {
    say(fmt::format("{}: {} warm-up + {} timed steps, {} output per step", level, cfg.warmup, cfg.steps,
                    format_bytes(cfg.output_bytes())));
    FERRY_RANGE("bench level", trace::color::blue);
    egress_row row;
    row.level = level;
    processor proc(cfg.check, cfg.process_ms_per_mib);
    std::optional<level_trace> traced;
    {
      workload w(dev, cfg, level);
      if (level == "ideal") run_ideal(cfg, w, row);
      else if (level == "L0") run_l0(dev, cfg, w, row, proc);
      else if (level == "L1") run_l1(dev, cfg, w, row, proc);
      else if (level == "L2") run_pool(dev, cfg, w, row, proc, pool_level::l2, false);
      else if (level == "L3") run_pool(dev, cfg, w, row, proc, pool_level::l3, false);
      else if (level == "L4") run_pool(dev, cfg, w, row, proc, pool_level::l4, false);
      else if (level == "L4-pinned") run_pool(dev, cfg, w, row, proc, pool_level::l4, true);
      else run_ferry(dev, cfg, w, row, proc);
      traced = w.tracer().finish(0, result.probed_d2h_gbps);
    }
    std::tie(row.bottleneck, row.finding) = keep_trace(std::move(traced), result.traces);
    const bool moves = level != "ideal";
    row.bytes = moves ? cfg.output_bytes() * static_cast<std::uint64_t>(cfg.steps) : 0;
    row.d2h_gbps = row.seconds > 0 ? static_cast<double>(row.bytes) / row.seconds / 1e9 : 0;
    row.link_fraction = result.probed_d2h_gbps > 0 ? row.d2h_gbps / result.probed_d2h_gbps : 0;
    row.checked_bytes = proc.checked();
    row.mismatches = proc.mismatches();
    if (moves) {
      // Warm-up outputs are processed too; every output of every step must have been seen in full.
      const std::uint64_t expected = cfg.output_bytes() * static_cast<std::uint64_t>(cfg.warmup + cfg.steps);
      if (row.checked_bytes != expected) {
        throw logic_error(fmt::format("egress bench level {} processed {} bytes, expected {}: outputs were lost",
                                      level, row.checked_bytes, expected));
      }
    }
    if (level == "ideal") ideal = row.steps_per_s;
    result.rows.push_back(row);
  }
  for (auto& r : result.rows) r.ratio_to_ideal = ideal > 0 ? r.steps_per_s / ideal : 0;
  return result;
}

pure_copy_result run_egress_pure_copy(device& dev, const egress_config& cfg, int outputs, progress_fn progress,
                                      clock_type::time_point deadline) {
  FERRY_EXPECTS(outputs >= 1, fmt::format("pure copy of {} outputs; at least 1 is needed", outputs));
  auto say = [&](const std::string& line) {
    if (progress != nullptr) progress(line);
  };
  pure_copy_result r;
  r.device = dev.info();
  r.output_bytes = cfg.output_bytes();
  r.outputs = outputs;
  r.probed_d2h_gbps = probed_d2h(dev, cfg, progress);
  buffer out = dev.alloc_device(cfg.output_bytes());
  stream producer = dev.make_stream();
  constexpr std::uint64_t seed = 77;
  dev.fill_pattern_async(out, seed, producer);
  producer.synchronize();

  processor proc(cfg.check, 0);  // the copy path alone: no modelled processing
  const egress::options opts = ferry_options(cfg);
  auto sink = std::make_shared<egress::callback_sink>(
      [&proc](const egress::output_chunk& c) { proc.process(c.bytes, seed, c.offset); });
  egress::pipeline pipe(dev, sink, opts);
  say(fmt::format("pure copy: {} x {} through ferry::egress", outputs, format_bytes(cfg.output_bytes())));
  static_cast<void>(pipe.submit(out, producer, 0));  // warm-up: the output is never rewritten
  pipe.flush();
  const egress::pipeline_stats before = pipe.stats();
  const auto t0 = clock_type::now();
  int submitted = 0;
  for (; submitted < outputs && clock_type::now() < deadline; ++submitted) {
    static_cast<void>(pipe.submit(out, producer, static_cast<std::uint64_t>(submitted + 1)));
  }
  pipe.flush();
  r.window_start = t0;
  r.window_end = clock_type::now();
  r.seconds = std::chrono::duration<double>(r.window_end - t0).count();
  outputs = submitted;
  r.outputs = submitted;
  const egress::pipeline_stats after = pipe.stats();
  pipe.close();
  const double bytes = static_cast<double>(cfg.output_bytes()) * outputs;
  r.gbps = bytes / r.seconds / 1e9;
  const double copy_s = after.copy_seconds - before.copy_seconds;
  r.copy_gbps = copy_s > 0 ? bytes / copy_s / 1e9 : 0;
  r.link_fraction = r.probed_d2h_gbps > 0 ? r.gbps / r.probed_d2h_gbps : 0;
  r.mismatches = proc.mismatches();
  const std::uint64_t expected = cfg.output_bytes() * static_cast<std::uint64_t>(outputs + 1);
  if (proc.checked() != expected) {
    throw logic_error(fmt::format("pure copy processed {} bytes, expected {}: outputs were lost", proc.checked(),
                                  expected));
  }
  return r;
}

std::string format_table(const egress_result& r) {
  std::string out = fmt::format(
      "egress ladder on {} ({}): output {} per step, compute {:.1f} ms per step, probed pinned D2H {:.2f} GB/s\n\n",
      r.device.name, to_string(r.device.kind), format_bytes(r.config.output_bytes()),
      std::chrono::duration<double, std::milli>(r.config.compute).count(), r.probed_d2h_gbps);
  out += fmt::format("{:<10} {:>8} {:>8} {:>9} {:>7} {:>8} {:>10} {:>6}\n", "level", "steps/s", "x ideal", "D2H GB/s",
                     "% link", "GPU idle", "mismatch", "steps");
  for (const auto& row : r.rows) {
    out += fmt::format("{:<10} {:>8.3f} {:>8.3f} {:>9.2f} {:>6.1f}% {:>7.1f}% {:>10} {:>6}\n", row.level,
                       row.steps_per_s, row.ratio_to_ideal, row.d2h_gbps, row.link_fraction * 100, row.gpu_idle * 100,
                       row.mismatches, row.steps);
  }
  out += "\n";
  for (const auto& row : r.rows) {
    for (const auto& l : egress_levels()) {
      if (l.name == row.level) out += fmt::format("{:<10} {}; bound: {}\n", l.name, l.what, l.bottleneck);
    }
  }
  out += format_findings(r.traces, egress_levels());
  return out;
}

}  // namespace ferry::bench
