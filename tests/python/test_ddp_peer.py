"""PyTorch's own DDP tests, ported: every case of ddp_peer_worker.py runs under torch's DistributedDataParallel
and under ferry.torch.DataParallel in the same job (2 gloo processes, CPU tensors, ferry's host backend), and
ferry must give what DDP gives, rank by rank: the same parameters, gradients, buffers and outputs (bit for
bit: both average the same float32 gradients, and with 2 ranks x/2 + y/2 and (x + y)/2 round the same), the
same None where DDP leaves a .grad None, the same state_dict keys; and its ranks agree where DDP's do.

Sources: torch/testing/_internal/distributed/distributed_test.py ("dt", pytorch/pytorch at commit
004e615403b6ee99c21093830ebfd454fb7a0199) and test/distributed/test_c10d_gloo.py ("gloo", at commit
005a6a0b9ec22601279bf00a3f32e8696eee3b68); the worker's @case(source=...) says what each case keeps.
  net_manual_steps_as_ddp_niter          dt test_DistributedDataParallelCPU (_test_DDP_niter)
  sgd_momentum_weight_decay              dt _test_ddp_hook_with_optimizer_parity_sgd, test_ddp_join_model_equivalence
  adam                                   dt test_ddp_hook_with_optimizer_parity_adam, test_ddp_apply_optim_in_backward
  uneven_batch_sizes                     dt test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_gradient
  no_sync_accumulation                   dt test_accumulate_gradients_no_sync
  gradient_accumulation                  issue 36's list (no torch test of its own)
  no_sync_then_sync_with_rank_dependent_unused  dt test_grads_same_across_ranks_with_no_sync (torch 1.13's
                                         DDP fails it: ferry is held to the test's assertions)
  two_forwards_then_one_backward         issue 36's list
  tied_weights, shared_parameter_unused  dt test_ddp_shared_grad_acc_unused_params
  frozen_parameters                      dt DDP_NET, test_ddp_build_debug_param_to_name_mapping_requires_grad
  parameter_unused_on_one_rank           gloo test_find_unused_parameters_when_unused_parameters_empty
  globally_unused_parameter_untouched    gloo test_global_local_unused_params_grad
  control_flow_different_across_ranks    dt test_ddp_control_flow_different_across_ranks
  output_unused_in_loss                  dt test_output_unused_in_loss_tuple_module
  unused_parameter_refused               dt test_ddp_unused_params_rebuild_buckets_exception
  batchnorm_buffers_each_step            DDP's note on buffers; dt test_DistributedDataParallel_SyncBatchNorm's net
  batchnorm_broadcast_buffers_false      dt _test_ddp_new_tensor_in_fwd, _test_ddp_buffer_hook_allreduce
  eval_under_no_grad_after_a_step        issue 36 item 1; DDP's require_forward_param_sync
  eval_forward_counts_differ_per_rank    dt test_ddp_inference
  buffers_with_no_sync_accumulation      DDP's require_forward_param_sync; dt _run_uneven_inputs_test's no_sync
  clip_grad_norm                         issue 36's list
  zero_grad_both_ways                    dt _test_ddp_native_mixed_precision, _test_ddp_apply_optim_in_backward
  state_dict_and_checkpoint_reload       gloo test_save_load_checkpoint
  construction_broadcasts_rank0_state    dt test_ddp_sync_module_states
  grads_are_none_before_training         dt _test_DistributedDataParallel_with_amp, gloo
                                         test_global_local_unused_params_grad
  autocast_bf16                          dt _test_DistributedDataParallel_with_amp (bf16 autocast on the CPU)
  summed_loss_grad_is_averaged           dt test_DistributedDataParallel_non_default_stream,
                                         test_ddp_uneven_input_join_disable
  ignored_output                         gloo test_ignored_output, test_ignored_output_with_unused_parameters
  structured_inputs_and_outputs          dt test_ddp_namedtuple, test_ddp_static_graph_nested_types,
                                         test_ddp_returns_tensor_with_no_grad, test_ddp_new_tensor_in_fwd
  module_attribute                       DDP's `module` attribute (used throughout dt)
The cases' names come from the worker (read here without importing it).

The job starts once for the module (one torch import per rank, every case in turn, one JSON report per
rank); a case that raises on a rank is that case's failure, not the job's."""
import ast
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("ddp_peer_worker.py")
WORLD = 2
JOB_TIMEOUT = 240.0  # the whole job (about 15 s); a hung collective fails its case within the worker's 30 s first


def case_names():
    """The worker's cases, in order: its functions decorated with @case(...)."""
    tree = ast.parse(WORKER.read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "case" for d in f.decorator_list)]


CASES = case_names()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Runs the worker on WORLD ranks once; returns [(exit status, report or None, stderr)] by rank."""
    out = tmp_path_factory.mktemp("ddp_peer")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", FERRY_TEST_BACKENDS="host")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(WORLD), str(port), str(out / f"{r}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    deadline = time.monotonic() + JOB_TIMEOUT
    results = []
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, err = p.communicate()
            err += f"\n(rank {r} killed: the job ran past {JOB_TIMEOUT} s)"
        path = out / f"{r}.json"
        results.append((p.returncode, json.loads(path.read_text()) if path.exists() else None, err))
    return results


def records(job, name):
    """The case's record on every rank; fails naming the rank when a rank has none."""
    recs = []
    for r, (code, rep, err) in enumerate(job):
        if rep is None or name not in rep["cases"]:
            pytest.fail(f"rank {r} reported nothing for {name} (exit status {code}):\n{err[-1500:]}")
        recs.append(rep["cases"][name])
    return recs


def show(v, limit=6):
    if isinstance(v, dict) and "values" in v:
        vals = v["values"]
        return f"{v['dtype']}{v['shape']} {vals[:limit]}{' ...' if len(vals) > limit else ''}"
    return repr(v)[:200]


def differences(a, b, tol, path=""):
    """Where observation b differs from a (relative tol on numbers, 0: exact), as readable lines."""
    if isinstance(a, dict) and "values" in a and isinstance(b, dict) and "values" in b:
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"]:
            return [f"{path}: {show(a)} against {show(b)}"]
        worst, at = 0.0, None
        for i, (x, y) in enumerate(zip(a["values"], b["values"])):
            if x == y or (x != x and y != y):  # equal, or NaN on both sides
                continue
            d = abs(x - y) / (1.0 + abs(x))
            if d != d:  # a NaN on one side only
                d = float("inf")
            if d > worst:
                worst, at = d, i
        if worst > tol:
            return [f"{path}: differ by {worst:.3g} (relative) at element {at}: {a['values'][at]!r} against "
                    f"{b['values'][at]!r}"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} against {sorted(b)}"]
        return [line for k in a for line in differences(a[k], b[k], tol, f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, tol, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {show(a)} against {show(b)}"]


def test_this_docstring_names_every_case_of_the_worker():
    named = set(re.findall(r"\w+", __doc__))
    assert [n for n in CASES if n not in named] == []


def test_the_job_ran_every_case_on_every_rank(job):
    for r, (code, rep, err) in enumerate(job):
        assert code == 0, f"rank {r} exited with {code}:\n{err[-3000:]}"
        assert rep is not None and list(rep["cases"]) == CASES, f"rank {r}:\n{err[-3000:]}"
    # Every rank opened as many ferry groups in each case: the next case's group meets on the same keys.
    for name in CASES:
        assert len({rec["ferry"]["opened"] for rec in records(job, name)}) == 1, name


@pytest.mark.parametrize("name", CASES)
def test_ferry_gives_what_ddp_gives(job, name):
    recs = records(job, name)
    expect = recs[0]["expect"]
    for r, rec in enumerate(recs):
        if expect is None:
            assert rec["ddp"]["error"] is None, f"rank {r}: the case's DDP half raised: {rec['ddp']['error']}"
        assert rec["ferry"]["error"] is None, f"rank {r}: ferry raised: {rec['ferry']['error']}"
    for r, rec in enumerate(recs):
        if expect is None:
            lines = differences(rec["ddp"]["obs"], rec["ferry"]["obs"], recs[0]["tol"])
            what = "DDP against ferry"
        else:  # torch 1.13's DDP fails the source test: ferry is held to the test's own assertions
            lines = differences(expect, {k: rec["ferry"]["obs"].get(k) for k in expect}, 0.0)
            what = "the source test's expectation against ferry"
        assert not lines, f"rank {r}, {what} ({recs[0]['source']}):\n" + "\n".join(lines[:12])
    for pattern in recs[0]["agree"]:
        for kind in ("ddp", "ferry") if expect is None else ("ferry",):
            first = {k: v for k, v in recs[0][kind]["obs"].items() if re.search(pattern, k)}
            assert first, f"{kind}: no observation matches {pattern!r}"
            for r, rec in enumerate(recs[1:], 1):
                other = {k: v for k, v in rec[kind]["obs"].items() if re.search(pattern, k)}
                lines = differences(first, other, 0.0)
                assert not lines, f"{kind}: ranks 0 and {r} differ on {pattern!r}:\n" + "\n".join(lines[:12])


def test_ferry_names_the_unused_parameter_where_ddp_points_at_find_unused_parameters(job):
    for rec in records(job, "unused_parameter_refused"):
        assert "find_unused_parameters" in rec["ddp"]["notes"]["error"]
        message = rec["ferry"]["notes"]["error"]
        assert "got no gradient in this backward: net2.weight" in message, message
        assert "find_unused_parameters=True" in message, message
