"""Type stubs for flashsel (see the module docstring and help(flashsel.topk))."""

from typing import Any, Literal, TypeVar, overload

__version__: str
__all__ = [
    "__version__",
    "backends",
    "dsa_indexer",
    "dsa_scores",
    "qsa_attention",
    "qsa_indexer",
    "qsa_scores",
    "qsa_select",
    "sparse_mla_decode",
    "sparse_mla_prefill",
    "topk",
]

def __dir__() -> list[str]: ...

# The output is the same kind as the input: numpy.ndarray in, numpy.ndarray
# out; torch.Tensor in, torch.Tensor (same device) out. Accepted scores:
# NumPy float32, float16, ml_dtypes.bfloat16, or uint16 / int16 bf16 bit
# patterns (values come back in the same integer dtype), either byte order;
# torch float32, float16, bfloat16 (CPU or CUDA). Shape [cols] gives [k]
# outputs, [rows, cols] gives [rows, k].
_A = TypeVar("_A")

# lengths: None, a scalar for every row (int, 0-d array or tensor), or one
# entry per row (a sequence of ints, an int32/int64 array or tensor).

Order = Literal["score", "index"]
Nan = Literal["lowest", "largest"]

@overload
def topk(
    scores: _A,
    k: int,
    *,
    lengths: Any = None,
    order: Order = "score",
    nan: Nan = "lowest",
    return_values: Literal[False] = False,
    starts: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> _A: ...
@overload
def topk(
    scores: _A,
    k: int,
    *,
    lengths: Any = None,
    order: Order = "score",
    nan: Nan = "lowest",
    return_values: Literal[True],
    starts: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> tuple[_A, _A]: ...
@overload
def topk(
    scores: _A,
    k: int,
    *,
    lengths: Any = None,
    order: Order = "score",
    nan: Nan = "lowest",
    return_values: bool,
    starts: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> _A | tuple[_A, _A]: ...
def backends() -> dict[str, dict[str, Any]]: ...

# QSA block selection (CPU engine: NumPy arrays, CPU tensors; CUDA engine: CUDA
# tensors, on the current stream, graph-capturable): (ids int32
# [T, k_blocks * ratio + ratio - 1], counts int32 [T]).
def qsa_select(
    scores: _A,
    positions: Any,
    *,
    ratio: int = 4,
    k_blocks: int = 512,
    order: Order = "index",
    nan: Nan = "lowest",
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> tuple[_A, _A]: ...

# QSA indexer scores (CPU engine: NumPy arrays, CPU tensors; CUDA engine: CUDA
# tensors, on the current stream, graph-capturable): float32
# [T, NB], sum over heads of relu(q[t, h] . kbar[b]) / sqrt(d) for the blocks
# b < (positions[t] + 1) // ratio, -inf beyond. q [T, H, d] float32 / bf16;
# kbar [NB, d] (or [pages, page_size // ratio, d] with page_table and
# seq_ids) float32 / bf16 / fp8 e4m3. A tensor q gives a tensor.
def qsa_scores(
    q: _A,
    kbar: Any,
    positions: Any,
    *,
    ratio: int = 4,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> _A: ...

# The fused QSA indexer (CPU engine: NumPy arrays, CPU tensors; CUDA engine:
# CUDA tensors, on the current stream, graph-capturable): exactly
# qsa_select(qsa_scores(q, kbar, positions, ...), positions, ...) without the
# [T, NB] scores -> (ids int32 [T, k_blocks * ratio + ratio - 1], counts int32
# [T]); with page_table the keys are paged and the ids are slots.
def qsa_indexer(
    q: _A,
    kbar: Any,
    positions: Any,
    *,
    ratio: int = 4,
    k_blocks: int = 512,
    order: Literal["score", "index"] = "index",
    nan: Literal["lowest", "largest"] = "lowest",
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> tuple[_A, _A]: ...

# Sparse MLA attention with FlashMLA's semantics (the float64 reference on
# the CPU for NumPy arrays and CPU tensors, float32 / bfloat16; the CUDA
# kernels for CUDA tensors, all on one device, on the current stream).
# Prefill: q [s_q, h_q, d_qk], kv [s_kv, 1, d_qk],
# indices int32 [s_q, 1, topk] -> (out [s_q, h_q, d_v] in q's dtype,
# max_logits float32 [s_q, h_q], lse float32 [s_q, h_q]).
def sparse_mla_prefill(
    q: _A,
    kv: Any,
    indices: Any,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Any = None,
    topk_length: Any = None,
) -> tuple[_A, _A, _A]: ...

# Decode: q [b, s_q, h_q, d_qk], k_cache [pages, page_size, 1, 656] (fp8,
# uint8 / float8_e4m3fn) or [pages, page_size, 1, d_qk] (float32 / bfloat16),
# indices int32 [b, s_q, topk] slots -> (out [b, s_q, h_q, d_v], lse float32
# [b, h_q, s_q]).
def sparse_mla_decode(
    q: _A,
    k_cache: Any,
    indices: Any,
    sm_scale: float | None = None,
    d_v: int = 512,
    *,
    is_fp8_kvcache: bool | None = None,
    topk_length: Any = None,
    attn_sink: Any = None,
) -> tuple[_A, _A]: ...

# QSA sparse attention (grouped-query attention over the ids qsa_select
# writes; the float64 reference on the CPU for NumPy arrays and CPU tensors,
# the CUDA kernel for CUDA tensors, all on one device, on the current
# stream): q [rows, h_q, d] (d 64 / 128 / 256), k and v [tokens, h_kv, d] or
# a paged cache [num_pages, page_size, h_kv, d] (float32 / bfloat16),
# indices int32 [rows, width] -> (out [rows, h_q, d] in q's dtype, lse
# float32 [rows, h_q]; an empty row gives out 0, lse -inf).
def qsa_attention(
    q: _A,
    k: Any,
    v: Any,
    indices: Any,
    *,
    scale: float | None = None,
    lengths: Any = None,
) -> tuple[_A, _A]: ...

# The DSA (DeepSeek-V3.2) lightning indexer (CPU engine: NumPy arrays, CPU
# tensors; CUDA engine: CUDA tensors, on the current stream, graph-capturable;
# the same bits on both): float32 [T, N], k_scale[s] * sum over h of
# weights[t, h] * relu(q[t, h] . k[s]) for starts[t] <= s < ends[t], -inf
# elsewhere. q [T, H, d] and k [N, d] (or [N, 1, d]) float32 / bf16 / fp8
# e4m3 (H 1..128, d 64 / 128 / 256); weights float32 [T, H]; starts, ends
# int32 / int64 [T]; k_scale float32 [N]. A tensor q gives a tensor. With
# page_table (int32 [B, max_pages]) and seq_ids (int32 [T]), a k that is not
# [N, d] / [N, 1, d] is DeepSeek-V3.2's paged fp8 index-key cache (bytes
# [pages, page_size, 1, d + 4], [pages, page_size, d + 4], [pages, page_size
# * (d + 4)] or flat; the scales are the cache's, k_scale None), N =
# max_pages * page_size.
def dsa_scores(
    q: _A,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    k_scale: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> _A: ...

# The top topk of each row's range of dsa_scores (the bytes of topk(scores,
# topk, starts=starts, lengths=ends, ...)): ids int32 [T, topk] (-1 padded;
# KV slots with page_table and seq_ids: through the paged cache's own table
# for a paged k, unless slots=False, which gives token positions), with
# return_values also the float32 scores.
@overload
def dsa_indexer(
    q: _A,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    topk: int = 2048,
    k_scale: Any = None,
    order: Order = "index",
    nan: Nan = "lowest",
    return_values: Literal[False] = False,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    slots: bool | None = None,
) -> _A: ...
@overload
def dsa_indexer(
    q: _A,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    topk: int = 2048,
    k_scale: Any = None,
    order: Order = "index",
    nan: Nan = "lowest",
    return_values: Literal[True],
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    slots: bool | None = None,
) -> tuple[_A, _A]: ...
@overload
def dsa_indexer(
    q: _A,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    topk: int = 2048,
    k_scale: Any = None,
    order: Order = "index",
    nan: Nan = "lowest",
    return_values: bool,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    slots: bool | None = None,
) -> _A | tuple[_A, _A]: ...
