"""The capture guard names what a CUDA graph cannot hold; the recorded step passes it, traced on
meta as CUDA would run it, over the whole warm list of the embedded model."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoserve.core import BucketSet, Shape, paged_decode_attention, warm_shapes
from nanoserve.runtime.decode.capture_guard import (
    DynamicShapeError,
    ForeignDeviceError,
    HostSyncError,
    capture_guard,
)
from nanoserve.runtime.decode.capture_trace import trace_recorded_steps
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.model import kv_pool
from tests.runtime.capture_helpers import recordings_of, tiny_engine, warm

X = torch.tensor([1.0, -2.0, 3.0])


@pytest.mark.parametrize(
    ("planted", "error", "op"),
    [
        (lambda x: torch.where(x > 0, x, torch.zeros(())), ForeignDeviceError, "zeros"),
        (lambda x: x + torch.arange(3), ForeignDeviceError, "arange"),
        (lambda x: x.sum().item(), HostSyncError, "Tensor.item"),
        (lambda x: x.tolist(), HostSyncError, "Tensor.tolist"),
        (lambda x: bool((x > 0).all()), HostSyncError, "Tensor.__bool__"),
        (lambda x: int(x.argmax()), HostSyncError, "Tensor.__int__"),
        (lambda x: torch.ops.aten._local_scalar_dense(x[0]), HostSyncError, "_local_scalar_dense"),
        (lambda x: x.nonzero(), DynamicShapeError, "nonzero"),
        (lambda x: x[x > 0], DynamicShapeError, "index.Tensor"),
        (lambda x: x.masked_select(x > 0), DynamicShapeError, "masked_select"),
        (lambda x: x.clone().__setitem__(x > 0, 0.0), DynamicShapeError, "index_put"),
        (lambda x: torch.unique(x), DynamicShapeError, "unique"),
        (
            lambda x: torch.repeat_interleave(x, torch.ones(3, dtype=torch.int64, device="cpu")),
            DynamicShapeError,
            "repeat_interleave",
        ),
    ],
)
def test_each_planted_violation_is_named(
    planted: Callable[[torch.Tensor], object], error: type[Exception], op: str
) -> None:
    with pytest.raises(error, match=op), capture_guard("cpu"):
        planted(X)


def test_what_a_graph_can_hold_passes() -> None:
    index = torch.tensor([2, 0])
    counts = torch.ones(3, dtype=torch.int64)
    with capture_guard("cpu") as guard:
        X[index]  # an integer index: the shape is the index's
        X.masked_fill(X > 0, 0.0)  # a Python scalar, not a host tensor
        torch.where(X > 0, X, X.new_zeros(()))
        torch.repeat_interleave(X, counts, output_size=3)
        torch.arange(3, device=X.device) * 2.5
    assert guard.num_ops >= 8


def test_a_host_tensor_is_foreign_to_a_trace_on_meta() -> None:
    """On meta (standing in for CUDA) an explicit host tensor is caught too."""
    x = torch.empty(3, device="meta")
    made_on_host = re.escape("zeros.default makes a () torch.float32 tensor on cpu")
    with pytest.raises(ForeignDeviceError, match=made_on_host), capture_guard("meta"):
        torch.where(x > 0, x, torch.zeros((), device="cpu"))
    with pytest.raises(ForeignDeviceError, match="on cpu"), capture_guard("meta"):
        x + torch.ones(3)  # no device=: the host, where a trace's stray factories land


def _old_attention(
    q, k_pool, v_pool, slot_rect, context_lens, scale, accum_dtype, window=None, sinks=None
):
    """The attention as it was: a host zero in its final where (every CUDA capture failed)."""
    out = paged_decode_attention(q, k_pool, v_pool, slot_rect, context_lens, scale, accum_dtype)
    return torch.where((context_lens > 0)[:, None, None], out, torch.zeros((), dtype=out.dtype))


def _reading_attention(
    q, k_pool, v_pool, slot_rect, context_lens, scale, accum_dtype, window=None, sinks=None
):
    """Attention that reads the longest context on the host (to slice the rectangle)."""
    width = int(context_lens.max().item()) or 1
    return paged_decode_attention(
        q, k_pool, v_pool, slot_rect[:, :width], context_lens, scale, accum_dtype
    )


@pytest.mark.parametrize(
    ("planted", "error"),
    [(_old_attention, ForeignDeviceError), (_reading_attention, HostSyncError)],
)
def test_the_warm_up_refuses_a_planted_attention(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, planted: object, error: type
) -> None:
    engine = tiny_engine(
        tiny_llama_dir, decode_mode="recorded", max_model_len=64, width_multiple=16
    )
    monkeypatch.setattr(kv_pool, "paged_decode_attention", planted)
    with pytest.raises(error):
        warm(engine, (Shape(2, 16),))
    assert not recordings_of(engine).by_shape


def test_a_lazy_recording_runs_under_the_guard(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanoserve.runtime.engine.requests.sampling_params import SamplingParams

    engine = tiny_engine(tiny_llama_dir, decode_mode="recorded")
    engine.add_request("a", [5, 17, 3], SamplingParams(max_tokens=4, temperature=0))
    engine.step()  # prefill: eager, not recorded, not guarded
    monkeypatch.setattr(kv_pool, "paged_decode_attention", _reading_attention)
    with pytest.raises(HostSyncError):
        engine.step()  # the first decode step records its shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_whole_default_warm_list_traces_clean_as_cuda(
    embedded_checkpoint: Checkpoint, dtype: torch.dtype
) -> None:
    """Every shape of `nanoserve serve --capture`'s list (rows <= 32, width <= 4096 by 64),
    on the embedded model's geometry. Every layer runs the same code, so one layer covers the
    list's shapes; all 30 run for the widest and the narrowest."""
    config = embedded_checkpoint.config
    shapes = warm_shapes(BucketSet(32, 4096, 64))
    assert len(shapes) == 384
    one_layer = dataclasses.replace(config, num_layers=1)
    trace = trace_recorded_steps(one_layer, shapes, dtype=dtype, max_batch=32, max_model_len=4096)
    assert trace.shapes == shapes
    whole = trace_recorded_steps(
        config, (shapes[0], shapes[-1]), dtype=dtype, max_batch=32, max_model_len=4096
    )
    assert whole.ops > 30 * 2 * 20


def test_int8_weights_trace_clean_as_cuda(embedded_checkpoint: Checkpoint) -> None:
    config = dataclasses.replace(embedded_checkpoint.config, num_layers=2)
    trace = trace_recorded_steps(
        config,
        (Shape(32, 256), Shape(1, 64)),
        dtype=torch.bfloat16,
        quantize="int8",
        max_batch=32,
        max_model_len=512,
    )
    assert len(trace.shapes) == 2


def test_the_old_attention_fails_the_trace(
    embedded_checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What CPU CI could not see before: the host zero, on the path CUDA would run."""
    monkeypatch.setattr(kv_pool, "paged_decode_attention", _old_attention)
    config = dataclasses.replace(embedded_checkpoint.config, num_layers=1)
    with pytest.raises(ForeignDeviceError, match=re.escape("zeros.default makes a () torch")):
        trace_recorded_steps(config, (Shape(4, 64),), max_batch=4, max_model_len=64)
