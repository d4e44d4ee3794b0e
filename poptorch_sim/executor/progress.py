"""The "Graph compilation" progress bar (tqdm) that PopTorch shows while compiling."""

from __future__ import annotations

import tqdm

__all__ = ["CompilationBar"]

_TOTAL = 100


class CompilationBar:
    """A tqdm bar from 0 to 100 labelled "Graph compilation"; silent when ``show`` is False."""

    def __init__(self, show: bool) -> None:
        self._bar = (
            tqdm.tqdm(
                desc="Graph compilation",
                total=_TOTAL,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]",
            )
            if show
            else None
        )
        self._done = 0

    def update(self, progress: int) -> None:
        """Move the bar to ``progress`` (0-100)."""
        if self._bar is not None and progress > self._done:
            self._bar.update(progress - self._done)
            self._done = progress

    def finish(self) -> None:
        """Complete and close the bar."""
        self.update(_TOTAL)
        if self._bar is not None:
            self._bar.close()
