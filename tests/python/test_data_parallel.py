"""ferry.torch.DataParallel over several processes on CPU tensors (ferry's host backend, the group found
through torch.distributed's TCPStore), as torchrun would start them: the ranks end with identical
parameters equal to one process training on the whole batch; no_sync accumulates; unused parameters are
refused by name unless allowed; a rank that raises or is killed fails the others within the timeout, with
an error naming the rank and the operation, and no process hangs. Each rank is data_parallel_worker.py."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("data_parallel_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(tmp_path, scenario: str, world: int, timeout: float = 90.0, backends: str = "host"):
    """Starts `world` ranks; returns their (exit status, report or None, stderr)."""
    port = free_port()
    env = dict(os.environ, FERRY_TEST_BACKENDS=backends, OMP_NUM_THREADS="1")
    procs = []
    for r in range(world):
        out = tmp_path / f"{scenario}_{r}.json"
        procs.append((subprocess.Popen([sys.executable, str(WORKER), scenario, str(r), str(world), str(port), str(out)],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out))
    results = []
    deadline = time.monotonic() + timeout
    for p, out in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            pytest.fail(f"scenario {scenario}: a rank hung past {timeout} s")
        results.append((p.returncode, json.loads(out.read_text()) if out.exists() else None, err))
    return results


def reference(steps=6, batch=4, world=2):
    """One process training rank 0's initial model on the whole global batch."""
    sys.path.insert(0, str(WORKER.parent))
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps, world * batch, 8, generator=g)
    y = torch.randint(0, 3, (steps, world * batch), generator=g)
    torch.manual_seed(10)
    m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                            torch.nn.Linear(32, 3))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for s in range(steps):
        opt.zero_grad()
        loss_fn(m(x[s]), y[s]).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in m.parameters()]


def assert_close(a, b, tol=2e-5):
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert len(pa) == len(pb)
        worst = max(abs(u - v) / (1.0 + abs(v)) for u, v in zip(pa, pb))
        assert worst <= tol, f"parameters differ by {worst} (relative), more than {tol}"


@pytest.mark.parametrize("scenario,world", [("fixed", 2), ("fixed", 4), ("one_bucket", 2), ("auto", 3),
                                            ("no_sync", 2), ("zero_after_forward", 2),
                                                ("grad_then_zero", 2)])
def test_ranks_end_identical_and_equal_to_one_process_on_the_whole_batch(tmp_path, scenario, world):
    results = run_job(tmp_path, scenario, world)
    for code, rep, err in results:
        assert code == 0, err
        assert rep is not None and rep["error"] is None, (rep, err)
    first = results[0][1]
    # Rank 0's initial parameters reached every rank (they were made with different seeds).
    for _, rep, _ in results[1:]:
        assert rep["initial"] == first["initial"]
        # Every rank reduced the same gathered gradients in the same order: the same bits.
        assert rep["params"] == first["params"]
    assert_close(first["params"], reference(world=world))
    stats = first["stats"]
    assert stats["steps"] == 6 and stats["world_size"] == world and stats["backend"] == "host"
    if scenario == "auto":
        assert stats["decided"] is not None and not stats["learning"]
    elif scenario == "one_bucket":
        assert stats["buckets"] == 1
    else:
        assert stats["buckets"] > 1  # the small caps cut the model into several buckets


def test_unused_parameters_are_refused_by_name_and_allowed_when_asked(tmp_path):
    for code, rep, err in run_job(tmp_path, "unused", 2, timeout=60):
        assert code == 0, err
        assert "got no gradient in this backward: head_b.weight, head_b.bias" in rep["error"]
        assert "find_unused_parameters=True" in rep["error"]
    results = run_job(tmp_path, "unused_allowed", 2, timeout=60)
    for code, rep, err in results:
        assert code == 0, err
        assert rep["error"] is None, rep
    assert results[0][1]["params"] == results[1][1]["params"]


@pytest.mark.parametrize("scenario", ["raise", "killed"])
def test_a_rank_that_fails_fails_the_others_within_the_timeout_naming_it(tmp_path, scenario):
    results = run_job(tmp_path, scenario, 2, timeout=90)  # run_job fails the test if a rank hangs
    code1, _, err1 = results[1]
    assert code1 != 0
    code0, rep0, err0 = results[0]
    assert code0 == 0, err0
    assert rep0 is not None and rep0["error"], err0
    assert "all_reduce" in rep0["error"] or "broadcast" in rep0["error"], rep0["error"]
    if scenario == "raise":
        # The failing rank closed its group on the way out: the other learns at once, and why.
        assert "aborted by process 1 of 2" in rep0["error"], rep0["error"]
    else:
        assert "process 1 did not write its part within 5000 ms" in rep0["error"], rep0["error"]


@pytest.mark.parametrize("codec,tol", [("none", 2e-5), ("bf16", 2e-2)])
def test_ddp_with_ferrys_comm_hook_trains_as_one_process_within_the_codecs_error(tmp_path, codec, tol):
    results = run_job(tmp_path, f"hook_{codec}", 2)
    for code, rep, err in results:
        assert code == 0, err
        assert rep is not None and rep["error"] is None, (rep, err)
    assert results[0][1]["params"] == results[1][1]["params"]
    # bf16 keeps 8 bits of mantissa: each gradient's mean is within about 2^-8 of its magnitude (codec.hpp's
    # bound), and six SGD steps of lr 0.1 move the parameters by a few tenths at most.
    assert_close(results[0][1]["params"], reference(world=2), tol=tol)


def test_mixed_precision_under_autocast_just_works(tmp_path):
    results = run_job(tmp_path, "autocast", 2)
    for code, rep, err in results:
        assert code == 0, err
        assert rep is not None and rep["error"] is None, (rep, err)
    first = results[0][1]
    assert results[1][1]["params"] == first["params"]
    # bf16 compute: close to the float32 run of one process, as autocast is anywhere.
    assert_close(first["params"], reference(world=2), tol=5e-2)
    assert first["params"] != first["initial"]


@pytest.mark.parametrize("scenario", ["bf16", "bf16_f32"])
def test_bf16_parameters_train_with_bf16_gradients_averaged_in_bf16_or_in_f32(tmp_path, scenario):
    results = run_job(tmp_path, scenario, 2)
    for code, rep, err in results:
        assert code == 0, err
        assert rep is not None and rep["error"] is None, (rep, err)
    first = results[0][1]
    assert results[1][1]["params"] == first["params"]
    assert first["stats"]["grad_dtype"] == "bf16"
    # The host group sums in f32 and rounds once either way: the wire tells the modes apart (widened to f32,
    # twice the gradients' bytes travel).
    stats = first["stats"]
    assert stats["wire_bytes"] == (2 if scenario == "bf16_f32" else 1) * stats["gradient_bytes"] > 0
    # bf16 parameters, activations and gradients: every value carries bf16's 2^-8 (0.004) relative rounding;
    # the run follows the float32 one of one process on the whole batch within 2.5 of those (0.0033 seen),
    # while the initial parameters are 0.07 away from its end.
    assert_close(first["params"], reference(world=2), tol=1e-2)
    assert first["params"] != first["initial"]


def test_parameters_of_mixed_or_unsupported_dtypes_and_lossy_bf16_are_refused_by_name():
    import ferry.torch
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    m[1].to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"parameter 1.weight is torch.bfloat16 and 0.weight torch.float32"):
        ferry.torch.DataParallel(m)
    with pytest.raises(ValueError, match=r"lossy=True with torch.bfloat16 parameters"):
        ferry.torch.DataParallel(m.to(torch.bfloat16), lossy=True)
    with pytest.raises(ValueError, match=r"reduce_dtype=torch.float16 for torch.bfloat16 parameters"):
        ferry.torch.DataParallel(m, reduce_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"parameter 0.weight is torch.float64"):
        ferry.torch.DataParallel(m.to(torch.float64))


@pytest.mark.skipif("cuda" not in os.environ.get("FERRY_TEST_BACKENDS", "host").split(",")
                    or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs FERRY_TEST_BACKENDS=cuda and two GPUs")
def test_on_two_gpus_beside_torchs_own_nccl_group_every_step_all_reduces_in_both(tmp_path):
    """ferry's NCCL communicator and torch's ProcessGroupNCCL on the same two GPUs: torch's all-reduce of
    the loss after every backward, ferry's buckets during it; no deadlock, and the same parameters as one
    process on the whole batch (float32 on GPUs against the CPU: a looser tolerance)."""
    results = run_job(tmp_path, "nccl", 2, timeout=240, backends="cuda")
    for code, rep, err in results:
        assert code == 0, err
        assert rep is not None and rep["error"] is None, (rep, err)
    first = results[0][1]
    assert first["stats"]["backend"] == "nccl" and first["stats"]["world_size"] == 2
    assert results[1][1]["params"] == first["params"]
    assert_close(first["params"], reference(world=2), tol=1e-4)


def test_the_store_adapter_survives_waits_that_time_out():
    """ferry's group waits for store keys in 100 ms slices. A timed-out TCPStore.wait (the only wait torch
    < 2.0 has) leaves the server's late answer on the connection, and the next wait returned at once for a
    key that was not there: the adapter must report a missing key as missing after a timed-out wait, and
    still read, overwrite and erase keys."""
    import ctypes
    import datetime
    from ferry._native.comm import StoreCallbacks as _TorchStore

    port = free_port()
    timeout = datetime.timedelta(seconds=5)
    server = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timeout, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout)
    writer, reader = _TorchStore(server), _TorchStore(client)
    out = ctypes.create_string_buffer(2)

    def get(key: bytes, wait_ms: int = 20) -> int:
        return reader._get(None, key, ctypes.addressof(out), 2, wait_ms)

    def put(key: bytes, value: bytes) -> None:
        src = ctypes.create_string_buffer(value, len(value))
        assert writer._set(None, key, ctypes.addressof(src), len(value)) == 0, writer.error

    assert get(b"ferry/t/a") == 1  # not there: the wait times out
    put(b"ferry/t/a", b"xy")
    time.sleep(0.2)  # a late answer to the timed-out wait, if any, is on the connection now
    assert get(b"ferry/t/b") == 1, reader.error  # still not there
    assert get(b"ferry/t/a", 1000) == 0, reader.error
    assert out.raw == b"xy"
    put(b"ferry/t/a", b"zw")
    assert get(b"ferry/t/a", 1000) == 0 and out.raw == b"zw", reader.error
    assert writer._erase(None, b"ferry/t/a") == 0
    assert get(b"ferry/t/a") == 1
    assert reader.error is None


def test_ddps_constructor_arguments_are_taken_where_they_mean_what_ferry_does_and_refused_by_name_otherwise():
    """A DDP line swapped for DataParallel keeps its arguments: those that mean what ferry does anyway are
    accepted, the others refused with what to do (python/README.md's table of DDP's behaviours)."""
    import warnings
    import ferry.torch
    m = torch.nn.Linear(4, 2)
    dp = ferry.torch.DataParallel(m, dim=0, process_group=None, check_reduction=False, static_graph=True,
                                  gradient_as_bucket_view=True, init_sync=True)
    try:
        assert dp.world_size == 1 and list(dp.state_dict()) == ["module.weight", "module.bias"]
        with pytest.raises(RuntimeError, match=r"has no join\(\): give every rank the same number of batches"):
            dp.join()
        with dp.join(enable=False):  # `with model.join(enable=args.uneven):` runs when it is off
            dp(torch.ones(2, 4)).sum().backward()
        with pytest.raises(RuntimeError, match=r"takes no comm hook: lossy=True"):
            dp.register_comm_hook(None, lambda state, bucket: None)
    finally:
        dp.close()
    for kwargs, message in [({"dim": 1}, r"DataParallel\(dim=1\): not supported"),
                            ({"process_group": object()}, r"process_group=<object.*pass store=, rank= and world_size="),
                            ({"mixed_precision": object()}, r"mixed_precision=.*use autocast"),
                            ({"delay_all_reduce_named_params": [("w", m.weight)]}, r"delay_all_reduce_named_params"),
                            ({"device_ids": [0]}, r"parameters are on cpu; as DDP, device_ids and output_device "
                                                  r"are for a module on one GPU")]:
        with pytest.raises(ValueError, match=message):
            ferry.torch.DataParallel(m, **kwargs)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bucket_cap'"):
        ferry.torch.DataParallel(m, bucket_cap=25)
    with pytest.raises(ValueError, match=r"0 is a SyncBatchNorm, whose backward runs torch's collectives"):
        ferry.torch.DataParallel(torch.nn.Sequential(torch.nn.SyncBatchNorm(4), torch.nn.Linear(4, 2)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ferry.torch.DataParallel(m, gradient_as_bucket_view=False).close()
    assert any("always views of its buckets" in str(w.message) for w in seen)


def test_static_graph_meets_a_parameter_that_never_gets_a_gradient_as_ddp_does():
    """DDP with static_graph=True trains a model with a layer its forward never calls; so does
    DataParallel (as find_unused_parameters=True: the layer's .grad stays None)."""
    import ferry.torch

    class Partly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.idle = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x)

    dp = ferry.torch.DataParallel(Partly(), static_graph=True, plan="fixed")
    try:
        for _ in range(2):
            dp.zero_grad(set_to_none=True)
            dp(torch.ones(3, 4)).sum().backward()
            assert dp.module.idle.weight.grad is None and dp.module.used.weight.grad is not None
    finally:
        dp.close()


@pytest.mark.skipif("cuda" not in os.environ.get("FERRY_TEST_BACKENDS", "host").split(",")
                    or not torch.cuda.is_available(), reason="needs FERRY_TEST_BACKENDS=cuda and a GPU")
def test_on_one_gpu_a_ddp_line_trains_as_the_model_alone():
    """DDP's usual line on one GPU (world size 1, ferry's NCCL group of one): device_ids=[0] moves CPU
    inputs to the GPU as DDP does, a layer no rank uses keeps .grad None under find_unused_parameters (its
    used-map all-reduced on the GPU and read back), an eval forward under no_grad runs, and the parameters
    equal those of the model trained alone (the average over one rank is the gradient itself)."""
    import copy
    import ferry.torch

    class Partly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
            self.idle = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    alone = Partly().cuda()
    wrapped = ferry.torch.DataParallel(copy.deepcopy(alone), device_ids=[0], find_unused_parameters=True,
                                       plan="fixed")
    try:
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
                for m in (alone, wrapped)]
        g = torch.Generator().manual_seed(3)
        for step in range(4):
            x = torch.randn(6, 8, generator=g)
            for m, opt in zip((alone, wrapped), opts):
                m.train()
                opt.zero_grad(set_to_none=True)
                m(x.cuda() if m is alone else x).square().sum().backward()  # CPU input: device_ids moves it
                opt.step()
                m.eval()
                with torch.no_grad():
                    m(torch.ones(2, 8, device="cuda"))
            assert wrapped.module.idle.weight.grad is None
        for a, b in zip(alone.state_dict().values(), wrapped.module.state_dict().values()):
            assert torch.equal(a, b)
    finally:
        wrapped.close()


class Blocks(torch.nn.Module):
    """`blocks` residual blocks of two small linear layers (four parameters each) and a head: a model of
    many parameter tensors, as a transformer is."""

    def __init__(self, blocks: int, width: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
            for _ in range(blocks))
        self.head = torch.nn.Linear(width, 2)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def ferry_python_calls(fn) -> int:
    """How many times Python code of the ferry package is entered while fn() runs (the function calls a
    profiler sees: methods, comprehensions, generators)."""
    import ferry
    root = str(Path(ferry.__file__).resolve().parent)
    calls = 0

    def profile(frame, event, _arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("plan", ["fixed", "auto"])
def test_a_backward_runs_ferrys_python_a_fixed_number_of_times_whatever_the_number_of_parameters(plan):
    """The gradient hooks are the library's C functions: ferry's Python runs when the backward reaches the
    forward's output and when it ends, the same number of calls for 42 parameters as for 402 (before, one
    Python hook per parameter), and the gradients are the model's own (world size 1)."""
    import copy
    import ferry.torch

    counts = {}
    for blocks in (10, 100):
        torch.manual_seed(0)
        alone = Blocks(blocks)
        dp = ferry.torch.DataParallel(copy.deepcopy(alone), plan=plan, learn_steps=1, first_bucket_mb=0.0005,
                                      bucket_cap_mb=0.001)
        try:
            assert len(list(dp.parameters())) == 4 * blocks + 2
            per_step = []
            for step in range(6):  # auto: one bucket, learning, then the decided plan
                x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
                for m in (alone, dp):
                    m.zero_grad(set_to_none=step % 2 == 0)
                ref = alone(x).square().sum()
                ref.backward()
                loss = dp(x).square().sum()
                per_step.append(ferry_python_calls(loss.backward))
                for (name, a), b in zip(alone.named_parameters(), dp.module.parameters()):
                    assert torch.allclose(a.grad, b.grad, atol=1e-6), (blocks, step, name)
            assert plan == "auto" or dp.stats()["buckets"] > 1
        finally:
            dp.close()
        counts[blocks] = per_step
    assert counts[10] == counts[100], counts
    assert max(counts[100]) <= 60, counts  # about 35: the two entries and what they call


def test_gradients_dropped_after_the_forward_are_seated_and_reduced():
    """zero_grad(set_to_none=True) between forward and backward (pytorch/examples' imagenet loop): the
    gradients are seated in their views when the backward starts, and they are the model's own."""
    import copy
    import ferry.torch

    torch.manual_seed(0)
    alone = Blocks(3)
    dp = ferry.torch.DataParallel(copy.deepcopy(alone), plan="fixed", bucket_cap_mb=0.0005)
    try:
        for step in range(3):
            x = torch.randn(5, 4)
            outs = [m(x).sum() for m in (alone, dp)]
            for m in (alone, dp):
                m.zero_grad(set_to_none=True)
            for o in outs:
                o.backward()
            for a, b in zip(alone.parameters(), dp.module.parameters()):
                assert torch.allclose(a.grad, b.grad, atol=1e-6)
    finally:
        dp.close()


def test_misuses_the_c_hooks_cannot_raise_in_are_raised_at_the_end_of_backward_by_name():
    """A hook cannot raise: what it meets is raised when the backward ends (or at the next forward), naming
    the parameter: a parameter used only outside forward (its gradient complete before the backward reached
    the outputs), a second gradient in one step (two backward passes of one forward), and create_graph=True
    (autograd would replace the bucket views). torch.autograd.grad through the outputs accumulates nothing:
    the step waits for its backward."""
    import ferry.torch

    class Outside(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.scale = torch.nn.Linear(4, 2), torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return self.lin(x)

    dp = ferry.torch.DataParallel(Outside(), plan="fixed")
    try:
        with pytest.raises(RuntimeError, match=r"parameter scale's gradient was complete before the backward"):
            (dp(torch.ones(3, 4)).sum() + dp.module.scale * 2).backward()
    finally:
        dp.close()

    dp = ferry.torch.DataParallel(torch.nn.Linear(4, 2), plan="fixed")
    try:
        x = torch.ones(3, 4, requires_grad=True)
        out = dp(x).sum()
        (gx,) = torch.autograd.grad(out, x, retain_graph=True)  # no parameter's gradient: not the step's
        assert torch.allclose(gx, dp.module.weight.sum(0).expand(3, 4))
        out.backward(retain_graph=True)
        assert torch.allclose(dp.module.bias.grad, torch.full((2,), 3.0))
        out.backward()  # a second backward after the step's: noted as a gradient made outside a step
        assert torch.allclose(dp.module.bias.grad, torch.full((2,), 6.0))
        with pytest.raises(RuntimeError, match=r"create_graph=True"):
            dp(x).sum().backward(create_graph=True)
    finally:
        dp.close()

    class Reentrant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            from torch.utils.checkpoint import checkpoint
            return checkpoint(self.lin, x, use_reentrant=True) + self.lin(x)

    dp = ferry.torch.DataParallel(Reentrant(), plan="fixed")
    try:
        with pytest.raises(RuntimeError, match=r"parameter lin\.(weight|bias) got a second gradient in one "
                                               r"backward.*use_reentrant=False"):
            dp(torch.ones(3, 4, requires_grad=True)).sum().backward()
    finally:
        dp.close()


def test_a_backward_that_fails_before_its_first_gradient_leaves_the_step_to_the_next():
    """An error in the loss's backward before any parameter's gradient (caught, the batch skipped): no
    bucket went out, so the next backward arms the step again, seats the gradients the optimizer dropped,
    and reduces them (world size 1: they are the model's own)."""
    import copy
    import ferry.torch

    torch.manual_seed(0)
    alone = Blocks(2)
    dp = ferry.torch.DataParallel(copy.deepcopy(alone), plan="fixed", bucket_cap_mb=0.0005)
    try:
        loss = dp(torch.randn(4, 4)).sum()

        def fail(_grad):
            raise ValueError("the loss's backward fails")

        loss.register_hook(fail)
        with pytest.raises(ValueError, match="the loss's backward fails"):
            loss.backward()
        x = torch.randn(4, 4)
        for m in (alone, dp):
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()
        for a, b in zip(alone.parameters(), dp.module.parameters()):
            assert torch.allclose(a.grad, b.grad, atol=1e-6)
        assert dp.stats()["steps"] == 1
    finally:
        dp.close()


def test_an_output_object_is_searched_for_its_tensors_and_an_output_without_one_is_refused():
    """A forward that returns a torch.distributions object is hooked through its attributes (its loc and
    scale): the step is reduced. One that returns no tensor computed with grad is refused by name, at the
    forward, where a backward could not start the reduction."""
    import copy
    import ferry.torch

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mean, self.log_std = torch.nn.Linear(4, 2), torch.nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return torch.distributions.Normal(self.mean(x), self.log_std.exp())

    torch.manual_seed(0)
    alone = Policy()
    dp = ferry.torch.DataParallel(copy.deepcopy(alone), plan="fixed")
    try:
        x, a = torch.randn(5, 4), torch.randn(5, 2)
        for m in (alone, dp):
            m(x).log_prob(a).sum().backward()
        for q, r in zip(alone.parameters(), dp.module.parameters()):
            assert torch.allclose(q.grad, r.grad, atol=1e-6)
        assert dp.stats()["steps"] == 1
    finally:
        dp.close()

    class Nothing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            self.last = self.lin(x)

    dp = ferry.torch.DataParallel(Nothing(), plan="fixed")
    try:
        with pytest.raises(RuntimeError, match=r"the forward returned NoneType with no tensor computed with grad"):
            dp(torch.ones(2, 4))
        with torch.no_grad():
            dp(torch.ones(2, 4))  # no backward follows: nothing to hook
    finally:
        dp.close()
