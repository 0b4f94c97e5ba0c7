"""flashsel.dsa_scores and flashsel.dsa_indexer on CUDA torch tensors: the
CUDA engine writes the CPU engine's bits (docs/semantics.md, "DSA indexer
scores"), so every result here is compared byte for byte with the same call
on CPU copies: every q / k dtype pair of float32, bfloat16 and fp8 e4m3,
with and without the key scale, head counts and widths up to DeepSeek-V3.2's
64 heads of 128, near-ties and NaN under both orders and NaN policies, a
decode batch over many keys with topk 2048, a page table (slots), empty
ranges, no keys and no rows, ranges as host data or int64, device ranges
out of bounds (clamped in the scores, all -1 rows in the selection), CUDA
graph capture and replay on new data, torch.compile(fullgraph=True) (also
captured, mode="reduce-overhead"), the current stream, and the host-side
errors. The paged fp8 key cache (DeepGEMM's layout): the CUDA engine's
scores, ids and slots are the CPU engine's paged ones (which test_dsa.py
holds to the contiguous keys' bits), also under torch.compile and in a CUDA
graph replayed on new data, and its device rules for table entries the host
does not check.

Skipped (reported as skipped) where torch is not importable or sees no CUDA
device.

XFAIL (session 21): the CUDA engine's scores moved to tensor cores in the
device order (docs/semantics.md, "DSA indexer scores"): they are no longer
the CPU engine's bits, and a paged cache of odd page size is now an error
on the GPU. The byte comparisons below still hold the old contract and are
marked expected to fail until they are rewritten to the new one (scores
within ops/dsa's device_error_bound of the reference, ids equal to the
CPU's selection of the device's scores); `flashsel check --only
dsa-indexer` checks the new contract."""

from __future__ import annotations

import pytest

import flashsel

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

pytestmark = pytest.mark.xfail(
    reason="the device order's scores are not the CPU's bits: these byte comparisons await the rewrite", strict=False
)

DEV = torch.device("cuda", torch.cuda.current_device())
FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16, FP8]


@pytest.fixture(scope="module", autouse=True)
def engine():
    b = flashsel.backends()["cuda"]
    if not b["available"]:
        pytest.fail(f"torch sees a GPU but the flashsel CUDA engine is unavailable: {b['reason']}")
    return b


def values_of(x, dtype):
    """f32 values as `dtype` (fp8: scaled into e4m3's range)."""
    return (x * 8).to(dtype) if dtype == FP8 else x.to(dtype)


def ranges(g, rows, n):
    """Random [start, end) rows, and the edge ones: the whole range, empty,
    at N, one key."""
    a = torch.randint(0, n + 1, (rows,), generator=g)
    b = torch.randint(0, n + 1, (rows,), generator=g)
    s, e = torch.minimum(a, b), torch.maximum(a, b)
    fixed = [(0, n), (n // 2, n // 2), (n, n), (n - 1, n), (0, 1)]
    for i, (x, y) in enumerate(fixed[: rows // 2]):
        s[i], e[i] = x, y
    return s.to(torch.int32), e.to(torch.int32)


def make(rows, heads, d, n, qd=torch.float32, kd=torch.float32, seed=0, scale=False, ties=False):
    """CPU tensors (q, k, weights, starts, ends, k_scale)."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        # Small integers everywhere, repeated key rows: most scores tie exactly.
        q = torch.randint(-1, 3, (rows, heads, d), generator=g).float()
        base = torch.randint(-2, 3, (4, d), generator=g).float()
        k = base[torch.randint(0, 4, (n,), generator=g)]
        w = torch.randint(0, 3, (rows, heads), generator=g).float()
    else:
        q = torch.randn((rows, heads, d), generator=g)
        k = torch.randn((n, d), generator=g)
        w = torch.randn((rows, heads), generator=g)
    st, en = ranges(g, rows, n)
    ks = torch.rand((n,), generator=g) * 3 + 0.25 if scale else None
    return values_of(q, qd), values_of(k, kd), w, st, en, ks


def cuda(*xs):
    return tuple(None if x is None else x.to(DEV) for x in xs)


def bits(t):
    t = t.contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_bytes(got, want, ctx=""):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), ctx
    for g, w in zip(got, want):
        assert g.device.type == "cuda" and g.dtype == w.dtype and g.shape == w.shape, f"{ctx}: {g.dtype} {g.shape}"
        assert torch.equal(bits(g.cpu()), bits(w.cpu())), f"bytes differ {ctx}"


def both(args, **kw):
    """(CUDA result, CPU result) of dsa_scores and of dsa_indexer (kw its
    options; tensors in kw go to the device for the CUDA call)."""
    q, k, w, st, en, ks = args
    dkw = {n: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
    s = (flashsel.dsa_scores(*cuda(q, k, w, st, en), k_scale=None if ks is None else ks.to(DEV)),
         flashsel.dsa_scores(q, k, w, st, en, k_scale=ks))  # fmt: skip
    i = (flashsel.dsa_indexer(*cuda(q, k, w, st, en), k_scale=None if ks is None else ks.to(DEV), **dkw),
         flashsel.dsa_indexer(q, k, w, st, en, k_scale=ks, **kw))  # fmt: skip
    return s, i


# ---------------------------------------------------------------------------
# The CPU engine's bytes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("qd", DTYPES, ids=str)
@pytest.mark.parametrize("kd", DTYPES, ids=str)
@pytest.mark.parametrize(("heads", "d"), [(4, 128), (1, 64), (7, 256), (64, 128)])
def test_scores_and_indexer_match_the_cpu(qd, kd, heads, d):
    args = make(9, heads, d, 3000, qd, kd, seed=heads + d, scale=kd == FP8)
    for kw in ({"topk": 100, "return_values": True}, {"topk": 2048, "order": "score"}):
        (gs, cs), (gi, ci) = both(args, **kw)
        assert_bytes(gs, cs, f"scores {qd} {kd}")
        assert_bytes(gi, ci, f"indexer {qd} {kd} {kw}")


@pytest.mark.parametrize("order", ["score", "index"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
def test_near_ties_and_nan_match_the_cpu(order, nan):
    q, k, w, st, en, ks = make(12, 3, 64, 5000, seed=1, ties=True, scale=True)
    k[[7, 1234, 4999]] = float("nan")
    w[3, 1] = 0.0  # a zero weight beside finite dots: still exact
    (gs, cs), (gi, ci) = both((q, k, w, st, en, ks), topk=300, order=order, nan=nan, return_values=True)
    assert_bytes(gs, cs)
    assert (bits(gs.cpu())[torch.isnan(cs)] == 0x7FC00000).all()
    assert_bytes(gi, ci)


def test_decode_batch_of_many_keys():
    # DeepSeek-V3.2's shape: 64 fp8 heads of 128, fp8 keys with their scale,
    # topk 2048, over 65,536 keys.
    args = make(4, 64, 128, 65536, FP8, FP8, seed=2, scale=True)
    q, k, w, st, en, ks = args
    st[:] = torch.tensor([0, 0, 1000, 60000], dtype=torch.int32)
    en[:] = torch.tensor([65536, 2000, 65536, 61000], dtype=torch.int32)
    (gs, cs), (gi, ci) = both(args, topk=2048, return_values=True)
    assert_bytes(gs, cs)
    assert_bytes(gi, ci)
    assert_bytes(gi, flashsel.topk(gs, 2048, starts=st.to(DEV), lengths=en.to(DEV), order="index", return_values=True))


@pytest.mark.parametrize("kd", [torch.bfloat16, FP8], ids=str)
def test_page_table_slots_match_the_cpu(kd):
    q, k, w, st, en, ks = make(8, 4, 128, 1024, torch.bfloat16, kd, seed=3, scale=True)
    g = torch.Generator().manual_seed(4)
    table = torch.randperm(64, generator=g).to(torch.int32).reshape(4, 16)  # 4 sequences of 16 pages of 64
    seqs = torch.randint(0, 4, (8,), generator=g).to(torch.int32)
    for order in ("index", "score"):
        kw = dict(topk=200, order=order, page_table=table, page_size=64, seq_ids=seqs, return_values=True)
        (_, _), (gi, ci) = both((q, k, w, st, en, ks), **kw)
        assert_bytes(gi, ci, order)


def test_empty_ranges_no_keys_no_rows():
    q, k, w, _, _, _ = make(3, 2, 64, 40)
    z = torch.tensor([0, 17, 40], dtype=torch.int32)
    (gs, cs), (gi, ci) = both((q, k, w, z, z, None), topk=5, return_values=True)
    assert_bytes(gs, cs)
    assert_bytes(gi, ci)
    assert (gi[0] == -1).all()
    zero = torch.zeros(3, dtype=torch.int32)
    (gs, cs), (gi, ci) = both((q, k[:0], w, zero, zero, None), topk=4, return_values=True)
    assert gs.shape == (3, 0)
    assert_bytes(gi, ci)
    e = torch.zeros(0, dtype=torch.int32)
    (gs, cs), (gi, ci) = both((q[:0], k, w[:0], e, e, None), topk=4)
    assert gs.shape == (0, 40) and gi.shape == (0, 4)


def test_host_and_int64_ranges():
    q, k, w, st, en, ks = make(6, 4, 64, 700, seed=5)
    qd, kd, wd = cuda(q, k, w)
    want = flashsel.dsa_indexer(q, k, w, st, en, topk=64, return_values=True)
    for s, e in [(st, en), (st.long().to(DEV), en.long().to(DEV)), (st.numpy(), en.tolist())]:
        assert_bytes(flashsel.dsa_indexer(qd, kd, wd, s, e, topk=64, return_values=True), want)
        assert_bytes(flashsel.dsa_scores(qd, kd, wd, s, e), flashsel.dsa_scores(q, k, w, st, en))


def test_device_ranges_out_of_bounds():
    # Device values are not checked: the scores clamp them (start into 0..N,
    # end into start..N); the selection gives a row out of range all -1.
    q, k, w, _, _, _ = make(5, 4, 64, 300, seed=6)
    st = torch.tensor([-5, 10, 250, 0, 2**31 - 1], dtype=torch.int32)
    en = torch.tensor([20, 5, 400, 300, 2**31 - 1], dtype=torch.int32)
    qd, kd, wd = cuda(q, k, w)
    got = flashsel.dsa_scores(qd, kd, wd, st.to(DEV), en.to(DEV))
    a = st.clamp(0, 300)
    b = torch.maximum(en, a).clamp(max=300)
    assert_bytes(got, flashsel.dsa_scores(q, k, w, a, b))
    ids, vals = flashsel.dsa_indexer(qd, kd, wd, st.to(DEV), en.to(DEV), topk=16, return_values=True)
    good = [3]
    want = flashsel.dsa_indexer(q[good], k, w[good], st[good], en[good], topk=16, return_values=True)
    assert_bytes((ids[good], vals[good]), want)
    bad = [0, 1, 2, 4]
    assert (ids[bad] == -1).all().item()
    # int64 values past int32 are clamped into [-1, 2**31 - 1]: rows out of range, never wrapped.
    ids = flashsel.dsa_indexer(qd, kd, wd, torch.tensor([0, 2**32, 0, 0, 0], device=DEV),
                               torch.tensor([300, 2**32 + 5, 300, 300, 300], device=DEV), topk=16)  # fmt: skip
    assert (ids[1] == -1).all().item()
    assert_bytes(ids[[0]], flashsel.dsa_indexer(q[:1], k, w[:1], [0], [300], topk=16))


# ---------------------------------------------------------------------------
# CUDA graphs, torch.compile, streams
# ---------------------------------------------------------------------------


def test_graph_capture_and_replay_on_new_data():
    rows, heads, d, n = 6, 8, 128, 4096
    q, k, w, st, en, ks = make(rows, heads, d, n, torch.bfloat16, FP8, seed=7, scale=True)
    qd, kd, wd, sd, ed, ksd = cuda(q, k, w, st, en, ks)
    table = torch.arange(64, dtype=torch.int32, device=DEV).flip(0).reshape(2, 32)
    seqs = torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.int32, device=DEV)
    pkw = dict(page_table=table, page_size=128, seq_ids=seqs)

    def step():
        return (
            flashsel.dsa_scores(qd, kd, wd, sd, ed, k_scale=ksd),
            flashsel.dsa_indexer(qd, kd, wd, sd, ed, topk=512, k_scale=ksd, order="score", return_values=True),
            flashsel.dsa_indexer(qd, kd, wd, sd, ed, topk=100, k_scale=ksd, **pkw),
        )

    step()  # the engine exists before the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in (8, 9):
        q2, k2, w2, st2, en2, ks2 = make(rows, heads, d, n, torch.bfloat16, FP8, seed=seed, scale=True)
        for dst, src in zip((qd, kd, wd, sd, ed, ksd), (q2, k2, w2, st2, en2, ks2)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert_bytes(out[0], flashsel.dsa_scores(q2, k2, w2, st2, en2, k_scale=ks2))
        assert_bytes(out[1], flashsel.dsa_indexer(q2, k2, w2, st2, en2, topk=512, k_scale=ks2, order="score",
                                                  return_values=True))  # fmt: skip
        hkw = {a: (v.cpu() if isinstance(v, torch.Tensor) else v) for a, v in pkw.items()}
        assert_bytes(out[2], flashsel.dsa_indexer(q2, k2, w2, st2, en2, topk=100, k_scale=ks2, **hkw))


def test_compile_fullgraph_matches_eager():
    args = make(7, 16, 128, 3000, FP8, FP8, seed=10, scale=True)
    dargs = cuda(*args)

    def step(q, k, w, s, e, ks):
        scores = flashsel.dsa_scores(q, k, w, s, e, k_scale=ks)
        ids, vals = flashsel.dsa_indexer(q, k, w, s, e, topk=256, k_scale=ks, return_values=True)
        return scores, ids, vals

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*dargs)
    assert_bytes(got, step(*dargs))
    assert_bytes(got, step(*args))  # the CPU engine's bytes
    # A compiled function captured in a CUDA graph (reduce-overhead).
    f = torch.compile(lambda *a: flashsel.dsa_indexer(*a[:5], topk=64, k_scale=a[5]), fullgraph=True,
                      mode="reduce-overhead")  # fmt: skip
    for _ in range(3):
        out = f(*dargs)
    assert_bytes(out, flashsel.dsa_indexer(*args[:5], topk=64, k_scale=args[5]))
    torch._dynamo.reset()


def test_runs_on_the_current_stream():
    args = make(5, 4, 128, 20000, seed=11)
    dargs = cuda(*args)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # the launches must queue behind this on s
        ids = flashsel.dsa_indexer(*dargs[:5], topk=128)
        sc = flashsel.dsa_scores(*dargs[:5])
    s.synchronize()
    assert_bytes(ids, flashsel.dsa_indexer(*args[:5], topk=128))
    assert_bytes(sc, flashsel.dsa_scores(*args[:5]))


# ---------------------------------------------------------------------------
# The paged key cache
# ---------------------------------------------------------------------------


def make_paged(rows, heads, d, ps, max_pages, qd=torch.bfloat16, seed=0, share=2):
    """CPU tensors (q, weights, starts, ends, seq_ids, cache, table): two
    sequences of max_pages pages of ps tokens (N = max_pages * ps) in one
    fp8 cache [P, ps, 1, d + 4] in DeepGEMM's layout (per page ps * d e4m3
    bytes, then ps f32 scales), sequence 1 sharing sequence 0's first
    `share` pages, the pages in a shuffled order, one unused page of NaN
    codes and NaN scales."""
    g = torch.Generator().manual_seed(seed)
    n = max_pages * ps
    ks = [(torch.randn((n, d), generator=g) * 8).to(FP8) for _ in range(2)]
    scs = [torch.rand((n,), generator=g) * 3 + 0.25 for _ in range(2)]
    ks[1][: share * ps] = ks[0][: share * ps]
    scs[1][: share * ps] = scs[0][: share * ps]
    pages = 2 * max_pages - share + 1
    perm = torch.randperm(pages, generator=g).to(torch.int32)
    table = torch.empty((2, max_pages), dtype=torch.int32)
    table[0] = perm[:max_pages]
    table[1, :share] = perm[:share]
    table[1, share:] = perm[max_pages : 2 * max_pages - share]
    cache = torch.full((pages, ps * (d + 4)), 0x7F, dtype=torch.uint8)
    cache[int(perm[-1]), ps * d :] = torch.full((ps,), float("nan")).view(torch.uint8)
    for seq in range(2):
        for i in range(max_pages):
            p = int(table[seq, i])
            cache[p, : ps * d] = ks[seq][i * ps : (i + 1) * ps].reshape(-1).view(torch.uint8)
            cache[p, ps * d :] = scs[seq][i * ps : (i + 1) * ps].contiguous().view(torch.uint8)  # little-endian
    q = values_of(torch.randn((rows, heads, d), generator=g), qd)
    w = torch.randn((rows, heads), generator=g)
    st, en = ranges(g, rows, n)
    seqs = torch.randint(0, 2, (rows,), generator=g).to(torch.int32)
    return q, w, st, en, seqs, cache.reshape(pages, ps, 1, d + 4), table


def paged_both(args, ps, **kw):
    """(CUDA, CPU) results of dsa_scores and of dsa_indexer (kw its options)
    over the paged cache."""
    q, w, st, en, seqs, cache, table = args
    qd, wd, sd, ed, seqd, cd, td = cuda(q, w, st, en, seqs, cache, table)
    s = (flashsel.dsa_scores(qd, cd, wd, sd, ed, page_table=td, page_size=ps, seq_ids=seqd),
         flashsel.dsa_scores(q, cache, w, st, en, page_table=table, page_size=ps, seq_ids=seqs))  # fmt: skip
    i = (flashsel.dsa_indexer(qd, cd, wd, sd, ed, page_table=td, page_size=ps, seq_ids=seqd, **kw),
         flashsel.dsa_indexer(q, cache, w, st, en, page_table=table, page_size=ps, seq_ids=seqs, **kw))  # fmt: skip
    return s, i


@pytest.mark.parametrize("qd", DTYPES, ids=str)
@pytest.mark.parametrize(("heads", "d", "ps"), [(4, 128, 64), (3, 64, 16), (5, 256, 7)])
def test_paged_matches_the_cpu(qd, heads, d, ps):
    args = make_paged(9, heads, d, ps, 12, qd, seed=heads + ps)
    for kw in ({"topk": 100, "return_values": True}, {"topk": 2048, "order": "score", "slots": False},
               {"topk": 50, "order": "score", "nan": "largest", "slots": True, "return_values": True}):  # fmt: skip
        (gs, cs), (gi, ci) = paged_both(args, ps, **kw)
        assert_bytes(gs, cs, f"scores {qd}")
        assert_bytes(gi, ci, f"indexer {qd} {kw}")


def test_paged_deepseek_decode_shape():
    # 64 fp8 heads of 128, pages of 64 tokens, top-2048 slots over 40 pages a sequence.
    args = make_paged(6, 64, 128, 64, 40, FP8, seed=30)
    q, w, st, en, seqs, cache, table = args
    st[:] = 0
    en[:] = torch.tensor([2560, 100, 2049, 2560, 1, 0], dtype=torch.int32)
    (gs, cs), (gi, ci) = paged_both(args, 64, topk=2048, return_values=True)
    assert_bytes(gs, cs)
    assert_bytes(gi, ci)
    # A flat cache and a float8 view are the same cache.
    (gs2, _), (gi2, _) = paged_both((q, w, st, en, seqs, cache.reshape(-1), table), 64, topk=2048, return_values=True)
    assert_bytes(gs2, cs)
    assert_bytes(gi2, ci)
    (gs3, _), _ = paged_both((q, w, st, en, seqs, cache.view(FP8), table), 64, topk=8)
    assert_bytes(gs3, cs)


def test_paged_device_table_values_are_not_checked():
    # On the device a key whose page entry is negative or past the cache, or
    # whose sequence is outside the table, scores -inf (never read); the
    # same keys with a good table give the CPU engine's bits elsewhere.
    ps = 16
    q, w, st, en, seqs, cache, table = make_paged(6, 4, 64, ps, 6, seed=31)
    st[:] = 0
    en[:] = 96
    seqs[:] = torch.tensor([0, 1, 0, 1, 0, 1], dtype=torch.int32)
    want = flashsel.dsa_scores(q, cache, w, st, en, page_table=table, page_size=ps, seq_ids=seqs)
    bad = table.clone()
    bad[0, 2] = -1
    bad[1, 4] = cache.shape[0]  # one past the cache's pages
    seqs_bad = seqs.clone()
    seqs_bad[5] = 7  # outside the table's 2 sequences
    want[seqs == 0, 2 * ps : 3 * ps] = float("-inf")
    want[seqs == 1, 4 * ps : 5 * ps] = float("-inf")
    want[5] = float("-inf")
    qd, wd, sd, ed, cd, td, seqd = cuda(q, w, st, en, cache, bad, seqs_bad)
    got = flashsel.dsa_scores(qd, cd, wd, sd, ed, page_table=td, page_size=ps, seq_ids=seqd)
    assert_bytes(got, want)
    ids = flashsel.dsa_indexer(qd, cd, wd, sd, ed, topk=8, page_table=td, page_size=ps, seq_ids=seqd)
    assert (ids[5] == -1).all().item()  # a sequence outside the table: all -1
    # The host checks what the device cannot.
    with pytest.raises(ValueError, match=r"page_table\[0, 2\] = -1"):
        flashsel.dsa_scores(q, cache, w, st, en, page_table=bad, page_size=ps, seq_ids=seqs)


def test_paged_graph_capture_and_replay_on_new_data():
    rows, heads, d, ps, mp = 5, 16, 128, 64, 20
    args = make_paged(rows, heads, d, ps, mp, FP8, seed=32)
    dargs = cuda(*args)
    qd, wd, sd, ed, seqd, cd, td = dargs
    pkw = dict(page_table=td, page_size=ps, seq_ids=seqd)

    def step():
        return (
            flashsel.dsa_scores(qd, cd, wd, sd, ed, **pkw),
            flashsel.dsa_indexer(qd, cd, wd, sd, ed, topk=256, order="score", return_values=True, **pkw),
            flashsel.dsa_indexer(qd, cd, wd, sd, ed, topk=100, slots=False, **pkw),
        )

    step()  # the engine exists before the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in (33, 34):
        new = make_paged(rows, heads, d, ps, mp, FP8, seed=seed)  # the same shapes, a new table
        for dst, src in zip(dargs, new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        q, w, st, en, seqs, cache, table = new
        hkw = dict(page_table=table, page_size=ps, seq_ids=seqs)
        assert_bytes(out[0], flashsel.dsa_scores(q, cache, w, st, en, **hkw))
        assert_bytes(out[1], flashsel.dsa_indexer(q, cache, w, st, en, topk=256, order="score", return_values=True,
                                                  **hkw))  # fmt: skip
        assert_bytes(out[2], flashsel.dsa_indexer(q, cache, w, st, en, topk=100, slots=False, **hkw))


def test_paged_compile_fullgraph_matches_eager():
    ps = 64
    args = make_paged(7, 8, 128, ps, 16, torch.bfloat16, seed=35)
    dargs = cuda(*args)

    def step(q, w, s, e, seqs, c, t):
        scores = flashsel.dsa_scores(q, c, w, s, e, page_table=t, page_size=ps, seq_ids=seqs)
        ids, vals = flashsel.dsa_indexer(q, c, w, s, e, topk=128, return_values=True, page_table=t, page_size=ps,
                                         seq_ids=seqs)  # fmt: skip
        tok = flashsel.dsa_indexer(q, c, w, s, e, topk=64, page_table=t, page_size=ps, seq_ids=seqs, slots=False)
        return scores, ids, vals, tok

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*dargs)
    assert_bytes(got, step(*dargs))
    assert_bytes(got, step(*args))  # the CPU engine's bytes
    f = torch.compile(lambda *a: step(*a)[1], fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out = f(*dargs)
    assert_bytes(out, step(*args)[1])
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Host-checkable errors
# ---------------------------------------------------------------------------


def test_errors_on_the_host():
    q, k, w, st, en, ks = make(3, 4, 128, 100, seed=12, scale=True)
    qd, kd, wd, sd, ed, ksd = cuda(q, k, w, st, en, ks)
    msg = "the DSA indexer on CUDA takes q, k, weights and k_scale on one device"
    with pytest.raises(ValueError, match=f"k is on cpu but q is on cuda:\\d: {msg}"):
        flashsel.dsa_scores(qd, k, wd, sd, ed)
    with pytest.raises(ValueError, match="weights is on cpu but q is on cuda"):
        flashsel.dsa_indexer(qd, kd, w, sd, ed)
    with pytest.raises(ValueError, match="k_scale is on cpu but q is on cuda"):
        flashsel.dsa_indexer(qd, kd, wd, sd, ed, k_scale=ks)
    with pytest.raises(ValueError, match="k is on cuda:\\d but q is in host memory"):
        flashsel.dsa_scores(q, kd, w, st, en)
    with pytest.raises(ValueError, match="starts is on cuda:\\d but q is in host memory"):
        flashsel.dsa_indexer(q, k, w, sd, en)
    with pytest.raises(ValueError, match="k must be C-contiguous"):
        flashsel.dsa_scores(qd, torch.zeros(100, 256, device=DEV)[:, :128], wd, sd, ed)
    with pytest.raises(TypeError, match="unsupported k dtype torch.float16"):
        flashsel.dsa_indexer(qd, kd.half(), wd, sd, ed)
    with pytest.raises(TypeError, match="weights must be float32, got bfloat16"):
        flashsel.dsa_scores(qd, kd, wd.bfloat16(), sd, ed)
    with pytest.raises(ValueError, match="starts must be 1-D with 3 entries"):
        flashsel.dsa_indexer(qd, kd, wd, sd[:2], ed)
    with pytest.raises(TypeError, match="ends must hold int32 or int64"):
        flashsel.dsa_indexer(qd, kd, wd, sd, ed.float())
    with pytest.raises(ValueError, match="invalid heads"):
        flashsel.dsa_scores(torch.zeros(3, 129, 128, device=DEV), kd, torch.zeros(3, 129, device=DEV), sd, ed)
    with pytest.raises(ValueError, match="page_table and seq_ids come together"):
        flashsel.dsa_indexer(qd, kd, wd, sd, ed, page_table=torch.zeros(1, 4, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="topk must be in 1"):
        flashsel.dsa_indexer(qd, kd, wd, sd, ed, topk=0)
    # The paged cache: on q's device, without k_scale.
    pq, pw, pst, pen, pseqs, pc, pt = make_paged(3, 4, 128, 64, 2, seed=13)
    pqd, pwd, psd, ped, pseqd, pcd, ptd = cuda(pq, pw, pst, pen, pseqs, pc, pt)
    pkw = dict(page_table=ptd, page_size=64, seq_ids=pseqd)
    with pytest.raises(ValueError, match=f"k is on cpu but q is on cuda:\\d: {msg}"):
        flashsel.dsa_scores(pqd, pc, pwd, psd, ped, **pkw)
    with pytest.raises(ValueError, match="k_scale must be None with a paged key cache"):
        flashsel.dsa_indexer(pqd, pcd, pwd, psd, ped, k_scale=torch.ones(128, device=DEV), **pkw)
    with pytest.raises(ValueError, match="k is a paged key cache of pages of 64 tokens"):
        flashsel.dsa_indexer(pqd, pcd, pwd, psd, ped, page_table=ptd, page_size=32, seq_ids=pseqd)
    with pytest.raises(ValueError, match="slots=False with contiguous keys"):
        flashsel.dsa_indexer(qd, kd, wd, sd, ed, page_table=ptd, seq_ids=pseqd, slots=False)
    # A strided q is copied (it is small); the result is the contiguous one's.
    wide = torch.randn(3, 8, 128, device=DEV)
    assert_bytes(flashsel.dsa_scores(wide[:, ::2], kd, wd, sd, ed),
                 flashsel.dsa_scores(wide[:, ::2].contiguous(), kd, wd, sd, ed))  # fmt: skip
