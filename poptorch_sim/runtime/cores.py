"""How the machine's cores are shared between the IPU workers of one program: threads per IPU.

[Note: cores follow the work]
On an IPU every stage has its own tiles; on a CPU the simulated IPUs share the cores, and no
fixed split serves every model. An equal split (4 workers at 1 thread on 2 cores) leaves a core
idle whenever one worker computes alone: in the pipeline's fill and drain, and all the time
when one stage holds most of the work (GPT-2's and Llama's LM heads on IPU 0). Giving every
worker all cores oversubscribes the machine when several compute at once, and libgomp's team
threads spin at their barriers while other workers want the cores. So a pipeline's workers
borrow the cores one compute action (a stage's forward, backward or optimizer step on one
micro-batch) at a time:

    policy   when                                      threads of a compute action
    fixed    threads_per_ipu / POPTORCH_SIM_THREADS_   that number, never changed
             PER_IPU given
    serial   sharded (one IPU computes at a time)      every core
    lent     pipelines (stages compute at once)        the cores no other worker is computing
                                                       on, less one per worker waiting; none
                                                       free: wait until one is given back
                                                       (or, as trials below decide, a split
                                                       by measured work, or every core on
                                                       one thread for all stages)

Under ``lent`` the program never computes on more threads than the caller's intra-op count
(``cores``), and a worker ready to compute never finds a core idle: a stage computing alone runs
on every core, two at once share them, and a fifth worker waits for a core instead of
time-slicing one. A count holds for a whole action: a worker that started on one core keeps one
when the other is given back before it ends, and two balanced stages can take turns on both
cores (one starts alone, takes both, and the other waits for it) instead of computing side by
side on one each; the trials below catch where that costs. When several workers wait, the one whose IPU did the most work first gets
the core given back (the pipeline's bottleneck: e.g. the LM head's IPU). That work, ``cost``,
is the CPU time each worker's thread spent in its compute actions during a run times the threads
it ran them with (thread-seconds: what the work costs whatever the split; waits for
activations, gradients, cores or the GIL are not counted), smoothed over runs (each run counts
half; the first run is not measured: one-off costs, first allocations, lazy imports).

Lending assumes the cores are the program's. On a machine loaded by other processes a
two-thread op waits at its barriers for whichever of its threads the scheduler has parked, and
single-threaded workers can do better (measured on the shared 2-core build machine at load
average 4.2-4.5: Llama inference pipelined 0.82 of eager with lending, 0.91 on the equal split;
at load 2.5 BERT training 1.26 lent, 0.79 on the split), and a fixed split by measured work
can beat lending where one stage holds most of it (GPT-2 at 84% on IPU 0, dev-zen4, quiet:
training 5,575 ms on the split IPU 0: 2, IPUs 1-3: 1, 6,292 ms lent). And where one stage
holds most of the work even lending leaves the pipeline waiting on it, while one thread running
every stage on every core, one micro-batch at a time (the sharded schedule's order), computes
as eager PyTorch does (as a sharded program always runs on the CPU: See [Note: one thread for a sharded
program]; Llama training, dev-zen4, quiet, the trial's runs: 5,268-5,367 ms on the split,
4,369-4,533 ms lent, 3,796-4,071 ms on one thread, ``benchmarks/RESULTS.md``). So the runtime tries the
modes of ``MODES``: after the first run (lent, not judged: one-off costs), a trial of
``TRIAL_RUNS`` runs each of the split by measured work (``apportion``: ``round(cores * share)``
threads each, at least 1; the equal split before anything is measured) and lending, whose
first micro-batches probe one thread (where the runtime can: more than one IPU, all on the
CPU) and, for inference, micro-batches side by side (See [Note: micro-batches side by side]);
the runs after take the mode whose fastest time per micro-batch was fastest if that took at
most ``TRIAL_MARGIN`` of the split's fastest, else the split (which follows the smoothed work).
A sharded program, on one thread, has trials only where side by side is offered: whole runs on
one thread, each probing side by side. When the trials come, how a probe is timed without a
whole call in a slower mode, and how a choice made on a busy machine changes once it is quiet:
See [Note: trials that cost a fraction of a call] (``trials.py``).
Balanced pipelines mostly keep the split (same machine: BERT training 825 vs 905 ms, ViT
training 421 vs 476 ms, split vs lent), and lending pays where a stage holds most of the work and
the split cannot give it a second core (Llama, 66-71% on IPU 0: 3,949 ms on the split, 2,729 ms
lent, xeon-avx512 pinned to 2 cores). Runs on one thread or side by side leave ``cost`` and
``mean_threads`` alone: such a thread's compute time is every IPU's at once.

Numbers: the same ops run on the same values in the same order, with the same schedule and the
same actions; only the number of threads an op may use changes, which can change the last bits
of a reduction exactly as ``torch.set_num_threads`` does in eager PyTorch. The execution trace
shows each worker's thread count as a counter track (``IPU i threads``), stepping at each
compute action that runs on a different count; ``CoreShare.describe`` gives each worker's mean
threads over its compute time in the last run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from .trials import TRIAL_EVERY, TRIAL_EVERY_MAX, TRIAL_MARGIN, TRIAL_RUNS, Probe, Trials

__all__ = [
    "CoreBudget",
    "CoreShare",
    "apportion",
    "MODES",
    "POLICIES",
    "TRIAL_EVERY",
    "TRIAL_EVERY_MAX",
    "TRIAL_MARGIN",
    "TRIAL_RUNS",
]

POLICIES = ("fixed", "serial", "lent")
MODES = ("split", "lent", "one thread", "side by side")  # how one run of a program computes
SMOOTHING = 0.5  # weight of the newest run in the smoothed cost
WARMUP_RUNS = 1  # runs not measured
PATIENCE_S = 1.0  # the longest a worker waits for a lent core before taking one anyway


def apportion(costs: Mapping[int, float], cores: int) -> dict[int, int]:
    """Threads per IPU in proportion to its cost: ``round(cores * cost / total)``, in [1, cores].

    Args:
        costs: IPU -> measured cost (any unit; only the shares matter).
        cores: the threads the program may use in all.

    Returns:
        IPU -> threads. Without any cost measured, the equal split ``cores // IPUs``.

    >>> apportion({0: 85.0, 1: 5.0, 2: 5.0, 3: 5.0}, cores=2)
    {0: 2, 1: 1, 2: 1, 3: 1}
    >>> apportion({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, cores=16)
    {0: 4, 1: 4, 2: 4, 3: 4}
    """
    total = sum(costs.values())
    if total <= 0:
        return {ipu: max(1, cores // max(1, len(costs))) for ipu in costs}
    return {
        ipu: min(cores, max(1, int(cores * cost / total + 0.5))) for ipu, cost in costs.items()
    }


class CoreBudget:
    """The cores of one program, lent to its IPU workers one compute action at a time.

    See [Note: cores follow the work]. ``take`` returns the free cores less one for each other
    worker waiting (at least 1); with none free it waits until one is given back, serving the
    waiter with the largest ``priority`` first (then the lowest IPU). A wait longer than
    ``patience_s`` takes one core anyway, so an action that blocks on another worker (a user's
    op) cannot stall the program.

    Args:
        cores: the threads the program may use in all.
        priority: IPU -> weight (read at each wait; the caller keeps it up to date).
        patience_s: the longest a ``take`` waits.

    >>> budget = CoreBudget(2)
    >>> budget.take(0)  # computing alone: every core
    2
    >>> budget.give(0)
    >>> budget.held
    {}
    """

    def __init__(
        self,
        cores: int,
        priority: Mapping[int, float] | None = None,
        patience_s: float = PATIENCE_S,
    ) -> None:
        self.cores = max(1, cores)
        self.priority: Mapping[int, float] = priority if priority is not None else {}
        self.patience_s = patience_s
        self._held: dict[int, int] = {}
        self._waiting: set[int] = set()
        self._changed = threading.Condition(threading.Lock())

    @property
    def held(self) -> dict[int, int]:
        """IPU -> cores it computes on now (a snapshot)."""
        with self._changed:
            return dict(self._held)

    def _free(self) -> int:
        return self.cores - sum(self._held.values())

    def _first(self, ipu: int) -> bool:
        rank = self.priority.get
        return all((rank(ipu, 0.0), -ipu) >= (rank(o, 0.0), -o) for o in self._waiting)

    def take(self, ipu: int) -> int:
        """Cores for ``ipu``'s next compute action (at least 1), waiting for one if none is free.

        Raises:
            RuntimeError: ``ipu`` already holds cores (``give`` was not called).
        """
        with self._changed:
            if ipu in self._held:
                raise RuntimeError(f"IPU {ipu} takes cores while it holds {self._held[ipu]}")
            self._waiting.add(ipu)
            deadline = time.monotonic() + self.patience_s
            try:
                while self._free() < 1 or not self._first(ipu):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
            finally:
                self._waiting.discard(ipu)
            count = max(1, self._free() - len(self._waiting))
            self._held[ipu] = count
            self._changed.notify_all()  # the next waiter may be served from what is left
        return count

    def give(self, ipu: int) -> None:
        """``ipu``'s action ended: its cores are free again."""
        with self._changed:
            self._held.pop(ipu, None)
            self._changed.notify_all()


class CoreShare:
    """The intra-op threads of each IPU worker of one program. See [Note: cores follow the work].

    Args:
        ipus: the program's IPUs.
        cores: the threads the program may use in all (the caller's intra-op thread count).
        fixed: threads per IPU pinned by the caller (then nothing is lent; nor with one core).
        serial: only one IPU computes at a time (sharded execution): each gets every core.
        one_thread: the runtime can run every stage on one worker thread (a ``serial`` program
            then always does; the trials of a ``lent`` program try that mode too).
        side_by_side: the runtime can compute micro-batches side by side, one worker thread per
            core (See [Note: micro-batches side by side]): the trials try that mode too, and a
            ``serial`` program's trials compare it with one thread.

    Attributes:
        threads: IPU -> the worker's threads when it does not borrow (under ``lent``: the split
            by measured work, ``apportion(cost, cores)``).
        budget: the ``CoreBudget`` the workers borrow from (``lent`` only, else None).
        cost: IPU -> smoothed thread-seconds of compute per run (the budget's priorities).
        mean_threads: IPU -> threads per compute second in the last measured run.
        one_thread: as the argument.
        trials: the modes the trials compare (``lent``, or ``serial`` with side by side; else
            none).
        choice: the mode of the runs outside a trial (one of ``MODES``; ``split`` when nothing
            is lent).

    >>> share = CoreShare([0, 1], cores=2)
    >>> share.policy, share.threads, share.mode()
    ('lent', {0: 1, 1: 1}, 'lent')
    >>> for _ in range(2):  # the warm-up run is not measured
    ...     share.observe({0: 0.9, 1: 0.1}, {0: 1.5, 1: 1.0})
    >>> share.cost, share.describe()
    ({0: 0.9, 1: 0.1}, 'lent 2 cores (mean threads IPU 0: 1.5, IPU 1: 1.0; work IPU 0: 90%, IPU 1: 10%)')
    """

    def __init__(
        self,
        ipus: list[int],
        cores: int,
        fixed: int | None = None,
        serial: bool = False,
        one_thread: bool = False,
        side_by_side: bool = False,
    ) -> None:
        self.cores = max(1, cores)
        self.budget: CoreBudget | None = None
        self.cost: dict[int, float] = {}
        self.mean_threads: dict[int, float] = {}
        self.trials: tuple[str, ...] = ()
        self.one_thread = one_thread
        if fixed is not None or self.cores == 1:  # one core: nothing to lend
            self.policy = "fixed"
            self.threads = dict.fromkeys(ipus, fixed or 1)
        elif serial:
            self.policy = "serial"
            self.threads = dict.fromkeys(ipus, self.cores)
            self.trials = ("one thread", "side by side") if side_by_side else ()
        else:
            self.policy = "lent"
            self.threads = apportion(dict.fromkeys(ipus, 0.0), self.cores)
            self.budget = CoreBudget(self.cores, self.cost)
            offered = {"one thread": one_thread, "side by side": side_by_side}
            self.trials = tuple(m for m in MODES if offered.get(m, True))
        choice = "lent" if self.budget is not None else "split"
        if self.trials and self.budget is None:
            choice = self.trials[0]
        self._trials = Trials(self.trials, choice, self.cores)
        self._runs = 0

    @property
    def choice(self) -> str:
        """The mode of the runs outside a trial."""
        return self._trials.choice

    def mode(self) -> str:
        """How the next run computes (after its probe, if any): ``split`` (each worker on its
        ``threads``), ``lent`` (compute actions borrow from ``budget``), ``one thread`` (one
        worker runs every stage on every core) or ``side by side`` (one worker per core, each on
        whole micro-batches)."""
        return self._trials.mode()

    def probe(self, count: int) -> Probe | None:
        """The mode the next run of ``count`` micro-batches computes its first ones in, and how
        many (a trial's probe; None: none). See [Note: trials that cost a fraction of a call]."""
        return self._trials.probe(count)

    def observe(
        self,
        cost_s: Mapping[int, float],
        mean_threads: Mapping[int, float],
        seconds_per_mb: float | None = None,
        probe_s_per_mb: float | None = None,
        used: float | None = None,
    ) -> None:
        """Record one run: each IPU worker's thread-seconds of compute and its mean threads, and
        for the trials the run's wall time per micro-batch after its probe, the probe's, and
        the share of the cores its compute kept busy (thread-seconds over wall time times
        ``cores``)."""
        mode = self.mode()
        self._trials.observe(seconds_per_mb, probe_s_per_mb, used)
        self._runs += 1
        if mode in ("one thread", "side by side"):
            return  # such a thread's work is not one IPU's
        self.mean_threads = dict(mean_threads)
        if self._runs <= WARMUP_RUNS:
            return
        for ipu, spent in cost_s.items():
            previous = self.cost.get(ipu)
            self.cost[ipu] = (
                spent if previous is None else (SMOOTHING * spent + (1 - SMOOTHING) * previous)
            )
        if self.budget is not None and len(self.cost) == len(self.threads):
            self.threads = apportion(self.cost, self.cores)

    def describe(self) -> str:
        """One line for logs: the policy and the split (under ``lent``, what the last run used)."""
        split = ", ".join(f"IPU {ipu}: {n}" for ipu, n in sorted(self.threads.items()))
        others = [{"lent": "lending"}.get(m, m) for m in self.trials if m != self.choice]
        slower = " and ".join(filter(None, (", ".join(others[:-1]), *others[-1:])))
        if self.choice == "side by side":
            return f"micro-batches side by side on {self.cores} threads ({slower} measured slower)"
        if self.policy != "lent":
            if self.policy == "serial" and (self.one_thread or self.trials):  # on one thread
                measured = f" ({slower} measured slower)" if self._trials.picked else ""
                return f"one thread on {self.cores} cores{measured}"
            return f"{self.policy} split of {self.cores} cores ({split})"
        if self.choice != "lent":
            if self.choice == "one thread":
                return f"one thread on {self.cores} cores ({slower} measured slower)"
            return f"measured split of {self.cores} cores ({split}; {slower} measured slower)"
        used = ", ".join(f"IPU {i}: {n:.1f}" for i, n in sorted(self.mean_threads.items()))
        total = sum(self.cost.values())
        work = ", ".join(
            f"IPU {i}: {100 * c / total:.0f}%" for i, c in sorted(self.cost.items()) if total > 0
        )
        parts = [f"mean threads {used}" if used else "", f"work {work}" if work else ""]
        detail = "; ".join(p for p in parts if p)
        return f"lent {self.cores} cores" + (f" ({detail})" if detail else "")
