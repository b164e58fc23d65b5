#include "ferry/bench/ingest_bench.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/ingest/ingest.hpp"
#include "ferry/probe/probe.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

std::chrono::nanoseconds decode_per_sample(const ingest_options& cfg) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(
      cfg.make_ms_per_mib * 1e6 * static_cast<double>(cfg.image_bytes()) / (1 << 20)));
}

// CPU time of every thread of the process, summed per role: the main thread is "main", other threads by
// their name without a trailing number ("ingest-load-3" -> "ingest-load"), unnamed ones as the process.
// From /proc/self/task/*/schedstat (nanoseconds on the CPU); empty where /proc does not offer it. A thread
// that ends inside a window is not counted; threads that start inside one count from 0.
std::map<std::string, std::uint64_t> cpu_ns_by_thread_role() {
  std::map<std::string, std::uint64_t> out;
  const std::string self = std::to_string(::getpid());
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream stat(task.path() / "schedstat");
    std::ifstream comm(task.path() / "comm");
    std::uint64_t ns = 0;
    std::string name;
    if (!(stat >> ns) || !std::getline(comm, name)) continue;
    if (task.path().filename() == self) {
      name = "main";
    } else {
      while (!name.empty() &&
             (std::isdigit(static_cast<unsigned char>(name.back())) != 0 || name.back() == '-'))
        name.pop_back();
    }
    out[name] += ns;
  }
  return out;
}

// The process's resource usage: user and system CPU seconds, minor page faults, voluntary and involuntary
// context switches.
std::array<double, 5> process_usage() noexcept {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return {};
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return {secs(u.ru_utime), secs(u.ru_stime), static_cast<double>(u.ru_minflt),
          static_cast<double>(u.ru_nvcsw), static_cast<double>(u.ru_nivcsw)};
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
  std::chrono::nanoseconds decode{0};  // modelled decode time per sample (ingest_options::make_ms_per_mib)
  [[nodiscard]] std::uint64_t images() const noexcept { return image_bytes * batch; }
  [[nodiscard]] std::uint64_t labels() const noexcept { return sizeof(std::int64_t) * batch; }
};

std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// What making samples cost, counted alike at every level: the samples made, and the CPU time of the
// threads that made them, spent inside make_sample (the same function at every level, ferry's included).
struct making_counter {
  std::atomic<std::uint64_t> samples{0};
  std::atomic<std::uint64_t> cpu_ns{0};
};

void make_sample(std::span<std::byte> image, std::span<std::byte> label, std::uint64_t step, std::size_t j,
                 std::size_t batch, std::chrono::nanoseconds decode, making_counter& made) {
  if (decode.count() > 0) std::this_thread::sleep_for(decode);
  const std::uint64_t cpu0 = thread_cpu_ns();
  fill_pattern(image, sample_seed(step, j, batch));
  const std::int64_t index = static_cast<std::int64_t>(step * batch + j);
  std::memcpy(label.data(), &index, sizeof index);
  made.cpu_ns.fetch_add(thread_cpu_ns() - cpu0, std::memory_order_relaxed);
  made.samples.fetch_add(1, std::memory_order_relaxed);
}

// Fills samples [from, to) of batch `step` into a contiguous images+labels buffer.
void make_samples(std::byte* base, const batch_layout& l, std::uint64_t step, std::size_t from,
                  std::size_t to, making_counter& made) {
  FERRY_RANGE("make samples", trace::color::yellow);
  for (std::size_t j = from; j < to; ++j) {
    make_sample({base + j * l.image_bytes, l.image_bytes}, {base + l.images() + j * 8, 8}, step, j, l.batch,
                l.decode, made);
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

// The training step every level shares: the compute stream and the per-step checksums (images and
// labels) written to device memory, its steps timed by the level's window.
class workload {
 public:
  workload(device& dev, const ingest_options& cfg, level_window& window)
      : dev_(dev),
        cfg_(cfg),
        window_(window),
        layout_{cfg.image_bytes(), cfg.batch, decode_per_sample(cfg)},
        compute_(dev.make_stream()),
        sums_(dev.alloc_device(16 * static_cast<std::size_t>(cfg.warmup + cfg.steps))) {}

  [[nodiscard]] stream_view compute_stream() const { return compute_.view(); }
  [[nodiscard]] int total_steps() const { return window_.total_steps(); }
  [[nodiscard]] const batch_layout& layout() const { return layout_; }

  /// Queues training step `step` on the compute stream over the device batch (images, labels).
  void compute(int step, mem_view images, mem_view labels) {
    FERRY_RANGE("train step", trace::color::green);
    stream_view s = compute_.view();
    window_.compute_started(step, s);
    dev_.spin_async(cfg_.compute, s);
    dev_.checksum_async(images, sums_.view(16 * static_cast<std::size_t>(step), 8), s);
    dev_.checksum_async(labels, sums_.view(16 * static_cast<std::size_t>(step) + 8, 8), s);
    window_.compute_done(step, s);
  }

  /// Counts the samples this level makes and their CPU time (pass to make_sample).
  [[nodiscard]] making_counter& made() { return made_; }

  void begin_timing() {
    window_.begin();
    made_at_begin_ = made_.samples.load();
    make_ns_at_begin_ = made_.cpu_ns.load();
    roles_at_begin_ = cpu_ns_by_thread_role();
    usage_at_begin_ = process_usage();
  }
  /// Ends the timed window. Besides the window's figures, per batch made in the window (levels run
  /// different distances ahead, so the batches made in the window, not its steps, are what its CPU time
  /// paid for; per step for a level that makes none in it): cpu_ms_per_batch_made, the process CPU time;
  /// make_cpu_ms_per_batch, the part inside make_sample; cpu_ms_per_batch.<thread role>, the CPU time of
  /// the threads alive at both ends of the window by role, and .ended_threads for those that ended
  /// inside it (a level's sample makers end once they made their last batch); the process's user and
  /// system CPU time, page faults and context switches. cpu_ms_per_batch itself stays what earlier
  /// results called it: an alias of cpu_ms_per_step.
  void end_timing(ladder_row& row) {
    window_.end(row);
    const auto roles = cpu_ns_by_thread_role();
    const auto usage = process_usage();
    const std::uint64_t made_in_window = made_.samples.load() - made_at_begin_;
    const double make_ms = static_cast<double>(made_.cpu_ns.load() - make_ns_at_begin_) * 1e-6;
    const double window_cpu_ms = row.extra("cpu_ms_per_step") * row.steps;
    const double batches = static_cast<double>(made_in_window) / static_cast<double>(layout_.batch);
    const double per = made_in_window > 0 ? batches : row.steps;
    row.set_extra("batches_made_in_window", batches);
    row.set_extra("cpu_ms_per_batch_made", window_cpu_ms / per);
    row.set_extra("make_cpu_ms_per_batch", make_ms / per);
    // Where the window's CPU time went: user or kernel, page faults, sleeps (voluntary switches),
    // preemptions.
    static constexpr std::array<std::pair<const char*, double>, 5> usage_names{
        {{"user_cpu_ms_per_batch", 1e3},
         {"system_cpu_ms_per_batch", 1e3},
         {"page_faults_per_batch", 1},
         {"voluntary_switches_per_batch", 1},
         {"involuntary_switches_per_batch", 1}}};
    for (std::size_t i = 0; i < usage.size(); ++i)
      row.set_extra(usage_names[i].first, (usage[i] - usage_at_begin_[i]) * usage_names[i].second / per);
    double live_ms = 0;
    for (const auto& [role, ns] : roles) {
      const auto before = roles_at_begin_.find(role);
      const std::uint64_t base = before == roles_at_begin_.end() ? 0 : before->second;
      if (ns <= base) continue;
      live_ms += static_cast<double>(ns - base) * 1e-6;
      row.set_extra("cpu_ms_per_batch." + role, static_cast<double>(ns - base) * 1e-6 / per);
    }
    if (!roles.empty())
      row.set_extra("cpu_ms_per_batch.ended_threads", std::max(0.0, window_cpu_ms - live_ms) / per);
  }

  /// Compares every step's device checksums with the host's expectation for batch batch_of(step).
  template <class F>
  void check(ladder_row& row, F batch_of) {
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
      if (got[0] != want[static_cast<std::size_t>(i)].first ||
          got[1] != want[static_cast<std::size_t>(i)].second)
        ++row.wrong;
      ++row.checked;
    }
  }

 private:
  device& dev_;
  const ingest_options& cfg_;
  level_window& window_;
  batch_layout layout_;
  stream compute_;
  buffer sums_;
  making_counter made_;
  std::uint64_t made_at_begin_ = 0;
  std::uint64_t make_ns_at_begin_ = 0;
  std::map<std::string, std::uint64_t> roles_at_begin_;
  std::array<double, 5> usage_at_begin_{};
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
        for (int step = static_cast<int>(w); step < steps_ && !stop.stop_requested();
             step += static_cast<int>(workers)) {
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
  [[nodiscard]] mem_view view(int step) const {
    return buffers_[static_cast<std::size_t>(step) % buffers_.size()];
  }

 private:
  std::vector<buffer> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> next_step_;  // the step each buffer may be taken for next
};

void run_ideal(device& dev, const ingest_options& cfg, workload& w, ladder_row& row) {
  const batch_layout& l = w.layout();
  buffer host = dev.alloc_pinned(cfg.batch_bytes());
  make_samples(host.host_bytes(), l, 0, 0, l.batch, w.made());
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
void run_l0(device& dev, const ingest_options& cfg, workload& w, ladder_row& row) {
  const batch_layout& l = w.layout();
  buffer on_device = dev.alloc_device(cfg.batch_bytes());
  for (int step = 0; step < w.total_steps(); ++step) {
    if (step == cfg.warmup) w.begin_timing();
    FERRY_RANGE("step", trace::color::gray);
    buffer fresh = dev.alloc_pageable(cfg.batch_bytes());
    make_samples(fresh.host_bytes(), l, static_cast<std::uint64_t>(step), 0, l.batch, w.made());
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

void run_pooled(device& dev, const ingest_options& cfg, workload& w, ladder_row& row, copy_mode mode,
                bool collate) {
  const batch_layout& l = w.layout();
  const bool pinned = mode != copy_mode::blocking_pageable;
  host_pool pool(dev, cfg.host_slots, cfg.batch_bytes(), pinned);
  // L4 re-creates a framework loader: workers make samples into their own pageable memory and a collate
  // step copies them into the pinned batch, as a pin-memory thread does.
  std::vector<buffer> sample_scratch;
  if (collate)
    for (std::size_t i = 0; i < cfg.workers; ++i)
      sample_scratch.push_back(dev.alloc_pageable(cfg.batch_bytes()));
  batch_makers makers(
      cfg.workers, w.total_steps(), [&](int step) { return pool.take(step); },
      [&](int step, std::byte* base) {
        if (!collate) {
          make_samples(base, l, static_cast<std::uint64_t>(step), 0, l.batch, w.made());
          return;
        }
        std::byte* scratch = sample_scratch[static_cast<std::size_t>(step) % cfg.workers].host_bytes();
        make_samples(scratch, l, static_cast<std::uint64_t>(step), 0, l.batch, w.made());
        FERRY_RANGE("collate", trace::color::purple);
        std::memcpy(base, scratch, cfg.batch_bytes());
      });
  row.set_extra("worker_threads", static_cast<double>(cfg.workers), true);

  const std::size_t device_slots = mode == copy_mode::copy_stream ? cfg.depth : 1;
  FERRY_EXPECTS(device_slots >= 1, "ingest bench depth is 0; at least 1 device batch is needed");
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
void run_ferry(device& dev, const ingest_options& cfg, workload& w, ladder_row& row) {
  const batch_layout& l = w.layout();
  ingest::loader_options opts;
  opts.fields = {{"image", static_cast<std::size_t>(l.image_bytes)}, {"label", sizeof(std::int64_t)}};
  opts.sampling.dataset_size = static_cast<std::uint64_t>(w.total_steps()) * l.batch;
  opts.sampling.batch_size = l.batch;
  opts.workers = cfg.workers;
  opts.slots = cfg.host_slots;
  opts.epochs = 1;
  making_counter& made = w.made();
  ingest::loader data(dev, opts, [&l, &made](const ingest::sample& s, ingest::sample_fields out) {
    make_sample(out[0], out[1], s.batch, s.position, l.batch, l.decode, made);
  });
  ingest::prefetch_options popts;
  popts.depth = cfg.depth;
  ingest::prefetcher gpu(dev, data, popts);
  row.set_extra("worker_threads", static_cast<double>(cfg.workers), true);
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
  // Times ferry's copier waited for the device (0 when healthy; each wait busy-spins a core on cuda).
  row.set_extra("copier_waits", static_cast<double>(gpu.stats().copier_waits), true);
  if (cfg.check) w.check(row, [](int s) { return static_cast<std::uint64_t>(s); });
}

// The table's columns after the standard ones: sample-making threads, CPU time per batch (the whole
// process's, and inside make_sample), wrong batches.
std::vector<ladder_column> columns() {
  return standard_columns(copy_direction::host_to_device,
                          {extra_column("workers", 7, 0, "worker_threads"),
                           extra_column("CPU ms/batch", 12, 1, "cpu_ms_per_batch_made"),
                           extra_column("make ms/batch", 13, 1, "make_cpu_ms_per_batch"), wrong_column(8)});
}

using level_args = level_context<ingest_options, workload>;

// The ladder's levels, in order: what each does, what bounds it, the analyzer's rule for that
// bottleneck, and its run function.
const level_table_of<level_args>& level_table() {
  static const level_table_of<level_args> table{
      {{"ideal", "compute only: the same steps over a batch already on the device", "the ceiling",
        "compute_bound"},
       [](const level_args& a) { run_ideal(a.dev, a.cfg, a.w, a.row); }},
      {{"L0",
        "one thread makes each batch in fresh pageable memory, blocking copy, compute, wait for the step",
        "the GPU idles while the CPU makes the batch and while the pageable copy runs", "gpu_idle"},
       [](const level_args& a) { run_l0(a.dev, a.cfg, a.w, a.row); }},
      {{"L1", "N workers make batches ahead (pageable pool); blocking pageable copy",
        "the blocking copy from pageable memory (staged by the driver) still stalls the GPU every step",
        "sync_copy"},
       [](const level_args& a) {
         run_pooled(a.dev, a.cfg, a.w, a.row, copy_mode::blocking_pageable, false);
       }},
      {{"L2", "pinned pool + non-blocking copy on the compute stream",
        "copy and kernels run one after the other on the one stream", "serialized_copy"},
       [](const level_args& a) { run_pooled(a.dev, a.cfg, a.w, a.row, copy_mode::async_pinned, false); }},
      {{"L3", "copy stream: batch N+1 copied while batch N computes; compute waits on an event",
        "little: copies hide behind compute; the loop itself drives the copies", "compute_bound"},
       [](const level_args& a) { run_pooled(a.dev, a.cfg, a.w, a.row, copy_mode::copy_stream, false); }},
      {{"L4",
        "L3 inside a prefetching iterator fed by a framework-style loader (per-sample memory + collate copy)",
        "the extra collate copy costs CPU time per batch", "compute_bound"},
       [](const level_args& a) { run_pooled(a.dev, a.cfg, a.w, a.row, copy_mode::copy_stream, true); }},
      {{"ferry",
        "ferry::ingest: workers write samples straight into pinned slots; prefetcher on its own stream",
        "the compute, when the workers keep up", "compute_bound"},
       [](const level_args& a) { run_ferry(a.dev, a.cfg, a.w, a.row); }},
  };
  return table;
}

}  // namespace

ingest_options::ingest_options() : ladder_options(std::chrono::milliseconds(66), names_of(ingest_levels())) {}

ingest_options default_ingest_options(backend b) {
  ingest_options c;
  if (b == backend::host) {
    c.set_shape({8, c.channels, 128, 128});  // 1.5 MiB per batch
    c.compute = std::chrono::milliseconds(10);
    c.workers = 2;
    // With the ladder link (ladder_host_options), make each batch cost 90% of a step on one thread, as
    // making the reference's batch does on the cuda ladder (docs/PERFORMANCE.md): its proportions.
    c.make_ms_per_mib = 6.0;
  }
  return c;
}

ingest_options default_both_ways_ingest_options(backend b) {
  ingest_options c = default_ingest_options(b);
  c.workers = 2;
  return c;
}

const ladder_spec& ingest_spec() {
  static const ladder_spec spec = [] {
    ladder_spec s{
        "ingest", copy_direction::host_to_device, "batch", "batches", infos_of(level_table()), 7, columns(),
        {}};
    // Its name in earlier results: the window's CPU time per step (cpu_ms_per_batch_made is per batch made).
    s.json_aliases.emplace_back("cpu_ms_per_batch", "cpu_ms_per_step");
    return s;
  }();
  return spec;
}

const std::vector<level_info>& ingest_levels() { return ingest_spec().levels; }

// The JSON fields of the config and of a pure copy's result (nlohmann's to_json, found by ADL).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ingest_options, batch, channels, height, width, host_slots, depth)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ingest_pure_copy_result, batches, batch_bytes, seconds, gbps,
                                   probed_h2d_gbps, link_fraction, mismatches)

ingest_result run_ingest(device& dev, const ingest_options& cfg, progress_fn progress) {
  FERRY_EXPECTS(cfg.batch_bytes() > 0 && cfg.image_bytes() > 0,
                "ingest bench shape has a zero dimension; every dimension must be >= 1");
  FERRY_EXPECTS(cfg.workers >= 1 && cfg.host_slots >= 1 && cfg.depth >= 1,
                fmt::format("ingest bench needs at least 1 worker, host slot and depth (got {}, {}, {})",
                            cfg.workers, cfg.host_slots, cfg.depth));
  const auto& table = level_table();
  auto run = [&](std::size_t index, level_window& window, ladder_row& row) {
    row.set_extra("worker_threads", 0, true);
    workload w(dev, cfg, window);
    table[index].run({dev, cfg, w, row});
  };
  return run_ladder_as<ingest_result>(dev, ingest_spec(), cfg, cfg.batch_bytes(), run, progress);
}

ingest_pure_copy_result run_ingest_pure_copy(device& dev, const ingest_options& cfg, int batches,
                                             progress_fn progress, start_line* together) {
  FERRY_EXPECTS(batches >= 1, fmt::format("pure copy of {} batches; at least 1 is needed", batches));
  ingest_pure_copy_result r{};
  r.probed_h2d_gbps = probe::pinned_ceiling(dev, copy_direction::host_to_device, cfg.batch_bytes(),
                                            cfg.probed_gbps, progress);
  std::tie(r.device, r.batch_bytes, r.batches) = std::tuple(dev.info(), cfg.batch_bytes(), batches);
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
  making_counter made;
  ingest::loader data(dev, opts, [&l, slots, &made](const ingest::sample& s, ingest::sample_fields out) {
    if (s.batch < slots) {
      make_sample(out[0], out[1], s.batch, s.position, l.batch, l.decode, made);
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
  if (progress) {
    progress(fmt::format("ingest pure copy: {} x {} through ferry::ingest", batches,
                         format_bytes(cfg.batch_bytes())));
  }
  steady_clock::time_point t0{};
  auto deadline = steady_clock::time_point::max();
  std::uint64_t step = 0;
  for (ingest::device_batch& b : gpu.batches(consumer)) {
    if (step == 1) {
      consumer.synchronize();  // batch 0 is the warm-up
      t0 = together != nullptr ? together->arrive() : steady_clock::now();
      if (together != nullptr) deadline = together->deadline();
    }
    dev.checksum_async(b.field(0), sums.view(16 * step, 8), consumer);
    dev.checksum_async(b.field(1), sums.view(16 * step + 8, 8), consumer);
    ++step;
    if (step > 1 && steady_clock::now() >= deadline) break;
  }
  consumer.synchronize();
  r.window_start = t0;
  r.window_end = steady_clock::now();
  r.seconds = std::chrono::duration<double>(r.window_end - t0).count();
  gpu.close();
  FERRY_EXPECTS(step >= 2 && (step == static_cast<std::uint64_t>(batches + 1) || together != nullptr),
                fmt::format("ingest pure copy delivered {} batches, expected {}", step, batches + 1));
  r.batches = static_cast<int>(step - 1);
  r.gbps = gb_per_s(cfg.batch_bytes() * static_cast<std::uint64_t>(r.batches), r.seconds);
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

both_ways_result run_both_ways(device& dev, const ingest_options& in_cfg, const egress_options& out_cfg,
                               std::chrono::milliseconds duration, progress_fn progress) {
  both_ways_result r;
  {
    probe::options po = probe::default_options(dev.kind());
    po.measure_pin_cost = false;
    po.iterations = 20;  // the two-way figure varies more from copy to copy than one direction
    if (progress) progress("probing both directions at once");
    r.probed_duplex_gbps = probe::run(dev, po).duplex.total_gbps;
  }
  ingest_options in = in_cfg;
  egress_options out = out_cfg;
  if (in.probed_gbps <= 0) in.probed_gbps = 1;  // the ratio that matters here is the two-way one
  if (out.probed_gbps <= 0) out.probed_gbps = 1;
  // Both sides set up (pinning, first fills, a warm-up item), meet at the start line, and run from one
  // start until one deadline, each timing at least one item: their windows share a start.
  start_line line(2, duration);
  std::exception_ptr egress_error;
  std::thread egress_thread([&] {
    try {
      r.egress = run_egress_pure_copy(dev, out, std::numeric_limits<int>::max(), progress, &line);
    } catch (...) {
      egress_error = std::current_exception();
      line.leave();
    }
  });
  try {
    // More batches than any link can move before the deadline (the deadline ends it first); bounded,
    // since every batch's checksum is kept until the end.
    const double seconds = std::chrono::duration<double>(duration).count();
    const int most = static_cast<int>(seconds * 100e9 / static_cast<double>(in.batch_bytes())) + 16;
    r.ingest = run_ingest_pure_copy(dev, in, most, progress, &line);
  } catch (...) {
    line.leave();
    egress_thread.join();
    throw;
  }
  egress_thread.join();
  if (egress_error) std::rethrow_exception(egress_error);
  const auto common = std::min(r.ingest.window_end, r.egress.window_end) -
                      std::max(r.ingest.window_start, r.egress.window_start);
  const auto longer = std::max(r.ingest.window_end, r.egress.window_end) -
                      std::min(r.ingest.window_start, r.egress.window_start);
  r.overlap = std::max(
      0.0, std::chrono::duration<double>(common).count() / std::chrono::duration<double>(longer).count());
  r.total_gbps = r.ingest.gbps + r.egress.gbps;
  r.link_fraction = r.probed_duplex_gbps > 0 ? r.total_gbps / r.probed_duplex_gbps : 0;
  return r;
}

std::string format_text(const ingest_pure_copy_result& r) {
  return fmt::format(
      "ingest pure copy on {}: {} x {} in {:.3f} s = {:.2f} GB/s, {:.1f}% of the probed pinned H2D "
      "{:.2f} GB/s; {} mismatches\n",
      r.device.name, r.batches, format_bytes(r.batch_bytes), r.seconds, r.gbps, r.link_fraction * 100,
      r.probed_h2d_gbps, r.mismatches);
}

nlohmann::json to_json(const ingest_pure_copy_result& r, const run_stamp& stamp) {
  nlohmann::json j = stamp_json("ferry bench ingest --pure-copy", stamp, r.device);
  j.update(nlohmann::json(r));
  return j;
}

std::string format_text(const both_ways_result& r) {
  return fmt::format(
      "both ways on {}: ingest {:.2f} GB/s + egress {:.2f} GB/s = {:.2f} GB/s, {:.1f}% of the probed "
      "two-way {:.2f} GB/s (windows overlap {:.0f}%); {} mismatches\n",
      r.ingest.device.name, r.ingest.gbps, r.egress.gbps, r.total_gbps, r.link_fraction * 100,
      r.probed_duplex_gbps, r.overlap * 100, r.ingest.mismatches + r.egress.mismatches);
}

nlohmann::json to_json(const both_ways_result& r, const run_stamp& stamp) {
  nlohmann::json j = stamp_json("ferry bench ingest --both-ways", stamp, r.ingest.device);
  j.update({{"ingest", r.ingest},
            {"egress",
             {{"outputs", r.egress.outputs},
              {"output_bytes", r.egress.output_bytes},
              {"seconds", r.egress.seconds},
              {"gbps", r.egress.gbps},
              {"mismatches", r.egress.mismatches}}},
            {"overlap", r.overlap},
            {"total_gbps", r.total_gbps},
            {"probed_duplex_gbps", r.probed_duplex_gbps},
            {"link_fraction", r.link_fraction}});
  return j;
}

}  // namespace ferry::bench
