"""flashsel: exact, deterministic top-k selection for long-context sparse attention.

:func:`topk` selects the top k of each row; :func:`qsa_select` turns QSA
block scores into the token ids (or KV slots) a query attends to;
:func:`qsa_scores` computes those block scores from the indexer's queries
and block keys, :func:`qsa_indexer` both at once without the score matrix; :func:`sparse_mla_prefill` and
:func:`sparse_mla_decode` are the sparse attention that reads the selected
indices, with FlashMLA's semantics (the float64 reference on the CPU, the
CUDA kernels on CUDA tensors); :func:`qsa_attention` is QSA's grouped-query
sparse attention over the ids ``qsa_select`` writes (likewise);
:func:`dsa_scores` and :func:`dsa_indexer` are the DSA (DeepSeek-V3.2)
lightning indexer's logits over per-query key ranges and their exact top-k
(the same bits on the CPU and CUDA engines), over contiguous keys or
DeepSeek-V3.2's paged fp8 index-key cache (``page_table=``);
:func:`backends` says what can run here; ``__version__`` is the
package version. Those are the public names (``__all__``, ``dir(flashsel)``); everything else is private. NumPy arrays and CPU torch tensors go to the CPU engine (the GIL is
released while it runs); CUDA torch tensors go to the CUDA engine on the
tensor's device and current stream, asynchronously.

The selection contract (topk, qsa_select: the same bytes on every backend)
--------------------------------------------------------------------------
* Order: a larger score ranks higher. ``-0.0`` equals ``+0.0``.
* NaN: ``nan="lowest"`` (default) ranks every NaN below ``-inf``;
  ``nan="largest"`` ranks it above ``+inf``, as ``torch.topk`` does.
* Ties: among equal scores the lower column index ranks higher, so the result
  is fully determined by the input (no "any k of the tied ones").
* Padding: row ``i`` holds ``min(k, len_i)`` indices, then ``-1`` up to ``k``
  (``len_i = lengths[i]``, default ``cols``); padded values are ``-inf``.
* Output order: ``order="score"`` lists the selection best first;
  ``order="index"`` lists the same set by ascending column index.
"""

import sys as _sys

from ._api import backends, qsa_select, topk
from ._dsa import dsa_indexer, dsa_scores
from ._indexer import qsa_indexer, qsa_scores
from ._mla import sparse_mla_decode, sparse_mla_prefill
from ._native import __version__
from ._qsa_attention import qsa_attention

if _sys.modules.get("torch") is not None:
    # torch came first: register its operators (torch.ops.flashsel.topk,
    # .qsa_select, .qsa_scores, .qsa_indexer, .sparse_mla_prefill,
    # .sparse_mla_decode, .qsa_attention, .dsa_scores, .dsa_indexer) now;
    # otherwise the first call on a tensor does.
    from . import _torch_ops  # noqa: F401

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

# help() names the public module, not the private one.
topk.__module__ = backends.__module__ = qsa_select.__module__ = qsa_scores.__module__ = __name__
sparse_mla_prefill.__module__ = sparse_mla_decode.__module__ = qsa_indexer.__module__ = __name__
qsa_attention.__module__ = dsa_scores.__module__ = dsa_indexer.__module__ = __name__


def __dir__() -> list[str]:
    """The public names only (the implementation lives in private modules)."""
    return sorted(__all__)
