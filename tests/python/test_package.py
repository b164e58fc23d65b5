"""The distribution ferry-gpu: one version, the `ferry` command and `python -m ferry` (the bundled CLI, its
exit status and signals), what an install without nvcc says (setup.py) and what ferry.Device("cuda")
says on such an install. Under scripts/test.sh (FERRY_EXPECT_INSTALLED=1) the package is pip's."""
import importlib.metadata
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import ferry
from ferry import _c, _cli, _device
from ferry._native import device as native_device

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = bool(os.environ.get("FERRY_EXPECT_INSTALLED"))


def python_m_ferry(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def needs_cli():
    if _cli.cli_path() is None:
        pytest.skip("no ferry CLI: bundled by pip, or named by FERRY_CLI (ctest and scripts/test.sh set it)")


def load_setup():
    """setup.py as a module, without running setup()."""
    spec = importlib.util.spec_from_file_location("ferry_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- the ferry command and python -m ferry

def test_python_m_ferry_runs_the_cli_with_its_arguments():
    needs_cli()
    r = python_m_ferry("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ferry {ferry.library_version}"
    r = python_m_ferry("probe", "--backend", "host", "--bytes", "1MiB", "--iterations", "1")
    assert r.returncode == 0, r.stderr
    assert "pinned H2D" in r.stdout


def test_the_clis_exit_status_comes_through():
    needs_cli()
    r = python_m_ferry("probe", "--backend", "host", "--no-such-flag")
    assert r.returncode == 2, (r.returncode, r.stderr)  # the CLI's usage status
    assert "ferry: error:" in r.stderr and "--no-such-flag" in r.stderr


def test_the_cli_replaces_python_so_ctrl_c_reaches_it():
    # The CLI runs as this very process (exec, not a child): the signals a terminal sends go to it, and
    # its status (130 after a second Ctrl-C) is the command's.
    needs_cli()
    p = subprocess.Popen([sys.executable, "-m", "ferry", "bench", "egress", "--backend", "host", "--levels",
                          "ideal", "--steps", "1000000", "--warmup", "0", "--probed-d2h", "1", "--shape",
                          "1x1x8x8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A guard against a hang only: a CLI that never prints what the reads below wait for is killed, and
    # the test fails on its status instead of waiting for ctest's timeout.
    guard = threading.Timer(120, p.kill)
    guard.start()
    try:
        for line in p.stderr:  # the ladder has started: the CLI's handlers are installed
            if line.startswith("bench: ideal:"):
                break
        assert Path(os.readlink(f"/proc/{p.pid}/exe")).resolve() == _cli.cli_path().resolve()
        p.send_signal(signal.SIGINT)  # the first finishes the level (a million steps) ...
        for line in p.stderr:
            if "interrupted" in line:
                break
        p.send_signal(signal.SIGINT)  # ... the second stops at once
        p.wait(timeout=60)
        assert p.returncode == 130, (p.returncode, p.stderr.read())
    finally:
        guard.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def test_without_the_cli_the_command_says_what_to_do(monkeypatch, capsys):
    monkeypatch.setattr(_cli, "cli_path", lambda: None)
    monkeypatch.setenv("FERRY_CLI", "/nonexistent/ferry")
    with pytest.raises(SystemExit) as e:
        _cli.main(["--version"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "ferry's command-line tool is not installed" in err
    assert "FERRY_CLI=/nonexistent/ferry is not a file" in err and "pip install ." in err


def test_ferry_cli_names_the_tool_in_a_source_checkout(tmp_path):
    if INSTALLED:
        pytest.skip("the bundled CLI comes first")
    r = python_m_ferry("--version", env={**os.environ, "FERRY_CLI": str(tmp_path / "missing")})
    assert r.returncode == 1 and f"FERRY_CLI={tmp_path / 'missing'} is not a file" in r.stderr


# --- what pip installed

def test_the_installed_distribution():
    if not INSTALLED:
        pytest.skip("scripts/test.sh's pip-installed run")
    package = Path(ferry.__file__).parent
    assert importlib.metadata.version("ferry-gpu") == ferry.__version__  # what `pip show ferry-gpu` prints
    assert (package / "py.typed").is_file()
    assert _cli.cli_path() == package / "ferry" and os.access(package / "ferry", os.X_OK)
    # Every package of the source tree is installed (pyproject.toml finds them): each imports from pip's copy.
    source = ROOT / "python" / "ferry"
    for init in sorted(source.rglob("__init__.py")):
        name = ".".join(("ferry",) + init.parent.relative_to(source).parts)
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().is_relative_to(package.resolve()), (name, module.__file__)
    script = Path(sys.executable).parent / "ferry"  # the console script
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"ferry {ferry.library_version}", r


def test_the_package_ships_py_typed():
    assert (Path(ferry.__file__).parent / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


# --- a library built without the CUDA toolkit

def no_cuda_message() -> str:
    """What src/cuda/no_cuda.cpp's make_cuda_device throws, its string literals joined."""
    src = (ROOT / "src" / "cuda" / "no_cuda.cpp").read_text()
    body = re.search(r"make_cuda_device\(int ordinal\)\s*\{(.*?)\n\}", src, re.S).group(1)
    return "".join(re.findall(r'"([^"]*)"', body))


def test_device_cuda_on_a_host_only_library_says_what_to_do(monkeypatch):
    message = no_cuda_message()
    assert _device.NO_CUDA_MARK in message, message
    assert load_setup().NO_CUDA_MARK.decode() == _device.NO_CUDA_MARK

    class HostOnly:  # the library of an install without nvcc, as far as ferry_device_create goes
        def ferry_device_create(self, backend, ordinal, out):
            raise _c.InvalidArgumentError(message, _c.STATUS["FERRY_ERROR_INVALID"])

    monkeypatch.setattr(native_device, "lib", HostOnly())
    with pytest.raises(ferry.InvalidArgumentError) as e:
        ferry.Device("cuda")
    text = str(e.value)
    assert "ferry.Device('cuda', 0): this ferry was built without CUDA" in text
    assert "nvcc" in text and "FERRY_REQUIRE_CUDA=1 python3 -m pip install" in text
    assert 'ferry.Device("host")' in text


def test_other_device_errors_are_left_as_they_are():
    host_only = _device.NO_CUDA_MARK.encode() in Path(ferry.library_path).read_bytes()
    try:
        ferry.Device("cuda")
    except ferry.FerryError as e:  # no GPU here: the library's own message, unless it has no cuda backend
        assert ("FERRY_REQUIRE_CUDA=1" in str(e)) == host_only, e
    with pytest.raises(ferry.InvalidArgumentError, match="host backend has one device"):
        ferry.Device("host", 3)


# --- setup.py: an install without nvcc

@pytest.fixture
def setup_py(monkeypatch, tmp_path):
    mod = load_setup()
    monkeypatch.setattr(mod, "TTY", str(tmp_path / "tty"))  # stands in for the terminal
    for name in ("FERRY_PREBUILT_LIBRARY", "FERRY_PREBUILT_CLI", "FERRY_REQUIRE_CUDA"):
        monkeypatch.delenv(name, raising=False)
    return mod


def prebuilt_files(tmp_path, cuda: bool):
    library = tmp_path / "libferry_c.so"
    library.write_bytes(b"\x7fELF..." + (b"" if cuda else b"ferry was built without the CUDA toolkit (host)"))
    cli = tmp_path / "ferry"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    return library, cli


def test_an_install_without_nvcc_warns_on_the_terminal_and_stderr(setup_py, monkeypatch, tmp_path, capfd):
    library, cli = prebuilt_files(tmp_path, cuda=False)
    monkeypatch.setenv("FERRY_PREBUILT_LIBRARY", str(library))
    monkeypatch.setenv("FERRY_PREBUILT_CLI", str(cli))
    assert setup_py.prebuilt() == (library, cli)
    err = capfd.readouterr().err
    tty = (tmp_path / "tty").read_text()
    for text in (err, tty):  # pip -q hides stderr unless the build fails; the terminal sees it
        assert "ferry-gpu: WARNING:" in text and "WITHOUT its cuda backend" in text
        assert "FERRY_REQUIRE_CUDA=1 python3 -m pip install --force-reinstall --no-deps ." in text


def test_ferry_require_cuda_fails_such_an_install(setup_py, monkeypatch, tmp_path):
    library, cli = prebuilt_files(tmp_path, cuda=False)
    monkeypatch.setenv("FERRY_PREBUILT_LIBRARY", str(library))
    monkeypatch.setenv("FERRY_PREBUILT_CLI", str(cli))
    monkeypatch.setenv("FERRY_REQUIRE_CUDA", "1")
    with pytest.raises(SystemExit, match="FERRY_REQUIRE_CUDA=1, but the prebuilt library"):
        setup_py.prebuilt()
    library, cli = prebuilt_files(tmp_path, cuda=True)  # a library with the cuda backend passes, silently
    assert setup_py.prebuilt() == (library, cli)
    assert not (tmp_path / "tty").exists()


def test_one_prebuilt_file_without_the_other_is_refused(setup_py, monkeypatch, tmp_path):
    library, _ = prebuilt_files(tmp_path, cuda=True)
    monkeypatch.setenv("FERRY_PREBUILT_LIBRARY", str(library))
    with pytest.raises(SystemExit, match="FERRY_PREBUILT_LIBRARY is set but FERRY_PREBUILT_CLI is not"):
        setup_py.prebuilt()


def test_the_configure_step_tells_why_a_build_is_host_only(setup_py, tmp_path):
    def reason(cache, output):
        (tmp_path / "CMakeCache.txt").write_text(cache)
        return setup_py.host_only_reason(setup_py.cache_entries(tmp_path), output)

    off = "-- ferry: no CUDA compiler found; building the host backend only\n" \
          "-- ferry: cuda backend OFF, NVTX OFF, sanitizer ''\n"
    on = "-- ferry: cuda backend ON, NVTX ON, sanitizer ''\n"
    assert reason("FERRY_WITH_CUDA:BOOL=ON\n", off) == "no nvcc"
    assert reason("FERRY_WITH_CUDA:BOOL=ON\n", on) is None
    assert reason("FERRY_WITH_CUDA:BOOL=OFF\n", off) == "asked"
    # The status line setup.py reads is CMakeLists.txt's.
    assert 'message(STATUS "ferry: cuda backend ${FERRY_HAVE_CUDA},' in (ROOT / "CMakeLists.txt").read_text()
