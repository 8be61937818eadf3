"""The recurrent layers' C++ decode steps (kernels/csrc/recurrent.h): against a float64
reference, the same bits on every ISA path this CPU runs and alone or batched, in place on the
pool, with a fresh row reading nothing and the sink never written."""

from __future__ import annotations

import pytest
import torch

from nanoserve.runtime.kernels import kernel_ops
from tests.runtime.isa_paths import assert_same_bits, on_every_isa

SLOTS, HEADS, K_DIM, V_DIM = 5, 3, 24, 32  # slot 5 is the sink


def delta_inputs(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q = torch.nn.functional.normalize(rand(rows, HEADS, K_DIM), dim=-1) * K_DIM**-0.5
    k = torch.nn.functional.normalize(rand(rows, HEADS, K_DIM), dim=-1)
    return {
        "state": rand(SLOTS + 1, HEADS, K_DIM, V_DIM),
        "q": q,
        "k": k,
        "v": rand(rows, HEADS, V_DIM),
        "decay": torch.rand(rows, HEADS, generator=gen) * 0.5 + 0.5,
        "beta": torch.rand(rows, HEADS, generator=gen),
    }


def delta_reference(
    inputs: dict[str, torch.Tensor], slots: list[int], positions: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule in float64, as written: (o, the state pool after)."""
    state = inputs["state"].double().clone()
    outs = []
    for row, (slot, position) in enumerate(zip(slots, positions, strict=True)):
        q, k, v = (inputs[n][row].double() for n in ("q", "k", "v"))
        d, beta = inputs["decay"][row].double(), inputs["beta"][row].double()
        s = state[slot] if position else torch.zeros_like(state[slot])
        s = d[:, None, None] * s  # forget
        delta = beta[:, None] * (v - torch.einsum("hk,hkv->hv", k, s))
        s = s + k[..., None] * delta[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q, s))
        if slot != SLOTS:
            state[slot] = s
    return torch.stack(outs), state


def run_delta(
    inputs: dict[str, torch.Tensor], slots: list[int], positions: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    state = inputs["state"].clone()
    out = kernel_ops.delta_net_step(
        state,
        torch.tensor(slots),
        torch.tensor(positions),
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs["decay"],
        inputs["beta"],
    )
    return out, state


# Rows continuing slots 2 and 0, one starting a sequence on slot 3, two padded rows on the sink.
SLOTS_OF, POSITIONS = [2, 0, 3, SLOTS, SLOTS], [7, 1, 0, 0, 0]


def test_the_delta_step_is_the_delta_rule_on_every_isa(runnable_isas: list[str]) -> None:
    inputs = delta_inputs(len(SLOTS_OF))
    inputs["state"][3] = float("nan")  # a fresh row reads nothing its slot held
    results = on_every_isa(runnable_isas, lambda: run_delta(inputs, SLOTS_OF, POSITIONS))
    assert_same_bits(results)
    out, state = results["portable"]
    want_out, want_state = delta_reference(inputs, SLOTS_OF, POSITIONS)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[:SLOTS].double(), want_state[:SLOTS], rtol=1e-5, atol=1e-5)
    assert torch.equal(state[1], inputs["state"][1])  # a slot no row names is untouched
    assert torch.equal(state[SLOTS], inputs["state"][SLOTS])  # the sink is never written


def test_a_row_gives_the_same_bits_alone_and_batched(runnable_isas: list[str]) -> None:
    inputs = delta_inputs(len(SLOTS_OF), seed=1)
    batched_out, batched_state = run_delta(inputs, SLOTS_OF, POSITIONS)
    alone = {name: tensor[:1] for name, tensor in inputs.items() if name != "state"}
    alone["state"] = inputs["state"]
    out, state = run_delta(alone, SLOTS_OF[:1], POSITIONS[:1])
    assert torch.equal(out[0], batched_out[0])
    assert torch.equal(state[2], batched_state[2])


def test_a_slot_outside_the_pool_is_refused() -> None:
    inputs = delta_inputs(1)
    with pytest.raises(RuntimeError, match="a state slot is outside the state pool of 6 slots"):
        run_delta(inputs, [6], [3])


# -- the convolution's step ------------------------------------------------------------------

CHANNELS, TAPS = 40, 4


def conv_inputs(rows: int, bias: bool) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(2)
    return {
        "state": torch.randn(SLOTS + 1, CHANNELS, TAPS - 1, generator=gen),
        "x": torch.randn(rows, CHANNELS, generator=gen),
        "kernel": torch.randn(CHANNELS, TAPS, generator=gen),
        "bias": torch.randn(CHANNELS, generator=gen) if bias else None,
    }


def run_conv(
    inputs: dict[str, torch.Tensor | None], slots: list[int], positions: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    state, x, kernel = inputs["state"], inputs["x"], inputs["kernel"]
    assert state is not None and x is not None and kernel is not None
    state = state.clone()
    out = kernel_ops.conv_step(
        state, torch.tensor(slots), torch.tensor(positions), x, kernel, inputs["bias"]
    )
    return out, state


@pytest.mark.parametrize("bias", [False, True])
def test_the_conv_step_is_torchs_prompt_order_on_every_isa(
    runnable_isas: list[str], bias: bool
) -> None:
    """The products and sums in short_conv.py's order, so the bits are what a one-token prompt
    chunk computes in torch; the window shifts by the new input, in place."""
    inputs = conv_inputs(len(SLOTS_OF), bias)
    state, x, kernel = inputs["state"], inputs["x"], inputs["kernel"]
    assert state is not None and x is not None and kernel is not None
    state[3] = float("nan")  # a fresh row reads an empty window
    results = on_every_isa(runnable_isas, lambda: run_conv(inputs, SLOTS_OF, POSITIONS))
    assert_same_bits(results)
    out, after = results["portable"]
    fresh = torch.tensor(POSITIONS) == 0
    past = state[SLOTS_OF].transpose(1, 2).masked_fill(fresh[:, None, None], 0.0)
    windows = torch.cat((past, x[:, None, :]), dim=1)  # [rows, taps, channels]
    want = windows[:, 0] * kernel[:, 0]
    for k in range(1, TAPS):
        want = want + windows[:, k] * kernel[:, k]
    if inputs["bias"] is not None:
        want = want + inputs["bias"]
    assert torch.equal(out, want)
    for row, slot in enumerate(SLOTS_OF[:3]):
        assert torch.equal(after[slot], windows[row, 1:].T)  # the last taps - 1 inputs
    assert torch.equal(after[SLOTS], state[SLOTS])  # the sink is never written


# -- Mamba2's state space step -----------------------------------------------------------------

HEAD_DIM, D_STATE = 8, 32


def ssm_inputs(rows: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {
        "state": torch.randn(SLOTS + 1, HEADS, HEAD_DIM, D_STATE, generator=gen),
        "u": torch.randn(rows, HEADS, HEAD_DIM, generator=gen),
        "b": torch.randn(rows, HEADS, D_STATE, generator=gen),
        "c": torch.randn(rows, HEADS, D_STATE, generator=gen),
        "decay": torch.rand(rows, HEADS, generator=gen),
    }


def run_ssm(
    inputs: dict[str, torch.Tensor], slots: list[int], positions: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    state = inputs["state"].clone()
    args = (inputs[n] for n in ("u", "b", "c", "decay"))
    out = kernel_ops.ssm_step(state, torch.tensor(slots), torch.tensor(positions), *args)
    return out, state


def test_the_ssm_step_is_the_recurrence_on_every_isa(runnable_isas: list[str]) -> None:
    inputs = ssm_inputs(len(SLOTS_OF))
    inputs["state"][3] = float("nan")  # a fresh row reads nothing its slot held
    results = on_every_isa(runnable_isas, lambda: run_ssm(inputs, SLOTS_OF, POSITIONS))
    assert_same_bits(results)
    out, after = results["portable"]
    state = inputs["state"].double()
    for row, (slot, position) in enumerate(zip(SLOTS_OF, POSITIONS, strict=True)):
        s = state[slot] if position else torch.zeros_like(state[slot])
        u, b, c = (inputs[n][row].double() for n in ("u", "b", "c"))
        s = inputs["decay"][row].double()[:, None, None] * s + u[..., None] * b[:, None, :]
        want = (s * c[:, None, :]).sum(-1)
        torch.testing.assert_close(out[row].double(), want, rtol=1e-5, atol=1e-5)
        if slot != SLOTS:
            torch.testing.assert_close(after[slot].double(), s, rtol=1e-5, atol=1e-5)
    assert torch.equal(after[1], inputs["state"][1])
    assert torch.equal(after[SLOTS], inputs["state"][SLOTS])  # the sink is never written


def test_the_steps_give_the_same_bits_alone_and_batched() -> None:
    conv, ssm = conv_inputs(len(SLOTS_OF), True), ssm_inputs(len(SLOTS_OF))
    conv_batched, ssm_batched = (
        run_conv(conv, SLOTS_OF, POSITIONS),
        run_ssm(ssm, SLOTS_OF, POSITIONS),
    )
    conv_alone = run_conv({**conv, "x": conv["x"][1:2]}, SLOTS_OF[1:2], POSITIONS[1:2])  # type: ignore[index]
    alone = {n: t if n == "state" else t[1:2] for n, t in ssm.items()}
    ssm_alone = run_ssm(alone, SLOTS_OF[1:2], POSITIONS[1:2])
    assert torch.equal(conv_alone[0][0], conv_batched[0][1])
    assert torch.equal(ssm_alone[0][0], ssm_batched[0][1])
    assert torch.equal(ssm_alone[1][0], ssm_batched[1][0])
