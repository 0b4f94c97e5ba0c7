"""The `flashsel` CLI and the Python package agree byte for byte: `flashsel
qsa` against `flashsel.qsa_select` and `flashsel select --starts` against
`flashsel.topk(..., starts=...)`, on the same NumPy data written to .npy
files (page tables, both orders, both NaN policies, f32 / f16 / bfloat16 bits,
big-endian inputs, rows that see at most k_blocks blocks, empty ranges).

The CLI binary is $FLASHSEL_CLI, else the newer of target/release/flashsel and
target/debug/flashsel under the repository root (.ci/run's `cargo test
--workspace` builds target/debug/flashsel before python/ci.sh runs); without
one, every test here is skipped with that reason."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import flashsel

REPO = Path(__file__).resolve().parents[2]


def _find_cli() -> tuple[Path | None, str]:
    """(the binary, '') or (None, why not)."""
    env = os.environ.get("FLASHSEL_CLI")
    if env:
        return Path(env), ""
    built = [p for p in (REPO / "target/release/flashsel", REPO / "target/debug/flashsel") if p.is_file()]
    if not built:
        return None, (
            "no flashsel CLI binary: set FLASHSEL_CLI, or build one (cargo build -p flashsel-cli, "
            f"or cargo test --workspace) so that {REPO}/target/{{release,debug}}/flashsel exists"
        )
    # The newer of the two: a release binary left from an old `cargo run --release`
    # must not shadow the debug one `cargo test` just built.
    return max(built, key=lambda p: p.stat().st_mtime), ""


CLI, WHY_NOT = _find_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason=WHY_NOT)


@pytest.fixture(scope="module")
def cli() -> Path:
    assert CLI is not None
    if not (CLI.is_file() and os.access(CLI, os.X_OK)):
        pytest.fail(f"FLASHSEL_CLI={CLI} is not an executable file")
    for cmd in (["qsa", "--help"], ["select", "--help"]):
        r = subprocess.run([str(CLI), *cmd], capture_output=True, text=True)
        if r.returncode != 0 or (cmd[0] == "select" and "--starts" not in r.stdout):
            pytest.fail(
                f"{CLI} predates this source (`flashsel {' '.join(cmd)}` failed or lacks --starts): "
                f"rebuild it (cargo build -p flashsel-cli) or point FLASHSEL_CLI at a current one\n{r.stderr}"
            )
    return CLI


def run(cli: Path, *args: object) -> None:
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"flashsel {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}"
    assert r.stderr == "", r.stderr


def assert_same_bytes(path: Path, want: np.ndarray, what: str) -> None:
    """The .npy at `path` holds `want`: dtype (little-endian), shape and bytes."""
    got = np.load(path)
    assert got.dtype == want.dtype.newbyteorder("<") and got.dtype.byteorder in "<=|", (what, got.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.tobytes() == np.ascontiguousarray(want, want.dtype.newbyteorder("<")).tobytes(), what


def as_dtype(s32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 scores as f32, f16, or bfloat16 bit patterns (uint16 / int16)."""
    if dtype == "f32":
        return s32
    if dtype == "f16":
        return s32.astype(np.float16)
    bits = (s32.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact bf16 values
    return bits if dtype == "bf16-u2" else bits.view(np.int16)


def block_scores(rows: int, nb: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((rows, nb)).astype(np.float32)
    s[:, ::7] = np.nan  # NaN on every seventh block
    s[1] = np.maximum(s[1], 0)  # a ReLU plateau of exact zeros
    s[2] = -0.0  # all equal (and negative zero)
    s[3, ::3] = np.inf
    return s


def positions_for(ratio: int, k_blocks: int, nb: int) -> np.ndarray:
    """Positions at every V boundary against k_blocks and nb, tails of 0 to ratio-1."""
    r, k = ratio, k_blocks
    p = [0, r - 1, r, k * r - 1, k * r, k * r + r - 1, k * r + r, k * r + r + 1, nb * r - 1, nb * r + r - 2]
    p += [nb * r // 2 + 1, (k + 5) * r + (r - 1) // 2]
    return np.array([t for t in p if 0 <= t and (t + 1) // r <= nb], np.int64)


# ---------------------------------------------------------------------------
# flashsel qsa == flashsel.qsa_select
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16-u2", "bf16-i2"])
@pytest.mark.parametrize("order", ["index", "score"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
def test_qsa_agrees(cli, tmp_path, dtype, order, nan):
    ratio, k_blocks, nb = 4, 24, 200
    pos = positions_for(ratio, k_blocks, nb)
    s = as_dtype(block_scores(len(pos), nb, 1), dtype)
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "p.npy", pos.astype(np.int32) if order == "index" else pos)
    ids_p, counts_p = tmp_path / "ids.npy", tmp_path / "counts.npy"
    run(cli, "qsa", "--backend", "cpu", "--scores", tmp_path / "s.npy", "--positions", tmp_path / "p.npy",
        "--ratio", ratio, "--k-blocks", k_blocks, "--order", order, "--nan", nan,
        "--ids", ids_p, "--counts", counts_p)
    ids, counts = flashsel.qsa_select(s, pos, ratio=ratio, k_blocks=k_blocks, order=order, nan=nan)
    assert ids.shape == (len(pos), k_blocks * ratio + ratio - 1)
    assert_same_bytes(ids_p, ids, "ids")
    assert_same_bytes(counts_p, counts, "counts")


@pytest.mark.parametrize("ratio,k_blocks", [(3, 5), (1, 8)])
def test_qsa_agrees_on_other_ratios_big_endian(cli, tmp_path, ratio, k_blocks):
    nb = 40
    pos = positions_for(ratio, k_blocks, nb)
    s = block_scores(len(pos), nb, 2)
    np.save(tmp_path / "s.npy", s.astype(">f4"))
    np.save(tmp_path / "p.npy", pos.astype(">i8"))
    run(cli, "qsa", "--scores", tmp_path / "s.npy", "--positions", tmp_path / "p.npy", "--ratio", ratio,
        "--k-blocks", k_blocks, "--order", "score", "--ids", tmp_path / "i.npy", "--counts", tmp_path / "c.npy")
    ids, counts = flashsel.qsa_select(s.astype(">f4"), pos, ratio=ratio, k_blocks=k_blocks, order="score")
    assert_same_bytes(tmp_path / "i.npy", ids, "ids")
    assert_same_bytes(tmp_path / "c.npy", counts, "counts")


def test_qsa_defaults_and_rows_that_see_few_blocks(cli, tmp_path):
    nb = 600  # ratio 4, k_blocks 512: rows below, at and above 512 visible blocks
    pos = positions_for(4, 512, nb)
    s = block_scores(len(pos), nb, 3)
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "p.npy", pos)
    run(cli, "qsa", "--scores", tmp_path / "s.npy", "--positions", tmp_path / "p.npy",
        "--ids", tmp_path / "i.npy", "--counts", tmp_path / "c.npy")
    ids, counts = flashsel.qsa_select(s, pos)
    assert ids.shape[1] == 2051
    assert_same_bytes(tmp_path / "i.npy", ids, "ids")
    assert_same_bytes(tmp_path / "c.npy", counts, "counts")


@pytest.mark.parametrize("page_size,order", [(16, "index"), (64, "score"), (1, "index")])
def test_qsa_agrees_through_a_page_table(cli, tmp_path, page_size, order):
    ratio, k_blocks, nb = 4, 20, 150
    pos = positions_for(ratio, k_blocks, nb)
    s = block_scores(len(pos), nb, 4)
    used = int(pos.max()) // page_size + 1
    max_pages = used + 2
    table = ((np.arange(3 * max_pages, dtype=np.int64) * 37 + 11) % 4099).astype(np.int32).reshape(3, max_pages)
    table[:, used:] = -1  # pages no row needs may be anything
    seqs = (np.arange(len(pos)) % 3).astype(np.int32)
    for name, a in [("s", s), ("p", pos), ("pt", table), ("q", seqs)]:
        np.save(tmp_path / f"{name}.npy", a)
    run(cli, "qsa", "--scores", tmp_path / "s.npy", "--positions", tmp_path / "p.npy", "--k-blocks", k_blocks,
        "--order", order, "--page-table", tmp_path / "pt.npy", "--seq-ids", tmp_path / "q.npy",
        "--page-size", page_size, "--ids", tmp_path / "i.npy", "--counts", tmp_path / "c.npy")
    ids, counts = flashsel.qsa_select(
        s, pos, k_blocks=k_blocks, order=order, page_table=table, page_size=page_size, seq_ids=seqs
    )
    assert_same_bytes(tmp_path / "i.npy", ids, "slots")
    assert_same_bytes(tmp_path / "c.npy", counts, "counts")


# ---------------------------------------------------------------------------
# flashsel select --starts == flashsel.topk(..., starts=...)
# ---------------------------------------------------------------------------

STARTS = np.array([0, 0, 5, 10, 59, 60, 30, 17, 0], np.int32)
ENDS = np.array([60, 0, 5, 40, 60, 60, 31, 20, 60], np.int32)  # empty ranges in rows 1, 2 and 5


def range_scores(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = (rng.integers(-6, 7, (len(STARTS), 60)) * 0.5).astype(np.float32)  # many ties
    s[:, ::9] = np.nan
    s[4, 59] = -np.inf
    s[6] = -0.0
    return as_dtype(s, dtype)


def select_starts(cli, tmp_path, s, k, order, nan, starts, ends):
    """The CLI's (indices, values) for `select --starts`."""
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "st.npy", starts)
    args = ["select", "--input", tmp_path / "s.npy", "--k", k, "--order", order, "--nan", nan,
            "--starts", tmp_path / "st.npy", "--output", tmp_path / "i.npy", "--values", tmp_path / "v.npy"]
    if ends is not None:
        np.save(tmp_path / "en.npy", ends)
        args += ["--lengths", tmp_path / "en.npy"]
    run(cli, *args)
    return tmp_path / "i.npy", tmp_path / "v.npy"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16-u2", "bf16-i2"])
@pytest.mark.parametrize("order", ["score", "index"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
@pytest.mark.parametrize("k", [1, 4, 70])
def test_select_starts_agrees(cli, tmp_path, dtype, order, nan, k):
    s = range_scores(dtype, 5)
    i_p, v_p = select_starts(cli, tmp_path, s, k, order, nan, STARTS, ENDS)
    idx, val = flashsel.topk(s, k, starts=STARTS, lengths=ENDS, order=order, nan=nan, return_values=True)
    assert_same_bytes(i_p, idx, "indices")
    assert_same_bytes(v_p, val, "values")


@pytest.mark.parametrize(
    "starts,ends",
    [
        (STARTS, None),  # ends default to cols
        (np.array(12, np.int64), ENDS.clip(12).astype(np.int64)),  # a scalar start, int64
        (np.array(3, np.int32), np.array(3, np.int32)),  # every range empty
        (STARTS.astype(">i4"), ENDS.astype(">i8")),  # big-endian, mixed widths
    ],
)
def test_select_starts_agrees_on_scalars_defaults_and_byte_orders(cli, tmp_path, starts, ends):
    s = range_scores("f32", 6)
    i_p, v_p = select_starts(cli, tmp_path, s, 6, "score", "lowest", starts, ends)
    idx, val = flashsel.topk(s, 6, starts=starts, lengths=ends, return_values=True)
    assert_same_bytes(i_p, idx, "indices")
    assert_same_bytes(v_p, val, "values")


def test_select_starts_agrees_on_a_one_d_row(cli, tmp_path):
    s = range_scores("f32", 7)[0]
    i_p, v_p = select_starts(cli, tmp_path, s, 5, "index", "largest", np.array([20], np.int32), np.array(50))
    idx, val = flashsel.topk(s, 5, starts=np.array([20], np.int32), lengths=50, order="index", nan="largest",
                             return_values=True)
    assert idx.shape == (5,)
    assert_same_bytes(i_p, idx, "indices")
    assert_same_bytes(v_p, val, "values")
