// PowerSGD's layout of one bucket (which matrices are compressed, where their P and Q live) and the work
// between its two all-reduces behind one interface per backend. The host backend's work is in
// src/comm/powersgd.cpp (host functions on the stream); the cuda backend's in src/comm/cuda (cuBLAS
// loaded at run time for the products, a kernel for the orthogonalization). Internal: callers use
// powersgd.hpp, which checks the arguments and owns the buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "ferry/device/device.hpp"

namespace ferry::comm::detail {

/// One compressed matrix: where it lives in the bucket, and where its P and Q live.
struct powersgd_matrix {
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t offset = 0;    // first element in the bucket (and in the error-feedback buffer)
  std::size_t p_offset = 0;  // first float of its P (rows x r, row-major) in the first wire buffer
  std::size_t q_offset = 0;  // first float of its Q (cols x r, row-major) in the second
};

/// What the backend's work reads and writes. The buffers are device memory of the communicator's device,
/// owned by the powersgd object and alive as long as the work.
struct powersgd_layout {
  std::size_t rank = 1;                       // r
  std::span<const powersgd_matrix> matrices;  // compressed ones, grouped by shape (rows, then cols)
  std::span<const std::size_t> u_offsets;     // uncompressed tensors: offsets in the bucket
  std::span<const std::size_t> u_elements;    // and sizes
  std::size_t p_total = 0;                    // floats of every P
  std::size_t q_total = 0;                    // floats of every Q
  float* error = nullptr;                     // bucket layout
  float* first = nullptr;                     // every P, then every uncompressed tensor
  float* q = nullptr;                         // every Q
};

/// The stages between the all-reduces, queued on `s` (never blocking the host).
class powersgd_work {
 public:
  powersgd_work() = default;
  powersgd_work(const powersgd_work&) = delete;
  powersgd_work& operator=(const powersgd_work&) = delete;
  virtual ~powersgd_work() = default;

  /// Q[j] = unit_noise(seed, j): the first Q (and every Q without warm start).
  virtual void seed_q(std::uint64_t seed, stream_view s) = 0;
  /// E += G (compressed matrices); P = E Q; the uncompressed tensors of G after the P's.
  virtual void project(float* g, stream_view s) = 0;
  /// Orthonormal columns of each (averaged) P; Q = E^T P.
  virtual void orthogonalize(stream_view s) = 0;
  /// G = P Q^T and E -= P Q^T (compressed matrices); the uncompressed tensors' mean back into G.
  virtual void reconstruct(float* g, stream_view s) = 0;
};

#if defined(FERRY_COMM_HAVE_CUDA)
/// The cuda backend's work for `layout` on `dev` (a cuda device): loads cuBLAS (throws comm_error naming
/// what dlopen said when it is missing), makes its handle and allocates its workspace and pointer arrays.
[[nodiscard]] std::unique_ptr<powersgd_work> make_cuda_powersgd_work(device& dev,
                                                                     const powersgd_layout& layout);
#endif

}  // namespace ferry::comm::detail
