// The sampler: which dataset indices make which batch. Shuffled epochs use a keyed pseudorandom
// permutation (a balanced Feistel network over the smallest even power of two covering the dataset,
// cycle-walked back into range), keyed by mix64(seed ^ mix64(epoch)). It gives the same permutation as a
// table would, but index() is O(1), takes no lock and needs no memory per epoch, so workers of any number
// of epochs in flight ask it concurrently and nothing is allocated at an epoch boundary.
#include <fmt/format.h>

#include <bit>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern_word.hpp"
#include "ferry/ingest/ingest.hpp"

namespace ferry::ingest {

std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) noexcept {
  return mix64(mix64(mix64(seed) + epoch) + index);
}

struct sampler::impl {
  sampler_options opts;
  std::size_t batches = 0;
  unsigned half_bits = 0;  // bits of each Feistel half
  std::uint64_t half_mask = 0;

  static constexpr int rounds = 6;

  [[nodiscard]] std::uint64_t permute(std::uint64_t key, std::uint64_t x) const noexcept {
    // Cycle-walking: the Feistel network permutes [0, 4^half_bits); applying it again to values outside
    // the dataset until one falls inside restricts it to a permutation of [0, dataset_size).
    do {
      std::uint64_t left = x >> half_bits;
      std::uint64_t right = x & half_mask;
      for (int r = 0; r < rounds; ++r) {
        const std::uint64_t f =
            mix64(right ^ (key + static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull)) & half_mask;
        const std::uint64_t next = left ^ f;
        left = right;
        right = next;
      }
      x = (left << half_bits) | right;
    } while (x >= opts.dataset_size);
    return x;
  }
};

sampler::sampler(const sampler_options& opts) {
  FERRY_EXPECTS(opts.dataset_size > 0,
                "ingest sampler_options::dataset_size is 0: the dataset needs at least one sample");
  FERRY_EXPECTS(opts.batch_size > 0,
                fmt::format("ingest sampler_options::batch_size is 0 (dataset_size {}): a "
                            "batch needs at least one sample",
                            opts.dataset_size));
  FERRY_EXPECTS(
      !opts.drop_last || opts.dataset_size >= opts.batch_size,
      fmt::format("ingest sampler: dataset_size {} is smaller than batch_size {} with drop_last, so an "
                  "epoch has no batch; lower batch_size or set drop_last = false",
                  opts.dataset_size, opts.batch_size));
  auto p = std::make_shared<impl>();
  p->opts = opts;
  p->batches =
      static_cast<std::size_t>(opts.drop_last ? opts.dataset_size / opts.batch_size
                                              : (opts.dataset_size + opts.batch_size - 1) / opts.batch_size);
  const unsigned bits =
      opts.dataset_size <= 1 ? 1 : static_cast<unsigned>(std::bit_width(opts.dataset_size - 1));
  p->half_bits = (bits + 1) / 2;
  p->half_mask = (std::uint64_t{1} << p->half_bits) - 1;
  impl_ = std::move(p);
}

std::size_t sampler::batches_per_epoch() const noexcept { return impl_->batches; }

std::size_t sampler::batch_samples(std::size_t batch) const {
  FERRY_EXPECTS(batch < impl_->batches,
                fmt::format("ingest sampler: batch {} is out of range; an epoch has {} batches", batch,
                            impl_->batches));
  const std::uint64_t first = static_cast<std::uint64_t>(batch) * impl_->opts.batch_size;
  const std::uint64_t left = impl_->opts.dataset_size - first;
  return left < impl_->opts.batch_size ? static_cast<std::size_t>(left) : impl_->opts.batch_size;
}

std::uint64_t sampler::index(std::uint64_t epoch, std::size_t batch, std::size_t position) const {
  FERRY_EXPECTS(position < batch_samples(batch),
                fmt::format("ingest sampler: position {} is out of range; batch {} has {} samples", position,
                            batch, batch_samples(batch)));
  const std::uint64_t i = static_cast<std::uint64_t>(batch) * impl_->opts.batch_size + position;
  if (!impl_->opts.shuffle) return i;
  return impl_->permute(mix64(impl_->opts.seed ^ mix64(epoch)), i);
}

const sampler_options& sampler::options() const noexcept { return impl_->opts; }

}  // namespace ferry::ingest
