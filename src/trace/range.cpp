#include "ferry/trace/range.hpp"

#if FERRY_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace ferry::trace {

#if FERRY_NVTX
namespace {

nvtxDomainHandle_t ferry_domain() noexcept {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("ferry");
  return domain;
}

nvtxEventAttributes_t attributes(const char* name, color c) noexcept {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = static_cast<std::uint32_t>(c);
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = name;
  return attr;
}

}  // namespace

void push_range(const char* name, color c) noexcept {
  const nvtxEventAttributes_t attr = attributes(name, c);
  nvtxDomainRangePushEx(ferry_domain(), &attr);
}

void pop_range() noexcept { nvtxDomainRangePop(ferry_domain()); }

void mark(const char* name, color c) noexcept {
  const nvtxEventAttributes_t attr = attributes(name, c);
  nvtxDomainMarkEx(ferry_domain(), &attr);
}
#else
void push_range(const char*, color) noexcept {}
void pop_range() noexcept {}
void mark(const char*, color) noexcept {}
#endif

}  // namespace ferry::trace
