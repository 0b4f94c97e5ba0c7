"""flashsel.qsa_select and flashsel.topk(starts=...) on CUDA torch tensors:
the same bytes as the CPU engine (ids, counts, indices and values), page
tables, device values out of range, CUDA graphs.

Skipped (reported as skipped) where torch is not importable or sees no CUDA
device."""

from __future__ import annotations

import numpy as np
import pytest

import flashsel
from _ref import make

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

DEV = torch.device("cuda", torch.cuda.current_device())
TDTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@pytest.fixture(scope="module", autouse=True)
def engine():
    b = flashsel.backends()["cuda"]
    if not b["available"]:
        pytest.fail(f"torch sees a GPU but the flashsel CUDA engine is unavailable: {b['reason']}")
    return b


def scores(kind, rows, cols, dtype, seed):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(make(kind, rows, cols, np.float32, rng)).to(dtype)


def page_table(rows, tokens, page_size, seed):
    rng = np.random.default_rng(seed)
    seqs = max(1, (rows + 1) // 2)
    max_pages = -(-tokens // page_size) + 1
    table = rng.permutation(seqs * max_pages).astype(np.int32).reshape(seqs, max_pages)
    seq_ids = (np.arange(rows) % seqs).astype(np.int32)
    return torch.from_numpy(table), torch.from_numpy(seq_ids)


QSA_SHAPES = [
    # rows, blocks, k_blocks, ratio, positions kind
    (1, 262_144, 512, 4, "full"),
    (16, 65_536, 512, 4, "full"),
    (1, 16_384, 512, 4, "full"),
    (300, 4096, 512, 4, "chunk"),
    (40, 3000, 300, 1, "random"),
    (40, 3000, 300, 8, "random"),
    (9, 10, 11, 4, "random"),
]


def positions_for(kind, rows, blocks, ratio, seed):
    rng = np.random.default_rng(seed)
    top = blocks * ratio + ratio - 2  # the last position whose V is blocks
    if kind == "full":
        return torch.from_numpy((top - np.arange(rows) % ratio).astype(np.int64))
    if kind == "chunk":
        return torch.arange(top - rows + 1, top + 1, dtype=torch.int64)
    return torch.from_numpy(rng.integers(0, top + 1, rows).astype(np.int64))


@pytest.mark.parametrize("shape", QSA_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
@pytest.mark.parametrize("order", ["index", "score"])
def test_qsa_matches_cpu(shape, dtype, order):
    rows, blocks, k, ratio, kind = shape
    for seed, data in enumerate(["normal", "relu", "nan5"]):
        s = scores(data, rows, blocks, dtype, seed)
        pos = positions_for(kind, rows, blocks, ratio, seed)
        want = flashsel.qsa_select(s, pos, ratio=ratio, k_blocks=k, order=order)
        got = flashsel.qsa_select(s.to(DEV), pos.to(DEV), ratio=ratio, k_blocks=k, order=order)
        assert got[0].device == DEV and got[0].dtype == torch.int32
        assert torch.equal(got[1].cpu(), want[1]), f"counts differ {shape} {data}"
        assert torch.equal(got[0].cpu(), want[0]), f"ids differ {shape} {data}"


@pytest.mark.parametrize("order", ["index", "score"])
def test_qsa_page_table_matches_cpu(order):
    rows, blocks, k, ratio = 24, 20_000, 512, 4
    s = scores("relu", rows, blocks, torch.bfloat16, 3)
    pos = positions_for("random", rows, blocks, ratio, 3)
    table, seq_ids = page_table(rows, blocks * ratio + ratio, 64, 3)
    want = flashsel.qsa_select(s, pos, order=order, page_table=table, seq_ids=seq_ids)
    got = flashsel.qsa_select(
        s.to(DEV), pos.to(DEV), order=order, page_table=table.to(DEV), seq_ids=seq_ids.to(DEV)
    )
    assert torch.equal(got[1].cpu(), want[1])
    assert torch.equal(got[0].cpu(), want[0])


def test_qsa_device_rows_out_of_range_are_padding():
    rows, blocks = 8, 5000
    s = scores("normal", rows, blocks, torch.float32, 5)
    pos = positions_for("random", rows, blocks, 4, 5)
    bad = pos.clone()
    bad[0] = -3
    bad[1] = blocks * 4 + 4  # V > blocks
    bad[2] = 2**40  # beyond int32: must not wrap into range
    bad[3] = -(2**40)
    ids, counts = flashsel.qsa_select(s.to(DEV), bad.to(DEV))
    ids, counts = ids.cpu(), counts.cpu()
    assert (counts[:4] == 0).all() and (ids[:4] == -1).all()
    want = flashsel.qsa_select(s[4:], pos[4:])
    assert torch.equal(ids[4:], want[0]) and torch.equal(counts[4:], want[1])


def test_qsa_cuda_graph_replay():
    rows, blocks = 4, 65_536
    s = scores("normal", rows, blocks, torch.bfloat16, 7).to(DEV)
    pos = positions_for("full", rows, blocks, 4, 7).to(DEV)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flashsel.qsa_select(s, pos)  # warm-up outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            out = flashsel.qsa_select(s, pos)
    fresh = scores("relu", rows, blocks, torch.bfloat16, 8)
    s.copy_(fresh.to(DEV))
    g.replay()
    torch.cuda.synchronize()
    want = flashsel.qsa_select(fresh, pos.cpu())
    assert torch.equal(out[0].cpu(), want[0]) and torch.equal(out[1].cpu(), want[1])


RANGE_SHAPES = [
    # rows, cols, k
    (64, 131_072, 2048),
    (2, 262_144, 512),
    (300, 20_000, 512),
    (12, 5000, 300),
]


def ranges_for(rows, cols, k, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, cols + 1, rows)
    b = rng.integers(0, cols + 1, rows)
    starts, ends = np.minimum(a, b), np.maximum(a, b)
    edges = [(0, 0), (0, 1), (cols - 1, cols), (0, cols), (1, min(cols, 1 + k)), (cols, cols)]
    for i, (s0, e0) in enumerate(edges[:rows]):
        starts[i], ends[i] = s0, e0
    return torch.from_numpy(starts.astype(np.int32)), torch.from_numpy(ends.astype(np.int32))


@pytest.mark.parametrize("shape", RANGE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
@pytest.mark.parametrize("order", ["score", "index"])
def test_ranges_match_cpu(shape, dtype, order):
    rows, cols, k = shape
    s = scores("relu", rows, cols, dtype, 11)
    starts, ends = ranges_for(rows, cols, k, 11)
    wi, wv = flashsel.topk(s, k, lengths=ends, starts=starts, order=order, return_values=True)
    gi, gv = flashsel.topk(s.to(DEV), k, lengths=ends.to(DEV), starts=starts.to(DEV), order=order, return_values=True)
    assert torch.equal(gi.cpu(), wi)
    iv = INT_VIEW[dtype]
    assert torch.equal(gv.cpu().view(iv), wv.view(iv))


def test_ranges_device_out_of_range_rows_are_padding():
    rows, cols, k = 6, 5000, 100
    s = scores("normal", rows, cols, torch.float32, 13)
    starts = torch.tensor([-1, 10, 4000, 0, 7, 3], dtype=torch.int32)
    ends = torch.tensor([100, 5, cols + 1, cols, 300, 3], dtype=torch.int32)
    gi = flashsel.topk(s.to(DEV), k, lengths=ends.to(DEV), starts=starts.to(DEV)).cpu()
    assert (gi[:3] == -1).all()
    wi = flashsel.topk(s[3:], k, lengths=ends[3:], starts=starts[3:])
    assert torch.equal(gi[3:], wi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ranges_to_slots_match_cpu(dtype):
    rows, cols, k, ps = 64, 131_072, 2048, 64
    s = scores("normal", rows, cols, dtype, 17)
    starts, ends = ranges_for(rows, cols, k, 17)
    table, seq_ids = page_table(rows, cols, ps, 17)
    want = flashsel.topk(s, k, lengths=ends, starts=starts, order="index", page_table=table, seq_ids=seq_ids)
    got = flashsel.topk(
        s.to(DEV), k, lengths=ends.to(DEV), starts=starts.to(DEV), order="index",
        page_table=table.to(DEV), seq_ids=seq_ids.to(DEV),
    )
    assert torch.equal(got.cpu(), want)
