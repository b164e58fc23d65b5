// data() of a temporary buffer must not compile: the pointer would outlive the memory.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  void* p = dev.alloc_device(4096).data();
  static_cast<void>(p);
}
