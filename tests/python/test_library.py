"""ferry.__version__, devices, probe and analyze against the CLI."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import ferry

ROOT = Path(__file__).resolve().parents[2]


def source_version_module():
    """python/ferry/_version.py of the source tree (an installed package has the literal in its place)."""
    import runpy
    return runpy.run_path(str(ROOT / "python" / "ferry" / "_version.py"))


KINETO = ROOT / "tests" / "trace" / "data" / "kineto_naive.json"
# PEP 440's canonical public version, and a local label (the commit) after a "+".
PUBLIC = r"(?:\d+!)?\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?"
LOCAL = r"\+[a-z0-9]+(?:\.[a-z0-9]+)*"


def test_one_version_for_the_package_the_library_and_the_cli():
    # CMakeLists.txt's project version is the one source: the package's, and the library's before its
    # commit label (what `ferry --version` prints).
    assert re.fullmatch(PUBLIC, ferry.__version__), ferry.__version__
    assert re.fullmatch(PUBLIC + f"(?:{LOCAL})?", ferry.library_version), ferry.library_version
    assert ferry.library_version.split("+")[0] == ferry.__version__
    assert ferry.__version__ == source_version_module()["version_of"](ROOT / "CMakeLists.txt")
    cli = os.environ.get("FERRY_CLI")
    if cli:
        out = subprocess.run([cli, "--version"], check=True, capture_output=True, text=True).stdout
        assert out.strip() == f"ferry {ferry.library_version}"


def test_the_version_parser_reads_the_project_line(tmp_path):
    version_of = source_version_module()["version_of"]
    cmake = tmp_path / "CMakeLists.txt"
    cmake.write_text('cmake_minimum_required(VERSION 3.25)\nproject(ferry VERSION 2.10.3 DESCRIPTION "x")\n')
    assert version_of(cmake) == "2.10.3"
    cmake.write_text("project(other VERSION 1.0)\n")
    with pytest.raises(RuntimeError, match="no `project\\(ferry VERSION"):
        version_of(cmake)


def test_the_library_is_found():
    assert os.path.basename(ferry.library_path) == "libferry_c.so"
    if os.environ.get("FERRY_EXPECT_INSTALLED"):  # scripts/test.sh's pip-installed run
        assert Path(ferry.library_path).parent == Path(ferry.__file__).parent


def test_device_reports_its_backend(device, backend):
    assert device.backend == backend
    assert device.name
    s = device.stream()
    s.synchronize()
    assert s.handle != 0


def test_bad_device_arguments_name_the_value():
    with pytest.raises(ValueError, match="'gpu'"):
        ferry.Device("gpu")
    with pytest.raises(ferry.InvalidArgumentError, match="host backend has one device"):
        ferry.Device("host", 3)


def test_probe_on_the_host_backend_measures_every_link():
    r = ferry.probe("host", copy_bytes=1 << 20, iterations=2, warmup=1, pin_bytes=1 << 20)
    assert r.device["backend"] == "host"
    names = {x.name for x in r.links}
    assert {"pinned H2D", "pinned D2H"} <= names, names
    assert all(x.median_gbps > 0 and x.checked for x in r.links)
    assert "pinned H2D" in str(r)


def test_analyze_gives_the_clis_findings_as_objects(tmp_path):
    a = ferry.analyze(KINETO)
    assert a.steps and a.findings and a.bottleneck == a.findings[0].rule
    assert isinstance(a.findings[0], ferry.Finding) and a.findings[0].fix
    cli = os.environ.get("FERRY_CLI")
    if cli:  # the same JSON as `ferry analyze --json`
        out = json.loads(subprocess.check_output([cli, "analyze", str(KINETO), "--json"]))
        assert [f["rule"] for f in out["findings"]] == [f.rule for f in a.findings]
        assert [f["cost_ms_per_step"] for f in out["findings"]] == [f.cost_ms_per_step for f in a.findings]
        assert out["mean"]["idle_ms"] == a.mean.idle_ms
    assert "'make batch'" in str(a)
    html = tmp_path / "report.html"
    a.to_html(html)
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text


def test_analyze_refuses_a_missing_file_naming_it(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ferry.FerryError, match="nope.json"):
        ferry.analyze(missing)
    with pytest.raises(ValueError, match="idle_threshold=2"):
        ferry.analyze(KINETO, idle_threshold=2)
