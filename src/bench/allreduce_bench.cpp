// `ferry bench allreduce` (allreduce_bench.hpp): nccl-tests' all_reduce_perf on ferry::comm, with codecs.
#include "ferry/bench/allreduce_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/bus_factor.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"

namespace ferry::bench {
namespace {

using comm::codec_kind;

// "fp32" for the lossless codec (the all-reduce of fp32 itself), else the codec's name.
std::string codec_name(codec_kind c) { return c == codec_kind::none ? "fp32" : std::string(to_string(c)); }

// What one rank measured for one row.
struct rank_row {
  double out_of_place_s = 0;  // per operation
  double in_place_s = 0;
  double codec_s = 0;
  std::uint64_t wrong_out_of_place = 0;
  std::uint64_t wrong_in_place = 0;
  std::uint64_t checked = 0;
};

// One rank's buffers (allocated once, at the largest size) and stream.
class rank_runner {
 public:
  rank_runner(comm::communicator& c, const allreduce_options& o, std::uint64_t max_bytes)
      : comm_(c), o_(o), s_(c.dev().make_stream()) {
    send_ = c.dev().alloc_device(max_bytes);
    recv_ = c.dev().alloc_device(max_bytes);
    const bool lossy =
        std::any_of(o.codecs.begin(), o.codecs.end(), [](codec_kind k) { return comm::lossy(k); });
    if (lossy) wire_ = c.dev().alloc_device(max_bytes / 2);
  }

  rank_row measure(std::uint64_t bytes, codec_kind codec, std::uint64_t seed) {
    const std::size_t count = bytes / sizeof(float);
    const mem_view send = send_.view(0, bytes);
    const mem_view recv = recv_.view(0, bytes);
    const int n = comm_.size();
    rank_row r;
    // Finite values to reduce; every rank's own, so the sums are real sums.
    comm::fill_f32_async(send, count, {0.25F, 1.0F, seed + static_cast<std::uint64_t>(comm_.rank()), 1}, s_);
    comm::fill_f32_async(recv, count, {0.25F, 1.0F, seed + static_cast<std::uint64_t>(comm_.rank()), 1}, s_);
    for (int i = 0; i < o_.warmup; ++i) op(codec, send, recv, count);
    r.out_of_place_s = timed([&] { op(codec, send, recv, count); });
    r.in_place_s = timed([&] { op(codec, recv, recv, count); });
    if (codec != codec_kind::none) {
      const mem_view wire = wire_.view(0, comm::wire_bytes(codec, count));
      r.codec_s = timed(
          [&] {
            comm::encode_async(codec, send, wire, count, n, s_);
            comm::decode_async(codec, wire, recv, count, s_);
          },
          false);
    }
    if (o_.check) {
      // Each rank's values, and their exact mean: what every rank must hold after the operation.
      const comm::f32_fill mine{0.25F, 1.0F, seed + 1000 + static_cast<std::uint64_t>(comm_.rank()), 1};
      const comm::f32_fill mean{0.25F, 1.0F, seed + 1000, static_cast<std::uint32_t>(n)};
      const auto tolerance = static_cast<float>(comm::error_bound(codec, n, mine.max_abs()));
      comm::fill_f32_async(send, count, mine, s_);
      op(codec, send, recv, count);
      r.wrong_out_of_place = comm::compare_f32(recv, mean, count, tolerance, s_).wrong;
      comm::fill_f32_async(recv, count, mine, s_);
      op(codec, recv, recv, count);
      r.wrong_in_place = comm::compare_f32(recv, mean, count, tolerance, s_).wrong;
      r.checked = 2 * count;
    }
    return r;
  }

 private:
  // One operation as the reducer runs a bucket: fp32 all-reduce (avg), or encode / all-reduce (sum) /
  // decode through the wire buffer.
  void op(codec_kind codec, mem_view in, mem_view out, std::size_t count) {
    if (codec == codec_kind::none) {
      static_cast<void>(comm_.all_reduce(in, out, count, comm::dtype::f32, comm::reduce_op::avg, s_));
      return;
    }
    const mem_view wire = wire_.view(0, comm::wire_bytes(codec, count));
    comm::encode_async(codec, in, wire, count, comm_.size(), s_);
    static_cast<void>(comm_.all_reduce(wire, wire, count, comm::wire_type(codec), comm::reduce_op::sum, s_));
    comm::decode_async(codec, wire, out, count, s_);
  }

  // Seconds per operation of `iters` operations queued back to back, from a barrier of the group (when
  // `together`) to the stream's completion.
  template <class Op>
  double timed(Op&& one, bool together = true) {
    if (together) {
      event e = comm_.barrier(s_);
      e.synchronize();
    } else {
      s_.synchronize();
    }
    const auto t0 = steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) one();
    s_.synchronize();
    return seconds_since(t0) / o_.iters;
  }

  comm::communicator& comm_;
  const allreduce_options& o_;
  stream s_;
  buffer send_, recv_, wire_;
};

allreduce_timing timing_of(double seconds, std::uint64_t fp32_bytes, std::uint64_t wire_bytes, int n) {
  allreduce_timing t;
  t.time_us = seconds * 1e6;
  t.algbw = seconds > 0 ? static_cast<double>(wire_bytes) / seconds / 1e9 : 0;
  t.busbw = t.algbw * comm::all_reduce_bus_factor(n);
  t.effbw = seconds > 0 ? static_cast<double>(fp32_bytes) / seconds / 1e9 : 0;
  return t;
}

}  // namespace

std::vector<std::uint64_t> allreduce_sizes(const allreduce_options& o) {
  FERRY_EXPECTS(o.min_bytes >= sizeof(float),
                fmt::format("allreduce min size {} B is below one fp32 element (4 B)", o.min_bytes));
  FERRY_EXPECTS(o.max_bytes >= o.min_bytes,
                fmt::format("allreduce max size {} is below the min size {}", format_bytes(o.max_bytes),
                            format_bytes(o.min_bytes)));
  FERRY_EXPECTS(o.step_factor >= 2,
                fmt::format("allreduce step factor {} must be at least 2", o.step_factor));
  FERRY_EXPECTS(o.iters >= 1, fmt::format("allreduce iters {} must be at least 1", o.iters));
  FERRY_EXPECTS(o.warmup >= 0, fmt::format("allreduce warmup {} must not be negative", o.warmup));
  FERRY_EXPECTS(!o.codecs.empty(), "allreduce needs at least one codec (fp32, bf16, fp16)");
  for (const codec_kind c : o.codecs)
    FERRY_EXPECTS(comm::has_error_bound(c),
                  fmt::format("allreduce runs the element-wise codecs (fp32, bf16, fp16) and checks their "
                              "results against their bound; {} has none, so it runs in the reducer only "
                              "(bench ddp)",
                              to_string(c)));
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = o.min_bytes; s <= o.max_bytes; s *= o.step_factor) {
    out.push_back(s / sizeof(float) * sizeof(float));
    if (s > o.max_bytes / o.step_factor) break;  // the next would pass max (or overflow)
  }
  return out;
}

double allreduce_result::average_busbw(codec_kind c) const noexcept {
  double sum = 0;
  int n = 0;
  for (const allreduce_row& r : rows) {
    if (r.codec != c) continue;
    sum += r.out_of_place.busbw + r.in_place.busbw;
    n += 2;
  }
  return n > 0 ? sum / n : 0;
}

std::uint64_t allreduce_result::wrong() const noexcept {
  std::uint64_t n = 0;
  for (const allreduce_row& r : rows) n += r.out_of_place.wrong + r.in_place.wrong;
  return n;
}

namespace {

// Sums over the ranks of this process of what each measured for every row (times in seconds, counts).
struct row_sums {
  double out_of_place_s = 0;
  double in_place_s = 0;
  double codec_s = 0;
  double wrong_out_of_place = 0;  // counts, exact in a double up to 2^53
  double wrong_in_place = 0;
  double checked = 0;
};

allreduce_result measure_here(std::span<comm::communicator* const> ranks, const allreduce_options& o,
                              const progress_fn& progress, const std::vector<std::uint64_t>& sizes,
                              std::vector<row_sums>& sums) {
  FERRY_EXPECTS(!ranks.empty(), "allreduce needs at least one rank");
  const int here = static_cast<int>(ranks.size());
  const int first = ranks[0] != nullptr ? ranks[0]->rank() : 0;
  const int n = ranks[0] != nullptr ? ranks[0]->size() : 0;
  for (int r = 0; r < here; ++r) {
    const comm::communicator* c = ranks[static_cast<std::size_t>(r)];
    FERRY_EXPECTS(
        c != nullptr && c->rank() == first + r && c->size() == n,
        fmt::format("allreduce ranks must be consecutive ranks of one group: entry {} is not rank {} "
                    "of {}",
                    r, first + r, n));
  }
  allreduce_result result;
  result.device = ranks[0]->dev().info();
  result.backend = std::string(ranks[0]->backend_name());
  result.ranks = n;

  // measured[r][i * codecs + j]: rank r's row for size i and codec j.
  const std::size_t row_count = sizes.size() * o.codecs.size();
  std::vector<std::vector<rank_row>> measured(static_cast<std::size_t>(here),
                                              std::vector<rank_row>(row_count));
  std::mutex mu;
  std::exception_ptr failure;
  std::vector<std::thread> threads;
  for (int r = 0; r < here; ++r) {
    threads.emplace_back([&, r] {
      comm::communicator& c = *ranks[static_cast<std::size_t>(r)];
      try {
        rank_runner runner(c, o, sizes.back());
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          for (std::size_t j = 0; j < o.codecs.size(); ++j) {
            if (c.rank() == 0 && progress)
              progress(fmt::format("allreduce: {} {} over {} ranks", format_bytes(sizes[i]),
                                   codec_name(o.codecs[j]), n));
            measured[static_cast<std::size_t>(r)][i * o.codecs.size() + j] =
                runner.measure(sizes[i], o.codecs[j], 16 * (i * o.codecs.size() + j));
          }
        }
      } catch (...) {
        {
          const std::lock_guard lock(mu);
          if (!failure) failure = std::current_exception();
        }
        // The other ranks wait in collectives for this one: abort the group so they fail instead.
        c.abort(fmt::format("rank {} of the allreduce bench failed", c.rank()));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);

  sums.assign(row_count, row_sums{});
  for (std::size_t k = 0; k < row_count; ++k) {
    for (int r = 0; r < here; ++r) {
      const rank_row& m = measured[static_cast<std::size_t>(r)][k];
      sums[k].out_of_place_s += m.out_of_place_s;
      sums[k].in_place_s += m.in_place_s;
      sums[k].codec_s += m.codec_s;
      sums[k].wrong_out_of_place += static_cast<double>(m.wrong_out_of_place);
      sums[k].wrong_in_place += static_cast<double>(m.wrong_in_place);
      sums[k].checked += static_cast<double>(m.checked);
    }
  }
  return result;
}

// The rows from the sums over every rank of the group.
void fill_rows(allreduce_result& result, const allreduce_options& o, const std::vector<std::uint64_t>& sizes,
               const std::vector<row_sums>& sums) {
  const int n = result.ranks;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t j = 0; j < o.codecs.size(); ++j) {
      const row_sums& m = sums[i * o.codecs.size() + j];
      allreduce_row row;
      row.bytes = sizes[i];
      row.count = sizes[i] / sizeof(float);
      row.codec = o.codecs[j];
      row.wire_bytes = comm::wire_bytes(row.codec, row.count);
      row.out_of_place = timing_of(m.out_of_place_s / n, row.bytes, row.wire_bytes, n);
      row.in_place = timing_of(m.in_place_s / n, row.bytes, row.wire_bytes, n);
      row.out_of_place.wrong = static_cast<std::uint64_t>(m.wrong_out_of_place);
      row.in_place.wrong = static_cast<std::uint64_t>(m.wrong_in_place);
      row.checked = static_cast<std::uint64_t>(m.checked);
      row.codec_us = m.codec_s / n * 1e6;
      result.rows.push_back(row);
    }
  }
}

}  // namespace

allreduce_result run_allreduce(std::span<comm::communicator* const> ranks, const allreduce_options& o,
                               progress_fn progress) {
  const std::vector<std::uint64_t> sizes = allreduce_sizes(o);
  FERRY_EXPECTS(
      !ranks.empty() && ranks[0] != nullptr && ranks[0]->rank() == 0 &&
          ranks[0]->size() == static_cast<int>(ranks.size()),
      fmt::format("allreduce ranks must be one whole group in rank order ({} given)", ranks.size()));
  std::vector<row_sums> sums;
  allreduce_result result = measure_here(ranks, o, progress, sizes, sums);
  fill_rows(result, o, sizes, sums);
  return result;
}

allreduce_result run_allreduce(comm::bootstrap& job, std::span<comm::communicator* const> ranks,
                               const allreduce_options& o, progress_fn progress) {
  const std::vector<std::uint64_t> sizes = allreduce_sizes(o);
  std::vector<row_sums> sums;
  allreduce_result result = measure_here(ranks, o, progress, sizes, sums);
  // Every process's sums, added up: the group's.
  static_assert(std::is_trivially_copyable_v<row_sums>);
  const std::vector<std::byte> all = job.all_gather(std::as_bytes(std::span(sums)));
  std::vector<row_sums> theirs(sums.size());
  const std::size_t each = sums.size() * sizeof(row_sums);
  std::vector<row_sums> total(sums.size());
  for (int p = 0; p < job.size(); ++p) {
    std::memcpy(theirs.data(), all.data() + static_cast<std::size_t>(p) * each, each);
    for (std::size_t k = 0; k < total.size(); ++k) {
      total[k].out_of_place_s += theirs[k].out_of_place_s;
      total[k].in_place_s += theirs[k].in_place_s;
      total[k].codec_s += theirs[k].codec_s;
      total[k].wrong_out_of_place += theirs[k].wrong_out_of_place;
      total[k].wrong_in_place += theirs[k].wrong_in_place;
      total[k].checked += theirs[k].checked;
    }
  }
  fill_rows(result, o, sizes, total);
  return result;
}

std::string format_text(const allreduce_result& r) {
  const bool checked =
      std::any_of(r.rows.begin(), r.rows.end(), [](const allreduce_row& x) { return x.checked > 0; });
  std::string out = fmt::format("# ferry bench allreduce: {} rank{}, {} backend on {}{}\n", r.ranks,
                                r.ranks == 1 ? "" : "s", r.backend, r.device.name,
                                r.link.empty() ? "" : fmt::format(" (modelled link: {})", r.link));
  out += "# busbw = algbw * 2(n-1)/n over the wire bytes; effbw = fp32 bytes / time\n#\n";
  // The two groups of five columns are 40 characters wide each.
  out += fmt::format("# {:>10} {:>11} {:>5} {:>5} {:>11}  {:^40}  {:^40}\n", "", "", "", "", "",
                     "out-of-place", "in-place");
  out += fmt::format(
      "# {:>10} {:>11} {:>5} {:>5} {:>11}  {:>9} {:>7} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}  "
      "{:>9}\n",
      "size", "count", "type", "codec", "wire", "time", "algbw", "busbw", "effbw", "#wrong", "time", "algbw",
      "busbw", "effbw", "#wrong", "codec");
  out += fmt::format(
      "# {:>10} {:>11} {:>5} {:>5} {:>11}  {:>9} {:>7} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>7} {:>6}  "
      "{:>9}\n",
      "(B)", "(elements)", "", "", "(B)", "(us)", "(GB/s)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
      "(GB/s)", "(GB/s)", "", "(us)");
  auto wrong = [checked](std::uint64_t w) { return checked ? fmt::format("{}", w) : std::string("N/A"); };
  for (const allreduce_row& x : r.rows) {
    out += fmt::format(
        "  {:>10} {:>11} {:>5} {:>5} {:>11}  {:>9.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>6}  {:>9.2f} {:>7.2f} "
        "{:>7.2f} "
        "{:>7.2f} {:>6}  {:>9.2f}\n",
        x.bytes, x.count, "float", codec_name(x.codec), x.wire_bytes, x.out_of_place.time_us,
        x.out_of_place.algbw, x.out_of_place.busbw, x.out_of_place.effbw, wrong(x.out_of_place.wrong),
        x.in_place.time_us, x.in_place.algbw, x.in_place.busbw, x.in_place.effbw, wrong(x.in_place.wrong),
        x.codec_us);
  }
  out += fmt::format("# Out of bounds values : {} {}\n", r.wrong(), r.wrong() == 0 ? "OK" : "FAILED");
  std::vector<codec_kind> seen;
  std::string avg;
  for (const allreduce_row& x : r.rows) {
    if (std::find(seen.begin(), seen.end(), x.codec) != seen.end()) continue;
    seen.push_back(x.codec);
    avg +=
        fmt::format("{}{:.3f} ({})", avg.empty() ? "" : ", ", r.average_busbw(x.codec), codec_name(x.codec));
  }
  out += fmt::format("# Avg bus bandwidth    : {}\n", avg);
  return out;
}

nlohmann::json to_json(const allreduce_result& r, const allreduce_options& o, const run_stamp& stamp) {
  nlohmann::json j = stamp_json("ferry bench allreduce", stamp, r.device);
  std::vector<std::string> codecs;
  for (codec_kind c : o.codecs) codecs.push_back(codec_name(c));
  j["config"] = {{"min_bytes", o.min_bytes}, {"max_bytes", o.max_bytes}, {"step_factor", o.step_factor},
                 {"iters", o.iters},         {"warmup", o.warmup},       {"check", o.check},
                 {"codecs", codecs}};
  j["backend"] = r.backend;
  j["ranks"] = r.ranks;
  j["link"] = r.link;
  auto timing = [](const allreduce_timing& t) {
    return nlohmann::json{{"time_us", t.time_us},
                          {"algbw", t.algbw},
                          {"busbw", t.busbw},
                          {"effbw", t.effbw},
                          {"nwrong", t.wrong}};
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const allreduce_row& x : r.rows) {
    rows.push_back({{"size", x.bytes},
                    {"count", x.count},
                    {"type", "float"},
                    {"redop", x.codec == codec_kind::none ? "avg" : "sum"},
                    {"codec", codec_name(x.codec)},
                    {"wire_bytes", x.wire_bytes},
                    {"out_of_place", timing(x.out_of_place)},
                    {"in_place", timing(x.in_place)},
                    {"codec_us", x.codec_us},
                    {"checked", x.checked}});
  }
  j["rows"] = std::move(rows);
  nlohmann::json avg = nlohmann::json::object();
  for (codec_kind c : o.codecs) avg[codec_name(c)] = r.average_busbw(c);
  j["average_bus_bandwidth"] = std::move(avg);
  j["wrong"] = r.wrong();
  j["out_of_bounds"] = r.wrong() == 0 ? "OK" : "FAILED";
  return j;
}

}  // namespace ferry::bench
