// PowerSGD's work on the cuda backend. The products are cuBLAS's (loaded at run time through ferry::shim),
// one batched GEMM per shape group and product: cublasSgemmBatched over arrays of device pointers, since
// the matrices of a group sit at the bucket's offsets, which need not be evenly spaced. The arrays for
// the error-feedback buffer, P and Q are written once, at construction; the bucket's (where G = P Q^T
// goes) by a small kernel each step, because the bucket's address is the caller's. The rest are the
// kernels of powersgd_kernels.cu. Nothing is allocated after construction (cuBLAS gets its workspace
// from here), and nothing waits for the device.
//
// Row-major matrices are cuBLAS's column-major transposes: M (rows x cols, ld cols) is M^T, P (rows x r)
// is P^T (ld r), Q (cols x r) is Q^T (ld r). So P^T = Q^T M^T, Q^T = P^T M and (P Q^T)^T = Q P^T.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "current_device.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/detail/powersgd_work.hpp"
#include "ferry/core/error.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"
#include "ferry/shim/cublas.hpp"
#include "powersgd_kernels.hpp"

namespace ferry::comm::detail {
namespace {

using cuda_kernels::ortho_item;
using cuda_kernels::segment;
using shim::cublas_op;

// cuBLAS's workspace for this object's handle (its products are skinny: r <= a few columns).
constexpr std::size_t workspace_bytes = std::size_t{4} << 20;

void cublas_try(shim::cublas_status status, const char* call) {
  if (status != shim::cublas_success) {
    throw cuda_error(status, fmt::format("{} failed: {}", call, shim::cublas().error_string(status)));
  }
}

int as_int(std::size_t v, const char* what) {
  FERRY_EXPECTS(v <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                fmt::format("powersgd on cuda: {} = {} exceeds cuBLAS's int limit {}", what, v,
                            std::numeric_limits<int>::max()));
  return static_cast<int>(v);
}

// The matrices [begin, end) of one shape.
struct group {
  std::size_t begin = 0;
  int count = 0;
  int rows = 0;
  int cols = 0;
};

class cuda_powersgd_work final : public powersgd_work {
 public:
  cuda_powersgd_work(device& dev, const powersgd_layout& layout)
      : api_(&shim::cublas()), layout_(layout), n_(layout.matrices.size()) {
    if (!api_->ok()) {
      throw comm_error(fmt::format("powersgd on cuda needs cuBLAS: {}", api_->error), collective::all_reduce,
                       -1);
    }
    const auto r = as_int(layout.rank, "rank");
    static_cast<void>(r);
    // Shape groups: runs of equal (rows, cols) in the layout's order.
    for (std::size_t i = 0; i < n_; ++i) {
      const powersgd_matrix& m = layout.matrices[i];
      if (groups_.empty() || static_cast<std::size_t>(groups_.back().rows) != m.rows ||
          static_cast<std::size_t>(groups_.back().cols) != m.cols) {
        groups_.push_back(group{i, 0, as_int(m.rows, "rows"), as_int(m.cols, "cols")});
      }
      ++groups_.back().count;
    }
    // The tables the kernels and cuBLAS read, in one allocation: segments, items, offsets, pointers.
    std::vector<segment> segs;
    for (const powersgd_matrix& m : layout.matrices) {
      segs.push_back({m.offset, m.offset, m.rows * m.cols});
      largest_e_ = std::max(largest_e_, m.rows * m.cols);
    }
    std::size_t u = layout.p_total;
    for (std::size_t k = 0; k < layout.u_offsets.size(); ++k) {
      segs.push_back({u, layout.u_offsets[k], layout.u_elements[k]});  // into the wire buffer
      largest_u_ = std::max(largest_u_, layout.u_elements[k]);
      u += layout.u_elements[k];
    }
    u = layout.p_total;
    for (std::size_t k = 0; k < layout.u_offsets.size(); ++k) {
      segs.push_back({layout.u_offsets[k], u, layout.u_elements[k]});  // back into the bucket
      u += layout.u_elements[k];
    }
    FERRY_EXPECTS(
        n_ < 65536 && layout.u_offsets.size() < 65536,
        fmt::format("powersgd on cuda: {} compressed and {} whole tensors in one bucket; at most 65535 "
                    "of each",
                    n_, layout.u_offsets.size()));
    std::vector<ortho_item> items;
    std::vector<std::size_t> offsets;
    std::vector<const float*> e_ptrs;
    std::vector<const float*> p_ptrs;
    std::vector<const float*> q_ptrs;
    for (const powersgd_matrix& m : layout.matrices) {
      items.push_back({m.p_offset, m.rows});
      offsets.push_back(m.offset);
      e_ptrs.push_back(layout.error + m.offset);
      p_ptrs.push_back(layout.first + m.p_offset);
      q_ptrs.push_back(layout.q + m.q_offset);
    }
    auto align = [](std::size_t b) { return (b + 255) / 256 * 256; };
    const std::size_t seg_bytes = align(std::max<std::size_t>(segs.size(), 1) * sizeof(segment));
    const std::size_t item_bytes = align(std::max<std::size_t>(n_, 1) * sizeof(ortho_item));
    const std::size_t off_bytes = align(std::max<std::size_t>(n_, 1) * sizeof(std::size_t));
    const std::size_t ptr_bytes = align(std::max<std::size_t>(n_, 1) * sizeof(float*));
    const std::size_t total = seg_bytes + item_bytes + off_bytes + 4 * ptr_bytes;
    tables_ = dev.alloc_device(total);
    workspace_ = dev.alloc_device(workspace_bytes);
    const buffer staging = dev.alloc_pinned(total);
    std::byte* h = staging.host_bytes();
    std::memset(h, 0, total);
    auto* base = static_cast<std::byte*>(tables_.data());
    std::size_t at = 0;
    auto put = [&](const void* src, std::size_t bytes, std::size_t room) {
      std::memcpy(h + at, src, bytes);
      std::byte* where = base + at;
      at += room;
      return where;
    };
    const auto* segs_dev =
        reinterpret_cast<const segment*>(put(segs.data(), segs.size() * sizeof(segment), seg_bytes));
    segs_e_ = segs_dev;
    segs_u_in_ = segs_dev + n_;
    segs_u_out_ = segs_dev + n_ + layout.u_offsets.size();
    items_ = reinterpret_cast<const ortho_item*>(put(items.data(), n_ * sizeof(ortho_item), item_bytes));
    offsets_ = reinterpret_cast<const std::size_t*>(put(offsets.data(), n_ * sizeof(std::size_t), off_bytes));
    e_ptrs_ = reinterpret_cast<float* const*>(put(e_ptrs.data(), n_ * sizeof(float*), ptr_bytes));
    p_ptrs_ = reinterpret_cast<float* const*>(put(p_ptrs.data(), n_ * sizeof(float*), ptr_bytes));
    q_ptrs_ = reinterpret_cast<float* const*>(put(q_ptrs.data(), n_ * sizeof(float*), ptr_bytes));
    g_ptrs_ = reinterpret_cast<float**>(base + at);  // written by each step's project
    const stream s = dev.make_stream();
    dev.copy(tables_.view(), staging.view(), s);  // construction may wait: no step runs yet
    // The handle, on the device of the communicator (current while it is made).
    static_cast<void>(select(s));
    cublas_try(api_->create(&handle_), "cublasCreate_v2");
    cublas_try(api_->set_math_mode(handle_, shim::cublas_math::default_math), "cublasSetMathMode");
  }

  cuda_powersgd_work(const cuda_powersgd_work&) = delete;
  cuda_powersgd_work& operator=(const cuda_powersgd_work&) = delete;

  ~cuda_powersgd_work() override {
    // powersgd's destructor waited for the device: nothing queued uses the handle any more.
    if (handle_ != nullptr) {
      const shim::cublas_status status = api_->destroy(handle_);
      FERRY_ASSERT_NOTHROW(status == shim::cublas_success,
                           fmt::format("cublasDestroy_v2 failed: {}", api_->error_string(status)));
    }
  }

  void seed_q(std::uint64_t seed, stream_view s) override {
    const cudaStream_t stream = select(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_seed(layout_.q, layout_.q_total, seed, stream));
  }

  void project(float* g, stream_view s) override {
    const cudaStream_t stream = bind(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_pointers(g_ptrs_, offsets_, n_, g, stream));
    FERRY_CUDA_TRY(cuda_kernels::launch_segments(segs_e_, static_cast<unsigned>(n_), largest_e_,
                                                 layout_.error, g, true, stream));
    FERRY_CUDA_TRY(cuda_kernels::launch_segments(segs_u_in_, static_cast<unsigned>(layout_.u_offsets.size()),
                                                 largest_u_, layout_.first, g, false, stream));
    // P^T (r x rows) = Q^T (r x cols) M^T (cols x rows).
    for (const group& gr : groups_) {
      gemm(cublas_op::n, cublas_op::n, r(), gr.rows, gr.cols, 1.0F, q_ptrs_ + gr.begin, r(),
           e_ptrs_ + gr.begin, gr.cols, 0.0F, p_ptrs_ + gr.begin, r(), gr.count);
    }
  }

  void orthogonalize(stream_view s) override {
    const cudaStream_t stream = bind(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_orthogonalize(items_, static_cast<unsigned>(n_), layout_.first,
                                                      layout_.rank, stream));
    // Q^T (r x cols) = P^T (r x rows) M (rows x cols).
    for (const group& gr : groups_) {
      gemm(cublas_op::n, cublas_op::t, r(), gr.cols, gr.rows, 1.0F, p_ptrs_ + gr.begin, r(),
           e_ptrs_ + gr.begin, gr.cols, 0.0F, q_ptrs_ + gr.begin, r(), gr.count);
    }
  }

  void reconstruct(float* g, stream_view s) override {
    const cudaStream_t stream = bind(s);
    // G^T (cols x rows) = Q (cols x r) P^T (r x rows); then E^T -= the same product (the residual, fused
    // into the product's epilogue: beta = 1).
    for (const group& gr : groups_) {
      gemm(cublas_op::t, cublas_op::n, gr.cols, gr.rows, r(), 1.0F, q_ptrs_ + gr.begin, r(),
           p_ptrs_ + gr.begin, r(), 0.0F, g_ptrs_ + gr.begin, gr.cols, gr.count);
      gemm(cublas_op::t, cublas_op::n, gr.cols, gr.rows, r(), -1.0F, q_ptrs_ + gr.begin, r(),
           p_ptrs_ + gr.begin, r(), 1.0F, e_ptrs_ + gr.begin, gr.cols, gr.count);
    }
    FERRY_CUDA_TRY(cuda_kernels::launch_segments(segs_u_out_, static_cast<unsigned>(layout_.u_offsets.size()),
                                                 largest_u_, g, layout_.first, false, stream));
  }

 private:
  [[nodiscard]] int r() const noexcept { return static_cast<int>(layout_.rank); }

  // The stream's device current, and cuBLAS on the stream with this object's workspace (setting the
  // stream resets cuBLAS's workspace, so both change together, only when the stream does).
  cudaStream_t bind(stream_view s) {
    const cudaStream_t stream = select(s);
    if (stream != bound_ || !bound_once_) {
      cublas_try(api_->set_stream(handle_, stream), "cublasSetStream_v2");
      cublas_try(api_->set_workspace(handle_, workspace_.data(), workspace_bytes), "cublasSetWorkspace_v2");
      bound_ = stream;
      bound_once_ = true;
    }
    return stream;
  }

  void gemm(cublas_op ta, cublas_op tb, int m, int n, int k, float alpha, float* const* a, int lda,
            float* const* b, int ldb, float beta, float* const* c, int ldc, int count) {
    cublas_try(api_->sgemm_batched(handle_, ta, tb, m, n, k, &alpha, const_cast<const float* const*>(a), lda,
                                   const_cast<const float* const*>(b), ldb, &beta, c, ldc, count),
               "cublasSgemmBatched");
  }

  const shim::cublas_api* api_;
  powersgd_layout layout_;
  std::size_t n_;
  std::vector<group> groups_;
  std::size_t largest_e_ = 0;
  std::size_t largest_u_ = 0;
  buffer tables_;
  buffer workspace_;
  const segment* segs_e_ = nullptr;
  const segment* segs_u_in_ = nullptr;
  const segment* segs_u_out_ = nullptr;
  const ortho_item* items_ = nullptr;
  const std::size_t* offsets_ = nullptr;
  float* const* e_ptrs_ = nullptr;
  float* const* p_ptrs_ = nullptr;
  float* const* q_ptrs_ = nullptr;
  float** g_ptrs_ = nullptr;
  shim::cublas_handle handle_ = nullptr;
  cudaStream_t bound_ = nullptr;
  bool bound_once_ = false;
};

}  // namespace

std::unique_ptr<powersgd_work> make_cuda_powersgd_work(device& dev, const powersgd_layout& layout) {
  return std::make_unique<cuda_powersgd_work>(dev, layout);
}

}  // namespace ferry::comm::detail
