"""The capture guard: what a CUDA graph cannot hold, refused by name while a step is recorded.

A recorded step replays its kernels on their recorded arguments, so three things are wrong
inside one, and a CPU run shows none of them:

- a host synchronisation (`.item()`, `.tolist()`, `bool(t)`, `nonzero`, boolean-mask indexing,
  `unique`, `repeat_interleave` without `output_size`): capture refuses it, or the value read
  at record time is baked into every replay;
- a tensor on another device than the pool's (a host zero in `where`, a tensor made without
  `device=`): on CUDA that is a copy the graph does not repeat, or a synchronising one;
- an output whose shape depends on tensor values: a graph's shapes are fixed.

`capture_guard(device)` runs a region under a TorchDispatchMode that sees every aten op and
raises a named error for each of these. Factory calls without a device land on `meta` inside
it, so a tensor built with no device shows up as a foreign device on a CPU too. The guard is
entered around every recording (both backends): CI's frozen-call recordings are checked by the
same rules a CUDA capture needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nanoserve.core.errors import GateError
from nanoserve.runtime.model.experts import static_dispatch

aten = torch.ops.aten


class CaptureSafetyError(GateError):
    """An op inside a recorded step that a CUDA graph cannot replay faithfully."""


class HostSyncError(CaptureSafetyError):
    """The op reads a tensor's value on the host (a device sync on CUDA)."""


class ForeignDeviceError(CaptureSafetyError):
    """The op touches a tensor on another device than the pool's."""


class DynamicShapeError(CaptureSafetyError):
    """The op's output shape depends on tensor values."""


def _op_name(func: Any) -> str:
    return str(func.overloadpacket.__name__) + "." + str(func._overloadname)


_MASK_DTYPES = (torch.bool, torch.uint8)
_INDEX_OPS = ("index", "index_put", "index_put_", "_index_put_impl_")


def _is_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in indices or ())


def _dynamic_shape_is_fixed(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Ops tagged dynamic_output_shape whose shape is in fact fixed by their arguments."""
    packet = func.overloadpacket
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        return not _is_bool_index(args)  # integer indices: the shape is the index's
    if packet is aten.repeat_interleave:
        return kwargs.get("output_size") is not None or (
            len(args) > 1 and not isinstance(args[1], torch.Tensor)
        )
    return False


class CaptureGuard(TorchDispatchMode):
    """Raises on host syncs, foreign devices and value-dependent shapes; counts ops seen."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = _normalise(torch.device(device))
        self.num_ops = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.num_ops += 1
        tags = func.tags
        if torch.Tag.data_dependent_output in tags:
            raise HostSyncError(
                f"{_op_name(func)} reads a tensor's value on the host inside a recorded step"
                " (.item(), .tolist(), bool(tensor) and the like); decide it on the host"
                " before the step"
            )
        # A mask index is a nonzero inside (a sync on CUDA), also where the op's shape is
        # fixed: `t[mask] = v` is index_put_, which carries no dynamic-shape tag.
        masked = func.overloadpacket.__name__ in _INDEX_OPS and _is_bool_index(args)
        if masked or (
            torch.Tag.dynamic_output_shape in tags
            and not _dynamic_shape_is_fixed(func, args, kwargs)
        ):
            raise DynamicShapeError(
                f"{_op_name(func)} gives an output whose shape depends on tensor values"
                " (nonzero, masked_select, a boolean-mask index, unique, repeat_interleave"
                " without output_size); a recording's shapes are fixed"
            )
        self._check_devices(func, args, "takes")
        self._check_devices(func, kwargs.values(), "takes")
        out = func(*args, **kwargs)
        self._check_devices(func, out if isinstance(out, tuple | list) else (out,), "makes")
        return out

    def _check_devices(self, func: Any, values: Iterable[Any], verb: str) -> None:
        for value in values:
            if isinstance(value, torch.Tensor):
                if value.device != self.device and _normalise(value.device) != self.device:
                    self._foreign(func, value, verb)
            elif isinstance(value, tuple | list):  # a tensor list operand (cat, stack, index)
                self._check_devices(func, value, verb)

    def _foreign(self, func: Any, value: torch.Tensor, verb: str) -> None:
        raise ForeignDeviceError(
            f"{_op_name(func)} {verb} a {tuple(value.shape)} {value.dtype} tensor on"
            f" {value.device}; a recorded step may only touch {self.device}"
            " (pass device= to every factory, use Python scalars for constants)"
        )


_HOST_READS = frozenset(
    getattr(torch.Tensor, name)
    for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__")
)


class HostReadGuard(TorchFunctionMode):
    """The host reads that never reach the dispatcher on a CPU (`.tolist()` of a CPU tensor
    reads its memory directly), refused where Python asks for them."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _HOST_READS:
            raise HostSyncError(
                f"Tensor.{func.__name__} reads a tensor's value on the host inside a recorded"
                " step; decide it on the host before the step"
            )
        return func(*args, **(kwargs or {}))


def _normalise(device: torch.device) -> torch.device:
    """cuda and cuda:0 name the same device when 0 is the current one."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    return device


@contextmanager
def capture_guard(device: torch.device | str) -> Iterator[CaptureGuard]:
    """Run a region as a recording must run: on `device` alone, with no host reads."""
    guard = CaptureGuard(device)
    # A factory without device= lands on a device no operand is on, so the guard names it: meta
    # for a real run; the host for a trace on meta (meta standing in for CUDA, see trace_step).
    stray = "cpu" if guard.device.type == "meta" else "meta"
    # A mixture of experts sizes nothing by its routing in here (experts.py's static dispatch).
    with torch.device(stray), HostReadGuard(), guard, static_dispatch():
        yield guard
