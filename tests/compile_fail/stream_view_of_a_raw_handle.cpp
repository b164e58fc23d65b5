// A view of a raw handle is made only by device::adopt_stream, which refuses the legacy default stream
// and handles the backend cannot run work on; the constructor that skips those checks is private.
// expect-error: private
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev, void* foreign) {
  const ferry::stream_view v(dev, foreign);
  static_cast<void>(v);
}
