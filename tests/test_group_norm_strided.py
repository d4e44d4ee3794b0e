"""PopART's groupNormStridedChannelGrouping: channel c normalised in group c % G."""

from __future__ import annotations

import torch
from torch import nn

import poptorch


def _by_hand(gn: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """Each group's mean and (biased) variance over its channels c with c % G == g."""
    out = torch.empty_like(x)
    for g in range(gn.num_groups):
        chans = list(range(g, x.shape[1], gn.num_groups))
        part = x[:, chans]
        dims = tuple(range(1, x.dim()))
        mean = part.mean(dim=dims, keepdim=True)
        var = part.var(dim=dims, unbiased=False, keepdim=True)
        out[:, chans] = (part - mean) / torch.sqrt(var + gn.eps)
    shape = [1, -1] + [1] * (x.dim() - 2)
    return out * gn.weight.view(shape) + gn.bias.view(shape)


def test_strided_grouping_follows_the_option() -> None:
    torch.manual_seed(0)
    gn = nn.GroupNorm(3, 12)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-1, 1)
    x = torch.randn(4, 12, 5) * torch.arange(1, 13).view(1, 12, 1)
    opts = poptorch.Options()
    opts._Popart.set("groupNormStridedChannelGrouping", True)
    strided = poptorch.inferenceModel(gn, opts)(x)
    with torch.no_grad():
        torch.testing.assert_close(strided, _by_hand(gn, x), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(strided, gn(x), atol=1e-2)  # not PyTorch's contiguous groups
        # Without the option: PyTorch's own group norm.
        torch.testing.assert_close(poptorch.inferenceModel(gn)(x), gn(x))


def test_strided_grouping_trains_like_its_eager_form() -> None:
    torch.manual_seed(1)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gn = nn.GroupNorm(2, 4)

        def forward(self, x, target=None):
            y = self.gn(x)
            return y if target is None else (y, nn.functional.mse_loss(y, target))

    model, x, target = Net(), torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    reference = Net()
    reference.load_state_dict(model.state_dict())
    opts = poptorch.Options()
    opts._Popart.set("groupNormStridedChannelGrouping", True)
    train = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.5)
    )
    train(x, target)
    train.copyWeightsToHost()
    loss = nn.functional.mse_loss(_by_hand(reference.gn, x), target)
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.5 * p.grad
    torch.testing.assert_close(model.gn.weight, reference.gn.weight, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.gn.bias, reference.gn.bias, atol=1e-5, rtol=1e-5)
