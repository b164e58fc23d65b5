"""`ferry trace -- CMD` on process trees, without a GPU: every process gets its own file, nothing hangs,
the exit status comes through, a fork child does not repeat its parent's events, blocking calls are
recorded with their lengths and callers, NVTX ranges are recorded in any process, the CUDA driver's
injection contract holds without CUPTI, a SIGKILL loses at most one flush interval, every other way out of
src/inject/exit.cpp's table (return from main, exit, quick_exit, glibc's own exit, a pthread_exit main,
_exit, SIGTERM) writes the exit line and leaves no CUPTI call after the CUDA runtime's teardown, and the
recording merges and analyzes.

Run by ctest (`inject`, label cpu) with FERRY_CLI, FERRY_INJECT_FIXTURE (tests/inject/tree_fixture.cpp)
and FERRY_INJECT_LIBRARY set. Every run has a timeout: a hang fails the test rather than the CI job.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CLI = os.environ.get("FERRY_CLI")
FIXTURE = os.environ.get("FERRY_INJECT_FIXTURE")
LIBRARY = os.environ.get("FERRY_INJECT_LIBRARY")
pytestmark = pytest.mark.skipif(not (CLI and FIXTURE and LIBRARY),
                                reason="FERRY_CLI, FERRY_INJECT_FIXTURE and FERRY_INJECT_LIBRARY are not set "
                                       "(ctest sets them)")
# A liveness guard, not a speed check: each recording here takes about a second.
TIMEOUT = 120
KINDS = ["kernel", "memcpy", "memset", "sync", "api", "range", "stage"]


def interposed_calls():
    """The names of src/inject/os_calls.def, the one list of the C library calls ferry trace interposes."""
    import re
    text = (Path(__file__).resolve().parents[2] / "src" / "inject" / "os_calls.def").read_text()
    return re.findall(r"^FERRY_OS_CALL\(\s*[^,]+,\s*(\w+)", text, flags=re.M)


def test_every_interposed_call_is_exported_by_the_library():
    """A wrapper that the export map leaves out is never called: a program's pread went unseen while the
    map, kept by hand, listed only pread64. The built library's dynamic symbols hold every name."""
    names = interposed_calls()
    assert len(names) >= 40 and "pread" in names and "pwrite" in names
    out = subprocess.run(["nm", "-D", "--defined-only", LIBRARY], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    missing = [n for n in names if n not in exported]
    assert not missing, f"{LIBRARY} does not export {missing}"


def record(out, *cmd, flags=(), env=None, timeout=TIMEOUT):
    full_env = dict(os.environ, FERRY_INJECT_LIBRARY=LIBRARY)
    full_env.pop("CUDA_INJECTION64_PATH", None)
    full_env.update(env or {})
    return subprocess.run([CLI, "trace", "-o", str(out), *flags, "--", *cmd], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def unescape(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append({"t": "\t", "n": "\n", "r": "\r"}.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def processes(out):
    """Every process file of a recording, parsed: pid, ppid, started, command, events, notes, exit."""
    procs = []
    for f in sorted(Path(out).glob("*.ferry-proc")):
        p = {"file": f.name, "events": [], "notes": {}, "exit": None, "threads": {}}
        strings = {0: ""}
        lines = f.read_text().split("\n")
        assert lines[0] == "ferry-process-trace 1", f
        for line in lines[1:-1]:  # the last piece has no newline: empty, or cut
            head, _, text = line.partition("\t")
            v = head.split(" ")
            if v[0] == "P":
                p.update(pid=int(v[1]), ppid=int(v[2]), started=v[6], command=unescape(text))
            elif v[0] == "S":
                strings[int(v[1])] = unescape(text)
            elif v[0] == "T":
                p["threads"][int(v[1])] = unescape(text)
            elif v[0] == "E":
                p["events"].append({"kind": KINDS[int(v[1])], "start": int(v[2]), "end": int(v[3]),
                                    "thread": int(v[4]), "bytes": int(v[8]), "name": strings[int(v[9])],
                                    "domain": strings[int(v[10])]})
            elif v[0] == "M":
                p["notes"][v[1]] = unescape(text)
            elif v[0] == "X":
                p["exit"] = int(v[2])
        procs.append(p)
    return procs


def names(p, domain=None):
    return [e["name"] for e in p["events"] if domain is None or e["domain"] == domain]


def fixture_processes(out):
    return [p for p in processes(out) if os.path.basename(FIXTURE) in p["command"]]


def test_blocking_calls_are_recorded_with_their_length_size_and_caller(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "blocking", flags=["--block-us", "1000"])
    assert r.returncode == 0, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    os_calls = {e["name"].split(" (")[0]: e for e in p["events"] if e["domain"] == "os"}
    assert os_calls["munmap"]["bytes"] == 256 << 20
    assert os_calls["munmap"]["name"] == f"munmap ({os.path.basename(FIXTURE)})", os_calls["munmap"]
    # At least as long as what they waited for (the other thread's sleep), never shorter.
    assert os_calls["read"]["end"] - os_calls["read"]["start"] >= 25_000_000
    assert os_calls["nanosleep"]["end"] - os_calls["nanosleep"]["start"] >= 20_000_000
    assert os_calls["sem_wait"]["end"] - os_calls["sem_wait"]["start"] >= 20_000_000
    # Only calls that lasted the threshold (1 ms) are kept.
    assert all(e["end"] - e["start"] >= 1_000_000 for e in p["events"] if e["domain"] == "os")
    assert p["exit"] == 0


def test_a_fork_child_has_its_own_file_without_its_parents_events(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "fork")
    assert r.returncode == 0, r.stderr
    procs = fixture_processes(tmp_path / "t")
    assert len(procs) == 2, procs
    parent = next(p for p in procs if p["started"] == "exec")
    child = next(p for p in procs if p["started"] == "fork")
    assert child["ppid"] == parent["pid"]
    assert "parent before fork" in names(parent)
    assert "child" in names(child) and "parent before fork" not in names(child)
    assert all(e["thread"] == child["pid"] for e in child["events"]), child["events"]
    assert child["exit"] == 5 and parent["exit"] == 0


def test_an_execd_child_and_a_reparented_daemon_are_recorded_and_waited_for(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "forkexec")
    assert r.returncode == 0, r.stderr
    procs = fixture_processes(tmp_path / "t")
    child = next(p for p in procs if p["command"].endswith("blocking"))
    parent = next(p for p in procs if p["command"].endswith("forkexec"))
    assert child["ppid"] == parent["pid"] and child["started"] == "exec"
    assert any(n.startswith("nanosleep") for n in names(child, "os"))

    done = tmp_path / "daemon.pid"
    r = record(tmp_path / "d", FIXTURE, "doublefork", str(done))
    assert r.returncode == 0, r.stderr
    # The launcher returned only after the re-parented grandchild had finished.
    assert done.exists(), "ferry trace returned before the daemon it had to wait for"
    daemon_pid = int(done.read_text())
    daemon = next(p for p in fixture_processes(tmp_path / "d") if p["pid"] == daemon_pid)
    assert daemon["exit"] == 0


def test_the_commands_exit_status_comes_through(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "exit3")
    assert r.returncode == 3, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert p["exit"] == 3
    # A command that cannot start: said once, with a shell's status, before the output folder is made.
    r = record(tmp_path / "n", "/nonexistent/program")
    assert r.returncode == 127 and "cannot run /nonexistent/program" in r.stderr, r.stderr
    assert "nothing was recorded" in r.stderr and "merged" not in r.stderr, r.stderr
    assert not (tmp_path / "n").exists()
    r = record(tmp_path / "p", "no-such-program-on-path")
    assert r.returncode == 127 and "not found on PATH" in r.stderr, r.stderr
    assert not (tmp_path / "p").exists()
    r = record(tmp_path / "e", "")
    assert r.returncode == 127 and "No such file" in r.stderr, r.stderr
    (tmp_path / "file").write_text("")
    r = record(tmp_path / "d", str(tmp_path / "file" / "program"))  # a path through a file: as a shell, 126
    assert r.returncode == 126 and "Not a directory" in r.stderr, r.stderr
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "kept").write_text("")
    r = record(tmp_path / "x", str(script), flags=["--force"])
    assert r.returncode == 126 and "Permission denied" in r.stderr, r.stderr
    assert [f.name for f in (tmp_path / "x").iterdir()] == ["kept"], "the folder was touched"


def test_quick_exit_writes_its_handlers_events_and_the_exit_status(tmp_path):
    # glibc's quick_exit ends with an _exit of its own, which no preload sees: it left no exit line.
    r = record(tmp_path / "t", FIXTURE, "quickexit")
    assert r.returncode == 3, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert "before quick_exit" in names(p) and "in a quick_exit handler" in names(p), names(p)
    assert p["exit"] == 3


def test_a_main_that_calls_pthread_exit_ends_with_its_last_thread(tmp_path):
    # ferry's writer thread must not keep the process alive once the program's threads have all ended.
    r = record(tmp_path / "t", FIXTURE, "pthreadexit", timeout=30)
    assert r.returncode == 0, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert "before pthread_exit" in names(p) and "last thread" in names(p), names(p)
    assert p["exit"] == 0


def test_sigkill_loses_at_most_one_flush_interval(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "kill", flags=["--flush-ms", "20"])
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    assert f"was ended by signal {int(signal.SIGKILL)} (Killed); exit status 137" in r.stderr, r.stderr
    last = int(r.stdout.split("last mark ends at ")[1])
    [p] = fixture_processes(tmp_path / "t")
    assert p["exit"] is None
    marks = [e for e in p["events"] if e["name"].startswith("mark ")]
    # The property: the writer flushed while the process ran, so a SIGKILL leaves the marks written before
    # it (no exit flush ran). How many were lost depends on the machine's load: printed, not asserted.
    assert marks, "nothing flushed before the SIGKILL"
    lost_ms = (last - max(e["end"] for e in marks)) / 1e6
    print(f"SIGKILL lost the last {lost_ms:.1f} ms of marks (flush interval 20 ms)")
    numbers = sorted(int(e["name"].split()[1]) for e in marks)
    assert numbers == list(range(len(numbers))), "a mark before the last one written is missing"
    analysis = json.loads(subprocess.run([CLI, "analyze", str(tmp_path / "t"), "--json"], capture_output=True,
                                         text=True, timeout=TIMEOUT, check=True).stdout)
    assert any("no exit record" in n for n in analysis["notes"]), analysis["notes"]


@pytest.mark.parametrize("flush_ms", [None, 5000])
def test_sigterm_at_its_default_flushes_then_ends_the_process(tmp_path, flush_ms):
    # With a flush interval longer than the handler's wait (2 s), the writer is woken for the SIGTERM: it
    # used to sleep through it, and the process ended without its last events and exit line.
    r = record(tmp_path / "t", FIXTURE, "sigterm", flags=["--flush-ms", str(flush_ms)] if flush_ms else [])
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert "before SIGTERM" in names(p)
    assert p["exit"] == 128 + signal.SIGTERM


@pytest.mark.parametrize("how, status", [("return", 4), ("_exit", 6), ("sigterm", 128 + signal.SIGTERM)])
def test_the_programs_exit_handlers_after_exit_are_recorded(tmp_path, how, status):
    # exit(4), then an exit handler of the program's that records a range and returns, calls _exit(6) or
    # raises SIGTERM: the exit line comes after the handlers, with the status the process ended with (it was
    # written inside exit(), before them: their events were lost and the status was exit's).
    r = record(tmp_path / "t", FIXTURE, "exithandler", how)
    assert r.returncode == status, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert "before exit" in names(p) and "in an exit handler" in names(p), names(p)
    assert p["exit"] == status


def test_nvtx_ranges_in_any_domain_across_threads_and_in_a_fork_child(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "nvtx")
    assert r.returncode == 0, r.stderr
    procs = fixture_processes(tmp_path / "t")
    parent = next(p for p in procs if p["started"] == "exec")
    child = next(p for p in procs if p["started"] == "fork")
    ranges = {e["name"]: e for e in parent["events"] if e["kind"] == "range" and e["domain"] != "os"}
    assert {"outer", "inner", "in my domain", "across threads"} <= set(ranges), ranges
    assert ranges["outer"]["start"] <= ranges["inner"]["start"] <= ranges["inner"]["end"] <= ranges["outer"]["end"]
    assert ranges["in my domain"]["domain"] == "my domain"
    assert parent["threads"][parent["pid"]] == "nvtx main"
    assert "nvtx" in parent["notes"]
    assert names(child) == ["in the child"]


def test_the_cuda_driver_contract_holds_and_says_what_cupti_did(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "cuda")
    assert r.returncode == 0, r.stderr  # InitializeInjection returned 1, twice
    [p] = fixture_processes(tmp_path / "t")
    assert p["notes"]["cuda"].startswith("initialized")
    # Without a GPU, CUPTI cannot record (or ferry was built without it): the trace says so, the CPU side
    # is still recorded.
    assert "cupti" in p["notes"], p["notes"]
    assert any(n.startswith("nanosleep") for n in names(p, "os"))


@pytest.mark.skipif(not os.environ.get("FERRY_FAKE_CUPTI"),
                    reason="FERRY_FAKE_CUPTI is not set (ctest sets it in a build with the CUDA toolkit; "
                           "without it the injection library has no CUPTI recorder)")
def test_cupti_stops_when_main_returns_before_the_cuda_runtimes_teardown(tmp_path):
    # A stand-in libcupti that aborts on any call after the CUDA runtime's teardown (an exit handler, as a
    # statically linked cudart registers it after cuInit). On an H200, ferry's own benches crashed there
    # (cuptiActivityDisable from the injection library's exit handler, SIGSEGV).
    fake = Path(os.environ["FERRY_FAKE_CUPTI"])
    library_path = ":".join(p for p in (str(fake.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    r = record(tmp_path / "t", FIXTURE, "cudateardown", fake.name, env={"LD_LIBRARY_PATH": library_path})
    assert r.returncode == 0, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert p["notes"]["cupti"].startswith("recording"), p["notes"]  # the recorder ran, on the stand-in
    assert "cupti_end" not in p["notes"], p["notes"]
    assert p["exit"] == 0
    # The writer thread inside a slow flush of its own (every millisecond, 20 ms each) when main returns:
    # the stop waits for it, so no CUPTI call runs across the teardown.
    for i in range(3):
        r = record(tmp_path / f"slow{i}", FIXTURE, "cudateardown", fake.name, flags=["--flush-ms", "1"],
                   env={"LD_LIBRARY_PATH": library_path, "FERRY_FAKE_CUPTI_SLOW_FLUSH_MS": "20"})
        assert r.returncode == 0, r.stderr
        [p] = fixture_processes(tmp_path / f"slow{i}")
        assert p["exit"] == 0
    # glibc's errx calls its own exit, which no preload sees: the last exit handler drops CUPTI's trace
    # without a CUPTI call, and says so.
    r = record(tmp_path / "errx", FIXTURE, "cudateardown", fake.name, "errx", env={"LD_LIBRARY_PATH": library_path})
    assert r.returncode == 5 and "ended by errx" in r.stderr, r.stderr
    [p] = fixture_processes(tmp_path / "errx")
    assert "cupti_abandoned" in p["notes"], p["notes"]


@pytest.mark.skipif(not os.environ.get("FERRY_FAKE_CUPTI"),
                    reason="FERRY_FAKE_CUPTI is not set (ctest sets it in a build with the CUDA toolkit; "
                           "without it the injection library has no CUPTI recorder)")
@pytest.mark.parametrize("how, status", [("exit", 7), ("_exit", 8), ("sigterm", 128 + signal.SIGTERM),
                                         ("pthreadexit", 0)])
def test_every_way_out_leaves_no_cupti_call_after_the_cuda_runtimes_teardown(tmp_path, how, status):
    # The ways out besides main's return and errx (above), each with the stand-in libcupti that aborts on a
    # CUPTI call after the teardown: exit() and a pthread_exit main stop CUPTI before the exit handlers, a
    # SIGTERM stops it on the writer (no handler runs), _exit leaves it alone (none runs either).
    fake = Path(os.environ["FERRY_FAKE_CUPTI"])
    library_path = ":".join(p for p in (str(fake.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    r = record(tmp_path / "t", FIXTURE, "cudateardown", fake.name, how, env={"LD_LIBRARY_PATH": library_path})
    assert r.returncode == status, r.stderr
    assert "fake libcupti" not in r.stderr, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert p["notes"]["cupti"].startswith("recording"), p["notes"]
    assert "cupti_end" not in p["notes"] and "cupti_abandoned" not in p["notes"], p["notes"]
    assert p["exit"] == status


@pytest.mark.skipif(not os.environ.get("FERRY_FAKE_CUPTI"),
                    reason="FERRY_FAKE_CUPTI is not set (ctest sets it in a build with the CUDA toolkit; "
                           "without it the injection library has no CUPTI recorder)")
def test_a_second_exit_waits_for_the_first_ones_cupti_stop_before_the_exit_handlers(tmp_path):
    # exit(7) on the main thread stops CUPTI, its two forced flushes taking 100 ms each; exit(7) on another
    # thread 30 ms later must not run the exit handlers (the CUDA runtime's teardown among them) before that
    # stop ends: it returned at once, and the stand-in aborted for a teardown inside a CUPTI call. Which
    # thread writes the exit line, and whether the other ends the process first, is glibc's: not asserted.
    fake = Path(os.environ["FERRY_FAKE_CUPTI"])
    library_path = ":".join(p for p in (str(fake.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    r = record(tmp_path / "t", FIXTURE, "cudateardown", fake.name, "twoexits",
               env={"LD_LIBRARY_PATH": library_path, "FERRY_FAKE_CUPTI_SLOW_FORCED_FLUSH_MS": "100"})
    assert r.returncode == 7, r.stderr
    assert "fake libcupti" not in r.stderr, r.stderr


def test_python_process_trees_with_every_start_method(tmp_path):
    script = tmp_path / "tree.py"
    pids = tmp_path / "pids"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing as mp, os, time
        def child(tag):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{tag}} {{os.getpid()}}\\n")
            time.sleep(0.05)
            os._exit(0)
        def sleeper(ready):
            open(ready, "w").close()
            time.sleep(60)
        if __name__ == "__main__":
            for method in ("fork", "spawn", "forkserver"):
                p = mp.get_context(method).Process(target=child, args=(method,))
                p.start(); p.join()
                assert p.exitcode == 0, (method, p.exitcode)
            ready = {str(tmp_path / "ready")!r}
            victim = mp.get_context("fork").Process(target=sleeper, args=(ready,))
            victim.start()
            while not os.path.exists(ready):
                time.sleep(0.01)
            victim.kill(); victim.join()
            print("killed", victim.pid, flush=True)
    """))
    r = record(tmp_path / "t", sys.executable, str(script), flags=["--python", "none"])
    assert r.returncode == 0, r.stderr
    recorded = {p["pid"]: p for p in processes(tmp_path / "t")}
    for line in pids.read_text().split("\n")[:-1]:
        tag, pid = line.split()
        assert int(pid) in recorded, f"the {tag} child {pid} has no file"
        assert recorded[int(pid)]["exit"] == 0, (tag, recorded[int(pid)])
    victim = int(r.stdout.split("killed ")[1])
    assert victim in recorded and recorded[victim]["exit"] is None
    # The merge: one track group per process, and the analysis lists them all.
    trace = json.loads((tmp_path / "t" / "trace.json").read_text())
    named = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
    assert set(recorded) <= named
    analysis = json.loads(subprocess.run([CLI, "analyze", str(tmp_path / "t"), "--json"], capture_output=True,
                                         text=True, timeout=TIMEOUT, check=True).stdout)
    assert {p["pid"] for p in analysis["processes"]} == set(recorded)
    assert analysis["ranks"] == []


def test_bad_input_is_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    r = record(tmp_path / "t", "/bin/sh", "-c", f"touch {marker}", env={"CUDA_INJECTION64_PATH": "/opt/nsys/x.so"})
    assert r.returncode == 2 and "/opt/nsys/x.so" in r.stderr and not marker.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    r = record(tmp_path / "full", "/bin/true")
    assert r.returncode == 2 and "not empty" in r.stderr and "--force" in r.stderr
    for steps in ("5:2", "5:9x", "5"):
        r = record(tmp_path / "s", "/bin/true", flags=["--steps", steps])
        assert r.returncode == 2 and f"--steps {steps}" in r.stderr, r.stderr
    r = record(tmp_path / "s", "/bin/true", flags=["--steps", "1:2", "--delay", "1"])
    assert r.returncode == 2 and "cannot be combined" in r.stderr
    r = record(tmp_path / "l", "/bin/sh", "-c", f"touch {marker}", flags=["--lite", "--all-runtime-calls"])
    assert r.returncode == 2 and "--all-runtime-calls and --lite" in r.stderr and not marker.exists()


@pytest.mark.parametrize("flags, expected", [
    ([], "lite=0 syncs=1 all=0"),
    (["--lite"], "lite=1 syncs=1 all=0"),
    (["--no-syncs"], "lite=0 syncs=0 all=0"),
    (["--all-runtime-calls", "--no-syncs"], "lite=0 syncs=0 all=1"),
])
def test_the_cuda_record_options_reach_every_process(tmp_path, flags, expected):
    # The injection library reads them where CUDA starts (InitializeInjection), in the program and in any
    # process it starts: the environment carries them, as the child sees it here.
    seen = tmp_path / "seen"
    script = ('printf "lite=%s syncs=%s all=%s" "$FERRY_TRACE_LITE" "$FERRY_TRACE_SYNCS" "$FERRY_TRACE_ALL_CALLS" '
              f'> {seen}')
    r = record(tmp_path / "t", "/bin/sh", "-c", f"/bin/sh -c '{script}'", flags=flags)
    assert r.returncode == 0, r.stderr
    assert seen.read_text() == expected


def marks_of(p):
    return sorted((e["start"], int(e["name"].split()[1])) for e in p["events"] if e["name"].startswith("mark "))


def test_a_capture_window_by_time_records_only_inside_it(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "marks", flags=["--delay", "0.4", "--duration", "0.4", "--flush-ms", "10"])
    assert r.returncode == 0, r.stderr
    started = int(r.stdout.split("started at ")[1])
    [p] = fixture_processes(tmp_path / "t")
    kept = marks_of(p)
    # Marks every 10 ms for 1.2 s; the window is [0.4 s, 0.8 s] after the launcher started (before the
    # fixture did). Nothing of the first 0.4 s is kept, and not everything after it.
    assert kept, "no mark inside the window"
    assert kept[0][0] >= started + 350_000_000, (kept[0][0] - started) / 1e6
    total = max(i for _, i in kept) + 1
    assert len(kept) < total
    assert "capture_on_ns" in p["notes"] and "capture_off_ns" in p["notes"]


def test_cuda_profiler_start_and_stop_open_and_close_the_capture(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "profiler", flags=["--capture-range", "cudaProfilerApi", "--flush-ms", "10"])
    assert r.returncode == 0, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert [i for _, i in marks_of(p)] == list(range(10, 20))


def test_steps_window_of_a_torch_loop_and_its_own_cost(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(64, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 64), torch.randn(32, 8)
        for _ in range(14):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
    """))
    site = Path(__file__).resolve().parents[2] / "python" / "ferry" / "_trace_site"
    r = record(tmp_path / "t", sys.executable, str(script), flags=["--steps", "5:9", "--flush-ms", "10"],
               env={"FERRY_TRACE_SITE": str(site)})
    assert r.returncode == 0, r.stderr
    [p] = [p for p in processes(tmp_path / "t") if "train.py" in p["command"]]
    steps = sorted((e["start"], e["name"]) for e in p["events"] if e["name"].startswith("step "))
    assert [n for _, n in steps] == [f"step {i}" for i in range(14)]  # every step, captured or not
    forwards = [e["start"] for e in p["events"] if e["name"] == "forward (Linear)"]
    assert forwards, "no forward range captured"
    # Only steps 5 to 9 (and at most a poll interval into step 10) were captured.
    step_start = {n: s for s, n in steps}
    assert min(forwards) >= step_start["step 5"] and max(forwards) < step_start["step 11"], (forwards, steps)
    analysis = json.loads(subprocess.run([CLI, "analyze", str(tmp_path / "t"), "--json"], capture_output=True,
                                         text=True, timeout=TIMEOUT, check=True).stdout)
    # The cost compares whole steps before the window (0 to 4) with whole steps inside it (5 to 8, 9 if the
    # poll that closes it comes late): at least 3 of each, or it is not computed.
    assert analysis["steps_before"] >= 3 and analysis["steps_during"] >= 3, analysis
    assert "recording cost" in r.stderr


def test_the_launcher_samples_each_process_cpu_use(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            time.sleep(0.6); os._exit(0)
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            pass
        os.wait()
    """))
    r = record(tmp_path / "t", sys.executable, str(script), flags=["--python", "none", "--sample-ms", "50"])
    assert r.returncode == 0, r.stderr
    by_pid = {}
    for line in (tmp_path / "t" / "samples.ferry-cpu").read_text().split("\n")[1:-1]:
        v = line.split()
        if v[0] == "C":
            by_pid.setdefault(int(v[2]), []).append(int(v[4]) / 1000)
    procs = {p["started"]: p["pid"] for p in processes(tmp_path / "t")}
    # The spinning parent used more CPU than the sleeping child in their busiest samples (a busy machine
    # may give the spinner less than a core, so no absolute floor).
    assert max(by_pid[procs["exec"]]) > max(by_pid[procs["fork"]]), by_pid


def test_a_directory_of_per_rank_traces_names_the_straggler(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank, compute in ((0, "1"), (1, "8")):  # a wide margin: CI machines are loaded
        subprocess.run([CLI, "bench", "egress", "--backend", "host", "--levels", "L4-pinned", "--steps", "4",
                        "--warmup", "1", "--shape", "2x3x32x32", "--compute-ms", compute,
                        "--trace", str(tmp_path / f"rank{rank}.json")], check=True, capture_output=True,
                       timeout=TIMEOUT)
        (tmp_path / f"rank{rank}.L4-pinned.json").rename(ranks / f"rank{rank}.pt.trace.json")
    r = subprocess.run([CLI, "analyze", str(ranks), "--json"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert [x["name"] for x in a["ranks"]] == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    # Rank 1 computes 8 times longer; a loaded machine stretches rank 0 too: the excess asked is far below 7
    assert a["straggler"] == "rank1.pt.trace.json" and a["straggler_excess"] > 0.25, a["straggler_excess"]
    text = subprocess.run([CLI, "analyze", str(ranks)], capture_output=True, text=True, timeout=TIMEOUT).stdout
    assert "Per rank" in text and "Straggler: rank1.pt.trace.json" in text


def test_an_nvtx_range_opens_and_closes_the_capture(tmp_path):
    r = record(tmp_path / "t", FIXTURE, "nvtxwindow", flags=["--capture-range", "nvtx", "--nvtx-capture", "capture me"])
    assert r.returncode == 0, r.stderr
    [p] = fixture_processes(tmp_path / "t")
    assert sorted(n for n in names(p) if n in ("before", "capture me", "inside", "after")) == ["capture me", "inside"]
    r = record(tmp_path / "bad", "/bin/true", flags=["--capture-range", "nvtx"])
    assert r.returncode == 2 and "--nvtx-capture" in r.stderr


def test_the_wait_for_processes_left_running_is_bounded(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    script = f"(sleep 30 & echo $! > {pid_file}) ; exit 0"
    try:
        r = record(tmp_path / "t", "/bin/sh", "-c", script, flags=["--wait-s", "0.5"])
        assert r.returncode == 0, r.stderr
        assert "still run" in r.stderr and "--wait-s" in r.stderr
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
