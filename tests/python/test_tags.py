"""Tags: a tag names an output to the file sinks (its file) and to the checksum sink (its checksum), so a
tag given twice is refused at submit with an error naming it. It used to crash the process at close():
two sink workers shared one staged file and the second committed a file the first had released."""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import ferry
from ferry.torch import ChecksumSink, Egress, NpySink, RawFileSink

ROOT = Path(__file__).resolve().parents[2]

# The reproduction as a user wrote it, in a child process so that a crash fails the test instead of
# killing pytest. It prints how many submits were refused, then each refusal.
REPRODUCTION = """
import sys, torch
sys.path.insert(0, {python!r})
import ferry
from ferry.torch import Egress, NpySink, RawFileSink
backend, kind, directory = sys.argv[1:4]
sink = NpySink(directory) if kind == "npy" else RawFileSink(directory)
e = Egress(sink, device=ferry.Device(backend))
refused = []
for j in range(4):
    try:
        e.submit(torch.ones(4).cuda() if backend == "cuda" else torch.ones(4), tag=1)
    except ValueError as err:
        refused.append(str(err))
e.close()
print(len(refused))
print("\\n".join(refused))
"""


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_a_repeated_tag_is_refused_at_submit_instead_of_crashing_at_close(backend, kind, tmp_path):
    script = REPRODUCTION.format(python=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", script, backend, kind, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"exit status {r.returncode} (negative: killed by that signal)\n{r.stderr}"
    lines = r.stdout.splitlines()
    assert lines[0] == "3", r.stdout
    name = "output_1.npy" if kind == "npy" else "output_1.bin"
    for message in lines[1:]:
        assert "tag 1 was already submitted" in message and name in message, message
    # The first output was written whole, and nothing else (no temporary) is left.
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    ones = np.ones(4, dtype=np.float32)
    if kind == "npy":
        assert (np.load(tmp_path / name) == ones).all()
    else:
        assert (tmp_path / name).read_bytes() == ones.tobytes()


def test_default_tags_are_the_submission_numbers_and_never_collide(device, make_tensor, tmp_path):
    sink = NpySink(tmp_path)
    outs = [make_tensor((8,), seed=i) for i in range(4)]
    with Egress(sink, slots=2, slot_bytes=64, device=device) as e:
        for t in outs:
            e.submit(t)
    for i, t in enumerate(outs):
        assert np.load(sink.path_of(i)).tobytes() == t.detach().cpu().numpy().tobytes()


def test_a_refused_tag_leaves_the_egress_usable(device, make_tensor, tmp_path):
    sink = RawFileSink(tmp_path)
    a, b = make_tensor((16,), seed=1), make_tensor((16,), seed=2)
    with Egress(sink, slots=2, slot_bytes=64, device=device) as e:
        e.submit(a, tag=5)
        with pytest.raises(ferry.InvalidArgumentError, match="tag 5 was already submitted"):
            e.submit(b, tag=5)
        e.submit(b, tag=6)
    assert Path(sink.path_of(5)).read_bytes() == a.detach().cpu().numpy().tobytes()
    assert Path(sink.path_of(6)).read_bytes() == b.detach().cpu().numpy().tobytes()


def test_checksum_sink_refuses_a_repeated_tag_at_submit(device, make_tensor):
    sink = ChecksumSink()
    t = make_tensor((100,), seed=3)
    with Egress(sink, slots=2, slot_bytes=128, device=device) as e:  # 400 bytes: 4 chunks
        e.submit(t, tag=2)
        with pytest.raises(ValueError, match="checksum_sink: tag 2 was already submitted"):
            e.submit(t, tag=2)
    assert sink.checksum(2) == ChecksumSink.of(t.detach().cpu().numpy().tobytes())


def test_a_callable_sink_may_get_one_tag_for_outputs_of_different_shapes(device, make_tensor):
    # A callback has no per-tag file, so a tag may repeat; each output still arrives in its own shape
    # (the shape was once kept by tag, and a later output's replaced an earlier one's still in flight).
    got = []
    all_submitted = threading.Event()

    def held(view, chunk):
        assert all_submitted.wait(30)  # the three outputs are in flight together
        got.append((chunk.sequence, chunk.tag, view.shape))

    outs = [make_tensor((4,), seed=1), make_tensor((2, 3), seed=2), make_tensor((5,), seed=3)]
    with Egress(held, slots=4, slot_bytes=4096, workers=2, device=device) as e:
        for t in outs:
            e.submit(t, tag=0)
        all_submitted.set()
    assert sorted(got) == [(0, 0, (4,)), (1, 0, (2, 3)), (2, 0, (5,))]
