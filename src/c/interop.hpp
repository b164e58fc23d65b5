// Default streams at the C ABI. Frameworks run on the legacy default stream (a cudaStream_t of 0, or 1
// in DLPack) or the per-thread one (2); ferry's device interface refuses to adopt them, because work
// queued there synchronizes with every stream. The C ABI accepts them for hand-offs only: it bridges a
// default stream to a ferry-owned stream with an event recorded on one and waited for by the other, so
// no host synchronization happens and nothing of ferry's runs on the default stream.
#pragma once

#include <cstdint>

#include "api.hpp"

namespace ferry::c_api {

/// True for the handles of the default streams on the cuda backend (0, 1, 2).
[[nodiscard]] bool is_default_stream(const device_state& st, std::uintptr_t handle) noexcept;

/// A stream ferry may queue work on, standing in for `handle`: the adopted handle itself, or, for a
/// default stream, the device's bridge stream made to wait for the default stream's current point.
[[nodiscard]] stream_view producer_view(device_state& st, std::uintptr_t handle);

/// Makes `handle` (any stream, default streams included) wait on the device for what `from` has queued
/// so far. Never blocks the host.
void join_into(device_state& st, std::uintptr_t handle, stream_view from);

/// `handle` (any stream, default streams included) waits on the device for the event `e`.
void wait_event(device_state& st, std::uintptr_t handle, const event& e);

/// Blocks until `handle`'s queued work is done (default streams included).
void synchronize(device_state& st, std::uintptr_t handle);

}  // namespace ferry::c_api
