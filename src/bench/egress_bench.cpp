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
#include <vector>

#include "ferry/core/bounded_queue.hpp"
#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/core/worker_pool.hpp"
#include "ferry/egress/egress.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

// Step i's output carries seed i + 1, so an output delivered for the wrong step fails its check.
std::uint64_t seed_of(int step) { return static_cast<std::uint64_t>(step) + 1; }

// The host work every level does on every delivered byte: the check against the pattern, or a checksum
// when checking is off. Counts checked bytes and wrong outputs; safe from many threads.
class processor {
 public:
  processor(bool check, double extra_ms_per_mib, bool inject_wrong_byte = false)
      : check_(check), extra_ms_per_mib_(extra_ms_per_mib), inject_(inject_wrong_byte) {}

  void process(std::span<const std::byte> bytes, std::uint64_t seed, std::uint64_t offset) {
    FERRY_RANGE("process output", trace::color::orange);
    if (extra_ms_per_mib_ > 0) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<std::int64_t>(
          extra_ms_per_mib_ * 1e6 * static_cast<double>(bytes.size()) / (1 << 20))));
    }
    if (check_) {
      std::vector<std::byte> flipped;
      if (inject_ && !bytes.empty() && !injected_.exchange(true)) {
        flipped.assign(bytes.begin(), bytes.end());
        flipped[flipped.size() / 2] ^= std::byte{1};
        bytes = flipped;
      }
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
  bool inject_;
  std::atomic<bool> injected_{false};
  std::atomic<std::uint64_t> checked_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> sink_{0};  // keeps the checksums observable, so they are computed
};

// The synthetic model every level shares: two device output buffers (the model writes step i into
// out[i % 2]) on the compute stream, its steps timed by the level's window.
class workload {
 public:
  workload(device& dev, const egress_options& cfg, level_window& window, processor& proc)
      : dev_(dev),
        cfg_(cfg),
        window_(window),
        proc_(proc),
        compute_(dev.make_stream()),
        input_(dev.alloc_device(cfg.input_bytes())) {
    for (auto& o : out_) o = dev.alloc_device(cfg.output_bytes());
    for (auto& f : out_free_) f = dev.make_event();
    dev.fill_pattern_async(input_, 0, compute_);
    compute_.synchronize();
  }

  [[nodiscard]] stream_view compute_stream() const { return compute_.view(); }
  [[nodiscard]] const buffer& output(int step) const { return out_[step % 2]; }
  [[nodiscard]] int total_steps() const { return window_.total_steps(); }
  /// The host processing every level does on every delivered byte.
  [[nodiscard]] processor& proc() const noexcept { return proc_; }

  /// Queues step `step` of the model on the compute stream: it first waits until the output buffer it
  /// overwrites has been copied out (when the level said so with output_copied).
  void compute(int step) {
    FERRY_RANGE("model step", trace::color::green);
    stream_view s = compute_.view();
    event& freed = out_free_[step % 2];
    if (freed.recorded()) s.wait(freed);
    window_.compute_started(step, s);
    dev_.spin_async(cfg_.compute, s);
    dev_.fill_pattern_async(out_[step % 2], seed_of(step), s);
    window_.compute_done(step, s);
  }

  /// The level's copy out of step `step`'s buffer is queued on `s`: the model waits for it before
  /// writing that buffer again.
  void output_copied(int step, stream_view s) { out_free_[step % 2].record(s); }
  /// As above, with an event that completes when the copy is done (egress::pipeline::submit's).
  void output_copied(int step, event copied) { out_free_[step % 2] = std::move(copied); }

  void begin_timing() { window_.begin(); }
  /// Closes the window and fills the row's times; call after the last output was processed.
  void end_timing(ladder_row& row) { window_.end(row); }

 private:
  device& dev_;
  const egress_options& cfg_;
  level_window& window_;
  processor& proc_;
  stream compute_;
  buffer input_;
  buffer out_[2];
  event out_free_[2];
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
  worker_stage(const char* name, std::size_t workers, std::size_t capacity,
               std::function<void(work_item&)> fn)
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
egress::options ferry_options(const egress_options& cfg) {
  egress::options opts;
  opts.slot_bytes = cfg.slot_bytes;
  opts.slots = cfg.slots;
  opts.sink_workers = cfg.workers;
  opts.order = delivery::as_completed;
  return opts;
}

void run_ideal(const egress_options& cfg, workload& w, ladder_row& row) {
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step);
  }
  w.end_timing(row);
}

// L0: compute, a blocking copy into a freshly allocated pageable buffer, and processing inline.
void run_l0(device& dev, const egress_options& cfg, workload& w, ladder_row& row, processor& proc) {
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
void run_l1(device& dev, const egress_options& cfg, workload& w, ladder_row& row, processor& proc) {
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
void run_pool(device& dev, const egress_options& cfg, workload& w, ladder_row& row, processor& proc,
              pool_level level, bool pinned) {
  const std::uint64_t n = cfg.output_bytes();
  std::vector<buffer> pool;
  const auto t_pin = steady_clock::now();
  for (std::size_t i = 0; i < cfg.pool_buffers; ++i) {
    pool.push_back(pinned ? dev.alloc_pinned(n) : dev.alloc_pageable(n));
    std::memset(pool.back().host_bytes(), 0, n);  // fault the pages in before timing, as a real pool would
  }
  if (pinned) row.set_extra("pin_seconds", seconds_since(t_pin));
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
void run_ferry(device& dev, const egress_options& cfg, workload& w, ladder_row& row, processor& proc) {
  const egress::options opts = ferry_options(cfg);
  auto sink = std::make_shared<egress::callback_sink>([&proc](const egress::output_chunk& c) {
    proc.process(c.bytes, seed_of(static_cast<int>(c.tag)), c.offset);
  });
  egress::pipeline out(dev, sink, opts);
  row.set_extra("pin_seconds", out.stats().pin_seconds);
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

// The table's columns after the standard ones.
std::vector<ladder_column> columns() {
  ladder_column steps{"steps", 6, 0, false, [](const ladder_row& r) { return r.steps * 1.0; }};
  return standard_columns(copy_direction::device_to_host, {wrong_column(10), std::move(steps)});
}

using level_args = level_context<egress_options, workload>;

// The ladder's levels, in order: what each does, what bounds it, the analyzer's rule for that
// bottleneck, and its run function.
const level_table_of<level_args>& level_table() {
  static const level_table_of<level_args> table{
      {{"ideal", "compute only: the same model steps with no output transfer", "the ceiling",
        "compute_bound"},
       [](const level_args& a) { run_ideal(a.cfg, a.w, a.row); }},
      {{"L0", "compute; blocking copy into a fresh pageable buffer; process inline",
        "first the blocking copy into fresh pageable memory, then the inline processing the GPU idles "
        "through, which the next level moves to workers",
        "sync_copy"},
       [](const level_args& a) { run_l0(a.dev, a.cfg, a.w, a.row, a.w.proc()); }},
      {{"L1", "as L0, processing on N worker threads",
        "each step still allocates a fresh buffer (page faults) and copies it with a blocking pageable copy",
        "sync_copy"},
       [](const level_args& a) { run_l1(a.dev, a.cfg, a.w, a.row, a.w.proc()); }},
      {{"L2", "pool of reusable host buffers behind a free list; blocking copy",
        "the copy is pageable and blocking, so copy and compute run one after the other", "sync_copy"},
       [](const level_args& a) { run_pool(a.dev, a.cfg, a.w, a.row, a.w.proc(), pool_level::l2, false); }},
      {{"L3", "asynchronous copy on the compute stream + event + monitor thread, pool not really pinned",
        "the pool lost its pinning (as the reference's share_memory_()), so each copy is a blocking pageable "
        "copy serialized with compute",
        "pageable_async_copy"},
       [](const level_args& a) { run_pool(a.dev, a.cfg, a.w, a.row, a.w.proc(), pool_level::l3, false); }},
      {{"L4", "copy on an egress stream that waits on the compute stream, pool not really pinned",
        "still pageable: the host blocks in every copy, so step N+1 is queued only after copy N",
        "pageable_async_copy"},
       [](const level_args& a) { run_pool(a.dev, a.cfg, a.w, a.row, a.w.proc(), pool_level::l4, false); }},
      {{"L4-pinned", "L4 with the pool really pinned (the reference's fix)",
        "compute in steady state; but whole-output buffers are processed only once all of an output arrived, "
        "so the last outputs' processing trails the last step, and the pool pins whole outputs up front",
        "compute_bound"},
       [](const level_args& a) { run_pool(a.dev, a.cfg, a.w, a.row, a.w.proc(), pool_level::l4, true); }},
      {{"ferry",
        "ferry::egress: slot-sized chunks on an egress stream into a pinned slot ring, N sink workers",
        "the compute time itself when the sink keeps up; else the sink", "compute_bound"},
       [](const level_args& a) { run_ferry(a.dev, a.cfg, a.w, a.row, a.w.proc()); }},
  };
  return table;
}

}  // namespace

const ladder_spec& egress_spec() {
  static const ladder_spec spec{
      "egress", copy_direction::device_to_host, "output", "bytes", infos_of(level_table()), 10, columns(),
      {}};
  return spec;
}

const std::vector<level_info>& egress_levels() { return egress_spec().levels; }

egress_options::egress_options()
    : ladder_options(std::chrono::milliseconds(165), names_of(egress_levels())) {}

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

egress_options default_egress_options(backend b) {
  egress_options c;
  if (b == backend::host) {
    c.set_shape({4, c.classes, 128, 128});  // 5.25 MiB per output
    c.compute = std::chrono::milliseconds(20);
    c.workers = 8;  // they mostly sleep (process_ms_per_mib): as many as on cuda
    c.pool_buffers = 3;
    c.slot_bytes = 1 * MiB;
    c.slots = 16;
    c.steps = 10;
    // With the ladder link (ladder_host_options), processing one output on one thread costs a third of a
    // step's compute and the blocking pageable copy about half a step: the proportions of the cuda ladder
    // at the reference shape (docs/PERFORMANCE.md).
    c.process_ms_per_mib = 1.15;
  }
  return c;
}

egress_options default_pure_copy_options(backend b) {
  egress_options c = default_egress_options(b);
  if (b == backend::cuda) {
    c.slot_bytes = 8 * MiB;
    c.slots = 48;
    const unsigned cores = std::thread::hardware_concurrency();
    c.workers = cores > 1 ? cores - 1 : 1;
  }
  return c;
}

egress_options default_both_ways_egress_options(backend b) {
  egress_options c = default_pure_copy_options(b);
  const unsigned cores = std::thread::hardware_concurrency();
  c.workers = cores > 2 ? cores - 2 : 1;
  return c;
}

// The JSON fields of the config and of a pure copy's result (nlohmann's to_json, found by ADL).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(egress_options, batch, classes, height, width, input_channels,
                                   pool_buffers, slot_bytes, slots)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(pure_copy_result, outputs, output_bytes, seconds, gbps, copy_gbps,
                                   probed_d2h_gbps, link_fraction, mismatches)

egress_result run_egress(device& dev, const egress_options& cfg, progress_fn progress) {
  FERRY_EXPECTS(cfg.output_bytes() > 0,
                "egress bench shape has a zero dimension; every dimension must be >= 1");
  FERRY_EXPECTS(cfg.pool_buffers >= 1,
                fmt::format("egress bench needs at least 1 pool buffer (got {})", cfg.pool_buffers));
  const auto& table = level_table();
  auto run = [&](std::size_t index, level_window& window, ladder_row& row) {
    processor proc(cfg.check, cfg.process_ms_per_mib, cfg.inject_wrong_byte);
    row.set_extra("pin_seconds", 0);
    {
      workload w(dev, cfg, window, proc);
      table[index].run({dev, cfg, w, row});
    }
    row.checked = proc.checked();
    row.wrong = proc.mismatches();
    if (row.level != ideal_level) {
      // Warm-up outputs are processed too; every output of every step must have been seen in full.
      const std::uint64_t expected = cfg.output_bytes() * static_cast<std::uint64_t>(cfg.warmup + cfg.steps);
      if (row.checked != expected) {
        throw logic_error(
            fmt::format("egress bench level {} processed {} bytes, expected {}: outputs were lost", row.level,
                        row.checked, expected));
      }
    }
  };
  return run_ladder_as<egress_result>(dev, egress_spec(), cfg, cfg.output_bytes(), run, progress);
}

pure_copy_result run_egress_pure_copy(device& dev, const egress_options& cfg, int outputs,
                                      progress_fn progress, start_line* together) {
  FERRY_EXPECTS(outputs >= 1, fmt::format("pure copy of {} outputs; at least 1 is needed", outputs));
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  pure_copy_result r;
  r.device = dev.info();
  r.output_bytes = cfg.output_bytes();
  r.outputs = outputs;
  r.probed_d2h_gbps = probe::pinned_ceiling(dev, copy_direction::device_to_host, cfg.output_bytes(),
                                            cfg.probed_gbps, progress);
  buffer out = dev.alloc_device(cfg.output_bytes());
  stream producer = dev.make_stream();
  constexpr std::uint64_t seed = 77;
  dev.fill_pattern_async(out, seed, producer);
  producer.synchronize();

  processor proc(cfg.check, 0, cfg.inject_wrong_byte);  // the copy path alone: no modelled processing
  const egress::options opts = ferry_options(cfg);
  auto sink = std::make_shared<egress::callback_sink>(
      [&proc](const egress::output_chunk& c) { proc.process(c.bytes, seed, c.offset); });
  egress::pipeline pipe(dev, sink, opts);
  say(fmt::format("pure copy: {} x {} through ferry::egress", outputs, format_bytes(cfg.output_bytes())));
  static_cast<void>(pipe.submit(out, producer, 0));  // warm-up: the output is never rewritten
  pipe.flush();
  const egress::pipeline_stats before = pipe.stats();
  const auto t0 = together != nullptr ? together->arrive() : steady_clock::now();
  const auto deadline = together != nullptr ? together->deadline() : steady_clock::time_point::max();
  int submitted = 0;
  // At least one output is timed, however late the set-up made this run.
  for (; submitted < outputs && (submitted == 0 || steady_clock::now() < deadline); ++submitted) {
    static_cast<void>(pipe.submit(out, producer, static_cast<std::uint64_t>(submitted) + 1));
  }
  pipe.flush();
  r.window_start = t0;
  r.window_end = steady_clock::now();
  r.seconds = std::chrono::duration<double>(r.window_end - t0).count();
  outputs = submitted;
  r.outputs = submitted;
  const egress::pipeline_stats after = pipe.stats();
  pipe.close();
  const std::uint64_t bytes = cfg.output_bytes() * static_cast<std::uint64_t>(outputs);
  r.gbps = gb_per_s(bytes, r.seconds);
  r.copy_gbps = gb_per_s(bytes, after.copy_seconds - before.copy_seconds);
  r.link_fraction = r.probed_d2h_gbps > 0 ? r.gbps / r.probed_d2h_gbps : 0;
  r.mismatches = proc.mismatches();
  const std::uint64_t expected = cfg.output_bytes() * static_cast<std::uint64_t>(outputs + 1);
  if (proc.checked() != expected) {
    throw logic_error(fmt::format("pure copy processed {} bytes, expected {}: outputs were lost",
                                  proc.checked(), expected));
  }
  return r;
}

std::string format_text(const pure_copy_result& r) {
  return fmt::format(
      "pure copy on {}: {} x {} in {:.3f} s = {:.2f} GB/s end to end ({:.2f} GB/s of copies), "
      "{:.1f}% of the probed pinned D2H {:.2f} GB/s; {} mismatches\n",
      r.device.name, r.outputs, format_bytes(r.output_bytes), r.seconds, r.gbps, r.copy_gbps,
      r.link_fraction * 100, r.probed_d2h_gbps, r.mismatches);
}

nlohmann::json to_json(const pure_copy_result& r, const egress_options& cfg, const run_stamp& stamp) {
  nlohmann::json j = stamp_json("ferry bench egress --pure-copy", stamp, r.device);
  j.update(nlohmann::json(r));
  j["config"] = ladder_options_json(egress_spec(), cfg, cfg, cfg.output_bytes());
  return j;
}

}  // namespace ferry::bench
