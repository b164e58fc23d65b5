// The analyzer on real PyTorch profiler traces (tests/data/real_traces): for every trace in the manifest,
// the first finding (what bounds the workload) must be the expected rule, with the expected activity,
// main thread and cost, or the trace must be refused with the expected error.
//
// An entry marked "known_failure" is one the analyzer does not meet yet: the test reports it as an
// expected failure (skipped, with what the analyzer says) and fails when it starts passing, so the change
// that fixes it also removes the mark. Expectations are never loosened to pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/trace_io.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// FERRY_REAL_TRACES_DIR in the environment points the test at another fixture set with its own manifest.
const fs::path data_dir = [] {
  const char* dir = std::getenv("FERRY_REAL_TRACES_DIR");
  return fs::path(dir != nullptr && *dir != '\0' ? dir : FERRY_REAL_TRACES_DIR);
}();

struct entry {
  std::string file;
  json spec;  // the manifest's object for this file
};

std::vector<entry> load_manifest() {
  std::ifstream in(data_dir / "manifest.json");
  if (!in) return {};  // manifest_lists_every_trace reports it
  const json m = json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<entry> out;
  if (!m.is_object() || !m.contains("traces") || !m["traces"].is_array()) return out;
  for (const json& e : m["traces"])
    if (e.is_object() && e.contains("file") && e["file"].is_string())
      out.push_back({e["file"].get<std::string>(), e});
  return out;
}

std::string field_or(const json& j, const char* key, const std::string& fallback = "") {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

std::vector<std::string> strings_of(const json& j, const char* key) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  if (j[key].is_string()) out.push_back(j[key].get<std::string>());
  if (j[key].is_array())
    for (const json& s : j[key])
      if (s.is_string()) out.push_back(s.get<std::string>());
  return out;
}

/// What the analyzer says about a trace, in one line, for messages and known_failure notes.
std::string summary(const ferry::trace::analysis& a) {
  const ferry::trace::finding& f = a.findings.front();
  std::ostringstream s;
  s << "first finding " << f.rule << " (" << f.cost_ms_per_step << " ms/step): \"" << f.title
    << "\"; main thread \"" << a.main_thread << "\"";
  return s.str();
}

/// Checks one trace against its expectation; returns the mismatches (empty: it meets them all).
std::vector<std::string> check(const entry& e, std::string& said) {
  const json& expect = e.spec.at("expect");
  const std::string error_wanted = field_or(expect, "error_contains");
  std::vector<std::string> problems;
  ferry::trace::analysis a;
  try {
    a = ferry::trace::analyze(ferry::trace::read_trace(data_dir / e.file));
  } catch (const std::exception& ex) {
    said = std::string("refused: ") + ex.what();
    if (error_wanted.empty())
      problems.push_back(said);
    else if (std::string(ex.what()).find(error_wanted) == std::string::npos)
      problems.push_back("the error does not contain \"" + error_wanted + "\": " + said);
    return problems;
  }
  said = summary(a);
  if (!error_wanted.empty()) {
    problems.push_back("expected a refusal containing \"" + error_wanted +
                       "\", but it was analyzed: " + said);
    return problems;
  }
  const ferry::trace::finding& f = a.findings.front();
  const std::string rule = field_or(expect, "rule");
  if (f.rule != rule) problems.push_back("first finding is " + f.rule + ", expected " + rule);
  for (const std::string& s : strings_of(expect, "title_contains"))
    if (f.title.find(s) == std::string::npos)
      problems.push_back("the first finding's title does not contain \"" + s + "\"");
  for (const std::string& s : strings_of(expect, "main_thread_contains"))
    if (a.main_thread.find(s) == std::string::npos)
      problems.push_back("the main thread \"" + a.main_thread + "\" does not contain \"" + s + "\"");
  for (const std::string& s : strings_of(expect, "first_not_contains"))
    if (f.title.find(s) != std::string::npos || f.fix.find(s) != std::string::npos)
      problems.push_back("the first finding's title or fix contains \"" + s + "\": \"" + f.fix + "\"");
  if (expect.contains("min_cost_ms") && expect["min_cost_ms"].is_number() &&
      f.cost_ms_per_step < expect["min_cost_ms"].get<double>())
    problems.push_back("the first finding costs " + std::to_string(f.cost_ms_per_step) +
                       " ms/step, expected at least " + std::to_string(expect["min_cost_ms"].get<double>()));
  return problems;
}

// gtest prints a parameter with this instead of its bytes.
void PrintTo(const entry& e, std::ostream* os) { *os << e.file; }

class real_trace : public ::testing::TestWithParam<entry> {};

TEST_P(real_trace, first_finding_is_the_expected_bottleneck) {
  const entry& e = GetParam();
  ASSERT_TRUE(e.spec.contains("expect") && e.spec["expect"].is_object())
      << e.file << ": no \"expect\" object";
  std::string said;
  const std::vector<std::string> problems = check(e, said);
  std::string text;
  for (const std::string& p : problems)
    if (p != said) text += "\n  - " + p;
  const std::string known = field_or(e.spec, "known_failure");
  if (known.empty()) {
    EXPECT_TRUE(problems.empty()) << e.file << " (" << field_or(e.spec, "why") << "):" << text
                                  << "\n  the analyzer says: " << said;
    return;
  }
  ASSERT_FALSE(problems.empty()) << e.file
                                 << " now meets its expectation: remove its \"known_failure\" from "
                                    "tests/data/real_traces/manifest.json\n  the analyzer says: "
                                 << said;
  GTEST_SKIP() << "expected failure (" << known << "):" << text << "\n  the analyzer says: " << said;
}

std::string test_name(const ::testing::TestParamInfo<entry>& info) {
  std::string name = info.param.file;
  for (const char* suffix : {".pt.trace.json.gz", ".json.gz", ".json"})
    if (name.size() > std::string(suffix).size() && name.ends_with(suffix)) {
      name.resize(name.size() - std::string(suffix).size());
      break;
    }
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(manifest, real_trace, ::testing::ValuesIn(load_manifest()), test_name);

TEST(real_traces, manifest_lists_every_trace_with_its_origin_and_expectation) {
  ASSERT_TRUE(fs::exists(data_dir / "manifest.json")) << data_dir;
  const std::vector<entry> entries = load_manifest();
  ASSERT_GE(entries.size(), 1u) << "manifest.json holds no traces";
  std::set<std::string> listed;
  for (const entry& e : entries) {
    EXPECT_TRUE(listed.insert(e.file).second) << e.file << " is listed twice";
    EXPECT_TRUE(fs::is_regular_file(data_dir / e.file)) << e.file << " is listed but missing";
    for (const char* key : {"origin", "workload", "why"})
      EXPECT_FALSE(field_or(e.spec, key).empty()) << e.file << ": no \"" << key << "\"";
    const json expect = e.spec.value("expect", json::object());
    EXPECT_NE(field_or(expect, "rule").empty(), field_or(expect, "error_contains").empty())
        << e.file << ": \"expect\" names either a rule or an error";
  }
  for (const fs::directory_entry& d : fs::directory_iterator(data_dir)) {
    const std::string name = d.path().filename().string();
    const bool trace = name.ends_with(".json") || name.ends_with(".json.gz");
    if (trace && name != "manifest.json") {
      EXPECT_TRUE(listed.contains(name)) << name << " is not in manifest.json";
    }
  }
}

TEST(real_traces, the_readme_lists_every_trace_with_its_expected_rule) {
  std::ifstream in(data_dir / "README.md");
  ASSERT_TRUE(in) << data_dir / "README.md"
                  << " is missing";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (const entry& e : load_manifest()) {
    const json expect = e.spec.value("expect", json::object());
    const std::string rule = field_or(expect, "rule");
    const std::string wanted = rule.empty() ? field_or(expect, "error_contains") : "`" + rule + "`";
    const std::string file = "`" + e.file + "`";
    const bool listed = std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.starts_with("| " + file) && l.find(wanted) != std::string::npos;
    });
    EXPECT_TRUE(listed) << "README.md has no table row for " << e.file << " naming " << wanted;
  }
}

}  // namespace
