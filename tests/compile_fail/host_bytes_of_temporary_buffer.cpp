// host_bytes() of a temporary buffer must not compile: the pointer would outlive the memory.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  std::byte* p = dev.alloc_pinned(4096).host_bytes();
  static_cast<void>(p);
}
