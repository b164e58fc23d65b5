#!/usr/bin/env python3
"""Docs that quote ferry must quote what ferry says today.

Every ```console block of README.md and of the living docs (docs/*.md but the dated measurement records
of docs/PERFORMANCE.md) is checked: each `$ ferry ...` line is run from the repository root, and each
line quoted after it (but `...`) must appear in that command's output, blanks aside. So a default in
--help or a figure of `ferry analyze` that changes fails this test until the quote is updated.

README prose may not quote defaults or analysis figures outside such blocks: "(default ...)" and
"idle NN%" there fail the test, since nothing would check them.

Usage: docs_test.py FERRY_BINARY
"""
import os
import re
import shlex
import subprocess
import sys
import unittest

FERRY = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "build/default/tools/ferry/ferry"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Dated records of measurements quote what ferry said then, not now.
RECORDS = {"PERFORMANCE.md"}


def living_docs():
    docs = [os.path.join(ROOT, "README.md")]
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if name.endswith(".md") and name not in RECORDS:
            docs.append(os.path.join(ROOT, "docs", name))
    return docs


def console_blocks(text):
    """[(command, [quoted lines])] of every ```console block."""
    out = []
    for block in re.findall(r"^```console\n(.*?)^```", text, flags=re.S | re.M):
        command, quoted = None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    out.append((command, quoted))
                command, quoted = line[2:], []
            elif line.strip() and line.strip() != "...":
                quoted.append(line)
        if command:
            out.append((command, quoted))
    return out


def squash(s):
    return " ".join(s.split())


def run_quoted(command):
    args = shlex.split(command)
    assert args[0] == "ferry", f"quoted command does not run ferry: {command}"
    r = subprocess.run([FERRY, *args[1:]], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return r.returncode, r.stdout


class docs(unittest.TestCase):
    def test_quoted_output_matches_what_ferry_prints(self):
        checked = 0
        for doc in living_docs():
            with open(doc) as f:
                blocks = console_blocks(f.read())
            for command, quoted in blocks:
                rc, out = run_quoted(command)
                with self.subTest(doc=os.path.basename(doc), command=command):
                    self.assertEqual(rc, 0, f"`{command}` failed")
                    got = squash(out)
                    for line in quoted:
                        self.assertIn(squash(line), got,
                                      f"{os.path.basename(doc)} quotes `{command}` as printing\n  {line.strip()}\n"
                                      f"but it prints:\n{out}")
                        checked += 1
        self.assertGreater(checked, 0, "no quoted output found: the README's quotes are gone")

    def test_readme_prose_quotes_no_default_or_figure_outside_a_checked_block(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            text = f.read()
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for pattern in (r"\(default[^)]*\d", r"idle \d+(\.\d+)?% of", r"pinning of \d"):
            with self.subTest(pattern=pattern):
                self.assertIsNone(re.search(pattern, prose),
                                  "README prose quotes a figure no test checks; quote the command's output in "
                                  "a ```console block instead")


if __name__ == "__main__":
    unittest.main(verbosity=1)
