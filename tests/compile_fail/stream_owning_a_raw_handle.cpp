// Only the device makes owning streams; a foreign handle is adopted as a view (device::adopt_stream),
// never owned, so the constructor that takes a raw handle is private.
// expect-error: private
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev, void* foreign) {
  const ferry::stream s(dev, foreign);
  static_cast<void>(s);
}
