// Two uses of a slot_ring that the loader and the prefetcher share: a wait timed into a stage only when
// it waits, and a close that fails the ring with stopped_error.
#pragma once

#include <chrono>
#include <exception>

#include "ferry/core/error.hpp"
#include "ferry/core/slot_ring.hpp"
#include "ferry/core/stats.hpp"

namespace ferry::ingest::detail {

/// `now()` (a try_ member of the ring); when it gives nothing, `wait()` (the blocking one), its time
/// recorded in `stage`. Throws what they throw.
template <class Now, class Wait>
auto timed_if_waiting(stage_stats& stage, Now now, Wait wait) -> decltype(now()) {
  if (auto got = now()) return got;
  const auto t0 = std::chrono::steady_clock::now();
  decltype(now()) got = wait();
  stage.record(std::chrono::steady_clock::now() - t0);
  return got;
}

/// Fails `ring` with stopped_error(`why`): every wait on it wakes and throws that, even where slots are
/// ready. Never throws (out of memory for the error, it stops the ring at least).
inline void fail_closed(slot_ring& ring, const char* why) noexcept {
  try {
    ring.fail(std::make_exception_ptr(stopped_error(why)));
  } catch (...) {
    ring.stop();
  }
}

}  // namespace ferry::ingest::detail
