// Checked entry points of the fp32 fill and comparison; the work is the backend's device ops.
#include "ferry/comm/f32_ops.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/comm/detail/device_ops.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {
namespace {

void expect_view(mem_view v, std::size_t bytes, std::size_t align, std::string_view what,
                 std::string_view call) {
  FERRY_EXPECTS(v.data != nullptr, fmt::format("{}: the {} view is null", call, what));
  FERRY_EXPECTS(
      v.kind != memory_kind::pageable,
      fmt::format("{}: the {} view is pageable memory, which a stream cannot read or write in order; "
                  "pass device memory",
                  call, what));
  FERRY_EXPECTS(v.bytes >= bytes, fmt::format("{}: the {} view of {} is smaller than the {} it needs", call,
                                              what, format_bytes(v.bytes), format_bytes(bytes)));
  FERRY_EXPECTS(reinterpret_cast<std::uintptr_t>(v.data) % align == 0,
                fmt::format("{}: the {} view at {} is not aligned to {} bytes", call, what, v.data, align));
}

void expect_fill(const f32_fill& f, std::string_view call) {
  FERRY_EXPECTS(f.ranks >= 1, fmt::format("{}: f32_fill::ranks = 0; the mean of no rank is undefined", call));
  FERRY_EXPECTS(std::isfinite(f.base) && std::isfinite(f.scale),
                fmt::format("{}: f32_fill base {} and scale {} must be finite", call, f.base, f.scale));
}

f32_diff compare_sync(mem_view a, const float* b, const f32_fill& expected, std::size_t count,
                      float tolerance, stream_view s) {
  expect_view(a, count * sizeof(float), sizeof(float), "compared", "compare_f32");
  FERRY_EXPECTS(!(tolerance < 0), fmt::format("compare_f32: tolerance {} must be >= 0", tolerance));
  device& dev = s.dev();
  const buffer result = dev.alloc_device(f32_diff_bytes);
  const buffer host = dev.alloc_pinned(f32_diff_bytes);
  detail::ops_for(dev).compare(static_cast<const float*>(a.data), b, expected, count, tolerance,
                               result.data(), s);
  dev.copy_async(host.view(), result.view(), s);
  s.synchronize();
  return read_f32_diff(host.host_bytes());
}

}  // namespace

float f32_fill::value(std::uint64_t i) const noexcept {
  return detail::fill_mean(base, scale, seed, ranks, i);
}

float f32_fill::max_abs() const noexcept { return std::fabs(base) + std::fabs(scale); }

void fill_f32_async(mem_view dst, std::size_t count, const f32_fill& f, stream_view s) {
  expect_view(dst, count * sizeof(float), sizeof(float), "destination", "fill_f32_async");
  expect_fill(f, "fill_f32_async");
  if (count == 0) return;
  detail::ops_for(s.dev()).fill(static_cast<float*>(dst.data), count, f, s);
}

void compare_f32_async(mem_view a, mem_view b, std::size_t count, float tolerance, mem_view result,
                       stream_view s) {
  expect_view(a, count * sizeof(float), sizeof(float), "first", "compare_f32_async");
  expect_view(b, count * sizeof(float), sizeof(float), "second", "compare_f32_async");
  expect_view(result, f32_diff_bytes, 8, "result", "compare_f32_async");
  FERRY_EXPECTS(!(tolerance < 0), fmt::format("compare_f32_async: tolerance {} must be >= 0", tolerance));
  detail::ops_for(s.dev()).compare(static_cast<const float*>(a.data), static_cast<const float*>(b.data),
                                   f32_fill{}, count, tolerance, result.data, s);
}

void compare_f32_async(mem_view a, const f32_fill& expected, std::size_t count, float tolerance,
                       mem_view result, stream_view s) {
  expect_view(a, count * sizeof(float), sizeof(float), "compared", "compare_f32_async");
  expect_view(result, f32_diff_bytes, 8, "result", "compare_f32_async");
  expect_fill(expected, "compare_f32_async");
  FERRY_EXPECTS(!(tolerance < 0), fmt::format("compare_f32_async: tolerance {} must be >= 0", tolerance));
  detail::ops_for(s.dev()).compare(static_cast<const float*>(a.data), nullptr, expected, count, tolerance,
                                   result.data, s);
}

f32_diff read_f32_diff(const std::byte* bytes) noexcept {
  detail::diff_result r{};
  std::memcpy(&r, bytes, sizeof r);
  return {detail::f32_from_bits(r.max_bits), r.wrong};
}

f32_diff compare_f32(mem_view a, mem_view b, std::size_t count, float tolerance, stream_view s) {
  expect_view(b, count * sizeof(float), sizeof(float), "second", "compare_f32");
  return compare_sync(a, static_cast<const float*>(b.data), f32_fill{}, count, tolerance, s);
}

f32_diff compare_f32(mem_view a, const f32_fill& expected, std::size_t count, float tolerance,
                     stream_view s) {
  expect_fill(expected, "compare_f32");
  return compare_sync(a, nullptr, expected, count, tolerance, s);
}

}  // namespace ferry::comm
