#!/usr/bin/env python3
"""The ferry CLI as a user meets it: careless flags, bad output paths, sizes that cannot fit, full
disks, Ctrl-C, hostile names from traces, --version and unknown subcommands.

Usage: cli_test.py FERRY_BINARY   (run by ctest as the `cli` test, from the repository root)
"""
import json
import os
import pty
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

FERRY = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "build/default/tools/ferry/ferry"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINETO = os.path.join(ROOT, "tests", "trace", "data", "kineto_naive.json")

# Each subcommand (as its path of names), what it needs besides the flag under test, and a table of bad
# values for every flag that takes a number or a size. The run must end with status 2 and one line that
# names the flag and the value, before any device is opened.
INTS_FROM_1 = ["-1", "0", "abc", "1.5", "18446744073709551616", "99999999999"]
INTS_FROM_0 = ["-1", "abc", "1.5", "99999999999"]
THREADS = ["-1", "0", "100000", "x"]
SIZES = ["-1", "0", "abc", "1ZiB", "20000TiB"]
FRACTION = ["-0.1", "1.5", "nan", "inf", "-inf", "x"]
GBPS = ["-1", "nan", "inf", "1e300", "x"]
MS = ["-5", "nan", "inf", "-inf", "1e300", "x"]

LADDER = {
    "--gpu": ["-1", "100000", "x"],
    "--compute-ms": MS,
    "--steps": INTS_FROM_1,
    "--warmup": INTS_FROM_0,
    "--workers": THREADS,
    "--trace-events": INTS_FROM_1,
}
SUBCOMMANDS = {
    ("probe",): ([], {
        "--gpu": ["-1", "100000", "x"],
        "--bytes": SIZES + ["7"],
        "--iterations": INTS_FROM_1,
        "--warmup": INTS_FROM_0,
        "--pin-bytes": SIZES,
    }),
    ("bench", "egress"): ([], dict(LADDER, **{
        "--pool-buffers": INTS_FROM_1,
        "--slot-bytes": SIZES,
        "--slots": INTS_FROM_1,
        "--pure-copy": INTS_FROM_1,
        "--probed-d2h": GBPS,
    })),
    ("bench", "ingest"): (["--levels", "L1"], dict(LADDER, **{
        "--host-slots": INTS_FROM_1,
        "--depth": INTS_FROM_1,
        "--probed-h2d": GBPS,
        "--pure-copy": INTS_FROM_1,
        "--both-ways": INTS_FROM_1,
        "--egress-workers": THREADS,
        "--egress-slot-bytes": SIZES,
        "--egress-slots": INTS_FROM_1,
    })),
    ("bench", "allreduce"): ([], {
        "--ranks": ["-1", "0", "65", "x"],
        "--gpus": ["-1", "0", "65", "x"],
        "--min-bytes": SIZES,
        "--max-bytes": SIZES,
        "--step-factor": ["-1", "0", "1", "1025", "x"],
        "--iters": INTS_FROM_1,
        "--warmup": INTS_FROM_0,
    }),
    ("bench", "ddp"): ([], {
        "--ranks": ["-1", "0", "65", "x"],
        "--gpus": ["-1", "0", "65", "x"],
        "--step-ms": MS + ["0"],
        "--scale": ["0", "-1", "1.5", "nan", "x"],
        "--steps": INTS_FROM_1,
        "--warmup": INTS_FROM_1,
        "--learn-steps": INTS_FROM_1,
        "--trace-events": INTS_FROM_1,
    }),
    ("analyze",): ([KINETO], {
        "--idle-threshold": FRACTION,
        "--link-h2d": GBPS,
        "--link-d2h": GBPS,
        "--max-bytes": SIZES,
    }),
}
# Flags whose value is text, checked by their own code (tested below or in the library's tests).
TEXT_FLAGS = {"--backend", "--shape", "--levels", "--trace", "--html", "--output", "--step", "-o", "--codec",
              "--link", "--bootstrap", "--fail-on"}


def exit_statuses():
    """{name: status} as tools/ferry/exit_status.hpp names them: the one list the CLI returns."""
    with open(os.path.join(ROOT, "tools", "ferry", "exit_status.hpp")) as f:
        return {m.group(1): int(m.group(2))
                for m in re.finditer(r"inline constexpr int (\w+) = (\d+);", f.read())}


STATUS = exit_statuses()


def load_json(path):
    with open(path) as f:
        return json.load(f)


def run(args, timeout=60, **kw):
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          errors="replace", **kw)


def value_flags(path):
    """The flags of `ferry <path> --help` that take a value."""
    out = run([*path, "--help"]).stdout
    flags = set()
    for line in out.splitlines():
        m = re.match(r"^\s+(?:-\w,)?(--[a-z0-9-]+)(?:,-\w)?\s+([A-Z]+)\b", line)
        if m:
            flags.add(m.group(1))
    return flags


class flags(unittest.TestCase):
    def test_every_value_flag_of_every_subcommand_has_a_table_of_bad_values(self):
        for path, (_, table) in SUBCOMMANDS.items():
            found = value_flags(path)
            self.assertTrue(found, f"no flags found in `ferry {' '.join(path)} --help`")
            missing = found - set(table) - TEXT_FLAGS
            self.assertEqual(missing, set(), f"ferry {' '.join(path)}: flags without bad values in this test")

    def test_bad_values_are_one_line_naming_flag_and_value_with_status_2_before_any_work(self):
        for path, (extra, table) in SUBCOMMANDS.items():
            for flag, values in table.items():
                for value in values:
                    with self.subTest(cmd=" ".join([*path, flag, value])):
                        r = run([*path, *extra, "--backend", "host", f"{flag}={value}"]
                                if flag != "--backend" and path != ("analyze",)
                                else [*path, *extra, f"{flag}={value}"], timeout=30)
                        self.assertEqual(r.returncode, 2, r.stderr)
                        lines = r.stderr.strip().splitlines()
                        self.assertEqual(len(lines), 1, r.stderr)
                        self.assertIn(flag, lines[0])
                        self.assertIn(value, lines[0])
                        self.assertNotIn("backend", r.stderr.replace("--backend", ""))  # no device opened
                        self.assertEqual(r.stdout, "")

    def test_a_value_after_a_space_is_checked_as_well(self):
        for args in (["bench", "egress", "--pool-buffers", "-1"],
                     ["bench", "ingest", "--workers", "-1", "--levels", "L1"],
                     ["bench", "ingest", "--workers", "100000"],
                     ["bench", "egress", "--steps", "0"],
                     ["bench", "ingest", "--compute-ms", "nan"],
                     ["bench", "egress", "--pure-copy", "0"],
                     ["bench", "ingest", "--both-ways", "-1"]):
            with self.subTest(args=args):
                r = run(args + ["--backend", "host"], timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(args[2], r.stderr)
                self.assertIn(args[3], r.stderr)
                self.assertIn("expected", r.stderr)

    def test_shapes_and_levels_are_checked_before_the_work(self):
        for ladder in ("egress", "ingest"):
            for flag, value in (("--shape", "-1x3x4x4"), ("--shape", "0x1x1x1"), ("--shape", "1x2x3"),
                                ("--shape", "ax1x1x1"), ("--shape", "16777216x16777216x64x64"),
                                ("--levels", "L9"), ("--levels", "ideal,,L0")):
                with self.subTest(ladder=ladder, flag=flag, value=value):
                    r = run(["bench", ladder, "--backend", "host", f"{flag}={value}"], timeout=30)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    lines = r.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertIn(flag, lines[0])
                    self.assertNotIn("ferry: backend", r.stderr)

    def test_a_good_value_still_works(self):
        r = run(["probe", "--backend", "host", "--bytes", "64KiB", "--iterations", "1", "--warmup", "0",
                 "--no-pin-cost", "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(j["options"]["copy_bytes"], 65536)
        self.assertEqual(j["options"]["iterations"], 1)
        self.assertEqual(j["options"]["warmup"], 0)


class subcommands(unittest.TestCase):
    def test_version_is_the_build_version(self):
        r = run(["--version"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), r"^ferry \S+$")
        probe = run(["probe", "--backend", "host", "--bytes", "64KiB", "--iterations", "1", "--no-pin-cost",
                     "--json"])
        self.assertEqual(r.stdout.strip(), "ferry " + json.loads(probe.stdout)["version"])

    def test_an_unknown_subcommand_is_named_with_the_valid_ones(self):
        for args, valid in ((["frob"], ["probe", "bench", "analyze"]),
                            (["bench", "egres"], ["egress", "ingest"])):
            r = run(args)
            self.assertEqual(r.returncode, 2, r.stderr)
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(f'"{args[-1]}"', lines[0])
            for v in valid:
                self.assertIn(v, lines[0])


class comm_benches(unittest.TestCase):
    def test_allreduce_on_the_host_backend_checks_every_element_and_reports_nccl_tests_columns(self):
        args = ["bench", "allreduce", "--backend", "host", "-b", "64K", "-e", "256K", "-f", "2", "-n", "2",
                "-w", "1", "--codec", "fp32,bf16"]
        r = run(args + ["--json"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(j["tool"], "ferry bench allreduce")
        self.assertEqual((j["backend"], j["ranks"]), ("host", 2))
        self.assertEqual([(row["size"], row["codec"]) for row in j["rows"]],
                         [(s, c) for s in (65536, 131072, 262144) for c in ("fp32", "bf16")])
        for row in j["rows"]:
            self.assertEqual(row["count"] * 4, row["size"])
            self.assertEqual(row["wire_bytes"], row["size"] // (1 if row["codec"] == "fp32" else 2))
            self.assertEqual(row["checked"], 2 * 2 * row["count"])  # 2 ranks, out of place and in place
            for side in ("out_of_place", "in_place"):
                self.assertEqual(row[side]["nwrong"], 0)
                self.assertAlmostEqual(row[side]["busbw"], row[side]["algbw"], places=9)  # 2(n-1)/n = 1
                self.assertGreater(row[side]["time_us"], 0)
        self.assertEqual(j["out_of_bounds"], "OK")
        self.assertEqual(sorted(j["average_bus_bandwidth"]), ["bf16", "fp32"])
        text = run(args + ["--ranks", "3", "--link", "host-memory"], timeout=120)
        self.assertEqual(text.returncode, 0, text.stderr)
        for column in ("algbw", "busbw", "effbw", "#wrong", "out-of-place", "in-place", "wire", "codec",
                       "# Out of bounds values : 0 OK", "# Avg bus bandwidth", "3 ranks", "host_memory"):
            self.assertIn(column, text.stdout)

    def test_allreduce_refuses_a_bad_codec_or_contradicting_flags_before_the_work(self):
        for extra, needle in ((["--codec", "fp8"], "--codec"), (["--codec", "fp32,,bf16"], "--codec"),
                              (["--codec", "fp32,powersgd"], "--codec"),
                              (["--check", "--no-check"], "--no-check"),
                              (["-b", "64M", "-e", "1M"], "--min-bytes"),
                              (["--bootstrap", "tcp"], "--bootstrap")):
            with self.subTest(extra=extra):
                r = run(["bench", "allreduce", "--backend", "host", *extra], timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(needle, lines[0])
                self.assertNotIn("ferry: backend", r.stderr)


    def test_ddp_on_the_host_backend_checks_every_gradient_and_reports_every_level(self):
        r = run(["bench", "ddp", "--backend", "host", "--link", "host-memory", "--step-ms", "10", "--steps", "2",
                 "--warmup", "1", "--learn-steps", "1", "--json"], timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual((j["ladder"], j["ranks"], j["comm_backend"]), ("ddp", 2, "host"))
        self.assertIn("host_memory", j["link"])
        levels = [row["level"] for row in j["rows"]]
        self.assertEqual(levels, ["single", "one-bucket", "25MB", "100MB", "fp16", "bf16", "powersgd", "auto",
                                  "auto-lossy"])
        for row in j["rows"]:
            self.assertEqual(row["wrong"], 0, row["level"])
            self.assertGreater(row["checked"], 0)
            for key in ("hidden", "exposed_ms", "comm_ms", "buckets", "lossy_buckets", "wire_mb"):
                self.assertIn(key, row)
        self.assertEqual(j["rows"][0]["ratio_to_ideal"], 1.0)
        self.assertEqual(j["rows"][1]["buckets"], 1)

    def test_ddp_trace_writes_each_levels_timeline_and_report_and_names_its_bottleneck(self):
        with tempfile.TemporaryDirectory() as tmp:
            base = os.path.join(tmp, "runs", "ddp.json")
            r = run(["bench", "ddp", "--backend", "host", "--levels", "single,25MB", "--step-ms", "10",
                     "--steps", "2", "--warmup", "1", "--json", "--trace", base], timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            j = json.loads(r.stdout)
            self.assertEqual([t["level"] for t in j["traces"]], ["single", "25MB"])
            for t in j["traces"]:
                self.assertEqual(t["trace_file"], os.path.join(tmp, "runs", f"ddp.{t['level']}.json"))
                self.assertGreater(t["events"], 0)
                self.assertIn("traceEvents", load_json(t["trace_file"]))
                self.assertTrue(os.path.getsize(t["html_file"]) > 0, t)
                self.assertTrue(t["bottleneck"], t)
            self.assertEqual(sorted(os.listdir(os.path.join(tmp, "runs"))),
                             ["ddp.25MB.html", "ddp.25MB.json", "ddp.single.html", "ddp.single.json"])
            # A --trace that cannot be written fails before the work, as on the other ladders.
            with open(os.path.join(tmp, "file"), "w") as f:
                f.write("x")
            bad = run(["bench", "ddp", "--backend", "host", "--levels", "single", "--trace",
                       os.path.join(tmp, "file", "t.json")], timeout=30)
            self.assertEqual(bad.returncode, 2, bad.stderr)
            self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
            self.assertIn("--trace", bad.stderr)
            self.assertNotIn("bench:", bad.stderr)

    def test_ddp_refuses_an_unknown_level_before_the_work(self):
        r = run(["bench", "ddp", "--backend", "host", "--levels", "single,2000MB"], timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("2000MB", r.stderr)
        self.assertNotIn("ferry: backend", r.stderr)


class memory(unittest.TestCase):
    def limited(self):
        # If ferry allocated before checking, it would fail on this limit (or be killed), not with its
        # own message.
        lim = 2 << 30
        return lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    def test_sizes_beyond_the_device_are_refused_before_allocating(self):
        for args, needle in ((["probe", "--backend", "host", "--bytes", "16GiB"], "device memory"),
                             (["bench", "ingest", "--backend", "host", "--shape", "64x3x512x512",
                               "--depth", "1000", "--levels", "ideal,L3"], "device memory"),
                             (["bench", "egress", "--backend", "host", "--slots", "200", "--slot-bytes",
                               "1GiB", "--levels", "ferry"], "host memory")):
            with self.subTest(args=args):
                t0 = time.monotonic()
                r = run(args, timeout=60, preexec_fn=self.limited())
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertNotIn("probe:", r.stderr)  # nothing measured
                self.assertNotIn("bench:", r.stderr)
                self.assertLess(time.monotonic() - t0, 50)


class output_paths(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        with open(os.path.join(self.tmp, "file"), "w") as f:
            f.write("x")

    def tearDown(self):
        self.dir.cleanup()

    def test_bad_output_paths_fail_before_the_work(self):
        under_file = os.path.join(self.tmp, "file", "t.json")
        for args in (["bench", "ingest", "--backend", "host", "--levels", "ideal,L0", "--steps", "2",
                      "--trace", under_file],
                     ["bench", "egress", "--backend", "host", "--levels", "ideal", "--steps", "2", "--json",
                      "--output", "/proc/ferry_out.json"],
                     ["probe", "--backend", "host", "--output", os.path.join(self.tmp, "no", "p.json")],
                     ["analyze", KINETO, "--html", os.path.join(self.tmp, "no", "r.html")],
                     ["analyze", KINETO, "--output", self.tmp]):
            with self.subTest(args=args):
                r = run(args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertNotIn("bench:", r.stderr)
                self.assertEqual(r.stdout, "")

    def fsize_limited(self, limit):
        def pre():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return pre

    def test_a_full_disk_leaves_no_partial_file(self):
        out = os.path.join(self.tmp, "out")
        os.mkdir(out)
        for args in (["analyze", KINETO, "--json", "--output", os.path.join(out, "a.json")],
                     ["analyze", KINETO, "--html", os.path.join(out, "a.html")],
                     ["bench", "ingest", "--backend", "host", "--levels", "ideal,L0", "--steps", "2",
                      "--warmup", "0", "--trace", os.path.join(out, "t.json")]):
            with self.subTest(args=args):
                r = run(args, timeout=120, preexec_fn=self.fsize_limited(2048))
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(out, r.stderr)
                self.assertEqual(os.listdir(out), [])

    def test_outputs_written_whole(self):
        path = os.path.join(self.tmp, "a.json")
        r = run(["analyze", KINETO, "--json", "--output", path])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("findings", load_json(path))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["a.json", "file"])


class statuses(unittest.TestCase):
    def test_the_header_names_each_status_once(self):
        self.assertEqual(STATUS, {"ok": 0, "error": 1, "usage": 2, "wrong_data": 3, "finding": 4,
                                  "interrupted": 130})

    def test_wrong_bytes_are_status_3_and_a_usage_error_2(self):
        ladder = ["bench", "egress", "--backend", "host", "--levels", "ideal,L0", "--steps", "1", "--warmup", "0"]
        good = run([*ladder, "--json"], timeout=120)
        self.assertEqual(good.returncode, STATUS["ok"], good.stderr)
        self.assertEqual([r["wrong"] for r in json.loads(good.stdout)["rows"]], [None, 0])  # ideal checks nothing
        wrong = run([*ladder, "--json", "--inject-wrong-byte"], timeout=120)
        self.assertEqual(wrong.returncode, STATUS["wrong_data"], wrong.stderr)
        self.assertEqual([r["wrong"] for r in json.loads(wrong.stdout)["rows"]], [None, 1])  # still printed
        pure = run(["bench", "egress", "--backend", "host", "--pure-copy", "2", "--inject-wrong-byte"], timeout=120)
        self.assertEqual(pure.returncode, STATUS["wrong_data"], pure.stderr)
        self.assertIn("1 mismatches", pure.stdout)
        for usage in ([*ladder, "--steps", "0"], [*ladder, "--inject-wrong-byte", "--no-check"], ["frob"]):
            with self.subTest(args=usage):
                r = run(usage, timeout=30)
                self.assertEqual(r.returncode, STATUS["usage"], r.stderr)
                self.assertEqual(r.stdout, "")
        missing = run(["analyze", os.path.join(ROOT, "no-such-trace.json")])
        self.assertEqual(missing.returncode, STATUS["error"], missing.stderr)


class analyze_for_ci(unittest.TestCase):
    def test_fail_on_a_present_finding_is_status_4_after_the_analysis(self):
        prefetch = os.path.join(ROOT, "tests", "trace", "data", "kineto_prefetch.json")
        for trace, fail_on, status in ((KINETO, "gpu_idle", "finding"), (KINETO, "device_sync,sync_copy", "finding"),
                                       (KINETO, "any", "finding"), (KINETO, "device_sync", "ok"),
                                       (prefetch, "any", "ok"), (prefetch, "compute_bound", "finding")):
            with self.subTest(trace=os.path.basename(trace), fail_on=fail_on):
                r = run(["analyze", trace, "--fail-on", fail_on, "--json"])
                self.assertEqual(r.returncode, STATUS[status], r.stderr)
                rules = [f["rule"] for f in json.loads(r.stdout)["findings"]]  # printed whole either way
                if status == "finding":
                    self.assertRegex(r.stderr, r"--fail-on: .*finding")
                    self.assertTrue(any(rule in rules for rule in fail_on.split(",")) or fail_on == "any")

    def test_an_unknown_rule_is_refused_naming_the_known_ones_before_reading(self):
        for value in ("gpu-idle", "gpu_idle,nope", ","):
            with self.subTest(value=value):
                r = run(["analyze", os.path.join(ROOT, "no-such-trace.json"), "--fail-on", value])
                self.assertEqual(r.returncode, STATUS["usage"], r.stderr)
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn("--fail-on", lines[0])
                for known in ("gpu_idle", "sync_copy", "drain_tail", "any"):
                    self.assertIn(known, lines[0])
                self.assertNotIn("no-such-trace", r.stderr)

    def test_a_pytorch_trace_gets_pytorch_fixes(self):
        r = run(["analyze", KINETO])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("DataLoader(num_workers=..., pin_memory=True)", r.stdout)
        self.assertIn(".to(device, non_blocking=True)", r.stdout)
        self.assertIn("ferry.torch.Prefetcher", r.stdout)
        self.assertNotIn("ferry::", r.stdout)


class emulator_numbers(unittest.TestCase):
    def test_the_emulated_link_is_shown_and_the_ceiling_has_no_link_figures(self):
        args = ["bench", "ingest", "--backend", "host", "--levels", "ideal,L2", "--steps", "2", "--warmup", "0"]
        text = run(args, timeout=120)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertRegex(text.stdout, r"emulated link: the emulator models pinned H2D at \d+\.\d\d GB/s, a PCIe "
                                      r"gen5 x16 link's 53\.6 GB/s slowed 24 times")
        lines = text.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("level"))
        header, rows = lines[at], {line.split()[0]: line.split() for line in lines[at + 1:at + 3]}
        self.assertIn("H2D GB/s", header)
        self.assertEqual(rows["ideal"][3:5], ["-", "-"])  # H2D GB/s and % link do not apply
        self.assertNotIn("-", rows["L2"][3:5])
        j = json.loads(run([*args, "--json"], timeout=120).stdout)
        self.assertAlmostEqual(j["emulated_link"]["slowdown"], 24)
        self.assertAlmostEqual(j["emulated_link"]["reference_gbps"], 53.6)
        ideal, l2 = j["rows"]
        self.assertIsNone(ideal["gbps"])
        self.assertIsNone(ideal["link_fraction"])
        self.assertIsNone(ideal["h2d_gbps"])
        self.assertGreater(l2["gbps"], 0)


class interrupts(unittest.TestCase):
    def start_ladder(self, trace_dir):
        return subprocess.Popen(
            [FERRY, "bench", "ingest", "--backend", "host", "--levels", "ideal,L0,L1,L2", "--steps", "30",
             "--warmup", "1", "--json", "--trace", os.path.join(trace_dir, "t.json")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)

    def wait_for_line(self, p, pattern, timeout=120):
        seen = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([p.stderr], [], [], 1)
            if ready:
                line = p.stderr.readline()
                seen += line
                if re.search(pattern, line):
                    return seen
        p.kill()
        self.fail(f"no line matching {pattern!r} on stderr:\n{seen}")

    def test_ctrl_c_prints_the_finished_levels_and_exits_130(self):
        with tempfile.TemporaryDirectory() as d:
            p = self.start_ladder(d)
            self.wait_for_line(p, r"^bench: L0: ")  # ideal finished, L0 under way
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 130, err)
            result = json.loads(out)
            self.assertTrue(result["interrupted"])
            levels = [row["level"] for row in result["rows"]]
            self.assertEqual(levels, ["ideal", "L0"])  # the level under way finishes; none starts
            for t in result["traces"]:
                load_json(t["trace_file"])  # complete traces only
            self.assertEqual([n for n in os.listdir(d) if n.startswith(".")], [])

    def test_a_second_ctrl_c_stops_at_once_and_leaves_no_partial_file(self):
        with tempfile.TemporaryDirectory() as d:
            p = self.start_ladder(d)
            self.wait_for_line(p, r"^bench: L0: ")
            p.send_signal(signal.SIGINT)
            time.sleep(0.2)
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=120)
            self.assertEqual(p.returncode, 130)
            self.assertEqual([n for n in os.listdir(d) if n.startswith(".")], [])
            for n in os.listdir(d):
                if n.endswith(".json"):
                    load_json(os.path.join(d, n))


class terminal(unittest.TestCase):
    def test_names_from_a_trace_cannot_drive_the_terminal(self):
        with open(KINETO) as f:
            text = f.read()
        self.assertIn('"make batch"', text)
        hostile = text.replace('"make batch"', '"make\\u001b[2J\\u001b]0;owned\\u0007 batch"')
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(hostile)
        try:
            r = subprocess.run([FERRY, "analyze", f.name], capture_output=True, cwd=ROOT, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn(b"\x1b", r.stdout)
            self.assertNotIn(b"\x07", r.stdout)
            self.assertIn(b"make\\x1b[2J\\x1b]0;owned\\x07 batch", r.stdout)
        finally:
            os.unlink(f.name)

    def test_progress_is_drawn_on_a_terminal_only(self):
        args = [FERRY, "bench", "ingest", "--backend", "host", "--levels", "ideal", "--steps", "2"]
        piped = subprocess.run(args, capture_output=True, cwd=ROOT, timeout=120)
        self.assertEqual(piped.returncode, 0)
        self.assertNotIn(b"\r", piped.stderr)
        self.assertNotIn(b"\x1b", piped.stderr)
        self.assertIn(b"bench: ideal", piped.stderr)
        seen = self.read_pty(args, stdout_too=False)
        self.assertIn(b"\r\x1b[K", seen)
        self.assertIn(b"bench: ideal", seen)

    def read_pty(self, args, stdout_too=True):
        """Runs `args` with stderr (and stdout, unless `stdout_too` is False: then it goes nowhere) on a
        terminal, as a user's shell does; returns all it wrote there."""
        master, slave = pty.openpty()
        p = subprocess.Popen(args, stdout=slave if stdout_too else subprocess.DEVNULL, stderr=slave, cwd=ROOT)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        p.wait(timeout=120)
        os.close(master)
        self.assertEqual(p.returncode, 0, seen)
        return seen

    def test_the_status_line_is_cleared_before_the_table_and_counts_steps(self):
        # 6 steps of 300 ms at L0, which waits for each step: the status line is redrawn as each step
        # starts, with the steps of the total, and from the fifth (1.2 s after the first) with the time left
        # at the pace so far.
        seen = self.read_pty([FERRY, "bench", "ingest", "--backend", "host", "--levels", "L0", "--steps", "6",
                              "--warmup", "0", "--compute-ms", "300"])
        table = seen.index(b"ingest ladder on")
        # What the terminal shows on the table's first line before it: after the last newline, whatever
        # the last erase (carriage return, erase to end of line) left.
        line = seen[:table].rsplit(b"\n", 1)[-1].rsplit(b"\r\x1b[K", 1)[-1]
        self.assertEqual(line, b"", seen[:table])
        self.assertRegex(seen[:table], rb"step [1-6] of 6")
        self.assertRegex(seen[:table], rb"step [5-6] of 6, about \d+ s left")


if __name__ == "__main__":
    unittest.main(verbosity=1)
