// What the device-to-device benches' tests share: a host group of emulated devices, and a communicator
// that reduces wrongly (it sums where it is asked to average), to show the benches' checks catch it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::bench::test_groups {

/// `n` emulated devices and a host group over them: at memcpy speed, or over `link` when it models.
struct host_group {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<comm::communicator>> comms;
  std::vector<comm::communicator*> ranks;
  explicit host_group(int n, comm::comm_link link = unmodelled()) {
    std::vector<device*> raw;
    for (int r = 0; r < n; ++r) {
      host_device_options o;
      o.model_link = false;
      devices.push_back(make_host_device(o));
      raw.push_back(devices.back().get());
    }
    comm::comm_options o;
    o.link = std::move(link);
    o.timeout = std::chrono::seconds(60);
    comms = comm::make_host_group(raw, o);
    for (auto& c : comms) ranks.push_back(c.get());
  }
  host_group(const host_group&) = delete;
  host_group& operator=(const host_group&) = delete;
  ~host_group() { comms.clear(); }

  static comm::comm_link unmodelled() {
    comm::comm_link l;
    l.model = false;
    return l;
  }
};

/// Forwards every collective to `inner`, except that an all-reduce asked to average sums instead.
class summing : public comm::communicator {
 public:
  explicit summing(comm::communicator& inner)
      : communicator(inner.dev(), inner.rank(), inner.size()), inner_(inner) {}
  [[nodiscard]] std::string_view backend_name() const noexcept override { return "summing"; }
  void abort(const std::string& why) noexcept override { inner_.abort(why); }
  [[nodiscard]] bool aborted() const noexcept override { return inner_.aborted(); }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, comm::dtype type, comm::reduce_op,
                     stream_view s) override {
    const std::size_t bytes = count * comm::size_of(type);
    static_cast<void>(inner_.all_reduce(device_view(const_cast<void*>(send), bytes), device_view(recv, bytes),
                                        count, type, comm::reduce_op::sum, s));
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, comm::dtype type,
                     stream_view s) override {
    const std::size_t bytes = count * comm::size_of(type);
    static_cast<void>(inner_.all_gather(device_view(const_cast<void*>(send), bytes),
                                        device_view(recv, bytes * static_cast<std::size_t>(size())), count,
                                        type, s));
  }
  void do_broadcast(const void* send, void* recv, std::size_t count, comm::dtype type, int root,
                    stream_view s) override {
    const std::size_t bytes = count * comm::size_of(type);
    const void* from = send != nullptr ? send : recv;  // send is read on the root only
    static_cast<void>(inner_.broadcast(device_view(const_cast<void*>(from), bytes), device_view(recv, bytes),
                                       count, type, root, s));
  }
  void do_barrier(stream_view s) override { static_cast<void>(inner_.barrier(s)); }

 private:
  comm::communicator& inner_;
};

}  // namespace ferry::bench::test_groups
