// A view of a buffer that is freed at the `;` must not compile.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  ferry::mem_view m = dev.alloc_device(1 << 20);
  static_cast<void>(m);
}
