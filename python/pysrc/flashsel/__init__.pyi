"""Type stubs for flashsel (see the module docstring and help(flashsel.topk))."""

from typing import Any, Literal, TypeVar, overload

__version__: str
__all__ = ["__version__", "backends", "qsa_scores", "qsa_select", "topk"]

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
) -> _A | tuple[_A, _A]: ...
def backends() -> dict[str, dict[str, Any]]: ...

# QSA block selection (CPU engine; NumPy arrays or CPU tensors): (ids int32
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

# QSA indexer scores (CPU engine; NumPy arrays or CPU tensors): float32
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
