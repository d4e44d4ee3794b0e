"""PopTorch's ops: losses, blocks, annotations, control flow, slicing, printing, host and custom ops."""

from __future__ import annotations

from . import custom_library as custom_library  # registers PopTorch's own custom ops
from . import library as library  # registers torch.ops.poptorch
from .annotations import (
    Attribute,
    NameScope,
    nop,
    recomputationCheckpoint,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from .blocks import BeginBlock, Block, BlockFunction, LegacyBeginBlockFn, removeBlocks
from .control import cond, for_loop
from .cpu import CPU
from .custom import custom_op, register_custom_op
from .loss import identity_loss
from .misc import ctc_beam_search_decoder, fps, nearest
from .multiconv import MultiConv
from .printing import ipu_print_tensor
from .slicing import dynamic_slice, dynamic_update

__all__ = [
    "Attribute",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CPU",
    "LegacyBeginBlockFn",
    "MultiConv",
    "NameScope",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "fps",
    "nearest",
    "register_custom_op",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "identity_loss",
    "ipu_print_tensor",
    "nop",
    "recomputationCheckpoint",
    "removeBlocks",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
]
