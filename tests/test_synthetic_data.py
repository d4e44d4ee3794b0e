"""Synthetic data: the host's inputs are not sent; the model runs on zeros or random data of
their shape and dtype, as an IPU does with ``enableSyntheticData`` / ``syntheticDataMode``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popart
import poptorch_sim as poptorch
from poptorch_sim.executor.synthetic import SyntheticData


class Recorder(nn.Module):
    """Keeps what it was given; returns a function of it so outputs show the data too."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor):
        self.seen.append((x.clone(), labels.clone()))
        out = self.lin(x)
        return out, nn.functional.cross_entropy(out, labels)


def _run(mode: int | None, training: bool):
    model = Recorder()
    opts = poptorch.Options()
    if mode is not None:
        opts._Popart.set("syntheticDataMode", mode)
    x = torch.full((4, 3), 7.0, dtype=torch.float16).float()
    labels = torch.ones(4, dtype=torch.long)
    if training:
        wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0))
    else:
        wrapped = poptorch.inferenceModel(model, opts)
    out, loss = wrapped(x, labels)
    wrapped.destroy()
    seen_x = torch.cat([s[0] for s in model.seen])
    seen_labels = torch.cat([s[1] for s in model.seen])
    return seen_x, seen_labels, out


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_enable_synthetic_data_runs_on_random_normal_values_of_the_inputs_shape(training):
    opts = poptorch.Options().enableSyntheticData(int(popart.SyntheticDataMode.RandomNormal))
    assert opts._Popart.options["syntheticDataMode"] == popart.SyntheticDataMode.RandomNormal
    seen_x, seen_labels, out = _run(int(popart.SyntheticDataMode.RandomNormal), training)
    assert seen_x.shape[-1] == 3 and seen_x.dtype == torch.float32
    assert not (seen_x == 7.0).any()  # the host's values never arrive
    assert abs(seen_x.mean().item()) < 1.5 and seen_x.std().item() > 0.3
    assert seen_labels.dtype == torch.long and (seen_labels == 0).all()  # valid class indices
    assert out.shape == (4, 2)


@pytest.mark.parametrize(
    "mode,check",
    [
        (popart.SyntheticDataMode.Zeros, lambda t: bool((t == 0).all())),
        (popart.SyntheticDataMode.RandomUniform, lambda t: bool(((t >= 0) & (t < 1)).all())),
        (popart.SyntheticDataMode.Off, lambda t: bool((t == 7.0).all())),
    ],
    ids=["zeros", "uniform", "off"],
)
def test_each_mode_fills_the_inputs_as_popart_does(mode, check) -> None:
    seen_x, _, _ = _run(int(mode), training=False)
    assert check(seen_x)


def test_synthetic_values_keep_the_host_dtype_and_differ_between_calls() -> None:
    synthetic = SyntheticData(int(popart.SyntheticDataMode.RandomNormal), seed=3)
    host = torch.ones(2, 5, dtype=torch.float16)
    a, b = synthetic.replace(host), synthetic.replace(host)
    assert a.dtype == torch.float16 and a.shape == (2, 5)
    assert not torch.equal(a, b)
    assert synthetic.replace(torch.ones(3, dtype=torch.bool)).tolist() == [False] * 3


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="Unknown syntheticDataMode 7: expected 0 to 3"):
        SyntheticData(7)


def test_popart_enums_that_applications_read() -> None:
    assert [int(m) for m in popart.SyntheticDataMode][:4] == [0, 1, 2, 3]
    assert int(popart.BatchSerializationBatchSchedule.Isomorphic) == 1
