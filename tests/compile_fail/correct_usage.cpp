// The correct usage of every escape the other snippets refuse: views of owners that outlive them. This
// one must compile, so the failures of the others come from the deleted overloads, not from a broken
// include path or flags.
#include "ferry/device/device.hpp"

void snippet(ferry::device& dev, void* foreign) {
  const ferry::stream s = dev.make_stream();
  const ferry::stream_view v = s;
  const ferry::stream_view w = s.view();
  const ferry::stream_view adopted = dev.adopt_stream(foreign);
  const ferry::buffer device_memory = dev.alloc_device(1 << 20);
  const ferry::buffer pinned = dev.alloc_pinned(4096);
  const ferry::mem_view m = device_memory;
  const ferry::mem_view part = device_memory.view(0, 1024);
  std::byte* bytes = pinned.host_bytes();
  void* p = device_memory.data();
  dev.copy_async(pinned.view(), device_memory.view(0, 4096), v);
  // Reading the size or the kind of a temporary hands out nothing that could dangle.
  static_cast<void>(dev.alloc_pageable(64).size());
  static_cast<void>(ferry::stream{}.empty());
  static_cast<void>(w == adopted);
  static_cast<void>(m.bytes + part.bytes);
  static_cast<void>(bytes);
  static_cast<void>(p);
}
