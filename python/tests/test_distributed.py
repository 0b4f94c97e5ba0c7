"""flashsel.distributed: ranks holding slices of each row's columns, the
candidates all-gathered over a torch.distributed group, the exact merge.
CPU: 2-4 processes with the gloo backend (localhost only), every rank's
bytes equal to flashsel.topk on the whole rows (uneven and empty shards,
ties and NaN across the boundaries, both orders and NaN policies, three
dtypes, lengths). CUDA: the GPU merge of simulated shards and a world-size-1
NCCL group, skipped without CUDA. Everything skips without torch."""

import contextlib
import os
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import flashsel  # noqa: E402
from flashsel import distributed as fd  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _scores(rows, cols, dtype, seed):
    g = np.random.default_rng(seed)
    x = g.integers(-3, 4, size=(rows, cols)).astype(np.float32)  # many ties
    x[g.random((rows, cols)) < 0.05] = np.nan
    x[g.random((rows, cols)) < 0.05] = -0.0
    x[g.random((rows, cols)) < 0.02] = -np.inf
    x[:, ::7] += g.standard_normal((rows, (cols + 6) // 7)).astype(np.float32)
    return torch.from_numpy(x).to(dtype)


def _cuts(cols, world, seed):
    g = np.random.default_rng(seed)
    cuts = sorted(int(c) for c in g.integers(0, cols + 1, size=world - 1))
    bounds = [0, *cuts, cols]
    return [(bounds[r], bounds[r + 1] - bounds[r]) for r in range(world)]


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _worker(rank, world):
    checked = 0
    for case, (rows, cols, k) in enumerate([(3, 50, 8), (2, 37, 64), (4, 300, 16), (1, 5, 3)]):
        for dtype in DTYPES:
            for order in ("score", "index"):
                for nan in ("lowest", "largest"):
                    seed = 1000 * case + 10 * DTYPES.index(dtype) + (order == "index") * 2 + (nan == "largest")
                    x = _scores(rows, cols, dtype, seed)
                    shards = _cuts(cols, world, seed)
                    off, n = shards[rank]
                    lengths = [int(v) for v in np.random.default_rng(seed).integers(0, cols + 1, size=rows)]
                    for lens in (None, lengths):
                        got_i, got_v = fd.topk(
                            x[:, off : off + n], k, group=None, offset=off, total_cols=cols,
                            lengths=lens, order=order, nan=nan, return_values=True,
                        )
                        want_i, want_v = flashsel.topk(
                            x, k, lengths=None if lens is None else torch.tensor(lens, dtype=torch.int32),
                            order=order, nan=nan, return_values=True,
                        )
                        tag = f"rank {rank}/{world} case {case} {dtype} {order} {nan} lengths={lens is not None}"
                        assert torch.equal(got_i, want_i.to(torch.int32)), tag
                        assert torch.equal(_bits(got_v), _bits(want_v)), tag
                        checked += 1
    return checked


def _gloo_rank(rank, world, init, result_dir, worker):
    """One spawned rank: joins the gloo group, runs `worker(rank, world)`
    (it returns how many cases it checked), writes that count."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        checked = worker(rank, world)
        with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
            f.write(str(checked))
    finally:
        dist.destroy_process_group()


def _run_ranks(worker, world):
    """Spawns `world` gloo ranks of `worker` (file:// rendezvous); each writes
    how many cases it checked: every rank the same number, at least one."""
    mp = pytest.importorskip("torch.multiprocessing")
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        mp.spawn(_gloo_rank, args=(world, init, d, worker), nprocs=world, join=True)
        counts = [int(open(os.path.join(d, f"rank{r}")).read()) for r in range(world)]
    assert counts == [counts[0]] * world and counts[0] > 0


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_ranks_equal_the_single_process_result(world):
    _run_ranks(_worker, world)


def test_cpu_merge_of_simulated_shards():
    for dtype in DTYPES:
        x = _scores(4, 90, dtype, 7)
        for world in (1, 2, 5, 8):
            shards = _cuts(90, world, world)
            k = 12
            ids, vals = [], []
            for off, n in shards:
                i, v = flashsel.topk(x[:, off : off + n], k, order="index", return_values=True)
                ids.append(torch.where(i >= 0, i + off, i).to(torch.int32))
                vals.append(v)
            for order in ("score", "index"):
                got_i, got_v = fd.merge(torch.stack(ids), torch.stack(vals), k=k,
                                        shard_lens=[n for _, n in shards], order=order)
                want_i, want_v = flashsel.topk(x, k, order=order, return_values=True)
                assert torch.equal(got_i, want_i.to(torch.int32))
                assert torch.equal(_bits(got_v), _bits(want_v))


def test_bad_layout_is_an_error():
    ids = torch.full((2, 1, 4), -1, dtype=torch.int32)
    vals = torch.full((2, 1, 4), float("-inf"))
    ids[0, 0, 0] = 9  # rank 0 ships 1 of its 4 and an id outside its 5 columns
    with pytest.raises(Exception, match="rank candidates"):
        fd.merge(ids, vals, k=4, shard_lens=[5, 5])


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_merge_of_simulated_shards_equals_one_device():
    for dtype in DTYPES:
        x = _scores(16, 20000, dtype, 3).cuda()
        for world in (1, 2, 3, 8):
            shards = _cuts(20000, world, 11 * world)
            k = 2048
            for order in ("score", "index"):
                for nan in ("lowest", "largest"):
                    # Each rank's candidates under the merge's NaN policy (a
                    # NaN a rank ranked lowest could not come back).
                    ids, vals = [], []
                    for off, n in shards:
                        i, v = flashsel.topk(x[:, off : off + n], k, order="index", nan=nan, return_values=True)
                        ids.append(torch.where(i >= 0, i + off, i).to(torch.int32))
                        vals.append(v)
                    got_i, got_v = fd.merge(torch.stack(ids), torch.stack(vals), k=k,
                                            shard_lens=[n for _, n in shards], order=order, nan=nan)
                    want_i, want_v = flashsel.topk(x, k, order=order, nan=nan, return_values=True)
                    assert torch.equal(got_i, want_i.to(torch.int32)), (dtype, world, order, nan)
                    assert torch.equal(_bits(got_v), _bits(want_v)), (dtype, world, order, nan)
                    cpu_i, cpu_v = fd.merge(torch.stack(ids).cpu(), torch.stack(vals).cpu(), k=k,
                                            shard_lens=[n for _, n in shards], order=order, nan=nan)
                    assert torch.equal(cpu_i, got_i.cpu()) and torch.equal(_bits(cpu_v), _bits(got_v.cpu()))


def _nccl_worker(rank, world, init):
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        torch.cuda.set_device(rank)
        x = _scores(16, 4096, torch.bfloat16, 5).cuda()
        got_i, got_v = fd.topk(x, 512, offset=0, total_cols=4096, return_values=True)
        want_i, want_v = flashsel.topk(x, 512, return_values=True)
        assert torch.equal(got_i, want_i.to(torch.int32)) and torch.equal(_bits(got_v), _bits(want_v))
    finally:
        dist.destroy_process_group()


def _run_nccl_alone(worker):
    """`worker` as the one rank of an NCCL group (NVLink multicast off)."""
    if not dist.is_nccl_available():
        pytest.skip("no NCCL in this torch")
    mp = pytest.importorskip("torch.multiprocessing")
    with tempfile.TemporaryDirectory() as d:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        mp.spawn(worker, args=(1, "file://" + os.path.join(d, "rdv")), nprocs=1, join=True)


@cuda
def test_nccl_world_size_one():
    _run_nccl_alone(_nccl_worker)


# ---------------------------------------------------------------------------
# qsa_select over block shards
# ---------------------------------------------------------------------------


def _qsa_case(rows, nb, ratio, k, seed):
    """Block scores with ties and NaN, positions from copy rows (V <= k) to
    V = nb, and a page table covering every token a row can name."""
    x = _scores(rows, nb, torch.float32, seed)
    g = np.random.default_rng(seed)
    v = g.integers(0, nb + 1, size=rows)
    v[: min(rows, 3)] = [0, min(k, nb), nb][: min(rows, 3)]
    tail = g.integers(0, ratio, size=rows)
    pos = torch.from_numpy(np.maximum(v * ratio + tail, 1) - 1).to(torch.int64)
    page_size = 16
    max_pages = (nb * ratio + ratio) // page_size + 1
    seqs = 2
    table = torch.from_numpy(g.permutation(seqs * max_pages).astype(np.int32).reshape(seqs, max_pages))
    seq_ids = torch.from_numpy((np.arange(rows) % seqs).astype(np.int32))
    return x, pos, table, page_size, seq_ids


def _qsa_worker(rank, world):
    checked = 0
    for case, (rows, nb, ratio, k) in enumerate([(9, 120, 4, 16), (5, 40, 1, 50), (7, 333, 3, 8)]):
        for dtype in DTYPES:
            for order in ("index", "score"):
                for nan in ("lowest", "largest"):
                    seed = 100 * case + 10 * DTYPES.index(dtype) + 2 * (order == "score") + (nan == "largest")
                    x, pos, table, ps, seq = _qsa_case(rows, nb, ratio, k, seed)
                    x = x.to(dtype)
                    off, n = _cuts(nb, world, seed)[rank]
                    for paged in (False, True):
                        kw = dict(page_table=table, page_size=ps, seq_ids=seq) if paged else {}
                        got = fd.qsa_select(x[:, off : off + n], pos, offset=off, total_blocks=nb, ratio=ratio,
                                            k_blocks=k, order=order, nan=nan, **kw)  # fmt: skip
                        want = flashsel.qsa_select(x, pos, ratio=ratio, k_blocks=k, order=order, nan=nan, **kw)
                        tag = f"rank {rank}/{world} case {case} {dtype} {order} {nan} paged={paged}"
                        assert torch.equal(got[0], torch.as_tensor(want[0])), tag
                        assert torch.equal(got[1], torch.as_tensor(want[1])), tag
                        checked += 1
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_qsa_select_equals_the_single_process_result(world):
    _run_ranks(_qsa_worker, world)


def _nccl_qsa_worker(rank, world, init):
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        torch.cuda.set_device(rank)
        x, pos, table, ps, seq = _qsa_case(12, 3000, 4, 256, 21)
        x = x.to(torch.bfloat16)
        for order in ("index", "score"):
            kw = dict(page_table=table.cuda(), page_size=ps, seq_ids=seq.cuda())
            got = fd.qsa_select(x.cuda(), pos.cuda(), offset=0, total_blocks=3000, k_blocks=256, order=order, **kw)
            want = flashsel.qsa_select(x, pos, k_blocks=256, order=order, page_table=table, page_size=ps, seq_ids=seq)
            assert torch.equal(got[0].cpu(), torch.as_tensor(want[0])), order
            assert torch.equal(got[1].cpu(), torch.as_tensor(want[1])), order
    finally:
        dist.destroy_process_group()


@cuda
def test_nccl_qsa_select_world_size_one():
    _run_nccl_alone(_nccl_qsa_worker)


# ---------------------------------------------------------------------------
# qsa_indexer over key shards
# ---------------------------------------------------------------------------


def _indexer_worker(rank, world):
    checked = 0
    for case, (rows, nb, ratio, k, heads, d) in enumerate([(8, 300, 4, 32, 2, 64), (5, 90, 1, 40, 4, 128)]):
        for qd, kd in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
            for order in ("index", "score"):
                seed = 50 * case + 2 * (qd == torch.bfloat16) + (order == "score")
                g = np.random.default_rng(seed)
                q = torch.from_numpy(g.integers(-2, 3, size=(rows, heads, d)).astype(np.float32)).to(qd)
                kbar = torch.from_numpy(g.integers(-2, 3, size=(nb, d)).astype(np.float32)).to(kd)  # near-ties
                _, pos, table, ps, seq = _qsa_case(rows, nb, ratio, k, seed)
                off, n = _cuts(nb, world, seed)[rank]
                for paged in (False, True):
                    kw = dict(page_table=table, page_size=ps, seq_ids=seq) if paged else {}
                    got = fd.qsa_indexer(q, kbar[off : off + n], pos, offset=off, total_blocks=nb, ratio=ratio,
                                         k_blocks=k, order=order, **kw)  # fmt: skip
                    scores = flashsel.qsa_scores(q, kbar, pos, ratio=ratio)
                    want = flashsel.qsa_select(scores, pos, ratio=ratio, k_blocks=k, order=order, **kw)
                    tag = f"rank {rank}/{world} case {case} {qd} {kd} {order} paged={paged}"
                    assert torch.equal(got[0], torch.as_tensor(want[0])), tag
                    assert torch.equal(got[1], torch.as_tensor(want[1])), tag
                    if not paged:
                        fused = flashsel.qsa_indexer(q, kbar, pos, ratio=ratio, k_blocks=k, order=order)
                        assert torch.equal(got[0], torch.as_tensor(fused[0])), tag
                    checked += 1
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_qsa_indexer_equals_the_single_process_result(world):
    _run_ranks(_indexer_worker, world)


# ---------------------------------------------------------------------------
# shard_sizes: the layout given, not all-gathered (no host read-back)
# ---------------------------------------------------------------------------


def _counting_gathers():
    """Wraps fd._all_gather to record the shape of every all-gather."""
    shapes = []
    inner = fd._all_gather

    def counted(torch_, dist_, t, world, group):
        shapes.append(tuple(t.shape))
        return inner(torch_, dist_, t, world, group)

    fd._all_gather = counted
    return shapes


def _sizes_worker(rank, world):
    shapes = _counting_gathers()
    checked = 0
    for case, (rows, cols, k) in enumerate([(3, 50, 8), (4, 300, 16)]):
        for dtype in DTYPES:
            seed = 77 + 10 * case + DTYPES.index(dtype)
            x = _scores(rows, cols, dtype, seed)
            shards = _cuts(cols, world, seed)
            sizes = [n for _, n in shards]
            off, n = shards[rank]
            lengths = torch.from_numpy(np.random.default_rng(seed).integers(0, cols + 1, size=rows))
            for order in ("score", "index"):
                shapes.clear()
                got = fd.topk(x[:, off : off + n], k, offset=off, total_cols=cols, lengths=lengths,
                              order=order, return_values=True, shard_sizes=sizes)  # fmt: skip
                # Only the candidates travel: ids and values, no layout.
                assert shapes == [(rows, k), (rows, k * x.element_size())], shapes
                want = fd.topk(x[:, off : off + n], k, offset=off, total_cols=cols, lengths=lengths,
                               order=order, return_values=True)  # fmt: skip
                assert shapes[2] == (2,), shapes  # without: the layout first
                one = flashsel.topk(x, k, lengths=lengths.to(torch.int32), order=order, return_values=True)
                for g, w in ((got, want), (got, one)):
                    assert torch.equal(g[0], w[0].to(torch.int32)) and torch.equal(_bits(g[1]), _bits(w[1]))
                checked += 1
    # qsa_select and qsa_indexer take it too.
    x, pos, table, ps, seq = _qsa_case(9, 120, 4, 16, 5)
    cuts = _cuts(120, world, 5)
    off, n = cuts[rank]
    sizes = [c for _, c in cuts]
    shapes.clear()
    got = fd.qsa_select(x[:, off : off + n], pos, offset=off, total_blocks=120, k_blocks=16, shard_sizes=sizes)
    assert len(shapes) == 2, shapes
    want = flashsel.qsa_select(x, pos, k_blocks=16)
    assert torch.equal(got[0], torch.as_tensor(want[0])) and torch.equal(got[1], torch.as_tensor(want[1]))
    g = np.random.default_rng(6)
    q = torch.from_numpy(g.standard_normal((9, 2, 64)).astype(np.float32))
    kbar = torch.from_numpy(g.standard_normal((120, 64)).astype(np.float32))
    shapes.clear()
    got = fd.qsa_indexer(q, kbar[off : off + n], pos, offset=off, total_blocks=120, k_blocks=16,
                         shard_sizes=sizes)  # fmt: skip
    assert len(shapes) == 2, shapes
    want = flashsel.qsa_indexer(q, kbar, pos, k_blocks=16)
    assert torch.equal(got[0], torch.as_tensor(want[0])) and torch.equal(got[1], torch.as_tensor(want[1]))
    checked += 2
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_shard_sizes_skip_the_layout_gather(world):
    _run_ranks(_sizes_worker, world)


@contextlib.contextmanager
def _one_rank_group():
    """A one-rank gloo group in this process (checks that raise before any
    collective)."""
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "rdv"), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_bad_shard_sizes_are_errors():
    """A one-rank gloo group in this process: every check is local, so each
    raises before any collective."""
    with _one_rank_group():
        x = _scores(2, 30, torch.float32, 1)
        for sizes, match in (
            ([30, 0], "2 entries for a group of 1"),
            ([29], r"shard_sizes\[0\] is 29"),
            ([-1], ">= 0"),
        ):
            with pytest.raises(ValueError, match=match):
                fd.topk(x, 4, offset=0, total_cols=30, shard_sizes=sizes)
        with pytest.raises(ValueError, match="its offset is 3"):
            fd.topk(x, 4, offset=3, total_cols=33, shard_sizes=[30])
        with pytest.raises(ValueError, match="the total says 31"):
            fd.topk(x, 4, offset=0, total_cols=31, shard_sizes=[30])
        with pytest.raises(ValueError, match=r"shard_sizes\[0\] is 10"):
            fd.qsa_select(x, torch.tensor([100, 119]), offset=0, total_blocks=30, k_blocks=4, shard_sizes=[10])
        got = fd.topk(x, 4, offset=0, total_cols=30, shard_sizes=[30])
        assert torch.equal(got, flashsel.topk(x, 4).to(torch.int32))


def _nccl_graph_worker(rank, world, init):
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        torch.cuda.set_device(rank)
        x = _scores(16, 8192, torch.bfloat16, 9).cuda()
        lengths = torch.randint(0, 8193, (16,), device="cuda")
        x_pos = torch.full((4,), 4 * 2048 + 1, dtype=torch.int64, device="cuda")
        xs = _scores(4, 2048, torch.float32, 10).cuda()
        kw = dict(offset=0, shard_sizes=[8192])
        fd.topk(x, 512, total_cols=8192, lengths=lengths, **kw)  # warm-up (compiles, allocates)
        fd.qsa_select(xs, x_pos, offset=0, total_blocks=2048, k_blocks=256, shard_sizes=[2048])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = fd.topk(x, 512, total_cols=8192, lengths=lengths, **kw)
            got_q = fd.qsa_select(xs, x_pos, offset=0, total_blocks=2048, k_blocks=256, shard_sizes=[2048])
        for trial in range(2):
            x.copy_(_scores(16, 8192, torch.bfloat16, 100 + trial).cuda())
            xs.copy_(_scores(4, 2048, torch.float32, 200 + trial).cuda())
            graph.replay()
            torch.cuda.synchronize()
            want = flashsel.topk(x, 512, lengths=lengths.to(torch.int32))
            assert torch.equal(got, want.to(torch.int32)), trial
            want_q = flashsel.qsa_select(xs, x_pos, k_blocks=256)
            assert torch.equal(got_q[0], torch.as_tensor(want_q[0])) and torch.equal(got_q[1], torch.as_tensor(want_q[1]))
    finally:
        dist.destroy_process_group()


@cuda
def test_nccl_shard_sizes_capture_in_a_cuda_graph():
    """With shard_sizes nothing reads back to the host: topk and qsa_select
    over an NCCL group capture into one CUDA graph and replay on new
    scores."""
    _run_nccl_alone(_nccl_graph_worker)


# ---------------------------------------------------------------------------
# qsa_indexer over paged key shards
# ---------------------------------------------------------------------------


def _paged_keys(g, bpp, d, dtype, table):
    """A global paged cache: sequence s's block b at
    kbar[table[s, b // bpp], b % bpp] (small integers: near-ties)."""
    pages = int(table.max()) + 1
    kbar = torch.from_numpy(g.integers(-2, 3, size=(pages, bpp, d)).astype(np.float32)).to(dtype)
    return kbar


def _rank_cache(kbar, table, off, n, bpp, seqs, g):
    """Rank's own cache of global blocks off .. off + n (page-aligned) of
    every sequence: its pages in a random order of its own, its table."""
    local_pages = n // bpp
    perm = g.permutation(seqs * local_pages + 2).astype(np.int32)  # two unused pages
    t_r = perm[: seqs * local_pages].reshape(seqs, local_pages)
    cache = torch.full((seqs * local_pages + 2, *kbar.shape[1:]), float("nan"), dtype=kbar.dtype)
    for s in range(seqs):
        for j in range(local_pages):
            cache[t_r[s, j]] = kbar[int(table[s, off // bpp + j])]
    return cache, torch.from_numpy(t_r)


def _paged_indexer_worker(rank, world):
    checked = 0
    for case, (rows, nb, ratio, k, heads, d) in enumerate([(8, 320, 4, 32, 2, 64), (6, 96, 2, 40, 4, 128)]):
        for qd, kd in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
            seed = 70 * case + 3 * (qd == torch.bfloat16)
            g = np.random.default_rng(seed)
            _, pos, table, ps, seq = _qsa_case(rows, nb, ratio, k, seed)
            bpp = ps // ratio
            q = torch.from_numpy(g.integers(-2, 3, size=(rows, heads, d)).astype(np.float32)).to(qd)
            kbar = _paged_keys(g, bpp, d, kd, table)
            cuts = _cuts(nb // bpp, world, seed)  # page-aligned shards, some empty
            off, n = cuts[rank][0] * bpp, cuts[rank][1] * bpp
            cache, t_r = _rank_cache(kbar, table, off, n, bpp, 2, np.random.default_rng(seed + rank))
            for order in ("index", "score"):
                for slots in (False, True):
                    kw = dict(page_table=table) if slots else {}
                    got = fd.qsa_indexer(q, cache, pos, offset=off, total_blocks=nb, ratio=ratio, k_blocks=k,
                                         order=order, page_size=ps, seq_ids=seq, key_page_table=t_r,
                                         **kw)  # fmt: skip
                    scores = flashsel.qsa_scores(q, kbar, pos, ratio=ratio, page_table=table, page_size=ps,
                                                 seq_ids=seq)[:, :nb]  # fmt: skip
                    want = flashsel.qsa_select(scores, pos, ratio=ratio, k_blocks=k, order=order, page_size=ps,
                                               **(dict(page_table=table, seq_ids=seq) if slots else {}))  # fmt: skip
                    tag = f"rank {rank}/{world} case {case} {qd} {kd} {order} slots={slots}"
                    assert torch.equal(got[0], torch.as_tensor(want[0])), tag
                    assert torch.equal(got[1], torch.as_tensor(want[1])), tag
                    if slots:
                        fused = flashsel.qsa_indexer(q, kbar, pos, ratio=ratio, k_blocks=k, order=order,
                                                     page_table=table, page_size=ps, seq_ids=seq)  # fmt: skip
                        assert torch.equal(got[0], torch.as_tensor(fused[0])), tag
                    checked += 1
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_qsa_indexer_paged_key_shards(world):
    """Each rank holds its page-aligned block range of every sequence in a
    paged cache of its own (its own page order, unused pages of NaN): every
    rank's ids are the single process's, as token ids and as slots."""
    _run_ranks(_paged_indexer_worker, world)


def test_paged_key_shard_errors():
    with _one_rank_group():
        q = torch.zeros((2, 1, 64))
        cache = torch.zeros((4, 16, 64))
        table = torch.zeros((1, 4), dtype=torch.int32)
        pos = torch.tensor([10, 20])
        seq = torch.zeros(2, dtype=torch.int32)
        kw = dict(offset=0, total_blocks=64, k_blocks=8)
        with pytest.raises(ValueError, match="needs seq_ids"):
            fd.qsa_indexer(q, cache, pos, key_page_table=table, **kw)
        with pytest.raises(ValueError, match="page_size // ratio = 16"):
            fd.qsa_indexer(q, torch.zeros((4, 8, 64)), pos, key_page_table=table, seq_ids=seq, **kw)
        with pytest.raises(ValueError, match="multiple of ratio"):
            fd.qsa_indexer(q, cache, pos, key_page_table=table, seq_ids=seq, page_size=62, **kw)
        with pytest.raises(ValueError, match="takes key_page_table"):
            fd.qsa_indexer(q, cache, pos, **kw)
        got = fd.qsa_indexer(q, cache, pos, key_page_table=table, seq_ids=seq, **kw)
        want = flashsel.qsa_indexer(q, cache, pos, k_blocks=8, page_table=table, seq_ids=seq)
        # Token ids against slots through an identity table: page 0 only.
        assert torch.equal(got[1], torch.as_tensor(want[1]))
