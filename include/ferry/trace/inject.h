/* The protocol between `ferry trace` (the launcher, src/launch/launch.cpp), the library it injects
 * into every process of the recorded program (libferry_inject.so, src/inject) and that library's Python
 * side (python/ferry/_trace_site/sitecustomize.py): the environment each process starts with, its
 * defaults, and the functions the Python side calls. The one owner of these names: the C++ parts include
 * this header, and tests/python/test_trace_site.py proves sitecustomize.py's copies against it, as
 * test_header.py proves ferry/_c.py against ferry.h. A C header, so that both languages read it. */
#ifndef FERRY_TRACE_INJECT_H
#define FERRY_TRACE_INJECT_H

/* ---- set by the launcher for every process it starts (inherited by their children) ---- */
/* The folder each process writes its <pid>.ferry-proc file into; unset, the library records nothing. */
#define FERRY_TRACE_ENV_DIR "FERRY_TRACE_DIR"
/* The capture switch file: "on" or "off", written by the launcher (--delay, --duration). */
#define FERRY_TRACE_ENV_CONTROL "FERRY_TRACE_CONTROL"
/* "on": capture from the start; "off": wait for the switch, the steps or the NVTX range. */
#define FERRY_TRACE_ENV_CAPTURE "FERRY_TRACE_CAPTURE"
/* "1": kernels, copies and memsets only (--lite). */
#define FERRY_TRACE_ENV_LITE "FERRY_TRACE_LITE"
/* "0": no synchronization records (--no-syncs). */
#define FERRY_TRACE_ENV_SYNCS "FERRY_TRACE_SYNCS"
/* "1": every CUDA runtime call, the quiet queries included (--all-runtime-calls). */
#define FERRY_TRACE_ENV_ALL_CALLS "FERRY_TRACE_ALL_CALLS"
/* Blocking calls at least this many microseconds long are recorded (--block-us). */
#define FERRY_TRACE_ENV_BLOCK_US "FERRY_TRACE_BLOCK_US"
#define FERRY_TRACE_DEFAULT_BLOCK_US 100
#define FERRY_TRACE_MAX_BLOCK_US 10000000
/* How often each process appends to its file, in milliseconds: what a killed process loses (--flush-ms). */
#define FERRY_TRACE_ENV_FLUSH_MS "FERRY_TRACE_FLUSH_MS"
#define FERRY_TRACE_DEFAULT_FLUSH_MS 50
#define FERRY_TRACE_MAX_FLUSH_MS 10000
/* "A:B": capture training steps A to B (--steps). */
#define FERRY_TRACE_ENV_STEPS "FERRY_TRACE_STEPS"
/* "NAME[@DOMAIN]": capture inside this NVTX range (--capture-range nvtx --nvtx-capture). */
#define FERRY_TRACE_ENV_NVTX_CAPTURE "FERRY_TRACE_NVTX_CAPTURE"
/* The path of libferry_inject.so, for the Python side to load. */
#define FERRY_TRACE_ENV_INJECT "FERRY_TRACE_INJECT"
/* "1": Python processes annotate their training loops (the sitecustomize folder is on PYTHONPATH). */
#define FERRY_TRACE_ENV_PYTHON "FERRY_TRACE_PYTHON"

/* ---- set by a user ---- */
/* The sitecustomize folder the launcher puts first on PYTHONPATH (default: the one beside ferry). */
#define FERRY_TRACE_ENV_SITE "FERRY_TRACE_SITE"
/* "1": the Python side says once on stderr why it turned itself off. */
#define FERRY_TRACE_ENV_DEBUG "FERRY_TRACE_DEBUG"
/* "1": CUPTI's records are converted on the flushing thread (cupti::options::defer_conversion). */
#define FERRY_TRACE_ENV_DEFER_CONVERSION "FERRY_TRACE_DEFER_CONVERSION"

/* ---- what libferry_inject.so exports to the Python side ---- */
#ifdef __cplusplus
extern "C" {
#endif
/* 1 when this process records (ferry trace started it), else 0. */
int ferry_inject_recording(void);
/* A finished range on the calling thread; times on CLOCK_MONOTONIC (Python's time.monotonic_ns()). */
void ferry_inject_range(const char* name, const char* domain, long long start_ns, long long end_ns);
/* Training step `index` spanning [start_ns, end_ns] on the calling thread. */
void ferry_inject_step(long long index, long long start_ns, long long end_ns);
#ifdef __cplusplus
}
#endif

#endif /* FERRY_TRACE_INJECT_H */
