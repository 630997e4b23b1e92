"""Learner: trains on each dataset the batcher prepares and publishes the new weights.

Signals in: batch_ready, save_checkpoint, stop. Out: batch_consumed (after the new weights are
published), checkpoint_saved, report (sf_core/contracts/signals.py).

The algorithm is a dataflow graph (`sf_core.algo.algorithms`, run by `sf_core.algo.executor.GraphExecutor`): this module
only moves data, keeps the policy version, and saves checkpoints.

Each policy has its own learner, with its own hyperparameters (the flags, --policy_hyperparams, or
what PBT set: `pbt_replace`), saved in its checkpoints and restored on resume. With --num_learners=N the
learner is rank 0 of a learner group (sf_core/learning/group/): ranks 1..N-1 train beside it with the
same `Trainer`, each on its share of every dataset.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

import gymnasium as gym
import torch

from sf_core.algo.adam import make_adam
from sf_core.algo.executor import GraphExecutor, Held, Release
from sf_core.algo.graph import Context, ModelSlot, build_graph
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.params import LearningParams
from sf_core.algo.meshes import ModelHooks
from sf_core.algo.placement import place_models
from sf_core.algo.registry import AlgorithmBuilder, build_algorithm
from sf_core.config import NUMERIC_LEARNING_FLAGS, Config
from sf_core.contracts.buffers import DatasetBuffers, SharedWeights
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.names import per_policy
from sf_core.contracts.sample import BATCH_KEYS
from sf_core.contracts.signals import BATCH_CONSUMED, CHECKPOINT_SAVED, COMPONENT_ERROR, REPORT, LearnerReport
from sf_core.learning.group.link import GroupError
from sf_core.records import checkpoint
from signal_slot.signal_slot import EventLoop, Timer

if TYPE_CHECKING:
    from sf_core.learning.group.link import GroupLink, GroupSpec


def learner_name(policy: int, num_policies: int) -> str:
    return per_policy("learner", policy, num_policies)


def hyperparams_of(cfg: Config) -> dict[str, float]:
    """The values of the numeric learning flags: what --policy_hyperparams sets and PBT copies and mutates."""
    return {name: float(getattr(cfg, name)) for name in NUMERIC_LEARNING_FLAGS}


class Trainer:
    """The model, its optimizer and the algorithm's graph, built from the shared weights (and a checkpoint
    on resume). The learner trains with one; so does every other rank of a learner group, built the same
    way from the same weights (sf_core/learning/group/)."""

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec, device: str,
                 seed: int, algorithm_builder: AlgorithmBuilder, policy: int = 0):
        self.cfg, self.obs_space, self.action_space, self.spec = cfg, obs_space, action_space, spec
        self.device, self.seed, self.algorithm_builder, self.policy = device, seed, algorithm_builder, policy
        self.hyperparams = hyperparams_of(cfg.policy_config(policy))
        self.models: dict[str, ModelSlot] = {}
        self.executor: GraphExecutor | None = None
        self.link: GroupLink | None = None

    def on_device(self, device: str) -> "Trainer":
        """A trainer like this one, not built yet, on `device`: another rank of a learner group."""
        return Trainer(self.cfg, self.obs_space, self.action_space, self.spec, device, self.seed,
                       self.algorithm_builder, self.policy)

    def build(self, weights: SharedWeights | None, state: dict | None, on_minibatch: Callable[[], None] = lambda: None,
              link: GroupLink | None = None) -> int:
        """Returns the policy version of the weights it starts from. `link`: this rank's place in a learner
        group, whose rank 0 then hands every rank its weights and optimizer state, so all start identical (a
        rank on another machine has no `weights` to load: it starts from rank 0's alone)."""
        torch.manual_seed(self.seed)
        model = ActorCritic(self.obs_space, self.action_space, self.spec).to(self.device)
        version = weights.load_into(model) if weights is not None else 0
        if state is not None and self.cfg.with_pbt:  # PBT's current values; otherwise the flags decide
            self.hyperparams.update(state.get("hyperparams", {}))
        # fused: one kernel for all parameters instead of a dozen tensor ops per parameter (docs/performance.md)
        optimizer = make_adam(model.parameters(), self.device)
        if state is not None:  # the moments; the hyperparameters in it give way to apply_hyperparams below
            optimizer.load_state_dict(state["optimizer"])
        self.models = {"actor_critic": ModelSlot(model, optimizer, self.device)}
        params = self.learning_params()
        algorithm = build_algorithm(self.algorithm_builder, params)
        self.models.update(algorithm.extra_models(self.models))
        place_models(self.models, self.cfg, algorithm.devices)
        if state is not None:
            load_extra_models(self.models, state)
        self.link = link
        hooks = link.start_identical(model, self.policy_optimizers()) if link is not None else {}
        mesh = link.mesh if link is not None else None
        if mesh is not None:  # --model_ranks: only the models this rank trains, once every rank has rank 0's start
            self.models = mesh.place(self.models)
        context = Context(self.models, params, on_minibatch=on_minibatch, policy_index=self.policy, **hooks)
        # a learner group's ranks share one process group for every model, so their collectives must come in one
        # order: train_steps one by one there. With --model_ranks each model has a group of its own, and a
        # train_step's collectives are its model's: steps on different groups may run at once
        self.executor = GraphExecutor(build_graph(algorithm.nodes, BATCH_KEYS), context,
                                      overlap=self.cfg.overlap_graph_nodes, home=self.device,
                                      overlap_train_steps=link is None or mesh is not None,
                                      mesh=mesh.mesh(self.cfg.batch_size, ModelHooks(**hooks)) if mesh else None,
                                      release_after=algorithm.release_after if self.releases_early(link) else ())
        self.apply_hyperparams()
        return version

    def releases_early(self, link: GroupLink | None) -> bool:
        """Whether the weights inference acts with are published, and the dataset handed back, when the algorithm's
        `release_after` nodes are done: inference must need nothing of what trains after them (it runs the actor
        alone), each version must be a dataset's, and one learner must hold the dataset."""
        return self.cfg.values_at_learner() and not self.cfg.publish_every_sgd_step and link is None

    def learning_params(self) -> LearningParams:
        # a rank of a learner group trains on 1/N of each dataset: in minibatches of 1/N of --batch_size, so
        # every rank makes as many SGD steps as one learner would
        batch_size = self.cfg.batch_size // self.cfg.num_learners
        return LearningParams.from_config(dataclasses.replace(self.cfg, **self.hyperparams, batch_size=batch_size))

    def policy_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers the learner's learning rate, Adam settings and PBT apply to, by model: the
        actor-critic's, and its actor's and critic's with --split_actor_critic (with --model_ranks, once the
        group started: those this rank trains)."""
        return {name: slot.optimizer for name, slot in self.models.items()
                if (name == "actor_critic" or slot.part_of == "actor_critic") and slot.optimizer is not None}

    def apply_hyperparams(self) -> None:
        """The current hyperparameters into the graph's context and the optimizers (after a PBT change)."""
        assert self.executor is not None
        self.executor.context.params = self.learning_params()
        h = self.hyperparams
        for optimizer in self.policy_optimizers().values():
            for group in optimizer.param_groups:
                group.update(lr=h["learning_rate"], eps=h["adam_eps"], betas=(h["adam_beta1"], h["adam_beta2"]))

    def transfer_seconds(self) -> tuple[float, float]:
        """The offloaded models' copies since the last call, and their exposed part
        (`GraphExecutor.take_transfer_seconds`)."""
        assert self.executor is not None
        return self.executor.take_transfer_seconds()

    def train(self, dataset: dict[str, torch.Tensor] | None, lr: float, version: int,
              release: Release | None = None) -> dict[str, float]:
        """One training iteration on `dataset` (in a learner group: on this rank's share of it; a rank elsewhere
        passes None and receives its share from rank 0); returns the graph's statistics (in a group: over every
        rank's share). `release`: called when the weights inference acts with are final for this dataset, if the
        graph says so before its end (GraphExecutor's release_after)."""
        assert self.executor is not None, "the graph is built in build(), before any dataset"
        if self.link is not None:
            dataset = self.link.share(dataset)
        assert dataset is not None
        # the dataset holds exactly the batch's rows (sf_core/contracts/sample.py): no slicing, no renaming
        batch = {key: t.to(self.device, non_blocking=True) for key, t in dataset.items()}
        for optimizer in self.policy_optimizers().values():
            for group in optimizer.param_groups:
                group["lr"] = lr
        self.executor.context.policy_version = version
        outputs = self.executor.run(batch, release)
        # the graph's statistics are nested: a custom *_stats key cannot overwrite version or samples
        stats = {k: v for key, d in outputs.items() if key.endswith("_stats") for k, v in d.items()}
        if self.link is None:
            return stats
        stats = self.link.mean_stats(stats)
        if self.link.mesh is not None:  # after the statistics' all-gather, so it times the copy, not a wait
            self.link.mesh.hand_over(self.models["actor_critic"].module)
            stats.update(self.link.mesh.take_handover())
        return stats


def extra_models_state(models: dict[str, ModelSlot]) -> dict[str, dict]:
    """The algorithm's other models (a trained RND predictor, its statistics; a frozen teacher), for a resume. A
    part of another model (the actor of --split_actor_critic) has its weights saved with that model's: only its
    optimizer here."""
    return {name: {"model": slot.module.state_dict() if slot.part_of is None else None,
                   "optimizer": slot.optimizer.state_dict() if slot.optimizer is not None else None}
            for name, slot in models.items() if name != "actor_critic"}


def load_extra_models(models: dict[str, ModelSlot], state: dict) -> None:
    for name, saved in state.get("extra_models", {}).items():
        if name in models:  # a checkpoint of another algorithm may have others: they are not ours to load
            if saved["model"] is not None:
                models[name].module.load_state_dict(saved["model"])
            if saved["optimizer"] is not None and models[name].optimizer is not None:
                models[name].optimizer.load_state_dict(saved["optimizer"])


class Learner(Component):
    def __init__(self, loop: EventLoop, cfg: Config, datasets: DatasetBuffers, weights: SharedWeights,
                 obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec, device: str, seed: int,
                 checkpoint_dir: str, resume_from: str | None, algorithm_builder: AlgorithmBuilder,
                 control: ControlBlock, policy: int = 0, population: list[SharedWeights] | None = None,
                 group: GroupSpec | None = None):
        super().__init__(loop, learner_name(policy, cfg.num_policies), control)
        self.control = control  # the stop flag: a stop skips the datasets queued behind it
        self.policy = policy
        self.population = population or [weights]  # every policy's weights: PBT copies the best's
        self.checkpoint_dir, self.resume_from = checkpoint_dir, resume_from
        self.cfg, self.datasets, self.weights = cfg, datasets, weights
        # the spec's custom model factories were resolved by the runner, so they exist in this process
        self.trainer = Trainer(cfg, obs_space, action_space, spec, device, seed, algorithm_builder, policy)
        self.version = 0
        self.samples_trained = 0
        self.group = group  # --num_learners > 1: this learner is rank 0 of that group
        self.link: GroupLink | None = None
        self.group_lost = False  # another rank is gone: no more training, the run is stopping
        self.report_timing()  # and its on_start, from the loop's start
        if group is not None:
            self.keepalive = Timer(loop, group.keepalive_interval(), object_id=f"{self.name}_group_keepalive")
            self.keepalive.timeout.connect(self.keep_group_waiting)

    @guarded
    def on_start(self) -> None:
        state = checkpoint.load(self.resume_from, map_location=self.trainer.device) if self.resume_from else None
        self.link = self.group.join(0) if self.group is not None else None
        self.version = self.trainer.build(self.weights, state, self.after_sgd_step, self.link)
        self.clock.mark("model_ready")
        if state is not None:
            self.samples_trained = state["samples_trained"]
            checkpoint.restore_rng(state["rng"])

    def after_sgd_step(self) -> None:
        self.beat("training on a dataset")
        if self.cfg.publish_every_sgd_step:  # each step's weights are a version of their own
            self.version += 1
            self.weights.publish(self.trainer.models["actor_critic"].module, self.version)
            self.clock.count("weights_published")

    @guarded
    def save_checkpoint(self, runner_state: dict, is_best: bool) -> None:
        if self.trainer.executor is None:
            return
        self.beat("saving a checkpoint")
        slot = self.trainer.models["actor_critic"]
        state = {
            "version": self.version,
            "model": slot.module.state_dict(),
            "optimizer": slot.optimizer.state_dict(),
            "samples_trained": self.samples_trained,
            "learning_rate": self._learning_rate(),
            "hyperparams": dict(self.trainer.hyperparams),
            "policy": self.policy,
            "rng": checkpoint.rng_state(),
            "runner": runner_state,
            "extra_models": {**extra_models_state(self.trainer.models), **self._other_ranks_optimizers()},
            "config": dataclasses.asdict(self.cfg),  # the model's flags: another run can rebuild it (a teacher)
        }
        path = checkpoint.save(self.checkpoint_dir, state, self.cfg.keep_checkpoints, is_best)
        CHECKPOINT_SAVED.emit(self, path)

    def _other_ranks_optimizers(self) -> dict[str, dict]:
        """--model_ranks: the optimizer state of each model this rank does not train, from the model's first
        rank (its weights are in the actor-critic's, current since the last hand-over)."""
        if self.link is None or self.link.mesh is None:
            return {}
        try:
            self.link.send_optimizers_command()
            return {name: {"model": None, "optimizer": state}
                    for name, state in self.link.mesh.receive_optimizers().items()}
        except GroupError as exc:  # the checkpoint is still saved, with the moments this rank has
            self._lose_group(exc)
            return {}

    def _learning_rate(self) -> float:
        lr = self.trainer.hyperparams["learning_rate"]
        if self.cfg.lr_schedule == "linear_decay":
            # each of several policies trains on its share of the run's frames
            progress = (self.samples_trained * self.cfg.env_frameskip * self.cfg.num_policies
                        / self.cfg.train_for_env_steps)
            return lr * max(0.0, 1.0 - progress)
        return lr

    @guarded
    def pbt_replace(self, source: int, hyperparams: dict) -> None:
        """PBT: continue from policy `source`'s latest weights with these hyperparameters. The optimizer's
        moments belonged to the replaced weights: they start afresh."""
        if self.trainer.executor is None:
            return
        slot = self.trainer.models["actor_critic"]
        self.population[source].load_into(slot.module)
        for optimizer in self.trainer.policy_optimizers().values():
            optimizer.state.clear()
        self.trainer.hyperparams.update(hyperparams)
        self.trainer.apply_hyperparams()
        self.version += 1  # samples acted on with the replaced weights now count as lagging
        self.weights.publish(slot.module, self.version)

    @guarded
    def batch_ready(self, index: int) -> None:
        if self.cfg.sampling_only or self.control.stop_requested() or self.group_lost:
            # benchmarking the sampler, or stopping: hand the data straight back (a stop must not
            # wait behind queued datasets before the final checkpoint)
            BATCH_CONSUMED.emit(self, index)
            return
        started = time.perf_counter()
        self.beat("training on a dataset")
        dataset = self.datasets[index]
        lr = self._learning_rate()
        # several policies: a dataset holds rows of other policies too (inactive here), which are not ours;
        # counted before the dataset goes back to the batcher, which refills it
        samples = dataset["rewards"].numel() if self.cfg.num_policies == 1 else int((~dataset["inactive"]).sum())
        handed_back: list[float] = []  # the seconds publishing took, once done

        def hand_back(held: Held | None = None) -> None:
            handed_back.append(self._publish_and_hand_back(index, (held or {}).get("actor_critic")))

        try:
            if self.link is not None:  # the other ranks train on their shares of the dataset alongside
                self.link.send_train(index, lr, self.version)
            stats = self.trainer.train(dataset, lr, self.version, release=hand_back)
        except GroupError as exc:
            self._lose_group(exc)
            return
        trained = time.perf_counter()
        copied, exposed = self.trainer.transfer_seconds()
        if copied:  # the offloaded models' copies: the part the training waited for is a phase of its own
            self.clock.add("offload_copy", exposed)
            self.clock.count("offload_copy_us", int(copied * 1e6))  # every copy's whole time, hidden or not
        self.clock.add("sgd", trained - started - exposed - sum(handed_back))
        self.clock.mark("first_sgd")
        if not handed_back:  # (the graph hands it back early where the critic trains on: Trainer.releases_early)
            hand_back()
        self.clock.add("publish_weights", handed_back[0])
        self.clock.count("datasets")
        self.samples_trained += samples
        REPORT.emit(self, LearnerReport(self.policy, self.version, samples, time.perf_counter() - started,
                                        {"learning_rate": lr, **stats}))

    def _publish_and_hand_back(self, index: int, held: dict[str, torch.Tensor] | None = None) -> float:
        """The dataset's new weights out (unless each SGD step published its own; `held`: what to publish in
        place of the entries still training) and its slots back to the batcher; returns the seconds it took."""
        started = time.perf_counter()
        if self.trainer.device.startswith("cuda"):  # its copies to the device done before the batcher refills it
            torch.cuda.synchronize(self.trainer.device)
        if not self.cfg.publish_every_sgd_step:
            self.version += 1
            self.weights.publish(self.trainer.models["actor_critic"].module, self.version, held)
        BATCH_CONSUMED.emit(self, index)
        return time.perf_counter() - started

    @guarded
    def keep_group_waiting(self) -> None:
        """The other ranks wait for a command inside a collective, which times out: an idle rank 0 (no
        dataset yet) tells them to keep waiting."""
        if self.link is not None:
            try:
                self.link.send_keep_waiting()
            except GroupError as exc:
                self._lose_group(exc)

    def _lose_group(self, error: GroupError) -> None:
        """Another rank is gone: the group cannot train on, but this learner's loop lives on to save its
        checkpoint when the runner stops the run (which this error asks for)."""
        self.link, self.group_lost = None, True
        self.keepalive.stop()
        COMPONENT_ERROR.emit(self, self.name, str(error))

    @guarded
    def stop(self) -> None:
        if self.link is not None:
            self.link.close()  # tells the other ranks to stop
            self.link = None
        self.stop_loop()
