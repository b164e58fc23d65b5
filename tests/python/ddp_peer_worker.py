"""One rank of test_ddp_peer.py's job: `python ddp_peer_worker.py RANK WORLD PORT OUT`. It runs every case
below in turn, each twice from the same seed and the same data: once with torch's DistributedDataParallel
("ddp") and once with ferry.torch.DataParallel ("ferry"), on CPU tensors over gloo (ferry: its host
backend, found through torch.distributed's store). A case records what a training script can see
(parameters, gradients, buffers, outputs, whether .grad is None, state_dict keys) as named observations;
the rank writes them all, with each half's error if it raised, to the JSON report OUT after every case.

The cases are ported from PyTorch's own DDP tests: torch/testing/_internal/distributed/distributed_test.py
(pytorch/pytorch at commit 004e615403b6ee99c21093830ebfd454fb7a0199) and test/distributed/test_c10d_gloo.py
(at commit 005a6a0b9ec22601279bf00a3f32e8696eee3b68); each case names the test(s) it comes from in
@case(source=...). Only what a training script relies on is kept: the numbers and None-ness DDP gives,
not DDP's internals (its logging data, bucket rebuilds, used-maps). A few cases have no test of their
own in torch's suite (they come from issue 36's list) and say so.

The halves of a case are apart by a barrier on the store (no gloo collective: a half that failed part
way cannot desynchronize the next one's), and every ferry DataParallel a half opens is closed at its end."""
import contextlib
import datetime
import json
import os
import sys
import time
from collections import namedtuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ferry.torch

TIMEOUT = 30.0  # seconds: ferry's collectives and gloo's; a half that hangs fails within it
BARRIER_TIMEOUT = 120.0

CASES = {}


def case(source, tol=0.0, agree=(), expect=None):
    """Registers a case. source: the torch test(s) it is ported from. tol: the relative difference allowed
    between ferry's and DDP's numbers (0: bit-identical). agree: patterns (re.search) of the observations on
    which the ranks must agree: DDP's (so the case tests what it claims) and ferry's. expect: for a case
    where torch 1.13's DDP itself fails the source test, the observations the source test asserts; ferry is
    then held to those (and to agree), not to DDP's numbers."""
    def register(fn):
        CASES[fn.__name__] = {"fn": fn, "source": source, "tol": tol, "agree": list(agree), "expect": expect}
        return fn
    return register


class Half:
    """One half of a case: the program under torch's DDP (kind "ddp") or ferry's DataParallel ("ferry")."""

    def __init__(self, kind, rank, world):
        self.kind, self.rank, self.world = kind, rank, world
        self.obs, self.notes = {}, {}
        self.opened = 0
        self._ferry = []

    def wrap(self, module, **kwargs):
        if self.kind == "ddp":
            return nn.parallel.DistributedDataParallel(module, **kwargs)
        self.opened += 1
        m = ferry.torch.DataParallel(module, timeout=TIMEOUT, **kwargs)
        self._ferry.append(m)
        return m

    def put(self, key, value):
        """An observation: compared between DDP and ferry, rank by rank."""
        self.obs[key] = encode(value)

    def note(self, key, value):
        """Kept in the report, not compared (error messages, which differ by design)."""
        self.notes[key] = value

    def close(self):
        for m in self._ferry:
            m.close()


def encode(v):
    if isinstance(v, torch.Tensor):
        t = v.detach()
        return {"dtype": str(t.dtype), "shape": list(t.shape), "values": t.double().reshape(-1).tolist()}
    if isinstance(v, dict):
        return {str(k): encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    return v


def params(m):
    return {n: p for n, p in m.named_parameters()}


def grads(m):
    return {n: p.grad for n, p in m.named_parameters()}


def buffers(m):
    return {n: b for n, b in m.named_buffers()}


def my_slice(t, rank, per_rank):
    return t[rank * per_rank:(rank + 1) * per_rank]


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def bn_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


# ---- distributed_test.py's models ---------------------------------------------------------------------
class _FC2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    """distributed_test.py's DDP_NET: a frozen bias and a long parameter that does not require grad."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = _FC2()
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False)

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return F.softmax(self.fc3(x), dim=1)


class Task(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        return self.p + x


def train_steps(h, model, opt, xs, ys, loss_fn, tag="step"):
    for s, (x, y) in enumerate(zip(xs, ys)):
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        h.put(f"{tag}{s}.grads", grads(model.module))
        opt.step()
        h.put(f"{tag}{s}.params", params(model.module))
        h.put(f"{tag}{s}.loss", loss)


# ---- the cases ----------------------------------------------------------------------------------------
@case("distributed_test.py test_DistributedDataParallelCPU (_test_DistributedDataParallelCPU, _test_DDP_niter "
      "with zero_grad=True): DDP_NET, MSE on each rank's slice, param += grad, grad.zero_()",
      agree=[r"\.(grads|params)$"])
def net_manual_steps_as_ddp_niter(h):
    m = h.wrap(Net())
    local_bs = 2
    global_bs = h.world * local_bs
    inp, target = torch.randn(global_bs, 2), torch.randn(global_bs, 4)
    for it in range(5):
        off = h.rank * local_bs
        F.mse_loss(m(inp[off:off + local_bs]), target[off:off + local_bs]).backward()
        h.put(f"it{it}.grads", grads(m.module))
        for p in m.module.parameters():
            if p.grad is not None:
                with torch.no_grad():
                    p += p.grad
                p.grad.requires_grad_(False)
                p.grad.zero_()
        h.put(f"it{it}.params", params(m.module))
        inp = inp[torch.randperm(global_bs)]


@case("distributed_test.py _test_ddp_hook_with_optimizer_parity_sgd's optimizer (SGD lr 1e-2, momentum 0.9, "
      "weight_decay 0.01) with optimizer.zero_grad(), as test_ddp_join_model_equivalence's loop",
      agree=[r"\.(grads|params)$", "^momentum$"])
def sgd_momentum_weight_decay(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.01)
    x, y = torch.randn(5, 2 * h.world, 8), torch.randint(0, 3, (5, 2 * h.world))
    train_steps(h, m, opt, [my_slice(a, h.rank, 2) for a in x], [my_slice(a, h.rank, 2) for a in y],
                nn.CrossEntropyLoss())
    h.put("momentum", [opt.state[p]["momentum_buffer"] for p in m.parameters()])


@case("distributed_test.py test_ddp_hook_with_optimizer_parity_adam's optimizer (Adam lr 1e-2, betas (0.9, "
      "0.99), eps 1e-6), test_ddp_apply_optim_in_backward's zero_grad(set_to_none=True)",
      agree=[r"\.params$", "^exp_avg_sq$"])
def adam(h):
    m = h.wrap(mlp())
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-6)
    x, y = torch.randn(5, 2 * h.world, 8), torch.randint(0, 3, (5, 2 * h.world))
    for s in range(5):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m(my_slice(x[s], h.rank, 2)), my_slice(y[s], h.rank, 2))
        loss.backward()
        opt.step()
        h.put(f"step{s}.params", params(m.module))
    h.put("exp_avg_sq", [opt.state[p]["exp_avg_sq"] for p in m.parameters()])


@case("distributed_test.py test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_gradient's batch split "
      "(local_bs = rank + 2): each rank's mean loss on a different number of samples", agree=[r"\.(grads|params)$"])
def uneven_batch_sizes(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    global_bs = (h.world + 3) * h.world // 2
    off, local_bs = (h.rank + 3) * h.rank // 2, h.rank + 2
    x, y = torch.randn(4, global_bs, 8), torch.randint(0, 3, (4, global_bs))
    train_steps(h, m, opt, [a[off:off + local_bs] for a in x], [a[off:off + local_bs] for a in y],
                nn.CrossEntropyLoss())


@case("distributed_test.py test_accumulate_gradients_no_sync (_test_accumulate_gradients_no_sync): a no_grad "
      "forward inside no_sync first, then backward passes alternately under no_sync (local sums) and synced",
      agree=[r"^it[13]\.grads$"])
def no_sync_accumulation(h):
    m = h.wrap(Net())
    world = h.world
    inp, target = torch.randn(world, 2), torch.randn(world, 4)
    with torch.no_grad():
        with m.no_sync():
            m.train()
            m(inp)
    for it in range(4):
        x, t = inp[h.rank:h.rank + 1], target[h.rank:h.rank + 1]
        ctx = m.no_sync() if it % 2 == 0 else contextlib.nullcontext()
        with ctx:
            F.mse_loss(m(x), t).backward()
        h.put(f"it{it}.grads", grads(m.module))
        torch.manual_seed(1337 + it)
        inp = inp[torch.randperm(world)]


@case("issue 36's list (no torch test of its own): gradient accumulation over 3 micro-batches, the first two "
      "under no_sync, the loss divided by 3, one optimizer step per 3", agree=[r"\.(grads|params)$"])
def gradient_accumulation(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(3, 3, 2 * h.world, 8), torch.randint(0, 3, (3, 3, 2 * h.world))
    for r in range(3):
        opt.zero_grad()
        for micro in range(3):
            ctx = m.no_sync() if micro < 2 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(m(my_slice(x[r, micro], h.rank, 2)), my_slice(y[r, micro], h.rank, 2)) / 3
                loss.backward()
        h.put(f"round{r}.grads", grads(m.module))
        opt.step()
        h.put(f"round{r}.params", params(m.module))


@case("distributed_test.py test_grads_same_across_ranks_with_no_sync: find_unused_parameters=True, each rank uses "
      "other layers in its no_sync pass and its synced pass; no grad is None and the ranks' grads agree. "
      "torch 1.13's DDP fails it (a layer used only under no_sync keeps its local .grad, or None, on each rank; "
      "later torch counts no_sync uses): ferry is held to the test's assertions",
      agree=[r"^grads$"], expect={"any_grad_is_none": False})
def no_sync_then_sync_with_rank_dependent_unused(h):
    class SimpleConditionalModel(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.rank = rank
            self.nn1, self.nn2, self.nn3, self.nn4 = (nn.Linear(1, 1) for _ in range(4))
            self.state = 0

        def forward(self, x):
            first = self.state == 0
            self.state = 1 - self.state
            if self.rank == 0:
                return self.nn1(x) if first else self.nn2(x)
            return self.nn3(x) if first else self.nn4(x)

    m = h.wrap(SimpleConditionalModel(h.rank), find_unused_parameters=True)
    gen = torch.Generator().manual_seed(7 + h.rank)
    for micro in range(2):
        ctx = m.no_sync() if micro == 0 else contextlib.nullcontext()
        with ctx:
            x, t = torch.rand((1,), generator=gen), torch.rand((1,), generator=gen)
            F.mse_loss(m(x), t).backward()
    h.put("grads", grads(m.module))
    h.put("any_grad_is_none", any(p.grad is None for p in m.parameters()))


@case("issue 36's list (a model called twice, as a siamese or contrastive step): two forwards of the wrapper, "
      "then one backward of both losses", agree=[r"\.(grads|params)$"])
def two_forwards_then_one_backward(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x1, x2 = torch.randn(3, 2 * h.world, 8), torch.randn(3, 2 * h.world, 8)
    for s in range(3):
        opt.zero_grad()
        a, b = m(my_slice(x1[s], h.rank, 2)), m(my_slice(x2[s], h.rank, 2))
        (a.square().mean() + (a - b).abs().mean()).backward()
        h.put(f"step{s}.grads", grads(m.module))
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("distributed_test.py test_ddp_shared_grad_acc_unused_params's sharing (one parameter under two names, "
      "net1.bias = self.bias), here used: an embedding tied to the output layer", agree=[r"\.(grads|params)$"])
def tied_weights(h):
    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(12, 8)
            self.hidden = nn.Linear(8, 8)
            self.out = nn.Linear(8, 12, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, tokens):
            return self.out(torch.tanh(self.hidden(self.emb(tokens))))

    torch.manual_seed(0)
    m = h.wrap(TiedLM())
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    tok, nxt = torch.randint(0, 12, (4, 4 * h.world)), torch.randint(0, 12, (4, 4 * h.world))
    h.put("names", [n for n, _ in m.named_parameters()])
    train_steps(h, m, opt, [my_slice(a, h.rank, 4) for a in tok], [my_slice(a, h.rank, 4) for a in nxt],
                nn.CrossEntropyLoss())
    h.put("tied", m.module.out.weight is m.module.emb.weight)


@case("distributed_test.py test_ddp_shared_grad_acc_unused_params: net1.bias and bias one parameter, net1 unused, "
      "find_unused_parameters=True, loss /= 10; DDP leaves the unused parameters' .grad None", agree=[r"\.grads$"])
def shared_parameter_unused(h):
    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 5, bias=False)
            self.bias = nn.Parameter(torch.zeros(5))
            self.net1.bias = self.bias
            self.net2 = nn.Linear(10, 5)

        def forward(self, x):
            return self.net2(x).sum()

    torch.manual_seed(0)
    m = h.wrap(ToyModel(), find_unused_parameters=True)
    inp = torch.randn(20, 10) + h.rank
    for i in range(3):
        loss = m(inp)
        loss /= 10
        loss.backward()
        h.put(f"it{i}.grads", grads(m.module))


@case("distributed_test.py DDP_NET's frozen fc2.fc.bias (requires_grad=False), "
      "test_ddp_build_debug_param_to_name_mapping_requires_grad: DDP neither reduces nor touches it",
      agree=[r"\.(grads|params)$"])
def frozen_parameters(h):
    m = h.wrap(Net())
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
    x, y = torch.randn(4, 2 * h.world, 2), torch.randn(4, 2 * h.world, 4)
    train_steps(h, m, opt, [my_slice(a, h.rank, 2) for a in x], [my_slice(a, h.rank, 2) for a in y], F.mse_loss)
    h.put("frozen.grad_is_none", m.module.fc2.fc.bias.grad is None)


@case("test_c10d_gloo.py test_find_unused_parameters_when_unused_parameters_empty: rank 0 uses t0 and t1, rank 1 "
      "only t1 (find_unused_parameters=True); t0's gradient is rank 0's over the world size on both ranks",
      agree=[r"\.(grads|params)$"])
def parameter_unused_on_one_rank(h):
    class FindUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1 = Task(), Task()

        def forward(self, x, rank):
            return self.t1(self.t0(x)) if rank == 0 else self.t1(x)

    m = h.wrap(FindUnusedParamModule(), find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for s in range(3):
        opt.zero_grad()
        out = m(torch.full((2, 2), 8.0 + s), h.rank)
        (out * out).mean().backward()
        h.put(f"step{s}.grads", grads(m.module))
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("test_c10d_gloo.py test_global_local_unused_params_grad: t0 used on rank 0, t1 on rank 1, task_unused on "
      "none (find_unused_parameters=True): DDP leaves task_unused's .grad None, so SGD(weight_decay) never moves "
      "it", agree=[r"\.(grads|params)$"])
def globally_unused_parameter_untouched(h):
    class GlobalLocalUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1, self.task_unused = Task(), Task(), Task()

        def forward(self, x, rank):
            return self.t0(x) if rank == 0 else self.t1(x)

    m = h.wrap(GlobalLocalUnusedParamModule(), find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    for s in range(3):
        opt.zero_grad(set_to_none=True)
        m(8, h.rank).mean().backward()
        h.put(f"step{s}.grads", grads(m.module))
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("distributed_test.py test_ddp_control_flow_different_across_ranks: lin2 used on rank 1 only on odd "
      "iterations and by no rank on even ones (find_unused_parameters=True), with SGD(weight_decay) steps",
      agree=[r"\.(grads|params)$"])
def control_flow_different_across_ranks(h):
    batch, dim = 20, 10

    class ToyModel(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.lin1 = nn.Linear(10, 10, bias=False)
            self.lin2 = nn.Linear(10, 10, bias=False)
            self.rank = rank

        def forward(self, x):
            if torch.equal(x, torch.ones(batch, dim)) and self.rank == 1:
                return self.lin2(F.relu(self.lin1(x)))
            return F.relu(self.lin1(x))

    torch.manual_seed(0)
    m = h.wrap(ToyModel(h.rank), find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, weight_decay=0.1)
    random_input, ones_input = torch.randn(batch, dim), torch.ones(batch, dim)
    for i in range(4):
        opt.zero_grad()
        m(random_input if i % 2 == 0 else ones_input).sum().backward()
        h.put(f"it{i}.grads", grads(m.module))
        opt.step()
        h.put(f"it{i}.params", params(m.module))


@case("distributed_test.py test_output_unused_in_loss_tuple_module (_test_output_unused_in_loss): output a left "
      "out of the loss (find_unused_parameters=True): a.weight's .grad stays None, later keeps its value",
      agree=[r"\.grads$"])
def output_unused_in_loss(h):
    class UnusedParamTwoLinLayerNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(10, 10, bias=False)
            self.b = nn.Linear(10, 10, bias=False)
            self.c = nn.Linear(5, 5, bias=False)

        def forward(self, x):
            return self.a(x), self.b(x)

    torch.manual_seed(0)
    m = h.wrap(UnusedParamTwoLinLayerNet(), find_unused_parameters=True)
    inp = torch.randn(10, 10)
    _, b = m(inp)
    b.sum().backward()
    h.put("first.grads", grads(m.module))
    m.zero_grad()
    for i in range(4):
        a, b = m(inp)
        loss = (a @ b).sum() if i < 2 else b.sum()
        loss.backward()
        h.put(f"it{i}.grads", grads(m.module))


@case("distributed_test.py test_ddp_unused_params_rebuild_buckets_exception: net2 unused, "
      "find_unused_parameters=False: both refuse within two iterations (DDP at the second forward, ferry at the "
      "end of the first backward, naming net2.weight)")
def unused_parameter_refused(h):
    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 10, bias=False)
            self.net2 = nn.Linear(10, 10, bias=False)

        def forward(self, x):
            return self.net1(x)

    m = h.wrap(ToyModel())
    raised = False
    for i in range(2):
        try:
            m(torch.rand(1, 10)).sum().backward()
        except RuntimeError as e:
            raised = True
            h.note("error", str(e))
            break
    h.put("raised_within_two_iterations", raised)


@case("DDP's note on buffers ('broadcast from the module in process of rank 0 ... in every iteration'), "
      "test_DistributedDataParallel_SyncBatchNorm's BatchNorm net without SyncBatchNorm: each rank's running "
      "statistics after each training step on rank-different data", agree=[r"\.params$"])
def batchnorm_buffers_each_step(h):
    m = h.wrap(bn_net())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(4):
        opt.zero_grad()
        out = m(torch.randn(8, 4) * (1 + h.rank) + h.rank)
        out.square().mean().backward()
        opt.step()
        h.put(f"step{s}.params", params(m.module))
        h.put(f"step{s}.buffers", buffers(m.module))


@case("DDP's broadcast_buffers=False (distributed_test.py _test_ddp_new_tensor_in_fwd, "
      "_test_ddp_buffer_hook_allreduce's model_ddp_no_hook): each rank keeps its own running statistics",
      agree=[r"\.params$"])
def batchnorm_broadcast_buffers_false(h):
    m = h.wrap(bn_net(), broadcast_buffers=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(3):
        opt.zero_grad()
        m(torch.randn(8, 4) + h.rank).square().mean().backward()
        opt.step()
        h.put(f"step{s}.params", params(m.module))
        h.put(f"step{s}.buffers_of_rank", buffers(m.module))


@case("issue 36 item 1 (imagenet's validate()); DDP's require_forward_param_sync: the first forward after a "
      "synced step broadcasts rank 0's buffers, under torch.no_grad() and eval() too", agree=[r"^eval\.", r"^after\."])
def eval_under_no_grad_after_a_step(h):
    m = h.wrap(bn_net())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt.zero_grad()
    m(torch.randn(8, 4) + h.rank).square().mean().backward()
    opt.step()
    m.eval()
    with torch.no_grad():
        h.put("eval.output", m(torch.ones(2, 4)))
    h.put("eval.buffers", buffers(m.module))
    m.train()
    opt.zero_grad()
    m(torch.randn(8, 4) + h.rank).square().mean().backward()
    opt.step()
    h.put("after.params", params(m.module))


@case("distributed_test.py test_ddp_inference (inference on rank 0 only, no hang): between training epochs rank 0 "
      "runs 1 eval forward under no_grad and rank 1 runs 3; only the first follows a synced step",
      agree=[r"first_eval_output$", r"\.params$"])
def eval_forward_counts_differ_per_rank(h):
    m = h.wrap(bn_net())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    probe = torch.linspace(-1, 1, 8).reshape(2, 4)
    for epoch in range(2):
        m.train()
        for _ in range(2):
            opt.zero_grad()
            m(torch.randn(8, 4) + h.rank).square().mean().backward()
            opt.step()
        m.eval()
        with torch.no_grad():
            outs = [m(probe) for _ in range(1 if h.rank == 0 else 3)]
        h.put(f"epoch{epoch}.first_eval_output", outs[0])
        h.put(f"epoch{epoch}.params", params(m.module))
        h.put(f"rank_eval{epoch}.outputs", outs)
        h.put(f"rank_eval{epoch}.buffers", buffers(m.module))


@case("DDP's require_forward_param_sync under no_sync (distributed_test.py _run_uneven_inputs_test's no_sync every "
      "sync_interval, on BatchNormNet): buffers are broadcast before the forward that follows a synced one, "
      "not before a synced forward that follows a no_sync one", agree=[r"\.params$"])
def buffers_with_no_sync_accumulation(h):
    m = h.wrap(bn_net())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for r in range(3):
        opt.zero_grad()
        with m.no_sync():
            m(torch.randn(8, 4) + h.rank).square().mean().backward()
        h.put(f"rank_micro{r}.buffers", buffers(m.module))
        m(torch.randn(8, 4) - h.rank).square().mean().backward()
        opt.step()
        h.put(f"rank_synced{r}.buffers", buffers(m.module))
        h.put(f"round{r}.params", params(m.module))


@case("issue 36's list (no torch test of its own; DDP_NET-style loop): clip_grad_norm_ of the averaged "
      "gradients before SGD", agree=[r"total_norm$", r"\.(grads|params)$"])
def clip_grad_norm(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    x, y = torch.randn(3, 2 * h.world, 8) * 4, torch.randint(0, 3, (3, 2 * h.world))
    for s in range(3):
        opt.zero_grad()
        F.cross_entropy(m(my_slice(x[s], h.rank, 2)), my_slice(y[s], h.rank, 2)).backward()
        h.put(f"step{s}.total_norm", torch.nn.utils.clip_grad_norm_(m.parameters(), 0.25))
        h.put(f"step{s}.grads", grads(m.module))
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("distributed_test.py _test_ddp_native_mixed_precision's net.zero_grad(set_to_none=...) and "
      "_test_ddp_apply_optim_in_backward's optim.zero_grad(set_to_none=True): both ways, on the optimizer and "
      "on the wrapper", agree=[r"\.(grads|params)$"])
def zero_grad_both_ways(h):
    m = h.wrap(mlp())
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 2 * h.world, 8), torch.randint(0, 3, (4, 2 * h.world))
    for s in range(4):
        if s % 2 == 0:
            opt.zero_grad(set_to_none=(s == 0))
        else:
            m.zero_grad(set_to_none=(s == 1))
        h.put(f"step{s}.grad_is_none_after_zero_grad", [p.grad is None for p in m.parameters()])
        F.cross_entropy(m(my_slice(x[s], h.rank, 2)), my_slice(y[s], h.rank, 2)).backward()
        h.put(f"step{s}.grads", grads(m.module))
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("test_c10d_gloo.py test_save_load_checkpoint: state_dict keys carry the 'module.' prefix; training resumed "
      "from a reloaded state_dict and a plain module loaded through consume_prefix_in_state_dict_if_present "
      "match", agree=[r"^resumed\.", r"^reloaded\."])
def state_dict_and_checkpoint_reload(h):
    m = h.wrap(bn_net())
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(6, 2 * h.world, 4), torch.randn(6, 2 * h.world, 2)

    def loop(model, optimizer, steps):
        for s in steps:
            optimizer.zero_grad()
            F.mse_loss(model(my_slice(x[s], h.rank, 2)), my_slice(y[s], h.rank, 2)).backward()
            optimizer.step()

    h.put("keys", list(m.state_dict().keys()))
    loop(m, opt, range(3))
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    m.load_state_dict(sd)
    plain = bn_net(seed=5)
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")
    plain.load_state_dict(sd)
    h.put("reloaded.module", params(m.module))
    h.put("reloaded.plain", params(plain))
    h.put("plain_keys", list(plain.state_dict().keys()))
    loop(m, opt, range(3, 6))
    h.put("resumed.params", params(m.module))


@case("distributed_test.py test_ddp_sync_module_states (DDP's _sync_module_states at construction): ranks built "
      "from different seeds start from rank 0's parameters (frozen ones included) and buffers",
      agree=[r"^after_wrap\.", r"^step\.params$"])
def construction_broadcasts_rank0_state(h):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.bn = nn.BatchNorm1d(4)
            self.frozen = nn.Linear(4, 4)
            self.frozen.requires_grad_(False)
            self.register_buffer("counter", torch.tensor([0]))

        def forward(self, x):
            return self.bn(self.lin(x)) + self.frozen(x)

    torch.manual_seed(100 + h.rank)
    module = M()
    with torch.no_grad():
        module.bn.running_mean.fill_(h.rank + 0.5)
        module.counter.fill_(10 + h.rank)
    m = h.wrap(module)
    h.put("after_wrap.params", params(m.module))
    h.put("after_wrap.buffers", buffers(m.module))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(4, 4) + h.rank).sum().backward()
    opt.step()
    h.put("step.params", params(m.module))


@case("distributed_test.py _test_DistributedDataParallel_with_amp's 'verify grads are none before training' and "
      "test_c10d_gloo.py test_global_local_unused_params_grad's start: after wrapping, before any forward, every "
      ".grad is None")
def grads_are_none_before_training(h):
    m = h.wrap(Net())
    h.put("grad_is_none", [p.grad is None for p in m.parameters()])


@case("distributed_test.py _test_DistributedDataParallel_with_amp (on the CPU: torch.autocast bfloat16, no "
      "GradScaler): float32 parameters and gradients, bf16 compute; DDP_NET, SGD lr 0.03", agree=[r"\.params$"])
def autocast_bf16(h):
    m = h.wrap(Net())
    opt = torch.optim.SGD(m.parameters(), lr=0.03)
    inp, target = torch.randn(h.world * 2, 2), torch.randn(h.world * 2, 4)
    for s in range(4):
        opt.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = m(my_slice(inp, h.rank, 2))
            loss = F.mse_loss(out.float(), my_slice(target, h.rank, 2))
        loss.backward()
        h.put(f"step{s}.grad_dtypes", [str(p.grad.dtype) for p in m.parameters() if p.grad is not None])
        opt.step()
        h.put(f"step{s}.params", params(m.module))
        torch.manual_seed(1337 + s)
        inp = inp[torch.randperm(h.world * 2)]


@case("distributed_test.py test_DistributedDataParallel_non_default_stream and test_ddp_uneven_input_join_disable: "
      "a summed loss on input rank gives .grad = sum(ranks) / world size (DDP's note: averaged, not summed)",
      agree=[r"\.grad$"])
def summed_loss_grad_is_averaged(h):
    torch.manual_seed(0)
    m = h.wrap(nn.Linear(1, 1, bias=False))
    for it in range(3):
        g = m.module.weight.grad
        if g is not None:
            g.requires_grad_(False)
            g.zero_()
        m(torch.tensor([float(h.rank)])).sum().backward()
        h.put(f"it{it}.grad", m.module.weight.grad)
    h.put("expected", sum(range(h.world)) / h.world)


@case("test_c10d_gloo.py test_ignored_output and test_ignored_output_with_unused_parameters: forwards whose output "
      "is dropped without backward, then training; find_unused_parameters=False and True", agree=[r"\.params$"])
def ignored_output(h):
    class IgnoredOutputWithUnusedParameters(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 10, bias=False)
            self.fc2 = nn.Linear(10, 4, bias=False)
            self.fc3 = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            x = F.relu(self.fc1(x))
            return F.softmax(F.relu(self.fc2(x)), dim=1)

    for find_unused in (False, True):
        torch.manual_seed(0)
        module = IgnoredOutputWithUnusedParameters()
        if not find_unused:
            del module.fc3
        m = h.wrap(module, find_unused_parameters=find_unused)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        inp, target = torch.rand(4, 2) + h.rank, torch.tensor([0, 1, 2, 3])
        for _ in range(3):
            out = m(inp)
            del out
        for i in range(3):
            opt.zero_grad()
            F.cross_entropy(m(inp), target).backward()
            opt.step()
        h.put(f"used{int(find_unused)}.params", {n: p for n, p in params(m.module).items() if "fc3" not in n})


@case("distributed_test.py test_ddp_namedtuple, test_ddp_static_graph_nested_types, "
      "test_ddp_returns_tensor_with_no_grad, test_ddp_new_tensor_in_fwd: inputs pass as given (namedtuple, "
      "keyword), nested outputs come back as returned, a detached output stays detached", agree=[r"\.params$"])
def structured_inputs_and_outputs(h):
    Pair = namedtuple("Pair", ("a", "b"))

    class NestedOutputModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 2, bias=False)

        def forward(self, pair, scale=1.0):
            assert isinstance(pair, Pair), type(pair)
            y = self.lin(pair.a * pair.b) * scale
            return {"y": y, "nested": [y.detach(), (y * 2,)], "new": torch.zeros(1)}

    torch.manual_seed(0)
    m = h.wrap(NestedOutputModule())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(3):
        opt.zero_grad()
        out = m(Pair(torch.randn(3, 6), torch.randn(3, 6) + h.rank), scale=0.5)
        h.put(f"step{s}.structure", [type(out).__name__, type(out["nested"]).__name__,
                                     type(out["nested"][1]).__name__, out["nested"][0].requires_grad,
                                     out["new"].grad_fn is None])
        (out["y"].sum() + out["nested"][1][0].sum()).backward()
        opt.step()
        h.put(f"step{s}.params", params(m.module))


@case("DDP's `module` attribute (distributed_test.py uses model_DDP.module throughout): the wrapped module "
      "itself, its parameters the wrapper's, named with the 'module.' prefix")
def module_attribute(h):
    inner = mlp()
    m = h.wrap(inner)
    h.put("module_is_inner", m.module is inner)
    h.put("same_parameters", all(a is b for a, b in zip(m.parameters(), inner.parameters())))
    h.put("names", [n for n, _ in m.named_parameters()])
    h.put("children", [n for n, _ in m.named_children()])


# ---- the job ------------------------------------------------------------------------------------------
def barrier(store, key, world):
    """Every rank reached `key` (a counter on the store, read with add(key, 0): never a timed-out wait)."""
    k = f"ddp_peer/{key}"
    store.add(k, 1)
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while int(store.add(k, 0)) < world:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ddp_peer_worker: not every rank reached {key} within {BARRIER_TIMEOUT} s")
        time.sleep(0.002)


def main() -> int:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    store = dist.distributed_c10d._get_default_store()
    only = [n for n in os.environ.get("FERRY_DDP_PEER_CASES", "").split(",") if n]
    report = {"torch": torch.__version__, "rank": rank, "world": world, "cases": {}}
    started = time.monotonic()
    for i, (name, c) in enumerate(CASES.items()):
        if only and name not in only:
            continue
        rec = {"source": c["source"], "tol": c["tol"], "agree": c["agree"], "expect": c["expect"]}
        for kind in ("ddp", "ferry"):
            barrier(store, f"{i}/{kind}", world)
            torch.manual_seed(1000 + i)  # both halves, and every rank, draw the same numbers
            h = Half(kind, rank, world)
            t0 = time.monotonic()
            error = None
            try:
                c["fn"](h)
            except Exception as e:  # noqa: BLE001 - the case's error, reported by the test
                error = f"{type(e).__name__}: {e}"
            try:
                h.close()
            except Exception as e:  # noqa: BLE001
                error = error or f"close: {type(e).__name__}: {e}"
            rec[kind] = {"obs": h.obs, "notes": h.notes, "error": error, "opened": h.opened,
                         "seconds": round(time.monotonic() - t0, 3)}
        report["cases"][name] = rec
        report["seconds"] = round(time.monotonic() - started, 3)
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f)
        os.replace(tmp, out)
    barrier(store, "end", world)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
