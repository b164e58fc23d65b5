// How the processes of one job find one another before they make a group: each process's rank among the
// job's processes, their number, and two small collectives over the host (broadcast and all-gather of
// bytes). ferry::comm uses them to agree on a group's NCCL unique id, on the ranks each process's GPUs
// take, and on whether every process is ready; gradients never pass through a bootstrap.
//
// Two bootstraps: a single process (the job is this process), and MPI (a job started by mpirun: Open MPI,
// loaded at run time, on MPI_COMM_WORLD), so the same program runs on one GPU, on several GPUs of one
// process, or over processes and nodes. There is no home-made transport or rendezvous server.
#pragma once

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
};

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
