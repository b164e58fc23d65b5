// ferry probe --topology, host part: CPU lists, sysfs reading against a fake sysfs tree, the
// nvidia-smi-like matrix and the JSON.
#include "ferry/probe/topology.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "ferry/core/error.hpp"

namespace ferry::probe {
namespace {

namespace fs = std::filesystem;

// A fake sysfs root in a fresh temporary folder, removed at the end of the test.
class fake_sysfs {
 public:
  fake_sysfs() {
    std::random_device rd;
    root_ = fs::temp_directory_path() / ("ferry-sysfs-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(root_);
  }
  fake_sysfs(const fake_sysfs&) = delete;
  fake_sysfs& operator=(const fake_sysfs&) = delete;
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void write(const std::string& relative, const std::string& text) const {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // A PCI device at /sys/devices/<tree>, linked from /sys/bus/pci/devices/<bus id> as on Linux.
  void pci_device(const std::string& tree, const std::string& bus_id) const {
    const fs::path dev = root_ / "devices" / tree;
    fs::create_directories(dev);
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directory_symlink(dev, root_ / "bus/pci/devices" / bus_id);
  }
  [[nodiscard]] std::string root() const { return root_.string(); }

 private:
  fs::path root_;
};

TEST(topology, parses_cpu_lists) {
  EXPECT_EQ(parse_cpulist("0-3,8-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(parse_cpulist("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpulist(" 7,1-2 "), (std::vector<int>{1, 2, 7}));
  EXPECT_TRUE(parse_cpulist("").empty());
  EXPECT_TRUE(parse_cpulist("\n").empty());
  EXPECT_EQ(format_cpulist({0, 1, 2, 3, 8, 9, 10, 11}), "0-3,8-11");
  EXPECT_EQ(format_cpulist({4}), "4");
  EXPECT_EQ(format_cpulist({1, 3, 4}), "1,3-4");
  EXPECT_EQ(format_cpulist({}), "");
}

TEST(topology, rejects_malformed_cpu_lists_naming_the_text) {
  for (const char* bad : {"0-", "a-3", "3-1", "0,,2", "-4", "1-2-3", "0x3"}) {
    try {
      static_cast<void>(parse_cpulist(bad));
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const input_error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(topology, reads_pcie_generation_from_link_speed) {
  EXPECT_EQ(pcie_gen_from_speed("2.5 GT/s PCIe\n"), 1);
  EXPECT_EQ(pcie_gen_from_speed("8.0 GT/s PCIe"), 3);
  EXPECT_EQ(pcie_gen_from_speed("16.0 GT/s PCIe"), 4);
  EXPECT_EQ(pcie_gen_from_speed("32.0 GT/s PCIe"), 5);
  EXPECT_EQ(pcie_gen_from_speed("64.0 GT/s PCIe"), 6);
  EXPECT_EQ(pcie_gen_from_speed("Unknown"), 0);
  EXPECT_EQ(normalize_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_bus_id("0000:3B:00.0\n"), "0000:3b:00.0");
}

TEST(topology, reads_numa_nodes_and_cpus_from_sysfs) {
  fake_sysfs sys;
  sys.write("devices/system/cpu/online", "0-15\n");
  sys.write("devices/system/node/node0/cpulist", "0-3,8-11\n");
  sys.write("devices/system/node/node0/meminfo", "Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 5 kB\n");
  sys.write("devices/system/node/node1/cpulist", "4-7,12-15\n");
  sys.write("devices/system/node/possible", "0-1\n");  // not a node folder
  EXPECT_EQ(read_cpu_count(sys.root()), 16);
  const auto nodes = read_numa_nodes(sys.root());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].id, 0);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(nodes[0].memory_bytes, 1024u * 1024u);
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_EQ(format_cpulist(nodes[1].cpus), "4-7,12-15");
  EXPECT_EQ(nodes[1].memory_bytes, 0u);

  // Without sysfs NUMA nodes (a container, say) there are none, and that is not an error.
  fake_sysfs empty;
  EXPECT_TRUE(read_numa_nodes(empty.root()).empty());
  EXPECT_EQ(read_cpu_count(empty.root()), 0);
}

TEST(topology, names_the_sysfs_file_it_cannot_parse) {
  fake_sysfs sys;
  sys.write("devices/system/node/node0/cpulist", "0-3,x\n");
  try {
    static_cast<void>(read_numa_nodes(sys.root()));
    ADD_FAILURE() << "accepted a bad cpulist";
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("node0/cpulist"), std::string::npos) << e.what();
  }
  sys.pci_device("pci0000:00/0000:00:01.0/0000:01:00.0", "0000:01:00.0");
  sys.write("devices/pci0000:00/0000:00:01.0/0000:01:00.0/current_link_width", "sixteen\n");
  try {
    static_cast<void>(read_pci_device(sys.root(), "0000:01:00.0"));
    ADD_FAILURE() << "accepted a bad link width";
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("current_link_width"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sixteen"), std::string::npos) << e.what();
  }
}

TEST(topology, reads_a_pci_device_and_derives_the_path_between_two) {
  fake_sysfs sys;
  const std::string gpu0 = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0";
  const std::string gpu1 = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
  const std::string gpu2 = "pci0000:00/0000:00:02.0/0000:05:00.0";
  const std::string gpu3 = "pci0000:80/0000:80:01.0/0000:81:00.0";
  sys.pci_device(gpu0, "0000:03:00.0");
  sys.pci_device(gpu1, "0000:04:00.0");
  sys.pci_device(gpu2, "0000:05:00.0");
  sys.pci_device(gpu3, "0000:81:00.0");
  const std::string dir0 = "devices/" + gpu0 + "/";
  sys.write(dir0 + "numa_node", "0\n");
  sys.write(dir0 + "local_cpulist", "0-3,8-11\n");
  sys.write(dir0 + "current_link_speed", "32.0 GT/s PCIe\n");
  sys.write(dir0 + "current_link_width", "16\n");
  sys.write(dir0 + "max_link_speed", "32.0 GT/s PCIe\n");
  sys.write(dir0 + "max_link_width", "16\n");
  sys.write("devices/" + gpu1 + "/numa_node", "0\n");
  sys.write("devices/" + gpu2 + "/numa_node", "0\n");
  sys.write("devices/" + gpu3 + "/numa_node", "1\n");

  const pci_device d0 = read_pci_device(sys.root(), "0000:03:00.0");
  EXPECT_EQ(d0.numa_node, 0);
  EXPECT_EQ(format_cpulist(d0.local_cpus), "0-3,8-11");
  EXPECT_EQ(d0.link.current_gen, 5);
  EXPECT_EQ(d0.link.current_width, 16);
  EXPECT_EQ(d0.link.max_gen, 5);
  EXPECT_EQ(d0.link.max_width, 16);
  EXPECT_EQ(d0.link.source, "sysfs");
  EXPECT_TRUE(d0.notes.empty());

  const pci_device d1 = read_pci_device(sys.root(), "0000:04:00.0");
  EXPECT_EQ(d1.link.source, "");   // no link files
  EXPECT_FALSE(d1.notes.empty());  // local_cpulist is missing, and said so
  const pci_device d2 = read_pci_device(sys.root(), "0000:05:00.0");
  const pci_device d3 = read_pci_device(sys.root(), "0000:81:00.0");
  EXPECT_EQ(link_from_pci_paths(d0, d1), gpu_link::pix);  // one switch
  EXPECT_EQ(link_from_pci_paths(d0, d2), gpu_link::phb);  // only the host bridge shared
  EXPECT_EQ(link_from_pci_paths(d0, d3), gpu_link::sys);  // other host bridge, other NUMA node

  const pci_device missing = read_pci_device(sys.root(), "0000:99:00.0");
  EXPECT_EQ(missing.numa_node, -1);
  ASSERT_EQ(missing.notes.size(), 1u);
  EXPECT_NE(missing.notes[0].find("0000:99:00.0"), std::string::npos);
}

topology two_gpus() {
  topology t;
  t.cpu_count = 16;
  t.numa = {{0, {0, 1, 2, 3, 8, 9, 10, 11}, 64ULL << 30}, {1, {4, 5, 6, 7, 12, 13, 14, 15}, 64ULL << 30}};
  gpu_info g0;
  g0.ordinal = 0;
  g0.name = "NVIDIA H200";
  g0.pci_bus_id = "0000:19:00.0";
  g0.numa_node = 0;
  g0.cpu_affinity = {0, 1, 2, 3, 8, 9, 10, 11};
  g0.pcie = {5, 16, 5, 16, "nvml"};
  g0.nvlinks = 18;
  gpu_info g1 = g0;
  g1.ordinal = 1;
  g1.pci_bus_id = "0000:3b:00.0";
  g1.pcie = {1, 16, 5, 16, "nvml"};
  t.gpus = {g0, g1};
  t.pairs.assign(2, std::vector<gpu_pair>(2));
  t.pairs[0][0].link = t.pairs[1][1].link = gpu_link::self;
  for (auto [i, j] : {std::pair{0, 1}, std::pair{1, 0}}) {
    gpu_pair& p = t.pairs[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
    p.link = gpu_link::nvlink;
    p.nvlinks = 18;
    p.access_supported = true;
    p.native_atomics = true;
    p.checked = true;
  }
  t.pairs[0][1].gbps = 389.25;
  t.pairs[1][0].gbps = 390.5;
  t.p2p_bytes = 256ULL << 20;
  t.p2p_iterations = 5;
  t.nvml_note = "";
  return t;
}

TEST(topology, formats_an_nvidia_smi_like_matrix) {
  const std::string text = format_table(two_gpus());
  SCOPED_TRACE(text);
  EXPECT_NE(text.find("GPU0    GPU1    CPU Affinity        NUMA Affinity"), std::string::npos);
  EXPECT_NE(text.find("GPU0     X      NV18    0-3,8-11            0"), std::string::npos);
  EXPECT_NE(text.find("GPU1    NV18     X      0-3,8-11            0"), std::string::npos);
  EXPECT_NE(text.find("Gen5 x16"), std::string::npos);
  EXPECT_NE(text.find("Gen1 x16"), std::string::npos);
  EXPECT_NE(text.find("389.2"), std::string::npos);
  EXPECT_NE(text.find("390.5"), std::string::npos);
  EXPECT_NE(text.find("yes r0 A"), std::string::npos);
  EXPECT_NE(text.find("node 1: CPUs 4-7,12-15"), std::string::npos);
  EXPECT_NE(text.find("NV#  = Connection traversing a bonded set of # NVLinks"), std::string::npos);
}

TEST(topology, formats_one_gpu_and_no_gpu) {
  topology one = two_gpus();
  one.gpus.resize(1);
  one.pairs = {{gpu_pair{gpu_link::self}}};
  one.p2p_bytes = 0;
  one.nvml_note = "NVML not available: dlopen(\"libnvidia-ml.so.1\") failed: no such file";
  const std::string text = format_table(one);
  EXPECT_NE(text.find("GPU0     X      0-3,8-11"), std::string::npos) << text;
  EXPECT_NE(text.find("NVML not available"), std::string::npos) << text;
  // One GPU: the P2P matrix is just X.
  EXPECT_NE(text.find("one GPU, no pair to measure\n        GPU0      \nGPU0     X"), std::string::npos)
      << text;

  topology none;
  none.gpu_note = "the host backend has no GPUs";
  EXPECT_NE(format_table(none).find("GPUs: none (the host backend has no GPUs)"), std::string::npos);
}

TEST(topology, writes_json) {
  const auto j = nlohmann::json::parse(to_json(two_gpus()));
  EXPECT_EQ(j["tool"], "ferry probe --topology");
  EXPECT_EQ(j["host"]["cpu_count"], 16);
  ASSERT_EQ(j["host"]["numa_nodes"].size(), 2u);
  EXPECT_EQ(j["host"]["numa_nodes"][1]["cpus"], "4-7,12-15");
  ASSERT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["gpus"][1]["pci_bus_id"], "0000:3b:00.0");
  EXPECT_EQ(j["gpus"][1]["pcie"]["current_gen"], 1);
  EXPECT_EQ(j["gpus"][0]["nvlinks"], 18);
  ASSERT_EQ(j["pairs"].size(), 2u);
  EXPECT_EQ(j["pairs"][0]["from"], 0);
  EXPECT_EQ(j["pairs"][0]["to"], 1);
  EXPECT_EQ(j["pairs"][0]["link"], "NV18");
  EXPECT_DOUBLE_EQ(j["pairs"][0]["gbps"].get<double>(), 389.25);
  EXPECT_EQ(j["p2p"]["bytes"], 256ULL << 20);
}

TEST(topology, the_host_backend_reports_no_gpus_and_the_host) {
  fake_sysfs sys;
  sys.write("devices/system/cpu/online", "0-3\n");
  sys.write("devices/system/node/node0/cpulist", "0-3\n");
  topology_options opts;
  opts.sysfs_root = sys.root();
  const topology t = discover_topology(backend::host, opts);
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_FALSE(t.gpu_note.empty());
  EXPECT_EQ(t.cpu_count, 4);
  ASSERT_EQ(t.numa.size(), 1u);
  // The real machine's sysfs parses too.
  EXPECT_NO_THROW(static_cast<void>(discover_topology(backend::host, topology_options{})));
}

}  // namespace
}  // namespace ferry::probe
