"""flashsel.qsa_scores and flashsel.qsa_indexer on CUDA torch tensors: the
device's scores within their stated bound (docs/semantics.md, "The CUDA
engine": the tensor-core order) of the CPU engine's, and the device's ids
and counts the bytes of qsa_select over the device's own scores, on random
data and on near-ties, f32/bf16 queries, f32/bf16/fp8 keys, every head
width, paged keys with slots, varlen prefill rows with mixed V (copy rows
included) across several score groups, device values out of range (the
good rows the same bits as those rows alone), CUDA graph capture and replay
on new data, torch.compile(fullgraph=True).

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
FP8 = getattr(torch, "float8_e4m3fn", None)
KDTYPES = [torch.float32, torch.bfloat16] + ([FP8] if FP8 is not None else [])
NAN_BITS = 0x7FC00000


@pytest.fixture(scope="module", autouse=True)
def engine():
    b = flashsel.backends()["cuda"]
    if not b["available"]:
        pytest.fail(f"torch sees a GPU but the flashsel CUDA engine is unavailable: {b['reason']}")
    return b


def keys_of(x, dtype):
    """f32 values as keys of `dtype` (fp8: scaled into e4m3's range)."""
    return (x * 8).to(dtype) if dtype == FP8 else x.to(dtype)


def random_case(rows, heads, d, nb, seed, qdtype=torch.float32, kdtype=torch.bfloat16, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:
        # Few distinct values and repeated key rows: most scores tie exactly.
        q = torch.randint(-1, 3, (rows, heads, d), generator=g).float()
        base = torch.randint(-2, 3, (3, d), generator=g).float()
        k = base[torch.arange(nb) % 3]
    else:
        q = torch.randn((rows, heads, d), generator=g)
        k = torch.randn((nb, d), generator=g)
    return q.to(qdtype), keys_of(k, kdtype)


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


class Within:
    """The CPU engine's scores `cpu` and magnitudes `m` (the CPU engine's
    scores of |q| and |kbar|: M of the bound), for a device result that must
    lie within the CUDA engine's bound plus the CPU engine's of them."""

    def __init__(self, cpu, m, heads, d, qdtype, kdtype):
        terms = lambda t: 3 if t == torch.float32 else 1  # noqa: E731
        n = d // 16 * terms(qdtype) * terms(kdtype)
        self.cpu, self.m = cpu, m
        self.rel = ((68 * n + heads + 2) + (d + heads + 2)) * 2.0**-24
        self.abs = (d * heads * terms(qdtype) * terms(kdtype) + 1) * 2.0**-126 * 2


def within(got, w, ctx):
    g, c, m = got.cpu().double(), w.cpu.double(), w.m.double()
    nan = torch.isnan(c) | torch.isnan(m)
    assert (got.cpu().view(torch.int32)[nan] == NAN_BITS).all(), f"NaN entries {ctx}"
    inf = torch.isinf(c) & ~nan
    assert torch.equal(g[inf], c[inf]), f"infinite entries {ctx}"
    fin = ~nan & ~inf & (m < 2.0**127)
    err = (g[fin] - c[fin]).abs()
    bound = w.rel * m[fin] + w.abs
    assert (err <= bound).all(), f"over the bound {ctx}: worst {(err / bound).max().item():.3g} of it"


def assert_bytes(got, want, ctx=""):
    if isinstance(want, Within):
        return within(got, want, ctx)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.device.type == "cuda" and g.dtype == w.dtype and g.shape == w.shape, ctx
        assert torch.equal(bits(g.cpu()), bits(w.cpu())), f"bytes differ {ctx}"


def cpu(*xs):
    return [None if x is None else x.cpu() for x in xs]


def both(q, k, pos, **kw):
    """(CUDA scores, Within the CPU's) and (CUDA selection, qsa_select over
    the CUDA scores on the device)."""
    skw = {a: kw[a] for a in ("ratio", "page_table", "page_size", "seq_ids") if a in kw}
    hkw = {a: (v.cpu() if isinstance(v, torch.Tensor) else v) for a, v in kw.items()}
    hskw = {a: hkw[a] for a in skw}
    qh, kh, ph = cpu(q, k, pos)
    s = flashsel.qsa_scores(q, k, pos, **skw)
    sel = flashsel.qsa_indexer(q, k, pos, **kw)
    m = flashsel.qsa_scores(qh.abs(), absolute(kh), ph, **hskw)
    heads, d = q.shape[1], q.shape[2]
    w = Within(flashsel.qsa_scores(qh, kh, ph, **hskw), m, heads, d, q.dtype, k.dtype)
    return (s, w), (sel, flashsel.qsa_select(s, pos, **kw))


def absolute(k):
    """|k| (fp8: the sign bit cleared)."""
    if k.dtype == FP8:
        return (k.view(torch.uint8) & 0x7F).view(FP8)
    return k.abs()


def positions_mixed(rows, nb, ratio, k_blocks, seed):
    """Varlen rows: the last position, copy rows (V <= k_blocks), V = k_blocks,
    k_blocks + 1, random ones, and tails of every length."""
    rng = np.random.default_rng(seed)
    last = nb * ratio + ratio - 1
    fixed = [last - ratio + 1, last - 1, 0, ratio - 1, k_blocks * ratio - 1, k_blocks * ratio + ratio - 1,
             (k_blocks + 1) * ratio, (k_blocks + 1) * ratio + 2]  # fmt: skip
    fixed = [min(p, nb * ratio - 1 + (ratio - 1)) for p in fixed]
    rest = rng.integers(0, nb * ratio, max(0, rows - len(fixed)))
    pos = np.array((fixed + rest.tolist())[:rows], np.int64)
    v = (pos + 1) // ratio
    pos = np.where(v > nb, nb * ratio - 1, pos)
    return torch.from_numpy(pos)


# ---------------------------------------------------------------------------
# Within the CPU engine's bound; the selection is qsa_select of the device's scores
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kdtype", KDTYPES, ids=str)
@pytest.mark.parametrize(("heads", "d"), [(4, 128), (1, 64), (7, 256), (16, 128)])
def test_scores_and_indexer_match_the_cpu(qdtype, kdtype, heads, d):
    nb, k_blocks = 3000, 64
    q, k = random_case(23, heads, d, nb, seed=heads * d, qdtype=qdtype, kdtype=kdtype)
    pos = positions_mixed(23, nb, 4, k_blocks, seed=d)
    (s, sh), (sel, selh) = both(q.to(DEV), k.to(DEV), pos.to(DEV), k_blocks=k_blocks, order="score")
    assert s.dtype == torch.float32 and s.shape == (23, nb)
    assert_bytes(s, sh, "scores")
    assert_bytes(sel, selh, "indexer")


@pytest.mark.parametrize("order", ["index", "score"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
def test_near_ties_and_nan_match_the_cpu(order, nan):
    nb, k_blocks = 2000, 40
    q, k = random_case(17, 4, 128, nb, seed=1, ties=True, kdtype=torch.float32)
    pos = positions_mixed(17, nb, 4, k_blocks, seed=2)
    (s, sh), (sel, selh) = both(q.to(DEV), k.to(DEV), pos.to(DEV), k_blocks=k_blocks, order=order, nan=nan)
    assert_bytes(s, sh)
    assert_bytes(sel, selh)
    # Keys one bf16 step apart in one coordinate (scores differing in the last bits).
    g = torch.Generator().manual_seed(3)
    base = torch.randn(128, generator=g).bfloat16().view(torch.int16)
    kb = base.repeat(nb, 1)
    kb[torch.arange(nb), torch.arange(nb) % 128] += (torch.arange(nb) % 3).to(torch.int16)
    kb = kb.view(torch.bfloat16)
    qf = torch.randn((17, 4, 128), generator=g)
    (s, sh), (sel, selh) = both(qf.to(DEV), kb.to(DEV), pos.to(DEV), k_blocks=k_blocks, order=order, nan=nan)
    assert_bytes(s, sh)
    assert_bytes(sel, selh)
    # NaN queries and keys, infinities.
    qn, kn = qf.clone(), torch.randn((nb, 128), generator=g)
    qn[1] = float("nan")
    qn[2, 0, 5] = float("nan")
    kn[::5, 1] = float("nan")
    kn[2::7, 0] = float("inf")
    (s, sh), (sel, selh) = both(qn.to(DEV), kn.to(DEV), pos.to(DEV), k_blocks=k_blocks, order=order, nan=nan)
    assert_bytes(s, sh)
    assert_bytes(sel, selh)


def test_varlen_prefill_across_score_groups():
    # NB = 2^19 blocks: groups of 256 MiB / (4 NB) = 128 rows, so 270 rows
    # take three groups; mixed V, copy rows among them, two sequences' worth
    # of positions, int32 and int64 positions.
    nb, k_blocks, rows = 1 << 19, 512, 270
    q, k = random_case(rows, 4, 128, nb, seed=5)
    pos = positions_mixed(rows, nb, 4, k_blocks, seed=6)
    pos[10:40] = torch.arange(nb * 4 - 30, nb * 4)  # a prefill chunk at the end
    qd, kd = q.to(DEV), k.to(DEV)
    (s, sh), (sel, selh) = both(qd, kd, pos.to(DEV))
    assert_bytes(s, sh)
    assert_bytes(sel, selh)
    assert_bytes(flashsel.qsa_indexer(qd, kd, pos.int().to(DEV)), selh)
    assert_bytes(flashsel.qsa_indexer(qd, kd, pos.to(DEV), order="score"), flashsel.qsa_select(s, pos.to(DEV), order="score"))


def test_prefill_chunk_all_copy_rows_and_empty():
    q, k = random_case(300, 4, 128, 4096, seed=7)
    pos = torch.arange(300)  # V <= 75 <= k_blocks: every row copies
    (s, sh), (sel, selh) = both(q.to(DEV), k.to(DEV), pos.to(DEV))
    assert_bytes(s, sh)
    assert_bytes(sel, selh)
    ids, counts = flashsel.qsa_indexer(q[:0].to(DEV), k.to(DEV), pos[:0].to(DEV))
    assert ids.shape == (0, 2051) and counts.shape == (0,)
    assert flashsel.qsa_scores(q[:0].to(DEV), k.to(DEV), pos[:0].to(DEV)).shape == (0, 4096)
    # No keys at all: V = 0 rows (tail only).
    s = flashsel.qsa_scores(q[:3].to(DEV), k[:0].to(DEV), torch.tensor([0, 1, 2], device=DEV))
    assert s.shape == (3, 0)
    ids, counts = flashsel.qsa_indexer(q[:3].to(DEV), k[:0].to(DEV), torch.tensor([0, 1, 2], device=DEV))
    assert counts.tolist() == [1, 2, 3]


@pytest.mark.parametrize("kdtype", KDTYPES, ids=str)
def test_paged_keys_and_slots_match_the_cpu(kdtype):
    g = torch.Generator().manual_seed(8)
    ratio, page_size, d = 4, 64, 128
    per = page_size // ratio
    max_pages, seqs = 40, 3
    pages = seqs * max_pages + 5
    cache = keys_of(torch.randn((pages, per, d), generator=g), kdtype)
    # One page past the keys' 40: the slots of a row's tail tokens (t up to
    # 4 * NB + 3) live on page 40.
    table = torch.randperm(pages, generator=g)[: seqs * (max_pages + 1)].to(torch.int32).reshape(seqs, max_pages + 1)
    rows = 12
    q = torch.randn((rows, 4, d), generator=g)
    pos = positions_mixed(rows, max_pages * per, ratio, 64, seed=9)
    seq = (torch.arange(rows) % seqs).to(torch.int32)
    kw = dict(page_table=table.to(DEV), page_size=page_size, seq_ids=seq.to(DEV), k_blocks=64)
    for order in ("index", "score"):
        (s, sh), (sel, selh) = both(q.to(DEV), cache.to(DEV), pos.to(DEV), order=order, **kw)
        assert_bytes(s, sh)
        assert_bytes(sel, selh)
    # Host page tables and positions are copied over (not capturable, same bytes).
    (s2, _), (sel2, _) = both(q.to(DEV), cache.to(DEV), pos, page_table=table, page_size=page_size, seq_ids=seq,
                              k_blocks=64, order="score")  # fmt: skip
    assert_bytes(s2, sh)
    assert_bytes(sel2, selh)


# ---------------------------------------------------------------------------
# Device values out of range
# ---------------------------------------------------------------------------


def test_device_rows_out_of_range():
    nb = 500
    q, k = random_case(6, 4, 128, nb, seed=10)
    good = 4 * nb - 1
    pos = torch.tensor([good, -1, 4 * nb + 3, 2**40, -(2**40), 1000], dtype=torch.int64)
    qd, kd = q.to(DEV), k.to(DEV)
    s = flashsel.qsa_scores(qd, kd, pos.to(DEV))
    ids, counts = flashsel.qsa_indexer(qd, kd, pos.to(DEV), k_blocks=16)
    ok = [0, 5]
    # The good rows: the bits of those rows alone on the device.
    sh = flashsel.qsa_scores(qd[ok], kd, pos[ok].to(DEV)).cpu()
    ih, ch = flashsel.qsa_indexer(qd[ok], kd, pos[ok].to(DEV), k_blocks=16)
    ih, ch = ih.cpu(), ch.cpu()
    assert torch.equal(bits(s[ok].cpu()), bits(sh))
    assert torch.equal(ids[ok].cpu(), ih) and torch.equal(counts[ok].cpu(), ch)
    bad = [1, 2, 3, 4]
    assert (s[bad].cpu().view(torch.int32) == NAN_BITS).all()
    assert (ids[bad] == -1).all() and (counts[bad] == 0).all()


def test_device_page_values_out_of_range():
    g = torch.Generator().manual_seed(11)
    ratio, page_size, d, per = 4, 64, 128, 16
    max_pages, pages = 10, 24
    cache = torch.randn((pages, per, d), generator=g).bfloat16()
    table = torch.randperm(pages, generator=g)[:20].to(torch.int32).reshape(2, max_pages)
    q = torch.randn((5, 4, d), generator=g)
    last = max_pages * page_size - 1
    pos = torch.tensor([last, last, last, 300, last])
    seq = torch.tensor([0, 2, -1, 1, 1], dtype=torch.int32)  # rows 1, 2: sequences outside the table
    kw = dict(page_size=page_size, k_blocks=16)
    bad_table = table.clone()
    bad_table[1, 7] = pages + 3  # row 4 reads page 7 of sequence 1: outside the cache
    bad_table[1, 8] = -5
    s = flashsel.qsa_scores(q.to(DEV), cache.to(DEV), pos.to(DEV), page_table=bad_table.to(DEV),
                            page_size=page_size, seq_ids=seq.to(DEV))  # fmt: skip
    ids, counts = flashsel.qsa_indexer(q.to(DEV), cache.to(DEV), pos.to(DEV), page_table=bad_table.to(DEV),
                                       seq_ids=seq.to(DEV), **kw)  # fmt: skip
    assert (s[1:3].cpu().view(torch.int32) == NAN_BITS).all()
    assert (ids[1:3] == -1).all() and (counts[1:3] == 0).all()
    # Rows 0 and 3 never read the bad entries: their bits alone on a good table.
    ok = [0, 3]
    dev = lambda *xs: [x.to(DEV) for x in xs]  # noqa: E731
    sh = flashsel.qsa_scores(*dev(q[ok], cache, pos[ok]), page_table=table.to(DEV), page_size=page_size,
                             seq_ids=seq[ok].to(DEV)).cpu()  # fmt: skip
    assert torch.equal(bits(s[ok].cpu()), bits(sh))
    # Row 4: the blocks of pages 7 and 8 score NaN, the others the CPU's.
    s4 = s[4].cpu().view(torch.int32)
    nan_blocks = torch.zeros(max_pages * per, dtype=torch.bool)
    nan_blocks[7 * per : 9 * per] = True
    assert (s4[nan_blocks] == NAN_BITS).all()
    good_table = table.clone()
    good_table[1, 7], good_table[1, 8] = table[0, 0], table[0, 1]
    sh4 = flashsel.qsa_scores(*dev(q[4:], cache, pos[4:]), page_table=good_table.to(DEV), page_size=page_size,
                              seq_ids=seq[4:].to(DEV)).cpu()  # fmt: skip
    assert torch.equal(s4[~nan_blocks], sh4[0].view(torch.int32)[~nan_blocks])
    # ... and the indexer ranks those NaN blocks as qsa_select does (lowest), with
    # the entries of the bad pages written as -1 slots where selected.
    sel = flashsel.qsa_select(s[4:], pos[4:].to(DEV), page_table=bad_table.to(DEV), page_size=page_size,
                              seq_ids=seq[4:].to(DEV), k_blocks=16)  # fmt: skip
    assert torch.equal(ids[4:].cpu(), sel[0].cpu()) and torch.equal(counts[4:].cpu(), sel[1].cpu())


# ---------------------------------------------------------------------------
# The fused call is qsa_select of the scores, on the device
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kdtype", KDTYPES, ids=str)
def test_fused_is_qsa_select_of_qsa_scores_on_device(kdtype):
    nb = 20_000
    q, k = random_case(33, 4, 128, nb, seed=12, kdtype=kdtype, ties=kdtype == torch.float32)
    pos = positions_mixed(33, nb, 4, 512, seed=13).to(DEV)
    qd, kd = q.to(DEV), k.to(DEV)
    for order in ("index", "score"):
        for nan in ("lowest", "largest"):
            fused = flashsel.qsa_indexer(qd, kd, pos, order=order, nan=nan)
            s = flashsel.qsa_scores(qd, kd, pos)
            assert_bytes(fused, flashsel.qsa_select(s, pos, order=order, nan=nan), f"{order} {nan}")


# ---------------------------------------------------------------------------
# CUDA graphs, torch.compile, streams
# ---------------------------------------------------------------------------


def test_graph_capture_and_replay_on_new_data():
    nb, rows = 8192, 9
    q, k = random_case(rows, 4, 128, nb, seed=14)
    pos = positions_mixed(rows, nb, 4, 512, seed=15)
    qd, kd, pd = q.to(DEV), k.to(DEV), pos.to(DEV).int()
    flashsel.qsa_indexer(qd, kd, pd)  # the engine exists before the capture
    flashsel.qsa_scores(qd, kd, pd)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            flashsel.qsa_indexer(qd, kd, pd)
            flashsel.qsa_scores(qd, kd, pd)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_s = flashsel.qsa_scores(qd, kd, pd)
        out_i = flashsel.qsa_indexer(qd, kd, pd, order="score")
    for seed in (16, 17):
        q2, k2 = random_case(rows, 4, 128, nb, seed=seed)
        p2 = positions_mixed(rows, nb, 4, 512, seed=seed)
        qd.copy_(q2)
        kd.copy_(k2)
        pd.copy_(p2)
        g.replay()
        torch.cuda.synchronize()
        # The device's own bits (its scores are not the CPU engine's).
        q3, k3, p3 = q2.to(DEV), k2.to(DEV), p2.to(DEV)
        assert_bytes(out_s, flashsel.qsa_scores(q3, k3, p3))
        assert_bytes(out_i, flashsel.qsa_indexer(q3, k3, p3, order="score"))


def test_graph_capture_of_paged_decode():
    g = torch.Generator().manual_seed(18)
    per, page_size, max_pages, seqs = 16, 64, 64, 4
    cache = torch.randn((seqs * max_pages, per, 128), generator=g).bfloat16().to(DEV)
    table = torch.randperm(seqs * max_pages, generator=g).to(torch.int32).reshape(seqs, max_pages).to(DEV)
    q = torch.randn((seqs, 4, 128), generator=g).to(DEV)
    pos = torch.tensor([4095, 3000, 2051, 100], dtype=torch.int32, device=DEV)
    seq = torch.arange(seqs, dtype=torch.int32, device=DEV)
    kw = dict(page_table=table, page_size=page_size, seq_ids=seq)
    flashsel.qsa_indexer(q, cache, pos, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, counts = flashsel.qsa_indexer(q, cache, pos, **kw)
    pos.copy_(torch.tensor([4000, 4095, 600, 2047], dtype=torch.int32))
    q.copy_(torch.randn((seqs, 4, 128), generator=g))
    graph.replay()
    torch.cuda.synchronize()
    want = flashsel.qsa_select(flashsel.qsa_scores(q, cache, pos, **kw), pos, **kw)
    assert_bytes((ids, counts), want)


def test_compile_fullgraph_matches_eager():
    nb = 4096
    q, k = random_case(11, 4, 128, nb, seed=19, kdtype=torch.bfloat16)
    pos = positions_mixed(11, nb, 4, 512, seed=20).to(DEV)
    qd, kd = q.to(DEV), k.to(DEV)

    def step(q, k, p):
        s = flashsel.qsa_scores(q, k, p)
        ids, counts = flashsel.qsa_indexer(q, k, p, order="score")
        return s, ids, counts

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(qd, kd, pos)
    want = step(qd, kd, pos)
    assert_bytes(got, want)
    assert_bytes((got[1], got[2]), flashsel.qsa_indexer(q, k, pos.cpu(), order="score"))
    # A compiled function captured in a CUDA graph (reduce-overhead).
    f = torch.compile(lambda q, k, p: flashsel.qsa_indexer(q, k, p), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out = f(qd, kd, pos)
    assert_bytes(out, flashsel.qsa_indexer(qd, kd, pos))
    torch._dynamo.reset()


def test_runs_on_the_current_stream():
    q, k = random_case(5, 4, 128, 3000, seed=21)
    pos = positions_mixed(5, 3000, 4, 512, seed=22)
    qd, kd, pd = q.to(DEV), k.to(DEV), pos.to(DEV)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # the launch must queue behind this on s
        ids, counts = flashsel.qsa_indexer(qd, kd, pd)
        sc = flashsel.qsa_scores(qd, kd, pd)
    s.synchronize()
    # The same calls on the default stream: the device's own bits.
    assert_bytes((ids, counts), flashsel.qsa_indexer(qd.clone(), kd.clone(), pd.clone()))
    assert_bytes(sc, flashsel.qsa_scores(qd.clone(), kd.clone(), pd.clone()))


# ---------------------------------------------------------------------------
# Host-checkable errors
# ---------------------------------------------------------------------------


def test_errors_on_the_host():
    q, k = random_case(3, 4, 128, 100, seed=23)
    qd, kd = q.to(DEV), k.to(DEV)
    pos = torch.tensor([399, 3, 50], device=DEV)
    with pytest.raises(ValueError, match="kbar is on cpu but q is on cuda"):
        flashsel.qsa_scores(qd, k, pos)
    with pytest.raises(ValueError, match="kbar is on cpu but q is on cuda"):
        flashsel.qsa_indexer(qd, k, pos)
    with pytest.raises(ValueError, match="kbar is on cuda:\\d but q is in host memory"):
        flashsel.qsa_scores(q, kd, pos.cpu())
    with pytest.raises(ValueError, match="positions is on cuda:\\d but q is in host memory"):
        flashsel.qsa_indexer(q, k, pos)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        flashsel.qsa_scores(qd, kd.view(-1)[4 : 4 + 99 * 128].view(99, 128), pos.clamp(max=395))
    with pytest.raises(TypeError, match="unsupported kbar dtype torch.float16"):
        flashsel.qsa_indexer(qd, kd.half(), pos)
    with pytest.raises(ValueError, match="kbar has d = 64 but q has d = 128"):
        flashsel.qsa_scores(qd, kd[:, :64].contiguous(), pos)
    with pytest.raises(ValueError, match="kbar must be C-contiguous"):
        flashsel.qsa_scores(qd, kd[:, :64], pos)
    with pytest.raises(ValueError, match="positions must be 1-D with 3 entries"):
        flashsel.qsa_indexer(qd, kd, pos[:2])
    with pytest.raises(TypeError, match="positions must hold int32 or int64"):
        flashsel.qsa_indexer(qd, kd, pos.float())
    with pytest.raises(ValueError, match="invalid heads"):
        flashsel.qsa_scores(torch.zeros(3, 17, 128, device=DEV), kd, pos)
    with pytest.raises(ValueError, match="page_table and seq_ids come together"):
        flashsel.qsa_indexer(qd, kd, pos, page_table=torch.zeros(1, 4, dtype=torch.int32, device=DEV))
    # A strided q is copied (it is small); the result is the contiguous one's.
    wide = torch.randn(3, 8, 128, device=DEV)
    assert_bytes(flashsel.qsa_scores(wide[:, ::2], kd, pos), flashsel.qsa_scores(wide[:, ::2].contiguous(), kd, pos))
