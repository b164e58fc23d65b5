"""--cpus for the examples, applied before torch is imported (this module imports nothing heavy), so
torch's thread pools size themselves to the limit and worker processes inherit it."""
import os


def limit_cpus_early(argv):
    """Applies --cpus before torch is imported, so its thread pools size themselves to the limit."""
    for i, a in enumerate(argv):
        value = a.split("=", 1)[1] if a.startswith("--cpus=") else argv[i + 1] if a == "--cpus" and i + 1 < len(argv) else None
        if value is not None:
            try:
                n = int(value)
            except ValueError:
                raise SystemExit(f"--cpus {value!r}: expected a number of cores")
            allowed = sorted(os.sched_getaffinity(0))
            if not 1 <= n <= len(allowed):
                raise SystemExit(f"--cpus {n}: this process may use 1 to {len(allowed)} cores")
            os.sched_setaffinity(0, allowed[:n])

