"""One run id, one run, one terminal (PROTOCOL §9 "Identities are not reused").

An `input.start` whose `run_id` this driver has already run, is running or holds in its queue is
answered `failed` / `run.duplicate`, across a driver restart too: the journal's `runs` table (every run
is journaled there as started before its `run.started`, and a queued run that is cancelled too) is the
durable memory, bounded like that table (the newest `RUNS_KEPT` ended runs, plus every active one); the
queue holds the runs waiting; this module holds the claims of commands on their way in.

The claim is one synchronous step (the journal's `runs` table is read on the event loop, one indexed
row, as the command desk reads a command's stored status): two `input.start`s of one run id in a burst
cannot both pass the check, and a burst of queued runs reaches the queue's reservation in arrival
order (a read in a worker thread let later commands overtake earlier ones there). A command refused without running
or holding its run (`driver.run_active`, `driver.queue_full`, `driver.busy`, a failure) gives its
claim back: a retry with the same run id is not a duplicate.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from driver.queue.schema import RUNS_KEPT

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

DUPLICATE = "run.duplicate"


class RunIds:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        # Run ids claimed in this process, newest last; bounded like the journal's runs table, which
        # remembers the older ones (a claim that is dropped here is a run journaled there, or held).
        self._claimed: OrderedDict[str, None] = OrderedDict()

    def _live(self, run_id: str) -> bool:
        run = self.k.run
        return (run is not None and run.run_id == run_id) or self.k.runs.queue.find(run_id) is not None

    def claim(self, run_id: str) -> bool:
        """Take `run_id` for a new run (False: it is not new). No await: check and take are one step."""
        if run_id in self._claimed or self._live(run_id):
            return False
        known = self.k.journal.run_known(run_id)
        self._claimed[run_id] = None  # a known one stays claimed: it is a duplicate for good
        while len(self._claimed) > RUNS_KEPT:
            self._claimed.popitem(last=False)
        return not known

    def release(self, run_id: str) -> None:
        """The command that claimed `run_id` neither ran nor holds its run."""
        self._claimed.pop(run_id, None)
