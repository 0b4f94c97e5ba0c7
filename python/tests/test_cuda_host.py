"""The CUDA path's host-side helpers, without a GPU: the per-geometry
workspace cache and the stream-handle lookup (with fakes in place of the
native call and of torch)."""

from __future__ import annotations

import types

import flashsel
from flashsel import _api


def test_workspace_bytes_are_asked_once_per_geometry(monkeypatch):
    calls = []

    def fake(ordinal, name, rows, cols, row_stride, k, order, nan, has_lengths):
        calls.append((ordinal, name, rows, cols, row_stride, k, order, nan, has_lengths))
        return 1000 + rows

    monkeypatch.setattr(flashsel._native, "cuda_workspace_bytes", fake)
    monkeypatch.setattr(_api, "_ws_cache", {})
    a = (0, "f32", 1, 262144, 262144, 512, "score", "lowest", False)
    b = (0, "f32", 2, 262144, 262144, 512, "score", "lowest", False)
    assert _api._workspace_bytes(a) == 1001
    assert _api._workspace_bytes(a) == 1001
    assert _api._workspace_bytes(b) == 1002
    # Another device, or lengths, is another geometry.
    assert _api._workspace_bytes((1,) + a[1:]) == 1001
    assert _api._workspace_bytes(a[:-1] + (True,)) == 1001
    assert calls == [a, b, (1,) + a[1:], a[:-1] + (True,)]


def test_workspace_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(flashsel._native, "cuda_workspace_bytes", lambda *key: key[2])
    monkeypatch.setattr(_api, "_ws_cache", {})
    monkeypatch.setattr(_api, "_WS_CACHE_MAX", 3)
    for rows in range(10):
        assert _api._workspace_bytes((0, "f32", rows, 8, 8, 1, "score", "lowest", False)) == rows
        assert len(_api._ws_cache) <= 3


def test_stream_handle_prefers_the_raw_lookup_and_falls_back():
    raw = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: 4096 + ordinal),
        cuda=types.SimpleNamespace(current_stream=lambda ordinal: (_ for _ in ()).throw(AssertionError("not used"))),
    )
    assert _api._raw_stream(raw, 3) == 4099
    public = types.SimpleNamespace(
        _C=types.SimpleNamespace(),
        cuda=types.SimpleNamespace(current_stream=lambda ordinal: types.SimpleNamespace(cuda_stream=77 + ordinal)),
    )
    assert _api._raw_stream(public, 1) == 78
