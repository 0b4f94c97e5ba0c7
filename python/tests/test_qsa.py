"""flashsel.qsa_select on the CPU engine: the contract's worked example, a
pure-NumPy reference on random rows (every V boundary, both orders, both NaN
policies, the three dtypes), page tables, and the errors."""

import numpy as np
import pytest

import flashsel


def reference(scores, positions, ratio, k_blocks, order, nan, table=None, page_size=64, seqs=None):
    """The contract, directly: sort by (key desc, block asc), expand, map."""
    rows, nb = scores.shape
    width = k_blocks * ratio + ratio - 1
    ids = np.full((rows, width), -1, np.int32)
    counts = np.zeros(rows, np.int32)
    for i, t in enumerate(positions):
        v = (t + 1) // ratio
        if v <= k_blocks:
            blocks = list(range(v))
        else:
            row = scores[i, :v].astype(np.float64)
            # Best first: NaN above everything (largest) or below (lowest),
            # then the value (-0.0 == +0.0), then the lower block.
            nan_class = 2 if nan == "largest" else 0
            key = sorted(
                (-(nan_class if np.isnan(x) else 1), 0.0 if np.isnan(x) else -float(x) + 0.0, b)
                for b, x in enumerate(row)
            )
            blocks = [b for _, _, b in key[:k_blocks]]
            if order == "index":
                blocks.sort()
        toks = [b * ratio + j for b in blocks for j in range(ratio)] + list(range(v * ratio, t + 1))
        if table is not None:
            toks = [int(table[seqs[i], tok // page_size]) * page_size + tok % page_size for tok in toks]
        ids[i, : len(toks)] = toks
        counts[i] = len(toks)
    return ids, counts


def test_worked_example():
    s = np.array([[0.5, 2.0, -1.0, 2.0, np.nan, 3.0, 0.0, 9.0]], np.float32)
    ids, counts = flashsel.qsa_select(s, [22], k_blocks=2)
    assert ids.tolist() == [[4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22]] and counts.tolist() == [11]
    ids, _ = flashsel.qsa_select(s, np.array([22], np.int32), k_blocks=2, order="score", nan="largest")
    assert ids.tolist() == [[16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22]]
    ids, counts = flashsel.qsa_select(s, [9], k_blocks=2)
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1]] and counts.tolist() == [10]
    assert ids.dtype == np.int32 and counts.dtype == np.int32


@pytest.mark.parametrize("order", ["index", "score"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_random_rows_match_the_reference(order, nan, dtype):
    rng = np.random.default_rng(3)
    rows, nb, k = 10, 400, 32
    s = rng.standard_normal((rows, nb)).astype(np.float32)
    s[:, ::5] = np.nan  # NaN on every fifth block
    s[3] = np.maximum(s[3], 0)  # a ReLU plateau of exact zeros
    s[4] = 1.5  # all equal
    if dtype == "f16":
        s = s.astype(np.float16)
    positions = np.array([0, 3, 4, k * 4 - 1, k * 4, k * 4 + 5, 600, 1201, nb * 4 + 2, 777], np.int64)
    ids, counts = flashsel.qsa_select(s, positions, k_blocks=k, order=order, nan=nan)
    want_ids, want_counts = reference(s, positions, 4, k, order, nan)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(counts, want_counts)


def test_page_tables():
    rng = np.random.default_rng(4)
    s = rng.standard_normal((4, 300)).astype(np.float32)
    positions = [10, 900, 1199, 500]
    table = (np.arange(2 * 19, dtype=np.int32).reshape(2, 19) * 7) % 53
    seqs = np.array([0, 1, 1, 0], np.int32)
    ids, counts = flashsel.qsa_select(s, positions, k_blocks=50, page_table=table, seq_ids=seqs)
    want = reference(s, positions, 4, 50, "index", "lowest", table, 64, seqs)
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(counts, want[1])


def test_errors():
    s = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError):
        flashsel.qsa_select(s, [3, 35], k_blocks=2)  # V = 9 > 8 blocks
    with pytest.raises(ValueError):
        flashsel.qsa_select(s, [3, -1], k_blocks=2)
    with pytest.raises(ValueError):
        flashsel.qsa_select(s, [3], k_blocks=2)
    with pytest.raises(TypeError):
        flashsel.qsa_select(s, np.array([3.0, 4.0]), k_blocks=2)
    with pytest.raises(ValueError):
        flashsel.qsa_select(s, [3, 4], k_blocks=0)
    with pytest.raises(ValueError):
        flashsel.qsa_select(s, [3, 4], page_table=np.zeros((1, 1), np.int32))
    with pytest.raises(TypeError):
        flashsel.qsa_select(s.astype(np.float64), [3, 4])
    with pytest.raises(ValueError):
        flashsel.qsa_select(s[0], [3])


def test_cpu_tensors_give_tensors_and_cuda_tensors_are_refused():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    s = rng.standard_normal((3, 200)).astype(np.float32)
    positions = [10, 500, 799]
    want = flashsel.qsa_select(s, positions, k_blocks=40, order="score")
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.from_numpy(s).to(dtype)
        ids, counts = flashsel.qsa_select(t, torch.tensor(positions), k_blocks=40, order="score")
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int32 and tuple(ids.shape) == (3, 40 * 4 + 3)
        host = t.float().numpy() if dtype == torch.float32 else None
        if host is not None:
            np.testing.assert_array_equal(ids.numpy(), want[0])
            np.testing.assert_array_equal(counts.numpy(), want[1])
        else:
            # bf16: the same as the NumPy bit patterns of the same values.
            bits = t.view(torch.int16).numpy()
            np.testing.assert_array_equal(ids.numpy(), flashsel.qsa_select(bits, positions, k_blocks=40, order="score")[0])
    if torch.cuda.is_available():
        ids, counts = flashsel.qsa_select(torch.from_numpy(s).cuda(), torch.tensor(positions).cuda(), k_blocks=40, order="score")
        np.testing.assert_array_equal(ids.cpu().numpy(), want[0])
        np.testing.assert_array_equal(counts.cpu().numpy(), want[1])


# ---------------------------------------------------------------------------
# topk(starts=...): per-row ranges (DSA's ks / ke), CPU engine
# ---------------------------------------------------------------------------


def test_topk_ranges_keep_absolute_columns():
    rng = np.random.default_rng(8)
    rows, cols, k = 6, 5000, 64
    s = rng.standard_normal((rows, cols)).astype(np.float32)
    starts = np.array([0, 5, 100, 4999, 2000, 10], np.int64)
    ends = np.array([0, 6, 150, 5000, 5000, 4000], np.int32)
    for order in ("score", "index"):
        idx, val = flashsel.topk(s, k, lengths=ends, starts=starts, order=order, return_values=True)
        for r in range(rows):
            seg = s[r, starts[r] : ends[r]]
            # Best first by value, ties to the lower column (no ties in normal data).
            best = np.argsort(-seg, kind="stable")[:k] + starts[r]
            want = best if order == "score" else np.sort(best)
            n = len(want)
            np.testing.assert_array_equal(idx[r, :n], want)
            assert (idx[r, n:] == -1).all()
            np.testing.assert_array_equal(val[r, :n], s[r, want])
    # A scalar start for every row; start 0 is plain topk.
    np.testing.assert_array_equal(flashsel.topk(s, k, starts=0), flashsel.topk(s, k))
    one = flashsel.topk(s[1], 3, starts=4990)
    assert one.tolist() == (np.argsort(-s[1, 4990:], kind="stable")[:3] + 4990).tolist()


def test_topk_range_errors():
    s = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError):
        flashsel.topk(s, 2, lengths=[4, 4], starts=[5, 0])  # start past the row's end
    with pytest.raises(ValueError):
        flashsel.topk(s, 2, starts=[0])
    with pytest.raises(TypeError):
        flashsel.topk(s, 2, starts=[0.5, 1.0])


def test_topk_slots_are_the_ranges_mapped_through_the_page_table():
    rng = np.random.default_rng(9)
    rows, cols, k, ps = 5, 700, 50, 16
    s = rng.standard_normal((rows, cols)).astype(np.float32)
    starts = np.array([0, 3, 650, 100, 0], np.int32)
    ends = np.array([700, 40, 700, 100, 10], np.int32)
    max_pages = -(-cols // ps)
    table = rng.permutation(3 * max_pages).astype(np.int32).reshape(3, max_pages)
    seq_ids = np.array([2, 0, 1, 1, 0], np.int32)
    for order in ("score", "index"):
        idx = flashsel.topk(s, k, lengths=ends, starts=starts, order=order)
        slots = flashsel.topk(s, k, lengths=ends, starts=starts, order=order, page_table=table, page_size=ps, seq_ids=seq_ids)
        want = np.where(idx >= 0, table[seq_ids[:, None], np.maximum(idx, 0) // ps] * ps + np.maximum(idx, 0) % ps, -1)
        np.testing.assert_array_equal(slots, want)
    with pytest.raises(ValueError, match="together"):
        flashsel.topk(s, k, page_table=table)
    with pytest.raises(ValueError, match="page"):
        flashsel.topk(s, k, page_table=table[:, :2], page_size=ps, seq_ids=seq_ids)  # tokens past the table's pages
