// `ferry bench ddp` on the host communicator: the model's shapes, the scaled link, every level's gradients
// checked against the exact mean and across ranks, what each level's plan is, and a wrong reduction caught.
#include "ferry/bench/ddp_bench.hpp"

#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "bench/comm_groups.hpp"
#include "ferry/core/error.hpp"
#include "support/test_support.hpp"

using namespace ferry;
using namespace ferry::bench;
using ferry::testing::message_of;
using test_groups::host_group;
using test_groups::summing;

namespace {

TEST(ddp_bench, the_model_has_vit_l32s_parameters) {
  const std::vector<model_param>& p = vit_l32_params();
  ASSERT_EQ(p.size(), 4u + 24u * 12u + 4u);
  std::size_t total = 0;
  for (const model_param& x : p) total += x.elements;
  EXPECT_EQ(total, 306'535'400u);  // torchvision vit_l_32: 306.5 M parameters, 1.23 GB of fp32
  EXPECT_EQ(p[1].name, "conv_proj.weight");
  EXPECT_EQ(p[1].elements, 1024u * 3 * 32 * 32);
  EXPECT_EQ(p[6].name, "encoder.layers.encoder_layer_0.self_attention.in_proj_weight");
  EXPECT_EQ(p[6].elements, 3072u * 1024);
  EXPECT_EQ(p[6].shape.rows, 3072u);  // PowerSGD's view: rows x cols
  EXPECT_EQ(p[1].shape.cols, 3u * 32 * 32);
  EXPECT_EQ(p[3].shape.rows, 1u);  // pos_embedding 1 x 50 x 1024: 1 x 51200
  EXPECT_EQ(p[2].shape.cols, 1u);  // a bias: n x 1
  for (const model_param& x : p) EXPECT_EQ(x.shape.elements(), x.elements) << x.name;
  EXPECT_EQ(p.back().name, "heads.head.bias");
  EXPECT_EQ(p.back().unit, 25);
  ddp_options o;
  EXPECT_EQ(o.gradient_bytes(), 306'535'400u * 4);
  o.scale = 1e-3;
  for (std::size_t n : o.elements()) EXPECT_GE(n, 1u);  // the 1024-element norms keep one element
}

TEST(ddp_bench, the_host_link_keeps_the_references_share_of_a_step) {
  const comm::comm_link l = ddp_host_link(comm::comm_link::nvlink(), 1e-3, std::chrono::microseconds(41'500));
  EXPECT_DOUBLE_EQ(l.bus_gbps, 330.0 * 1e-3 * 2);  // a thousandth of the bytes in half the step
  EXPECT_EQ(l.latency, std::chrono::microseconds(10));
  EXPECT_THROW((void)ddp_host_link(comm::comm_link::nvlink(), 0, std::chrono::milliseconds(1)), logic_error);
}

ddp_options small(std::chrono::milliseconds step) {
  ddp_options o = default_ddp_options(backend::host);
  o.compute = step;
  o.warmup = 1;
  o.steps = 3;
  o.learn_steps = 2;
  return o;
}

TEST(ddp_bench, every_level_reduces_every_gradient_to_the_mean_identically_on_every_rank) {
  const ddp_options o = small(std::chrono::milliseconds(20));
  host_group g(2, ddp_host_link(comm::comm_link::host_memory(), o.scale, o.compute));
  const ddp_result r = run_ddp(g.ranks, o);
  ASSERT_EQ(r.rows.size(), 9u);
  EXPECT_EQ(r.ranks, 2);
  EXPECT_EQ(r.comm_backend, "host");
  const std::vector<std::size_t> e = o.elements();
  const std::uint64_t elements = std::accumulate(e.begin(), e.end(), std::uint64_t{0});
  EXPECT_EQ(r.wrong(), 0u);
  for (const ladder_row& row : r.rows) {
    SCOPED_TRACE(row.level);
    // Every element of every gradient, on both ranks: against the exact mean, or for PowerSGD's
    // compressed matrices (no element-wise bound) across ranks by the buckets' checksums.
    EXPECT_EQ(row.checked + static_cast<std::uint64_t>(row.extra("approximated")), 2 * elements);
    if (row.level != "powersgd") {
      EXPECT_EQ(row.extra("approximated"), 0);
    }
    EXPECT_EQ(row.steps, 3);
    EXPECT_GT(row.steps_per_s, 0);
  }
  const ladder_row& single = *r.find("single");
  EXPECT_DOUBLE_EQ(single.ratio_to_ideal, 1);
  EXPECT_EQ(single.extra("buckets"), 0);
  // One bucket: launched by the last gradient, so none of its all-reduce runs before backward ends.
  const ladder_row& one = *r.find("one-bucket");
  EXPECT_EQ(one.extra("buckets"), 1);
  EXPECT_LT(one.extra("hidden"), 0.01);
  EXPECT_GT(one.extra("exposed_ms"), 0);
  // Buckets of 25 MB (scaled): many, launched during backward.
  const ladder_row& b25 = *r.find("25MB");
  EXPECT_GT(b25.extra("buckets"), 10);
  EXPECT_GT(b25.extra("hidden"), one.extra("hidden"));
  EXPECT_EQ(b25.extra("lossy_buckets"), 0);
  // The codecs put half the bytes on the wire.
  for (const char* level : {"fp16", "bf16"}) {
    const ladder_row& c = *r.find(level);
    EXPECT_EQ(c.extra("lossy_buckets"), c.extra("buckets")) << level;
    EXPECT_NEAR(c.extra("wire_mb"), b25.extra("wire_mb") / 2, b25.extra("wire_mb") * 0.01) << level;
  }
  // PowerSGD rank 1 compresses the matrices (most of the bytes) and sends far fewer floats.
  const ladder_row& psgd = *r.find("powersgd");
  EXPECT_GT(psgd.extra("approximated"), static_cast<double>(elements));
  EXPECT_LT(psgd.extra("wire_mb"), b25.extra("wire_mb") / 4);
  EXPECT_EQ(psgd.extra("lossy_buckets"), psgd.extra("buckets"));
  // The automatic plans: lossless never lossy; both predicted their exposed time.
  const ladder_row& lossless = *r.find("auto");
  EXPECT_EQ(lossless.extra("lossy_buckets"), 0);
  EXPECT_GE(lossless.extra("buckets"), 1);
  for (const char* level : {"auto", "auto-lossy"}) {
    const ladder_row& a = *r.find(level);
    bool predicted = false;
    for (const ladder_extra& x : a.extras) predicted = predicted || x.name == "predicted_exposed_ms";
    EXPECT_TRUE(predicted) << level;
  }
  // The table and the JSON carry the ladder's columns.
  const std::string table = format_table(r);
  for (const char* column :
       {"steps/s", "x single", "hidden", "exposed ms", "comm ms", "buckets", "lossy", "wire MB"})
    EXPECT_NE(table.find(column), std::string::npos) << column << "\n" << table;
  const nlohmann::json j = ladder_json(r, stamp_now("ferry bench ddp"));
  EXPECT_EQ(j.at("ladder"), "ddp");
  EXPECT_DOUBLE_EQ(j.at("config").at("scale").get<double>(), o.scale);
  EXPECT_TRUE(j.at("rows").at(1).contains("hidden"));
}

TEST(ddp_bench, a_wrong_reduction_is_caught) {
  ddp_options o = small(std::chrono::milliseconds(10));
  o.levels = {"single", "25MB"};
  host_group g(2);
  summing a(*g.comms[0]), b(*g.comms[1]);
  const std::vector<comm::communicator*> ranks{&a, &b};
  const ddp_result r = run_ddp(ranks, o);
  EXPECT_EQ(r.find("single")->wrong, 0u);
  // The sum is twice the mean: wrong wherever the mean is not within the bound of 0 (nearly everywhere).
  EXPECT_GT(r.find("25MB")->wrong, r.find("25MB")->checked / 2);
}

TEST(ddp_bench, a_group_over_two_callers_as_over_two_processes_is_checked_whole_and_timed_on_rank_0) {
  // Each rank driven by its own run_ddp, as each process of an mpirun job runs its GPU's rank.
  ddp_options o = small(std::chrono::milliseconds(10));
  o.levels = {"single", "25MB", "bf16", "auto"};
  host_group g(2);
  auto other = std::async(std::launch::async, [&] { return run_ddp(std::span(&g.ranks[1], 1), o); });
  const ddp_result zero = run_ddp(std::span(&g.ranks[0], 1), o);
  const ddp_result one = other.get();
  const std::vector<std::size_t> e = o.elements();
  const std::uint64_t elements = std::accumulate(e.begin(), e.end(), std::uint64_t{0});
  EXPECT_EQ(zero.ranks, 2);
  EXPECT_EQ(zero.first_rank, 0);
  EXPECT_EQ(one.first_rank, 1);
  ASSERT_EQ(zero.rows.size(), 4u);
  ASSERT_EQ(one.rows.size(), 4u);
  for (std::size_t i = 0; i < zero.rows.size(); ++i) {
    SCOPED_TRACE(zero.rows[i].level);
    // Both callers hold the whole group's checks: both ranks' gradients.
    EXPECT_EQ(zero.rows[i].checked, 2 * elements);
    EXPECT_EQ(one.rows[i].checked, 2 * elements);
    EXPECT_EQ(zero.rows[i].wrong, 0u);
    EXPECT_EQ(one.rows[i].wrong, 0u);
    // Only rank 0's caller timed the steps.
    EXPECT_EQ(zero.rows[i].steps, o.steps);
    EXPECT_EQ(one.rows[i].steps, 0);
  }
  EXPECT_GT(zero.find("25MB")->extra("buckets"), 1);
}

TEST(ddp_bench, a_wrong_reduction_in_a_group_over_two_callers_is_counted_by_both) {
  ddp_options o = small(std::chrono::milliseconds(10));
  o.levels = {"25MB"};
  host_group g(2);
  summing a(*g.comms[0]), b(*g.comms[1]);  // they sum where they should average
  comm::communicator* const r0 = &a;
  comm::communicator* const r1 = &b;
  auto other = std::async(std::launch::async, [&] { return run_ddp(std::span(&r1, 1), o); });
  const ddp_result zero = run_ddp(std::span(&r0, 1), o);
  const ddp_result one = other.get();
  EXPECT_GT(zero.rows.at(0).wrong, zero.rows.at(0).checked / 2);
  EXPECT_EQ(zero.rows.at(0).wrong, one.rows.at(0).wrong);
}

TEST(ddp_bench, bad_settings_and_ranks_are_refused) {
  host_group g(2);
  ddp_options o = small(std::chrono::milliseconds(10));
  o.scale = 0;
  EXPECT_THROW((void)run_ddp(g.ranks, o), logic_error);
  o = small(std::chrono::milliseconds(10));
  o.warmup = 0;
  EXPECT_THROW((void)run_ddp(g.ranks, o), logic_error);
  o = small(std::chrono::milliseconds(10));
  o.levels = {"2000MB"};
  EXPECT_THROW((void)run_ddp(g.ranks, o), logic_error);
  const std::vector<comm::communicator*> swapped{g.ranks[1], g.ranks[0]};
  EXPECT_THROW((void)run_ddp(swapped, small(std::chrono::milliseconds(10))), logic_error);
  host_group three(3);
  const std::vector<comm::communicator*> gap{three.ranks[0], three.ranks[2]};
  const std::string why =
      message_of<logic_error>([&] { (void)run_ddp(gap, small(std::chrono::milliseconds(10))); });
  EXPECT_NE(why.find("entry 1 is not rank 1 of 3"), std::string::npos) << why;
}

}  // namespace
