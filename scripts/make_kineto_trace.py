#!/usr/bin/env python3
"""Writes a large synthetic PyTorch profiler (Kineto) trace, to measure `ferry analyze` on big inputs.

    scripts/make_kineto_trace.py OUT.json [--bytes 1G] [--style kineto|compact] [--gzip]

--style kineto (default) writes what torch.profiler's export_chrome_trace writes, record for record:
process and thread metadata, ProfilerStep# spans (user_annotation), python_function and cpu_op spans with
their args (input dims and types, External id, ...), cuda_runtime calls (cudaLaunchKernel,
cudaMemcpyAsync, cudaStreamSynchronize, cudaEventSynchronize), their flows to the GPU (ac2g "s"/"f"),
kernels with launch geometry, H2D and D2H copies with bytes and bandwidth, memsets, cuda_sync
"Event Sync" records with "stream": -1, gpu_user_annotation spans, in Kineto's indented layout. Each
step copies a batch in, runs a forward and backward of kernels, and copies a result out.
--style compact writes the smallest complete events (one line each, few fields): the most events per
byte, the reader's worst case for memory.
Deterministic: the same arguments write the same bytes.
"""
import argparse
import gzip
import random
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text):
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


KERNELS = [
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)",
    "ampere_sgemm_128x64_tn",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)",
]
OPS = ["aten::linear", "aten::gelu", "aten::layer_norm", "aten::addmm", "aten::mean"]


class kineto_writer:
    def __init__(self, out, budget, rng):
        self.out, self.budget, self.rng = out, budget, rng
        self.written = 0
        self.first = True
        self.corr = 1
        self.ext = 1
        self.ts = 1_700_000_000_000.0  # microseconds, as Kineto writes them (3 decimals)
        self.events = 0

    def emit(self, text):
        if not self.first:
            text = "," + text
        self.first = False
        self.out.write(text)
        self.written += len(text)
        self.events += 1

    def x(self, cat, name, pid, tid, ts, dur, args):
        self.emit(
            f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n{args}\n    }}\n  }}'
        )

    def flow(self, ph, corr, pid, tid, ts):
        extra = ', "bp": "e"' if ph == "f" else ""
        self.emit(
            f'\n  {{\n    "ph": "{ph}", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g"{extra}\n  }}'
        )

    def header(self):
        self.out.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, "name": "NVIDIA H100 80GB HBM3", '
            '"totalGlobalMem": 85045460992,\n      "computeMajor": 9, "computeMinor": 0\n    }\n  ],\n'
            '  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n'
            '  "traceEvents": ['
        )
        for pid, name, label in ((4242, "python 4242", "CPU"), (0, "python 0", "GPU 0")):
            self.emit(f'\n  {{\n    "name": "process_name", "ph": "M", "ts": 0, "pid": {pid}, "tid": 0,\n    "args": {{\n      "name": "{name}"\n    }}\n  }}')
            self.emit(f'\n  {{\n    "name": "process_labels", "ph": "M", "ts": 0, "pid": {pid}, "tid": 0,\n    "args": {{\n      "labels": "{label}"\n    }}\n  }}')
        for tid, name in ((4242, "thread 4242 (python)"), (4250, "thread 4250 (pt_autograd_0)")):
            self.emit(f'\n  {{\n    "name": "thread_name", "ph": "M", "ts": 0, "pid": 4242, "tid": {tid},\n    "args": {{\n      "name": "{name}"\n    }}\n  }}')
        for s in (7, 13):
            self.emit(f'\n  {{\n    "name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": {s},\n    "args": {{\n      "name": "stream {s} "\n    }}\n  }}')

    def launch(self, tid, t, kernel_start, ki):
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", "cudaLaunchKernel", 4242, tid, t, 4.2,
               f'      "External id": {self.ext}, "cbid": 211, "correlation": {corr}')
        self.flow("s", corr, 4242, tid, t)
        dur = 20 + (ki * 7) % 90
        grid = 132 * (1 + ki % 4)
        self.x("kernel", KERNELS[ki % len(KERNELS)], 0, 7, kernel_start, dur,
               f'      "External id": {self.ext},\n      "queued": 0, "device": 0, "context": 1,\n'
               f'      "stream": 7, "correlation": {corr},\n      "registers per thread": 128,\n'
               f'      "shared memory": 49152,\n      "blocks per SM": {grid / 132:.6f},\n'
               f'      "warps per SM": {grid * 8 / 132:.6f},\n      "grid": [{grid}, 1, 1],\n'
               f'      "block": [256, 1, 1],\n      "est. achieved occupancy %": 50')
        self.flow("f", corr, 0, 7, kernel_start)
        return kernel_start + dur

    def copy(self, tid, t, gpu_t, h2d, nbytes):
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", "cudaMemcpyAsync", 4242, tid, t, 6.1,
               f'      "External id": {self.ext}, "cbid": 41, "correlation": {corr}')
        self.flow("s", corr, 4242, tid, t)
        name = "Memcpy HtoD (Pinned -> Device)" if h2d else "Memcpy DtoH (Device -> Pageable)"
        dur = nbytes / 20_000.0
        self.x("gpu_memcpy", name, 0, 13 if h2d else 7, gpu_t, dur,
               f'      "External id": {self.ext},\n      "device": 0, "context": 1,\n      "stream": {13 if h2d else 7}, '
               f'"correlation": {corr},\n      "bytes": {nbytes}, "memory bandwidth (GB/s)": {nbytes / dur / 1000:.6f}')
        self.flow("f", corr, 0, 13 if h2d else 7, gpu_t)
        return gpu_t + dur

    def op(self, name, tid, t, dims):
        self.ext += 1
        self.x("cpu_op", name, 4242, tid, t, 30.0,
               f'      "External id": {self.ext},"Record function id": 0, "Ev Idx": {self.ext},\n'
               f'      "Input Dims": [{dims}, [512, 1024], [512]], "Input type": ["float", "float", "float"],\n'
               f'      "Input Strides": [[1024, 1], [1024, 1], [1]], "Concrete Inputs": ["", "", ""], "Sequence number": {self.ext}, "Fwd thread id": 0')

    def step(self, n):
        t0 = self.ts
        self.x("user_annotation", f"ProfilerStep#{n}", 4242, 4242, t0, 5000.0,
               f'      "External id": {self.ext},"Record function id": 0, "Ev Idx": {self.ext}')
        self.x("gpu_user_annotation", f"ProfilerStep#{n}", 0, 7, t0 + 10, 4900.0,
               f'      "External id": {self.ext}')
        self.x("python_function", "torch/utils/data/dataloader.py(631): __next__", 4242, 4242, t0 + 1, 400.0,
               f'      "Python parent id": 1, "Python id": {self.ext}, "Python thread": 0')
        gpu = t0 + 420
        gpu = self.copy(4242, t0 + 405, gpu, True, 4 << 20)
        t = t0 + 450
        for k in range(24):
            self.x("python_function", "nn.Module: Linear_0", 4242, 4242, t, 35.0,
                   f'      "Python parent id": 2, "Python id": {self.ext + k}, "Python thread": 0')
            self.op(OPS[k % len(OPS)], 4242, t + 1, f"[{32 + k % 3}, 512]")
            gpu = max(gpu, t + 8)
            gpu = self.launch(4242, t + 5, gpu + 1, k)
            t += 40
        for k in range(24):  # backward, on the autograd thread
            self.op(OPS[k % len(OPS)] + "_backward", 4250, t + 1, "[32, 512]")
            gpu = self.launch(4250, t + 5, max(gpu, t + 8) + 1, k + 1)
            t += 40
        gpu = self.copy(4242, t, gpu + 2, False, 1 << 16)
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", "cudaStreamSynchronize", 4242, 4242, t + 8, gpu - t, f'      "cbid": 131, "correlation": {corr}')
        self.x("cuda_sync", "Event Sync", 0, 7, t + 9, gpu - t - 2,
               f'      "device": 0, "stream": -1, "correlation": {corr}, "event": 0')
        self.ts = max(t0 + 5000.0, gpu + 50)

    def footer(self):
        self.out.write('\n],\n  "traceName": "synthetic.pt.trace.json",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1700000000000000000\n}\n')


def write_kineto(out, budget, rng):
    w = kineto_writer(out, budget, rng)
    w.header()
    n = 0
    while w.written < budget:
        w.step(n)
        n += 1
    w.footer()
    return w.events


def write_compact(out, budget, rng):
    out.write('{"traceEvents":[\n')
    written, n, ts = 0, 0, 1000
    cats = ('"cat":"kernel","name":"k","pid":0,"tid":7', '"cat":"cpu_op","name":"op","pid":1,"tid":1',
            '"cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1', '"cat":"user_annotation","name":"ProfilerStep#0","pid":1,"tid":1')
    while written < budget:
        c = cats[0] if n % 2 == 0 else cats[1 + (n // 2) % 2] if n % 1000 else cats[3]
        line = f'{"," if n else ""}{{"ph":"X",{c},"ts":{ts},"dur":{1000 if c is cats[3] else 1}}}\n'
        out.write(line)
        written += len(line)
        n += 1
        ts += 1
    out.write("]}\n")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--bytes", default="1G", help="approximate size of the JSON text (default 1G)")
    ap.add_argument("--style", choices=("kineto", "compact"), default="kineto")
    ap.add_argument("--gzip", action="store_true", help="gzip the output (as tensorboard_trace_handler does)")
    args = ap.parse_args()
    budget = parse_bytes(args.bytes)
    raw = gzip.open(args.out, "wt", compresslevel=1) if args.gzip else open(args.out, "w", buffering=1 << 20)
    with raw as out:
        events = (write_kineto if args.style == "kineto" else write_compact)(out, budget, random.Random(0))
    print(f"{args.out}: {events} events", file=sys.stderr)


if __name__ == "__main__":
    main()
