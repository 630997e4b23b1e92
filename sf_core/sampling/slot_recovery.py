"""What a rollout worker does when its env slots fail or run short (--env_service): the split's trajectory in
progress is dropped and its envs start new episodes on other slots, or the split waits (parked), holding no slot,
until a slot is healthy, free or added. A mixin of `RolloutWorker` (sf_core/sampling/rollout_worker.py), whose
state it uses: runners, pool, waits, parked, stopping.
"""

from __future__ import annotations

import logging

from sf_core.contracts.component import guarded
from sf_core.contracts.sample import RowOrigin
from sf_core.sampling.split_runner import EnvStepError

log = logging.getLogger("sf_core")


class SlotRecovery:
    def _recover_split(self, split: int, error: Exception) -> None:
        """An env slot failed mid-trajectory (whatever --env_fault_policy says: a service is expected to
        fail now and then). The split's trajectory in progress is dropped, never sent to the learner, and
        its envs start new episodes, on another slot for the env that lost its own. With no healthy slot
        free the split waits (parked) and `retry_parked` tries again every recheck interval."""
        if self.stopping:  # the pool closed under a step still queued: nothing failed
            return
        self.waits.failed()
        log.warning("%s: %s; split %d drops its unfinished trajectory and continues on another slot",
                    self.name, error, split)
        self.beat("recovering env slots")
        failure = self._restart_episodes(split)
        if failure is not None:
            self._park(split, failure)
            return
        self._request(split, RowOrigin.AFTER_RESET)

    def _restart_episodes(self, split: int) -> EnvStepError | None:
        """New episodes in every env of the split; the slot failure if no healthy slot is free (any
        other error propagates)."""
        try:
            self.runners[split].restart_episodes()
        except EnvStepError as exc:
            if not self._is_slot_failure(exc):
                raise
            return exc
        return None

    def _park(self, split: int, error: Exception) -> None:
        """No slot for every env of the split: it waits, holding none, so that its envs' slots serve another
        split meanwhile (a split steps only with all of its envs)."""
        assert self.pool is not None  # only splits on env slots park
        self.runners[split].let_go_slots()
        self.waits.park(split)
        if self.pool.waits_on_servers():
            log.warning("%s: split %d waits for a healthy env slot (%s)", self.name, split, error)
        else:  # more envs than slots (planned for slots to come, or some drained): nothing is down
            log.info("%s: split %d waits for a free env slot: this worker has fewer slots than envs [%s]; it runs "
                     "when slots are added", self.name, split, self.pool.summary())

    @guarded
    def retry_parked(self) -> None:
        """Every recheck interval: parked splits try to get slots again (the pool health-checks failed
        ones meanwhile, re-admitting those that answer, and takes in slots added). Training stops only after
        --env_service_down_timeout without any while slots are failed; waiting for slots to be added (no slot
        failed) has no limit."""
        if self.stopping:
            return
        for split in sorted(self.parked):
            self.beat("waiting for env slots")
            failure = self._restart_episodes(split)
            if failure is not None:
                self.runners[split].let_go_slots()
                self.waits.still_waiting(split, self.pool, failure)
                continue
            log.info("%s: split %d runs again after %.1fs without a slot", self.name, split, self.waits.resumed(split))
            self._request(split, RowOrigin.AFTER_RESET)
