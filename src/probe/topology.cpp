// The host part of ferry probe --topology: sysfs parsing, the nvidia-smi-like tables and JSON. The GPU
// part is detail::discover_gpus (topology_cuda.cpp, or topology_no_cuda.cpp without CUDA).
#include "ferry/probe/topology.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::probe {
namespace {

namespace fs = std::filesystem;

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::optional<long> parse_long(std::string_view s) noexcept {
  s = trim(s);
  long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// The contents of a sysfs file, or nullopt when it does not exist or cannot be read.
std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

long parse_number_file(const fs::path& p, std::string_view text) {
  const auto v = parse_long(text);
  if (!v) throw input_error(fmt::format("{}: expected an integer, found \"{}\"", p.string(), trim(text)));
  return *v;
}

std::string gen_width(int gen, int width) {
  if (gen == 0 && width == 0) return "?";
  return fmt::format("Gen{} x{}", gen == 0 ? std::string("?") : std::to_string(gen),
                     width == 0 ? std::string("?") : std::to_string(width));
}

std::string link_cell(const gpu_pair& p, bool self) {
  if (self) return "X";
  if (p.link == gpu_link::nvlink) return fmt::format("NV{}", p.nvlinks);
  return std::string(to_string(p.link));
}

}  // namespace

std::string_view to_string(gpu_link l) noexcept {
  switch (l) {
    case gpu_link::self: return "X";
    case gpu_link::nvlink: return "NV";
    case gpu_link::pix: return "PIX";
    case gpu_link::pxb: return "PXB";
    case gpu_link::phb: return "PHB";
    case gpu_link::node: return "NODE";
    case gpu_link::sys: return "SYS";
    case gpu_link::unknown: return "?";
  }
  return "?";
}

std::vector<int> parse_cpulist(std::string_view text) {
  std::vector<int> cpus;
  std::string_view rest = trim(text);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    auto bad = [&](std::string_view why) {
      return input_error(fmt::format("CPU list \"{}\": {} in \"{}\"; expected ranges like \"0-3,8-11\"",
                                     trim(text), why, part));
    };
    if (part.empty()) throw bad("an empty entry");
    const std::size_t dash = part.find('-');
    const auto first = parse_long(part.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : parse_long(part.substr(dash + 1));
    if (!first || !last) throw bad("not a number");
    if (*first < 0 || *last < *first) throw bad("a reversed or negative range");
    if (*last > 1 << 20) throw bad("a CPU number above 1048576");
    for (long c = *first; c <= *last; ++c) cpus.push_back(static_cast<int>(c));
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

int pcie_gen_from_speed(std::string_view text) noexcept {
  text = trim(text);
  const std::size_t gt = text.find("GT/s");
  if (gt == std::string_view::npos) return 0;
  const std::string number(trim(text.substr(0, gt)));
  char* end = nullptr;
  const double rate = std::strtod(number.c_str(), &end);
  if (end == number.c_str()) return 0;
  // Transfer rates per lane of PCIe generations 1 to 6.
  constexpr double rates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  for (int g = 0; g < 6; ++g) {
    if (rate > rates[g] * 0.9 && rate < rates[g] * 1.1) return g + 1;
  }
  return 0;
}

std::string normalize_bus_id(std::string_view bus_id) {
  std::string s(trim(bus_id));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // NVML writes an 8-digit domain ("00000000:3b:00.0"); sysfs and CUDA write 4 digits.
  const std::size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s.erase(0, colon - 4);
  return s;
}

std::vector<numa_node> read_numa_nodes(const std::string& sysfs_root) {
  std::vector<numa_node> nodes;
  const fs::path dir = fs::path(sysfs_root) / "devices/system/node";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return nodes;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("node")) continue;
    const auto id = parse_long(std::string_view(name).substr(4));
    if (!id) continue;  // "node" prefixed files that are not nodes (none today)
    numa_node n;
    n.id = static_cast<int>(*id);
    const fs::path cpulist = entry.path() / "cpulist";
    if (auto text = read_file(cpulist)) {
      try {
        n.cpus = parse_cpulist(*text);
      } catch (const input_error& e) {
        throw input_error(fmt::format("{}: {}", cpulist.string(), e.what()));
      }
    }
    if (auto text = read_file(entry.path() / "meminfo")) {
      std::istringstream lines(*text);
      std::string line;
      while (std::getline(lines, line)) {
        const std::size_t at = line.find("MemTotal:");
        if (at == std::string::npos) continue;
        std::string_view rest = trim(std::string_view(line).substr(at + 9));
        const std::size_t space = rest.find(' ');
        const auto kb = parse_long(rest.substr(0, space));
        if (!kb)
          throw input_error(
              fmt::format("{}: cannot read MemTotal from \"{}\"", (entry.path() / "meminfo").string(), line));
        n.memory_bytes = static_cast<std::uint64_t>(*kb) * 1024;
      }
    }
    nodes.push_back(std::move(n));
  }
  std::sort(nodes.begin(), nodes.end(), [](const numa_node& a, const numa_node& b) { return a.id < b.id; });
  return nodes;
}

int read_cpu_count(const std::string& sysfs_root) {
  const fs::path p = fs::path(sysfs_root) / "devices/system/cpu/online";
  const auto text = read_file(p);
  if (!text) return 0;
  try {
    return static_cast<int>(parse_cpulist(*text).size());
  } catch (const input_error& e) {
    throw input_error(fmt::format("{}: {}", p.string(), e.what()));
  }
}

pci_device read_pci_device(const std::string& sysfs_root, std::string_view bus_id) {
  pci_device d;
  d.bus_id = normalize_bus_id(bus_id);
  const fs::path dir = fs::path(sysfs_root) / "bus/pci/devices" / d.bus_id;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    d.notes.push_back(fmt::format("{} is missing", dir.string()));
    return d;
  }
  const fs::path resolved = fs::canonical(dir, ec);
  d.device_path = ec ? dir.string() : resolved.string();
  auto missing = [&](const char* file) {
    d.notes.push_back(fmt::format("{} is missing", (dir / file).string()));
  };

  if (auto text = read_file(dir / "numa_node")) {
    d.numa_node = static_cast<int>(parse_number_file(dir / "numa_node", *text));
    if (d.numa_node < 0) d.numa_node = -1;
  } else {
    missing("numa_node");
  }
  if (auto text = read_file(dir / "local_cpulist")) {
    try {
      d.local_cpus = parse_cpulist(*text);
    } catch (const input_error& e) {
      throw input_error(fmt::format("{}: {}", (dir / "local_cpulist").string(), e.what()));
    }
  } else {
    missing("local_cpulist");
  }
  bool any = false;
  auto speed = [&](const char* file, int& gen) {
    if (auto text = read_file(dir / file)) {
      gen = pcie_gen_from_speed(*text);  // "Unknown" (a link that is down) reads as 0
      any = true;
    }
  };
  auto width = [&](const char* file, int& w) {
    if (auto text = read_file(dir / file)) {
      w = static_cast<int>(parse_number_file(dir / file, *text));
      any = true;
    }
  };
  speed("current_link_speed", d.link.current_gen);
  width("current_link_width", d.link.current_width);
  speed("max_link_speed", d.link.max_gen);
  width("max_link_width", d.link.max_width);
  if (any) d.link.source = "sysfs";
  return d;
}

gpu_link link_from_pci_paths(const pci_device& a, const pci_device& b) noexcept {
  auto components = [](const std::string& path) {
    std::vector<std::string_view> out;
    std::string_view rest(path);
    const std::size_t devices = rest.find("/devices/");
    if (devices == std::string_view::npos) return out;
    rest.remove_prefix(devices + 9);
    while (!rest.empty()) {
      const std::size_t slash = rest.find('/');
      out.push_back(rest.substr(0, slash));
      if (slash == std::string_view::npos) break;
      rest.remove_prefix(slash + 1);
    }
    return out;
  };
  const auto pa = components(a.device_path);
  const auto pb = components(b.device_path);
  const bool other_node = a.numa_node >= 0 && b.numa_node >= 0 && a.numa_node != b.numa_node;
  if (pa.empty() || pb.empty()) return other_node ? gpu_link::sys : gpu_link::unknown;
  std::size_t common = 0;
  while (common < pa.size() && common < pb.size() && pa[common] == pb[common]) ++common;
  if (common == 0) return other_node ? gpu_link::sys : gpu_link::node;  // different host bridges
  if (common == 1) return gpu_link::phb;                                // only the host bridge shared
  // Below a shared bridge: a device hanging one switch level down (downstream port + device) is PIX.
  const std::size_t below = std::max(pa.size(), pb.size()) - common;
  return below <= 2 ? gpu_link::pix : gpu_link::pxb;
}

topology discover_topology(backend b, const topology_options& opts, progress_fn progress) {
  FERRY_EXPECTS(
      !opts.measure_p2p || (opts.p2p_bytes > 0 && opts.p2p_iterations >= 1 && opts.p2p_warmup >= 0),
      fmt::format("topology: P2P copies of {} bytes, {} iterations, {} warm-up: expected bytes > 0, "
                  "iterations >= 1, warm-up >= 0",
                  opts.p2p_bytes, opts.p2p_iterations, opts.p2p_warmup));
  topology t;
  if (progress) progress(fmt::format("reading host NUMA nodes from {}", opts.sysfs_root));
  t.cpu_count = read_cpu_count(opts.sysfs_root);
  t.numa = read_numa_nodes(opts.sysfs_root);
  if (b != backend::cuda) {
    t.gpu_note = "the host backend has no GPUs (use --backend cuda on a machine with a GPU)";
    return t;
  }
  if (!opts.gpus) {
    t.gpu_note = "GPU discovery was not asked for";
    return t;
  }
  detail::discover_gpus(t, opts, progress);
  // Where sysfs gives a GPU no NUMA node (virtual machines do), the node holding all its local CPUs is its
  // node, as nvidia-smi reports it.
  for (auto& g : t.gpus) {
    if (g.numa_node >= 0 || g.cpu_affinity.empty()) continue;
    for (const auto& node : t.numa) {
      if (std::includes(node.cpus.begin(), node.cpus.end(), g.cpu_affinity.begin(), g.cpu_affinity.end())) {
        g.numa_node = node.id;
        break;
      }
    }
  }
  return t;
}

std::string format_table(const topology& t) {
  std::string out;
  const std::size_t n = t.gpus.size();
  if (n == 0) {
    out += fmt::format("GPUs: none ({})\n", t.gpu_note.empty() ? "no GPU found" : t.gpu_note);
  } else {
    // The nvidia-smi topo -m matrix.
    std::string header = fmt::format("{:<8}", "");
    for (const auto& g : t.gpus) header += fmt::format("{:<8}", fmt::format("GPU{}", g.ordinal));
    header += fmt::format("{:<20}{}\n", "CPU Affinity", "NUMA Affinity");
    out += header;
    for (std::size_t i = 0; i < n; ++i) {
      std::string row = fmt::format("{:<8}", fmt::format("GPU{}", t.gpus[i].ordinal));
      for (std::size_t j = 0; j < n; ++j) {
        const bool self = i == j;
        const gpu_pair p = i < t.pairs.size() && j < t.pairs[i].size() ? t.pairs[i][j] : gpu_pair{};
        row += fmt::format("{:<8}", (self ? " " : "") + link_cell(p, self));
      }
      const std::string cpus = format_cpulist(t.gpus[i].cpu_affinity);
      row += fmt::format("{:<20}{}\n", cpus.empty() ? "N/A" : cpus,
                         t.gpus[i].numa_node >= 0 ? std::to_string(t.gpus[i].numa_node) : "N/A");
      out += row;
    }
    out +=
        "\nLegend:\n"
        "  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within "
        "a NUMA node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks\n";

    out += fmt::format("\n{:<6}{:<28}{:<16}{:<12}{:<12}{:<9}{}\n", "GPU", "Name", "PCI bus id", "PCIe now",
                       "PCIe max", "NVLinks", "source");
    for (const auto& g : t.gpus) {
      out += fmt::format("{:<6}{:<28}{:<16}{:<12}{:<12}{:<9}{}\n", g.ordinal, g.name, g.pci_bus_id,
                         gen_width(g.pcie.current_gen, g.pcie.current_width),
                         gen_width(g.pcie.max_gen, g.pcie.max_width), g.nvlinks,
                         g.pcie.source.empty() ? "-" : g.pcie.source);
    }

    out += "\nP2P access (cudaDeviceGetP2PAttribute: supported, performance rank, native atomics)\n";
    out += fmt::format("{:<8}", "");
    for (const auto& g : t.gpus) out += fmt::format("{:<12}", fmt::format("GPU{}", g.ordinal));
    out += '\n';
    for (std::size_t i = 0; i < n; ++i) {
      out += fmt::format("{:<8}", fmt::format("GPU{}", t.gpus[i].ordinal));
      for (std::size_t j = 0; j < n; ++j) {
        const gpu_pair p = i < t.pairs.size() && j < t.pairs[i].size() ? t.pairs[i][j] : gpu_pair{};
        const std::string cell =
            i == j               ? " X"
            : p.access_supported ? fmt::format("yes r{}{}", p.performance_rank, p.native_atomics ? " A" : "")
                                 : "no";
        out += fmt::format("{:<12}", cell);
      }
      out += '\n';
    }

    if (t.p2p_bytes > 0) {
      out += fmt::format("\nP2P bandwidth (GB/s; {} per copy, median of {}; rows copy to columns)\n",
                         format_bytes(t.p2p_bytes), t.p2p_iterations);
    } else if (n == 1) {
      out += "\nP2P bandwidth (GB/s): one GPU, no pair to measure\n";
    } else {
      out += "\nP2P bandwidth: not measured\n";
    }
    if (t.p2p_bytes > 0 || n == 1) {
      out += fmt::format("{:<8}", "");
      for (const auto& g : t.gpus) out += fmt::format("{:<10}", fmt::format("GPU{}", g.ordinal));
      out += '\n';
      for (std::size_t i = 0; i < n; ++i) {
        out += fmt::format("{:<8}", fmt::format("GPU{}", t.gpus[i].ordinal));
        for (std::size_t j = 0; j < n; ++j) {
          const gpu_pair p = i < t.pairs.size() && j < t.pairs[i].size() ? t.pairs[i][j] : gpu_pair{};
          const std::string cell = i == j ? " X" : p.gbps > 0 ? fmt::format("{:.1f}", p.gbps) : "-";
          out += fmt::format("{:<10}", cell);
        }
        out += '\n';
      }
    }
  }

  out += fmt::format("\nHost: {} online CPUs, {} NUMA node(s)\n", t.cpu_count, t.numa.size());
  for (const auto& node : t.numa) {
    out +=
        fmt::format("  node {}: CPUs {}{}\n", node.id, node.cpus.empty() ? "none" : format_cpulist(node.cpus),
                    node.memory_bytes > 0 ? ", " + format_bytes(node.memory_bytes) : "");
  }
  if (!t.nvml_note.empty()) out += fmt::format("\n{}\n", t.nvml_note);
  for (const auto& note : t.notes) out += fmt::format("note: {}\n", note);
  return out;
}

std::string to_json(const topology& t, int indent) {
  using nlohmann::json;
  json j;
  j["tool"] = "ferry probe --topology";
  j["host"] = {{"cpu_count", t.cpu_count}};
  auto& numa = j["host"]["numa_nodes"] = json::array();
  for (const auto& node : t.numa)
    numa.push_back(
        {{"id", node.id}, {"cpus", format_cpulist(node.cpus)}, {"memory_bytes", node.memory_bytes}});
  auto& gpus = j["gpus"] = json::array();
  for (const auto& g : t.gpus) {
    gpus.push_back({{"ordinal", g.ordinal},
                    {"name", g.name},
                    {"pci_bus_id", g.pci_bus_id},
                    {"numa_node", g.numa_node >= 0 ? json(g.numa_node) : json(nullptr)},
                    {"cpu_affinity", format_cpulist(g.cpu_affinity)},
                    {"pcie",
                     {{"current_gen", g.pcie.current_gen},
                      {"current_width", g.pcie.current_width},
                      {"max_gen", g.pcie.max_gen},
                      {"max_width", g.pcie.max_width},
                      {"source", g.pcie.source}}},
                    {"nvlinks", g.nvlinks}});
  }
  auto& pairs = j["pairs"] = json::array();
  for (std::size_t i = 0; i < t.pairs.size(); ++i) {
    for (std::size_t k = 0; k < t.pairs[i].size(); ++k) {
      if (i == k || i >= t.gpus.size() || k >= t.gpus.size()) continue;
      const gpu_pair& p = t.pairs[i][k];
      pairs.push_back({{"from", t.gpus[i].ordinal},
                       {"to", t.gpus[k].ordinal},
                       {"link", link_cell(p, false)},
                       {"nvlinks", p.nvlinks},
                       {"access_supported", p.access_supported},
                       {"performance_rank", p.performance_rank},
                       {"native_atomics", p.native_atomics},
                       {"gbps", p.gbps > 0 ? json(p.gbps) : json(nullptr)},
                       {"checked", p.checked}});
    }
  }
  j["p2p"] = {{"bytes", t.p2p_bytes}, {"iterations", t.p2p_iterations}};
  j["gpu_note"] = t.gpu_note;
  j["nvml_note"] = t.nvml_note;
  j["notes"] = t.notes;
  return j.dump(indent);
}

}  // namespace ferry::probe
