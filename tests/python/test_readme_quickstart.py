"""The README's Python quick start runs as printed: the ```python block under "## Python quick start" is
taken from README.md as it stands and run in a fresh interpreter, on the emulated device (no GPU visible)
and, where FERRY_TEST_BACKENDS names cuda, on the GPU. A change to the API that breaks the example, or an
edit that breaks the example, fails here."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def quickstart_code() -> str:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Python quick start\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert section, "README.md has no '## Python quick start' section"
    blocks = re.findall(r"^```python\n(.*?)^```[ \t]*$", section.group(1), flags=re.S | re.M)
    assert len(blocks) == 1, f"the quick start should hold one ```python block, it holds {len(blocks)}"
    return blocks[0]


def test_the_quickstart_is_one_screen():
    assert len(quickstart_code().splitlines()) <= 30


def test_the_readme_quickstart_runs_as_printed(backend, tmp_path):
    env = dict(os.environ)
    if backend == "host":
        env["CUDA_VISIBLE_DEVICES"] = ""  # torch sees no GPU, so the example takes ferry's emulated device
    else:
        import torch
        if not torch.cuda.is_available():
            pytest.skip("needs a GPU visible to torch")
    # The package and library of this test run (conftest puts python/ on the path when none is installed).
    import ferry
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ferry.__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_code())
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"the README's quick start failed:\n{r.stdout}\n{r.stderr}"
    # What the example's last line prints (its comment quotes it): 8 batches of 32 written as .npy files.
    assert r.stdout.split() == ["8", "output_0.npy", "(32,", "8,", "64,", "64)"], r.stdout
