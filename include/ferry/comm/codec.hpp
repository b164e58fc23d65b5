// ferry::comm codecs: how a bucket of fp32 gradients travels through an all-reduce.
//
// A codec encodes the fp32 bucket into a preallocated wire buffer (one fused pass: scale by 1/world_size,
// saturate, cast), the wire buffer is all-reduced with sum, and decode casts the result back into the
// bucket, which then holds the average over ranks. Both run on a stream of the bucket's device: on the
// cuda backend as grid-stride, vectorised kernels; on the host backend as plain C++ in a host function on
// the stream (the host device's memory is host memory).
//
//   codec  wire   bytes/elt  u (unit roundoff)  s (half the smallest subnormal step)
//   none   fp32   4          2^-24              2^-150
//   fp16   fp16   2          2^-11              2^-25
//   bf16   bf16   2          2^-8               2^-134
//
// These functions are the three element-wise codecs' arithmetic. How a bucket travels is a bucket codec
// (bucket_codec.hpp): these three are registered there over encode_async/decode_async, and every other
// codec (PowerSGD, or one registered by a user) is another implementation of that interface, with no row
// here: wire_type, wire_bytes and unit_roundoff read it as fp32, and error_bound, saturation_limit,
// encode_async and decode_async refuse it (has_error_bound says which codecs they take).
//
// Error bound (error_bound below), per element i, against the exact mean m_i = (1/n) sum_r x_{r,i} of the
// n ranks' fp32 values, with M_i = max_r |x_{r,i}| and gamma = (n-1) u / (1 - (n-1) u):
//   |result_i - m_i| <= (u + gamma (1 + u) + 2^-21) M_i + 2 n s          (about n u M_i)
// It holds for any order and association of the wire sum in which every partial sum is rounded to the
// wire type (NCCL's ring and tree, the host backend's sum): the cast of x_{r,i}/n costs at most
// u |x_{r,i}|/n per rank (u M_i in all), the n-1 rounded additions at most gamma sum_r |y_{r,i}|, and the
// fp32 scaling by fl(1/n) about 2^-23 M_i (the 2^-21 term covers it and the products of the small
// terms); s covers results in the subnormal range, where rounding errors are absolute. For codec none the
// reducer averages fp32 in place (reduce_op::avg, whether the backend divides before or after the sum)
// and the same bound holds with fp32's u. The bound is infinite (vacuous) once (n-1) u >= 1/2: fp16 past
// 1025 ranks, bf16 past 129.
//
// Saturation: before the cast, a finite scaled value x/n is clamped to +-L/n, where
// L = saturation_limit(codec, n) = max_finite / (1 + 2 n u) (about 65376 for fp16 with 2 ranks; bf16 and
// none saturate only near fp32's largest value). So no finite gradient becomes infinite on the wire, and
// no partial sum of n such values, each rounded, can round past the type's largest finite value. The
// bound above holds for elements with M_i <= L; an element beyond L saturates (its error is what the
// clamp removed). Infinity and NaN are not clamped: they reach the result as infinity and NaN, so an
// overflow check downstream (a loss scaler) still sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

/// A codec's identifier: the element-wise codecs of the table above; the built-in codecs of other kinds
/// have fixed values after them (PowerSGD's powersgd_kind, powersgd_codec.hpp), and register_codec
/// (bucket_codec.hpp) gives out the values after those. The values travel between ranks (a plan's
/// broadcast words), so a built-in codec keeps its value.
enum class codec_kind : std::uint8_t { none, fp16, bf16 };

/// The registered name ("none", "fp16", ...); "unregistered" for a value no codec holds.
[[nodiscard]] std::string_view to_string(codec_kind c) noexcept;
/// Parses a registered codec's name or alias ("none"/"fp32", "fp16", "bf16", "powersgd", and those
/// registered since); throws logic_error naming the text and the choices.
[[nodiscard]] codec_kind parse_codec(std::string_view text);
/// True for codecs that lose precision (of the built-ins, all but none) and for unregistered values: a
/// caller must allow them explicitly.
[[nodiscard]] bool lossy(codec_kind c) noexcept;

/// True for the codecs of the table above (none, fp16, bf16): those error_bound, saturation_limit,
/// encode_async and decode_async take, and whose results a check can hold to the bound.
[[nodiscard]] bool has_error_bound(codec_kind c) noexcept;
/// The element type on the wire (an element-wise codec's registered wire type; fp32 for the others).
[[nodiscard]] dtype wire_type(codec_kind c) noexcept;
/// Bytes on the wire for `elements` fp32 elements (what one rank sends into the all-reduce): for an
/// element-wise codec exact, for the others `elements` fp32 values (an upper bound).
[[nodiscard]] std::size_t wire_bytes(codec_kind c, std::size_t elements) noexcept;
/// The codec's unit roundoff u (table above; fp32's for codecs not in it).
[[nodiscard]] double unit_roundoff(codec_kind c) noexcept;
/// The bound of the header's comment for n = world_size ranks and M = max_abs, the largest |x| of the
/// element over the ranks. Throws logic_error for world_size < 1 or a negative or non-finite max_abs.
[[nodiscard]] double error_bound(codec_kind c, int world_size, double max_abs);
/// L of the header's comment: the largest |x| that does not saturate. Throws logic_error for
/// world_size < 1.
[[nodiscard]] float saturation_limit(codec_kind c, int world_size);

/// wire[i] = cast(clamp(bucket[i] / world_size)) for i < count, on `s`. bucket holds fp32; wire holds
/// wire_type(c) (for none: the scaled fp32). Both must be memory of s's device (device memory, or
/// pinned memory on the host backend) holding count elements. Throws logic_error, before queuing work,
/// naming the view that is too small, of another device, or when world_size < 1.
void encode_async(codec_kind c, mem_view bucket, mem_view wire, std::size_t count, int world_size,
                  stream_view s);
/// bucket[i] = fp32(wire[i]) for i < count, on `s`: after an all-reduce (sum) of encoded buckets, the
/// bucket holds the mean over ranks. Checks as encode_async.
void decode_async(codec_kind c, mem_view wire, mem_view bucket, std::size_t count, stream_view s);

}  // namespace ferry::comm
