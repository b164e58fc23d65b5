// The codec table (wire type, unit roundoff, bound, saturation) and the checked entry points that hand a
// bucket to the backend's device ops.
#include "ferry/comm/codec.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/detail/device_ops.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {
namespace {

// One row per codec: the table of codec.hpp's comment.
struct codec_row {
  std::string_view name;
  dtype wire;
  std::size_t wire_bytes;
  double u;           // unit roundoff
  double s;           // half the smallest subnormal step
  double max_finite;  // largest finite value of the wire type
};

constexpr std::array<codec_row, 3> rows{{
    {"none", dtype::f32, 4, 0x1p-24, 0x1p-150, 3.4028234663852886e38},
    {"fp16", dtype::f16, 2, 0x1p-11, 0x1p-25, 65504.0},
    {"bf16", dtype::bf16, 2, 0x1p-8, 0x1p-134, 3.3895313892515355e38},
}};

bool in_table(codec_kind c) noexcept { return static_cast<std::size_t>(c) < rows.size(); }

void expect_elementwise(codec_kind c, std::string_view call) {
  FERRY_EXPECTS(in_table(c),
                fmt::format("{}({}): {} is not an element-wise codec of this table (none, fp16, bf16); it "
                            "runs as its bucket codec (bucket_codec.hpp)",
                            call, to_string(c), to_string(c)));
}

// Codecs outside the table read as none's row: fp32 on the wire, fp32's roundoff (PowerSGD sends P, Q
// and the tensors it leaves whole as fp32).
const codec_row& row(codec_kind c) noexcept {
  return rows[in_table(c) ? static_cast<std::size_t>(c) : static_cast<std::size_t>(codec_kind::none)];
}

void expect_world(int world_size, std::string_view what) {
  FERRY_EXPECTS(world_size >= 1, fmt::format("{} for a world size of {}: it must be >= 1", what, world_size));
}

void expect_floats(mem_view v, std::size_t count, std::size_t element_bytes, std::string_view what,
                   std::string_view call) {
  FERRY_EXPECTS(v.data != nullptr, fmt::format("{}: the {} view is null", call, what));
  FERRY_EXPECTS(
      v.kind != memory_kind::pageable,
      fmt::format("{}: the {} view is pageable memory, which a stream cannot read or write in order; "
                  "pass device memory",
                  call, what));
  FERRY_EXPECTS(
      v.bytes / element_bytes >= count,
      fmt::format("{}: the {} view of {} holds {} elements of {} bytes, fewer than count = {}", call, what,
                  format_bytes(v.bytes), v.bytes / element_bytes, element_bytes, count));
  FERRY_EXPECTS(reinterpret_cast<std::uintptr_t>(v.data) % element_bytes == 0,
                fmt::format("{}: the {} view at {} is not aligned to its {}-byte elements", call, what,
                            v.data, element_bytes));
}

}  // namespace

bool has_error_bound(codec_kind c) noexcept { return in_table(c); }

// A registered element-wise codec outside the table puts its own wire type on the wire.
dtype wire_type(codec_kind c) noexcept {
  if (in_table(c) || !registered(c)) return row(c).wire;
  const codec_entry& e = codec_info(c);
  return e.elementwise ? e.elementwise->wire : dtype::f32;
}

std::size_t wire_bytes(codec_kind c, std::size_t elements) noexcept {
  return elements * (in_table(c) ? row(c).wire_bytes : size_of(wire_type(c)));
}

double unit_roundoff(codec_kind c) noexcept { return row(c).u; }

double error_bound(codec_kind c, int world_size, double max_abs) {
  expect_elementwise(c, "error_bound");
  expect_world(world_size, "error_bound");
  FERRY_EXPECTS(std::isfinite(max_abs) && max_abs >= 0,
                fmt::format("error_bound of max_abs = {}: it must be finite and >= 0", max_abs));
  const codec_row& r = row(c);
  const double n = world_size;
  const double k = (n - 1) * r.u;
  if (k >= 0.5) return std::numeric_limits<double>::infinity();
  const double gamma = k / (1 - k);
  return (r.u + gamma * (1 + r.u) + 0x1p-21) * max_abs + 2 * n * r.s;
}

float saturation_limit(codec_kind c, int world_size) {
  expect_elementwise(c, "saturation_limit");
  expect_world(world_size, "saturation_limit");
  const codec_row& r = row(c);
  return static_cast<float>(r.max_finite / (1 + 2 * world_size * r.u));
}

void encode_async(codec_kind c, mem_view bucket, mem_view wire, std::size_t count, int world_size,
                  stream_view s) {
  expect_elementwise(c, "encode_async");
  expect_world(world_size, "encode_async");
  expect_floats(bucket, count, sizeof(float), "bucket", "encode_async");
  expect_floats(wire, count, row(c).wire_bytes, "wire", "encode_async");
  if (count == 0) return;
  const float limit = saturation_limit(c, world_size);
  const detail::encode_params p{1.0F / static_cast<float>(world_size),
                                limit / static_cast<float>(world_size)};
  detail::ops_for(s.dev()).encode(c, static_cast<const float*>(bucket.data), wire.data, count, p, s);
}

void decode_async(codec_kind c, mem_view wire, mem_view bucket, std::size_t count, stream_view s) {
  expect_elementwise(c, "decode_async");
  expect_floats(wire, count, row(c).wire_bytes, "wire", "decode_async");
  expect_floats(bucket, count, sizeof(float), "bucket", "decode_async");
  if (count == 0) return;
  detail::ops_for(s.dev()).decode(c, wire.data, static_cast<float*>(bucket.data), count, s);
}

}  // namespace ferry::comm
