"""The PyTorch side-by-side examples (examples/pytorch/) at tiny sizes on the CPU: every level runs, every
output or batch is checked, and a wrong byte is caught. The scripts run in this process (their levels
start their own worker processes), so a patched function reaches those workers too."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pytorch"
sys.path.insert(0, str(EXAMPLES))

REFERENCE = ["L0", "L1", "L2", "L3", "L4", "L4-pinned", "L4-pinned-nocopy"]


def run(module_name, tmp_path, *args):
    """Runs an example's main() with --dry-run and --json; returns (exit code, {level: row})."""
    module = importlib.import_module(module_name)
    out = tmp_path / f"{module_name}.json"
    code = module.main(["--dry-run", "--device", "cpu", "--json", str(out), *args])
    doc = json.loads(out.read_text())
    return code, {row["level"]: row for row in doc["levels"]}


def assert_all_checked(rows, levels, expected):
    for level in levels:
        row = rows[level]
        assert row["error"] is None, f"{level}: {row['error']}"
        assert row["steps"] == 2
        assert row["steps_per_s"] > 0
        if level != "ideal":
            assert row["checked_outputs"] == expected, level
            assert row["mismatches"] == 0, level


def test_segmentation_every_reference_level_checks_every_output(tmp_path):
    levels = ["ideal", *REFERENCE]
    code, rows = run("segmentation_egress", tmp_path, "--levels", ",".join(levels))
    assert code == 0
    assert list(rows) == levels
    assert_all_checked(rows, levels, expected=3)  # 1 warm-up + 2 timed outputs
    assert rows["L4"]["gb_per_s"] > 0


def test_segmentation_ferry_level_checks_every_output_in_chunks(tmp_path):
    # 2x21x64x64 float32 = 688 KiB per output against 256 KiB slots: three chunks per output.
    code, rows = run("segmentation_egress", tmp_path, "--levels", "ideal,ferry", "--size", "64",
                     "--slot-mib", "1", "--slots", "2")
    assert code == 0
    assert_all_checked(rows, ["ideal", "ferry"], expected=3)


def test_segmentation_deeplabv3_runs_at_a_small_size(tmp_path):
    pytest.importorskip("torchvision")  # scripts/setup.sh installs python3-torchvision
    code, rows = run("segmentation_egress", tmp_path, "--model", "deeplabv3", "--size", "64",
                     "--levels", "ideal,L4-pinned,ferry", "--steps", "1")
    assert code == 0
    for level in ("L4-pinned", "ferry"):
        assert rows[level]["checked_outputs"] == 2 and rows[level]["mismatches"] == 0


def test_segmentation_a_wrong_byte_on_the_host_fails_the_run(tmp_path, monkeypatch):
    seg = importlib.import_module("segmentation_egress")
    right = seg.int64_sum
    monkeypatch.setattr(seg, "int64_sum", lambda buf: (right(buf) + 1) & seg.MASK)
    code, rows = run("segmentation_egress", tmp_path, "--levels", "L0,L4,ferry")
    assert code == 1
    for level in ("L0", "L4", "ferry"):
        assert rows[level]["checked_outputs"] == 3
        assert rows[level]["mismatches"] == 3, level


def test_segmentation_bad_options_are_refused_naming_the_value(capsys):
    seg = importlib.import_module("segmentation_egress")
    with pytest.raises(SystemExit):
        seg.parse_args(["--dry-run", "--size", "31"])
    assert "--size 31" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="'L9'"):
        seg.parse_args(["--dry-run", "--levels", "ideal,L9"])
    with pytest.raises(SystemExit):
        seg.parse_args(["--dry-run", "--slots", "0"])
    assert "--slots 0" in capsys.readouterr().err


def test_train_every_level_checks_every_batch(tmp_path):
    levels = ["ideal", "loader", "pinned", "reference", "ferry", "ferry_loader"]
    code, rows = run("train_prefetch", tmp_path, "--levels", ",".join(levels))
    assert code == 0
    assert list(rows) == levels
    assert_all_checked(rows, levels, expected=3)
    for level in levels:
        # /proc counts CPU time in clock ticks (10 ms): a tiny run's levels may read 0, never less.
        assert rows[level]["cpu_seconds_per_step"] >= 0


def test_train_a_wrong_sample_fails_the_run(tmp_path, monkeypatch):
    train = importlib.import_module("train_prefetch")
    right = train.RandomImages.__getitem__

    def wrong_at_3(self, i):
        img, label = right(self, i)
        if i == 3:  # the first sample of step 1 (batch 2) claims to be sample 4
            img[0, 0, 0] = 4.0
        return img, label

    monkeypatch.setattr(train.RandomImages, "__getitem__", wrong_at_3)
    code, rows = run("train_prefetch", tmp_path, "--levels", "pinned,reference,ferry,ferry_loader",
                     "--loader-start-method", "fork")  # forked workers see the patched dataset
    assert code == 1
    for level in ("pinned", "reference", "ferry", "ferry_loader"):
        assert rows[level]["checked_outputs"] == 3
        assert rows[level]["mismatches"] == 1, level


def test_train_cpus_limits_the_process_and_is_checked(tmp_path):
    out = tmp_path / "one.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, str(EXAMPLES / "train_prefetch.py"), "--dry-run", "--cpus", "1",
                        "--levels", "ideal,reference", "--json", str(out)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["cpus_allowed"] == 1
    bad = subprocess.run([sys.executable, str(EXAMPLES / "train_prefetch.py"), "--dry-run", "--cpus", "100000"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "--cpus 100000" in bad.stderr


def test_loader_jpeg_every_level_and_worker_count_checks_every_batch(tmp_path):
    levels = ["ideal", "dataloader/1", "dl_prefetcher/1", "ferry_loader/1", "ferry_cpu_decode/1", "dataloader/2",
              "dl_prefetcher/2", "ferry_loader/2", "ferry_cpu_decode/2"]
    code, rows = run("loader_jpeg", tmp_path, "--workers", "1,2", "--data", str(tmp_path / "jpeg"))
    assert code == 0
    assert list(rows) == levels
    # Every batch stepped is checked: warm-up (--warmup 1 + prefetch_factor 2 x N + depth 2, rounded up to
    # whole rounds of N) and the timed steps (2): 5 + 2 at one worker, 8 + 2 at two.
    assert_all_checked(rows, levels[:1], expected=None)
    assert_all_checked(rows, [lv for lv in levels if lv.endswith("/1")], expected=7)
    assert_all_checked(rows, [lv for lv in levels if lv.endswith("/2")], expected=10)
    assert len(list((tmp_path / "jpeg").glob("*.jpg"))) == 6 and not list((tmp_path / "jpeg").glob("*.partial"))


def test_loader_jpeg_a_decoded_image_unlike_the_reference_fails_the_run(tmp_path, monkeypatch):
    import ferry.torch as ft
    right = ft.ImageDecode.reference
    monkeypatch.setattr(ft.ImageDecode, "reference", lambda self, data, seed: right(self, data, seed).flip(-1))
    code, rows = run("loader_jpeg", tmp_path, "--levels", "ferry_cpu_decode")
    assert code == 1
    assert rows["ferry_cpu_decode/2"]["checked_outputs"] == 10 and rows["ferry_cpu_decode/2"]["mismatches"] == 10


def test_loader_jpeg_a_batch_unlike_its_samples_fails_the_run(tmp_path, monkeypatch):
    jpeg = importlib.import_module("loader_jpeg")
    right = jpeg.expected_sums

    def off_at_step_1(*args):
        sums = right(*args)
        sums[1] = (sums[1][0] + 1, sums[1][1])
        return sums

    monkeypatch.setattr(jpeg, "expected_sums", off_at_step_1)
    code, rows = run("loader_jpeg", tmp_path, "--levels", "dataloader,dl_prefetcher,ferry_loader")
    assert code == 1
    for level in ("dataloader/2", "dl_prefetcher/2", "ferry_loader/2"):
        assert rows[level]["checked_outputs"] == 10 and rows[level]["mismatches"] == 1, level
