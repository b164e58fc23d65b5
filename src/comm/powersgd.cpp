// PowerSGD: the checks, the layout (which matrices are compressed, shape groups) and the order of the
// stages and all-reduces; the stages are the backend's powersgd_work. Here the host backend's: host
// functions on the bucket's stream (products, Gram-Schmidt, reconstruction and error feedback), with fp64
// accumulation. The cuda backend's is src/comm/cuda/powersgd_cuda.cpp.
#include "ferry/comm/powersgd.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm {

// The host backend's stages: plain loops over the layout's buffers, which are host memory.
class powersgd::host_work final : public detail::powersgd_work {
 public:
  explicit host_work(const detail::powersgd_layout& layout) : l_(layout) {}
  void seed_q(std::uint64_t seed, stream_view s) override;
  void project(float* g, stream_view s) override;
  void orthogonalize(stream_view s) override;
  void reconstruct(float* g, stream_view s) override;

 private:
  void do_project(float* g) const;
  void do_orthogonalize() const;
  void do_reconstruct(float* g) const;

  detail::powersgd_layout l_;
};

void check(const powersgd_options& options) {
  FERRY_EXPECTS(options.rank >= 1, fmt::format("powersgd_options::rank = {}: must be >= 1", options.rank));
  FERRY_EXPECTS(
      options.min_compression_rate > 0,
      fmt::format("powersgd_options::min_compression_rate = {}: must be > 0", options.min_compression_rate));
}

powersgd::powersgd(communicator& comm, std::span<const matrix_shape> shapes,
                   std::span<const std::size_t> offsets, std::size_t bucket_elements,
                   powersgd_options options)
    : comm_(&comm), options_(options), bucket_elements_(bucket_elements) {
  check(options);
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
  const detail::powersgd_layout layout{r,
                                       matrices_,
                                       uncompressed_offsets_,
                                       uncompressed_elements_,
                                       p_total_,
                                       q_total_,
                                       static_cast<float*>(error_.data()),
                                       static_cast<float*>(first_.data()),
                                       static_cast<float*>(q_.data())};
  if (dev.kind() == backend::host) {
    // Host devices' memory is host memory, and no stream has touched these buffers yet.
    std::fill_n(static_cast<float*>(error_.data()), bucket_elements, 0.0F);
    work_ = std::make_unique<host_work>(layout);
    return;
  }
#if defined(FERRY_COMM_HAVE_CUDA)
  {
    const stream s = dev.make_stream();
    dev.memset_async(error_.view(), 0, s);
    s.synchronize();  // construction may wait: no step runs yet
  }
  work_ = detail::make_cuda_powersgd_work(dev, layout);
#else
  throw logic_error("ferry::comm was built without CUDA: PowerSGD runs on host devices only");
#endif
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
  auto* g = static_cast<float*>(bucket.data);
  if (steps_ == 0 || !options_.warm_start) work_->seed_q(options_.seed, s);
  ++steps_;
  work_->project(g, s);
  static_cast<void>(
      comm_->all_reduce(first_.view(), first_.view(), p_total_ + u_total_, dtype::f32, reduce_op::avg, s));
  if (q_total_ > 0) {
    work_->orthogonalize(s);
    static_cast<void>(comm_->all_reduce(q_.view(), q_.view(), q_total_, dtype::f32, reduce_op::avg, s));
  }
  work_->reconstruct(g, s);
}

void powersgd::host_work::seed_q(std::uint64_t seed, stream_view s) {
  s.dev().launch_host_func(s, [this, seed] {
    for (std::size_t j = 0; j < l_.q_total; ++j) l_.q[j] = detail::unit_noise(seed, j);
  });
}

void powersgd::host_work::project(float* g, stream_view s) {
  s.dev().launch_host_func(s, [this, g] { do_project(g); });
}

void powersgd::host_work::orthogonalize(stream_view s) {
  s.dev().launch_host_func(s, [this] { do_orthogonalize(); });
}

void powersgd::host_work::reconstruct(float* g, stream_view s) {
  s.dev().launch_host_func(s, [this, g] { do_reconstruct(g); });
}

// M = G + E into E; P = M Q; the uncompressed tensors after the P's.
void powersgd::host_work::do_project(float* g) const {
  const std::size_t r = l_.rank;
  float* e = l_.error;
  float* p = l_.first;
  const float* q = l_.q;
  for (const matrix& m : l_.matrices) {
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
  float* u = p + l_.p_total;
  for (std::size_t k = 0; k < l_.u_offsets.size(); ++k) {
    std::copy_n(g + l_.u_offsets[k], l_.u_elements[k], u);
    u += l_.u_elements[k];
  }
}

// Orthonormal columns of each (averaged) P by Gram-Schmidt; Q = M^T P.
void powersgd::host_work::do_orthogonalize() const {
  const std::size_t r = l_.rank;
  const float* e = l_.error;
  float* p = l_.first;
  float* q = l_.q;
  for (const matrix& m : l_.matrices) {
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
void powersgd::host_work::do_reconstruct(float* g) const {
  const std::size_t r = l_.rank;
  float* e = l_.error;
  const float* p = l_.first;
  const float* q = l_.q;
  for (const matrix& m : l_.matrices) {
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
  const float* u = p + l_.p_total;
  for (std::size_t k = 0; k < l_.u_offsets.size(); ++k) {
    std::copy_n(u, l_.u_elements[k], g + l_.u_offsets[k]);
    u += l_.u_elements[k];
  }
}

}  // namespace ferry::comm
