"""Joined outputs reuse their memory only once the caller has let go of it."""

from __future__ import annotations

import torch

import poptorch_sim as poptorch
from poptorch_sim.executor.host_buffers import MIN_BYTES, OutputBuffers
from poptorch_sim.executor.streams import assemble

ROWS, COLS = 64, MIN_BYTES // 4 // 64 // 8  # 8 micro-batches of one row block join to MIN_BYTES


def test_a_dropped_buffer_is_reused() -> None:
    buffers = OutputBuffers()
    first = buffers.empty((ROWS * 8, COLS), torch.float32)
    ptr = first.data_ptr()
    del first
    again = buffers.empty((ROWS * 8, COLS), torch.float32)
    assert again.data_ptr() == ptr
    assert again.shape == (ROWS * 8, COLS) and again.is_contiguous()


def test_a_buffer_the_caller_holds_is_never_handed_out() -> None:
    buffers = OutputBuffers()
    held = buffers.empty((ROWS * 8, COLS), torch.float32)
    view = held[1:]
    array = buffers.empty((ROWS * 8, COLS), torch.float32).numpy()
    del held  # the view still points into it
    third = buffers.empty((ROWS * 8, COLS), torch.float32)
    ptrs = {view.data_ptr() - view.element_size() * COLS, array.ctypes.data, third.data_ptr()}
    assert len(ptrs) == 3


def test_small_outputs_are_not_kept() -> None:
    buffers = OutputBuffers()
    small = buffers.empty((4, 4), torch.float32)
    del small
    assert buffers.kept_bytes == 0


def test_at_most_keep_buffers_per_size() -> None:
    buffers = OutputBuffers(keep=2)
    held = [buffers.empty((ROWS * 8, COLS), torch.float32) for _ in range(4)]
    assert buffers.kept_bytes == 2 * ROWS * 8 * COLS * 4
    buffers.clear()
    assert buffers.kept_bytes == 0
    assert all(t.shape == (ROWS * 8, COLS) for t in held)


def test_assemble_into_buffers_equals_cat() -> None:
    parts = [torch.randn(ROWS, COLS) for _ in range(8)]
    buffers = OutputBuffers()
    joined = assemble(parts, "all", 1, 8, 1, 1, buffers.empty)
    assert torch.equal(joined, torch.cat(parts))
    assert buffers.kept_bytes == joined.numel() * 4
    needs_grad = [p.clone().requires_grad_() for p in parts]  # cat records autograd: plain cat
    assert assemble(needs_grad, "all", 1, 8, 1, 1, buffers.empty).requires_grad


class Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, COLS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def test_inference_outputs_stay_intact_across_calls() -> None:
    model = Wide()
    opts = poptorch.Options().deviceIterations(8)
    sim = poptorch.inferenceModel(model, opts)
    xs = [torch.randn(8 * ROWS, 8) for _ in range(3)]
    with torch.no_grad():
        expected = [model(x) for x in xs]
    first = sim(xs[0])
    second = sim(xs[1])  # the first is held: written into fresh memory
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, expected[0], rtol=0, atol=0)
    ptr = second.data_ptr()
    del second
    third = sim(xs[2])
    assert third.data_ptr() == ptr  # the second was dropped: its memory is written again
    torch.testing.assert_close(first, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(third, expected[2], rtol=0, atol=0)
    sim.destroy()
