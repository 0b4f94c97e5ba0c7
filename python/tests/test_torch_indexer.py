"""The QSA indexer's torch operators, torch.ops.flashsel.qsa_scores and
.qsa_indexer, on the CPU: schemas, routing from the public functions,
torch.library.opcheck, the fake (meta) implementations (output shapes, and
the eager errors case by case), torch.compile(fullgraph=True) giving the
same bytes as eager, host forms (lists, NumPy arrays) beside a tensor q.

Skipped where torch is not importable. The CUDA half is
test_cuda_indexer.py."""

from __future__ import annotations

import numpy as np
import pytest

import flashsel

torch = pytest.importorskip("torch")

from flashsel import _torch_ops  # noqa: E402,F401 - after the skip; registers the operators

SCORES = torch.ops.flashsel.qsa_scores.default
INDEXER = torch.ops.flashsel.qsa_indexer.default
FP8 = getattr(torch, "float8_e4m3fn", None)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def case(rows=5, heads=4, d=128, nb=60, seed=0, kdtype=torch.float32, qdtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((rows, heads, d), generator=g).to(qdtype)
    k = torch.randn((nb, d), generator=g)
    k = (k * 8).to(kdtype) if kdtype == FP8 else k.to(kdtype)
    pos = torch.randint(0, 4 * nb, (rows,), generator=g)
    pos[0] = 4 * nb - 1
    return q, k, pos


def paged_case(seed=1, kdtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    ratio, page_size, d = 4, 64, 128
    per = page_size // ratio
    pages, max_pages = 12, 5
    cache = torch.randn((pages, per, d), generator=g).to(kdtype)
    table = torch.randperm(pages, generator=g)[: 2 * max_pages].to(torch.int32).reshape(2, max_pages)
    q = torch.randn((4, 4, d), generator=g)
    pos = torch.tensor([max_pages * page_size - 1, 100, 3, 250])
    seq = torch.tensor([0, 1, 1, 0], dtype=torch.int32)
    return q, cache, pos, table, page_size, seq


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.device == y.device
        assert torch.equal(bits(x), bits(y))


def numpy_of(t):
    """The NumPy form the CPU path takes (bf16 / fp8 as bit patterns)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if FP8 is not None and t.dtype == FP8:
        return t.view(torch.uint8).numpy()
    return t.numpy()


# ---------------------------------------------------------------------------
# Registration and routing
# ---------------------------------------------------------------------------


def test_schemas():
    s = str(SCORES._schema)
    assert s.startswith("flashsel::qsa_scores(Tensor q, Tensor kbar, Tensor positions, SymInt ratio")
    assert s.endswith("-> Tensor")
    i = str(INDEXER._schema)
    assert i.startswith("flashsel::qsa_indexer(Tensor q, Tensor kbar, Tensor positions, SymInt ratio, SymInt k_blocks")
    assert "-> (Tensor ids, Tensor counts)" in i
    assert torch.Tag.pt2_compliant_tag in SCORES.tags and torch.Tag.pt2_compliant_tag in INDEXER.tags


def test_public_functions_go_through_the_operators():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, p):
        return flashsel.qsa_scores(q, k, p), flashsel.qsa_indexer(q, k, p, k_blocks=8)

    q, k, pos = case()
    out = torch.compile(f, fullgraph=True, backend=backend)(q, k, pos)
    want = f(q, k, pos)
    same(out[0], want[0])
    same(out[1], want[1])
    targets = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert SCORES in targets or torch.ops.flashsel.qsa_scores in targets
    assert INDEXER in targets or torch.ops.flashsel.qsa_indexer in targets


def test_tensor_results_equal_the_numpy_path():
    for kd in [torch.float32, torch.bfloat16] + ([FP8] if FP8 is not None else []):
        for qd in (torch.float32, torch.bfloat16):
            q, k, pos = case(kdtype=kd, qdtype=qd, seed=3)
            s = flashsel.qsa_scores(q, k, pos)
            want = flashsel.qsa_scores(numpy_of(q), numpy_of(k), pos.numpy())
            np.testing.assert_array_equal(s.numpy().view(np.uint32), want.view(np.uint32))
            ids, counts = flashsel.qsa_indexer(q, k, pos, k_blocks=8, order="score")
            wi, wc = flashsel.qsa_indexer(numpy_of(q), numpy_of(k), pos.numpy(), k_blocks=8, order="score")
            np.testing.assert_array_equal(ids.numpy(), wi)
            np.testing.assert_array_equal(counts.numpy(), wc)


def test_host_forms_beside_a_tensor_q():
    q, k, pos = case(seed=4)
    want = flashsel.qsa_scores(q, k, pos)
    same(flashsel.qsa_scores(q, k, pos.tolist()), want)
    same(flashsel.qsa_scores(q, k, pos.numpy()), want)
    same(flashsel.qsa_scores(q, k.numpy(), pos.numpy()), want)  # NumPy keys: the eager host path
    wi = flashsel.qsa_indexer(q, k, pos, k_blocks=8)
    same(flashsel.qsa_indexer(q, k, pos.tolist(), k_blocks=8), wi)
    same(flashsel.qsa_indexer(q, k.numpy(), pos, k_blocks=8), wi)
    q, cache, pos, table, ps, seq = paged_case()
    want = flashsel.qsa_indexer(q, cache, pos, page_table=table, page_size=ps, seq_ids=seq, k_blocks=8)
    got = flashsel.qsa_indexer(
        q, cache, pos.tolist(), page_table=table.numpy(), page_size=ps, seq_ids=seq.tolist(), k_blocks=8
    )
    same(got, want)


# ---------------------------------------------------------------------------
# opcheck and the fakes
# ---------------------------------------------------------------------------


def _opcheck_args():
    q, k, pos = case(seed=5)
    yield "f32", (q, k, pos, 4, None, 64, None), (q, k, pos, 4, 8, "index", "lowest", None, 64, None)
    qb, kb, pos32 = q.bfloat16(), k.bfloat16(), pos.int()
    yield "bf16 int32", (qb, kb, pos32, 4, None, 64, None), (qb, kb, pos32, 4, 8, "score", "largest", None, 64, None)
    q, cache, pos, table, ps, seq = paged_case()
    yield "paged", (q, cache, pos, 4, table, ps, seq), (q, cache, pos, 4, 8, "index", "lowest", table, ps, seq)
    q, k, pos = case(rows=3, heads=2, d=64, nb=20, seed=6)
    yield "ratio 2 d 64", (q, k, pos // 2, 2, None, 64, None), (q, k, pos // 2, 2, 3, "index", "lowest", None, 64, None)


@pytest.mark.parametrize(("name", "s_args", "i_args"), list(_opcheck_args()), ids=lambda x: x if isinstance(x, str) else "")
def test_opcheck(name, s_args, i_args):
    torch.library.opcheck(SCORES, s_args)
    torch.library.opcheck(INDEXER, i_args)


@pytest.mark.skipif(FP8 is None, reason="torch has no float8_e4m3fn")
def test_opcheck_fp8_keys():
    # torch's CPU float8 cannot compute, which the schema test does on the
    # inputs: the other checks.
    q, k, pos = case(kdtype=FP8, seed=7)
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(SCORES, (q, k, pos, 4, None, 64, None), test_utils=tests)
    torch.library.opcheck(INDEXER, (q, k, pos, 4, 8, "index", "lowest", None, 64, None), test_utils=tests)


def test_fakes_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(6, 4, 128)
        k = torch.empty(300, 128, dtype=torch.bfloat16)
        pos = torch.empty(6, dtype=torch.int64)
        s = SCORES(q, k, pos, 4, None, 64, None)
        assert s.shape == (6, 300) and s.dtype == torch.float32
        ids, counts = INDEXER(q, k, pos, 4, 512, "index", "lowest", None, 64, None)
        assert ids.shape == (6, 2051) and counts.shape == (6,) and ids.dtype == counts.dtype == torch.int32
        cache = torch.empty(10, 16, 128)
        table = torch.empty(2, 7, dtype=torch.int32)
        seq = torch.empty(6, dtype=torch.int32)
        s = SCORES(q, cache, pos, 4, table, 64, seq)
        assert s.shape == (6, 7 * 16)
        ids, _ = INDEXER(q, cache, pos, 8, 10, "score", "lowest", table, 128, seq)
        assert ids.shape == (6, 10 * 8 + 7)


def _error_cases():
    q, k, pos = case(rows=3, nb=20, seed=8)
    qc, cache, pc, table, ps, seq = paged_case()

    def s(q=q, k=k, pos=pos, ratio=4, table=None, ps=64, seq=None):
        return (q, k, pos, ratio, table, ps, seq)

    yield s(q=q.double()), TypeError, "unsupported q dtype torch.float64"
    yield s(q=q.bfloat16().view(torch.int16)), TypeError, "pass x.view\\(torch.bfloat16\\)"
    yield s(k=k.half()), TypeError, "unsupported kbar dtype torch.float16"
    yield s(k=k.bfloat16().view(torch.int16)), TypeError, "unsupported kbar dtype torch.int16"
    yield s(k=torch.zeros(20, 128, dtype=torch.uint8)), TypeError, "pass x.view\\(torch.float8_e4m3fn\\)"
    yield s(q=q[0]), ValueError, "q must be 3-D .*for one query pass q\\[None\\]"
    yield s(k=k.t().contiguous().t()), ValueError, "kbar must be C-contiguous"
    yield s(k=k[None]), ValueError, "kbar must be 2-D \\[blocks, d\\]"
    yield s(k=k[:, :64]), ValueError, "kbar must be C-contiguous"
    yield s(k=k[:, :64].contiguous()), ValueError, "kbar has d = 64 but q has d = 128"
    yield s(pos=pos.float()), TypeError, "positions must hold int32 or int64 values, got float32"
    yield s(pos=pos[:2]), ValueError, "positions must be 1-D with 3 entries"
    yield s(pos=pos[None]), ValueError, "positions must be 1-D with 3 entries"
    yield s(q=torch.zeros(3, 17, 128)), ValueError, "invalid heads"
    yield s(q=torch.zeros(3, 4, 96), k=torch.zeros(20, 96)), ValueError, "invalid head dim"
    yield s(table=table), ValueError, "page_table and seq_ids come together"
    yield s(q=qc, k=cache.reshape(-1, 128), pos=pc, table=table, seq=seq), ValueError, "with page_table, kbar must be 3-D"
    p = dict(q=qc, k=cache, pos=pc, table=table, seq=seq)
    yield s(**{**p, "k": cache, "ps": 64}, ratio=8), ValueError, "kbar holds 16 blocks a page but page_size // ratio"
    yield s(**{**p, "ps": 66}), ValueError, "page_size = 66 is not a multiple of ratio = 4"
    yield s(**{**p, "table": table.long()}), TypeError, "page_table must be int32 \\[sequences, max_pages\\], got int64"
    yield s(**{**p, "table": table[0]}), TypeError, "page_table must be int32"
    yield s(**{**p, "seq": seq.float()}), TypeError, "seq_ids must hold int32 or int64 values, got float32"
    yield s(**{**p, "seq": seq[:3]}), ValueError, "seq_ids must be 1-D with 4 entries"


@pytest.mark.parametrize(("args", "exc", "match"), list(_error_cases()))
def test_fake_errors_are_the_eager_errors(args, exc, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, pos, ratio, table, ps, seq = args
    # The public function (NumPy-free eager path on tensors), the operator
    # eagerly, the operator on fakes; qsa_scores and qsa_indexer alike.
    kw = dict(ratio=ratio, page_table=table, page_size=ps, seq_ids=seq)
    with pytest.raises(exc, match=match):
        flashsel.qsa_scores(q, k, pos, **kw)
    with pytest.raises(exc, match=match):
        flashsel.qsa_indexer(q, k, pos, k_blocks=8, **kw)
    with pytest.raises(exc, match=match):
        SCORES(*args)
    iargs = (q, k, pos, ratio, 8, "index", "lowest", table, ps, seq)
    with pytest.raises(exc, match=match):
        INDEXER(*iargs)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        SCORES(*args)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        INDEXER(*iargs)
    # The NumPy path says the same (shapes, values: its dtype messages name
    # NumPy's dtypes).
    if exc is ValueError:
        with pytest.raises(exc, match=match):
            flashsel.qsa_scores(
                numpy_of(q), numpy_of(k), pos.numpy(), ratio=ratio,
                page_table=None if table is None else table.numpy(), page_size=ps,
                seq_ids=None if seq is None else seq.numpy(),
            )  # fmt: skip


def test_indexer_fake_checks_the_options():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, pos = case(rows=3, nb=20, seed=9)
    for args, exc, match in [
        ((q, k, pos, 4, 8, "best", "lowest", None, 64, None), ValueError, "order"),
        ((q, k, pos, 4, 8, "index", "high", None, 64, None), ValueError, "nan"),
        ((q, k, pos, 4, 0, "index", "lowest", None, 64, None), ValueError, "k_blocks must be in 1"),
        ((q, k, pos, 0, 8, "index", "lowest", None, 64, None), ValueError, "ratio must be in 1"),
    ]:
        with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
            INDEXER(*args)


def test_value_errors_come_when_the_operator_runs():
    q, k, pos = case(rows=2, nb=10, seed=10)
    bad = torch.tensor([39, 44])  # V = 11 > 10 blocks
    with pytest.raises(ValueError, match="positions\\[1\\] = 44 sees 11 blocks of 4 tokens but the keys hold 10"):
        flashsel.qsa_scores(q, k, bad)
    with pytest.raises(ValueError, match="positions\\[1\\] = 44 sees 11 blocks"):
        torch.compile(lambda q, k, p: flashsel.qsa_indexer(q, k, p, k_blocks=2), fullgraph=True)(q, k, bad)
    with pytest.raises(ValueError, match="position"):
        flashsel.qsa_scores(q, k, torch.tensor([-1, 3]))


def test_compile_errors_reach_the_caller():
    q, k, pos = case(rows=3, nb=20, seed=11)
    with pytest.raises(Exception, match="kbar has d = 64 but q has d = 128"):
        torch.compile(lambda q, k, p: flashsel.qsa_scores(q, k, p), fullgraph=True)(q, k[:, :64].contiguous(), pos)
    with pytest.raises(Exception, match="positions must hold int32 or int64"):
        torch.compile(lambda q, k, p: flashsel.qsa_indexer(q, k, p), fullgraph=True)(q, k, pos.float())


def test_outputs_never_require_grad():
    q, k, pos = case(rows=3, nb=20, seed=12)
    q.requires_grad_(True)
    s = flashsel.qsa_scores(q, k, pos)
    ids, counts = flashsel.qsa_indexer(q, k, pos, k_blocks=4)
    assert not s.requires_grad and not ids.requires_grad and not counts.requires_grad


# ---------------------------------------------------------------------------
# torch.compile(fullgraph=True) == eager
# ---------------------------------------------------------------------------


def _compile_configs():
    q, k, pos = case(rows=9, nb=200, seed=13)
    yield "f32", q, k, pos, dict(k_blocks=40)
    yield "bf16 score largest", q.bfloat16(), k.bfloat16(), pos.int(), dict(k_blocks=40, order="score", nan="largest")
    if FP8 is not None:
        q8, k8, p8 = case(rows=9, nb=200, seed=14, kdtype=FP8)
        yield "fp8", q8, k8, p8, dict(k_blocks=40)
    qq, cache, pc, table, ps, seq = paged_case()
    yield "paged", qq, cache, pc, dict(k_blocks=8, page_table=table, page_size=ps, seq_ids=seq)
    yield "ratio 8 d 256", torch.randn(4, 2, 256), torch.randn(50, 256), torch.tensor([0, 7, 100, 399]), dict(
        ratio=8, k_blocks=10
    )
    yield "all copies", q, k, torch.arange(9), dict(k_blocks=512)
    yield "strided q", torch.randn(9, 8, 128)[:, ::2], k, pos, dict(k_blocks=16)


@pytest.mark.parametrize(("name", "q", "k", "pos", "kw"), list(_compile_configs()), ids=lambda x: x if isinstance(x, str) else "")
def test_compile_matches_eager(name, q, k, pos, kw):
    skw = {a: kw[a] for a in ("ratio", "page_table", "page_size", "seq_ids") if a in kw}
    f = torch.compile(lambda q, k, p: flashsel.qsa_scores(q, k, p, **skw), fullgraph=True)
    same(f(q, k, pos), flashsel.qsa_scores(q, k, pos, **skw))
    g = torch.compile(lambda q, k, p: flashsel.qsa_indexer(q, k, p, **kw), fullgraph=True)
    want = flashsel.qsa_indexer(q, k, pos, **kw)
    same(g(q, k, pos), want)
    # The fused result is qsa_select of the scores.
    sel = {a: kw[a] for a in kw if a != "seq_ids"}
    if "seq_ids" in kw:
        sel["seq_ids"] = kw["seq_ids"]
    same(want, flashsel.qsa_select(flashsel.qsa_scores(q, k, pos, **skw), pos, **sel))


def test_compile_dynamic_shapes():
    f = torch.compile(lambda q, k, p: flashsel.qsa_indexer(q, k, p, k_blocks=8), fullgraph=True, dynamic=True)
    h = torch.compile(lambda q, k, p: flashsel.qsa_scores(q, k, p), fullgraph=True, dynamic=True)
    for rows, nb in [(3, 40), (5, 70), (8, 33)]:
        q, k, pos = case(rows=rows, nb=nb, seed=rows)
        same(f(q, k, pos), flashsel.qsa_indexer(q, k, pos, k_blocks=8))
        same(h(q, k, pos), flashsel.qsa_scores(q, k, pos))


def test_compile_inside_a_larger_graph():
    def step(q, k, p):
        ids, counts = flashsel.qsa_indexer(q * 2, k, p, k_blocks=8)
        return ids.clamp(min=0).sum(1) + counts

    q, k, pos = case(seed=15)
    got = torch.compile(step, fullgraph=True)(q, k, pos)
    assert torch.equal(got, step(q, k, pos))
