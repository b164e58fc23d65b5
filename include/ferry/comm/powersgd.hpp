// ferry::comm PowerSGD: a rank-r approximation of a bucket's averaged gradient matrices, with error
// feedback (Vogels et al., 2019, as in PyTorch's powerSGD_hook), reduced in two all-reduces and no host
// sync.
//
// For each matrix M = G + E of the bucket (its gradient plus the error fed back from the last step),
// with Q (cols x r) kept from the last step (warm start; the first Q is a seeded formula, the same on
// every rank):
//   P = M Q;  all-reduce P (avg), together with the bucket's uncompressed tensors;
//   orthogonalize P's columns (Gram-Schmidt);  Q = M^T P;  all-reduce Q (avg);
//   G <- P Q^T (the same on every rank);  E <- M - P Q^T (this rank's residual, fed back next step).
// A matrix is compressed only when (rows + cols) r rate < rows cols (rate = min_compression_rate, as in
// PyTorch); the others (1-D tensors, small matrices) travel whole in the first all-reduce and come back
// as the exact fp32 mean, with no error feedback. Matrices of the same shape are stored side by side
// (P, Q and their products per shape group), so a batched product can take them at once.
//
// Error feedback keeps the sum exact: after T steps, sum_t G_t(result) + mean_r E_r = sum_t mean_r G_r,t
// (up to fp32 rounding): what the approximation drops is delayed, not lost.
//
// The work between the all-reduces runs on the bucket's stream: on the host backend as plain C++ in host
// functions (the host device's memory is host memory), with fp64 accumulation; on the cuda backend as
// cuBLAS products (libcublas.so.13 loaded at run time through ferry::shim: one batched GEMM per shape
// group and product, fp32 without TF32) and ferry's kernels (E += G, Gram-Schmidt over the r columns
// of every P in one launch, copies of the whole tensors). Both backends compute the same numbers up to
// fp32 rounding. Nothing is allocated after construction, and the host never waits for the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/detail/powersgd_work.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

/// PowerSGD's options: its codec's (powersgd_kind's) registered defaults, and what a reducer is given in
/// reducer_options::codec_options[powersgd_kind].
struct powersgd_options {
  int rank = 1;                       // r: columns of P and Q
  double min_compression_rate = 2.0;  // compress when (rows + cols) r rate < rows cols
  bool warm_start = true;             // keep Q between steps (else a fresh seeded Q every step)
  std::uint64_t seed = 0;             // the first Q's formula (the same on every rank)
};

/// Throws logic_error, naming the field and its value, for rank < 1 or min_compression_rate <= 0.
void check(const powersgd_options& options);

/// PowerSGD state and work for one bucket: matrices at element offsets of a flat fp32 bucket. Elements of
/// the bucket outside every matrix (padding) are left as they are.
class powersgd {
 public:
  /// A bucket of `bucket_elements` floats holding matrix k at element offset offsets[k] (non-overlapping).
  /// Allocates the error-feedback buffer (one bucket, zeroed), P, Q and the wire buffers on comm.dev()
  /// (on a cuda device also cuBLAS's handle, its workspace and the pointer tables; a host sync, once).
  /// Throws logic_error for rank < 1, a shape of 0 elements, a matrix outside the bucket or overlapping
  /// another, or mismatched spans, naming the value; comm_error on a cuda device when cuBLAS cannot be
  /// loaded (naming what dlopen said).
  powersgd(communicator& comm, std::span<const matrix_shape> shapes, std::span<const std::size_t> offsets,
           std::size_t bucket_elements, powersgd_options options = {});
  powersgd(const powersgd&) = delete;
  powersgd& operator=(const powersgd&) = delete;
  /// Waits for the device's streams (the queued stages use this object); never throws.
  ~powersgd();

  /// Replaces the bucket's gradients (in place, on `s`) with the rank-r approximation of their average
  /// (and the exact mean of the uncompressed tensors), and updates the error feedback. Two all-reduces
  /// on `s`; the host is never blocked. Every rank must call it in the same collective order. Throws
  /// logic_error for a bucket view smaller than bucket_elements or of pageable memory.
  void reduce_async(mem_view bucket, stream_view s);

  /// The error-feedback buffer, in the bucket's layout (0 outside compressed matrices). Read it after
  /// the stream passed the reduce that wrote it.
  [[nodiscard]] mem_view error() const noexcept { return error_.view(); }
  /// Whether matrix k is compressed.
  [[nodiscard]] bool compressed(std::size_t k) const { return compressed_.at(k); }
  /// Floats each reduce hands to its two all-reduces (P's and the uncompressed tensors, then Q's).
  [[nodiscard]] std::size_t wire_elements() const noexcept { return p_total_ + u_total_ + q_total_; }

 private:
  using matrix = detail::powersgd_matrix;
  class host_work;

  communicator* comm_;
  powersgd_options options_;
  std::size_t bucket_elements_;
  std::vector<matrix> matrices_;  // compressed ones, grouped by shape
  std::vector<bool> compressed_;  // per matrix, in the caller's order
  std::vector<std::size_t> uncompressed_offsets_;
  std::vector<std::size_t> uncompressed_elements_;
  std::size_t p_total_ = 0;                      // floats of every P
  std::size_t q_total_ = 0;                      // floats of every Q
  std::size_t u_total_ = 0;                      // floats of every uncompressed tensor
  buffer error_;                                 // bucket layout
  buffer first_;                                 // all-reduced: every P, then every uncompressed tensor
  buffer q_;                                     // all-reduced: every Q (kept for the warm start)
  std::uint64_t steps_ = 0;                      // reduce_async calls so far
  std::unique_ptr<detail::powersgd_work> work_;  // the backend's stages (after the buffers it uses)
};

}  // namespace ferry::comm
