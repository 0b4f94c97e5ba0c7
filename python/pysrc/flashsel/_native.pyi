"""The PyO3 extension behind flashsel. Private: use flashsel.topk."""

from typing import Any

__version__: str

def check_spec(dtype: str, rows: int, cols: int, row_stride: int, k: int, order: str, nan: str) -> None: ...
def select_cpu(
    scores: Any,
    dtype: str,
    k: int,
    order: str,
    nan: str,
    lengths: Any | None,
    out_indices: Any,
    out_values: Any | None,
    starts: Any | None = None,
    page_table: Any | None = None,
    page_size: int = 64,
    seq_ids: Any | None = None,
) -> None: ...
def cuda_engine_error(device: int) -> str | None: ...
def cuda_workspace_bytes(
    device: int, dtype: str, rows: int, cols: int, row_stride: int, k: int, order: str, nan: str, has_lengths: bool
) -> int: ...
def cuda_select(
    device: int,
    dtype: str,
    rows: int,
    cols: int,
    row_stride: int,
    k: int,
    order: str,
    nan: str,
    scores: int,
    lengths: int | None,
    out_indices: int,
    out_values: int | None,
    workspace: int,
    workspace_bytes: int,
    stream: int,
    starts: int | None = None,
    pages: tuple[int, int, int, int, int] | None = None,
) -> None: ...
def qsa_select_cpu(
    scores: Any,
    dtype: str,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
) -> tuple[Any, Any]: ...
def cuda_qsa_workspace_bytes(
    device: int, dtype: str, rows: int, blocks: int, row_stride: int, ratio: int, k_blocks: int, order: str, nan: str
) -> int: ...
def cuda_qsa_select(
    device: int,
    dtype: str,
    rows: int,
    blocks: int,
    row_stride: int,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    scores: int,
    positions: int,
    ids: int,
    counts: int,
    pages: tuple[int, int, int, int, int] | None,
    workspace: int,
    workspace_bytes: int,
    stream: int,
) -> None: ...
def qsa_scores_cpu(
    q: Any,
    q_dtype: str,
    kbar: Any,
    k_dtype: str,
    positions: Any,
    ratio: int,
    page_table: Any | None,
    page_size: int,
    seq_ids: Any | None,
) -> Any: ...
def qsa_indexer_cpu(
    q: Any,
    q_dtype: str,
    kbar: Any,
    k_dtype: str,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any | None,
    page_size: int,
    seq_ids: Any | None,
) -> tuple[Any, Any]: ...
def sparse_mla_prefill_cpu(
    q: Any,
    kv: Any,
    indices: Any,
    dtype: str,
    s_q: int,
    s_kv: int,
    h_q: int,
    d_qk: int,
    topk: int,
    sm_scale: float,
    d_v: int,
    attn_sink: Any | None,
    topk_length: Any | None,
    out_bf16: bool,
) -> tuple[Any, Any, Any]: ...
def sparse_mla_decode_cpu(
    q: Any,
    q_dtype: str,
    cache: Any,
    cache_format: str,
    batch: int,
    s_q: int,
    h_q: int,
    d_qk: int,
    topk: int,
    num_pages: int,
    page_size: int,
    page_stride: int,
    token_stride: int,
    indices: Any,
    sm_scale: float,
    d_v: int,
    attn_sink: Any | None,
    topk_length: Any | None,
    out_bf16: bool,
) -> tuple[Any, Any]: ...
