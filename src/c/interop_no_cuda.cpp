// Without the cuda backend there are no default streams to bridge: every handle is a ferry stream.
#include "ferry/core/error.hpp"
#include "interop.hpp"

namespace ferry::c_api {

bool is_default_stream(const device_state& /*st*/, std::uintptr_t /*handle*/) noexcept { return false; }

stream_view producer_view(device_state& st, std::uintptr_t handle) {
  return st.dev->adopt_stream(reinterpret_cast<void*>(handle));
}

stream_view default_stand_in(device_state& st) {
  static_cast<void>(st);
  throw logic_error("default_stand_in without the cuda backend: there is no default stream to stand in for");
}

void join_into(device_state& st, std::uintptr_t handle, stream_view from) {
  const stream_view to = st.dev->adopt_stream(reinterpret_cast<void*>(handle));
  if (to == from) return;
  event e = st.dev->make_event();
  e.record(from);
  to.wait(e);
}

void wait_event(device_state& st, std::uintptr_t handle, const event& e) {
  st.dev->adopt_stream(reinterpret_cast<void*>(handle)).wait(e);
}

void synchronize(device_state& st, std::uintptr_t handle) {
  st.dev->adopt_stream(reinterpret_cast<void*>(handle)).synchronize();
}

}  // namespace ferry::c_api
