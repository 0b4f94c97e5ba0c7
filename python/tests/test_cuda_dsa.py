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
errors.

Skipped (reported as skipped) where torch is not importable or sees no CUDA
device."""

from __future__ import annotations

import numpy as np
import pytest

import flashsel

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

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
    # A strided q is copied (it is small); the result is the contiguous one's.
    wide = torch.randn(3, 8, 128, device=DEV)
    assert_bytes(flashsel.dsa_scores(wide[:, ::2], kd, wd, sd, ed),
                 flashsel.dsa_scores(wide[:, ::2].contiguous(), kd, wd, sd, ed))  # fmt: skip
