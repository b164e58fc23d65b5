"""ferry.torch.DataParallel with what torch 2 adds: torch.compile in both of the orders DDP documents, a
whole training step captured in a CUDA graph (torch's recipe for DDP), and compiled autograd refused by
name. Skipped on torches without them (CI's torch 1.13): they run on the GPU machines (docs/perf/)."""
import copy
import os

import pytest

torch = pytest.importorskip("torch")

needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"), reason="needs torch.compile (torch >= 2.0)")
needs_cuda = pytest.mark.skipif("cuda" not in os.environ.get("FERRY_TEST_BACKENDS", "host").split(",")
                                or not torch.cuda.is_available(), reason="needs FERRY_TEST_BACKENDS=cuda and a GPU")


def mlp(width: int = 16, depth: int = 6):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 3))


def train(model, params, steps: int, device="cpu"):
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g).to(device)
        y = torch.randint(0, 3, (8,), generator=g).to(device)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@needs_compile
@pytest.mark.parametrize("order", ["compile_inside", "compile_outside"])
def test_compiled_training_equals_the_models_own_in_both_orders(order):
    """DataParallel(torch.compile(model)) and torch.compile(DataParallel(model)) (aot_eager: AOT autograd
    without code generation) train as the model alone does at world size 1: their C gradient hooks fire
    after the compiled backward, and the buckets are reduced."""
    import ferry.torch

    torch.manual_seed(0)
    alone = mlp()
    inner = copy.deepcopy(alone)
    if order == "compile_inside":
        dp = ferry.torch.DataParallel(torch.compile(inner, backend="aot_eager"), plan="fixed",
                                      bucket_cap_mb=0.001, first_bucket_mb=0.0005)
        model = dp
    else:
        dp = ferry.torch.DataParallel(inner, plan="fixed", bucket_cap_mb=0.001, first_bucket_mb=0.0005)
        model = torch.compile(dp, backend="aot_eager")
    try:
        train(alone, alone.parameters(), 5)
        train(model, dp.parameters(), 5)
        for a, b in zip(alone.parameters(), inner.parameters()):
            assert torch.allclose(a, b, atol=1e-5)
        assert dp.stats()["steps"] == 5 and dp.stats()["buckets"] > 1
    finally:
        dp.close()


@needs_compile
def test_compiled_autograd_is_refused_by_name():
    import ferry.torch
    ca = pytest.importorskip("torch._dynamo.compiled_autograd")
    if not hasattr(ca, "_enable") and not hasattr(ca, "enable"):
        pytest.skip("this torch has no compiled autograd")
    dp = ferry.torch.DataParallel(mlp(), plan="fixed")
    try:
        loss = dp(torch.randn(4, 16)).sum()
        enable = getattr(ca, "_enable", None) or ca.enable
        with pytest.raises(RuntimeError, match=r"compiled autograd is on"):
            with enable(torch.compile(backend="aot_eager")):
                loss.backward()
    finally:
        dp.close()


@needs_cuda
def test_a_whole_step_captured_in_a_cuda_graph_replays_as_eager_training():
    """torch's recipe for DDP (warm up on a side stream, capture forward, backward and the optimizer step,
    replay with new data copied into the static input): DataParallel's buckets are captured with the step,
    and after the replays the parameters equal those of the model trained eagerly (world size 1)."""
    import ferry.torch

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    alone = mlp().to(dev)
    inner = copy.deepcopy(alone)
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(8, 16, generator=g).to(dev), torch.randint(0, 3, (8,), generator=g).to(dev))
               for _ in range(8)]
    warm, replays = batches[:3], batches[3:]

    def run(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    opt_a = torch.optim.SGD(alone.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        run(alone, opt_a, x, y)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dp = ferry.torch.DataParallel(inner, plan="fixed", bucket_cap_mb=0.001, first_bucket_mb=0.0005)
        opt = torch.optim.SGD(dp.parameters(), lr=0.05, momentum=0.9)
        for x, y in warm:
            run(dp, opt, x, y)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        static_x, static_y = torch.zeros_like(warm[0][0]), torch.zeros_like(warm[0][1])
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            torch.nn.functional.cross_entropy(dp(static_x), static_y).backward()
            opt.step()
        for x, y in replays:
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(alone.parameters(), inner.parameters()):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    finally:
        dp.close()
