"""The analyzer and the probe (ferry_analyze_file, ferry_analysis, ferry_probe_run) as native objects."""
from __future__ import annotations

import json
import os
from ctypes import byref
from typing import Any, Dict

from .._c import AnalysisHandle, lib
from ._base import NativeObject
from .device import Device
from .library import out_json


class Analysis(NativeObject[AnalysisHandle]):
    """ferry_analysis: one trace analyzed. `result` is its JSON (`ferry analyze --json`) as parsed."""

    def __init__(self, path: str, *, step_prefix: str, idle_threshold: float, link_h2d_gbps: float,
                 link_d2h_gbps: float) -> None:
        h = AnalysisHandle()
        lib.ferry_analyze_file(os.fspath(path).encode(), step_prefix.encode(), float(idle_threshold),
                               float(link_h2d_gbps), float(link_d2h_gbps), byref(h))
        super().__init__(h)
        self.result: Dict[str, Any] = json.loads(self.json())

    def _destroy(self, handle: AnalysisHandle) -> None:
        lib.ferry_analysis_destroy(handle)

    def json(self) -> str:
        """The result as the library wrote it (`ferry analyze --json`)."""
        return lib.ferry_analysis_json(self.handle).decode("utf-8")

    def text(self) -> str:
        """The CLI's text report."""
        return lib.ferry_analysis_text(self.handle).decode("utf-8")

    def write_html(self, path: str) -> None:
        """Writes the standalone HTML report (`ferry analyze --html`)."""
        lib.ferry_analysis_write_html(self.handle, os.fspath(path).encode())


def probe(device: Device, *, copy_bytes: int, warmup: int, iterations: int, pin_bytes: int) -> Dict[str, Any]:
    """What ferry_probe_run measured on `device` (`ferry probe --json` less its run stamp); zeros take the
    backend's defaults."""
    return out_json(lib.ferry_probe_run, device.handle, copy_bytes, warmup, iterations, pin_bytes)
