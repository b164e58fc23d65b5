// view() of a temporary buffer must not compile: the view would outlive the memory.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  const ferry::mem_view m = dev.alloc_pinned(4096).view();
  static_cast<void>(m);
}
