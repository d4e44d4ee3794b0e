"""Checks shared by the real-model tests: one training step or a few inference micro-batches of a
model split over IPUs against the eager PyTorch loop they stand for."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import poptorch_sim as poptorch

LR = 0.5  # SGD without momentum: (weight before - weight after) / LR is the gradient
Batch = dict[str, torch.Tensor]


def text_batch(n: int, seq: int = 8, vocab: int = 64) -> Batch:
    mask = torch.ones(n, seq, dtype=torch.long)
    mask[::2, seq - 3 :] = 0  # padding in every other sequence
    return {"input_ids": torch.randint(0, vocab, (n, seq)), "attention_mask": mask}


# -- the oracle -----------------------------------------------------------------------------------
def execution_strategy(name: str, auto_increment: bool = False) -> Any:
    stage = poptorch.AutoStage.AutoIncrement if auto_increment else poptorch.AutoStage.SameAsIpu
    if name == "sharded":
        return poptorch.ShardedExecution(stage)
    return poptorch.PipelinedExecution(stage)


def micro_batch(batch: Batch, i: int, size: int) -> Batch:
    return {k: v[i * size : (i + 1) * size] for k, v in batch.items()}


def workers_of_stages(runner: Any) -> dict[int, set[str]]:
    """Record which thread runs each stage's forward from now on (stage index -> names)."""
    seen: dict[int, set[str]] = {}
    for stage in runner.program.stages:

        def hook(_module: nn.Module, _args: Any, index: int = stage.index) -> None:
            seen.setdefault(index, set()).add(threading.current_thread().name)

        stage.module.register_forward_pre_hook(hook)
    return seen


def assert_all_close(
    what: str, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], tol: dict
) -> None:
    """Every tensor of ``ours`` equals ``theirs`` (one comparison of all, then the culprit)."""
    assert ours.keys() == theirs.keys()
    if not ours:
        return
    flat = [torch.cat([d[k].detach().double().flatten() for k in ours]) for d in (ours, theirs)]
    if torch.allclose(*flat, **tol):
        return
    for name in ours:
        torch.testing.assert_close(
            ours[name], theirs[name].detach(), **tol, msg=lambda m, n=name: f"{what} {n}: {m}"
        )
    raise AssertionError(f"{what}s differ from eager's beyond {tol} (at the tolerance's edge)")


def check_training(
    model: nn.Module,
    batch: Batch,
    outputs: Callable[[Any], tuple[torch.Tensor, torch.Tensor]],
    strategy: Any,
    ga: int,
    micro: int = 2,
    atol: float = 1e-5,
    capture: str = "auto",
    configure: Callable[[Any], None] | None = None,
) -> Any:
    """One training step over ``ga`` micro-batches equals eager's: outputs, losses, gradients,
    weights and buffers after the step; ``configure`` sets more options. Returns the compiled
    program's runner."""
    reference = copy.deepcopy(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    opts = poptorch.Options().setExecutionStrategy(strategy)
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    opts.Jit.captureMethod(capture)
    if configure is not None:
        configure(opts)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=LR))
    loss, out = outputs(training(**batch))
    runner = training._executable.program
    assert type(runner).__name__ == "StagedRunner"

    ref_loss, ref_out = [], []
    for i in range(ga):
        mb_loss, mb_out = outputs(reference(**micro_batch(batch, i, micro)))
        (mb_loss / ga).backward()
        ref_loss.append(mb_loss.detach())
        ref_out.append(mb_out.detach())
    tol = {"atol": atol, "rtol": 1e-4}
    torch.testing.assert_close(loss, torch.stack(ref_loss), **tol)
    torch.testing.assert_close(out, torch.cat(ref_out), **tol)
    training.copyWeightsToHost()
    after = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: (before[name] - after[name]) / LR for name in after}
    expected = {
        name: torch.zeros_like(p) if p.grad is None else p.grad
        for name, p in reference.named_parameters()
    }
    assert_all_close("gradient", grads, expected, tol)
    torch.optim.SGD(reference.parameters(), lr=LR).step()
    assert_all_close("weight", after, dict(reference.named_parameters()), tol)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    assert_all_close("buffer", buffers, dict(reference.named_buffers()), tol)
    training.destroy()
    return runner


def check_inference(
    model: nn.Module,
    batch: Batch,
    outputs: Callable[[Any], Any],
    strategy: Any,
    di: int,
    micro: int = 2,
) -> Any:
    """``di`` micro-batches of inference equal eager's outputs, in every mode the runtime's
    trials may run them in (See [Note: cores follow the work]). Returns the runner."""
    model.eval()
    opts = poptorch.Options().setExecutionStrategy(strategy).deviceIterations(di)
    inference = poptorch.inferenceModel(model, opts)
    out = outputs(inference(**batch))
    runner = inference._executable.program
    assert type(runner).__name__ == "StagedRunner"
    with torch.no_grad():
        want = torch.cat([outputs(model(**micro_batch(batch, i, micro))) for i in range(di)])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
    cores = runner.runtime.cores
    for mode in cores.trials:
        cores.mode = lambda mode=mode: mode
        torch.testing.assert_close(outputs(inference(**batch)), want, atol=1e-5, rtol=1e-4)
    inference.destroy()
    return runner


def stage_map(runner: Any) -> list[tuple[int, tuple[str, ...]]]:
    return [(stage.ipu, stage.blocks) for stage in runner.program.stages]


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every key and value tensor of a transformers ``DynamicCache`` / ``EncoderDecoderCache``."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    if isinstance(cache, EncoderDecoderCache):
        return cache_tensors(cache.self_attention_cache) + cache_tensors(
            cache.cross_attention_cache
        )
    assert type(cache) is DynamicCache, f"expected a DynamicCache, got {type(cache).__name__}"
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def per_sample(*values: Any) -> torch.Tensor:
    """Tensors and caches (batch-major) flattened per sample and joined: ``[batch, -1]``."""
    tensors: list[torch.Tensor] = []
    for value in values:
        tensors += [value] if isinstance(value, torch.Tensor) else cache_tensors(value)
    return torch.cat([t.detach().flatten(1).float() for t in tensors], dim=1)
