"""Host time per flashsel.topk call from Python, and of each step of it.

Run on a CUDA machine: python3 bench/py_overhead.py. Each line is the
wall-clock time per call (us, perf_counter over N calls after a warm-up, the
GPU work asynchronous and short), so it is the host cost whenever it exceeds
the kernel's time (1 x 262,144 k512: ~12 us).
"""

import sys
import time

import torch

import flashsel
from flashsel import _native

N = 3000


def per_call_us(fn, n=N):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    el = time.perf_counter() - t0
    torch.cuda.synchronize()
    return el / n * 1e6


def main():
    dev = torch.device("cuda:0")
    rows, cols, k = (int(a) for a in (sys.argv[1:4] if len(sys.argv) >= 4 else (1, 262144, 512)))
    x = torch.randn(rows, cols, device=dev)
    flashsel.topk(x, k)
    torch.cuda.synchronize()
    stride = cols
    out = torch.empty((rows, k), dtype=torch.int32, device=dev)
    nb = _native.cuda_workspace_bytes(0, "f32", rows, cols, stride, k, "score", "lowest", False)
    ws = torch.empty(max(nb, 1), dtype=torch.uint8, device=dev)
    s = torch.cuda.current_stream(dev).cuda_stream
    steps = [
        ("flashsel.topk (whole call)", lambda: flashsel.topk(x, k)),
        ("torch.topk", lambda: torch.topk(x, k)),
        ("_native.check_spec", lambda: _native.check_spec("f32", rows, cols, stride, k, "score", "lowest")),
        ("_native.cuda_workspace_bytes", lambda: _native.cuda_workspace_bytes(0, "f32", rows, cols, stride, k, "score", "lowest", False)),
        ("_native.cuda_select (buffers given)", lambda: _native.cuda_select(0, "f32", rows, cols, stride, k, "score", "lowest", x.data_ptr(), None, out.data_ptr(), None, ws.data_ptr(), nb, s)),
        ("torch.empty (rows, k) int32", lambda: torch.empty((rows, k), dtype=torch.int32, device=dev)),
        ("torch.empty workspace u8", lambda: torch.empty(max(nb, 1), dtype=torch.uint8, device=dev)),
        ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream(dev).cuda_stream),
        ("x.detach(); x.stride(); x.data_ptr()", lambda: (x.detach(), x.stride(0), x.data_ptr())),
        ("scores.device.index, dtype name", lambda: (x.device.index, flashsel._api._torch_dtype_name(torch, x.dtype))),
    ]
    print(f"shape {rows} x {cols} k {k}, {N} calls each")
    for name, fn in steps:
        print(f"{per_call_us(fn):9.2f} us  {name}")


if __name__ == "__main__":
    main()
