// The JSON shapes the probe layer owns: a device (to_json(device_info)) and a probe result
// (probe::to_json). The CLI, the C ABI and the benches all print these, so their keys are pinned here;
// tests/python/test_schema.py checks that the CLI and the C ABI print the same.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ferry/core/units.hpp"
#include "ferry/probe/probe.hpp"

namespace {

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> out;
  for (const auto& [k, v] : j.items()) out.insert(k);
  return out;
}

const std::set<std::string> device_keys{"backend",      "name",       "ordinal",
                                        "memory_bytes", "pci_bus_id", "copy_engines"};

TEST(json, device_info_has_one_shape) {
  ferry::device_info i;
  i.kind = ferry::backend::cuda;
  i.name = "NVIDIA \"H100\"";  // a quote must survive as JSON
  i.ordinal = 3;
  i.memory_bytes = 80 * ferry::GiB;
  i.pci_bus_id = "0000:3b:00.0";
  i.copy_engines = 4;
  const auto j = nlohmann::json::parse(ferry::to_json(i));
  EXPECT_EQ(keys_of(j), device_keys);
  EXPECT_EQ(j["backend"], "cuda");
  EXPECT_EQ(j["name"], "NVIDIA \"H100\"");
  EXPECT_EQ(j["ordinal"], 3);
  EXPECT_EQ(j["memory_bytes"], 80 * ferry::GiB);
  EXPECT_EQ(j["pci_bus_id"], "0000:3b:00.0");
  EXPECT_EQ(j["copy_engines"], 4);
  // One line by default (the C ABI's form), indented on request.
  EXPECT_EQ(ferry::to_json(i).find('\n'), std::string::npos);
  EXPECT_NE(ferry::to_json(i, 2).find('\n'), std::string::npos);
}

ferry::probe::options small_options() {
  ferry::probe::options o;
  o.copy_bytes = 1 * ferry::MiB;
  o.warmup = 0;
  o.iterations = 1;
  o.pin_bytes = 1 * ferry::MiB;
  return o;
}

TEST(json, probe_result_has_one_shape) {
  auto dev = ferry::make_host_device();
  const auto r = ferry::probe::run(*dev, small_options());
  const auto j = nlohmann::json::parse(ferry::probe::to_json(r));
  EXPECT_EQ(keys_of(j),
            (std::set<std::string>{"device", "memlock", "options", "links", "both_directions", "pin_cost"}));
  // The device is device_info's own JSON, not a copy of some of its fields.
  EXPECT_EQ(j["device"], nlohmann::json::parse(ferry::to_json(r.device)));
  EXPECT_EQ(keys_of(j["memlock"]),
            (std::set<std::string>{"soft_bytes", "hard_bytes", "unlimited", "cap_ipc_lock", "enforced"}));
  EXPECT_EQ(keys_of(j["options"]),
            (std::set<std::string>{"copy_bytes", "warmup", "iterations", "pin_bytes", "check"}));
  EXPECT_EQ(j["options"]["copy_bytes"], 1 * ferry::MiB);
  ASSERT_EQ(j["links"].size(), r.links.size());
  for (const auto& l : j["links"]) {
    EXPECT_EQ(keys_of(l), (std::set<std::string>{"name", "direction", "host_memory", "bytes", "iterations",
                                                 "median_gbps", "min_gbps", "max_gbps", "checked"}));
  }
  EXPECT_EQ(j["links"][0]["name"], r.links[0].name);
  EXPECT_EQ(keys_of(j["both_directions"]),
            (std::set<std::string>{"bytes_each_way", "iterations", "total_gbps", "h2d_gbps", "d2h_gbps"}));
  EXPECT_EQ(keys_of(j["pin_cost"]),
            (std::set<std::string>{"bytes", "alloc_seconds", "free_seconds", "seconds_per_gib"}));
  EXPECT_EQ(j["pin_cost"]["bytes"], 1 * ferry::MiB);
}

TEST(json, probe_result_keeps_its_keys_when_the_pinning_cost_is_not_measured) {
  auto dev = ferry::make_host_device();
  ferry::probe::options o = small_options();
  o.measure_pin_cost = false;
  const auto j = nlohmann::json::parse(ferry::probe::to_json(ferry::probe::run(*dev, o)));
  ASSERT_TRUE(j.contains("pin_cost"));
  EXPECT_TRUE(j["pin_cost"].is_null());
}

}  // namespace
