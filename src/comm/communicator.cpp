// The part of the communicator interface every backend shares: names, the link model's arithmetic and the
// argument checks. Checks live here, once, so the host and NCCL backends reject exactly the same misuse with
// the same messages; the do_* hooks may assume valid arguments.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <source_location>
#include <string>

#include "ferry/comm/bus_factor.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {
namespace {

bool valid(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::i32 || t == dtype::i64 ||
         t == dtype::u64;
}
bool is_integer(dtype t) noexcept { return t == dtype::i32 || t == dtype::i64 || t == dtype::u64; }
bool valid(reduce_op op) noexcept { return op == reduce_op::sum || op == reduce_op::avg; }

// The two ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
    case dtype::u64: return 8;
  }
  return 0;
}

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u64: return "u64";
  }
  return "unknown dtype";
}

std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
  }
  return "unknown reduce_op";
}

std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::barrier: return "barrier";
  }
  return "unknown collective";
}

dtype parse_dtype(std::string_view text) {
  if (text == "f32" || text == "fp32" || text == "float") return dtype::f32;
  if (text == "f16" || text == "fp16" || text == "half") return dtype::f16;
  if (text == "bf16") return dtype::bf16;
  if (text == "i32") return dtype::i32;
  if (text == "i64") return dtype::i64;
  if (text == "u64") return dtype::u64;
  detail::throw_logic_error(
      fmt::format("unknown dtype \"{}\": expected f32 (fp32, float), f16 (fp16, half), bf16, i32, i64 or u64",
                  text),
      std::source_location::current());
}

// ---- comm_link ---------------------------------------------------------------------------------

comm_link comm_link::nvlink() { return {}; }

comm_link comm_link::host_memory() {
  comm_link l;
  l.name = "host_memory";
  l.bus_gbps = 27.0;
  l.latency = std::chrono::microseconds(30);
  return l;
}

std::chrono::nanoseconds comm_link::modelled_time(collective c, std::size_t bytes, int ranks) const {
  FERRY_EXPECTS(ranks >= 1, fmt::format("modelled_time over {} ranks: a group has at least 1 rank", ranks));
  FERRY_EXPECTS(
      std::isfinite(bus_gbps) && bus_gbps > 0,
      fmt::format("comm_link \"{}\": bus_gbps = {} must be a positive finite number", name, bus_gbps));
  double share = 0;
  switch (c) {
    case collective::all_reduce: share = all_reduce_bus_factor(ranks); break;
    case collective::all_gather: share = all_gather_bus_factor(ranks); break;
    case collective::broadcast: share = broadcast_bus_factor(); break;
    case collective::barrier: share = 0; break;
  }
  const double seconds = static_cast<double>(bytes) * share / (bus_gbps * 1e9);
  return latency + std::chrono::nanoseconds(static_cast<std::int64_t>(std::ceil(seconds * 1e9)));
}

// ---- communicator ------------------------------------------------------------------------------

void communicator::expect_usable(collective op, stream_view s) const {
  FERRY_EXPECTS(&s.dev() == dev_,
                fmt::format("{} on rank {} of {}: the stream belongs to another device than "
                            "the rank's; pass a stream of the rank's device (dev())",
                            to_string(op), rank_, size_));
  if (aborted()) [[unlikely]] {
    const std::string why = abort_reason();
    throw comm_error(fmt::format("{} on rank {} of {}: the group was aborted{}{}; make a new group",
                                 to_string(op), rank_, size_, why.empty() ? "" : ": ", why),
                     op, rank_);
  }
}

std::size_t communicator::expect_elements(collective op, std::size_t count, dtype type,
                                          std::size_t multiple) const {
  FERRY_EXPECTS(valid(type), fmt::format("{} on rank {}: dtype {} is not f32, f16, bf16, i32, i64 or u64",
                                         to_string(op), rank_, static_cast<int>(type)));
  FERRY_EXPECTS(count > 0, fmt::format("{} of 0 elements on rank {}: a collective moves at least 1 element",
                                       to_string(op), rank_));
  const std::size_t limit = std::numeric_limits<std::size_t>::max() / size_of(type) / multiple;
  FERRY_EXPECTS(count <= limit,
                fmt::format("{} of {} {} elements on rank {}: more than the {} elements a view "
                            "can hold",
                            to_string(op), count, to_string(type), rank_, limit));
  return count * size_of(type) * multiple;
}

void communicator::expect_buffer(collective op, const mem_view& v, std::string_view role, std::size_t bytes,
                                 std::size_t count, dtype type) const {
  FERRY_EXPECTS(v.data != nullptr,
                fmt::format("{} on rank {}: the {} view is null", to_string(op), rank_, role));
  FERRY_EXPECTS(
      v.kind == memory_kind::device,
      fmt::format("{} on rank {}: the {} view is {} memory; a collective reads and writes device memory "
                  "of the rank's device (alloc_device or device_view)",
                  to_string(op), rank_, role, to_string(v.kind)));
  FERRY_EXPECTS(v.bytes >= bytes,
                fmt::format("{} on rank {}: the {} view of {} bytes cannot hold {} {} elements "
                            "({} bytes)",
                            to_string(op), rank_, role, v.bytes, count, to_string(type), bytes));
}

event communicator::completion(stream_view s) {
  event e = dev_->make_event();
  e.record(s);
  return e;
}

event communicator::all_reduce(mem_view send, mem_view recv, std::size_t count, dtype type, reduce_op op,
                               stream_view s) {
  constexpr collective c = collective::all_reduce;
  expect_usable(c, s);
  const std::size_t bytes = expect_elements(c, count, type, 1);
  FERRY_EXPECTS(valid(op), fmt::format("all_reduce on rank {}: reduce_op {} is not sum or avg", rank_,
                                       static_cast<int>(op)));
  FERRY_EXPECTS(op != reduce_op::avg || !is_integer(type),
                fmt::format("all_reduce on rank {}: avg of {} elements; an integer mean would round, so "
                            "integer dtypes reduce by sum only (divide on the host)",
                            rank_, to_string(type)));
  expect_buffer(c, send, "send", bytes, count, type);
  expect_buffer(c, recv, "recv", bytes, count, type);
  FERRY_EXPECTS(send.data == recv.data || !overlap(send.data, bytes, recv.data, bytes),
                fmt::format("all_reduce on rank {}: send ({}) and recv ({}) overlap without being the same "
                            "memory; pass the same view for an in-place all-reduce",
                            rank_, fmt::ptr(send.data), fmt::ptr(recv.data)));
  // A group of one: the mean is the sum, and x / 1 is x exactly in every dtype. NCCL would still scale
  // every element by 1 (a full pass over memory, beside the caller's compute), and even an in-place sum
  // of one rank is a copy kernel of NCCL's: in place, there is nothing to do.
  if (size_ == 1) {
    if (send.data == recv.data) return completion(s);
    op = reduce_op::sum;
  }
  do_all_reduce(send.data, recv.data, count, type, op, s);
  return completion(s);
}

event communicator::all_gather(mem_view send, mem_view recv, std::size_t count, dtype type, stream_view s) {
  constexpr collective c = collective::all_gather;
  expect_usable(c, s);
  const std::size_t part = expect_elements(c, count, type, 1);
  const std::size_t bytes = expect_elements(c, count, type, static_cast<std::size_t>(size_));
  expect_buffer(c, send, "send", part, count, type);
  expect_buffer(c, recv, "recv", bytes, count * static_cast<std::size_t>(size_), type);
  const std::byte* own = recv.begin() + static_cast<std::size_t>(rank_) * part;
  FERRY_EXPECTS(send.data == own || !overlap(send.data, part, recv.data, bytes),
                fmt::format("all_gather on rank {}: send ({}) overlaps recv ({}) but is not this rank's part "
                            "of it ({}, recv + rank * count elements), the one in-place layout",
                            rank_, fmt::ptr(send.data), fmt::ptr(recv.data), fmt::ptr(own)));
  do_all_gather(send.data, recv.data, count, type, s);
  return completion(s);
}

event communicator::broadcast(mem_view send, mem_view recv, std::size_t count, dtype type, int root,
                              stream_view s) {
  constexpr collective c = collective::broadcast;
  expect_usable(c, s);
  FERRY_EXPECTS(root >= 0 && root < size_,
                fmt::format("broadcast on rank {}: root {} is not a rank of this group of {} (0 to {})",
                            rank_, root, size_, size_ - 1));
  const std::size_t bytes = expect_elements(c, count, type, 1);
  expect_buffer(c, recv, "recv", bytes, count, type);
  if (root == rank_) {
    expect_buffer(c, send, "send", bytes, count, type);
    FERRY_EXPECTS(send.data == recv.data || !overlap(send.data, bytes, recv.data, bytes),
                  fmt::format("broadcast on root {}: send ({}) and recv ({}) overlap without being the same "
                              "memory; pass the same view for an in-place broadcast",
                              rank_, fmt::ptr(send.data), fmt::ptr(recv.data)));
  }
  do_broadcast(root == rank_ ? send.data : nullptr, recv.data, count, type, root, s);
  return completion(s);
}

event communicator::barrier(stream_view s) {
  expect_usable(collective::barrier, s);
  do_barrier(s);
  return completion(s);
}

}  // namespace ferry::comm
