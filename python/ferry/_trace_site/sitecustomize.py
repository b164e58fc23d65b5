"""`ferry trace`'s automatic annotation of PyTorch training loops (domain "ferry.python").

`ferry trace -- CMD` puts this folder first on PYTHONPATH, so every Python process of the recorded
program (DataLoader workers under fork, spawn or forkserver included) imports this module at start-up.
It first runs the sitecustomize it shadows, then, only when FERRY_TRACE_PYTHON=1, FERRY_TRACE_INJECT
names libferry_inject.so (the names of include/ferry/trace/inject.h) and that library says this process records, patches torch as the program
imports it (torch itself is never imported here) and hands finished ranges to the library:

  "wait for a batch (DataLoader)"   the loop waits in the DataLoader iterator's _next_data
  "DataLoader fetch (worker N)"     a worker's dataset fetch (__getitem__ and collate); "(main process)"
                                    when num_workers=0
  "DataLoader pin_memory"           pinning one batch (the pin-memory thread, or the loop at num_workers=0)
  "forward (ClassName)"             the outermost nn.Module call on a thread (nested calls are not ranges)
  "backward"                        torch.autograd.backward, which Tensor.backward calls
  "optimizer.step (ClassName)"      an optimizer step (the outermost one on a thread)

Steps: each optimizer step ends training step i (0-based, per process), and so does a GradScaler.step
that skipped the optimizer step (inf/NaN gradients); step i spans from the end of step i-1 to that end,
and step 0 from the start of the first range this process recorded (normally its first batch wait or
forward). An optimizer step that raises ends no step. Several optimizers stepping in one iteration end
one step each.

Annotation never changes what the program sees: an exception raised in a wrapped call propagates
unchanged (its range is still recorded), and any failure of this machinery turns it off for the process
(FERRY_TRACE_DEBUG=1 prints why, once, to stderr).
"""
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    """Runs the next `sitecustomize` on sys.path after this folder (Debian ships one), as site.py would."""
    try:
        # The frozen import system is always loaded; the importlib package would add its imports
        # (warnings; importlib.util adds contextlib and collections) to every start-up.
        bootstrap = sys.modules.get("_frozen_importlib")
        external = sys.modules.get("_frozen_importlib_external")
        if bootstrap is None or external is None:
            import importlib.machinery as external
            import importlib.util as bootstrap
        here = os.path.dirname(os.path.realpath(__file__))
        real = [os.path.realpath(p or os.curdir) for p in sys.path]
        after = real.index(here) + 1 if here in real else 0
        rest = [p for p, r in zip(sys.path[after:], real[after:]) if r != here]
        spec = external.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = bootstrap.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py reports a failing sitecustomize the same way and goes on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)


_run_shadowed_sitecustomize()

# The protocol with the launcher and the library, include/ferry/trace/inject.h: its environment names and
# the ferry_inject_* functions in its order, (name, return type, argument types) as ctypes names (ctypes is
# imported only in a process that records). tests/python/test_trace_site.py proves them against the header.
_ENV_PYTHON = "FERRY_TRACE_PYTHON"
_ENV_INJECT = "FERRY_TRACE_INJECT"
_ENV_DEBUG = "FERRY_TRACE_DEBUG"
_FUNCTIONS = (
    ("ferry_inject_recording", "c_int", ()),
    ("ferry_inject_range", None, ("c_char_p", "c_char_p", "c_longlong", "c_longlong")),
    ("ferry_inject_step", None, ("c_longlong", "c_longlong", "c_longlong")),
)

_DOMAIN = b"ferry.python"
_debug = os.environ.get(_ENV_DEBUG) == "1"
_told = False
_on = False  # read by every wrapper: False passes calls straight through


def _say(why: str) -> None:
    global _told
    if _debug and not _told:
        _told = True
        print(f"ferry trace: no Python annotation in process {os.getpid()}: {why}", file=sys.stderr)


def _disable(exc: BaseException) -> None:
    global _on
    _on = False
    _say(f"{type(exc).__name__}: {exc}")


if os.environ.get(_ENV_PYTHON) == "1" and os.path.isfile(os.environ.get(_ENV_INJECT, "")):
    import functools
    import threading
    import time
    import types

    _now = time.monotonic_ns  # CLOCK_MONOTONIC, the library's clock

    class _Flags(threading.local):
        """Per-thread state: which annotated calls are running (their nested calls are not ranges)."""
        forward = False
        backward = False
        batch = False
        fetch = False
        pin = False
        step = False
        scaler = False

        def __init__(self) -> None:
            self.optimizers = []  # (optimizer, start) of the steps running, outermost first

    _tls = _Flags()
    _step_lock = threading.Lock()
    _step_index = 0
    _step_end = None  # end of the last step (ns), None before step 0
    _first_start = None  # earliest start of a range recorded before step 0 ended
    _range_fn = None  # the library's ferry_inject_range and ferry_inject_step
    _step_fn = None
    _names = {}  # (kind, class or worker id) -> encoded range name

    def _emit(name: bytes, start: int, end: int) -> None:
        """Hands one finished range to the library; never raises."""
        global _first_start
        try:
            if _step_end is None and (_first_start is None or start < _first_start):
                _first_start = start
            _range_fn(name, _DOMAIN, start, end)
        except Exception as exc:
            _disable(exc)

    def _end_step(start: int, end: int) -> None:
        """Ends the current training step at `end` (an optimizer step that started at `start`)."""
        global _step_index, _step_end
        try:
            with _step_lock:
                index = _step_index
                _step_index += 1
                begin = _step_end if _step_end is not None else min(start, _first_start or start)
                _step_end = end
            _step_fn(index, begin, end)
        except Exception as exc:
            _disable(exc)

    def _name(kind: str, key, text) -> bytes:
        name = _names.get((kind, key))
        if name is None:
            name = _names[(kind, key)] = text().encode("utf-8", "replace")
        return name

    def _ranged(orig, flag: str, name_of):
        """`orig` wrapped: its outermost call on a thread is a range named name_of(args)."""
        def wrapper(*args, **kwargs):
            tls = _tls
            if not _on or getattr(tls, flag):
                return orig(*args, **kwargs)
            setattr(tls, flag, True)
            start = _now()
            try:
                return orig(*args, **kwargs)
            finally:
                setattr(tls, flag, False)
                try:
                    name = name_of(args)
                except Exception as exc:
                    _disable(exc)
                else:
                    _emit(name, start, _now())

        return _like(wrapper, orig)

    def _like(wrapper, orig):
        """`wrapper` with the name, doc and attributes of `orig`, marked as ferry's (never wrapped twice)."""
        functools.update_wrapper(wrapper, orig)
        wrapper._ferry_trace = True
        return wrapper

    def _wrap_method(cls, attr: str, flag: str, name_of) -> None:
        orig = cls.__dict__.get(attr)
        if orig is not None and not getattr(orig, "_ferry_trace", False):
            setattr(cls, attr, _ranged(orig, flag, name_of))

    # --- the patches, one per module, run right after the module executes ---

    def _patch_dataloader(module) -> None:
        wait = b"wait for a batch (DataLoader)"
        for cls in (module._SingleProcessDataLoaderIter, module._MultiProcessingDataLoaderIter):
            _wrap_method(cls, "_next_data", "batch", lambda args: wait)

    def _fetch_name(args) -> bytes:
        info = sys.modules["torch.utils.data._utils.worker"].get_worker_info()
        key = None if info is None else info.id
        return _name("fetch", key, lambda: "DataLoader fetch (main process)" if key is None
                     else f"DataLoader fetch (worker {key})")

    def _patch_fetch(module) -> None:
        for cls in (module._MapDatasetFetcher, module._IterableDatasetFetcher):
            _wrap_method(cls, "fetch", "fetch", _fetch_name)

    def _patch_pin_memory(module) -> None:
        # _pin_memory_loop and the single-process iterator call the module's global `pin_memory`, which
        # recurses through the same global: the flag keeps one range per batch.
        pin = b"DataLoader pin_memory"
        if not getattr(module.pin_memory, "_ferry_trace", False):
            module.pin_memory = _ranged(module.pin_memory, "pin", lambda args: pin)

    def _forward_name(module) -> bytes:
        cls = type(module)
        name = _names.get(("forward", cls))
        if name is None:
            shown = cls
            if cls.__name__ == "OptimizedModule":  # torch.compile's wrapper: name the compiled module
                inner = module.__dict__.get("_modules", {}).get("_orig_mod")
                shown = type(inner) if inner is not None else cls
            name = f"forward ({shown.__name__})".encode("utf-8", "replace")
            if shown is cls:
                _names[("forward", cls)] = name
        return name

    def _patch_module(module) -> None:
        cls = module.Module
        orig = cls.__dict__["__call__"]
        if getattr(orig, "_ferry_trace", False):
            return

        # The hot path of every nn.Module call, nested ones included: one thread-local read when a
        # forward is already running on this thread, no library call.
        def __call__(self, *args, **kwargs):
            tls = _tls
            if tls.forward or not _on:
                return orig(self, *args, **kwargs)
            tls.forward = True
            start = _now()
            try:
                return orig(self, *args, **kwargs)
            finally:
                tls.forward = False
                try:
                    name = _forward_name(self)
                except Exception as exc:
                    _disable(exc)
                else:
                    _emit(name, start, _now())

        cls.__call__ = _like(__call__, orig)

    def _patch_autograd(module) -> None:
        # Tensor.backward calls torch.autograd.backward through the module, so one patch covers both.
        backward = b"backward"
        if not getattr(module.backward, "_ferry_trace", False):
            module.backward = _ranged(module.backward, "backward", lambda args: backward)

    def _step_name(optimizer) -> bytes:
        cls = type(optimizer)
        return _name("step", cls, lambda: f"optimizer.step ({cls.__name__})")

    def _step_pre_hook(optimizer, args, kwargs) -> None:
        if not _on:
            return None
        try:
            running = _tls.optimizers
            # A step of this optimizer still on the stack raised (post hooks do not run then): drop it
            # and whatever started after it.
            for i, (o, _) in enumerate(running):
                if o is optimizer:
                    del running[i:]
                    break
            running.append((optimizer, _now()))
        except Exception as exc:
            _disable(exc)
        return None

    def _step_post_hook(optimizer, args, kwargs) -> None:
        end = _now()
        if not _on:
            return None
        try:
            running = _tls.optimizers
            for i in range(len(running) - 1, -1, -1):
                if running[i][0] is optimizer:
                    start = running[i][1]
                    del running[i:]
                    if not running:
                        _emit(_step_name(optimizer), start, end)
                        _end_step(start, end)
                    break
        except Exception as exc:
            _disable(exc)
        return None

    def _wrap_step(orig):
        def step(self, *args, **kwargs):
            tls = _tls
            if tls.step or not _on:
                return orig(self, *args, **kwargs)
            tls.step = True
            start = _now()
            ok = False
            try:
                out = orig(self, *args, **kwargs)
                ok = True
                return out
            finally:
                tls.step = False
                end = _now()
                try:
                    name = _step_name(self)
                except Exception as exc:
                    _disable(exc)
                else:
                    _emit(name, start, end)
                    if ok:
                        _end_step(start, end)

        return _like(step, orig)

    def _patch_optimizer(module) -> None:
        pre = getattr(module, "register_optimizer_step_pre_hook", None)
        post = getattr(module, "register_optimizer_step_post_hook", None)
        if pre is not None and post is not None:  # torch >= 2.0: global hooks around every step()
            pre(_step_pre_hook)
            post(_step_post_hook)
            return
        # torch 1.x: every Optimizer subclass is made after this module, so wrap each step() as its
        # class is created (the flag makes a subclass's super().step() part of the outer step).
        base = module.Optimizer
        before = base.__dict__.get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):
            if before is not None:
                before.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            try:
                _wrap_class_step(cls)
            except Exception as exc:
                _disable(exc)

        base.__init_subclass__ = classmethod(__init_subclass__)
        for cls in _subclasses(base):  # made before this patch (only when torch came first)
            _wrap_class_step(cls)

    def _wrap_class_step(cls) -> None:
        step = cls.__dict__.get("step")
        # A plain function only: a staticmethod or a callable object would not bind the same way.
        if isinstance(step, types.FunctionType) and not getattr(step, "_ferry_trace", False):
            cls.step = _wrap_step(step)

    def _patch_grad_scaler(module) -> None:
        # GradScaler.step skips optimizer.step() when the gradients hold inf/NaN (often in the first
        # steps of float16 training): that iteration still ends a training step.
        cls = getattr(module, "GradScaler", None)
        orig = None if cls is None else cls.__dict__.get("step")
        if not isinstance(orig, types.FunctionType) or getattr(orig, "_ferry_trace", False):
            return

        def step(self, *args, **kwargs):
            tls = _tls
            if tls.scaler or not _on:
                return orig(self, *args, **kwargs)
            tls.scaler = True
            start, before = _now(), _step_index
            ok = False
            try:
                out = orig(self, *args, **kwargs)
                ok = True
                return out
            finally:
                tls.scaler = False
                if ok and _step_index == before:
                    _end_step(start, _now())

        cls.step = _like(step, orig)

    def _subclasses(cls) -> list:
        out, pending = [], list(cls.__subclasses__())
        while pending:
            c = pending.pop()
            out.append(c)
            pending.extend(c.__subclasses__())
        return out

    _patches = {
        "torch.utils.data.dataloader": _patch_dataloader,
        "torch.utils.data._utils.fetch": _patch_fetch,
        "torch.utils.data._utils.pin_memory": _patch_pin_memory,
        "torch.nn.modules.module": _patch_module,
        "torch.autograd": _patch_autograd,
        "torch.optim.optimizer": _patch_optimizer,
        "torch.cuda.amp.grad_scaler": _patch_grad_scaler,  # torch 1.x and 2.x before 2.3
        "torch.amp.grad_scaler": _patch_grad_scaler,  # torch >= 2.3 (the cuda one subclasses it)
    }

    def _patch(fullname: str, module) -> None:
        try:
            _patches[fullname](module)
        except Exception as exc:  # this torch differs: leave the module as it is, keep the other patches
            _say(f"cannot annotate {fullname}: {type(exc).__name__}: {exc}")

    class _Loader:
        """The found loader, then the patch right after the module executes."""

        def __init__(self, loader, fullname: str) -> None:
            self._loader = loader
            self._fullname = fullname

        def create_module(self, spec):
            create = getattr(self._loader, "create_module", None)
            return create(spec) if create is not None else None

        def exec_module(self, module) -> None:
            # The module keeps the real loader (inspect, importlib.resources and pickling look at it).
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
            self._loader.exec_module(module)
            _patch(self._fullname, module)

        def __getattr__(self, name: str):
            if name == "_loader":  # not set yet (a copy made without __init__): no recursion
                raise AttributeError(name)
            return getattr(self._loader, name)

    class _Finder:
        """A sys.meta_path entry that asks the other finders and wraps the loader of a patched module."""

        def __init__(self) -> None:
            self._finding: set = set()

        def find_spec(self, fullname, path=None, target=None):
            if fullname not in _patches or fullname in self._finding:
                return None
            self._finding.add(fullname)
            try:
                for finder in sys.meta_path:
                    find = getattr(finder, "find_spec", None)
                    if finder is self or find is None:
                        continue
                    spec = find(fullname, path, target)
                    if spec is not None:
                        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                            spec.loader = _Loader(spec.loader, fullname)
                        return spec
                return None
            finally:
                self._finding.discard(fullname)

    def _after_fork_in_child() -> None:
        global _tls, _step_lock, _step_index, _step_end, _first_start, _on
        # The child has one thread, a new trace and no steps yet; its flags may say a call is running.
        _tls = _Flags()
        _step_lock = threading.Lock()
        _step_index, _step_end, _first_start = 0, None, None
        if _on:
            try:
                _on = _recording() == 1
            except Exception as exc:
                _disable(exc)

    def _start() -> None:
        global _on, _range_fn, _step_fn, _recording
        import ctypes

        # PyDLL keeps the GIL across the call: a CDLL call would release it, and taking it back while
        # another Python thread runs can cost the training loop a whole switch interval (5 ms).
        lib = ctypes.PyDLL(os.environ[_ENV_INJECT])
        fns = {}
        for name, restype, argtypes in _FUNCTIONS:
            fn = getattr(lib, name)
            fn.restype = None if restype is None else getattr(ctypes, restype)
            fn.argtypes = [getattr(ctypes, a) for a in argtypes]
            fns[name] = fn
        _recording, _range_fn, _step_fn = (fns["ferry_inject_recording"], fns["ferry_inject_range"],
                                           fns["ferry_inject_step"])
        if _recording() != 1:
            _say("the library does not record this process")
            return
        _on = True
        os.register_at_fork(after_in_child=_after_fork_in_child)
        sys.meta_path.insert(0, _Finder())
        for fullname in _patches:  # imported before this ran (not at start-up, but cheap to cover)
            if fullname in sys.modules:
                _patch(fullname, sys.modules[fullname])

    try:
        _start()
    except Exception as _exc:
        _disable(_exc)
