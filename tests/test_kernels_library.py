"""The C++ library's registrations: each op family's schemas, and ``poptorch_sim._C``'s functions.

Each family of ops (``csrc/engine``, ``csrc/sort``, ``csrc/optim``) declares its kernels in its
``ops.h``, and ``csrc/library.cpp`` registers them all with their schemas; the fused optimizer
steps are also plain Python functions of ``poptorch_sim._C``, generated from the same table as
their ops (``csrc/optim/ops.h``).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import poptorch_sim.kernels  # noqa: F401  (loads the library into torch.ops.poptorch_sim)

_C = importlib.import_module("poptorch_sim._C")

# The ops' contract with their Python wrappers, fake kernels and generic (CUDA) kernels.
SCHEMAS = [
    (
        "poptorch_sim::_sort_rows_8_lanes(Tensor self, bool descending=False) -> (Tensor values, "
        "Tensor indices)"
    ),
    "poptorch_sim::_sort_rows_8_lanes_built() -> bool",
    "poptorch_sim::accumulate_(Tensor(a!) accum, Tensor grad, float scale) -> ()",
    "poptorch_sim::accumulate_many_(Tensor(a!)[] accums, Tensor[] grads, float scale) -> ()",
    (
        "poptorch_sim::adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, float eps, "
        "float weight_decay, bool decoupled_weight_decay, bool bias_correction, bool maximize, "
        "float loss_scaling, float clip_coef, int chunk_elements) -> ()"
    ),
    "poptorch_sim::argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor",
    (
        "poptorch_sim::batched_nms(Tensor boxes, Tensor scores, Tensor idxs, "
        "float iou_threshold) -> Tensor"
    ),
    "poptorch_sim::engine_counters() -> (str[] kernels, str[] fields, Tensor table)",
    "poptorch_sim::engine_num_tiles() -> int",
    "poptorch_sim::engine_reset_counters() -> ()",
    "poptorch_sim::engine_set_num_tiles(int tiles) -> int",
    "poptorch_sim::engine_set_simd_choice(str family, str level) -> str",
    "poptorch_sim::engine_set_simd_level(str level) -> str",
    "poptorch_sim::engine_simd_families() -> str[]",
    "poptorch_sim::engine_simd_family_level(str family) -> str",
    "poptorch_sim::engine_simd_family_runs(str family) -> int[]",
    "poptorch_sim::engine_simd_level() -> str",
    "poptorch_sim::engine_supported_simd_level() -> str",
    "poptorch_sim::enter_worker_memory(bool pooled) -> bool",
    "poptorch_sim::grad_norm(Tensor[] grads, float loss_scaling) -> Tensor",
    "poptorch_sim::increment_steps_(Tensor(a!)[] steps) -> float[]",
    (
        "poptorch_sim::lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, float eps, "
        "float weight_decay, float max_weight_norm, bool bias_correction, float loss_scaling, "
        "float clip_coef, int chunk_elements) -> ()"
    ),
    "poptorch_sim::nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",
    "poptorch_sim::offload_reset_stats() -> ()",
    "poptorch_sim::offload_stats() -> int[]",
    (
        "poptorch_sim::rmsprop_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] square_avgs, "
        "Tensor(c!)[] momentum_buffers, Tensor(d!)[] grad_avgs, *, float lr, float alpha, float eps, "
        "float weight_decay, float momentum, bool centered, bool maximize, bool use_tf_variant, "
        "float loss_scaling, float clip_coef, int chunk_elements) -> ()"
    ),
    (
        "poptorch_sim::sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
        "*, float lr, float momentum, float dampening, float weight_decay, bool nesterov, "
        "bool maximize, bool first_step, float loss_scaling, float clip_coef, "
        "int chunk_elements) -> ()"
    ),
    (
        "poptorch_sim::sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, "
        "Tensor indices)"
    ),
    "poptorch_sim::sort_set_stream_mid_rows(bool stream) -> bool",
    "poptorch_sim::sort_stream_mid_rows() -> bool",
    "poptorch_sim::stream_sum(Tensor[] micro_batches, int replicas) -> Tensor",
    (
        "poptorch_sim::topk(Tensor self, int k, int dim=-1, bool largest=True, "
        "bool sorted=True) -> (Tensor values, Tensor indices)"
    ),
    "poptorch_sim::trim_worker_memory() -> int",
    "poptorch_sim::worker_memory_stats() -> int[]",
]


def test_every_op_is_registered_with_its_schema() -> None:
    found = sorted(
        str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("poptorch_sim::")
    )
    assert found == SCHEMAS


def test_the_module_holds_the_optimizer_steps_as_functions() -> None:
    names = sorted(n for n in dir(_C) if not n.startswith("_"))
    assert names == ["adam_step_", "increment_steps_", "lamb_step_", "rmsprop_step_", "sgd_step_"]


# Op: (tensor lists, whether it takes float steps, hyper-parameters in schema order).
STEPS = {
    "sgd_step_": (3, False, dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.01,
                                 nesterov=True, maximize=False, first_step=False,
                                 loss_scaling=2.0, clip_coef=0.5)),
    "adam_step_": (4, True, dict(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                                 decoupled_weight_decay=True, bias_correction=True,
                                 maximize=False, loss_scaling=3.0, clip_coef=0.7)),
    "rmsprop_step_": (5, False, dict(lr=0.01, alpha=0.95, eps=1e-6, weight_decay=0.1,
                                     momentum=0.5, centered=True, maximize=False,
                                     use_tf_variant=False, loss_scaling=3.0, clip_coef=0.7)),
    "lamb_step_": (4, True, dict(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                                 max_weight_norm=5.0, bias_correction=True, loss_scaling=3.0,
                                 clip_coef=0.7)),
}  # fmt: skip


@pytest.mark.parametrize("chunk_elements", [0, 2048], ids=["on-chip", "off-chip"])
@pytest.mark.parametrize("name", STEPS)
def test_python_function_equals_the_dispatcher_op(name: str, chunk_elements: int) -> None:
    torch.manual_seed(0)
    lists, has_steps, hyper = STEPS[name]
    hyper = dict(hyper, chunk_elements=chunk_elements)
    shapes = [(2500,), (7, 5), (3,)]
    # States as a step leaves them: second moments positive, centred RMSprop's gradient averages
    # (the fifth list) small beside its square averages.
    scale = [1.0, 1.0, 1.0, 1.0, 0.1]
    direct = [
        [torch.randn(s) if i < 2 else torch.rand(s) * scale[i] + 0.5 * (i < 4) for s in shapes]
        for i in range(lists)
    ]
    via_op = [[t.clone() for t in x] for x in direct]
    start = via_op[0][0].clone()
    steps = [[3.0] * len(shapes)] if has_steps else []
    getattr(torch.ops.poptorch_sim, name)(*via_op, *steps, **hyper)
    getattr(_C, name)(*direct, *steps, *hyper.values())
    assert not torch.equal(via_op[0][0], start)
    assert all(t.isfinite().all() for t in sum(via_op, []))
    for a, b in zip(sum(via_op, []), sum(direct, [])):
        assert torch.equal(a, b)


def test_increment_steps_function_equals_the_dispatcher_op() -> None:
    via_op = [torch.tensor(1.0), torch.tensor(4.0)]
    direct = [t.clone() for t in via_op]
    assert torch.ops.poptorch_sim.increment_steps_(via_op) == [2.0, 5.0]
    assert _C.increment_steps_(direct) == [2.0, 5.0]
    assert all(torch.equal(a, b) for a, b in zip(via_op, direct))
