import cProfile, pstats, sys, time, torch, flashsel
from flashsel import _native
dev = torch.device("cuda:0")
for rows, cols, k in ((1, 262144, 512), (1, 4096, 8)):
    x = torch.randn(rows, cols, device=dev)
    flashsel.topk(x, k); torch.cuda.synchronize()
    out = torch.empty((rows, k), dtype=torch.int32, device=dev)
    nb = _native.cuda_workspace_bytes(0, "f32", rows, cols, cols, k, "score", "lowest", False)
    ws = torch.empty(max(nb, 1), dtype=torch.uint8, device=dev)
    s = torch.cuda.current_stream(dev).cuda_stream
    def t(fn, n=3000):
        for _ in range(50): fn()
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(n): fn()
        el = time.perf_counter() - t0; torch.cuda.synchronize(); return el / n * 1e6
    print(rows, cols, k, "whole %.2f us" % t(lambda: flashsel.topk(x, k)),
          "cuda_select %.2f us" % t(lambda: _native.cuda_select(0, "f32", rows, cols, cols, k, "score", "lowest", x.data_ptr(), None, out.data_ptr(), None, ws.data_ptr(), nb, s)),
          "raw stream %.2f us" % t(lambda: torch._C._cuda_getCurrentRawStream(0)),
          "x.device %.2f us" % t(lambda: x.device),
          "x.get_device %.2f us" % t(lambda: x.get_device()))
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3000): flashsel.topk(x, k)
    pr.disable(); torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
