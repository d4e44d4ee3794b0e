"""How the machine's cores are shared between the IPU workers of one program: threads per IPU.

[Note: cores follow the work]
On an IPU every stage has its own tiles; on a CPU the simulated IPUs share the cores, and an
equal fixed split serves only balanced models. GPT-2 with its 50,257-wide LM head on IPU 0 does
most of its work there: with 2 cores and 4 workers at 1 thread each, IPU 0 computes on one core
while the other mostly idles. Giving every worker all cores instead oversubscribes balanced
pipelines (BERT), whose stages all compute at once, and libgomp's team threads spin at their
barriers while other workers want the cores. So the split follows each IPU's measured share of
the work:

    policy     when                                     threads of IPU i
    fixed      threads_per_ipu / POPTORCH_SIM_THREADS_  that number, never changed
               PER_IPU given
    serial     sharded (one IPU computes at a time)     every core
    measured   pipelines (stages compute at once)       first run: cores // IPUs (at least 1);
                                                        then round(cores * cost_i / sum cost),
                                                        at least 1, at most cores

``cost_i`` is the CPU time IPU i's worker thread spent in its forwards, backwards and optimizer
steps during a run, times the threads it ran them with (thread-seconds: what the work costs
whatever the split; waits for activations, gradients or the GIL are not counted), smoothed
over runs (each run counts half). The first run is not measured (one-off costs: first
allocations, lazy imports). A new split takes effect when two successive runs propose it, so
noise near a rounding edge does not flip it back and forth; it is applied by each worker at the
start of its next run, before its first action, so the schedule, the actions and their order
are the same as with a fixed split. Rounding keeps a balanced pipeline at the equal split
(4 IPUs of 25% on 2 cores: 0.5 -> 1 thread each) and gives a dominant stage the cores the
others leave idle (85% on 2 cores: 1.7 -> 2 threads; 14 of 16).

Numbers: the same ops run on the same values in the same order; only the number of threads an
op may use changes, which can change the last bits of a reduction exactly as
``torch.set_num_threads`` does in eager PyTorch. The execution trace shows each worker's thread
count as a counter track (``IPU i threads``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CoreShare", "apportion", "POLICIES"]

POLICIES = ("fixed", "serial", "measured")
SMOOTHING = 0.5  # weight of the newest run in the smoothed cost
WARMUP_RUNS = 1  # runs not measured


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


class CoreShare:
    """The intra-op threads of each IPU worker of one program, kept up to date from measurements.

    See [Note: cores follow the work].

    Args:
        ipus: the program's IPUs.
        cores: the threads the program may use in all (the caller's intra-op thread count).
        fixed: threads per IPU pinned by the caller (then the split never changes).
        serial: only one IPU computes at a time (sharded execution): each gets every core.

    >>> share = CoreShare([0, 1], cores=2)
    >>> share.threads, share.policy
    ({0: 1, 1: 1}, 'measured')
    >>> [share.observe({0: 0.9, 1: 0.1}) for _ in range(3)]  # warm-up, proposal, confirmation
    [False, False, True]
    >>> share.threads
    {0: 2, 1: 1}
    """

    def __init__(
        self, ipus: list[int], cores: int, fixed: int | None = None, serial: bool = False
    ) -> None:
        self.cores = max(1, cores)
        if fixed is not None:
            self.policy = "fixed"
            self.threads = dict.fromkeys(ipus, fixed)
        elif serial:
            self.policy = "serial"
            self.threads = dict.fromkeys(ipus, self.cores)
        else:
            self.policy = "measured"
            self.threads = apportion(dict.fromkeys(ipus, 0.0), self.cores)
        self.cost: dict[int, float] = {}
        self._runs = 0
        self._proposal: dict[int, int] | None = None

    def observe(self, cpu_s: Mapping[int, float]) -> bool:
        """Record one run: each IPU worker's CPU seconds in forward, backward and step.

        Returns:
            Whether ``threads`` changed (the workers take the new split on their next run).
        """
        self._runs += 1
        if self.policy != "measured" or self._runs <= WARMUP_RUNS:
            return False
        for ipu, seconds in cpu_s.items():
            spent = seconds * self.threads[ipu]
            previous = self.cost.get(ipu)
            self.cost[ipu] = (
                spent if previous is None else (SMOOTHING * spent + (1 - SMOOTHING) * previous)
            )
        proposal = apportion(self.cost, self.cores)
        if proposal == self.threads:
            self._proposal = None
            return False
        if proposal != self._proposal:
            self._proposal = proposal
            return False
        self.threads, self._proposal = proposal, None
        return True

    def describe(self) -> str:
        """One line for logs: the policy and the split."""
        split = ", ".join(f"IPU {ipu}: {n}" for ipu, n in sorted(self.threads.items()))
        return f"{self.policy} split of {self.cores} cores ({split})"
