// Bucket codecs as an open interface: codecs defined here, in the test, are registered and run by a
// reducer through set_plan with no library file knowing them: a whole bucket_codec ("negate, then
// average" through the reducer's scratch, counting its calls) and an element-wise one given as parts. The
// registry refuses names already taken and entries it cannot make; the built-in codecs keep their names.
#include "ferry/comm/bucket_codec.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <any>
#include <array>
#include <atomic>
#include <cmath>
#include <vector>

#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/comm/reducer.hpp"
#include "host_ranks.hpp"
#include "reducer_steps.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;
using testing::fill_of;
using testing::host_ranks;
using testing::on_every_rank;
using testing::read_floats;
using testing::reverse_order;
using testing::run_step;
using testing::sizes;
using testing::small_buckets;
using testing::unmodelled;

constexpr int max_ranks = 4;

// Per rank: codecs made, and reduce_async calls with the elements they reduced.
struct negate_counts {
  std::array<std::atomic<int>, max_ranks> made{};
  std::array<std::atomic<int>, max_ranks> calls{};
  std::array<std::atomic<std::size_t>, max_ranks> elements{};
};
negate_counts counts;

// scratch = -bucket; all-reduce (avg) of the scratch; bucket = -scratch: the exact fp32 mean, through the
// reducer's scratch, in host functions on the stream (host devices' memory is host memory).
class negate_codec final : public bucket_codec {
 public:
  explicit negate_codec(const bucket_setup& s) : bucket_codec(s.kind), comm_(&s.comm), elements_(s.elements) {
    ++counts.made[static_cast<std::size_t>(comm_->rank())];
  }
  void reduce_async(mem_view bucket, mem_view scratch, stream_view s, reduce_marks& marks) override {
    const auto r = static_cast<std::size_t>(comm_->rank());
    ++counts.calls[r];
    counts.elements[r] += elements_;
    auto* g = static_cast<float*>(bucket.data);
    auto* w = static_cast<float*>(scratch.data);
    const std::size_t n = elements_;
    s.dev().launch_host_func(s, [g, w, n] {
      for (std::size_t i = 0; i < n; ++i) w[i] = -g[i];
    });
    marks.reduce_start(s);
    static_cast<void>(comm_->all_reduce(scratch, scratch, n, dtype::f32, reduce_op::avg, s));
    marks.reduce_end(s);
    s.dev().launch_host_func(s, [g, w, n] {
      for (std::size_t i = 0; i < n; ++i) g[i] = -w[i];
    });
  }
  [[nodiscard]] std::size_t wire_bytes() const noexcept override { return elements_ * sizeof(float); }
  [[nodiscard]] std::size_t scratch_bytes() const noexcept override { return elements_ * sizeof(float); }

 private:
  communicator* comm_;
  std::size_t elements_;
};

codec_kind negate_kind() {
  static const codec_kind k = [] {
    codec_entry e;
    e.name = "test-negate";
    e.aliases = {"test-neg"};
    e.lossy = false;
    e.make = [](const bucket_setup& s) { return std::make_unique<negate_codec>(s); };
    return register_codec(std::move(e));
  }();
  return k;
}

std::atomic<int> parts_encodes{0};

// An element-wise codec given as parts: codec none's encode and decode (fp32 scaled by 1/n), counted.
codec_kind parts_kind() {
  static const codec_kind k = [] {
    codec_entry e;
    e.name = "test-parts";
    e.lossy = false;
    e.elementwise = elementwise_parts{
        dtype::f32,
        [](mem_view bucket, mem_view wire, std::size_t count, int world_size, stream_view s) {
          ++parts_encodes;
          encode_async(codec_kind::none, bucket, wire, count, world_size, s);
        },
        [](mem_view wire, mem_view bucket, std::size_t count, stream_view s) {
          decode_async(codec_kind::none, wire, bucket, count, s);
        }};
    return register_codec(std::move(e));
  }();
  return k;
}

// Every gradient of `step` within fp32's bound of the exact mean.
void expect_mean(reducer& r, std::uint64_t step, int ranks, stream_view s) {
  for (std::size_t p = 0; p < r.param_count(); ++p) {
    const std::vector<float> got = read_floats(r.comm().dev(), r.grad(p), s);
    for (std::size_t i = 0; i < got.size(); ++i) {
      double exact = 0;
      double m = 0;
      for (int k = 0; k < ranks; ++k) {
        const double x = fill_of(step, p, k).value(i);
        exact += x / ranks;
        m = std::max(m, std::fabs(x));
      }
      ASSERT_NEAR(got[i], exact, error_bound(codec_kind::none, ranks, m))
          << "rank " << r.comm().rank() << ", step " << step << ", param " << p << " element " << i;
    }
  }
}

TEST(bucket_codec, a_codec_registered_by_the_test_runs_every_bucket_of_a_plan_set_by_hand) {
  const codec_kind negate = negate_kind();
  EXPECT_GT(static_cast<int>(negate), static_cast<int>(powersgd_kind));
  EXPECT_EQ(to_string(negate), "test-negate");
  EXPECT_EQ(parse_codec("test-negate"), negate);
  EXPECT_EQ(parse_codec("test-neg"), negate);
  EXPECT_FALSE(lossy(negate));
  const int n = 3;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 7);
  on_every_rank(n, [&](int rank) {
    const auto me = static_cast<std::size_t>(rank);
    device& dev = ranks.dev(rank);
    reducer_options o = small_buckets();
    o.timing = true;
    reducer r(ranks[rank], sizes, o);
    const stream producer = dev.make_stream();
    run_step(r, 1, reverse_order(sizes.size()), producer, producer);
    const std::size_t buckets = r.plan().buckets.size();
    ASSERT_GE(buckets, 4U);
    r.set_plan(r.plan(), {negate});
    const int made = counts.made[me];
    const int calls = counts.calls[me];
    const reducer_stats before = r.stats();
    for (std::uint64_t step = 2; step <= 4; ++step) {
      run_step(r, step, reverse_order(sizes.size()), producer, producer);
      expect_mean(r, step, n, producer);
    }
    EXPECT_EQ(r.generation(), 0U) << "new codecs on the same buckets keep the layout";
    EXPECT_EQ(counts.made[me] - made, static_cast<int>(buckets)) << "one codec per bucket, kept over steps";
    EXPECT_EQ(counts.calls[me] - calls, static_cast<int>(3 * buckets)) << "every bucket of every step";
    std::uint64_t elements = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      EXPECT_EQ(r.codecs()[b], negate);
      EXPECT_EQ(r.codec(b).kind(), negate);
      EXPECT_FALSE(r.codec(b).lossy());
      EXPECT_EQ(r.codec(b).error_feedback().bytes, 0U);
      EXPECT_EQ(powersgd_state(r.codec(b)), nullptr);
      elements += r.plan().buckets[b].elements;
    }
    EXPECT_EQ(r.stats().wire_bytes - before.wire_bytes, 3 * elements * sizeof(float));
    // Its marks time its all-reduce inside its work.
    for (const bucket_timing& t : r.last_step_timing()) {
      EXPECT_LE(t.start_ms, t.reduce_start_ms);
      EXPECT_LE(t.reduce_start_ms, t.reduce_end_ms);
      EXPECT_LE(t.reduce_end_ms, t.end_ms);
    }
    // Back to none: the codec objects go, and the test's codec runs no more.
    r.set_plan(r.plan(), {codec_kind::none});
    const int calls_before = counts.calls[me];
    run_step(r, 5, reverse_order(sizes.size()), producer, producer);
    expect_mean(r, 5, n, producer);
    EXPECT_EQ(counts.calls[me], calls_before);
  });
}

TEST(bucket_codec, an_elementwise_codec_given_as_parts_shares_the_scratch_with_the_builtin_ones) {
  const codec_kind parts = parts_kind();
  const int n = 2;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 11);
  const int encodes = parts_encodes;
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    const stream producer = dev.make_stream();
    run_step(r, 1, reverse_order(sizes.size()), producer, producer);
    std::vector<codec_kind> codecs(r.plan().buckets.size(), parts);
    codecs[0] = codec_kind::bf16;
    codecs[1] = codec_kind::none;
    r.set_plan(r.plan(), codecs);
    const reducer_stats before = r.stats();
    run_step(r, 2, reverse_order(sizes.size()), producer, producer);
    std::uint64_t wire = 0;
    for (std::size_t b = 0; b < codecs.size(); ++b)
      wire += wire_bytes(codecs[b], r.plan().buckets[b].elements);
    EXPECT_EQ(r.stats().wire_bytes - before.wire_bytes, wire);
    EXPECT_EQ(wire_bytes(parts, 10), 40U);
    EXPECT_EQ(wire_type(parts), dtype::f32);
    // The parts' buckets are fp32 means; bucket 0's bf16 is checked within bf16's bound.
    for (std::size_t p = 0; p < r.param_count(); ++p) {
      const codec_kind c = r.codecs()[r.plan().places[p].bucket];
      const std::vector<float> got = read_floats(dev, r.grad(p), producer);
      for (std::size_t i = 0; i < got.size(); ++i) {
        double exact = 0;
        double m = 0;
        for (int k = 0; k < n; ++k) {
          const double x = fill_of(2, p, k).value(i);
          exact += x / n;
          m = std::max(m, std::fabs(x));
        }
        ASSERT_NEAR(got[i], exact, error_bound(c == parts ? codec_kind::none : c, n, m))
            << "param " << p << " element " << i << " (" << to_string(c) << ")";
      }
    }
  });
  const auto parts_buckets = parts_encodes - encodes;
  EXPECT_GT(parts_buckets, 0);
  EXPECT_EQ(parts_buckets % n, 0) << "every rank encodes the same buckets";
}

TEST(bucket_codec, the_registry_refuses_taken_names_and_entries_it_cannot_make) {
  static_cast<void>(negate_kind());
  codec_entry dup;
  dup.name = "fp16";
  dup.make = [](const bucket_setup& s) { return std::make_unique<negate_codec>(s); };
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(register_codec(dup)); }),
                     "the name \"fp16\" is codec fp16's already");
  dup.name = "fresh";
  dup.aliases = {"test-neg"};
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(register_codec(dup)); }),
                     "is codec test-negate's already");
  codec_entry nothing;
  nothing.name = "test-nothing";
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(register_codec(nothing)); }),
                     "give a factory");
  nothing.make = dup.make;
  nothing.automatic = true;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(register_codec(nothing)); }),
                     "an automatic codec needs element-wise parts");
  EXPECT_FALSE(registered(static_cast<codec_kind>(250)));
  EXPECT_THROW(static_cast<void>(codec_info(static_cast<codec_kind>(250))), logic_error);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { static_cast<void>(parse_codec("zstd")); }),
                     "expected none (fp32), fp16, bf16, powersgd");
  // The built-ins keep their names, and the automatic plan's candidates stay bf16 then fp16.
  EXPECT_EQ(parse_codec("fp32"), codec_kind::none);
  EXPECT_EQ(parse_codec("half"), codec_kind::fp16);
  EXPECT_EQ(to_string(powersgd_kind), "powersgd");
  EXPECT_EQ(automatic_codecs(), (std::vector<codec_kind>{codec_kind::bf16, codec_kind::fp16}));
  EXPECT_TRUE(lossy(codec_kind::bf16));
  EXPECT_FALSE(lossy(codec_kind::none));
  // A reducer refuses a value no codec holds.
  host_ranks ranks(1, unmodelled(std::chrono::seconds(5)), 1);
  reducer r(ranks[0], sizes, small_buckets());
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.set_plan(r.plan(), {static_cast<codec_kind>(250)}); }),
                     "codec 250 is not a codec");
}

// A codec with options of its own type: its factory reads them from the setup (the reducer's, or its
// entry's defaults), and its check refuses a factor <= 0.
struct scale_options {
  double factor = 1.0;
};

// The test makes these codecs to read the options they were given; it runs no step with them.
class scaled_codec final : public bucket_codec {
 public:
  explicit scaled_codec(const bucket_setup& s)
      : bucket_codec(s.kind), factor_(std::any_cast<const scale_options&>(*s.options).factor) {}
  void reduce_async(mem_view /*bucket*/, mem_view /*scratch*/, stream_view /*s*/,
                    reduce_marks& /*marks*/) override {
    throw logic_error("test-scaled: the test runs no step with it");
  }
  [[nodiscard]] std::size_t wire_bytes() const noexcept override { return 0; }
  [[nodiscard]] double factor() const noexcept { return factor_; }

 private:
  double factor_;
};

codec_kind scaled_kind() {
  static const codec_kind k = [] {
    codec_entry e;
    e.name = "test-scaled";
    e.make = [](const bucket_setup& s) { return std::make_unique<scaled_codec>(s); };
    e.options = scale_options{};
    e.check_options = [](const std::any& o) {
      const double f = std::any_cast<const scale_options&>(o).factor;
      FERRY_EXPECTS(f > 0, fmt::format("scale_options::factor = {}: must be > 0", f));
    };
    return register_codec(std::move(e));
  }();
  return k;
}

double factor_of(const bucket_codec& c) { return dynamic_cast<const scaled_codec&>(c).factor(); }

TEST(bucket_codec, a_codecs_options_travel_from_the_reducer_or_its_entry_to_its_factory_checked) {
  const codec_kind scaled = scaled_kind();
  host_ranks ranks(1, unmodelled(std::chrono::seconds(5)), 4);
  reducer_options o = small_buckets(scaled);
  {
    reducer r(ranks[0], sizes, o);
    EXPECT_EQ(factor_of(r.codec(0)), 1.0) << "no options given: the entry's defaults";
  }
  o.codec_options[scaled] = scale_options{2.5};
  {
    reducer r(ranks[0], sizes, o);
    for (std::size_t b = 0; b < r.plan().buckets.size(); ++b) EXPECT_EQ(factor_of(r.codec(b)), 2.5);
  }
  const std::any three = scale_options{3.0};
  EXPECT_EQ(factor_of(*make_bucket_codec({scaled, ranks[0], 16, {}, {}, &three})), 3.0);
  // Refused at construction, before any codec is made: a bad value, options of another type, options
  // for a codec that takes none.
  o.codec_options[scaled] = scale_options{0};
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer r(ranks[0], sizes, o); }),
                     "scale_options::factor = 0: must be > 0");
  o.codec_options[scaled] = 2.5;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer r(ranks[0], sizes, o); }),
                     "options for codec test-scaled of another type");
  o.codec_options.erase(scaled);
  o.codec_options[codec_kind::bf16] = scale_options{};
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer r(ranks[0], sizes, o); }),
                     "options for codec bf16, which takes none");
  // PowerSGD's options are its entry's the same way.
  o.codec_options.clear();
  o.codec_options[powersgd_kind] = 1;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer r(ranks[0], sizes, o); }),
                     "options for codec powersgd of another type");
  EXPECT_NO_THROW(check_codec_options(powersgd_kind, powersgd_options{.rank = 2}));
  // An entry's check needs defaults to check against.
  codec_entry half;
  half.name = "test-check-only";
  half.make = [](const bucket_setup& s) { return std::make_unique<negate_codec>(s); };
  half.check_options = [](const std::any&) {};
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(register_codec(half)); }),
                     "check_options without options");
}

TEST(bucket_codec, stateless_and_error_bound_are_properties_of_the_entry_not_of_a_name) {
  EXPECT_TRUE(stateless(codec_kind::none));
  EXPECT_TRUE(stateless(codec_kind::fp16));
  EXPECT_TRUE(stateless(codec_kind::bf16));
  EXPECT_FALSE(stateless(powersgd_kind));
  EXPECT_TRUE(stateless(parts_kind())) << "a codec made from element-wise parts keeps nothing";
  EXPECT_FALSE(stateless(negate_kind())) << "a factory's codec is stateless only when its entry says so";
  EXPECT_FALSE(stateless(static_cast<codec_kind>(250)));
  for (const codec_kind c : {codec_kind::none, codec_kind::fp16, codec_kind::bf16})
    EXPECT_TRUE(has_error_bound(c));
  EXPECT_FALSE(has_error_bound(powersgd_kind));
  EXPECT_FALSE(has_error_bound(parts_kind()));
  EXPECT_EQ(codec_names(has_error_bound), "none, fp16 and bf16");
  // The stateless codecs by name: the built-ins and the test's element-wise one, in codec_kind order.
  const std::string names = codec_names(stateless);
  EXPECT_EQ(names.rfind("none, fp16, bf16", 0), 0U) << names;
  EXPECT_NE(names.find("test-parts"), std::string::npos) << names;
  EXPECT_EQ(names.find("powersgd"), std::string::npos) << names;
  EXPECT_EQ(wire_bytes(powersgd_kind, 10), 40U) << "a codec outside the table counts fp32 on the wire";
  EXPECT_EQ(wire_type(powersgd_kind), dtype::f32);
}

}  // namespace
}  // namespace ferry::comm
