"""What every ferry object shares in python/ferry/_runtime.py: a Ctrl-C is never lost to a finalizer."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A finalizer that the Ctrl-C lands in, as a ferry Event freed in a submit loop does: the interpreter
# reports the KeyboardInterrupt as "ignored" and goes on, unless ferry delivers it again.
SCRIPT = """
import sys
sys.path.insert(0, {python!r})
import ferry

class Finalized:
    def __del__(self):
        raise KeyboardInterrupt

try:
    Finalized()
    for _ in range(10 ** 7):
        pass
    print("lost")
except KeyboardInterrupt:
    print("delivered")
try:
    class Other:
        def __del__(self):
            raise ValueError("an ordinary error in a finalizer")
    Other()
    print("still reported")
except BaseException as e:
    print("wrongly raised", type(e).__name__)
"""


def test_a_ctrl_c_in_a_finalizer_is_delivered_again_and_other_errors_still_reported():
    p = subprocess.run([sys.executable, "-c", SCRIPT.format(python=str(ROOT / "python"))], capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.split() == ["delivered", "still", "reported"], (p.stdout, p.stderr)
    assert "an ordinary error in a finalizer" in p.stderr  # the previous hook still prints it
