// Round-trips a buffer host -> device -> host on the best device available and checks every byte.
#include <ferry/cuda/cuda.hpp>
#include <ferry/device/device.hpp>

#include <cstdio>
#include <cstring>

int main() {
  std::string why;
  auto dev = ferry::make_default_device(&why);
  std::printf("device: %s (%s)\n", dev->info().name.c_str(), why.c_str());

  constexpr std::size_t bytes = 1 << 20;
  ferry::buffer src = dev->alloc_pinned(bytes);
  ferry::buffer dst = dev->alloc_pinned(bytes);
  ferry::buffer on_device = dev->alloc_device(bytes);
  for (std::size_t i = 0; i < bytes; ++i) src.host_bytes()[i] = static_cast<std::byte>(i * 7);
  std::memset(dst.host_bytes(), 0, bytes);

  ferry::stream s = dev->make_stream();
  dev->copy_async(on_device, src, s);
  dev->copy_async(dst, on_device, s);
  s.synchronize();

  const bool same = std::memcmp(src.host_bytes(), dst.host_bytes(), bytes) == 0;
  std::printf("round trip of %zu bytes: %s\n", bytes, same ? "ok" : "MISMATCH");
  return same ? 0 : 1;
}
