// How the processes of one job find one another before they make a group: each process's rank among the
// job's processes, their number, and two small collectives over the host (broadcast and all-gather of
// bytes). ferry::comm uses them to agree on a group's NCCL unique id, on the ranks each process's GPUs
// take, and on whether every process is ready; gradients never pass through a bootstrap.
//
// Three bootstraps: a single process (the job is this process); MPI (a job started by mpirun: Open MPI,
// loaded at run time, on MPI_COMM_WORLD); and a key-value store the job already has (the rendezvous store
// of torch.distributed under torchrun: TCPStore, FileStore), reached through set/get calls the caller
// gives (key_value_store), so a PyTorch job hands ferry its ranks without MPI. The same program runs on
// one GPU, on several GPUs of one process, or over processes and nodes. There is no home-made transport or
// rendezvous server: a store bootstrap only writes and reads keys of the caller's store.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::comm {

/// The processes of one job. Every process must call the collectives in the same order with the same
/// lengths (MPI's rule); calls come from one thread at a time. A failing call throws comm_error naming the
/// call, the process and the transport's own words.
class bootstrap {
 public:
  bootstrap() = default;
  bootstrap(const bootstrap&) = delete;
  bootstrap& operator=(const bootstrap&) = delete;
  virtual ~bootstrap() = default;

  /// This process's rank among the job's processes, 0 .. size() - 1.
  [[nodiscard]] virtual int rank() const noexcept = 0;
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// "single" or "mpi".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// What carries the bytes, for messages: "this process", "Open MPI v4.1.4".
  [[nodiscard]] virtual std::string transport() const = 0;

  /// `bytes` of process `root` to every process (the same length on every process). Throws logic_error
  /// for a root out of range.
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  /// Every process's `mine`, process after process (the same length on every process): size() * mine.size()
  /// bytes.
  [[nodiscard]] virtual std::vector<std::byte> all_gather(std::span<const std::byte> mine) = 0;

  /// Tells the other processes that this one gives up (`why`), so their pending and later collectives
  /// fail at once rather than at their timeout. The store bootstrap posts it under a key every process
  /// watches; the others do nothing (a single process has no one to tell; an MPI job ends as a whole).
  /// Safe from any thread; never throws.
  virtual void abort(const std::string& /*why*/) noexcept {}
};

/// A key-value store the processes of a job share (torch.distributed's Store is one): what a store
/// bootstrap needs of it. Every call may come from any thread, one at a time per bootstrap; a call that
/// fails throws (the bootstrap reports the store's words).
class key_value_store {
 public:
  key_value_store() = default;
  key_value_store(const key_value_store&) = delete;
  key_value_store& operator=(const key_value_store&) = delete;
  virtual ~key_value_store() = default;

  /// Stores `value` under `key` (a later set of the same key replaces it).
  virtual void set(const std::string& key, std::span<const std::byte> value) = 0;
  /// Fills `out` with the value of `key` and returns true once it is there, waiting at most `wait`;
  /// false when it is not there by then. Throws when the value's length is not out.size() (name both).
  virtual bool get(const std::string& key, std::span<std::byte> out, std::chrono::milliseconds wait) = 0;
  /// Removes `key` if the store can (keys are small; a store that cannot keeps them).
  virtual void erase(const std::string& /*key*/) {}
};

/// A store in this process's memory, for ranks that are threads of one process (tests, examples).
[[nodiscard]] std::shared_ptr<key_value_store> make_memory_store();

/// The job whose processes share `store`: this process is `rank` of `size` (as the launcher numbered
/// them: torchrun's RANK and WORLD_SIZE). Its keys start with `prefix` ("ferry/0"): two bootstraps on one
/// store need different prefixes, the same on every process. A collective sets this process's part under
/// a key numbered by the collective's order and reads the others', each within `timeout` (counted from the
/// start of the collective), checking between waits whether a process posted an abort (bootstrap::abort);
/// a process that never writes its part fails the others with comm_error naming it, the collective and
/// the key. Each process erases its own keys two collectives later (every process has read them by then).
/// Throws logic_error for a rank outside [0, size), a size < 1, an empty prefix or a timeout that is not
/// positive.
[[nodiscard]] std::unique_ptr<bootstrap> make_store_bootstrap(std::shared_ptr<key_value_store> store,
                                                              int rank, int size, std::string prefix,
                                                              std::chrono::milliseconds timeout);

/// The job of this process alone: rank 0 of 1; the collectives copy.
[[nodiscard]] std::unique_ptr<bootstrap> make_single_process_bootstrap();

/// True when Open MPI can be loaded (libmpi.so.40, or FERRY_MPI_LIBRARY); `reason` receives why not.
[[nodiscard]] bool mpi_available(std::string* reason = nullptr);
/// True when this process was started by mpirun (Open MPI's or PMIx's rank variables are set), so
/// make_mpi_bootstrap() will find the other processes rather than make a job of one.
[[nodiscard]] bool launched_by_mpi();
/// MPI_COMM_WORLD of Open MPI, loaded at run time. Initializes MPI (MPI_THREAD_SERIALIZED) unless the
/// program already did, and then finalizes it when the process exits (MPI cannot start twice, so
/// bootstraps may be made and dropped freely); errors return to ferry (MPI_ERRORS_RETURN on
/// MPI_COMM_WORLD) rather than end the job. Outside mpirun MPI makes a job of
/// this one process. Throws comm_error when MPI is missing, was already finalized or fails to start.
[[nodiscard]] std::unique_ptr<bootstrap> make_mpi_bootstrap();
/// The bootstrap `name` names: "single", "mpi", or "auto" (mpi when launched_by_mpi(), else single).
/// Throws logic_error for another name, naming it and the choices.
[[nodiscard]] std::unique_ptr<bootstrap> make_bootstrap(std::string_view name);

/// Every process's text (any length each), process after process: two all-gathers, of the lengths and of
/// the padded texts.
[[nodiscard]] std::vector<std::string> all_gather_text(bootstrap& job, std::string_view mine);

/// This process among those of its host, by host name: local_rank processes of the job on the same host
/// come before it, local_size in all. The GPU a process drives by default is its local_rank.
struct host_place {
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};
/// Collective: every process calls it.
[[nodiscard]] host_place place_on_host(bootstrap& job);

/// Collective: every process says whether it is ready (`problem` empty) or why not; throws comm_error on
/// every process when any is not, naming each reason once with the processes that gave it ("process 1 of
/// 3: NCCL not available: ...", "processes 0, 2 of 3: no GPU"), so no process goes on to wait for one that
/// gave up. `what` names the step
/// ("making an NCCL group").
void agree_ready(bootstrap& job, std::string_view what, const std::string& problem);

}  // namespace ferry::comm
