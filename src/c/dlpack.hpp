// DLPack's unversioned structs (dlpack.h, ABI-stable since 0.x), as the C ABI's translation units hand
// tensors out: only the layout, declared here so the build needs no dlpack.h.
#pragma once

#include <cstdint>

namespace ferry::c_api {

struct dl_device {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct dl_data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct dl_tensor {
  void* data;
  dl_device device;
  std::int32_t ndim;
  dl_data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct dl_managed_tensor {
  struct dl_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(dl_managed_tensor* self);
};
constexpr std::int32_t kdl_cpu = 1;
constexpr std::int32_t kdl_cuda = 2;
constexpr std::uint8_t kdl_float = 2;
constexpr std::uint8_t kdl_bfloat = 4;

}  // namespace ferry::c_api
