"""Patterns of Graphcore's model-garden applications, each against eager PyTorch: a model
rewritten with torch.fx (a ``GraphModule``), name scopes pushed from module hooks."""

from __future__ import annotations

import copy

import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch


class WithLoss(nn.Module):
    """The CNNs' wrapper: the model (here a GraphModule) and its loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        out = self.model(x)
        return out, nn.functional.cross_entropy(out, y)


def _scope_hooks(model: nn.Module) -> None:
    """What the CNNs' ``models.py`` registers for readable PopVision names."""
    for name, module in model.named_modules():
        if name:
            module.register_forward_pre_hook(
                lambda m, i, n=name: torch.ops.poptorch.push_name_scope(n.split(".")[-1])
            )
            module.register_forward_hook(lambda m, i, o: torch.ops.poptorch.pop_name_scope())


def test_fx_rewritten_model_with_name_scope_hooks_trains_like_eager() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    traced = torch.fx.symbolic_trace(plain)  # its class is made per instance by fx
    model = WithLoss(traced)
    reference = copy.deepcopy(model)
    _scope_hooks(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    out, loss = training(x, y)
    (outs,) = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, y), 1, 2, 1
    )
    torch.testing.assert_close(out, torch.cat([o[0][0] for o in outs]))
    torch.testing.assert_close(loss, torch.stack([o[0][1] for o in outs]))
    training.copyWeightsToHost()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()
