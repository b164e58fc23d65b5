"""One shape per result: `ferry probe --json` (the CLI) and ferry.probe() (the C ABI) write the probe
result through one function, and a device has the same keys in Device.info, in a probe result and in a
bench result. The CLI half runs where FERRY_CLI names the CLI (ctest and scripts/test.sh set it)."""
import json
import os
import subprocess

import pytest

import ferry

# What each side adds to the shared result: the CLI its run stamp, the C ABI the CLI's table.
CLI_ONLY = {"tool", "date", "command", "version"}
C_ONLY = {"table"}
# Device.info adds why "auto" chose the device it did.
DEVICE_INFO_ONLY = {"reason"}
SMALL = ["--bytes", "1MiB", "--iterations", "1", "--warmup", "0", "--pin-bytes", "1MiB"]


def key_paths(j, prefix=""):
    """Every key of a JSON value as a dotted path (list items merged under `[]`)."""
    out = set()
    if isinstance(j, dict):
        for k, v in j.items():
            out.add(prefix + k)
            out |= key_paths(v, prefix + k + ".")
    elif isinstance(j, list):
        for v in j:
            out |= key_paths(v, prefix + "[].")
    return out


def cli_json(args):
    cli = os.environ.get("FERRY_CLI")
    if not cli:
        pytest.skip("FERRY_CLI is not set (the CLI's half of the comparison)")
    return json.loads(subprocess.run([cli, *args], check=True, capture_output=True, text=True).stdout)


def test_the_cli_and_the_c_abi_write_the_same_probe_result(backend):
    c = ferry.probe(backend, copy_bytes=1 << 20, iterations=1, warmup=0, pin_bytes=1 << 20).raw
    cli = cli_json(["probe", "--backend", backend, "--json", *SMALL])
    assert set(cli) - CLI_ONLY == set(c) - C_ONLY
    assert key_paths({k: v for k, v in cli.items() if k not in CLI_ONLY}) == \
        key_paths({k: v for k, v in c.items() if k not in C_ONLY})
    assert [x["name"] for x in cli["links"]] == [x["name"] for x in c["links"]]
    assert cli["device"] == c["device"]


def test_a_device_has_one_shape_everywhere(backend):
    info = ferry.Device(backend).info
    device_keys = set(info) - DEVICE_INFO_ONLY
    assert device_keys == {"backend", "name", "ordinal", "memory_bytes", "pci_bus_id", "copy_engines"}
    c = ferry.probe(backend, copy_bytes=1 << 20, iterations=1, warmup=0, pin_bytes=1 << 20).raw
    assert c["device"] == {k: info[k] for k in device_keys}
    probe = cli_json(["probe", "--backend", backend, "--json", *SMALL])
    bench = cli_json(["bench", "egress", "--backend", backend, "--levels", "ideal", "--steps", "1",
                      "--warmup", "0", "--probed-d2h", "1", "--json"])
    assert probe["device"] == c["device"]
    assert bench["device"] == c["device"]
