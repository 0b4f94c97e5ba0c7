"""Sparse MLA on CUDA tensors: the kernels against the CPU float64 reference
(the same call on CPU copies) with FlashMLA's tolerances, the derived
topk_length's bits, strided caches, the current stream, CUDA graphs and
torch.compile. Skipped without torch or a CUDA device."""

import numpy as np
import pytest

import flashsel

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

OUT_TOL = (8e-4, 3.01 / 128, 7e-6)
LSE_TOL = (1e-6, 2.01 / 65536, 1e-7)
BAD = [-(2**31), -123456, -1, 2**31 - 1, 2147480000]


def close(what, got, want, tol):
    """FlashMLA's check_is_allclose: inf / NaN at the same places, each other
    element within abs or rel, and the cosine difference."""
    a, b = got.detach().double().cpu().numpy().ravel(), want.detach().double().cpu().numpy().ravel()
    for f in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(f(a), f(b)), f"{what}: inf / NaN positions differ"
    fin = np.isfinite(b)
    a, b = a[fin], b[fin]
    err = np.abs(a - b)
    ok = (err < tol[0]) | (err / (np.abs(b) + 1e-6) < tol[1])
    assert ok.all(), f"{what}: {np.count_nonzero(~ok)} elements off, worst {err.max():e}"
    den = (a * a).sum() + (b * b).sum()
    if (b * b).sum() >= 1e-12:
        assert abs(1 - 2 * (a * b).sum() / den) <= tol[2], f"{what}: cosine difference"


def indices(rng, rows, topk, bound):
    """Valid prefixes of random length (duplicates), a few interior invalid
    entries, invalid tails of FlashMLA's kinds, ~2% rows all invalid."""
    bad = BAD + [v for v in (bound, 114514) if v >= bound]
    out = np.empty((rows, topk), np.int32)
    for r in range(rows):
        n = 0 if rng.random() < 0.02 or bound == 0 else int(rng.integers(1, min(topk, bound) + 1))
        row = rng.integers(0, max(bound, 1), topk).astype(np.int64)
        row[n:] = bad[r % len(bad)]
        interior = rng.random(topk) < 0.03
        interior[max(n - 1, 0):] = False
        row[interior] = -1
        out[r] = row
    return out


def prefill_inputs(rng, s_q, s_kv, h_q, d_qk, topk, dtype, pad=0, sink=False, lengths=False):
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    q = torch.randn(s_q, h_q, d_qk, generator=g).to(dtype)
    kv_full = torch.randn(s_kv, 1, d_qk + pad, generator=g).to(dtype)
    kv = kv_full[:, :, :d_qk]  # strided rows when pad > 0
    idx = torch.from_numpy(indices(rng, s_q, topk, s_kv))[:, None, :]
    # Poison every kv row no entry attends (and the padding).
    lens = torch.from_numpy(rng.integers(0, topk + 1, s_q).astype(np.int32)) if lengths else None
    used = np.zeros(s_kv, bool)
    for r in range(s_q):
        row = idx[r, 0].numpy()[: (topk if lens is None else int(lens[r]))]
        used[row[(row >= 0) & (row < s_kv)]] = True
    kv_full[torch.from_numpy(~used)] = float("nan")
    kv_full[:, :, d_qk:] = float("nan")
    s = torch.randn(h_q, generator=g) if sink else None
    if s is not None and h_q > 2:
        s[1], s[2] = float("inf"), float("-inf")
    return q, kv, idx, s, lens


def cuda(*xs):
    return [None if x is None else x.cuda() for x in xs]


@pytest.mark.parametrize(
    "s_q,s_kv,h_q,d_qk,topk,dtype,pad,sink,lengths",
    [
        (1, 128, 128, 576, 128, torch.bfloat16, 0, False, False),
        (62, 592, 16, 512, 128, torch.bfloat16, 3, True, False),
        (213, 1592, 8, 576, 384, torch.float32, 0, True, True),
        (5, 95, 24, 576, 128, torch.bfloat16, 64, False, True),
        (3, 300, 1, 512, 33, torch.float32, 1, True, False),
        (16, 4096, 64, 576, 2048, torch.bfloat16, 0, True, False),
    ],
)
def test_prefill_matches_the_reference(s_q, s_kv, h_q, d_qk, topk, dtype, pad, sink, lengths):
    rng = np.random.default_rng(s_q * 7 + h_q)
    q, kv, idx, s, lens = prefill_inputs(rng, s_q, s_kv, h_q, d_qk, topk, dtype, pad, sink, lengths)
    want = flashsel.sparse_mla_prefill(q, kv, idx, d_qk**-0.5, attn_sink=s, topk_length=lens)
    cq, ckv, cidx, cs, clens = cuda(q, kv, idx, s, lens)
    got = flashsel.sparse_mla_prefill(cq, ckv, cidx, d_qk**-0.5, attn_sink=cs, topk_length=clens)
    assert got[0].device.type == "cuda" and got[0].dtype == dtype and got[0].shape == (s_q, h_q, 512)
    close("out", got[0].float(), want[0].float(), OUT_TOL)
    close("max_logits", got[1], want[1], LSE_TOL)
    close("lse", got[2], want[2], LSE_TOL)
    if lens is None:
        # The derived length passed explicitly: the same bits.
        derived = torch.from_numpy(
            np.array([max([p + 1 for p, v in enumerate(r) if 0 <= v < s_kv], default=0) for r in idx[:, 0].numpy()],
                     np.int32)
        ).cuda()
        again = flashsel.sparse_mla_prefill(cq, ckv, cidx, d_qk**-0.5, attn_sink=cs, topk_length=derived)
        for a, b in zip(got, again):
            assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                               b.view(torch.uint8) if b.dtype == torch.bfloat16 else b.view(torch.int32))


def quantize_fp8(vals):
    """FlashMLA's V3.2 quantizer: [n, 576] float32 -> [n, 656] uint8."""
    n = vals.shape[0]
    out = torch.empty(n, 656, dtype=torch.uint8)
    tiles = vals[:, :512].reshape(n, 4, 128)
    scale = torch.exp2(torch.ceil(torch.log2(torch.clamp(tiles.abs().amax(-1) / 448.0, min=1e-4))))
    q8 = (tiles / scale[..., None]).to(torch.float8_e4m3fn).reshape(n, 512)
    out[:, :512] = q8.view(torch.uint8)
    out[:, 512:528] = scale.float().contiguous().view(torch.uint8).reshape(n, 16)
    out[:, 528:] = vals[:, 512:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, 128)
    return out


@pytest.mark.parametrize(
    "b,s_q,h_q,topk,pages,page_size,fmt,lengths",
    [
        (1, 1, 128, 2048, 40, 64, "fp8", None),
        (4, 2, 64, 256, 30, 64, "fp8", "request"),
        (3, 2, 16, 100, 50, 17, "bf16", "row"),
        (2, 1, 8, 64, 20, 1, "f32", None),
    ],
)
def test_decode_matches_the_reference(b, s_q, h_q, topk, pages, page_size, fmt, lengths):
    if fmt == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no torch.float8_e4m3fn")
    rng = np.random.default_rng(b * 13 + h_q)
    g = torch.Generator().manual_seed(b + topk)
    d_qk = 576 if fmt == "fp8" else 512
    slots = pages * page_size
    vals = torch.randn(slots, d_qk, generator=g)
    if fmt == "fp8":
        tokens = quantize_fp8(vals)
    else:
        tokens = vals.to(torch.bfloat16 if fmt == "bf16" else torch.float32)
    w = tokens.shape[1]
    # Strided pages: a slice of a wider buffer.
    big = torch.zeros(pages, page_size, 1, w + 16, dtype=tokens.dtype)
    big[:, :, 0, :w] = tokens.reshape(pages, page_size, w)
    cache = big[:, :, :, :w]
    q = torch.randn(b, s_q, h_q, d_qk, generator=g).to(torch.bfloat16)
    idx = torch.from_numpy(indices(rng, b * s_q, topk, slots).reshape(b, s_q, topk))
    lens = None
    if lengths == "request":
        lens = torch.from_numpy(rng.integers(0, topk + 1, b).astype(np.int32))
    elif lengths == "row":
        lens = torch.from_numpy(rng.integers(0, topk + 1, (b, s_q)).astype(np.int32))
    sink = torch.randn(h_q, generator=g)
    want = flashsel.sparse_mla_decode(q, cache, idx, topk_length=lens, attn_sink=sink)
    cq, ccache, cidx, clens, csink = cuda(q, cache, idx, lens, sink)
    got = flashsel.sparse_mla_decode(cq, ccache, cidx, topk_length=clens, attn_sink=csink)
    assert got[0].shape == (b, s_q, h_q, 512) and got[1].shape == (b, h_q, s_q)
    close("out", got[0].float(), want[0].float(), OUT_TOL)
    close("lse", got[1], want[1], LSE_TOL)


def test_current_stream_graph_capture_and_compile():
    rng = np.random.default_rng(5)
    q, kv, idx, s, _ = prefill_inputs(rng, 9, 700, 16, 576, 256, torch.bfloat16, sink=True)
    cq, ckv, cidx, cs = cuda(q, kv, idx, s)
    want = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.05, attn_sink=cs)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.05, attn_sink=cs)
    side.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # A CUDA graph: captured once, replayed on new q.
    static_q = cq.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = flashsel.sparse_mla_prefill(static_q, ckv, cidx, 0.05, attn_sink=cs)
    q2 = torch.randn_like(cq.float()).to(cq.dtype)
    static_q.copy_(q2)
    g.replay()
    torch.cuda.synchronize()
    ref = flashsel.sparse_mla_prefill(q2, ckv, cidx, 0.05, attn_sink=cs)
    for a, b in zip(cap, ref):
        assert torch.equal(a, b)
    # torch.compile(fullgraph=True): the operator, the same bytes as eager.
    f = torch.compile(lambda a, b, c, d: flashsel.sparse_mla_prefill(a, b, c, 0.05, attn_sink=d), fullgraph=True)
    for a, b in zip(f(cq, ckv, cidx, cs), want):
        assert torch.equal(a, b)


def test_split_kv_is_deterministic_and_empty_rows():
    # One row of one head: the plan splits the positions; runs repeat bytes.
    rng = np.random.default_rng(9)
    q, kv, idx, _, _ = prefill_inputs(rng, 1, 5000, 1, 512, 2048, torch.float32)
    cq, ckv, cidx = cuda(q, kv, idx)
    a = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.04)
    b = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.04)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
    want = flashsel.sparse_mla_prefill(q, kv, idx, 0.04)
    close("out", a[0], want[0], OUT_TOL)
    close("lse", a[2], want[2], LSE_TOL)
    # Every index invalid: out 0, lse +inf, max -inf (a sink of +inf too).
    bad = torch.full((2, 1, 64), -1, dtype=torch.int32, device="cuda")
    out, m, lse = flashsel.sparse_mla_prefill(cq[:1].expand(2, -1, -1), ckv, bad, 0.04,
                                              attn_sink=torch.full((1,), float("inf"), device="cuda"))
    assert torch.all(out == 0) and torch.all(lse == float("inf")) and torch.all(m == float("-inf"))


def test_int64_topk_length_past_int32_is_clamped_not_wrapped():
    # docs/semantics.md: device topk_length values outside 0..=topk are
    # clamped into it; an int64 2^32 + 5 is topk (not 5), a negative one 0.
    rng = np.random.default_rng(10)
    q, kv, idx, _, _ = prefill_inputs(rng, 3, 600, 8, 512, 128, torch.bfloat16)
    cq, ckv, cidx = cuda(q, kv, idx)
    big = torch.tensor([2**32 + 5, 2**40, -(2**32) + 5], dtype=torch.int64, device="cuda")
    same = torch.tensor([128, 128, 0], dtype=torch.int32, device="cuda")
    got = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.04, topk_length=big)
    want = flashsel.sparse_mla_prefill(cq, ckv, cidx, 0.04, topk_length=same)
    for x, y in zip(got, want):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
