// PowerSGD's bucket codec: the bucket's parameters as matrices at their offsets within the bucket, and
// the powersgd object that reduces them and keeps their state between steps; its registry entry with its
// options (powersgd_options) and their check.
#include "ferry/comm/powersgd_codec.hpp"

#include <any>
#include <memory>

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
  return e;
}

}  // namespace detail
}  // namespace ferry::comm
