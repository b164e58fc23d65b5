// The host communicator's modelled link: a collective lasts at least comm_link::modelled_time of the
// device's modelled clock (timing events), which a memcpy of the same bytes alone would not reach.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::host_ranks;
using testing::on_every_rank;

// A slow link, so the modelled time (milliseconds) dwarfs the memcpy of the bytes.
comm_options slow_link() {
  comm_options o;
  o.timeout = std::chrono::seconds(60);
  o.link.name = "slow";
  o.link.bus_gbps = 0.5;
  o.link.latency = std::chrono::milliseconds(2);
  o.link.model = true;
  return o;
}

struct model_case {
  collective op;
  int ranks;
};

class link_model_test : public ::testing::TestWithParam<model_case> {};

TEST_P(link_model_test, a_collective_lasts_at_least_its_modelled_time_on_every_rank) {
  const model_case c = GetParam();
  const comm_options o = slow_link();
  host_ranks g(c.ranks, o);
  constexpr std::size_t count = 1 << 19;  // 2 MiB of f32
  const std::size_t bytes =
      count * 4 * (c.op == collective::all_gather ? static_cast<std::size_t>(c.ranks) : 1);
  const double modelled_ms =
      std::chrono::duration<double, std::milli>(o.link.modelled_time(c.op, bytes, c.ranks)).count();
  ASSERT_GE(modelled_ms, 2.0);  // at least the latency
  on_every_rank(c.ranks, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const buffer send = d.alloc_device(count * 4);
    const buffer recv = d.alloc_device(count * 4 * static_cast<std::size_t>(c.ranks));
    event start = d.make_timing_event();
    event stop = d.make_timing_event();
    start.record(s);
    switch (c.op) {
      case collective::all_reduce: g[r].all_reduce(send, recv, count, dtype::f32, reduce_op::sum, s); break;
      case collective::all_gather: g[r].all_gather(send, recv, count, dtype::f32, s); break;
      case collective::broadcast: g[r].broadcast(send, recv, count, dtype::f32, 0, s); break;
      case collective::barrier: g[r].barrier(s); break;
    }
    stop.record(s);
    stop.synchronize();
    EXPECT_GE(d.elapsed_ms(start, stop), modelled_ms) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(
    host, link_model_test,
    ::testing::Values(model_case{collective::all_reduce, 2}, model_case{collective::all_reduce, 3},
                      model_case{collective::all_gather, 3}, model_case{collective::broadcast, 2},
                      model_case{collective::barrier, 4}),
    [](const ::testing::TestParamInfo<model_case>& p) {
      return std::string(to_string(p.param.op)) + "_" + std::to_string(p.param.ranks) + "_ranks";
    });

}  // namespace
}  // namespace ferry::comm
