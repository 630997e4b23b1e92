"""Values the typed config derives from its flags (`Config` in schema.py inherits them): what several components
read the same way, written once."""

from __future__ import annotations


class DerivedValues:
    # the flags these read (fields of Config)
    batch_size: int
    num_batches_per_epoch: int
    rollout: int
    recurrence: int
    use_rnn: bool
    core_custom: str
    num_envs_per_worker: int
    worker_num_splits: int
    async_rl: bool
    num_batches_to_accumulate: int
    torch_threads: int
    learner_torch_threads: int
    recompute_values: bool
    actor_critic_share_weights: bool
    split_actor_critic: bool

    def dataset_size(self) -> int:
        """Samples the learner consumes per training iteration."""
        return self.batch_size * self.num_batches_per_epoch

    def recurrence_length(self) -> int:
        """Steps the learner unrolls per sequence (1: every sample on its own)."""
        recurrent = self.rollout if self.use_rnn or self.core_custom else 1
        return self.recurrence if self.recurrence != -1 else recurrent

    def envs_per_split(self) -> int:
        return self.num_envs_per_worker // self.worker_num_splits

    def datasets_ahead(self) -> int | None:
        """Datasets sampling may collect ahead of the one in training (its slots held until trained on): 0
        without --async_rl, --num_batches_to_accumulate with it; None: slots freed once copied (no bound)."""
        return (self.num_batches_to_accumulate or None) if self.async_rl else 0

    def learner_threads(self) -> int:
        """torch threads of a learner process (a rank of a learner group too)."""
        return self.learner_torch_threads or self.torch_threads

    def most_torch_threads(self) -> int:
        """The most torch threads any component process runs (how its processes may start: start_method.py)."""
        return max(self.torch_threads, self.learner_threads())

    def values_at_learner(self) -> bool:
        """Inference acts with the actor alone, the learner recomputes the values (--recompute_values)."""
        own = not self.actor_critic_share_weights or self.split_actor_critic
        return self.recompute_values and own and not (self.use_rnn or self.core_custom)
