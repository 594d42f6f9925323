"""A failed save does not end the run (issue 41, Megatron-LM #1435): the policy the Checkpointer follows.

Every rank raises the same CheckpointError for a failed save (core/checkpointing/agreement.py: the
ranks agree on each step's outcome, rank 0 removes the partial iter_X.tmp/, the tracker still names
the last good checkpoint), so every rank takes the same decision here without talking: a periodic
save's failure is one warning line and training goes on (the next --save-interval tries again);
--max-consecutive-save-failures in a row, or a failed final save (nothing would retry it), end the
run with the cause (exit code 2). An --async-save's outcome is known when it is waited for (at the
next save or the end), so it is counted then.
"""
from ...core.checkpointing import CheckpointError
from ..observability.log import print_rank_0


class SaveFailures:
    """Consecutive failed saves, and what each failure means for the run."""

    def __init__(self, limit):
        self.limit, self.in_a_row = limit, 0
        self.in_flight = False  # an --async-save submitted and not yet waited for

    def attempt(self, save, final, saver=None):
        """save() (which submits to `saver` when given); -> whether it was written (or submitted). The
        previous background save is waited for and counted first."""
        self.settle(saver, final=False)
        try:
            save()
        except CheckpointError as e:
            self.failed(e, final)
            return False
        if saver is None:
            self.succeeded()
        self.in_flight = saver is not None
        return True

    def settle(self, saver, final):
        """Wait for a background save in flight and count its outcome."""
        if not self.in_flight:
            return
        self.in_flight = False
        try:
            saver.wait()
        except CheckpointError as e:
            self.failed(e, final)
            return
        self.succeeded()

    def startup_line(self):
        return (f"> checkpoint saves: a failed periodic save is one warning line and training goes on (the next "
                f"interval retries); {self.limit} in a row end the run (--max-consecutive-save-failures), as does a "
                f"failed final save")

    def succeeded(self):
        self.in_a_row = 0

    def failed(self, error, final):
        """After a save raised `error` (CheckpointError) on every rank: a warning line, or (the limit reached,
        or `final`) a CheckpointError naming the cause, raised."""
        self.in_a_row += 1
        if final:
            raise CheckpointError(f"{error} (the final save: nothing retries it)") from None
        if self.in_a_row >= self.limit:
            raise CheckpointError(f"{self.in_a_row} checkpoint saves in a row failed (--max-consecutive-save-failures "
                                  f"{self.limit}); the last: {error}") from None
        print_rank_0(f"> warning: {error}; training goes on, the next save interval tries again "
                     f"({self.in_a_row} of {self.limit} failures in a row: --max-consecutive-save-failures)")
