"""Tensors that ``forward`` makes with a legacy typed constructor (``torch.LongTensor(..)``) are
host tensors, which PopTorch refuses to mix with the model's; factory functions are fine. See
[Note: host tensors made in forward] in ``executor/refusals.py``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import poptorch


class Forward(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


@pytest.mark.parametrize(
    ("fn", "shape", "dtype"),
    [
        (lambda x: torch.index_select(x, 0, torch.LongTensor([1, 0])), "2", "Long"),
        (lambda x: x + torch.FloatTensor([[1.0], [2.0]]).mul(2), "2, 1", "Float"),
        (lambda x: x[torch.IntTensor([0, 1, 1]).long()], "3", "Long"),
    ],
    ids=["index_select", "host-op-then-add", "index-after-cast"],
)
def test_legacy_constructor_tensor_mixed_with_the_model_is_refused(
    fn: Callable[[torch.Tensor], torch.Tensor], shape: str, dtype: str
) -> None:
    model = poptorch.inferenceModel(Forward(fn))
    expected = f"Expected an IPU tensor but got tensor(device=cpu, shape=[{shape}], dtype={dtype})"
    with pytest.raises(poptorch.Error) as info:
        model.compile(torch.rand(4))
    assert expected in str(info.value)
    assert isinstance(torch.LongTensor, type)  # the real type is back


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.index_select(x, 0, torch.tensor([1, 0])),
        lambda x: torch.index_select(x, 0, torch.LongTensor([1, 0]).to(x.device)),
        lambda x: x * torch.FloatTensor([3.0])[0],  # a 0-dim host tensor, as a CPU scalar
        lambda x: x.type(torch.IntTensor) * 2 if isinstance(x, torch.FloatTensor) else x,
        lambda x: x + torch.zeros(4).copy_(torch.FloatTensor([1.0, 2.0, 3.0, 4.0])),
    ],
    ids=["factory", "moved-to-device", "zero-dim", "type-and-isinstance", "copied-to-device"],
)
def test_allowed_tensors_made_in_forward_run_like_eager(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    x = torch.rand(4)
    torch.testing.assert_close(poptorch.inferenceModel(Forward(fn))(x), fn(x))


def test_a_legacy_tensor_made_before_the_model_is_wrapped_is_not_refused() -> None:
    made_outside = torch.LongTensor([3, 1])
    fn = lambda x: x[made_outside.tolist()]  # noqa: E731
    x = torch.rand(4)
    torch.testing.assert_close(poptorch.inferenceModel(Forward(fn))(x), fn(x))


def test_untyped_legacy_constructor_is_not_refused() -> None:
    # Footgun pinned (differs from PopTorch, which refuses this CPU tensor too): torch.Tensor is
    # also every tensor's class, so it is not wrapped, and its tensors run like eager's.
    fn = lambda x: x + torch.Tensor([1.0, 2.0, 3.0, 4.0])  # noqa: E731
    x = torch.rand(4)
    torch.testing.assert_close(poptorch.inferenceModel(Forward(fn))(x), fn(x))
