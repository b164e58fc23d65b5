// PowerSGD on the host backend: the three stages between the two all-reduces as host functions on the
// bucket's stream (products, Gram-Schmidt, reconstruction and error feedback), with fp64 accumulation.
#include "ferry/comm/powersgd.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm {

// One compressed matrix: where it lives in the bucket, and where its P and Q live.
struct powersgd::matrix {
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t offset = 0;    // first element in the bucket (and in error_)
  std::size_t p_offset = 0;  // first float of its P (rows x r, row-major) in first_
  std::size_t q_offset = 0;  // first float of its Q (cols x r, row-major) in q_
};

powersgd::powersgd(communicator& comm, std::span<const matrix_shape> shapes,
                   std::span<const std::size_t> offsets, std::size_t bucket_elements,
                   powersgd_options options)
    : comm_(&comm), options_(options), bucket_elements_(bucket_elements) {
  FERRY_EXPECTS(
      comm.dev().kind() == backend::host,
      "PowerSGD runs on host devices only: its cuda path (cuBLAS through src/shim) is not written yet");
  FERRY_EXPECTS(options.rank >= 1, fmt::format("powersgd_options::rank = {}: must be >= 1", options.rank));
  FERRY_EXPECTS(
      options.min_compression_rate > 0,
      fmt::format("powersgd_options::min_compression_rate = {}: must be > 0", options.min_compression_rate));
  FERRY_EXPECTS(shapes.size() == offsets.size(),
                fmt::format("powersgd of {} shapes and {} offsets: give one offset per matrix", shapes.size(),
                            offsets.size()));
  FERRY_EXPECTS(!shapes.empty(), "powersgd of no matrices");
  // Matrices inside the bucket, without overlap.
  std::vector<std::size_t> by_offset(shapes.size());
  std::iota(by_offset.begin(), by_offset.end(), 0);
  std::sort(by_offset.begin(), by_offset.end(),
            [&](std::size_t a, std::size_t b) { return offsets[a] < offsets[b]; });
  std::size_t end = 0;
  for (const std::size_t k : by_offset) {
    const std::size_t n = shapes[k].elements();
    FERRY_EXPECTS(n > 0, fmt::format("powersgd: matrix {} of shape {}x{} has no elements", k, shapes[k].rows,
                                     shapes[k].cols));
    FERRY_EXPECTS(offsets[k] >= end,
                  fmt::format("powersgd: matrix {} at element {} overlaps the one before it "
                              "(which ends at {})",
                              k, offsets[k], end));
    FERRY_EXPECTS(offsets[k] + n <= bucket_elements,
                  fmt::format("powersgd: matrix {} ({}x{} at element {}) ends past the bucket's {} elements",
                              k, shapes[k].rows, shapes[k].cols, offsets[k], bucket_elements));
    end = offsets[k] + n;
  }
  // Which matrices are worth compressing; those in shape groups, the others whole.
  const auto r = static_cast<std::size_t>(options.rank);
  compressed_.resize(shapes.size());
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const matrix_shape& m = shapes[k];
    compressed_[k] =
        m.rows >= 2 && m.cols >= 2 &&
        static_cast<double>(m.rows + m.cols) * static_cast<double>(r) * options.min_compression_rate <
            static_cast<double>(m.rows * m.cols);
    if (compressed_[k]) {
      matrices_.push_back(matrix{m.rows, m.cols, offsets[k], 0, 0});
    } else {
      uncompressed_offsets_.push_back(offsets[k]);
      uncompressed_elements_.push_back(m.elements());
      u_total_ += m.elements();
    }
  }
  std::stable_sort(matrices_.begin(), matrices_.end(), [](const matrix& a, const matrix& b) {
    return a.rows != b.rows ? a.rows < b.rows : a.cols < b.cols;
  });
  for (matrix& m : matrices_) {
    m.p_offset = p_total_;
    m.q_offset = q_total_;
    p_total_ += m.rows * r;
    q_total_ += m.cols * r;
  }
  device& dev = comm.dev();
  error_ = dev.alloc_device(bucket_elements * sizeof(float));
  first_ = dev.alloc_device(std::max<std::size_t>(p_total_ + u_total_, 1) * sizeof(float));
  q_ = dev.alloc_device(std::max<std::size_t>(q_total_, 1) * sizeof(float));
  // Host devices' memory is host memory, and no stream has touched these buffers yet.
  std::fill_n(static_cast<float*>(error_.data()), bucket_elements, 0.0F);
}

powersgd::~powersgd() {
  // Host functions queued by reduce_async point at this object and its buffers: let them finish.
  try {
    comm_->dev().synchronize();
  } catch (const std::exception& e) {
    FERRY_ASSERT_NOTHROW(
        false, fmt::format("powersgd on rank {}: its stream work failed: {}", comm_->rank(), e.what()));
  }
}

void powersgd::reduce_async(mem_view bucket, stream_view s) {
  FERRY_EXPECTS(bucket.kind != memory_kind::pageable && bucket.data != nullptr,
                "powersgd::reduce_async: the bucket must be device memory of the communicator's device");
  FERRY_EXPECTS(
      bucket.bytes >= bucket_elements_ * sizeof(float),
      fmt::format("powersgd::reduce_async: the bucket view of {} bytes is smaller than the {} elements "
                  "the matrices span",
                  bucket.bytes, bucket_elements_));
  FERRY_EXPECTS(&s.dev() == &comm_->dev(), "powersgd::reduce_async: the stream belongs to another device");
  device& dev = comm_->dev();
  auto* g = static_cast<float*>(bucket.data);
  dev.launch_host_func(s, [this, g] { stage_project(g); });
  static_cast<void>(
      comm_->all_reduce(first_.view(), first_.view(), p_total_ + u_total_, dtype::f32, reduce_op::avg, s));
  if (q_total_ > 0) {
    dev.launch_host_func(s, [this] { stage_orthogonalize(); });
    static_cast<void>(comm_->all_reduce(q_.view(), q_.view(), q_total_, dtype::f32, reduce_op::avg, s));
  }
  dev.launch_host_func(s, [this, g] { stage_reconstruct(g); });
}

// M = G + E into E; P = M Q; the uncompressed tensors after the P's.
void powersgd::stage_project(float* g) {
  const auto r = static_cast<std::size_t>(options_.rank);
  auto* e = static_cast<float*>(error_.data());
  auto* p = static_cast<float*>(first_.data());
  auto* q = static_cast<float*>(q_.data());
  if (steps_ == 0 || !options_.warm_start) {
    for (std::size_t j = 0; j < q_total_; ++j) q[j] = detail::unit_noise(options_.seed, j);
  }
  ++steps_;
  for (const matrix& m : matrices_) {
    float* mm = e + m.offset;
    const float* gm = g + m.offset;
    for (std::size_t i = 0; i < m.rows * m.cols; ++i) mm[i] += gm[i];
    const float* qm = q + m.q_offset;
    float* pm = p + m.p_offset;
    for (std::size_t i = 0; i < m.rows; ++i) {
      for (std::size_t k = 0; k < r; ++k) {
        double acc = 0;
        for (std::size_t j = 0; j < m.cols; ++j)
          acc += static_cast<double>(mm[i * m.cols + j]) * qm[j * r + k];
        pm[i * r + k] = static_cast<float>(acc);
      }
    }
  }
  float* u = p + p_total_;
  for (std::size_t k = 0; k < uncompressed_offsets_.size(); ++k) {
    std::copy_n(g + uncompressed_offsets_[k], uncompressed_elements_[k], u);
    u += uncompressed_elements_[k];
  }
}

// Orthonormal columns of each (averaged) P by Gram-Schmidt; Q = M^T P.
void powersgd::stage_orthogonalize() {
  const auto r = static_cast<std::size_t>(options_.rank);
  const auto* e = static_cast<const float*>(error_.data());
  auto* p = static_cast<float*>(first_.data());
  auto* q = static_cast<float*>(q_.data());
  for (const matrix& m : matrices_) {
    float* pm = p + m.p_offset;
    for (std::size_t k = 0; k < r; ++k) {
      for (std::size_t l = 0; l < k; ++l) {
        double dot = 0;
        for (std::size_t i = 0; i < m.rows; ++i) dot += static_cast<double>(pm[i * r + l]) * pm[i * r + k];
        for (std::size_t i = 0; i < m.rows; ++i) pm[i * r + k] -= static_cast<float>(dot * pm[i * r + l]);
      }
      double norm = 0;
      for (std::size_t i = 0; i < m.rows; ++i) norm += static_cast<double>(pm[i * r + k]) * pm[i * r + k];
      norm = std::sqrt(norm);
      // A zero column (a zero gradient) stays zero: that direction contributes nothing.
      const double inv = norm > 0 ? 1.0 / norm : 0.0;
      for (std::size_t i = 0; i < m.rows; ++i) pm[i * r + k] = static_cast<float>(pm[i * r + k] * inv);
    }
    const float* mm = e + m.offset;
    float* qm = q + m.q_offset;
    for (std::size_t j = 0; j < m.cols; ++j) {
      for (std::size_t k = 0; k < r; ++k) {
        double acc = 0;
        for (std::size_t i = 0; i < m.rows; ++i)
          acc += static_cast<double>(mm[i * m.cols + j]) * pm[i * r + k];
        qm[j * r + k] = static_cast<float>(acc);
      }
    }
  }
}

// G = P Q^T and E = M - G for each compressed matrix; the uncompressed tensors' mean back into G.
void powersgd::stage_reconstruct(float* g) {
  const auto r = static_cast<std::size_t>(options_.rank);
  auto* e = static_cast<float*>(error_.data());
  const auto* p = static_cast<const float*>(first_.data());
  const auto* q = static_cast<const float*>(q_.data());
  for (const matrix& m : matrices_) {
    const float* pm = p + m.p_offset;
    const float* qm = q + m.q_offset;
    float* mm = e + m.offset;
    float* gm = g + m.offset;
    for (std::size_t i = 0; i < m.rows; ++i) {
      for (std::size_t j = 0; j < m.cols; ++j) {
        double acc = 0;
        for (std::size_t k = 0; k < r; ++k) acc += static_cast<double>(pm[i * r + k]) * qm[j * r + k];
        const auto approx = static_cast<float>(acc);
        gm[i * m.cols + j] = approx;
        mm[i * m.cols + j] -= approx;
      }
    }
  }
  const float* u = p + p_total_;
  for (std::size_t k = 0; k < uncompressed_offsets_.size(); ++k) {
    std::copy_n(u, uncompressed_elements_[k], g + uncompressed_offsets_[k]);
    u += uncompressed_elements_[k];
  }
}

}  // namespace ferry::comm
