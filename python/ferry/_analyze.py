"""ferry.analyze and ferry.probe: the CLI's `ferry analyze` and `ferry probe` as Python objects."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

from ._device import Device, default_device
from ._native import analysis as _native


@dataclass
class Step:
    """What one step's GPU time went to (milliseconds); the same fields as `ferry analyze --json`."""
    index: int
    start_ns: int
    end_ns: int
    wall_ms: float
    compute_ms: float
    h2d_ms: float
    d2h_ms: float
    d2d_ms: float
    comm_ms: float
    idle_ms: float
    utilization: float
    copy_overlap: float
    h2d_bytes: int
    d2h_bytes: int


@dataclass
class IdleAttribution:
    """The CPU activity that covered GPU idle time. `work` is what the activity is, which decides the advice:
    data, output, user (work that could move off the launching thread), framework, launch, allocator,
    copy, sync, host_wait or runtime."""
    thread: str
    activity: str
    idle_ms: float
    fraction_of_idle: float
    thread_id: int = 0
    blocking: bool = False
    main_thread: bool = False
    work: str = ""


@dataclass
class Neighbour:
    """An activity of the main thread just before or after GPU idle time that nothing covered."""
    activity: str
    gaps: int
    idle_ms: float


@dataclass
class Uncovered:
    """GPU idle time no recorded CPU activity covered, in `gaps` stretches, with the main thread's activities
    that most often end just before (`before`) and start just after (`after`) them."""
    idle_ms: float = 0.0
    fraction_of_idle: float = 0.0
    gaps: int = 0
    before: List[Neighbour] = field(default_factory=list)
    after: List[Neighbour] = field(default_factory=list)


@dataclass
class Finding:
    """One finding: `rule` is its stable id (gpu_idle, pageable_async_copy, sync_copy, ...). `cause`, for
    gpu_idle, is the kind of the activity it names as the cause (IdleAttribution.work), "" when none."""
    rule: str
    title: str
    evidence: str
    fix: str
    cost_ms_per_step: float
    numbers: Dict[str, float] = field(default_factory=dict)
    cause: str = ""


T = TypeVar("T")


def _build(cls: Type[T], d: Dict[str, Any]) -> T:
    """A dataclass from one object of a JSON result. A key it has no field for is left out here (a newer
    library than the package); tests/python/test_analyze_schema.py fails on every such key of ferry's own
    library, so the package learns each key the C++ writes."""
    names = cls.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in d.items() if k in names})


def _uncovered(d: Dict[str, Any]) -> Uncovered:
    u = _build(Uncovered, d)
    u.before = [_build(Neighbour, x) for x in d.get("before", [])]
    u.after = [_build(Neighbour, x) for x in d.get("after", [])]
    return u


class Analysis:
    """The analysis of one trace: `steps`, `mean`, `idle`, `uncovered`, `findings` (costliest first),
    `bottleneck`; str() is the CLI's text report and to_html(path) writes its standalone HTML report.
    The attributes are the keys of `ferry analyze --json` (`raw` holds that JSON as parsed)."""

    # Each key of the JSON, and the class of each object under it (tests/python/test_analyze_schema.py).
    SCHEMA: Dict[str, Any] = {
        "source": str, "device_name": str, "dropped": int, "skipped": dict, "step_prefix": str,
        "main_thread": str, "main_thread_rule": str, "bottleneck": str, "mean": Step, "steps": [Step],
        "idle": [IdleAttribution], "uncovered": {"": Uncovered, "before": [Neighbour], "after": [Neighbour]},
        "findings": [Finding],
    }

    def __init__(self, native: _native.Analysis) -> None:
        self._native = native
        self.raw: Dict[str, Any] = native.result
        self.source: str = self.raw.get("source", "")
        self.device_name: str = self.raw.get("device_name", "")
        self.step_prefix: str = self.raw.get("step_prefix", "")
        self.main_thread: str = self.raw.get("main_thread", "")
        # How the main thread was chosen: step_spans, tid_is_pid, most_annotations, most_api_calls, ...
        self.main_thread_rule: str = self.raw.get("main_thread_rule", "")
        self.bottleneck: str = self.raw.get("bottleneck", "")
        self.dropped: int = self.raw.get("dropped", 0)
        self.skipped: Dict[str, int] = dict(self.raw.get("skipped", {}))
        self.steps: List[Step] = [_build(Step, s) for s in self.raw.get("steps", [])]
        self.mean: Optional[Step] = _build(Step, self.raw["mean"]) if "mean" in self.raw else None
        self.idle: List[IdleAttribution] = [_build(IdleAttribution, x) for x in self.raw.get("idle", [])]
        self.uncovered: Uncovered = _uncovered(self.raw.get("uncovered", {}))
        self.findings: List[Finding] = [_build(Finding, f) for f in self.raw.get("findings", [])]

    def to_html(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the standalone HTML report (the same as `ferry analyze --html`)."""
        self._native.write_html(os.fspath(path))

    def to_json(self) -> str:
        return self._native.json()

    def __str__(self) -> str:
        return self._native.text()

    def __repr__(self) -> str:
        return f"<ferry.Analysis of {self.source!r}: {len(self.steps)} steps, bottleneck {self.bottleneck!r}>"


def analyze(path: Union[str, "os.PathLike[str]", Any], step_prefix: str = "", idle_threshold: float = 0.10,
            link_h2d_gbps: float = 0.0, link_d2h_gbps: float = 0.0) -> Analysis:
    """Analyzes a trace: ferry's (`ferry bench --trace`) or a PyTorch profiler export
    (`prof.export_chrome_trace(path)`); a `torch.profiler.profile` object is exported to a temporary
    file first. The arguments are those of `ferry analyze`."""
    if hasattr(path, "export_chrome_trace"):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            file = os.path.join(tmp, "trace.json")
            path.export_chrome_trace(file)
            return analyze(file, step_prefix, idle_threshold, link_h2d_gbps, link_d2h_gbps)
    if not 0.0 <= idle_threshold <= 1.0:
        raise ValueError(f"ferry.analyze(idle_threshold={idle_threshold}): expected a fraction in [0, 1]")
    return Analysis(_native.Analysis(os.fspath(path), step_prefix=step_prefix, idle_threshold=idle_threshold,
                                     link_h2d_gbps=link_h2d_gbps, link_d2h_gbps=link_d2h_gbps))


@dataclass
class Link:
    """One measured link of `ferry.probe()`; bandwidths in decimal GB/s (medians over the iterations)."""
    name: str
    direction: str
    host_memory: str
    bytes: int
    iterations: int
    median_gbps: float
    min_gbps: float
    max_gbps: float
    checked: bool


class ProbeResult:
    """What `ferry.probe()` measured: `device`, `links`, `both_directions`, `pin_cost` (None when not
    measured), `memlock` and `options`; str() is the CLI's table. `raw` is the result as parsed, the same
    as `ferry probe --json` less its run stamp."""

    # Each key of the result, and the class of each object under it (tests/python/test_analyze_schema.py).
    SCHEMA: Dict[str, Any] = {"device": dict, "memlock": dict, "options": dict, "links": [Link],
                              "both_directions": dict, "pin_cost": dict, "table": str}

    def __init__(self, raw: Dict[str, Any]) -> None:
        self.raw = raw
        self.device: Dict[str, Any] = raw["device"]
        self.links: List[Link] = [_build(Link, x) for x in raw["links"]]
        self.both_directions: Dict[str, Any] = raw["both_directions"]
        self.pin_cost: Optional[Dict[str, Any]] = raw.get("pin_cost")
        self.memlock: Dict[str, Any] = raw.get("memlock", {})
        self.options: Dict[str, Any] = raw.get("options", {})

    def link(self, name: str) -> Link:
        for x in self.links:
            if x.name == name:
                return x
        raise KeyError(f"no link named {name!r}; measured: {[x.name for x in self.links]}")

    def __str__(self) -> str:
        return self.raw["table"]


def probe(device: Union[Device, str, None] = None, copy_bytes: int = 0, iterations: int = 0, warmup: int = 0,
          pin_bytes: int = 0) -> ProbeResult:
    """Measures the host-device links of `device` (a Device, a backend name, or None for "auto"), as
    `ferry probe`; zeros take the backend's defaults."""
    dev = device if isinstance(device, Device) else default_device(device or "auto")
    for name, v in (("copy_bytes", copy_bytes), ("iterations", iterations), ("warmup", warmup),
                    ("pin_bytes", pin_bytes)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"ferry.probe({name}={v!r}): expected an integer >= 0 (0: the default)")
    return ProbeResult(_native.probe(dev._native, copy_bytes=copy_bytes, warmup=warmup, iterations=iterations,
                                     pin_bytes=pin_bytes))
