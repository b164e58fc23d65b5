// A view of a stream that is destroyed at the `;` must not compile.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  ferry::stream_view v = dev.make_stream();
  static_cast<void>(v);
}
