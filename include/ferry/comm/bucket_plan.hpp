// ferry::comm bucket plan: which gradients share an all-reduce, and where each lives in the flat buffer.
//
// A pure host function (no device, no communicator): from the parameters' fp32 element counts and the
// order their gradients become ready in backward, it cuts that order into buckets. The first bucket is
// small (first_bucket_bytes) so that communication starts early in backward; the others are filled up to
// bucket_cap_bytes. A parameter is never split: one larger than its bucket's cap gets a bucket of its own.
// Buckets and the parameters inside them are laid out in ready order in one flat fp32 buffer; every
// parameter's offset is aligned (alignment_bytes), so gradients are well-aligned views into it and the
// kernels that read a bucket can use vector loads.
//
// The same inputs give the same plan on every rank; the reducer makes the inputs identical by
// broadcasting rank 0's observed order (docs/COMM.md, Note [Plans change only between steps]).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "ferry/core/units.hpp"

namespace ferry::comm {

/// Limits of a bucket plan.
struct bucket_plan_options {
  /// Cap of the first bucket (the first gradients to become ready), in bytes of fp32 gradient.
  std::size_t first_bucket_bytes = 1 * MiB;
  /// Cap of every later bucket, in bytes of fp32 gradient (padding included).
  std::size_t bucket_cap_bytes = 25 * MiB;
  /// Every parameter's offset in the flat buffer is a multiple of this many bytes: a power of two and a
  /// multiple of 4 (one fp32 element).
  std::size_t alignment_bytes = 256;
};

/// One bucket: parameters reduced by one all-reduce, in ready order, and the elements [offset,
/// offset + elements) of the flat buffer they occupy (the padding between them included).
struct bucket {
  std::vector<std::size_t> params;  // parameter indices, in ready order
  std::size_t offset = 0;           // first element of the bucket in the flat buffer
  std::size_t elements = 0;         // elements the all-reduce covers: from offset to the last param's end

  [[nodiscard]] std::size_t bytes() const noexcept { return elements * sizeof(float); }
  friend bool operator==(const bucket&, const bucket&) = default;
};

/// Where one parameter's gradient lives.
struct param_place {
  std::size_t bucket = 0;  // index of its bucket
  std::size_t offset = 0;  // first element in the flat buffer (aligned)
  std::size_t elements = 0;

  friend bool operator==(const param_place&, const param_place&) = default;
};

/// A plan: buckets in launch order and each parameter's place. Buckets cover the flat buffer in order.
struct bucket_plan {
  std::vector<bucket> buckets;
  std::vector<param_place> places;  // indexed by parameter (registration order)
  std::size_t total_elements = 0;   // size of the flat buffer, in fp32 elements

  [[nodiscard]] std::size_t total_bytes() const noexcept { return total_elements * sizeof(float); }
  /// The ready order the plan was made from: the buckets' parameters, concatenated.
  [[nodiscard]] std::vector<std::size_t> order() const;
  /// One line per bucket: index, bytes, parameter count and range of parameter indices; for logs.
  [[nodiscard]] std::string describe() const;
  friend bool operator==(const bucket_plan&, const bucket_plan&) = default;
};

/// Checks options: caps > 0, alignment a power of two and a multiple of 4. Throws logic_error naming the
/// field and its value.
void check(const bucket_plan_options& options);

/// Cuts `ready_order` (a permutation of 0..n-1, n = param_elements.size()) into buckets: the first up to
/// first_bucket_bytes, the others up to bucket_cap_bytes, counting the alignment padding; a parameter
/// that alone exceeds its bucket's cap gets a bucket of its own. Throws logic_error, before any work,
/// for bad options, no parameters, a parameter of 0 elements (naming it), or an order that is not a
/// permutation (naming the index that is out of range, repeated or missing).
[[nodiscard]] bucket_plan make_bucket_plan(std::span<const std::size_t> param_elements,
                                           std::span<const std::size_t> ready_order,
                                           const bucket_plan_options& options = {});

/// The plan of the first step, before any order was observed: reverse registration order (backward
/// produces the last layer's gradients first).
[[nodiscard]] bucket_plan make_reverse_plan(std::span<const std::size_t> param_elements,
                                            const bucket_plan_options& options = {});

/// Checks that `plan` is a valid layout of parameters of `param_elements` (as set_plan receives it from
/// another component): every parameter exactly once with its own size, offsets aligned to
/// `alignment_bytes`, no overlap, buckets in buffer order and consistent with `places`. Throws
/// logic_error naming the first problem.
void validate(const bucket_plan& plan, std::span<const std::size_t> param_elements,
              std::size_t alignment_bytes = 256);

}  // namespace ferry::comm
