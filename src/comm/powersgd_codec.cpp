// PowerSGD's bucket codec: the bucket's parameters as matrices at their offsets within the bucket, and
// the powersgd object that reduces them and keeps their state between steps; its registry entry with its
// options (powersgd_options) and their check.
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/core/error.hpp"

#include <fmt/format.h>

#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ferry::comm {
namespace {

class powersgd_codec final : public bucket_codec {
 public:
  explicit powersgd_codec(const bucket_setup& setup)
      : bucket_codec(setup.kind),
        state_(setup.comm, setup.shapes, setup.offsets, setup.elements,
               std::any_cast<const powersgd_options&>(*setup.options)) {}

  // Its two all-reduces are timed as one: all of PowerSGD's work.
  void reduce_async(mem_view bucket, mem_view /*scratch*/, stream_view s, reduce_marks& marks) override {
    marks.reduce_start(s);
    state_.reduce_async(bucket, s);
    marks.reduce_end(s);
  }
  [[nodiscard]] std::size_t wire_bytes() const noexcept override {
    return state_.wire_elements() * sizeof(float);
  }
  [[nodiscard]] mem_view error_feedback() const noexcept override { return state_.error(); }

  [[nodiscard]] const powersgd& state() const noexcept { return state_; }

 private:
  powersgd state_;
};

}  // namespace

const powersgd* powersgd_state(const bucket_codec& c) noexcept {
  const auto* p = dynamic_cast<const powersgd_codec*>(&c);
  return p != nullptr ? &p->state() : nullptr;
}

namespace detail {

codec_entry powersgd_codec_entry() {
  codec_entry e;
  e.name = "powersgd";
  e.make = [](const bucket_setup& setup) { return std::make_unique<powersgd_codec>(setup); };
  e.options = powersgd_options{};
  e.check_options = [](const std::any& o) { check(std::any_cast<const powersgd_options&>(o)); };
  e.options_from_fields = [](const std::vector<std::pair<std::string, double>>& fields) {
    powersgd_options o;
    for (const auto& [name, value] : fields) {
      if (name == "rank") {
        o.rank = static_cast<int>(value);
        FERRY_EXPECTS(static_cast<double>(o.rank) == value,
                      fmt::format("powersgd option rank = {}: expected a whole number", value));
      } else if (name == "min_compression_rate") {
        o.min_compression_rate = value;
      } else if (name == "warm_start") {
        o.warm_start = value != 0;
      } else if (name == "seed") {
        FERRY_EXPECTS(value >= 0 && value == static_cast<double>(static_cast<std::uint64_t>(value)),
                      fmt::format("powersgd option seed = {}: expected a whole number >= 0", value));
        o.seed = static_cast<std::uint64_t>(value);
      } else {
        throw logic_error(
            fmt::format("powersgd has no option '{}' (rank, min_compression_rate, warm_start, seed)", name));
      }
    }
    return std::any(o);
  };
  return e;
}

}  // namespace detail
}  // namespace ferry::comm
