// Checks that FERRY_RANGE really emits NVTX ranges in the "ferry" domain, by linking a static NVTX
// injection into this test binary: the NVTX library finds InitializeInjectionNvtx2_fnptr at the first
// NVTX call and routes the domain calls to the recorder below, as a profiler's injection would.
#include <gtest/gtest.h>

#include "ferry/trace/range.hpp"

#if FERRY_NVTX
#include <cstdint>
// The NVTX implementation in this translation unit refers to the injection pointer, so it is declared
// (with its type spelled out, since NVTX's typedef comes with the header) before the header.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

struct recorded {
  std::string kind;  // "push", "pop", "mark"
  std::string domain;
  std::string name;
  std::uint32_t argb = 0;
};

std::mutex recorder_mu;
std::vector<recorded> recorder;
std::vector<std::unique_ptr<std::string>> domain_names;  // a domain handle points at its name

std::string domain_name(nvtxDomainHandle_t d) {
  return d == nullptr ? std::string("<default>") : *reinterpret_cast<const std::string*>(d);
}

nvtxDomainHandle_t NVTX_API on_domain_create(const char* name) {
  std::lock_guard lock(recorder_mu);
  domain_names.push_back(std::make_unique<std::string>(name));
  return reinterpret_cast<nvtxDomainHandle_t>(domain_names.back().get());
}

int NVTX_API on_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* attr) {
  std::lock_guard lock(recorder_mu);
  recorder.push_back({"push", domain_name(d), attr->message.ascii, attr->color});
  return 0;
}

int NVTX_API on_pop(nvtxDomainHandle_t d) {
  std::lock_guard lock(recorder_mu);
  recorder.push_back({"pop", domain_name(d), "", 0});
  return 0;
}

void NVTX_API on_mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t* attr) {
  std::lock_guard lock(recorder_mu);
  recorder.push_back({"mark", domain_name(d), attr->message.ascii, attr->color});
}

int NVTX_API initialize_injection(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size))
    return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&on_domain_create);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&on_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&on_pop);
  *table[NVTX_CBID_CORE2_DomainMarkEx] = reinterpret_cast<NvtxFunctionPointer>(&on_mark);
  return 1;
}

}  // namespace

extern "C" {
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = initialize_injection;
}

namespace {

TEST(nvtx_range, emits_nested_ranges_and_marks_in_the_ferry_domain) {
  {
    std::lock_guard lock(recorder_mu);
    recorder.clear();  // other tests of this binary emit ranges too
  }
  {
    FERRY_RANGE("outer", ferry::trace::color::blue);
    {
      FERRY_RANGE("inner", ferry::trace::color::green);
      ferry::trace::mark("instant", ferry::trace::color::red);
    }
  }
  std::lock_guard lock(recorder_mu);
  ASSERT_EQ(recorder.size(), 5u);
  const std::vector<std::string> kinds{"push", "push", "mark", "pop", "pop"};
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_EQ(recorder[i].kind, kinds[i]) << i;
    EXPECT_EQ(recorder[i].domain, "ferry") << i;
  }
  EXPECT_EQ(recorder[0].name, "outer");
  EXPECT_EQ(recorder[0].argb, static_cast<std::uint32_t>(ferry::trace::color::blue));
  EXPECT_EQ(recorder[1].name, "inner");
  EXPECT_EQ(recorder[1].argb, static_cast<std::uint32_t>(ferry::trace::color::green));
  EXPECT_EQ(recorder[2].name, "instant");
}

}  // namespace
#else
TEST(nvtx_range, compiled_away_without_nvtx) {
  static_assert(!ferry::trace::nvtx_enabled());
  FERRY_RANGE("nothing", ferry::trace::color::blue);
  SUCCEED() << "FERRY_WITH_NVTX=OFF: FERRY_RANGE expands to nothing";
}
#endif
