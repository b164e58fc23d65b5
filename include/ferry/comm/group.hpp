// Opening a group over the processes of a job: what a training process does once, before its reducer.
//
// A job of one GPU per process (torchrun, mpirun) finds its processes through a bootstrap (bootstrap.hpp:
// MPI, or the key-value store torch.distributed already set up), picks each process's GPU (its local
// rank on its host) and makes the group: NCCL on cuda devices, the host backend's processes on emulated
// devices. Every step that could fail on one process is agreed on by all of them first (agree_ready), so a
// process that gives up never leaves the others waiting for it.
#pragma once

#include <memory>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

/// The GPU this process drives in a job of one GPU per process: its local rank on its host (collective:
/// every process calls it). Every process says whether it has one before any opens a device, so none is
/// left waiting: throws comm_error on every process, naming each process without a GPU for its local
/// rank and why ("process 1 of 2: local rank 1 of 2 on host h, which has 1 GPU: one GPU per process").
[[nodiscard]] int local_gpu(bootstrap& job);

/// This process's rank of a group over the processes of `job` (collective), on `dev`: one device per
/// process, rank = the process's rank in the job. The backend follows the device: NCCL for a cuda device
/// (make_nccl_group over the job), the host backend for an emulated one (make_host_group over the job;
/// with a job of one process, the in-process group of one rank with options.link). The communicator
/// shares ownership of `job`'s bootstrap where it still needs it; `dev` must outlive it. Throws as the
/// group it makes (comm_error on every process when one of them cannot join).
[[nodiscard]] std::unique_ptr<communicator> open_group(std::shared_ptr<bootstrap> job, device& dev,
                                                       const comm_options& options = {});

}  // namespace ferry::comm
