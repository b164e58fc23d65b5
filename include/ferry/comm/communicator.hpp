// ferry::comm: collectives between devices (GPU to GPU), the third data path.
//
// A communicator is one rank of a group. Every collective is asynchronous on a caller's stream of the
// rank's device and returns a completion event recorded on that stream after it; the host never waits on
// the hot path. Ranks of a group must issue the same collectives, with the same counts and types, in the
// same order (as with NCCL): the group matches them by order.
//
// Backends:
// - host: in-process ranks over emulated devices (make_host_device), one per rank; the reduction really
//   runs on host memory and the time it takes follows a modelled link (comm_link), so every pipeline on
//   top runs and is tested in CI without a GPU.
// - nccl: NCCL, loaded at run time (libnccl.so.2); one process driving several GPUs, their communicators
//   made together (nonblocking, so no NCCL call can hang a thread), or several processes of a job that
//   find one another through a bootstrap (bootstrap.hpp: MPI), so the same code runs across nodes.
//
// Faults: a collective that does not complete within comm_options::timeout (a rank that threw, died or
// never arrived) aborts the whole group: every rank's pending and later operations fail with comm_error,
// which names the operation, the rank that saw the failure and the ranks that were missing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device/device.hpp"

namespace ferry::comm {

class bootstrap;

/// Element types of a collective. The integers carry host values between ranks exactly (indices, counts,
/// plan words): NCCL's ncclInt32/ncclInt64/ncclUint64. Their sum wraps modulo 2^bits (two's complement), as
/// on the GPU; avg is refused for them (an integer mean would round, differently per backend).
enum class dtype : std::uint8_t { f32, f16, bf16, i32, i64, u64 };
/// Reduction of an all-reduce. avg divides the sum by the group's size (a group of one sums: the same
/// values, without a pass that divides by 1); floating-point types only.
enum class reduce_op : std::uint8_t { sum, avg };
/// The collectives, for messages and statistics.
enum class collective : std::uint8_t { all_reduce, all_gather, broadcast, barrier };

[[nodiscard]] std::size_t size_of(dtype t) noexcept;
[[nodiscard]] std::string_view to_string(dtype t) noexcept;
[[nodiscard]] std::string_view to_string(reduce_op op) noexcept;
[[nodiscard]] std::string_view to_string(collective c) noexcept;
/// Parses "f32"/"fp32"/"float", "f16"/"fp16"/"half", "bf16", "i32", "i64", "u64"; throws logic_error naming
/// the text.
[[nodiscard]] dtype parse_dtype(std::string_view text);

/// A collective failed or timed out; the group it belonged to is aborted. Making a group that fails (NCCL
/// missing or refusing) throws it too, with op() barrier and rank() -1 (the group as a whole).
class comm_error : public std::runtime_error {
 public:
  comm_error(const std::string& what, collective op, int rank)
      : std::runtime_error(what), op_(op), rank_(rank) {}
  [[nodiscard]] collective op() const noexcept { return op_; }
  /// The rank that raised the error (the one whose call failed).
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  collective op_;
  int rank_;
};

/// The modelled link of the host backend: an all-reduce of S bytes over n ranks takes
/// latency + S * 2(n-1)/n / bus_gbps (nccl-tests' bus bandwidth), an all-gather the (n-1)/n share of the
/// S gathered bytes (n * count elements) and a broadcast all of its S bytes; a barrier takes the latency.
/// Presets match the two links of the 2x H200 pair measured on 2026-11-23
/// (docs/perf/2026-11-23/h200x2-comm/).
struct comm_link {
  std::string name = "nvlink";
  double bus_gbps = 330.0;  // GB/s (1e9 bytes), the bus bandwidth of a large all-reduce
  std::chrono::nanoseconds latency{20'000};
  bool model = true;  // false: collectives run at memcpy speed (tests of bytes, not time)

  /// NVLink between two H200s (about 330 GB/s bus bandwidth).
  [[nodiscard]] static comm_link nvlink();
  /// Through host memory, as with NCCL_P2P_DISABLE=1 (about 27 GB/s).
  [[nodiscard]] static comm_link host_memory();

  /// The modelled length of collective `c` over `ranks` ranks moving `bytes` (S above: an all-reduce's or
  /// broadcast's count * element size, an all-gather's ranks * count * element size). Whether or not
  /// `model` is set: it is what the link would take.
  [[nodiscard]] std::chrono::nanoseconds modelled_time(collective c, std::size_t bytes, int ranks) const;
};

/// Options of a communicator group.
struct comm_options {
  /// A collective not complete after this long aborts the group (comm_error on every rank).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  comm_link link{};  // host backend only
};

/// One rank of a group. Thread-safe per rank: a rank's collectives may be issued from one thread at a time
/// (ranks of one process are usually driven each by its own thread). Views passed to a collective must
/// be device memory of this rank's device and stay alive until the returned event completes.
///
/// Every collective checks its arguments before any work starts, the same on every backend: a stream of
/// another device, a view that is not device memory or holds fewer than the elements the call needs, a
/// count of 0, a root out of range, or a send and recv that overlap without being the in-place layout
/// throw logic_error naming the value; a call on an aborted group throws comm_error. Destroying any
/// rank's communicator aborts its group, so operations still pending on the other ranks fail instead of
/// waiting for it.
class communicator {
 public:
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  virtual ~communicator() = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] device& dev() const noexcept { return *dev_; }
  /// "host" or "nccl".
  [[nodiscard]] virtual std::string_view backend_name() const noexcept = 0;

  /// recv = op over every rank's send, `count` elements of `type`. send and recv may be the same memory
  /// (in place). Throws logic_error when a view is smaller than count elements or not device memory.
  event all_reduce(mem_view send, mem_view recv, std::size_t count, dtype type, reduce_op op, stream_view s);
  /// recv holds every rank's `count` elements of send, rank after rank (size() * count elements). In
  /// place when send is this rank's part of recv (recv + rank() * count elements).
  event all_gather(mem_view send, mem_view recv, std::size_t count, dtype type, stream_view s);
  /// recv on every rank = send of `root` (send is read, and checked, on root only; may equal recv).
  event broadcast(mem_view send, mem_view recv, std::size_t count, dtype type, int root, stream_view s);
  /// Completes once every rank has reached it on its stream.
  event barrier(stream_view s);

  /// Aborts the group (every rank's pending and later operations fail with comm_error naming `why`).
  /// Safe from any thread; idempotent.
  virtual void abort(const std::string& why) noexcept = 0;
  /// True once the group was aborted, by a timeout, an error or abort().
  [[nodiscard]] virtual bool aborted() const noexcept = 0;
  /// Why the group was aborted (the first cause: the timeout, the error or abort's `why`); empty while it
  /// was not. Backends that keep no reason return the empty string.
  [[nodiscard]] virtual std::string abort_reason() const { return {}; }

 protected:
  communicator(device& dev, int rank, int size) noexcept : dev_(&dev), rank_(rank), size_(size) {}

  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                             stream_view s) = 0;
  virtual void do_all_gather(const void* send, void* recv, std::size_t count, dtype type, stream_view s) = 0;
  /// `send` is root's send on root and nullptr on every other rank.
  virtual void do_broadcast(const void* send, void* recv, std::size_t count, dtype type, int root,
                            stream_view s) = 0;
  virtual void do_barrier(stream_view s) = 0;

 private:
  // The checks every collective shares (src/comm/communicator.cpp).
  void expect_usable(collective op, stream_view s) const;
  std::size_t expect_elements(collective op, std::size_t count, dtype type, std::size_t multiple) const;
  void expect_buffer(collective op, const mem_view& v, std::string_view role, std::size_t bytes,
                     std::size_t count, dtype type) const;
  event completion(stream_view s);

  device* dev_;
  int rank_;
  int size_;
};

/// A group of in-process host ranks, one per device (each an emulated device, make_host_device). The
/// communicators keep pointers to the devices, which must outlive them. Throws logic_error for no
/// devices, a device that is not on the host backend, or the same device twice.
[[nodiscard]] std::vector<std::unique_ptr<communicator>> make_host_group(std::span<device* const> devices,
                                                                         const comm_options& options = {});

/// This process's rank of a host group whose ranks are the processes of `job`, one emulated device each
/// (`dev`, make_host_device): the collectives run on host memory as in the in-process group, and their
/// bytes travel through the bootstrap (the caller's key-value store, or MPI) at whatever speed it has: no
/// modelled link (options.link is ignored). For tests and examples of multi-process jobs without a GPU
/// (torchrun or mpirun on a laptop or in CI). Collectives run in issue order, one at a time; one that does
/// not complete within options.timeout, or a process that gives up (abort(), a destroyed communicator),
/// fails every process's pending and later collectives with comm_error naming the collective, its number
/// and the process that was missing or gave up. The communicator shares ownership of `job`. Throws
/// logic_error for a device that is not on the host backend.
[[nodiscard]] std::unique_ptr<communicator> make_host_group(std::shared_ptr<bootstrap> job, device& dev,
                                                            const comm_options& options = {});

/// True when NCCL can be loaded (libnccl.so.2); `reason` receives why not.
[[nodiscard]] bool nccl_available(std::string* reason = nullptr);
/// NCCL ranks for several GPUs of this process, one per cuda device, in order (one NCCL group of
/// nonblocking communicators, as ncclCommInitAll makes). Drive each rank from its own thread: a rank's
/// collective can complete only once every rank has issued it. A watchdog thread per group aborts it when a
/// collective runs longer than options.timeout or NCCL reports an asynchronous error. Throws logic_error for
/// a device not on the cuda backend or ordinals that repeat, comm_error when NCCL is missing or fails.
[[nodiscard]] std::vector<std::unique_ptr<communicator>> make_nccl_group(std::span<device* const> devices,
                                                                         const comm_options& options = {});
/// NCCL ranks over the processes of `job` (collective: every process calls it): this process's GPUs
/// (`devices`, in order, none to repeat) take consecutive ranks after every earlier process's, so with one
/// GPU per process rank equals the process's rank. Process 0 makes the group's unique id and the bootstrap
/// passes it on. Before anything waits on another process, every process says whether it is ready (its
/// devices valid, NCCL loaded); if any is not, every process throws comm_error naming each process that
/// failed and why, and the same after connecting, so a process that gives up never leaves the others
/// waiting on it. With a single-process bootstrap it is make_nccl_group(devices, options).
[[nodiscard]] std::vector<std::unique_ptr<communicator>> make_nccl_group(bootstrap& job,
                                                                         std::span<device* const> devices,
                                                                         const comm_options& options = {});

}  // namespace ferry::comm
