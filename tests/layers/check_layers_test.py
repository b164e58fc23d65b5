#!/usr/bin/env python3
"""The layering check fails on the mistakes it exists for, and passes on a tree that keeps the layers."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / "scripts" / "check_layers.py"


def run_check(files: dict[str, str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            path = Path(root) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return subprocess.run([sys.executable, str(CHECK), "--root", root], capture_output=True, text=True)


class CheckLayers(unittest.TestCase):
    def test_a_tree_that_keeps_the_layers_passes(self):
        r = run_check({
            "src/egress/pipeline.cpp": '#include "ferry/egress/egress.hpp"\n#include "ferry/device/device.hpp"\n'
                                       '#include "ferry/core/error.hpp"\n#include <vector>\n',
            "src/cuda/cuda_device.cpp": '#include <cuda_runtime_api.h>\n#include "ferry/device/device.hpp"\n',
            "tools/ferry/main.cpp": '#include "ferry/bench/egress_bench.hpp"\n',
        })
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_an_upward_include_fails_naming_the_file_line_and_the_allowed_targets(self):
        r = run_check({"src/core/stats.cpp": '// a core file\n#include "ferry/device/device.hpp"\n'})
        self.assertEqual(r.returncode, 1)
        self.assertIn("src/core/stats.cpp:2: core includes \"ferry/device/device.hpp\"", r.stdout)

    def test_a_public_header_including_a_higher_layer_fails(self):
        r = run_check({"include/ferry/trace/timeline.hpp": '#include "ferry/analyze/analyze.hpp"\n'})
        self.assertEqual(r.returncode, 1)
        self.assertIn("trace may use only core", r.stdout)

    def test_a_host_only_target_including_cuda_fails(self):
        for header in ("<cuda_runtime_api.h>", "<cupti.h>", "<nccl.h>", '"ferry/cuda/detail/kernels.cuh"'):
            with self.subTest(header=header):
                r = run_check({"src/analyze/rule.cpp": f"#include {header}\n"})
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn("analyze is host-only", r.stdout)

    def test_backend_code_of_a_component_inside_the_cuda_backend_fails(self):
        r = run_check({"src/cuda/topology_cuda.cpp": '#include "ferry/probe/topology.hpp"\n'})
        self.assertEqual(r.returncode, 1)
        self.assertIn("cuda includes \"ferry/probe/topology.hpp\"", r.stdout)

    def test_a_test_folder_uses_only_what_its_target_may(self):
        r = run_check({"tests/analyze/analyze_test.cpp": '#include "ferry/device/device.hpp"\n'})
        self.assertEqual(r.returncode, 1)
        self.assertIn("tests/analyze/analyze_test.cpp:1", r.stdout)


if __name__ == "__main__":
    unittest.main()
