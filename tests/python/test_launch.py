"""`python3 -m ferry.launch`, the launcher for machines where torchrun cannot start (Debian's torch 1.13
under Python 3.11): a torchrun-style script gets its rank and world in the environment and trains; the
first rank that fails ends the others and the launcher exits with its status."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

WORKER = Path(__file__).with_name("launch_worker.py")


def launch(*args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ferry.launch", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_two_ranks_from_the_environment_train_to_the_same_parameters(tmp_path):
    out = tmp_path / "params"
    r = launch("--nproc-per-node", "2", str(WORKER), "train", str(out))
    assert r.returncode == 0, r.stderr
    reports = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    assert [rep["world"] for rep in reports] == [2, 2]
    assert reports[0]["params"] == reports[1]["params"]
    # The step averaged the two ranks' gradients (inputs 1 and 2 per element): 1.5 * 3 rows from rank 0's start.
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 2)
    assert abs(reports[0]["params"][0][0] - (start.weight[0, 0].item() - 0.1 * 4.5)) < 1e-6


def test_the_first_failing_rank_ends_the_others_and_gives_its_status(tmp_path):
    r = launch("--nproc-per-node", "2", "--grace", "2", str(WORKER), "fail")
    assert r.returncode == 3, r.stderr
    assert "ferry.launch: rank 1 exited with status 3; ending the others" in r.stderr


def test_bad_arguments_are_refused_naming_the_value():
    r = launch("--nproc-per-node", "0", "x.py", timeout=60)
    assert r.returncode == 2 and "--nproc-per-node 0: expected 1 to 1024 processes" in r.stderr


def test_a_second_ctrl_c_kills_ranks_that_ignore_the_first_and_none_is_left(tmp_path):
    """Ranks stuck past Ctrl-C and SIGTERM (the launcher's grace is long): a second Ctrl-C ends them with
    SIGKILL at once, and the launcher returns only once every rank is gone."""
    out = tmp_path / "pid"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launcher = subprocess.Popen([sys.executable, "-m", "ferry.launch", "--nproc-per-node", "2", "--grace", "600",
                                 str(WORKER), "stubborn", str(out)], env=env, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group, as a terminal's job
    try:
        deadline = time.monotonic() + 60
        while not all(Path(f"{out}.{r}").exists() for r in range(2)):
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.05)
        pids = [int(Path(f"{out}.{r}").read_text()) for r in range(2)]
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C: the ranks ignore it, the launcher asks them to end
        time.sleep(0.5)
        assert launcher.poll() is None  # waiting out its grace for them
        os.killpg(launcher.pid, signal.SIGINT)  # the second Ctrl-C
        _, err = launcher.communicate(timeout=60)  # well inside the 600 s grace: the second one killed them
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 128 + signal.SIGINT, err
    for pid in pids:  # reaped by the launcher: no such process, not even a zombie
        try:
            os.kill(pid, 0)
            left = True
        except ProcessLookupError:
            left = False
        assert not left, f"rank process {pid} outlived the launcher"
