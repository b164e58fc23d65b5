// view(offset, count) of a temporary buffer must not compile: the view would outlive the memory.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  const ferry::mem_view m = dev.alloc_device(4096).view(0, 1024);
  static_cast<void>(m);
}
