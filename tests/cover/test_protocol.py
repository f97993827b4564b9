"""The control channel's serialisation: tensors travel as bytes, and come back bit for bit."""

from __future__ import annotations

import pickle

import pytest
import torch

from conformance.world import protocol

CASES = {
    "bf16 matrix": torch.randn(5, 7).to(torch.bfloat16),
    "transposed (not contiguous)": torch.randn(3, 4).t(),
    "one-element slice, stride 3": torch.arange(12).reshape(4, 3)[:1, 1:2],
    "no rows": torch.zeros(0, 5, dtype=torch.bfloat16),
    "scalar": torch.tensor(3.5),
    "bool": torch.tensor([True, False, True]),
    "int64 -1 padding": torch.full((2, 3), -1, dtype=torch.int64),
    "fp8": torch.randn(4, 8).to(torch.float8_e4m3fn),
    "nan payload bits": torch.tensor([float("nan"), -0.0, float("inf")]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_tensor_comes_back_bit_for_bit(name: str) -> None:
    sent = CASES[name]
    back = protocol.loads(protocol.dumps({"t": sent}))["t"]
    assert back.dtype == sent.dtype and back.shape == sent.shape, (name, back.dtype, back.shape)
    as_bytes = (lambda t: t.reshape(-1).clone().view(torch.uint8)) if sent.numel() else (lambda t: t)
    assert torch.equal(as_bytes(back), as_bytes(sent)), name


def test_tensors_the_bytes_path_does_not_take_use_torchs_pickling() -> None:
    grad = torch.ones(3, requires_grad=True)
    back = protocol.loads(protocol.dumps(grad))
    assert back.requires_grad and torch.equal(back.detach(), grad.detach())
    param = torch.nn.Parameter(torch.ones(2))
    assert isinstance(protocol.loads(protocol.dumps(param)), torch.nn.Parameter)


def test_the_bytes_path_is_smaller_and_plain_pickle_still_reads_it() -> None:
    payload = {"x": torch.zeros(32, 128, dtype=torch.bfloat16), "idx": torch.zeros(32, 2, dtype=torch.int64)}
    fast = protocol.dumps(payload)
    assert len(fast) < len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    assert torch.equal(pickle.loads(fast)["x"], payload["x"])
