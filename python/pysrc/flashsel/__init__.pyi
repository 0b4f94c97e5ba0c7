"""Type stubs for flashsel (see the module docstring and help(flashsel.topk))."""

from typing import Any, Literal, TypeVar, overload

__version__: str
__all__ = ["topk", "backends", "__version__"]

# The output is the same kind as the input: numpy.ndarray in, numpy.ndarray
# out; torch.Tensor in, torch.Tensor (same device) out.
_A = TypeVar("_A")

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
) -> _A | tuple[_A, _A]: ...
def backends() -> dict[str, dict[str, Any]]: ...
