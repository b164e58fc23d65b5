"""ferry.torch.DataParallel: data-parallel training with ferry's gradient reducer, adopted in one line.

    model = ferry.torch.DataParallel(model)             # after torch.distributed.init_process_group
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()                  # buckets are reduced while backward runs
        opt.step()

How it works. Every parameter's .grad is a view into ferry's flat gradient buffer (no copy in or out);
each parameter's gradient-accumulation hook is a C function of ferry's library (no Python runs per
gradient: ferry._native.reducer), which counts the gradients of each bucket, and the reducer launches each
bucket's all-reduce on its own stream as soon as the bucket is full, in the same order on every rank.
ferry's Python runs twice per backward whatever the number of parameters: when the backward reaches the
forward's outputs (a hook on them seats the gradients' views and arms the hooks on the stream of that
moment) and when it ends. At the end of backward the current stream waits for the last bucket, so
the optimizer reads averaged gradients with no host synchronization (with find_unused_parameters, one in
the steps where this rank has a parameter without a gradient: whether another rank used it decides its .grad). With plan="auto" the reducer learns
the backward over its first 1 + 3 * learn_steps steps (one bucket, then DDP's 25 MB buckets), measures the
link, and then chooses the buckets (and, with lossy=True, a bf16 or fp16 codec per bucket) that leave the
least communication exposed after backward.

The group: with torch.distributed initialized (torchrun, or any init_process_group), ferry reuses its
key-value store to find the other processes (NCCL on GPUs, ferry's host backend on CPU tensors); under
mpirun without torch.distributed, MPI; otherwise a job of this process alone.

Two communicators on one GPU (torch's ProcessGroupNCCL and ferry's) can deadlock when their collectives
are in flight together in different orders on different ranks. ferry keeps them apart by stream order:
its buckets wait for the work queued on the current stream before backward, and the current stream waits
for its last bucket at the end of backward. torch collectives called the usual way (synchronously, or
waited for on the current stream) before backward or after it are therefore ordered on every rank the
same way with respect to ferry's, and never overlap them. Do not leave an asynchronous torch collective
in flight across a backward pass of this module.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .. import _runtime
from .._device import Device
from .._native.reducer import Reducer
from ._common import resolve_device
from ._group import Group

# The current CUDA stream of a device index as an int (torch's own fast path, no Stream object); None on
# torches without it (then torch.cuda.current_stream).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

# The parameter dtypes the reducer takes, by the name its options give them.
_GRAD_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _shape_2d(shape: Any) -> tuple:
    """A gradient as a matrix, as PowerSGD sees it: (first dimension, the rest); a scalar or a vector of n
    elements is (n, 1)."""
    n = 1
    for d in shape:
        n *= int(d)
    if len(shape) <= 1:
        return (n, 1)
    return (int(shape[0]), n // int(shape[0]))


# DDP's constructor arguments that DataParallel does not take: the value that means what ferry does anyway
# (accepted), and what to do instead of any other.
_DDP_ARGUMENTS = {
    "dim": (0, "ferry's module runs on one device per process and scatters no input"),
    "process_group": (None, "ferry builds its own group over torch.distributed's store; for another set of "
                            "processes pass store=, rank= and world_size="),
    "check_reduction": (False, "DDP ignores it (deprecated)"),
    "delay_all_reduce_named_params": (None, "ferry reduces every parameter's gradient in its buckets"),
    "param_to_hook_all_reduce": (None, "ferry reduces every parameter's gradient in its buckets"),
    "mixed_precision": (None, "use autocast (float32 gradients) or a bfloat16/float16 module with "
                              "reduce_dtype="),
    "device_mesh": (None, "ferry's group is one dimension of every process of the job"),
    "skip_all_reduce_unused_params": (False, "find_unused_parameters=True leaves globally unused gradients "
                                             "untouched"),
}


def _refuse_ddp_arguments(given: Dict[str, Any]) -> None:
    for name, value in given.items():
        if name not in _DDP_ARGUMENTS:
            raise TypeError(f"DataParallel() got an unexpected keyword argument {name!r}")
        accepted, instead = _DDP_ARGUMENTS[name]
        if name == "process_group" and value is not None and _is_default_group(value):
            continue
        if value is not accepted and value != accepted:
            raise ValueError(f"DataParallel({name}={value!r}): not supported ({instead}); DDP's argument is "
                             f"accepted as {accepted!r} only")


def _is_default_group(group: Any) -> bool:
    """Whether `group` is torch.distributed's default group (every process of the job, as ferry's)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return group is dist.group.WORLD or group is dist.distributed_c10d._get_default_group()


def _check_device_ids(device_ids: Any, output_device: Any, device: Any) -> List[Any]:
    """DDP's device_ids and output_device, for a module on `device`: [that device] or None (a CPU module)."""
    def same(d: Any) -> bool:
        d = torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
        return d.type == device.type and (d.index or 0) == (device.index or 0)

    if device.type != "cuda":
        raise ValueError(f"DataParallel(device_ids={device_ids!r}, output_device={output_device!r}): the module's "
                         f"parameters are on {device}; as DDP, device_ids and output_device are for a module on "
                         "one GPU (leave them out for a CPU module)")
    ids = list(device_ids) if device_ids is not None else [device]
    if len(ids) != 1 or not same(ids[0]) or (output_device is not None and not same(output_device)):
        raise ValueError(f"DataParallel(device_ids={device_ids!r}, output_device={output_device!r}): the module's "
                         f"parameters are on {device}; ferry runs one device per process: pass [{device.index}] "
                         "or leave them out")
    return ids


def _in_compiled_autograd() -> bool:
    """Whether torch._dynamo's compiled autograd runs this backward (torch >= 2.4; False before)."""
    import sys
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(getattr(ca, "compiled_autograd_enabled", False)
                                   or getattr(ca, "in_compiled_autograd_region", False))


def _grad_tensors(obj: Any, _depth: int = 0) -> Iterator[Any]:
    """The tensors of a forward's output that require grad (in tuples, lists, dicts and dataclasses, as
    DDP finds them, and in the attributes of another object, one level down)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _grad_tensors(v, _depth)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _grad_tensors(v, _depth)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _grad_tensors(getattr(obj, f.name))
    elif _depth == 0 and hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        # A result object (a torch.distributions.Normal's loc and scale, say): its attributes, one level.
        for v in vars(obj).values():
            yield from _grad_tensors(v, 1)


def _to_device(obj: Any, device: Any) -> Any:
    """The forward's arguments with every tensor moved to `device` (what DDP does when given device_ids)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


class DataParallel(torch.nn.Module):
    """Wraps `module` for data-parallel training over the processes of a job, one device each.

    plan: "auto" (learn the backward, then choose the buckets) or "fixed" (first_bucket_mb, then buckets
    of bucket_cap_mb, in the order gradients became ready in the first step, as DDP).
    lossy: let the automatic plan send buckets as bf16 or fp16 (averages then carry the codec's rounding
    error, see ferry/comm/codec.hpp); only with plan="auto".
    find_unused_parameters: a parameter that gets no gradient in a step is averaged with the other ranks'
    gradients as its own stands (zeros where None), and keeps its .grad as it was where no rank used it, as
    DDP; without it such a step raises an error naming them.
    broadcast_buffers: rank 0's buffers (batch-norm statistics) are copied to every rank before the first
    forward after a synced one, under no_grad too, as DDP does.
    device_ids, output_device, init_sync, gradient_as_bucket_view, static_graph and DDP's other arguments:
    python/README.md's table of DDP's behaviours says which mean what they mean to DDP and which are refused.
    timeout: seconds a collective may take before the group is aborted on every rank.
    reduce_dtype: for a model trained in bfloat16 or float16 (its parameters, hence its gradients, of that
    type): None averages the gradients in their own type (half the bytes of float32, rounded at each
    partial sum as DDP's all-reduce of them is), torch.float32 widens them, averages in float32 and rounds
    back once (twice the bytes). float32 parameters (mixed precision under autocast included) are averaged
    in float32. Every parameter that requires grad must have the same dtype.
    """

    def __init__(self, module: Any, device_ids: Any = None, output_device: Any = None, *, plan: str = "auto",
                 lossy: bool = False, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 find_unused_parameters: bool = False, broadcast_buffers: bool = True, timeout: float = 300.0,
                 learn_steps: int = 3, store: Any = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, reduce_dtype: Any = None, init_sync: bool = True,
                 gradient_as_bucket_view: Optional[bool] = None, static_graph: bool = False,
                 **ddp_arguments: Any) -> None:
        super().__init__()
        _refuse_ddp_arguments(ddp_arguments)
        if gradient_as_bucket_view is False:
            warnings.warn("ferry.torch.DataParallel(gradient_as_bucket_view=False): ferry's gradients are always "
                          "views of its buckets (as DDP's gradient_as_bucket_view=True); clone a .grad you keep "
                          "across steps", stacklevel=2)
        if plan not in ("auto", "fixed"):
            raise ValueError(f"plan {plan!r}: expected 'auto' or 'fixed'")
        if lossy and plan != "auto":
            raise ValueError("lossy=True needs plan='auto': the automatic plan chooses where a codec pays")
        for name, mb in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if not (isinstance(mb, (int, float)) and 0 < mb <= 1 << 20):
                raise ValueError(f"{name}={mb!r}: expected a positive number of MiB up to 1048576")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
        self.module = module
        self._pid = _runtime.current_pid()
        self._closed = True  # until the group and the reducer exist: close() then has nothing to release
        self._hooks: List[Any] = []
        self._red: Optional[Reducer] = None
        self._group: Optional[Group] = None
        self._views: List[Any] = []
        self._params: List[Any] = []
        self._step_open = False
        # static_graph=True lets DDP meet parameters that never get a gradient without find_unused_parameters;
        # ferry's reducer learns the backward either way, and treats them as find_unused_parameters does.
        self._find_unused = bool(find_unused_parameters) or bool(static_graph)
        self._broadcast_buffers = bool(broadcast_buffers)
        self._forward_sync = True  # DDP's require_forward_param_sync: buffers go out before the next forward
        self._device_ids: Optional[List[Any]] = None
        for name, sub in module.named_modules():
            if isinstance(sub, torch.nn.SyncBatchNorm):
                raise ValueError(f"DataParallel: {name or 'the module'} is a SyncBatchNorm, whose backward runs "
                                 "torch's collectives beside ferry's bucket all-reduces on another communicator "
                                 "(they can deadlock): keep BatchNorm (rank 0's statistics reach every rank "
                                 "before the forward, broadcast_buffers=True), or wrap the model in torch's DDP "
                                 "with ferry.torch.comm_hook")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("DataParallel: the module has no parameter that requires grad")
        grad_dtype = named[0][1].dtype
        if grad_dtype not in _GRAD_DTYPES:
            raise ValueError(f"DataParallel: parameter {named[0][0]} is {grad_dtype}; ferry's reducer takes "
                             "float32, bfloat16 or float16 parameters")
        if reduce_dtype not in (None, grad_dtype, torch.float32):
            raise ValueError(f"DataParallel: reduce_dtype={reduce_dtype} for {grad_dtype} parameters; expected "
                             f"None (their own type) or torch.float32")
        if lossy and grad_dtype != torch.float32:
            raise ValueError(f"DataParallel: lossy=True with {grad_dtype} parameters; the lossy codecs compress "
                             "float32 gradients (16-bit ones travel as they are)")
        for n, p in named:
            if p.dtype != grad_dtype:
                raise ValueError(f"DataParallel: parameter {n} is {p.dtype} and {named[0][0]} {grad_dtype}; "
                                 "every parameter that requires grad must have one dtype (cast the module "
                                 "with .to(dtype), or keep float32 parameters under autocast)")
            if p.is_sparse:
                raise ValueError(f"DataParallel: parameter {n} is sparse; ferry reduces dense gradients")
        devices = {p.device for _, p in named}
        if len(devices) != 1:
            raise ValueError(f"DataParallel: parameters on {sorted(map(str, devices))}; one device per process")
        self._torch_device = next(iter(devices))
        if device_ids is not None or output_device is not None:
            self._device_ids = _check_device_ids(device_ids, output_device, self._torch_device)
        self._cuda_index = self._torch_device.index if self._torch_device.index is not None else 0
        self._dev: Device = resolve_device(self._torch_device)
        self._cuda = self._dev.backend == "cuda"
        self._host_stream = None if self._cuda else self._dev.default_stream()
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]

        # The group.
        self._group = Group(self._dev, timeout=timeout, store=store, rank=rank, world_size=world_size)
        self._comm = self._group.handle
        self.rank, self.world_size, self.backend = self._group.rank, self._group.world_size, self._group.backend
        self._closed = False
        try:
            self._set_up(plan, lossy, learn_steps, first_bucket_mb, bucket_cap_mb, grad_dtype, reduce_dtype,
                         bool(init_sync))
        except BaseException:
            self._abort("setting up DataParallel failed on this rank")
            self.close()
            raise
        _runtime.register(self)

    def _set_up(self, plan: str, lossy: bool, learn_steps: int, first_bucket_mb: float,
                bucket_cap_mb: float, grad_dtype: Any, reduce_dtype: Any, init_sync: bool) -> None:
        handle = self._comm
        module = self.module

        # Every rank starts from rank 0's parameters, frozen ones included, and buffers (init_sync=False:
        # from its own, as DDP).
        if init_sync:
            with torch.no_grad():
                self._broadcast([p.detach() for p in module.parameters()] + list(module.buffers()))

        # The reducer over the parameters' gradients.
        options = {"plan": plan, "lossy": bool(lossy), "learn_steps": int(learn_steps),
                   "first_bucket_bytes": int(first_bucket_mb * (1 << 20)),
                   "bucket_cap_bytes": int(bucket_cap_mb * (1 << 20)), "grad_dtype": _GRAD_DTYPES[grad_dtype],
                   "reduce_dtype": None if reduce_dtype in (None, grad_dtype) else "f32"}
        try:
            self._red = Reducer(handle, [_shape_2d(p.shape) for p in self._params], options)
        except Exception as e:
            raise self._group.with_store_error(e) from None
        self._generation = -1
        self._views: List[Any] = []
        self._point_grads(keep=[p.grad for p in self._params])

        self._sync = True
        self._step_open = False
        self._armed = False   # a backward of the step is running: the hooks count
        self._armed_stream = 0
        self._create_graph = False
        self._dropped: set = set()  # gradients that were None at a backward's start in this step
        self._error: Optional[str] = None
        self._install_hooks()

    # ---- the step ----------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._check_usable()
        if self._step_open:
            state = self._red.hook_state()
            if state.early is not None:
                self._fail(self._early_message(state.early))
            if state.marks > 0:
                # The last backward stopped part way (an exception in it, a Ctrl-C): some of its buckets
                # went out, others never will, so the ranks no longer agree on the next collective.
                self._fail("the previous backward stopped part way (an exception or an interrupt during it), "
                           f"after {state.marks} of {len(self._params)} gradients; the ranks' collectives no "
                           "longer match")
            # A backward that stopped before its first gradient (an error the caller caught and skipped):
            # none went out, and the next backward arms the step again.
            self._armed = False
        grad_sync = self._sync and torch.is_grad_enabled()
        # Rank 0's buffers before the first forward after a synced one, whatever the grad mode (DDP's
        # require_forward_param_sync): the evaluation under no_grad that follows a step sees the same
        # batch-norm statistics on every rank, and each rank broadcasts once per synced step however many
        # forwards it runs in between.
        if self._forward_sync and self._broadcast_buffers and self.world_size > 1:
            buffers = list(self.module.buffers())
            if buffers:
                with torch.no_grad():
                    self._broadcast(buffers)
        if grad_sync and not self._step_open:
            self._begin_step()
        if self._device_ids is not None:
            args, kwargs = _to_device((args, kwargs), self._torch_device)
        out = self.module(*args, **kwargs)
        self._forward_sync = grad_sync
        if self._step_open and torch.is_grad_enabled():
            # The backward's start: where the gradients are seated and the hooks armed (Note [Gradient
            # hooks in C] in docs/COMM.md). A leaf (a parameter returned as it is) would keep the hooks.
            found = [t for t in _grad_tensors(out) if t.grad_fn is not None]
            if not found:
                raise RuntimeError(
                    f"ferry.torch.DataParallel: the forward returned {type(out).__name__} with no tensor "
                    "computed with grad in it (looked in tuples, lists, dicts, dataclasses and an object's "
                    "attributes): ferry starts each step's reduction when the backward reaches the forward's "
                    "outputs. Return the tensors the loss is made of, or run this forward under "
                    "torch.no_grad() if no backward follows it")
            for t in found:
                t.register_hook(self._backward_starts)
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, without reducing them; the first backward
        after it reduces the sum of everything accumulated (gradient accumulation)."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def _set_static_graph(self) -> None:
        """DDP's late form of static_graph=True: parameters that never get a gradient are then handled as
        with find_unused_parameters=True."""
        self._find_unused = True

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Any:
        """DDP's context manager for uneven inputs: not supported (python/README.md's table of DDP's
        behaviours); join(enable=False) is a context that does nothing, as DDP's."""
        if not enable:
            return contextlib.nullcontext()
        raise RuntimeError("ferry.torch.DataParallel has no join(): give every rank the same number of batches "
                           "(DistributedSampler(..., drop_last=True), or ferry.torch.Loader, which splits each "
                           "epoch evenly); a rank that stops early fails the others within `timeout`, naming the "
                           "collective")

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """DDP's comm hooks: not supported on DataParallel, whose reducer owns each bucket's reduction."""
        raise RuntimeError("ferry.torch.DataParallel takes no comm hook: lossy=True lets its automatic plan send "
                           "buckets as bf16 or fp16 where that pays; to keep a hook, keep torch's DDP (ferry's "
                           "codecs go in as ferry.torch.comm_hook)")

    def _begin_step(self) -> None:
        generation, pending = self._red.layout()
        keep = None
        if pending:
            # The gradients move to a new layout: keep what they hold (an accumulation under no_sync, the
            # zeros of zero_grad) and write it into the new views.
            keep = [p.grad.detach().clone() if p.grad is not None else None for p in self._params]
            if self._cuda:
                torch.cuda.current_stream(self._torch_device).synchronize()
        self._red.begin_step()
        if self._red.layout()[0] != self._generation:
            self._point_grads(keep=keep)
        self._step_open = True
        self._armed = False
        self._dropped = set()

    def _seat(self) -> None:
        """Every .grad its view before the backward accumulates, so that autograd adds into the views in
        place and no gradient is copied: one that is None (the optimizer's zero_grad(set_to_none=True),
        before the forward or after it) becomes its zeroed view (one zeroing launch for all when all were
        None), another tensor is copied into its view. Remembers which were None: given back as None if no
        rank uses them (find_unused_parameters). Run at every backward's start: a backward that counted no
        gradient (torch.autograd.grad) leaves the step open, and zero_grad may drop the views before the
        next."""
        dropped, replaced = [], []
        for i, (p, v) in enumerate(zip(self._params, self._views)):
            g = p.grad
            if g is v:
                continue
            if g is None:
                dropped.append(i)
            elif g.data_ptr() != v.data_ptr():
                replaced.append(i)
        self._dropped.update(dropped)
        if not (dropped or replaced):
            return
        with torch.no_grad():
            if len(dropped) == len(self._params):
                self._flat.zero_()
            else:
                for i in dropped:
                    self._views[i].zero_()
            for i in replaced:
                self._views[i].copy_(self._params[i].grad)
            for i in dropped + replaced:
                self._params[i].grad = self._views[i]

    def _point_grads(self, keep: Optional[List[Any]]) -> None:
        """Makes every parameter's .grad a view of the reducer's flat buffer (after each new layout), holding
        keep[i]; a gradient whose keep[i] is None stays None (as DDP leaves it until backward: the next
        synced backward seats it)."""
        from torch.utils.dlpack import from_dlpack
        generation = self._red.layout()[0]
        flat = self._red.flat(from_dlpack)
        views = []
        with torch.no_grad():
            flat.zero_()
            for i, (p, (offset, count)) in enumerate(zip(self._params, self._red.places())):
                v = flat[offset:offset + count].view(p.shape)
                if keep is None or keep[i] is not None:
                    if keep is not None:
                        v.copy_(keep[i])
                    p.grad = v
                else:
                    p.grad = None
                views.append(v)
        self._flat = flat
        self._views = views
        self._generation = generation

    def _install_hooks(self) -> None:
        """Each parameter's hook: the reducer's C function for its gradient, called by autograd after the
        gradient is accumulated (no Python runs). Each is kept as it is made, so that close() removes every
        one made before the reducer they point to is destroyed, even after a failure part way."""
        if hasattr(self._params[0], "register_post_accumulate_grad_hook"):  # torch >= 2.1
            for p, h in zip(self._params, self._red.hooks()):
                self._hooks.append(p.register_post_accumulate_grad_hook(h))
            return
        # torch < 2.1: a hook on the parameter's AccumulateGrad node (kept alive here, as DDP does).
        for p, h in zip(self._params, self._red.hooks(node=True)):
            with torch.enable_grad():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append((acc, acc.register_hook(h)))

    def _stream(self) -> int:
        if self._cuda:
            if _raw_stream is not None:
                return int(_raw_stream(self._cuda_index))
            return int(torch.cuda.current_stream(self._torch_device).cuda_stream)
        return self._host_stream.handle

    def _backward_starts(self, _grad: Any) -> None:
        """A hook on the forward's outputs: a backward reaches them. The first of the step seats the
        gradients; each arms the reducer's hooks on the current stream (where autograd runs the backward of
        ops made on it) and queues the end of backward."""
        if not self._step_open or self._armed:
            return
        if _in_compiled_autograd():
            # Compiled autograd traces the gradient hooks into its graph; a C function is opaque to it.
            self._fail("torch._dynamo's compiled autograd is on: it traces the parameters' gradient hooks, and "
                       "ferry's are C functions it cannot trace, so the buckets would never be reduced; turn it "
                       "off for this module's backward (torch.compile of the model and of DataParallel both "
                       "work without it)")
        self._seat()
        self._armed_stream = self._stream()
        self._red.arm(self._armed_stream)
        self._armed = True
        self._create_graph = torch.is_grad_enabled()
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _early_message(self, i: int) -> str:
        return (f"parameter {self._names[i]}'s gradient was complete before the backward reached the forward's "
                "outputs: a parameter of the module used only outside its forward, or a backward that does not "
                "start from the forward's outputs. Use every parameter inside forward(), and call backward on "
                "what the outputs gave")

    def _finish(self) -> None:
        """The end of backward: unused parameters, then the current stream waits for the last bucket."""
        if not self._step_open or not self._armed:
            return  # a second end queued by a forward recomputed inside this backward (checkpointing)
        self._armed = False
        state = self._red.hook_state()
        if state.error is not None:
            self._fail(f"a gradient hook failed: {state.error}")
        if state.twice is not None:
            self._fail(f"parameter {self._names[state.twice]} got a second gradient in one backward after its "
                       "bucket was launched (reentrant activation checkpointing, or a parameter used by two "
                       "backward passes of one step); use torch.utils.checkpoint with use_reentrant=False, or one "
                       "backward per step")
        if state.early is not None:
            self._fail(self._early_message(state.early))
        if state.marks == 0:
            # This backward accumulated no parameter's gradient (torch.autograd.grad through the outputs, as
            # DDP, leaves .grad alone): not the step's; the step waits for the next.
            return
        if self._create_graph:
            self._fail("backward(create_graph=True): autograd then replaces each .grad with a new tensor instead "
                       "of adding into ferry's bucket views, so the buckets would carry stale gradients; as DDP, "
                       "DataParallel reduces first-order gradients only (take higher-order ones with "
                       "torch.autograd.grad, which it leaves alone)")
        marked, unsynced = (self._red.hook_flags(unsynced=self._find_unused)
                            if state.marks < len(self._params) or self._find_unused else (None, None))
        missing = [] if marked is None else [i for i, m in enumerate(marked) if not m]
        if missing and not self._find_unused:
            names = ", ".join(self._names[i] for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
            self._fail(f"{len(missing)} parameter(s) got no gradient in this backward: {names}. Every parameter "
                       "that requires grad must take part in the loss on every rank, or pass "
                       "find_unused_parameters=True (a parameter unused on some ranks is then averaged with "
                       "their gradients as they stand, one unused on every rank keeps its .grad untouched)")
        stream = self._stream()
        # What each locally unused gradient was before this backward, given back if no rank used it (DDP
        # leaves a globally unused parameter's .grad untouched: None stays None): (True, its values) when it
        # is its view, (False, the tensor or None) otherwise.
        before: Dict[int, Tuple[bool, Any]] = {}
        dropped = self._dropped
        with torch.no_grad():
            for i in missing:
                p, v = self._params[i], self._views[i]
                g = p.grad
                if g is not None and g.data_ptr() == v.data_ptr():
                    # Seated at this backward's start over a None (its zeros are reduced), or the view as it was.
                    before[i] = (False, None) if i in dropped else (True, v.clone())
                else:
                    # Another tensor (a gradient made under no_sync) is reduced as it stands, None as zeros.
                    before[i] = (False, g)
                    if g is None:
                        v.zero_()
                    else:
                        v.copy_(g)
                    p.grad = v
        if missing and self._cuda and stream != self._armed_stream:
            # The views just written on this stream; the reducer takes them as produced on the armed one.
            torch.cuda.ExternalStream(self._armed_stream, device=self._torch_device).wait_stream(
                torch.cuda.current_stream(self._torch_device))
        for i in missing:
            self._red.hook(i)
        self._red.finish(stream)
        self._step_open = False
        used = self._reduce_used(missing, unsynced, stream) if self._find_unused else None
        if not self._cuda:
            self._host_stream.synchronize()
        if used is not None and missing:
            self._restore_unused(missing, before, used)

    def _reduce_used(self, missing: List[int], unsynced: List[bool], stream: int) -> Any:
        """How many ranks used each parameter in this step (in its backward, or in one under no_sync() since
        the last synced step): one all-reduce of an int32 map after the last bucket, made on every rank so
        that the collectives match; read back only where this rank has an unused parameter."""
        unused = set(missing)
        local = [int(u or i not in unused) for i, u in enumerate(unsynced)]
        counts = torch.tensor(local, dtype=torch.int32)
        if self._cuda:
            # From pinned memory, asynchronously: a pageable copy would wait for the last bucket here.
            counts = counts.pin_memory().to(self._torch_device, non_blocking=True)
        self._group.all_reduce(counts.data_ptr(), counts.data_ptr(), counts.numel(), dtype="i32", op="sum",
                               stream=stream)
        return counts

    def _restore_unused(self, missing: List[int], before: Dict[int, Tuple[bool, Any]], counts: Any) -> None:
        """Gives the parameters that no rank used their .grad of before the backward (reading the map back is
        a host synchronization, as DDP's)."""
        if self._cuda:
            torch.cuda.current_stream(self._torch_device).synchronize()
        used = counts.tolist()
        with torch.no_grad():
            for i in missing:
                if used[i]:
                    continue
                is_view, kept = before[i]
                if is_view:
                    self._views[i].copy_(kept)
                else:
                    self._params[i].grad = kept

    def _abort(self, why: str) -> None:
        """Aborts the group: the other ranks' pending and later collectives fail at once, naming `why`."""
        if self._comm is not None:
            try:
                self._group.abort(why)
            except Exception:  # noqa: BLE001 - the group may be aborted already
                pass

    def _fail(self, why: str) -> None:
        self._error = f"ferry.torch.DataParallel (rank {self.rank} of {self.world_size}): {why}"
        self._abort(self._error)
        raise RuntimeError(self._error)

    # ---- collectives ---------------------------------------------------------------------------------
    def _broadcast(self, tensors: List[Any]) -> None:
        """Rank 0's values of `tensors` on every rank: their bytes packed into chunks of about 256 MiB, one
        broadcast each (as 64-bit words: any dtype crosses bit for bit)."""
        if self.world_size == 1 or not tensors:
            return
        chunks: List[List[Any]] = [[]]
        size = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if chunks[-1] and size + n > 256 << 20:
                chunks.append([])
                size = 0
            chunks[-1].append(t)
            size += n
        for chunk in chunks:
            flat = torch.cat([c.detach().contiguous().view(-1).view(torch.uint8) for c in chunk])
            pad = (-flat.numel()) % 8
            if pad:
                flat = torch.cat([flat, flat.new_zeros(pad)])
            self._group.broadcast(flat.data_ptr(), flat.data_ptr(), flat.numel() // 8, dtype="i64", root=0,
                                  stream=self._stream())
            if not self._cuda:
                self._host_stream.synchronize()
            at = 0
            for c in chunk:
                n = c.numel() * c.element_size()
                c.copy_(flat[at:at + n].view(c.dtype).view(c.shape))
                at += n

    # ---- state ---------------------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """The reducer's plan and counters: {"buckets", "bucket_bytes", "codecs", "steps", "learning",
        "decided" (the automatic plan's choice, or None while it learns), ...}."""
        self._check_usable()
        s = self._red.stats()
        s["plan"] = {"buckets": s["buckets"], "bucket_bytes": s["bucket_bytes"],
                     "lossy_buckets": sum(c != "none" for c in s["codecs"])}
        return s

    def _check_usable(self) -> None:
        _runtime.check_owner(self, self._pid)
        if self._closed:
            raise RuntimeError("ferry.torch.DataParallel: closed")
        if self._error is not None:
            raise RuntimeError(f"{self._error} (the step could not be finished; make a new DataParallel)")

    def close(self) -> None:
        """Releases the group. The parameters' .grad stay readable (copied out of ferry's buffer); another
        reference to a gradient taken before (g = p.grad) points into ferry's buffer, freed here: clone
        what you keep, as for a change of plan."""
        if getattr(self, "_closed", True) or _runtime.current_pid() != self._pid:
            return
        self._closed = True
        # The hooks first, before anything that can raise: they point at the reducer freed below.
        for h in self._hooks:
            (h[1] if isinstance(h, tuple) else h).remove()
        self._hooks = []
        half_step = False
        try:
            half_step = self._step_open and self._red is not None and self._red.hook_state().marks > 0
        except Exception:  # noqa: BLE001 - a reducer already ended (a collected cycle) is no half step
            pass
        if half_step or _runtime.exiting_on_interrupt():
            # Half a step, or a Ctrl-C: the other ranks learn at once instead of at their timeout, and the
            # waits below end.
            self._abort(f"rank {self.rank} closed its DataParallel during a step or after an interrupt")
        with torch.no_grad():
            for p, v in zip(self._params, self._views):
                if p.grad is not None and p.grad.data_ptr() == v.data_ptr():
                    p.grad = v.clone()
        if self._cuda:
            torch.cuda.current_stream(self._torch_device).synchronize()
        self._views, self._flat = [], None
        red, self._red = self._red, None
        if red is not None:
            red.close()
        self._comm = None
        if self._group is not None:
            self._group.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer reports nothing
            pass
