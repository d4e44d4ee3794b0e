"""Serving an ``inferenceModel`` as PopRT's runtime does: concurrent ``execute`` calls,
``execute_async`` futures, a bounded request queue, and requests batched into device iterations.

With IO tiles (``Options.TensorLocations.numIOTiles`` and ``set_overlap_for_input/output``) the
model's load, compute and store of successive requests overlap (``runtime/io_tiles.py``); keep
at least three requests in flight to fill that pipeline.

>>> from poptorch_sim.serving import Runner, RuntimeConfig  # doctest: +SKIP
>>> with Runner(poptorch.inferenceModel(model, opts), RuntimeConfig(timeout_ns=0)) as runner:
...     outputs = runner.execute(images)  # doctest: +SKIP
"""

from __future__ import annotations

from .runner import Runner, RuntimeConfig

ModelRunner = Runner  # PopRT 1.1's name

__all__ = ["Runner", "ModelRunner", "RuntimeConfig"]
