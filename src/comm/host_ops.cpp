// comm's device ops on the host backend: plain loops in a host function on the stream. The host
// device's device memory is host memory, so the loops read and write it directly, in stream order.
#include <algorithm>
#include <cstring>

#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/comm/detail/device_ops.hpp"
#include "ferry/comm/float16.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm::detail {
namespace {

void encode_loop(codec_kind c, const float* src, void* wire, std::size_t count, encode_params p) {
  switch (c) {
    case codec_kind::none: {
      auto* out = static_cast<float*>(wire);
      for (std::size_t i = 0; i < count; ++i) out[i] = scale_saturate(src[i], p.scale, p.limit);
      return;
    }
    case codec_kind::fp16: {
      auto* out = static_cast<std::uint16_t*>(wire);
      for (std::size_t i = 0; i < count; ++i) out[i] = float_to_f16(scale_saturate(src[i], p.scale, p.limit));
      return;
    }
    case codec_kind::bf16: {
      auto* out = static_cast<std::uint16_t*>(wire);
      for (std::size_t i = 0; i < count; ++i)
        out[i] = float_to_bf16(scale_saturate(src[i], p.scale, p.limit));
      return;
    }
  }
}

void decode_loop(codec_kind c, const void* wire, float* dst, std::size_t count) {
  switch (c) {
    case codec_kind::none: std::memmove(dst, wire, count * sizeof(float)); return;
    case codec_kind::fp16: {
      const auto* in = static_cast<const std::uint16_t*>(wire);
      for (std::size_t i = 0; i < count; ++i) dst[i] = f16_to_float(in[i]);
      return;
    }
    case codec_kind::bf16: {
      const auto* in = static_cast<const std::uint16_t*>(wire);
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_float(in[i]);
      return;
    }
  }
}

class host_device_ops final : public device_ops {
 public:
  void encode(codec_kind c, const float* src, void* wire, std::size_t count, encode_params p,
              stream_view s) override {
    s.dev().launch_host_func(s, [=] { encode_loop(c, src, wire, count, p); });
  }

  void decode(codec_kind c, const void* wire, float* dst, std::size_t count, stream_view s) override {
    s.dev().launch_host_func(s, [=] { decode_loop(c, wire, dst, count); });
  }

  void fill(float* dst, std::size_t count, const f32_fill& f, stream_view s) override {
    s.dev().launch_host_func(s, [=] {
      for (std::size_t i = 0; i < count; ++i) dst[i] = fill_mean(f.base, f.scale, f.seed, f.ranks, i);
    });
  }

  void compare(const float* a, const float* b, const f32_fill& expected, std::size_t count, float tolerance,
               void* result, stream_view s) override {
    s.dev().launch_host_func(s, [=] {
      float worst = 0;
      std::uint64_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const float want =
            b != nullptr ? b[i] : fill_mean(expected.base, expected.scale, expected.seed, expected.ranks, i);
        const float d = compare_diff(a[i], want);
        worst = std::max(worst, d);
        if (d > tolerance) ++wrong;
      }
      const diff_result r{f32_bits(worst), 0, wrong};
      std::memcpy(result, &r, sizeof r);
    });
  }
};

}  // namespace

device_ops& host_ops() {
  static host_device_ops ops;
  return ops;
}

device_ops& ops_for(device& dev) {
  if (dev.kind() == backend::host) return host_ops();
#if defined(FERRY_COMM_HAVE_CUDA)
  return cuda_ops();
#else
  throw logic_error("ferry::comm was built without CUDA: its codecs and fills run on host devices only");
#endif
}

}  // namespace ferry::comm::detail
