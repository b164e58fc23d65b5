// `ferry bench allreduce` on the host communicator: the sizes, every row checked element by element (and
// a reduction that is wrong is caught), nccl-tests' columns and formulas, and the JSON.
#include "ferry/bench/allreduce_bench.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/comm_groups.hpp"
#include "ferry/core/error.hpp"

using namespace ferry;
using namespace ferry::bench;
using comm::codec_kind;
using test_groups::host_group;
using test_groups::summing;

namespace {

allreduce_options small() {
  allreduce_options o;
  o.min_bytes = 4 * KiB;
  o.max_bytes = 64 * KiB;
  o.step_factor = 4;
  o.iters = 3;
  o.warmup = 1;
  o.codecs = {codec_kind::none, codec_kind::bf16, codec_kind::fp16};
  return o;
}

TEST(allreduce_bench, sizes_go_from_min_to_max_by_the_factor_in_whole_elements) {
  allreduce_options o;
  o.min_bytes = 1 * MiB;
  o.max_bytes = 2 * GiB;
  o.step_factor = 2;
  const std::vector<std::uint64_t> s = allreduce_sizes(o);
  ASSERT_EQ(s.size(), 12u);
  EXPECT_EQ(s.front(), 1 * MiB);
  EXPECT_EQ(s.back(), 2 * GiB);
  o.min_bytes = 10;
  o.max_bytes = 100;
  o.step_factor = 3;
  EXPECT_EQ(allreduce_sizes(o), (std::vector<std::uint64_t>{8, 28, 88}));  // 10, 30, 90 in whole floats
  o.min_bytes = 2;
  EXPECT_THROW((void)allreduce_sizes(o), logic_error);
  o.min_bytes = 200;
  EXPECT_THROW((void)allreduce_sizes(o), logic_error);  // above max
  o.min_bytes = 10;
  o.step_factor = 1;
  EXPECT_THROW((void)allreduce_sizes(o), logic_error);
  o.step_factor = 2;
  o.codecs.clear();
  EXPECT_THROW((void)allreduce_sizes(o), logic_error);
}

TEST(allreduce_bench, every_element_of_every_size_and_codec_is_the_mean_over_ranks) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    host_group g(n);
    const allreduce_options o = small();
    const allreduce_result r = run_allreduce(g.ranks, o);
    EXPECT_EQ(r.ranks, n);
    EXPECT_EQ(r.backend, "host");
    ASSERT_EQ(r.rows.size(), 3u * 3u);  // 4, 16, 64 KiB x fp32, bf16, fp16
    EXPECT_EQ(r.wrong(), 0u);
    for (const allreduce_row& row : r.rows) {
      EXPECT_EQ(row.count * 4, row.bytes);
      EXPECT_EQ(row.checked, 2 * row.count * static_cast<std::uint64_t>(n));  // both runs, every rank
      EXPECT_EQ(row.wire_bytes, row.codec == codec_kind::none ? row.bytes : row.bytes / 2);
      EXPECT_GT(row.out_of_place.time_us, 0);
      // nccl-tests' formulas: algbw over the wire bytes, busbw its 2(n-1)/n share, effbw over fp32 bytes.
      EXPECT_DOUBLE_EQ(row.out_of_place.algbw, row.wire_bytes / (row.out_of_place.time_us * 1e-6) / 1e9);
      EXPECT_DOUBLE_EQ(row.out_of_place.busbw, row.out_of_place.algbw * 2 * (n - 1) / n);
      EXPECT_DOUBLE_EQ(row.in_place.effbw, row.bytes / (row.in_place.time_us * 1e-6) / 1e9);
      if (row.codec == codec_kind::none) {
        EXPECT_EQ(row.codec_us, 0);
      } else {
        EXPECT_GT(row.codec_us, 0);
      }
    }
  }
}

TEST(allreduce_bench, a_wrong_reduction_is_counted_element_by_element) {
  host_group g(2);
  summing a(*g.comms[0]), b(*g.comms[1]);
  const std::vector<comm::communicator*> ranks{&a, &b};
  allreduce_options o = small();
  o.codecs = {codec_kind::none, codec_kind::bf16};
  const allreduce_result r = run_allreduce(ranks, o);
  for (const allreduce_row& row : r.rows) {
    if (row.codec == codec_kind::none) {
      // The sum is twice the mean: wrong wherever the mean is not within the bound of 0.
      EXPECT_GT(row.out_of_place.wrong, row.count);  // over half of the 2 x count elements checked
      EXPECT_GT(row.in_place.wrong, row.count);
    } else {
      EXPECT_EQ(row.out_of_place.wrong + row.in_place.wrong, 0u);  // the codecs sum by design
    }
  }
  EXPECT_NE(format_text(r).find("FAILED"), std::string::npos);
}

TEST(allreduce_bench, the_table_and_json_carry_nccl_tests_columns_and_the_codec_columns) {
  host_group g(2, comm::comm_link::nvlink());  // over the modelled NVLink
  allreduce_options o = small();
  o.check = false;
  allreduce_result r = run_allreduce(g.ranks, o);
  r.link = "nvlink, 330 GB/s bus";
  const std::string text = format_text(r);
  for (const char* column : {"size", "count", "type", "codec", "wire", "time", "algbw", "busbw", "effbw",
                             "#wrong", "out-of-place", "in-place", "# Out of bounds values : 0 OK",
                             "# Avg bus bandwidth", "(bf16)", "(fp16)", "(fp32)", "modelled link: nvlink"})
    EXPECT_NE(text.find(column), std::string::npos) << column << "\n" << text;
  EXPECT_NE(text.find("N/A"), std::string::npos) << text;  // no check: no #wrong figure

  const nlohmann::json j = to_json(r, o, stamp_now("ferry bench allreduce"));
  EXPECT_EQ(j.at("tool"), "ferry bench allreduce");
  EXPECT_EQ(j.at("ranks"), 2);
  EXPECT_EQ(j.at("rows").size(), 9u);
  const nlohmann::json& row = j.at("rows").at(1);
  EXPECT_EQ(row.at("codec"), "bf16");
  EXPECT_EQ(row.at("wire_bytes"), 2048);
  for (const char* key : {"time_us", "algbw", "busbw", "effbw", "nwrong"})
    EXPECT_TRUE(row.at("out_of_place").contains(key)) << key;
  EXPECT_DOUBLE_EQ(j.at("average_bus_bandwidth").at("fp32").get<double>(), r.average_busbw(codec_kind::none));
  EXPECT_EQ(j.at("out_of_bounds"), "OK");
  // The modelled link bounds the bus bandwidth: no size beats 330 GB/s.
  for (const allreduce_row& x : r.rows) EXPECT_LE(x.out_of_place.busbw, 330.0 * 1.0001);
}

TEST(allreduce_bench, ranks_that_are_not_one_group_are_refused) {
  host_group g(2);
  const std::vector<comm::communicator*> swapped{g.ranks[1], g.ranks[0]};
  EXPECT_THROW((void)run_allreduce(swapped, small()), logic_error);
  const std::vector<comm::communicator*> half{g.ranks[0]};
  EXPECT_THROW((void)run_allreduce(half, small()), logic_error);
}

}  // namespace
