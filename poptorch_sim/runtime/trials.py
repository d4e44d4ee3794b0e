"""The trials of a program's ways to share the cores: when they run, what each call times, and
what they choose.

[Note: trials that cost a fraction of a call]
The trials of [Note: cores follow the work] once ran whole calls in every mode, and a mode
several times slower than the others cost a whole call each time: BERT (4 layers, pipelined over
2 IPUs, GA 10) on the loaded two-core build machine took 9,644 and 8,397 ms in its two calls on
one thread against a steady 2,150 ms, and a 2-stage pipeline whose stages sleep ran one call in
three at the sharded speed until its eighth call. So the modes are of two kinds:

    kind     modes                       how a trial times them
    whole    split, lent (a serial       whole calls, in turn (both pipeline the stages on
             program: one thread)        a worker per IPU, which a few micro-batches' run
                                         would not measure: fill and drain dominate it)
    probed   one thread, side by side    the call's first micro-batches (1 on one thread,
                                         one per core side by side), then the rest of the
                                         call in the call's whole mode

A probe computes at most ``PROBE_SHARE`` of a call's micro-batches (none where the call has too
few), so a mode ``r`` times slower costs the call ``1 + PROBE_SHARE * (r - 1)`` at most: GA 10
with ``r`` = 4.5 costs 1.35 of a call. The split into two runs keeps the numbers: the
micro-batches still run in order, each parameter's gradients accumulate in micro-batch order,
and only the call's last run steps the optimizer. A mode measured more than ``RULED_OUT`` times
as slow as the trial's fastest whole mode runs no more in that trial (a whole mode's turn goes
to the split), so lending on a loaded machine, where its two-thread ops wait at their barriers
for parked threads, costs one call in a trial, not two. And a trial runs the split alone (no
lending, no probe) where the run before kept less than ``UNDERUSED`` of the cores busy (the thread-seconds
of its compute actions, ``CoreShare.cost``, over its wall time times the cores): stages that
wait (a sleep, a device) leave their cores idle, and lent cores make two such stages take
turns, one thread runs their waits one after another (a 2-stage pipeline sleeping 10 ms a
forward: its lent trial call 1.65x its split call); and where other processes hold the cores,
the program's threads are off them, and two-thread ops wait at their barriers for parked
threads (the build machine at load 14: BERT inference's call probing one thread on 1 of 10
micro-batches took 2.4x the steady call; GPT-2 inference's calls probing side by side on 2 of
10, 1.8x). The other modes use the cores better; a program that does not get them, or does
not use them, gains nothing from them. A pipeline with more threads than cores still keeps
them busy, and a quiet machine's later trial measures again.

The choice holds until the next trial (``TRIAL_EVERY`` runs after a trial started, doubling up
to ``TRIAL_EVERY_MAX`` while trials keep choosing the same mode), unless the machine changes:
the median of the first ``DRIFT_RUNS`` runs after a trial is the chosen mode's reference, and
once the median of the last ``DRIFT_RUNS`` is ``DRIFT`` times away from it (a machine that went
quiet, or got busy) the next run starts a new trial and the gap goes back to ``TRIAL_EVERY``.
Where the machine got busier, that trial leaves out the modes the last one measured
``RULED_OUT`` times as slow (they only get slower with fewer free cores); where it went quiet,
it tries every mode again.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import NamedTuple

__all__ = ["PROBED", "Probe", "Trials"]

PROBED = ("one thread", "side by side")  # modes a trial times on a call's first micro-batches
TRIAL_EVERY = 40  # runs from the start of one trial of the modes to the next
TRIAL_EVERY_MAX = 640  # the most it grows to, doubling after each trial that kept the choice
TRIAL_RUNS = 2  # runs of each mode in a trial
TRIAL_MARGIN = 0.95  # another mode must take at most this fraction of the first mode's time
PROBE_SHARE = 0.25  # the most of a call's micro-batches a probe computes
RULED_OUT = 1.5  # a mode this much slower than the fastest whole mode: tried no more
DRIFT = 1.5  # the chosen mode's recent time moved by this factor: try the modes again
DRIFT_RUNS = 5  # runs whose median sets the reference, and is compared with it
UNDERUSED = 0.3  # compute keeping less than this share of the cores busy: the split alone


class Probe(NamedTuple):
    """A call's first ``count`` micro-batches computed in ``mode`` (a trial's probe)."""

    mode: str
    count: int


class Trials:
    """The trials of ``modes`` and the mode of the runs outside them. See [Note: trials that
    cost a fraction of a call].

    Args:
        modes: the modes compared, the first being the one others must beat by
            ``TRIAL_MARGIN`` (empty: no trials).
        choice: the mode before any trial.
        cores: the program's cores (a side by side probe computes one micro-batch on each).

    Attributes:
        whole: the modes a trial runs whole calls in.
        probed: the modes a trial times on a call's first micro-batches.
        length: the runs of one trial.
        choice: the mode of the runs outside a trial.
        picked: what the last trial chose (None before the first).
        measured: the last trial's fastest time of each mode it ran or probed (s per mb).

    >>> trials = Trials(("split", "lent", "one thread"), "lent", cores=2)
    >>> trials.observe(0.5)  # the first run: not a trial's
    >>> trials.mode(), trials.probe(10)
    ('split', Probe(mode='one thread', count=1))
    >>> for seconds, probe in ((0.5, 0.6), (0.4, 0.7), (0.5, None), (0.4, None)):
    ...     trials.observe(seconds, probe)
    >>> trials.choice
    'lent'
    """

    def __init__(self, modes: tuple[str, ...], choice: str, cores: int) -> None:
        self.whole = tuple(m for m in modes if m not in PROBED) or modes[:1]
        self.probed = tuple(m for m in modes if m not in self.whole)
        self.length = TRIAL_RUNS * max(len(self.whole), len(self.probed)) if modes else 0
        self.choice = choice
        self.picked: str | None = None
        self._cores = cores
        self._runs = 0
        self._start = 0  # the run that starts the current trial period
        self._period = TRIAL_EVERY  # runs from this trial to the next
        self._times: dict[str, float] = {}  # mode -> its fastest time in this trial: s per mb
        self._reference: float | None = None  # the chosen mode's median after the trial
        self._recent: deque[float] = deque(maxlen=DRIFT_RUNS)
        self._skip: set[str] = set()  # modes the current trial leaves out
        self._used: float | None = None  # the share of the cores the last run kept busy
        self.measured: dict[str, float] = {}  # the last trial's times per mode: s per mb

    def _phase(self) -> int:
        """The next run's place in the current trial: 1 to ``length``, or 0 outside one."""
        phase = self._runs - self._start
        return phase if self._runs and 1 <= phase <= self.length else 0

    def mode(self) -> str:
        """The mode of the next run (of its micro-batches after any probe)."""
        phase = self._phase()
        if not phase:
            return self.choice
        mode = self.whole[(phase - 1) % len(self.whole)]
        return self.whole[0] if self._ruled_out(mode) else mode

    def _probed(self, phase: int) -> str | None:
        """The mode probed in the trial's run ``phase``: each ``TRIAL_RUNS`` times, in turn."""
        if not 1 <= phase <= TRIAL_RUNS * len(self.probed):
            return None
        return self.probed[(phase - 1) % len(self.probed)]

    def probe(self, count: int) -> Probe | None:
        """The probe of the next run, of ``count`` micro-batches (None: none)."""
        mode = self._probed(self._phase())
        if mode is None:
            return None
        size = self._cores if mode == "side by side" else 1
        if size > PROBE_SHARE * count or self._ruled_out(mode):
            return None
        return Probe(mode, size)

    def _ruled_out(self, mode: str) -> bool:
        """Whether this trial runs ``mode`` no more: the last run kept less than ``UNDERUSED``
        of the cores busy, ``mode`` measured ``RULED_OUT`` times as slow as the fastest whole
        mode, or skipped by a trial the machine's load started."""
        if mode == self.whole[0]:
            return False
        if self._used is not None and self._used < UNDERUSED:
            return True
        return mode in self._skip or _slow(self._times, mode, self.whole)

    def observe(
        self,
        seconds_per_mb: float | None,
        probe_s_per_mb: float | None = None,
        used: float | None = None,
    ) -> None:
        """Record one run: its time per micro-batch after the probe, the probe's, and the share
        of the cores its compute kept busy."""
        phase, mode = self._phase(), self.mode()
        probed = self._probed(phase)
        self._runs += 1
        if used is not None:
            self._used = used
        if phase:
            for timed, seconds in ((mode, seconds_per_mb), (probed, probe_s_per_mb)):
                if timed is not None and seconds is not None:
                    self._times[timed] = min(self._times.get(timed, seconds), seconds)
            if phase == self.length:
                if self.whole[0] in self._times:
                    self._pick()
                self.measured, self._times, self._skip = dict(self._times), {}, set()
        elif seconds_per_mb is not None:
            self._watch(seconds_per_mb)
        if self._runs - self._start >= self._period:
            self._start = self._runs

    def _pick(self) -> None:
        """Take the trial's fastest mode if within ``TRIAL_MARGIN`` of the first's, else the
        first; the next trial comes twice as late if it kept the last one's choice."""
        first = self.whole[0]
        others = [m for m in self._times if m != first]
        mode = first
        if others:
            best = min(others, key=self._times.__getitem__)
            if self._times[best] <= TRIAL_MARGIN * self._times[first]:
                mode = best
        kept = mode == self.picked
        self._period = min(2 * self._period, TRIAL_EVERY_MAX) if kept else TRIAL_EVERY
        self.picked = self.choice = mode
        self._reference = None
        self._recent.clear()

    def _watch(self, seconds_per_mb: float) -> None:
        """A run in the chosen mode: its first ``DRIFT_RUNS`` after a trial set the reference
        (their median); a median of the last ``DRIFT_RUNS`` ``DRIFT`` times away from it starts
        a trial at the next run, without the modes the last trial measured far slower where
        the machine got busier."""
        if not self.picked:
            return
        self._recent.append(seconds_per_mb)
        if len(self._recent) < DRIFT_RUNS:
            return
        median = statistics.median(self._recent)
        if self._reference is None:
            self._reference = median
            self._recent.clear()
            return
        ratio = median / self._reference
        if 1 / DRIFT <= ratio <= DRIFT:
            return
        self._start, self._period = self._runs - 1, TRIAL_EVERY
        self._reference = None
        self._recent.clear()
        busier = ratio > DRIFT
        modes = (*self.whole[1:], *self.probed)
        self._skip = {m for m in modes if busier and _slow(self.measured, m, self.whole)}


def _slow(times: dict[str, float], mode: str, whole: tuple[str, ...]) -> bool:
    """Whether ``times`` has ``mode`` ``RULED_OUT`` times as slow as the fastest whole mode."""
    measured = [times[m] for m in whole if m in times]
    return mode in times and bool(measured) and times[mode] > RULED_OUT * min(measured)
