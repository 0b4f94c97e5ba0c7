"""QSA sparse attention on CUDA tensors: the kernel against the CPU float64
reference (the same call on CPU copies) with FlashMLA's tolerances, over
QSA's heads and ids as qsa_select writes them, other groups and widths,
f32 / bf16 on both sides, paged caches with shuffled, strided pages; the
derived lengths' bits, split-KV determinism, empty rows, clamped device
lengths, the current stream, CUDA graphs and torch.compile(fullgraph=True).
Every K / V element that no attended entry reads is NaN, so a stray read
shows in the outputs. Skipped without torch or a CUDA device."""

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


def same_bits(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def random_rows(rng, rows, width, tokens):
    """Random token ids (duplicates), interior invalid entries, invalid tails
    of every kind, ~2% rows with nothing valid."""
    bad = BAD + [tokens, tokens + 5]
    out = np.empty((rows, width), np.int64)
    for r in range(rows):
        n = 0 if rng.random() < 0.02 else int(rng.integers(1, width + 1))
        row = rng.integers(0, tokens, width)
        row[n:] = bad[r % len(bad)]
        interior = rng.random(width) < 0.03
        interior[max(n - 1, 0) :] = False
        row[interior] = -1
        out[r] = row
    return out.astype(np.int32)


def qsa_rows(rng, rows, width, tokens):
    """qsa_select's ids (ratio 4, (width - 3) / 4 blocks) for random
    positions, and its counts (the lengths QSA passes)."""
    k_blocks = (width - 3) // 4
    positions = rng.integers(0, tokens, rows).astype(np.int32)
    scores = rng.standard_normal((rows, tokens // 4)).astype(np.float32)
    ids, counts = flashsel.qsa_select(scores, positions, ratio=4, k_blocks=k_blocks)
    assert ids.shape == (rows, width)
    return ids, counts


def inputs(rng, rows, tokens, h_q, h_kv, d, width, q_dtype, kv_dtype, *, index="random", lengths=False,
           paged=None):
    """CPU tensors q, k, v (paged = (page_size, token_pad, page_pad): a cache
    of shuffled pages, `token_pad` elements after each token and `page_pad`
    after each page), indices (slots when paged), lengths; every K / V
    element no attended entry reads (padding included) is NaN."""
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    q = torch.randn(rows, h_q, d, generator=g).to(q_dtype)
    if index == "qsa":
        idx, lens = qsa_rows(rng, rows, width, tokens)
    else:
        idx = random_rows(rng, rows, width, tokens)
        lens = rng.integers(0, width + 1, rows).astype(np.int32) if lengths else None
    vals_k = torch.randn(tokens, h_kv, d, generator=g)
    vals_v = torch.randn(tokens, h_kv, d, generator=g)
    nan = float("nan")
    if paged is None:
        slot, slots, page_size = np.arange(tokens), tokens, tokens
        k = torch.full((tokens, h_kv, d), nan, dtype=kv_dtype)
        v = torch.full((tokens, h_kv, d), nan, dtype=kv_dtype)
    else:
        page_size, token_pad, page_pad = paged
        pages = -(-tokens // page_size) + 2
        perm = rng.permutation(pages)
        slot = np.array([perm[t // page_size] * page_size + t % page_size for t in range(tokens)])
        slots = pages * page_size
        ts = h_kv * d + token_pad
        ps = page_size * ts + page_pad
        geom = ((pages, page_size, h_kv, d), (ps, ts, d, 1))
        k = torch.full((pages * ps,), nan, dtype=kv_dtype).as_strided(*geom)
        v = torch.full((pages * ps,), nan, dtype=kv_dtype).as_strided(*geom)
    # Token ids -> slots; invalid entries stay invalid (past every slot).
    idx = idx.astype(np.int64)
    idx = np.where((idx >= 0) & (idx < tokens), slot[np.clip(idx, 0, tokens - 1)],
                   np.where(idx >= 0, np.maximum(idx, slots), idx)).astype(np.int32)
    # Values for the attended slots only.
    n = np.full(rows, width) if lens is None else np.asarray(lens)
    att = (np.arange(width)[None, :] < n[:, None]) & (idx >= 0) & (idx < slots)
    used = np.unique(idx[att]).astype(np.int64)
    token_of = np.full(slots, -1)
    token_of[slot] = np.arange(tokens)
    tok = torch.from_numpy(token_of[used])
    u = torch.from_numpy(used)
    for cache, vals in ((k, vals_k), (v, vals_v)):
        if paged is None:
            cache[u] = vals[tok].to(kv_dtype)
        else:
            cache[u // page_size, u % page_size] = vals[tok].to(kv_dtype)
    lens_t = None if lens is None else torch.from_numpy(np.asarray(lens, np.int32))
    return q, k, v, torch.from_numpy(idx), lens_t


def cuda(*xs):
    """CUDA copies with the same strides (a strided cache stays strided)."""
    out = []
    for x in xs:
        if x is None:
            out.append(None)
            continue
        n = x.untyped_storage().nbytes() // x.element_size()
        flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, (n,), (1,))
        out.append(flat.cuda().as_strided(x.shape, x.stride(), x.storage_offset()))
    return out


BF, F = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "rows,tokens,h_q,h_kv,d,width,q_dtype,kv_dtype,index,lengths,paged",
    [
        (1, 8192, 24, 2, 256, 2051, BF, BF, "qsa", False, None),  # QSA decode (split-KV)
        (48, 4000, 24, 2, 256, 2051, BF, BF, "qsa", False, (64, 0, 0)),  # a batch, paged
        (6, 3000, 12, 1, 256, 2051, BF, BF, "qsa", False, (64, 0, 0)),  # the tensor-parallel shard
        (5, 3000, 16, 4, 128, 512, F, BF, "random", True, None),
        (3, 90, 1, 1, 256, 100, BF, F, "random", False, (1, 8, 0)),
        (62, 700, 8, 8, 64, 128, F, F, "random", False, (17, 3, 5)),
        (213, 1521, 32, 2, 128, 384, BF, BF, "random", True, None),
        (40, 300, 12, 3, 64, 33, F, BF, "random", False, (16, 0, 0)),
        (4, 20, 12, 1, 128, 31, BF, BF, "random", False, None),
    ],
)
def test_matches_the_reference(rows, tokens, h_q, h_kv, d, width, q_dtype, kv_dtype, index, lengths, paged):
    rng = np.random.default_rng(rows * 31 + h_q + d)
    q, k, v, idx, lens = inputs(rng, rows, tokens, h_q, h_kv, d, width, q_dtype, kv_dtype, index=index,
                                lengths=lengths, paged=paged)
    want = flashsel.qsa_attention(q, k, v, idx, lengths=lens)
    cq, ck, cv, cidx, clens = cuda(q, k, v, idx, lens)
    assert ck.stride() == k.stride()
    got = flashsel.qsa_attention(cq, ck, cv, cidx, lengths=clens)
    assert got[0].device.type == "cuda" and got[0].dtype == q_dtype and got[0].shape == (rows, h_q, d)
    assert got[1].dtype == torch.float32 and got[1].shape == (rows, h_q)
    close("out", got[0].float(), want[0].float(), OUT_TOL)
    close("lse", got[1], want[1], LSE_TOL)
    # The derived lengths passed explicitly (or the lengths passed again):
    # the same bits.
    if lens is None:
        slots = ck.shape[0] * ck.shape[1] if ck.dim() == 4 else ck.shape[0]
        n = idx.numpy()
        derived = np.array([max([p + 1 for p, x in enumerate(r) if 0 <= x < slots], default=0) for r in n],
                           np.int32)
        clens = torch.from_numpy(derived).cuda()
    same_bits(flashsel.qsa_attention(cq, ck, cv, cidx, lengths=clens), got)


def test_current_stream_graph_capture_and_compile():
    rng = np.random.default_rng(5)
    q, k, v, idx, lens = inputs(rng, 9, 700, 16, 2, 128, 256, BF, BF, lengths=True, paged=(16, 0, 0))
    cq, ck, cv, cidx, clens = cuda(q, k, v, idx, lens)
    want = flashsel.qsa_attention(cq, ck, cv, cidx, scale=0.05, lengths=clens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = flashsel.qsa_attention(cq, ck, cv, cidx, scale=0.05, lengths=clens)
    side.synchronize()
    same_bits(got, want)
    # A CUDA graph: captured once, replayed on new q.
    static_q = cq.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = flashsel.qsa_attention(static_q, ck, cv, cidx, scale=0.05, lengths=clens)
    q2 = torch.randn(cq.shape, device="cuda").to(cq.dtype)
    static_q.copy_(q2)
    g.replay()
    torch.cuda.synchronize()
    same_bits(cap, flashsel.qsa_attention(q2, ck, cv, cidx, scale=0.05, lengths=clens))
    # A split plan (one decode row) captured too.
    q1, k1, v1, i1, _ = inputs(rng, 1, 4000, 12, 1, 256, 2051, BF, BF, index="qsa")
    c1 = cuda(q1, k1, v1, i1)
    w1 = flashsel.qsa_attention(*c1)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        cap1 = flashsel.qsa_attention(*c1)
    g1.replay()
    torch.cuda.synchronize()
    same_bits(cap1, w1)
    # torch.compile(fullgraph=True): the operator, the same bytes as eager.
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, c, d, n: flashsel.qsa_attention(a, b, c, d, scale=0.05, lengths=n),
                      fullgraph=True)
    same_bits(f(cq, ck, cv, cidx, clens), want)
    # Compiled and captured (mode="reduce-overhead").
    torch._dynamo.reset()
    fr = torch.compile(lambda a, b, c, d, n: flashsel.qsa_attention(a, b, c, d, scale=0.05, lengths=n),
                       fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        r = fr(cq, ck, cv, cidx, clens)
    same_bits([x.clone() for x in r], want)


def test_split_kv_is_deterministic_and_empty_rows():
    rng = np.random.default_rng(9)
    q, k, v, idx, _ = inputs(rng, 1, 5000, 12, 1, 256, 2051, F, F, index="qsa")
    cq, ck, cv, cidx = cuda(q, k, v, idx)
    a = flashsel.qsa_attention(cq, ck, cv, cidx)
    b = flashsel.qsa_attention(cq, ck, cv, cidx)
    same_bits(a, b)
    want = flashsel.qsa_attention(q, k, v, idx)
    close("out", a[0], want[0], OUT_TOL)
    close("lse", a[1], want[1], LSE_TOL)
    # Every entry invalid, or lengths 0: out 0, lse -inf.
    bad = torch.full((2, 64), -1, dtype=torch.int32, device="cuda")
    bad[1] = 2**31 - 1
    out, lse = flashsel.qsa_attention(cq.expand(2, -1, -1), ck, cv, bad)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    zero = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, lse = flashsel.qsa_attention(cq, ck, cv, cidx, lengths=zero)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    # No tokens at all.
    e = torch.zeros(0, 1, 256, device="cuda")
    out, lse = flashsel.qsa_attention(cq, e, e, cidx)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_device_lengths_are_clamped_not_wrapped():
    # Device lengths outside 0..=width are clamped into it; an int64 2^32 + 5
    # is the width (not 5), a negative one 0.
    rng = np.random.default_rng(10)
    q, k, v, idx, _ = inputs(rng, 3, 600, 8, 2, 64, 128, BF, BF)
    cq, ck, cv, cidx = cuda(q, k, v, idx)
    big = torch.tensor([2**32 + 5, 2**40, -(2**32) + 5], dtype=torch.int64, device="cuda")
    same = torch.tensor([128, 128, 0], dtype=torch.int32, device="cuda")
    same_bits(flashsel.qsa_attention(cq, ck, cv, cidx, lengths=big),
              flashsel.qsa_attention(cq, ck, cv, cidx, lengths=same))
    past = torch.tensor([500, 129, -3], dtype=torch.int32, device="cuda")
    same_bits(flashsel.qsa_attention(cq, ck, cv, cidx, lengths=past),
              flashsel.qsa_attention(cq, ck, cv, cidx, lengths=same))


def test_devices_and_errors():
    rng = np.random.default_rng(11)
    q, k, v, idx, _ = inputs(rng, 2, 50, 4, 2, 64, 16, BF, BF)
    cq, ck, cv, cidx = cuda(q, k, v, idx)
    with pytest.raises(ValueError, match="every tensor on one device"):
        flashsel.qsa_attention(cq, k, cv, cidx)
    with pytest.raises(ValueError, match="every tensor on one device"):
        flashsel.qsa_attention(cq, ck, cv, cidx, lengths=[1, 2])
    with pytest.raises(TypeError, match="indices must be torch.int32"):
        flashsel.qsa_attention(cq, ck, cv, cidx.long())
    with pytest.raises(ValueError, match="invalid h_kv"):
        flashsel.qsa_attention(cq[:, :3], ck, cv, cidx)
    with pytest.raises(ValueError, match="must be packed"):
        wide = torch.zeros(50, 2, 128, dtype=BF, device="cuda")[..., :64]
        flashsel.qsa_attention(cq, wide, wide, cidx)
    with pytest.raises(ValueError, match="the same strides"):
        flashsel.qsa_attention(cq, ck, torch.zeros(50, 3, 64, dtype=BF, device="cuda")[:, :2], cidx)
