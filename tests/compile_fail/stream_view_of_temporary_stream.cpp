// view() of a temporary stream must not compile: the view would outlive the stream.
// expect-error: deleted
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev) {
  const ferry::stream_view v = dev.make_stream().view();
  static_cast<void>(v);
}
