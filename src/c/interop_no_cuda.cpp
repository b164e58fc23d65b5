// Without the cuda backend there are no default streams to bridge: every handle is a ferry stream.
#include "interop.hpp"

namespace ferry::c_api {

bool is_default_stream(const device_state& /*st*/, std::uintptr_t /*handle*/) noexcept { return false; }

stream_view producer_view(device_state& st, std::uintptr_t handle) {
  return st.dev->adopt_stream(reinterpret_cast<void*>(handle));
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
