"""flashsel's sparse MLA torch operators, torch.ops.flashsel.sparse_mla_prefill
and .sparse_mla_decode: their schemas, that the public functions route torch
tensors through them, torch.library.opcheck on CPU samples, the fake (meta)
implementations (the eager outputs' shapes and dtypes, the eager error
messages, CUDA metadata accepted), and torch.compile(fullgraph=True) giving
the same bytes as eager on the CPU (topk_length, attn_sink, invalid indices,
every cache format).

Skipped where torch is not importable."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flashsel

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from flashsel import _torch_ops  # noqa: E402,F401 - after the skip; registers the operators

PREFILL = torch.ops.flashsel.sparse_mla_prefill.default
DECODE = torch.ops.flashsel.sparse_mla_decode.default
HAS_CUDA = torch.cuda.is_available()
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, **kw):
    return torch.compile(fn, fullgraph=True, **kw)


def bits(t):
    t = t.contiguous()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same_bytes(got, want, ctx=""):
    assert len(got) == len(want), ctx
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, f"{ctx}: {g.dtype} {g.shape}"
        assert torch.equal(bits(g), bits(w)), f"bytes differ {ctx}"


# ---------------------------------------------------------------------------
# Inputs (torch only: no ml_dtypes needed)
# ---------------------------------------------------------------------------


def gen(seed):
    return torch.Generator().manual_seed(seed)


def prefill_inputs(s_q=3, s_kv=200, h_q=4, d_qk=576, topk=64, dtype=torch.bfloat16, seed=0, sink=False,
                   lengths=None, invalid=True):
    g = gen(seed)
    q = torch.randn(s_q, h_q, d_qk, generator=g).to(dtype)
    kv = torch.randn(s_kv, 1, d_qk, generator=g).to(dtype)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, dtype=torch.int32)
    if invalid:  # invalid entries: negative, past s_kv, the int32 extremes; one row with none valid
        bad = torch.tensor([INT_MIN, -1, s_kv, s_kv + 7, INT_MAX], dtype=torch.int32)
        mask = torch.rand(idx.shape, generator=g) < 0.2
        idx[mask] = bad[torch.randint(0, len(bad), (int(mask.sum()),), generator=g)]
        idx[-1, 0, :] = -1
        idx[0, 0, -3:] = s_kv  # an invalid tail
    kw = {}
    if sink:
        s = torch.randn(h_q, generator=g)
        s[0] = float("inf")
        s[-1] = float("-inf")
        kw["attn_sink"] = s
    if lengths is not None:
        kw["topk_length"] = torch.randint(0, topk + 1, (s_q,), generator=g).to(lengths)
    return q, kv, idx, kw


def fp8_tokens(n, g):
    """n tokens of FlashMLA's 656-byte layout: 512 e4m3 codes (no NaN), 4
    power-of-two f32 scales, 64 bf16 rope values."""
    codes = torch.randint(0, 256, (n, 512), generator=g, dtype=torch.int32)
    codes[(codes & 0x7F) == 0x7F] = 0
    scales = torch.pow(2.0, torch.randint(-8, 2, (n, 4), generator=g).float())
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    return torch.cat(
        [codes.to(torch.uint8), scales.view(torch.uint8).reshape(n, 16), rope.view(torch.uint8).reshape(n, 128)], 1
    )


def decode_inputs(b=2, s_q=3, h_q=8, topk=64, page_size=16, fmt="fp8", d_qk=576, seed=0, strided=True,
                  sink=False, lengths=None):
    """A cache of pages [num_pages, page_size(+1 when strided), 1, W][:, :page_size]."""
    g = gen(seed)
    num_pages = 2 * b * (topk // page_size + 1)
    size = page_size + 1 if strided else page_size
    if fmt == "fp8":
        base = fp8_tokens(num_pages * size, g).reshape(num_pages, size, 1, 656)
    else:
        dt = torch.float32 if fmt == "f32" else torch.bfloat16
        base = torch.randn(num_pages, size, 1, d_qk, generator=g).to(dt)
    cache = base[:, :page_size]
    slots = num_pages * page_size
    idx = torch.randint(0, slots, (b, s_q, topk), generator=g, dtype=torch.int32)
    mask = torch.rand(idx.shape, generator=g) < 0.2
    idx[mask] = torch.tensor([-1, slots, INT_MAX, INT_MIN], dtype=torch.int32)[
        torch.randint(0, 4, (int(mask.sum()),), generator=g)
    ]
    idx[0, -1, :] = -1
    q = torch.randn(b, s_q, h_q, d_qk, generator=g).to(torch.bfloat16)
    kw = {}
    if sink:
        kw["attn_sink"] = torch.randn(h_q, generator=g)
    if lengths == "b":
        kw["topk_length"] = torch.randint(0, topk + 1, (b,), generator=g, dtype=torch.int32)
    elif lengths == "b,s_q":
        kw["topk_length"] = torch.randint(0, topk + 1, (b, s_q), generator=g, dtype=torch.int64)
    return q, cache, idx, kw


# ---------------------------------------------------------------------------
# Registration and routing
# ---------------------------------------------------------------------------


def test_operators_are_registered_with_their_schemas():
    p = str(PREFILL._schema)
    assert p.startswith(
        "flashsel::sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, float sm_scale, SymInt d_v=512, "
        "Tensor? attn_sink=None, Tensor? topk_length=None)"
    ), p
    assert p.endswith("-> (Tensor out, Tensor max_logits, Tensor lse)")
    d = str(DECODE._schema)
    assert d.startswith(
        "flashsel::sparse_mla_decode(Tensor q, Tensor k_cache, Tensor indices, float? sm_scale=None, "
        "SymInt d_v=512, bool? is_fp8_kvcache=None, Tensor? topk_length=None, Tensor? attn_sink=None)"
    ), d
    assert d.endswith("-> (Tensor out, Tensor lse)")
    for op in (PREFILL, DECODE):
        assert torch.Tag.pt2_compliant_tag in op.tags


def test_registration_comes_with_the_first_tensor_call():
    # flashsel imported before torch: the first sparse MLA call on a tensor
    # registers the operators.
    code = (
        "import flashsel, torch\n"
        "print(hasattr(torch.ops.flashsel, 'sparse_mla_prefill'))\n"
        "q = torch.zeros(1, 2, 512); kv = torch.zeros(4, 1, 512); i = torch.zeros(1, 1, 8, dtype=torch.int32)\n"
        "print(tuple(flashsel.sparse_mla_prefill(q, kv, i, 0.1)[0].shape) == (1, 2, 512))\n"
        "print(hasattr(torch.ops.flashsel, 'sparse_mla_prefill'), hasattr(torch.ops.flashsel, 'sparse_mla_decode'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["False", "True", "True", "True"]


class Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_public_functions_call_the_operators():
    q, kv, idx, kw = prefill_inputs(sink=True, lengths=torch.int32)
    with Calls() as c:
        got = flashsel.sparse_mla_prefill(q, kv, idx, 0.05, **kw)
    assert "flashsel.sparse_mla_prefill.default" in c.names
    assert_same_bytes(got, PREFILL(q, kv, idx, 0.05, 512, kw["attn_sink"], kw["topk_length"]))
    dq, cache, didx, dkw = decode_inputs(lengths="b")
    with Calls() as c:
        flashsel.sparse_mla_decode(dq, cache, didx, is_fp8_kvcache=True, **dkw)
    assert "flashsel.sparse_mla_decode.default" in c.names


def test_eager_results_match_the_numpy_path():
    # The operator runs the same reference as the NumPy path: same bits.
    q, kv, idx, kw = prefill_inputs(dtype=torch.float32, sink=True, lengths=torch.int64)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 0.07, **kw)
    want = flashsel.sparse_mla_prefill(
        q.numpy(), kv.numpy(), idx.numpy(), 0.07, attn_sink=kw["attn_sink"].numpy(),
        topk_length=kw["topk_length"].numpy(),
    )
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)
    dq, cache, didx, dkw = decode_inputs(fmt="f32", lengths="b,s_q", sink=True)
    dq = dq.float()
    got = flashsel.sparse_mla_decode(dq, cache, didx, 0.04, **dkw)
    want = flashsel.sparse_mla_decode(
        dq.numpy(), cache.numpy(), didx.numpy(), 0.04, topk_length=dkw["topk_length"].numpy(),
        attn_sink=dkw["attn_sink"].numpy(),
    )
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_host_forms_beside_a_tensor_q_still_run_eagerly():
    # Lists / NumPy arrays beside a tensor q are not the operator's types:
    # the eager path runs them as before (same bits as all-tensor inputs).
    q, kv, idx, kw = prefill_inputs(sink=True, lengths=torch.int32)
    want = flashsel.sparse_mla_prefill(q, kv, idx, 0.05, **kw)
    got = flashsel.sparse_mla_prefill(
        q, kv, idx.numpy(), np.float32(0.05), attn_sink=kw["attn_sink"].tolist(),
        topk_length=kw["topk_length"].tolist(),
    )
    assert_same_bytes(got, want)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 0.05, d_v=np.int64(512), **kw)
    assert_same_bytes(got, want)
    with pytest.raises(TypeError, match="d_v must be an int"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.05, d_v=512.0)
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        flashsel.sparse_mla_prefill(q, kv, idx, "x")
    dq, cache, didx, _ = decode_inputs()
    want = flashsel.sparse_mla_decode(dq, cache, didx)
    assert_same_bytes(flashsel.sparse_mla_decode(dq, cache, didx, is_fp8_kvcache=np.bool_(True)), want)
    assert_same_bytes(flashsel.sparse_mla_decode(dq, cache, didx.numpy(), topk_length=[64, 64]),
                      flashsel.sparse_mla_decode(dq, cache, didx, topk_length=torch.tensor([64, 64])))


# ---------------------------------------------------------------------------
# opcheck and the fake implementations
# ---------------------------------------------------------------------------


def _prefill_samples():
    out = []
    for dtype, d_qk, h_q, topk, sink, lens in [
        (torch.bfloat16, 576, 4, 64, True, torch.int32),
        (torch.float32, 512, 2, 128, False, None),
        (torch.bfloat16, 512, 8, 96, False, torch.int64),
    ]:
        q, kv, idx, kw = prefill_inputs(h_q=h_q, d_qk=d_qk, topk=topk, dtype=dtype, sink=sink, lengths=lens)
        out.append((q, kv, idx, 0.05, 512, kw.get("attn_sink"), kw.get("topk_length")))
    q, kv, idx, _ = prefill_inputs(s_kv=50, topk=64)
    out.append((q, kv[:, 0], idx[:, 0], 0.1))  # 2-D kv and indices, defaults
    return out


def _decode_samples():
    out = []
    for fmt, d_qk, sink, lens, fp8 in [
        ("fp8", 576, True, "b", True),
        ("bf16", 576, False, "b,s_q", None),
        ("f32", 512, True, None, False),
    ]:
        q, cache, idx, kw = decode_inputs(fmt=fmt, d_qk=d_qk, sink=sink, lengths=lens)
        out.append((q, cache, idx, None, 512, fp8, kw.get("topk_length"), kw.get("attn_sink")))
    q, cache, idx, _ = decode_inputs(strided=False)
    out.append((q, cache[:, :, 0], idx, 0.05))  # [pages, page_size, W], dense
    return out


def test_opcheck_float8_cache():
    # opcheck's schema test computes on the inputs, which float8 tensors do
    # not support on the CPU: the other tests for a float8_e4m3fn cache.
    q, cache, idx, _ = decode_inputs()
    args = (q, cache.view(torch.float8_e4m3fn), idx)
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(DECODE, args, test_utils=tests)
    assert_same_bytes(DECODE(*args), DECODE(q, cache, idx))


@pytest.mark.parametrize("args", _prefill_samples(), ids=lambda a: f"{a[0].dtype}-{tuple(a[0].shape)}")
def test_opcheck_sparse_mla_prefill(args):
    torch.library.opcheck(PREFILL, args)


@pytest.mark.parametrize("args", _decode_samples(), ids=lambda a: f"{a[1].dtype}-{tuple(a[1].shape)}")
def test_opcheck_sparse_mla_decode(args):
    torch.library.opcheck(DECODE, args)


def test_outputs_never_require_grad():
    q, kv, idx, kw = prefill_inputs(dtype=torch.float32)
    q.requires_grad_(True)
    for o in flashsel.sparse_mla_prefill(q, kv, idx, 0.1):
        assert not o.requires_grad
    for o in compiled(lambda a: flashsel.sparse_mla_prefill(a * 2.0, kv, idx, 0.1))(q):
        assert not o.requires_grad


def _fake_run(op, args):
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return op(*fargs)


def test_fake_outputs_have_the_eager_shapes_dtypes_and_strides():
    for args in _prefill_samples():
        want = PREFILL(*args)
        got = _fake_run(PREFILL, args)
        assert [(g.shape, g.dtype, g.stride()) for g in got] == [(w.shape, w.dtype, w.stride()) for w in want]
        s_q, h_q = args[0].shape[:2]
        assert got[0].shape == (s_q, h_q, 512) and got[0].dtype == args[0].dtype
        assert got[1].shape == got[2].shape == (s_q, h_q) and got[1].dtype == got[2].dtype == torch.float32
    for args in _decode_samples():
        want = DECODE(*args)
        got = _fake_run(DECODE, args)
        assert [(g.shape, g.dtype, g.stride()) for g in got] == [(w.shape, w.dtype, w.stride()) for w in want]
        b, s_q, h_q = args[0].shape[:3]
        assert got[0].shape == (b, s_q, h_q, 512) and got[1].shape == (b, h_q, s_q)
    # Meta tensors (the Meta kernel is the fake one).
    q, kv, idx, _ = prefill_inputs()
    out = PREFILL(q.to("meta"), kv.to("meta"), idx.to("meta"), 0.1)
    assert out[0].device.type == "meta" and out[0].shape == (3, 4, 512)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e)
    return None


def _prefill_bad():
    q, kv, idx, _ = prefill_inputs(h_q=4, d_qk=512, topk=8, s_kv=20)
    z = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt)  # noqa: E731
    return [
        (z(3, 129, 512), kv, idx, 0.1),
        (z(3, 0, 512), kv, idx, 0.1),
        (z(3, 4, 256), z(20, 1, 256), idx, 0.1),
        (q, kv, idx, 0.1, 256),
        (q, kv, idx, 0.1, -1),
        (q, z(20, 2, 512), idx, 0.1),
        (q, z(20, 1, 576), idx, 0.1),
        (q, z(20, 1, 1, 512), idx, 0.1),
        (q[0], kv, idx, 0.1),
        (q, kv, idx[:1], 0.1),
        (q, kv, idx.expand(3, 2, 8), 0.1),
        (q, kv, torch.zeros(3, 1, 0, dtype=torch.int32), 0.1),
        (q, kv, idx.long(), 0.1),
        (q, kv.float(), idx, 0.1),
        (q.half(), kv.half(), idx, 0.1),
        (q, kv, idx, 0.1, 512, torch.zeros(3)),
        (q, kv, idx, 0.1, 512, torch.zeros(4, dtype=torch.float64)),
        (q, kv, idx, 0.1, 512, None, torch.zeros(2, dtype=torch.int32)),
        (q, kv, idx, 0.1, 512, None, torch.zeros(3, dtype=torch.int16)),
        (q, kv, idx, float("nan")),
        (q, kv, idx, float("inf")),
        (q, kv, idx, 1e39),  # finite, but not as float32
    ]


def _decode_bad():
    q, cache, idx, _ = decode_inputs(b=2, s_q=1, h_q=4, topk=8, page_size=4)
    fcache = torch.zeros(6, 4, 1, 576)
    return [
        (q, cache[..., :600].contiguous(), idx),
        (torch.zeros(2, 1, 4, 512, dtype=torch.bfloat16), cache, idx),
        (q, cache, idx, None, 512, False),
        (torch.zeros(2, 1, 4, 576, dtype=torch.float32), fcache, idx, None, 512, True),
        (q[0], cache, idx),
        (q, cache, idx[:1]),
        (q, cache, idx, None, 512, None, torch.zeros(3, dtype=torch.int32)),
        (q, cache, idx, None, 512, None, torch.zeros(2, 2, dtype=torch.int32)),
        (q, cache, idx, None, 512, None, torch.zeros(2, dtype=torch.float32)),
        (q, torch.zeros(2, 4, 2, 656, dtype=torch.uint8), idx),
        (q, torch.zeros(2, 4, 656, 1, 1, dtype=torch.uint8), idx),
        (q, torch.zeros(2, 4, 1, 576, dtype=torch.float16), idx),
        (q, torch.zeros(2, 4, 1, 512, dtype=torch.bfloat16), idx),
        (q.half(), cache, idx),
        (q, cache, idx.long()),
        (q, cache, idx, 0.1, 384),
        (q, cache, idx, float("nan")),
        (q, cache, idx, None, 512, None, None, torch.zeros(5)),
        (torch.zeros(2, 1, 200, 576, dtype=torch.bfloat16), cache, idx),
        (q, cache, torch.zeros(2, 1, 0, dtype=torch.int32)),
        (q, torch.zeros(2, 0, 1, 656, dtype=torch.uint8), idx),  # page_size 0
        (q, fcache.expand(6, 4, 1, 576)[:, :1].expand(6, 4, 1, 576), idx),  # token stride 0
        (q, torch.zeros(1, 4, 1, 576).expand(6, 4, 1, 576), idx),  # page stride 0
    ]


@pytest.mark.parametrize("i", range(len(_prefill_bad())))
def test_fake_prefill_errors_match_eager(i):
    args = _prefill_bad()[i]
    want = _error(lambda: PREFILL(*args))
    assert want is not None, "the eager call must fail"
    assert _error(lambda: _fake_run(PREFILL, args)) == want


@pytest.mark.parametrize("i", range(len(_decode_bad())))
def test_fake_decode_errors_match_eager(i):
    args = _decode_bad()[i]
    want = _error(lambda: DECODE(*args))
    assert want is not None, "the eager call must fail"
    assert _error(lambda: _fake_run(DECODE, args)) == want


def test_value_errors_come_when_the_operator_runs():
    # Data checks (topk_length values) are not the fake's: compile succeeds
    # and the run raises the eager error.
    q, kv, idx, _ = prefill_inputs(topk=8)
    lens = torch.tensor([1, 9, 0], dtype=torch.int32)
    fake = _fake_run(PREFILL, (q, kv, idx, 0.1, 512, None, lens))
    assert fake[0].shape == (3, 4, 512)
    with pytest.raises(ValueError, match="9 at row 1"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, topk_length=lens)
    with pytest.raises(ValueError, match="9 at row 1"):
        compiled(lambda a, n: flashsel.sparse_mla_prefill(a, kv, idx, 0.1, topk_length=n))(q, lens)


def test_fake_accepts_cuda_metadata_real_raises():
    # The fake implementations take CUDA tensors on one device (code for the
    # coming CUDA kernel traces); mixed CPU / CUDA is the eager error.
    q, kv, idx, kw = prefill_inputs(sink=True, lengths=torch.int32)
    dq, cache, didx, dkw = decode_inputs(sink=True, lengths="b")

    def on_cuda(*ts):
        return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in ts]

    with FakeTensorMode():
        args = on_cuda(q, kv, idx, kw["attn_sink"], kw["topk_length"])
        out = PREFILL(*args[:3], 0.1, 512, *args[3:])
        assert [(o.device.type, o.shape, o.dtype) for o in out] == [
            ("cuda", (3, 4, 512), torch.bfloat16), ("cuda", (3, 4), torch.float32), ("cuda", (3, 4), torch.float32)
        ]
        d = on_cuda(dq, cache, didx, dkw["topk_length"], dkw["attn_sink"])
        out, lse = DECODE(*d[:3], None, 512, True, *d[3:])
        assert out.device.type == "cuda" and out.shape == (2, 3, 8, 512) and lse.shape == (2, 8, 3)
        cpu_kv = torch.empty(kv.shape, dtype=kv.dtype)
        with pytest.raises(ValueError, match="every tensor on one device"):
            PREFILL(args[0], cpu_kv, args[2], 0.1)


# ---------------------------------------------------------------------------
# torch.compile(fullgraph=True) on the CPU: the same bytes as eager
# ---------------------------------------------------------------------------


PREFILL_CONFIGS = [
    # h_q, d_qk, topk, dtype, sink, lengths
    (2, 512, 64, torch.bfloat16, False, None),
    (2, 576, 128, torch.float32, True, torch.int32),
    (5, 576, 64, torch.bfloat16, True, None),
    (8, 512, 96, torch.bfloat16, False, torch.int64),
    (8, 576, 128, torch.bfloat16, True, torch.int32),
    (3, 512, 100, torch.float32, True, torch.int64),
]


@pytest.mark.parametrize("h_q,d_qk,topk,dtype,sink,lens", PREFILL_CONFIGS)
def test_compile_prefill_matches_eager(h_q, d_qk, topk, dtype, sink, lens):
    q, kv, idx, kw = prefill_inputs(3, 300, h_q, d_qk, topk, dtype, seed=h_q + topk, sink=sink, lengths=lens)

    def f(q, kv, idx, kw):
        return flashsel.sparse_mla_prefill(q, kv, idx, d_qk**-0.5, **kw)

    want = f(q, kv, idx, kw)
    assert (want[2][-1] == float("inf")).all()  # the row with no valid index
    assert_same_bytes(compiled(f)(q, kv, idx, kw), want, "compiled")


def test_compile_prefill_inside_a_larger_graph():
    # Inputs made in the graph (a view, a cast), outputs used after.
    q, kv, idx, kw = prefill_inputs(h_q=4, d_qk=512, topk=64, dtype=torch.float32, sink=True, lengths=torch.int32)
    big = torch.randn(300, 1, 600)

    def f(q, big, idx, sink, lens):
        out, mx, lse = flashsel.sparse_mla_prefill(
            (q * 0.5).to(torch.bfloat16), big[:, :, :512].to(torch.bfloat16), idx, 0.04, attn_sink=sink,
            topk_length=lens,
        )
        return out.float().sum(-1), torch.where(torch.isinf(lse), 0.0, lse - mx)

    want = f(q, big, idx, kw["attn_sink"], kw["topk_length"])
    got = compiled(f)(q, big, idx, kw["attn_sink"], kw["topk_length"])
    assert_same_bytes(got, want, "larger graph")


def test_compile_sm_scale_and_shapes_as_arguments():
    # A float scale passed in, new shapes (recompiles), dynamic shapes.
    def f(q, kv, idx, scale, lens):
        return flashsel.sparse_mla_prefill(q, kv, idx, scale, topk_length=lens)

    for dyn in (None, True):
        cf = compiled(f, dynamic=dyn)
        for s_q, h_q, topk, scale in [(3, 2, 64, 0.05), (3, 8, 128, 0.1), (5, 4, 72, 0.07)]:
            q, kv, idx, kw = prefill_inputs(s_q, 150, h_q, 576, topk, seed=topk, lengths=torch.int32)
            args = (q, kv, idx, scale, kw["topk_length"])
            assert_same_bytes(cf(*args), f(*args), f"dynamic={dyn} {s_q} {h_q} {topk}")


DECODE_CONFIGS = [
    # fmt, d_qk, h_q, topk, page_size, sink, lengths, scale, strided
    ("fp8", 576, 8, 64, 16, True, "b", None, True),
    ("fp8", 576, 2, 128, 64, False, None, 0.05, True),
    ("fp8", 576, 5, 64, 7, False, "b,s_q", None, False),
    ("bf16", 576, 4, 96, 8, True, "b,s_q", 0.04, True),
    ("f32", 512, 3, 64, 16, True, None, None, True),
]


@pytest.mark.parametrize("fmt,d_qk,h_q,topk,page_size,sink,lens,scale,strided", DECODE_CONFIGS)
def test_compile_decode_matches_eager(fmt, d_qk, h_q, topk, page_size, sink, lens, scale, strided):
    q, cache, idx, kw = decode_inputs(2, 3, h_q, topk, page_size, fmt, d_qk, topk + h_q, strided, sink, lens)
    if fmt == "fp8" and page_size == 64:
        cache = cache.view(torch.float8_e4m3fn)
    assert cache.is_contiguous() != strided

    def f(q, cache, idx, kw):
        return flashsel.sparse_mla_decode(q, cache, idx, scale, is_fp8_kvcache=fmt == "fp8", **kw)

    want = f(q, cache, idx, kw)
    assert (want[1][0, :, -1] == float("inf")).all()  # the row with no valid slot
    assert_same_bytes(compiled(f)(q, cache, idx, kw), want, "compiled")


def test_compiled_graph_holds_the_operators():
    q, kv, idx, _ = prefill_inputs()
    dq, cache, didx, _ = decode_inputs()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def f(q, kv, idx, dq, cache, didx):
        return flashsel.sparse_mla_prefill(q, kv, idx, 0.1), flashsel.sparse_mla_decode(dq, cache, didx)

    got = torch.compile(f, fullgraph=True, backend=backend)(q, kv, idx, dq, cache, didx)
    assert "flashsel.sparse_mla_prefill.default" in seen and "flashsel.sparse_mla_decode.default" in seen
    want = f(q, kv, idx, dq, cache, didx)
    assert_same_bytes(got[0] + got[1], want[0] + want[1])


def test_compile_errors_carry_the_eager_message():
    q, kv, idx, _ = prefill_inputs(h_q=4, d_qk=512, topk=8)
    with pytest.raises(Exception, match="indices must be torch.int32"):
        compiled(lambda a, i: flashsel.sparse_mla_prefill(a, kv, i, 0.1))(q, idx.long())
    with pytest.raises(Exception, match="invalid d_v"):
        compiled(lambda a: flashsel.sparse_mla_prefill(a, kv, idx, 0.1, d_v=256))(q)
    dq, cache, didx, _ = decode_inputs()
    with pytest.raises(Exception, match="is_fp8_kvcache=False"):
        compiled(lambda a: flashsel.sparse_mla_decode(a, cache, didx, is_fp8_kvcache=False))(dq)
