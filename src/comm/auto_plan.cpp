// The automatic bucket and codec plan (auto_plan.hpp): the model, the candidates and the search.
#include "ferry/comm/auto_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/bus_factor.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {

namespace {

constexpr double ns = 1e-9;
// An improvement smaller than this (seconds) is a tie: the earlier, simpler choice stays.
constexpr double tie_s = 1e-9;
// Codec assignments tried one by one when there are at most this many; else a local search.
constexpr double exhaustive_limit = 4096;
// Rounds of the local search (each visits every bucket); it usually settles in two.
constexpr int codec_rounds = 4;
// The broadcast form starts with this word ("FERRYPL" and a version byte).
constexpr std::uint64_t plan_magic = 0x4645525259504c01;

double seconds(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) * ns; }

bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0; }

// Times of one bucket with one codec on the communication stream, in seconds.
struct bucket_cost {
  double encode = 0;
  double wire = 0;  // the all-reduce and the per-bucket cost
  double decode = 0;
  [[nodiscard]] double total() const noexcept { return encode + wire + decode; }
};

bucket_cost cost_of(const plan_inputs& in, const codec_cost& c, const bucket& b) {
  bucket_cost x;
  const auto bytes = static_cast<double>(b.bytes());
  x.encode = c.encode_ns_per_byte * bytes * ns + seconds(c.per_call);
  x.decode = c.decode_ns_per_byte * bytes * ns + seconds(c.per_call);
  x.wire = in.link.all_reduce_seconds(wire_bytes(c.codec, b.elements)) + seconds(in.per_bucket);
  return x;
}

// Length of [a, b) inside [0, end).
double before(double a, double b, double end) { return std::max(0.0, std::min(b, end) - std::max(a, 0.0)); }

// When each bucket's last gradient is ready, in seconds.
std::vector<double> ready_times(const ready_timeline& t, const bucket_plan& layout) {
  std::vector<double> out;
  out.reserve(layout.buckets.size());
  for (const bucket& b : layout.buckets) {
    std::chrono::nanoseconds r{0};
    for (std::size_t p : b.params) r = std::max(r, t.ready[p]);
    out.push_back(seconds(r));
  }
  return out;
}

// The search's view of one layout: each bucket's ready time and its cost with every allowed codec, so
// that trying an assignment costs a few additions per bucket. Choices are indices into `allowed`.
class evaluator {
 public:
  evaluator(const plan_inputs& in, const bucket_plan& layout, const std::vector<std::size_t>& allowed)
      : ready_(ready_times(in.timeline, layout)),
        backward_end_(seconds(in.timeline.backward_end)),
        buckets_s_(static_cast<double>(layout.buckets.size()) * seconds(in.per_bucket_compute)),
        choices_(allowed.size()) {
    costs_.reserve(ready_.size() * choices_);
    for (const bucket& b : layout.buckets)
      for (std::size_t c : allowed) costs_.push_back(cost_of(in, in.codecs[c], b));
  }

  [[nodiscard]] std::size_t buckets() const noexcept { return ready_.size(); }
  [[nodiscard]] std::size_t choices() const noexcept { return choices_; }

  // Exposed time plus codec time before backward's end plus the buckets' share, for choice[b] per bucket.
  [[nodiscard]] double objective(const std::vector<std::size_t>& choice) const {
    double end = 0, local = 0;
    for (std::size_t b = 0; b < buckets(); ++b) {
      const bucket_cost& x = costs_[b * choices_ + choice[b]];
      const double start = std::max(ready_[b], end);
      end = start + x.total();
      local += before(start, start + x.encode, backward_end_) + before(end - x.decode, end, backward_end_);
    }
    return std::max(0.0, end - backward_end_) + local + buckets_s_;
  }

 private:
  std::vector<double> ready_;
  double backward_end_;
  double buckets_s_;
  std::size_t choices_;
  std::vector<bucket_cost> costs_;  // [bucket][choice]
};

// The best choice per bucket for one layout (indices into the allowed codecs, 0 = the first lossless
// one), and its objective. Ties keep the earlier: lower choices, i.e. lossless.
std::pair<std::vector<std::size_t>, double> best_choice(const evaluator& e) {
  std::vector<std::size_t> choice(e.buckets(), 0);
  double value = e.objective(choice);
  if (e.choices() == 1) return {choice, value};
  const double assignments = std::pow(static_cast<double>(e.choices()), static_cast<double>(e.buckets()));
  if (assignments <= exhaustive_limit) {
    // Every assignment, counting in base choices() with bucket 0 the most significant digit, so the
    // assignments with lossless early buckets come first.
    std::vector<std::size_t> x(e.buckets(), 0);
    while (true) {
      std::size_t k = e.buckets();
      while (k > 0 && x[k - 1] + 1 == e.choices()) x[--k] = 0;
      if (k == 0) break;
      ++x[k - 1];
      const double v = e.objective(x);
      if (v < value - tie_s) {
        value = v;
        choice = x;
      }
    }
    return {choice, value};
  }
  for (std::size_t c = 1; c < e.choices(); ++c) {
    const std::vector<std::size_t> uniform(e.buckets(), c);
    const double v = e.objective(uniform);
    if (v < value - tie_s) {
      value = v;
      choice = uniform;
    }
  }
  for (int round = 0; round < codec_rounds; ++round) {
    bool changed = false;
    for (std::size_t k = 0; k < e.buckets(); ++k) {
      const std::size_t was = choice[k];
      for (std::size_t c = 0; c < e.choices(); ++c) {
        if (c == choice[k]) continue;
        const std::size_t keep = choice[k];
        choice[k] = c;
        const double v = e.objective(choice);
        if (v < value - tie_s) {
          value = v;
        } else {
          choice[k] = keep;
        }
      }
      changed = changed || choice[k] != was;
    }
    if (!changed) break;
  }
  return {choice, value};
}

std::vector<std::size_t> log_spaced(double lo, double hi, int n) {
  std::vector<std::size_t> out;
  for (int i = 0; i < n; ++i) {
    const double v = lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1));
    out.push_back(static_cast<std::size_t>(std::llround(v)));
  }
  return out;
}

// Parameters per bucket: what tells two layouts of one order apart.
std::vector<std::size_t> shape_of(const bucket_plan& layout) {
  std::vector<std::size_t> out;
  out.reserve(layout.buckets.size());
  for (const bucket& b : layout.buckets) out.push_back(b.params.size());
  return out;
}

}  // namespace

// ---- link ----

link_table link_table::from_times(int ranks, std::span<const std::uint64_t> bytes,
                                  std::span<const double> seconds) {
  FERRY_EXPECTS(bytes.size() == seconds.size(),
                fmt::format("link table from {} sizes but {} times; give one time per size", bytes.size(),
                            seconds.size()));
  FERRY_EXPECTS(ranks >= 1, fmt::format("link table for {} ranks; at least 1 is needed", ranks));
  link_table t;
  t.ranks = ranks;
  const double factor = all_reduce_bus_factor(ranks);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    FERRY_EXPECTS(std::isfinite(seconds[i]) && seconds[i] > 0,
                  fmt::format("link table: the all-reduce of {} took {} s; a time must be positive",
                              format_bytes(bytes[i]), seconds[i]));
    t.points.push_back({bytes[i], static_cast<double>(bytes[i]) * factor / seconds[i] / 1e9});
  }
  t.check();
  return t;
}

void link_table::check() const {
  FERRY_EXPECTS(ranks >= 1, fmt::format("link table for {} ranks; at least 1 is needed", ranks));
  FERRY_EXPECTS(!points.empty(), "link table has no point; measure at least one all-reduce size");
  for (std::size_t i = 0; i < points.size(); ++i) {
    FERRY_EXPECTS(points[i].bytes > 0, fmt::format("link table point {} has 0 bytes", i));
    // One rank's bus factor is 0 (bus_factor.hpp), so a table measured at one rank holds 0 GB/s points.
    const bool one_rank_zero = ranks == 1 && points[i].bus_gbps == 0;
    FERRY_EXPECTS(one_rank_zero || (std::isfinite(points[i].bus_gbps) && points[i].bus_gbps > 0),
                  fmt::format("link table point {} ({}) has bus bandwidth {} GB/s; it must be positive "
                              "(or 0 at one rank)",
                              i, format_bytes(points[i].bytes), points[i].bus_gbps));
    FERRY_EXPECTS(i == 0 || points[i].bytes > points[i - 1].bytes,
                  fmt::format("link table points must grow in size: point {} ({}) follows {}", i,
                              format_bytes(points[i].bytes), format_bytes(points[i - 1].bytes)));
  }
}

double link_table::all_reduce_seconds(std::uint64_t bytes) const {
  check();
  const double factor = all_reduce_bus_factor(ranks);
  if (factor == 0 || bytes == 0) return 0;  // one rank moves nothing
  const link_point& lo = points.front();
  if (bytes <= lo.bytes) return static_cast<double>(lo.bytes) * factor / (lo.bus_gbps * 1e9);
  double gbps = points.back().bus_gbps;
  const auto hi = std::upper_bound(points.begin(), points.end(), bytes,
                                   [](std::uint64_t b, const link_point& p) { return b < p.bytes; });
  if (hi != points.end()) {
    const link_point& a = *(hi - 1);
    const double x = std::log(static_cast<double>(bytes) / static_cast<double>(a.bytes)) /
                     std::log(static_cast<double>(hi->bytes) / static_cast<double>(a.bytes));
    gbps = a.bus_gbps + x * (hi->bus_gbps - a.bus_gbps);
  }
  return static_cast<double>(bytes) * factor / (gbps * 1e9);
}

// ---- codecs, plans ----

double codec_cost::local_seconds(std::uint64_t bytes) const {
  return (encode_ns_per_byte + decode_ns_per_byte) * static_cast<double>(bytes) * ns + 2 * seconds(per_call);
}

std::size_t comm_plan::lossy_buckets() const noexcept {
  return static_cast<std::size_t>(
      std::count_if(codecs.begin(), codecs.end(), [](codec_kind c) { return lossy(c); }));
}

std::vector<std::size_t> default_caps() { return log_spaced(1.0 * MiB, 400.0 * MiB, 20); }

std::vector<std::size_t> default_first_buckets() {
  return {1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB};
}

std::vector<bucket_plan_options> ddp_plans() { return {{1 * MiB, 25 * MiB}, {100 * MiB, 100 * MiB}}; }

void check(const plan_inputs& in) {
  in.link.check();
  const ready_timeline& t = in.timeline;
  FERRY_EXPECTS(!t.elements.empty(), "plan inputs have no parameter; record the backward's timeline first");
  FERRY_EXPECTS(t.ready.size() == t.elements.size(),
                fmt::format("timeline has {} ready times for {} parameters; give one per parameter",
                            t.ready.size(), t.elements.size()));
  FERRY_EXPECTS(t.backward_end.count() >= 0,
                fmt::format("backward end {} ns is negative", t.backward_end.count()));
  for (std::size_t p = 0; p < t.elements.size(); ++p) {
    FERRY_EXPECTS(t.elements[p] > 0, fmt::format("parameter {} has a gradient of 0 elements", p));
    FERRY_EXPECTS(t.ready[p].count() >= 0 && t.ready[p] <= t.backward_end,
                  fmt::format("parameter {}'s gradient is ready at {} ns, outside backward [0, {}] ns", p,
                              t.ready[p].count(), t.backward_end.count()));
  }
  FERRY_EXPECTS(!in.codecs.empty(), "plan inputs have no codec; give at least none (lossless fp32)");
  bool lossless = false;
  for (const codec_cost& c : in.codecs) {
    FERRY_EXPECTS(
        finite_non_negative(c.encode_ns_per_byte) && finite_non_negative(c.decode_ns_per_byte) &&
            c.per_call.count() >= 0,
        fmt::format("codec {} costs must be finite and not negative (encode {} ns/B, decode {} "
                    "ns/B, per call {} ns)",
                    to_string(c.codec), c.encode_ns_per_byte, c.decode_ns_per_byte, c.per_call.count()));
    lossless = lossless || !lossy(c.codec);
  }
  FERRY_EXPECTS(lossless, "plan inputs have no lossless codec; none (fp32) must be among them");
  FERRY_EXPECTS(finite_non_negative(in.min_lossy_gain),
                fmt::format("min_lossy_gain {} must be a finite fraction >= 0", in.min_lossy_gain));
  FERRY_EXPECTS(in.per_bucket.count() >= 0 && in.per_bucket_compute.count() >= 0,
                fmt::format("per-bucket costs must not be negative (communication {} ns, compute {} ns)",
                            in.per_bucket.count(), in.per_bucket_compute.count()));
  for (std::size_t c : in.caps) FERRY_EXPECTS(c > 0, "a candidate bucket cap of 0 bytes; caps must be > 0");
  for (std::size_t f : in.first_buckets)
    FERRY_EXPECTS(f > 0, "a candidate first bucket of 0 bytes; first buckets must be > 0");
  for (std::size_t k = 0; k < in.fixed_plans.size(); ++k) {
    const bucket_plan_options& f = in.fixed_plans[k];
    FERRY_EXPECTS(f.first_bucket_bytes > 0 && f.bucket_cap_bytes > 0,
                  fmt::format("fixed plan {} has a first bucket of {} bytes and a cap of {} bytes; both must "
                              "be > 0",
                              k, f.first_bucket_bytes, f.bucket_cap_bytes));
  }
  check(bucket_plan_options{1, 1, in.alignment_bytes});
}

std::vector<std::size_t> ready_order(const ready_timeline& t) {
  std::vector<std::size_t> order(t.elements.size());
  for (std::size_t p = 0; p < order.size(); ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return t.ready[a] < t.ready[b]; });
  return order;
}

comm_plan simulate(const plan_inputs& in, const bucket_plan& layout, std::span<const codec_kind> codecs) {
  check(in);
  validate(layout, in.timeline.elements, in.alignment_bytes);
  FERRY_EXPECTS(
      codecs.size() == layout.buckets.size(),
      fmt::format("{} codecs for {} buckets; give one per bucket", codecs.size(), layout.buckets.size()));
  comm_plan p;
  p.layout = layout;
  p.codecs.assign(codecs.begin(), codecs.end());
  p.backward_end_s = seconds(in.timeline.backward_end);
  const std::vector<double> ready = ready_times(in.timeline, layout);
  double end = 0;
  for (std::size_t k = 0; k < layout.buckets.size(); ++k) {
    const auto cost = std::find_if(in.codecs.begin(), in.codecs.end(),
                                   [&](const codec_cost& c) { return c.codec == codecs[k]; });
    FERRY_EXPECTS(
        cost != in.codecs.end(),
        fmt::format("bucket {} uses codec {}, whose cost the inputs do not give", k, to_string(codecs[k])));
    const bucket_cost c = cost_of(in, *cost, layout.buckets[k]);
    bucket_forecast t;
    t.ready_s = ready[k];
    t.start_s = std::max(t.ready_s, end);
    t.end_s = t.start_s + c.total();
    p.codec_s += before(t.start_s, t.start_s + c.encode, p.backward_end_s) +
                 before(t.end_s - c.decode, t.end_s, p.backward_end_s);
    p.comm_s += c.total();
    end = t.end_s;
    p.timing.push_back(t);
  }
  p.comm_end_s = end;
  p.exposed_s = std::max(0.0, end - p.backward_end_s);
  p.bucket_s = static_cast<double>(layout.buckets.size()) * seconds(in.per_bucket_compute);
  return p;
}

comm_plan choose_plan(const plan_inputs& in) {
  check(in);
  const std::vector<std::size_t> order = ready_order(in.timeline);
  // One bucket holds every gradient with the padding between them.
  std::size_t total = 0;
  for (std::size_t n : in.timeline.elements)
    total += (n * sizeof(float) + in.alignment_bytes - 1) / in.alignment_bytes * in.alignment_bytes;
  // Codecs the policy allows, lossless first, so that ties keep the lossless choice.
  std::vector<std::size_t> allowed;
  for (std::size_t c = 0; c < in.codecs.size(); ++c)
    if (!lossy(in.codecs[c].codec)) allowed.push_back(c);
  if (in.policy == codec_policy::lossy_allowed)
    for (std::size_t c = 0; c < in.codecs.size(); ++c)
      if (lossy(in.codecs[c].codec)) allowed.push_back(c);

  // Candidates, largest buckets first: one bucket, then every cap from the largest down, each with no
  // smaller first bucket and then with each smaller first bucket.
  std::vector<std::size_t> caps = in.caps.empty() ? default_caps() : in.caps;
  std::vector<std::size_t> firsts = in.first_buckets.empty() ? default_first_buckets() : in.first_buckets;
  std::sort(caps.begin(), caps.end(), std::greater<>());
  std::sort(firsts.begin(), firsts.end());
  std::vector<bucket_plan_options> candidates{{total, total, in.alignment_bytes}};
  for (std::size_t cap : caps) {
    candidates.push_back({cap, cap, in.alignment_bytes});
    for (std::size_t first : firsts)
      if (first < cap) candidates.push_back({first, cap, in.alignment_bytes});
  }
  // DDP's fixed plans last (ties keep the search's own candidates): whatever the caps, the plan is never
  // worse in the model than what a user gets without it. Their codec assignments (uniform none, bf16,
  // fp16 among them) are searched as every candidate's.
  for (const bucket_plan_options& f : in.fixed_plans.empty() ? ddp_plans() : in.fixed_plans)
    candidates.push_back({f.first_bucket_bytes, f.bucket_cap_bytes, in.alignment_bytes});

  // The best plan over every candidate, with lossless codecs only and with every allowed codec.
  struct best_plan {
    double value = std::numeric_limits<double>::infinity();
    bucket_plan_options options;
    bucket_plan layout;
    std::vector<std::size_t> choice;
    void offer(double v, const bucket_plan_options& o, const bucket_plan& l, std::vector<std::size_t> c) {
      if (v >= value - tie_s) return;
      value = v;
      options = o;
      layout = l;
      choice = std::move(c);
    }
  };
  best_plan lossless, any;
  const std::vector<std::size_t> lossless_codec{allowed.front()};
  std::vector<std::vector<std::size_t>> seen;  // layouts already evaluated
  for (const bucket_plan_options& o : candidates) {
    const bucket_plan layout = make_bucket_plan(in.timeline.elements, order, o);
    std::vector<std::size_t> shape = shape_of(layout);
    if (std::find(seen.begin(), seen.end(), shape) != seen.end()) continue;
    seen.push_back(std::move(shape));
    const evaluator fp32(in, layout, lossless_codec);
    auto [c0, v0] = best_choice(fp32);
    lossless.offer(v0, o, layout, std::move(c0));
    if (allowed.size() > 1) {
      const evaluator e(in, layout, allowed);
      auto [c, v] = best_choice(e);
      any.offer(v, o, layout, std::move(c));
    }
  }
  const double gain = in.min_lossy_gain * seconds(in.timeline.backward_end);
  const bool take_lossy = allowed.size() > 1 && any.value < lossless.value - std::max(gain, tie_s);
  const best_plan& chosen = take_lossy ? any : lossless;
  const std::vector<std::size_t>& best_choice_of = chosen.choice;
  const bucket_plan& best_layout = chosen.layout;
  const bucket_plan_options& best_options = chosen.options;
  std::vector<codec_kind> codecs;
  for (std::size_t c : best_choice_of) codecs.push_back(in.codecs[allowed[c]].codec);
  comm_plan p = simulate(in, best_layout, codecs);
  p.options = best_options;
  return p;
}

// ---- broadcast form ----
// [magic, params, buckets, first, cap, backward_end, comm_end, exposed, codec, comm, bucket]
// [ready order: params words] [codec per bucket: params words, the unused ones 0]

namespace {
constexpr std::size_t header_words = 11;
std::uint64_t bits(double v) { return std::bit_cast<std::uint64_t>(v); }
double real(std::uint64_t w) { return std::bit_cast<double>(w); }
}  // namespace

std::size_t plan_words(std::size_t params) noexcept { return header_words + 2 * params; }

std::vector<std::uint64_t> to_words(const comm_plan& p) {
  const std::vector<std::size_t> order = p.layout.order();
  const std::size_t params = order.size();
  FERRY_EXPECTS(
      !p.layout.buckets.empty() && p.codecs.size() == p.layout.buckets.size(),
      fmt::format("a plan of {} buckets and {} codecs cannot be broadcast; give one codec per bucket",
                  p.layout.buckets.size(), p.codecs.size()));
  std::vector<std::uint64_t> w(plan_words(params), 0);
  w[0] = plan_magic;
  w[1] = params;
  w[2] = p.layout.buckets.size();
  w[3] = p.options.first_bucket_bytes;
  w[4] = p.options.bucket_cap_bytes;
  w[5] = bits(p.backward_end_s);
  w[6] = bits(p.comm_end_s);
  w[7] = bits(p.exposed_s);
  w[8] = bits(p.codec_s);
  w[9] = bits(p.comm_s);
  w[10] = bits(p.bucket_s);
  for (std::size_t i = 0; i < params; ++i) w[header_words + i] = order[i];
  for (std::size_t k = 0; k < p.codecs.size(); ++k)
    w[header_words + params + k] = static_cast<std::uint64_t>(p.codecs[k]);
  return w;
}

comm_plan from_words(std::span<const std::uint64_t> w, std::span<const std::size_t> elements,
                     std::size_t alignment_bytes) {
  const std::size_t params = elements.size();
  FERRY_EXPECTS(
      w.size() == plan_words(params) && w[0] == plan_magic && w[1] == params,
      fmt::format("{} words are not the broadcast plan of {} parameters ({} words starting with the "
                  "plan's mark)",
                  w.size(), params, plan_words(params)));
  comm_plan p;
  p.options = {w[3], w[4], alignment_bytes};
  p.backward_end_s = real(w[5]);
  p.comm_end_s = real(w[6]);
  p.exposed_s = real(w[7]);
  p.codec_s = real(w[8]);
  p.comm_s = real(w[9]);
  p.bucket_s = real(w[10]);
  const std::vector<std::size_t> order(w.begin() + header_words,
                                       w.begin() + static_cast<std::ptrdiff_t>(header_words + params));
  p.layout = make_bucket_plan(elements, order, p.options);
  FERRY_EXPECTS(p.layout.buckets.size() == w[2],
                fmt::format("the broadcast plan names {} buckets but its order and caps make {}", w[2],
                            p.layout.buckets.size()));
  for (std::size_t k = 0; k < p.layout.buckets.size(); ++k) {
    const std::uint64_t c = w[header_words + params + k];
    // The plan chooses none or one of the registry's automatic codecs.
    FERRY_EXPECTS(c == static_cast<std::uint64_t>(codec_kind::none) ||
                      (c < 256 && registered(static_cast<codec_kind>(c)) &&
                       codec_info(static_cast<codec_kind>(c)).automatic),
                  fmt::format("the broadcast plan's bucket {} names codec {}, which is not a codec", k, c));
    p.codecs.push_back(static_cast<codec_kind>(c));
  }
  return p;
}

}  // namespace ferry::comm
