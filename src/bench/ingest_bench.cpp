#include "ferry/bench/ingest_bench.hpp"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <exception>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/ingest/ingest.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::chrono::nanoseconds decode_per_sample(const ingest_config& cfg) {
  return std::chrono::nanoseconds(
      static_cast<std::int64_t>(cfg.make_ms_per_mib * 1e6 * static_cast<double>(cfg.image_bytes()) / (1 << 20)));
}

// Sample j of batch `step` (every level makes the same samples): its image is the pattern of this seed,
// its label the dataset index.
std::uint64_t sample_seed(std::uint64_t step, std::size_t j, std::size_t batch) {
  return mix64(step * batch + j + 1);
}

// A batch in host memory: images of every sample, then labels (ferry's loader lays fields out alike).
struct batch_layout {
  std::uint64_t image_bytes;
  std::size_t batch;
  std::chrono::nanoseconds decode{0};  // modelled decode time per sample (ingest_config::make_ms_per_mib)
  [[nodiscard]] std::uint64_t images() const noexcept { return image_bytes * batch; }
  [[nodiscard]] std::uint64_t labels() const noexcept { return sizeof(std::int64_t) * batch; }
};

void make_sample(std::span<std::byte> image, std::span<std::byte> label, std::uint64_t step, std::size_t j,
                 std::size_t batch, std::chrono::nanoseconds decode) {
  if (decode.count() > 0) std::this_thread::sleep_for(decode);
  fill_pattern(image, sample_seed(step, j, batch));
  const std::int64_t index = static_cast<std::int64_t>(step * batch + j);
  std::memcpy(label.data(), &index, sizeof index);
}

// Fills samples [from, to) of batch `step` into a contiguous images+labels buffer.
void make_samples(std::byte* base, const batch_layout& l, std::uint64_t step, std::size_t from, std::size_t to) {
  FERRY_RANGE("make samples", trace::color::yellow);
  for (std::size_t j = from; j < to; ++j) {
    make_sample({base + j * l.image_bytes, l.image_bytes}, {base + l.images() + j * 8, 8}, step, j, l.batch, l.decode);
  }
}

// What the device's checksums of batch `step` must be: images, then labels.
std::pair<std::uint64_t, std::uint64_t> expected_checksums(const batch_layout& l, std::uint64_t step) {
  std::uint64_t images = 0, labels = 0;
  for (std::size_t j = 0; j < l.batch; ++j) {
    images += pattern_checksum(sample_seed(step, j, l.batch), l.image_bytes, j * l.image_bytes / 8);
    labels += checksum_term(step * l.batch + j, j);
  }
  return {images, labels};
}

// The training step and the accounting every level shares: the compute stream, the per-step checksums
// (images and labels) written to device memory, timing events around each step's compute.
class workload {
 public:
  workload(device& dev, const ingest_config& cfg, const std::string& level)
      : dev_(dev),
        cfg_(cfg),
        tracer_(dev, cfg.trace, "ingest", level),
        layout_{cfg.image_bytes(), cfg.batch, decode_per_sample(cfg)},
        compute_(dev.make_stream()),
        sums_(dev.alloc_device(16 * static_cast<std::size_t>(cfg.warmup + cfg.steps))) {
    for (int i = 0; i < total_steps(); ++i) {
      starts_.push_back(dev.make_timing_event());
      stops_.push_back(dev.make_timing_event());
    }
  }

  [[nodiscard]] stream_view compute_stream() const { return compute_.view(); }
  [[nodiscard]] int total_steps() const { return cfg_.warmup + cfg_.steps; }
  [[nodiscard]] level_tracer& tracer() noexcept { return tracer_; }
  [[nodiscard]] const batch_layout& layout() const { return layout_; }

  /// Queues training step `step` on the compute stream over the device batch (images, labels).
  void compute(int step, mem_view images, mem_view labels) {
    FERRY_RANGE("train step", trace::color::green);
    stream_view s = compute_.view();
    starts_[step].record(s);
    dev_.spin_async(cfg_.compute, s);
    dev_.checksum_async(images, sums_.view(16 * static_cast<std::size_t>(step), 8), s);
    dev_.checksum_async(labels, sums_.view(16 * static_cast<std::size_t>(step) + 8, 8), s);
    stops_[step].record(s);
  }

  void begin_timing() {
    dev_.synchronize();
    tracer_.begin();
    t0_ = clock_type::now();
    cpu0_ = process_cpu_seconds();
  }

  void end_timing(ingest_row& row) {
    dev_.synchronize();
    row.seconds = seconds_since(t0_);
    tracer_.end();
    row.cpu_ms_per_batch = (process_cpu_seconds() - cpu0_) * 1e3 / cfg_.steps;
    row.steps = cfg_.steps;
    row.steps_per_s = row.seconds > 0 ? cfg_.steps / row.seconds : 0;
    double busy_ms = 0;
    for (int i = cfg_.warmup; i < total_steps(); ++i) busy_ms += dev_.elapsed_ms(starts_[i], stops_[i]);
    row.gpu_idle = row.seconds > 0 ? std::max(0.0, 1.0 - busy_ms * 1e-3 / row.seconds) : 0;
  }

  /// Compares every step's device checksums with the host's expectation for batch batch_of(step).
  template <class F>
  void check(ingest_row& row, F batch_of) {
    buffer back = dev_.alloc_pageable(sums_.size());
    dev_.copy(back, sums_, compute_);
    const int n = total_steps();
    std::vector<std::pair<std::uint64_t, std::uint64_t>> want(static_cast<std::size_t>(n));
    std::vector<std::jthread> threads;
    const unsigned parallel = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    for (unsigned t = 0; t < parallel; ++t) {
      threads.emplace_back([&, t] {
        for (int i = static_cast<int>(t); i < n; i += static_cast<int>(parallel))
          want[static_cast<std::size_t>(i)] = expected_checksums(layout_, batch_of(i));
      });
    }
    threads.clear();
    for (int i = 0; i < n; ++i) {
      std::uint64_t got[2];
      std::memcpy(got, back.host_bytes() + 16 * static_cast<std::size_t>(i), 16);
      if (got[0] != want[static_cast<std::size_t>(i)].first || got[1] != want[static_cast<std::size_t>(i)].second)
        ++row.mismatches;
      ++row.checked_batches;
    }
  }

 private:
  device& dev_;
  const ingest_config& cfg_;
  level_tracer tracer_;
  batch_layout layout_;
  stream compute_;
  buffer sums_;
  std::vector<event> starts_, stops_;
  clock_type::time_point t0_{};
  double cpu0_ = 0;
};

// Host batches made ahead by worker threads, handed out in step order. Each worker makes whole batches
// (steps w, w + N, ...) into a buffer from `take_buffer`; the consumer gets them in order.
class batch_makers {
 public:
  using buffer_source = std::function<std::byte*(int step)>;
  batch_makers(std::size_t workers, int steps, buffer_source take_buffer,
               std::function<void(int step, std::byte* base)> make)
      : steps_(steps) {
    for (std::size_t w = 0; w < workers; ++w) {
      threads_.emplace_back([=, this](std::stop_token stop) {
        trace::name_this_thread("bench-maker");
        for (int step = static_cast<int>(w); step < steps_ && !stop.stop_requested(); step += static_cast<int>(workers)) {
          std::byte* base = take_buffer(step);
          if (base == nullptr) return;
          make(step, base);
          std::lock_guard lock(mu_);
          ready_[step] = base;
          cv_.notify_all();
        }
      });
    }
  }
  batch_makers(const batch_makers&) = delete;
  batch_makers& operator=(const batch_makers&) = delete;

  /// The buffer of batch `step`, once made.
  std::byte* take(int step) {
    FERRY_RANGE("wait for batch", trace::color::red);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return ready_.count(step) != 0; });
    std::byte* b = ready_[step];
    ready_.erase(step);
    return b;
  }

 private:
  int steps_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::byte*> ready_;
  std::vector<std::jthread> threads_;  // last: joined before the members they use go
};

// Host batch buffers for L1..L4, handed out by step: the buffer of step s is step s - count's buffer,
// free once the main thread gave that step back. Handing out by step (not first come) keeps a worker that
// runs ahead from taking the buffer the next step in order needs.
class host_pool {
 public:
  host_pool(device& dev, std::size_t count, std::uint64_t bytes, bool pinned) {
    for (std::size_t i = 0; i < count; ++i) {
      buffers_.push_back(pinned ? dev.alloc_pinned(bytes) : dev.alloc_pageable(bytes));
      std::memset(buffers_.back().host_bytes(), 0, bytes);  // fault the pages in before timing
      next_step_.push_back(static_cast<int>(i));
    }
  }
  std::byte* take(int step) {
    const std::size_t i = static_cast<std::size_t>(step) % buffers_.size();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return next_step_[i] == step; });
    return buffers_[i].host_bytes();
  }
  void give(int step) {
    const std::size_t i = static_cast<std::size_t>(step) % buffers_.size();
    std::lock_guard lock(mu_);
    next_step_[i] = step + static_cast<int>(buffers_.size());
    cv_.notify_all();
  }
  [[nodiscard]] mem_view view(int step) const { return buffers_[static_cast<std::size_t>(step) % buffers_.size()]; }

 private:
  std::vector<buffer> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> next_step_;  // the step each buffer may be taken for next
};

void run_ideal(device& dev, const ingest_config& cfg, workload& w, ingest_row& row) {
  const batch_layout& l = w.layout();
  buffer host = dev.alloc_pinned(cfg.batch_bytes());
  make_samples(host.host_bytes(), l, 0, 0, l.batch);
  buffer on_device = dev.alloc_device(cfg.batch_bytes());
  dev.copy(on_device, host, w.compute_stream());
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step, on_device.view(0, l.images()), on_device.view(l.images(), l.labels()));
  }
  w.end_timing(row);
  if (cfg.check) w.check(row, [](int) { return std::uint64_t{0}; });
}

// L0: the main thread makes each batch in fresh pageable memory, copies it with a blocking copy, computes,
// and waits for the step (a naive loop reads its loss back every step).
void run_l0(device& dev, const ingest_config& cfg, workload& w, ingest_row& row) {
  const batch_layout& l = w.layout();
  buffer on_device = dev.alloc_device(cfg.batch_bytes());
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    buffer fresh = dev.alloc_pageable(cfg.batch_bytes());
    make_samples(fresh.host_bytes(), l, static_cast<std::uint64_t>(step), 0, l.batch);
    dev.copy(on_device, fresh, w.compute_stream());
    w.compute(step, on_device.view(0, l.images()), on_device.view(l.images(), l.labels()));
    w.compute_stream().synchronize();  // the naive loop reads its loss back every step (loss.item())
  }
  w.end_timing(row);
  if (cfg.check) w.check(row, [](int s) { return static_cast<std::uint64_t>(s); });
}

// L1..L3 and L4 share this loop: workers make batches ahead into a host pool; the main thread copies
// each one and computes.
enum class copy_mode {
  blocking_pageable,  // L1: pageable pool, blocking copy on the compute stream
  async_pinned,       // L2: pinned pool, non-blocking copy on the compute stream (copy, then compute)
  copy_stream,        // L3: pinned pool, copy on its own stream one batch ahead; compute waits on an event
};

void run_pooled(device& dev, const ingest_config& cfg, workload& w, ingest_row& row, copy_mode mode, bool collate) {
  const batch_layout& l = w.layout();
  const bool pinned = mode != copy_mode::blocking_pageable;
  host_pool pool(dev, cfg.host_slots, cfg.batch_bytes(), pinned);
  // L4 re-creates a framework loader: workers make samples into their own pageable memory and a collate
  // step copies them into the pinned batch, as a pin-memory thread does.
  std::vector<buffer> sample_scratch;
  if (collate)
    for (std::size_t i = 0; i < cfg.workers; ++i) sample_scratch.push_back(dev.alloc_pageable(cfg.batch_bytes()));
  batch_makers makers(
      cfg.workers, w.total_steps(), [&](int step) { return pool.take(step); },
      [&](int step, std::byte* base) {
        if (!collate) {
          make_samples(base, l, static_cast<std::uint64_t>(step), 0, l.batch);
          return;
        }
        std::byte* scratch = sample_scratch[static_cast<std::size_t>(step) % cfg.workers].host_bytes();
        make_samples(scratch, l, static_cast<std::uint64_t>(step), 0, l.batch);
        FERRY_RANGE("collate", trace::color::purple);
        std::memcpy(base, scratch, cfg.batch_bytes());
      });
  row.worker_threads = cfg.workers;

  const std::size_t device_slots = mode == copy_mode::copy_stream ? cfg.depth : 1;
  std::vector<buffer> on_device;
  std::vector<event> ready, consumed;
  for (std::size_t i = 0; i < device_slots; ++i) {
    on_device.push_back(dev.alloc_device(cfg.batch_bytes()));
    ready.push_back(dev.make_event());
    consumed.push_back(dev.make_event());
  }
  stream copy = dev.make_stream();
  std::vector<std::pair<int, event>> in_flight;  // steps whose host buffers' copies are queued

  // A host buffer returns to the pool only once the copy out of it completed: those already done, and
  // (waiting for it) every one up to step `must`, whose buffer a worker needs next.
  auto give_back_copied = [&](int must) {
    while (!in_flight.empty() && (in_flight.front().first <= must || in_flight.front().second.query())) {
      in_flight.front().second.synchronize();
      pool.give(in_flight.front().first);
      in_flight.erase(in_flight.begin());
    }
  };
  const int slots = static_cast<int>(cfg.host_slots);
  constexpr int all = std::numeric_limits<int>::max();

  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) {
      give_back_copied(all);
      w.begin_timing();
    }
    FERRY_RANGE("step", trace::color::gray);
    give_back_copied(step - slots);
    static_cast<void>(makers.take(step));
    const std::size_t slot = static_cast<std::size_t>(step) % device_slots;
    buffer& target = on_device[slot];
    event copied = dev.make_event();
    switch (mode) {
      case copy_mode::blocking_pageable:
        dev.copy(target, pool.view(step), w.compute_stream());
        pool.give(step);
        break;
      case copy_mode::async_pinned:
        dev.copy_async(target, pool.view(step), w.compute_stream());
        copied.record(w.compute_stream());
        in_flight.emplace_back(step, std::move(copied));
        break;
      case copy_mode::copy_stream:
        if (consumed[slot].recorded()) copy.wait(consumed[slot]);
        dev.copy_async(target, pool.view(step), copy);
        copied.record(copy);
        ready[slot].record(copy);
        w.compute_stream().wait(ready[slot]);
        in_flight.emplace_back(step, std::move(copied));
        break;
    }
    w.compute(step, target.view(0, l.images()), target.view(l.images(), l.labels()));
    if (mode == copy_mode::copy_stream) consumed[slot].record(w.compute_stream());
    give_back_copied(-1);
  }
  w.end_timing(row);
  give_back_copied(all);
  if (cfg.check) w.check(row, [](int s) { return static_cast<std::uint64_t>(s); });
}

// ferry: the loader's workers write samples straight into pinned batch slots; the prefetcher copies
// them on its own stream `depth` batches ahead and hands out device batches the compute stream waits on.
void run_ferry(device& dev, const ingest_config& cfg, workload& w, ingest_row& row) {
  const batch_layout& l = w.layout();
  ingest::loader_options opts;
  opts.fields = {{"image", static_cast<std::size_t>(l.image_bytes)}, {"label", sizeof(std::int64_t)}};
  opts.sampling.dataset_size = static_cast<std::uint64_t>(w.total_steps()) * l.batch;
  opts.sampling.batch_size = l.batch;
  opts.workers = cfg.workers;
  opts.slots = cfg.host_slots;
  opts.epochs = 1;
  ingest::loader data(dev, opts, [&l](const ingest::sample& s, ingest::sample_fields out) {
    make_sample(out[0], out[1], s.batch, s.position, l.batch, l.decode);
  });
  ingest::prefetch_options popts;
  popts.depth = cfg.depth;
  ingest::prefetcher gpu(dev, data, popts);
  row.worker_threads = cfg.workers;
  int step = 0;
  for (ingest::device_batch& b : gpu.batches(w.compute_stream())) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    w.compute(step, b.field(0), b.field(1));
    ++step;
  }
  FERRY_EXPECTS(step == w.total_steps(),
                fmt::format("ferry ingest delivered {} batches, expected {}", step, w.total_steps()));
  w.end_timing(row);
  gpu.close();
  if (cfg.check) w.check(row, [](int s) { return static_cast<std::uint64_t>(s); });
}

}  // namespace

ingest_config default_ingest_config(backend b) {
  ingest_config c;
  if (b == backend::host) {
    c.batch = 8;
    c.height = 128;
    c.width = 128;                            // 1.5 MiB per batch
    c.compute = std::chrono::milliseconds(10);
    c.workers = 2;
    // With the ladder link (ladder_host_options), make each batch cost 90% of a step on one thread, as
    // making the reference's batch does on the H200 machine: the proportions of the cuda ladder.
    c.make_ms_per_mib = 6.0;
  }
  return c;
}

const std::vector<level_info>& ingest_levels() {
  static const std::vector<level_info> levels{
      {"ideal", "compute only: the same steps over a batch already on the device", "the ceiling",
       "compute_bound"},
      {"L0", "one thread makes each batch in fresh pageable memory, blocking copy, compute, wait for the step",
       "the GPU idles while the CPU makes the batch and while the pageable copy runs",
       "gpu_idle"},
      {"L1", "N workers make batches ahead (pageable pool); blocking pageable copy",
       "the blocking copy from pageable memory (staged by the driver) still stalls the GPU every step",
       "sync_copy"},
      {"L2", "pinned pool + non-blocking copy on the compute stream",
       "copy and kernels run one after the other on the one stream",
       "serialized_copy"},
      {"L3", "copy stream: batch N+1 copied while batch N computes; compute waits on an event",
       "little: copies hide behind compute; the loop itself drives the copies",
       "compute_bound"},
      {"L4", "L3 inside a prefetching iterator fed by a framework-style loader (per-sample memory + collate copy)",
       "the extra collate copy costs CPU time per batch",
       "compute_bound"},
      {"ferry", "ferry::ingest: workers write samples straight into pinned slots; prefetcher on its own stream",
       "the compute, when the workers keep up",
       "compute_bound"},
  };
  return levels;
}

const ingest_row* ingest_result::find(const std::string& level) const noexcept {
  for (const auto& r : rows)
    if (r.level == level) return &r;
  return nullptr;
}

ingest_result run_ingest(device& dev, const ingest_config& cfg, progress_fn progress) {
  FERRY_EXPECTS(cfg.batch_bytes() > 0 && cfg.image_bytes() > 0,
                "ingest bench shape has a zero dimension; every dimension must be >= 1");
  FERRY_EXPECTS(cfg.steps >= 1, fmt::format("ingest bench steps is {}; at least 1 timed step is needed", cfg.steps));
  FERRY_EXPECTS(cfg.warmup >= 0, fmt::format("ingest bench warmup is {}; it cannot be negative", cfg.warmup));
  FERRY_EXPECTS(cfg.workers >= 1 && cfg.host_slots >= 1 && cfg.depth >= 1,
                fmt::format("ingest bench needs at least 1 worker, host slot and depth (got {}, {}, {})", cfg.workers,
                            cfg.host_slots, cfg.depth));
  for (const auto& level : cfg.levels) {
    const auto& known = ingest_levels();
    FERRY_EXPECTS(std::any_of(known.begin(), known.end(), [&](const level_info& l) { return l.name == level; }),
                  fmt::format("unknown ingest level \"{}\": expected ideal, L0, L1, L2, L3, L4 or ferry", level));
  }
  auto say = [&](const std::string& line) {
    if (progress != nullptr) progress(line);
  };
  ingest_result result;
  result.device = dev.info();
  result.config = cfg;
  result.probed_h2d_gbps =
      probe::pinned_ceiling(dev, copy_direction::host_to_device, cfg.batch_bytes(), cfg.probed_h2d_gbps, progress);
  double ideal = 0;
  for (const auto& level : cfg.levels) {
    say(fmt::format("{}: {} warm-up + {} timed steps, {} per batch", level, cfg.warmup, cfg.steps,
                    format_bytes(cfg.batch_bytes())));
    FERRY_RANGE("bench level", trace::color::blue);
    ingest_row row;
    row.level = level;
    std::optional<level_trace> traced;
    {
      workload w(dev, cfg, level);
      if (level == "ideal") run_ideal(dev, cfg, w, row);
      else if (level == "L0") run_l0(dev, cfg, w, row);
      else if (level == "L1") run_pooled(dev, cfg, w, row, copy_mode::blocking_pageable, false);
      else if (level == "L2") run_pooled(dev, cfg, w, row, copy_mode::async_pinned, false);
      else if (level == "L3") run_pooled(dev, cfg, w, row, copy_mode::copy_stream, false);
      else if (level == "L4") run_pooled(dev, cfg, w, row, copy_mode::copy_stream, true);
      else run_ferry(dev, cfg, w, row);
      traced = w.tracer().finish(result.probed_h2d_gbps, 0);
    }
    std::tie(row.bottleneck, row.finding) = keep_trace(std::move(traced), result.traces);
    row.bytes = level == "ideal" ? 0 : cfg.batch_bytes() * static_cast<std::uint64_t>(cfg.steps);
    row.h2d_gbps = row.seconds > 0 ? static_cast<double>(row.bytes) / row.seconds / 1e9 : 0;
    row.link_fraction = result.probed_h2d_gbps > 0 ? row.h2d_gbps / result.probed_h2d_gbps : 0;
    if (level == "ideal") ideal = row.steps_per_s;
    result.rows.push_back(row);
  }
  for (auto& r : result.rows) r.ratio_to_ideal = ideal > 0 ? r.steps_per_s / ideal : 0;
  return result;
}

ingest_pure_copy_result run_ingest_pure_copy(device& dev, const ingest_config& cfg, int batches,
                                             progress_fn progress, clock_type::time_point deadline) {
  FERRY_EXPECTS(batches >= 1, fmt::format("pure copy of {} batches; at least 1 is needed", batches));
  ingest_pure_copy_result r;
  r.device = dev.info();
  r.batch_bytes = cfg.batch_bytes();
  r.batches = batches;
  r.probed_h2d_gbps =
      probe::pinned_ceiling(dev, copy_direction::host_to_device, cfg.batch_bytes(), cfg.probed_h2d_gbps, progress);
  const batch_layout l{cfg.image_bytes(), cfg.batch, {}};  // the copy path alone: no modelled decode
  const std::uint64_t slots = cfg.host_slots;
  ingest::loader_options opts;
  opts.fields = {{"image", static_cast<std::size_t>(l.image_bytes)}, {"label", sizeof(std::int64_t)}};
  opts.sampling.dataset_size = static_cast<std::uint64_t>(batches + 1) * l.batch;
  opts.sampling.batch_size = l.batch;
  opts.workers = cfg.workers;
  opts.slots = cfg.host_slots;
  // Batch g lives in slot g % slots, so from the second pass on a slot's images are those of batch
  // g % slots, made on the first pass; only the labels are written again.
  ingest::loader data(dev, opts, [&l, slots](const ingest::sample& s, ingest::sample_fields out) {
    if (s.batch < slots) {
      make_sample(out[0], out[1], s.batch, s.position, l.batch, l.decode);
    } else {
      const std::int64_t index = static_cast<std::int64_t>(s.batch * l.batch + s.position);
      std::memcpy(out[1].data(), &index, sizeof index);
    }
  });
  ingest::prefetch_options popts;
  popts.depth = cfg.depth;
  ingest::prefetcher gpu(dev, data, popts);
  stream consumer = dev.make_stream();
  buffer sums = dev.alloc_device(16 * static_cast<std::size_t>(batches + 1));
  if (progress != nullptr) {
    progress(fmt::format("ingest pure copy: {} x {} through ferry::ingest", batches, format_bytes(cfg.batch_bytes())));
  }
  clock_type::time_point t0{};
  std::uint64_t step = 0;
  for (ingest::device_batch& b : gpu.batches(consumer)) {
    if (step == 1) {
      consumer.synchronize();  // batch 0 is the warm-up
      t0 = clock_type::now();
    }
    dev.checksum_async(b.field(0), sums.view(16 * step, 8), consumer);
    dev.checksum_async(b.field(1), sums.view(16 * step + 8, 8), consumer);
    ++step;
    if (step > 1 && clock_type::now() >= deadline) break;
  }
  consumer.synchronize();
  r.window_start = t0;
  r.window_end = clock_type::now();
  r.seconds = std::chrono::duration<double>(r.window_end - t0).count();
  gpu.close();
  FERRY_EXPECTS(step >= 2 && (step == static_cast<std::uint64_t>(batches + 1) || deadline != clock_type::time_point::max()),
                fmt::format("ingest pure copy delivered {} batches, expected {}", step, batches + 1));
  r.batches = static_cast<int>(step - 1);
  r.gbps = static_cast<double>(cfg.batch_bytes()) * r.batches / r.seconds / 1e9;
  r.link_fraction = r.probed_h2d_gbps > 0 ? r.gbps / r.probed_h2d_gbps : 0;
  buffer back = dev.alloc_pageable(sums.size());
  dev.copy(back, sums, consumer);
  std::vector<std::uint64_t> image_sums(static_cast<std::size_t>(std::min<std::uint64_t>(slots, step)));
  for (std::size_t g = 0; g < image_sums.size(); ++g) image_sums[g] = expected_checksums(l, g).first;
  for (std::uint64_t g = 0; g < step; ++g) {
    std::uint64_t got[2];
    std::memcpy(got, back.host_bytes() + 16 * g, 16);
    std::uint64_t labels = 0;
    for (std::size_t j = 0; j < l.batch; ++j) labels += checksum_term(g * l.batch + j, j);
    if (got[0] != image_sums[g % slots] || got[1] != labels) ++r.mismatches;
  }
  return r;
}

both_ways_result run_both_ways(device& dev, const ingest_config& in_cfg, const egress_config& out_cfg,
                               std::chrono::milliseconds duration, progress_fn progress) {
  both_ways_result r;
  {
    probe::options po = probe::default_options(dev.kind());
    po.measure_pin_cost = false;
    po.iterations = 20;  // the two-way figure varies more from copy to copy than one direction
    if (progress != nullptr) progress("probing both directions at once");
    r.probed_duplex_gbps = probe::run(dev, po).duplex.total_gbps;
  }
  ingest_config in = in_cfg;
  egress_config out = out_cfg;
  if (in.probed_h2d_gbps <= 0) in.probed_h2d_gbps = 1;  // the ratio that matters here is the two-way one
  if (out.probed_d2h_gbps <= 0) out.probed_d2h_gbps = 1;
  // Both sides run until one deadline, far enough out that their set-up (pinning, first fills) is a small
  // part of it, so their timed windows overlap.
  const auto deadline = clock_type::now() + duration;
  std::exception_ptr egress_error;
  std::thread egress_thread([&] {
    try {
      r.egress = run_egress_pure_copy(dev, out, std::numeric_limits<int>::max(), progress, deadline);
    } catch (...) {
      egress_error = std::current_exception();
    }
  });
  try {
    // More batches than any link can move before the deadline (the deadline ends it first); bounded,
    // since every batch's checksum is kept until the end.
    const double seconds = std::chrono::duration<double>(duration).count();
    const int most = static_cast<int>(seconds * 100e9 / static_cast<double>(in.batch_bytes())) + 16;
    r.ingest = run_ingest_pure_copy(dev, in, most, progress, deadline);
  } catch (...) {
    egress_thread.join();
    throw;
  }
  egress_thread.join();
  if (egress_error) std::rethrow_exception(egress_error);
  const auto common = std::min(r.ingest.window_end, r.egress.window_end) -
                      std::max(r.ingest.window_start, r.egress.window_start);
  const auto longer = std::max(r.ingest.window_end, r.egress.window_end) -
                      std::min(r.ingest.window_start, r.egress.window_start);
  r.overlap = std::max(0.0, std::chrono::duration<double>(common).count() / std::chrono::duration<double>(longer).count());
  r.total_gbps = r.ingest.gbps + r.egress.gbps;
  r.link_fraction = r.probed_duplex_gbps > 0 ? r.total_gbps / r.probed_duplex_gbps : 0;
  return r;
}

std::string format_table(const ingest_result& r) {
  std::string out = fmt::format(
      "ingest ladder on {} ({}): batch {} per step, compute {:.1f} ms per step, probed pinned H2D {:.2f} GB/s\n\n",
      r.device.name, to_string(r.device.kind), format_bytes(r.config.batch_bytes()),
      std::chrono::duration<double, std::milli>(r.config.compute).count(), r.probed_h2d_gbps);
  out += fmt::format("{:<7} {:>8} {:>8} {:>9} {:>7} {:>8} {:>7} {:>11} {:>8}\n", "level", "steps/s", "x ideal",
                     "H2D GB/s", "% link", "GPU idle", "workers", "CPU ms/step", "mismatch");
  for (const auto& row : r.rows) {
    out += fmt::format("{:<7} {:>8.3f} {:>8.3f} {:>9.2f} {:>6.1f}% {:>7.1f}% {:>7} {:>11.1f} {:>8}\n", row.level,
                       row.steps_per_s, row.ratio_to_ideal, row.h2d_gbps, row.link_fraction * 100, row.gpu_idle * 100,
                       row.worker_threads, row.cpu_ms_per_batch, row.mismatches);
  }
  out += "\n";
  for (const auto& row : r.rows)
    for (const auto& l : ingest_levels())
      if (l.name == row.level) out += fmt::format("{:<7} {}; bound: {}\n", l.name, l.what, l.bottleneck);
  out += format_findings(r.traces, ingest_levels());
  return out;
}

}  // namespace ferry::bench
