"""Every command-line flag, defined once: type, default, group and help (re-exported by `sf_core.config`).

The `Config` dataclass is the schema, with its validation (the values it derives from its flags are in
derived.py); `sf_core/cli/arguments.py` turns it into the command line. Flag names follow Sample Factory 2
where the concept is the same, so existing command lines carry over.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from sf_core.config.check_registry import register_check, registered_checks  # noqa: F401  (re-exported)
from sf_core.config.derived import DerivedValues
from sf_core.config.errors import ConfigError  # noqa: F401  (re-exported)
from sf_core.config.policy_hyperparams import parse_policy_hyperparams

GROUPS = ("experiment", "env", "rollout", "learning", "policies", "model", "logging", "system", "cluster")


def flag(default: Any, group: str, help: str, choices: Sequence[str] | None = None) -> Any:
    assert group in GROUPS, group
    factory = (lambda: list(default)) if isinstance(default, list) else None
    meta = {"group": group, "help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Config(DerivedValues):
    # --- experiment
    env: str = flag("", "experiment", "Environment: a registered name or any gymnasium id (e.g. CartPole-v1).")
    env_module: str = flag("", "experiment", "Comma-separated modules to import first, whose register_env (and other "
                           "register_*) calls make a custom env known: from the command line, in every tool. Saved in "
                           "config.json, so enjoy, export and push_to_hub import them again.")
    experiment: str = flag("default_experiment", "experiment", "Experiment name; files go to {train_dir}/{experiment}/.")
    train_dir: str = flag("train_dir", "experiment", "Root folder for experiments.")
    restart_behavior: str = flag("resume", "experiment", "What to do when the experiment folder exists: resume, "
                                 "restart (keep old files aside) or overwrite.", ("resume", "restart", "overwrite"))
    seed: int = flag(-1, "experiment", "Random seed; -1 picks one and records it in config.json.")
    train_for_env_steps: int = flag(10_000_000_000, "experiment", "Stop after this many env frames have been sampled.")
    train_for_seconds: float = flag(
        1e10, "experiment", "Stop after this many seconds of training, counted over every session of the experiment.")
    save_every_sec: float = flag(120.0, "experiment", "Seconds between checkpoints (also saved at every stop).")
    keep_checkpoints: int = flag(2, "experiment", "Periodic checkpoints kept (the best one is kept as well).")
    eval_every_env_steps: int = flag(
        0, "experiment", "Evaluate each policy every this many env frames (0: never): --eval_episodes deterministic "
        "episodes in a process beside training, to TensorBoard (eval/*) and training_summary.json; best.pt is then the "
        "best evaluation's checkpoint. A run that ends on a stop condition evaluates its final weights too.")
    eval_episodes: int = flag(10, "experiment", "Episodes per evaluation (--eval_every_env_steps).")
    target_mean_return: float = flag(
        float("inf"), "experiment", "Stop once the mean return of the last --stats_window episodes reaches this.")
    fit_defaults_to_env: bool = flag(
        True, "experiment", "An env without a preset gets values fitted to its spaces under the flags you type, as a "
        "preset would (sf_core/run/env_fit.py; the console names them); the env is made once more to read its spaces, "
        "not with --env_service. False: Sample Factory's defaults.")
    # not flags: the preset parse_args applied (its key; "" for none) and the flags it fitted to the env's spaces
    preset: str = field(default="", metadata={"group": "experiment", "cli": False})
    env_fit: list[str] = field(default_factory=list, metadata={"group": "experiment", "cli": False})

    # --- env
    env_frameskip: int = flag(1, "env", "Frames per env step; env frames count frameskip × steps.")
    repeat_action_probability: float = flag(
        0.25, "env", "Atari (ALE) games: sticky actions, the chance at each emulator frame that the previous "
        "action is repeated instead of the agent's (Machado et al. 2018; 0.25 is ALE v5's). 0: the deterministic "
        "emulator of the NoFrameskip-v4 envs that CleanRL's, RL-Zoo's and Sample Factory's Atari results ran on.")
    reward_scale: float = flag(1.0, "env", "Rewards are multiplied by this before learning.")
    reward_clip: float = flag(1000.0, "env", "Scaled rewards are clipped to [-reward_clip, reward_clip].")
    env_fault_policy: str = flag(
        "restart", "env", "When an env raises or a rollout or inference worker dies or hangs (--heartbeat_timeout): "
        "restart (new envs for that split; a new process for that worker alone, capped by "
        "--max_worker_replacements), or stop with a checkpoint, for runs where any fault is a bug to fix first "
        "(docs/faults.md). Counted in TensorBoard and training_summary.json.", choices=("restart", "stop"))
    max_worker_replacements: int = flag(
        5, "env", "A worker replaced more often than this within --worker_replacement_window seconds stops the run "
        "with a checkpoint, naming it (an inference worker: every component restored instead, --max_recoveries).")
    worker_replacement_window: float = flag(600.0, "env", "Seconds over which --max_worker_replacements counts.")
    check_env: bool = flag(
        True, "env", "Before anything starts, reset and step one env in the main process and check it keeps the "
        "gymnasium API (or the multi-agent contract): spaces, return values, observation shapes and dtypes. A broken "
        "one stops the run with one line naming the env and the rule (exit code 2). False skips the check (an env "
        "that is expensive to step, or one whose first step must not happen outside a worker).")
    env_service: str = flag(
        "", "env", "Envs served by env servers (python -m sf_core.env_server) instead of built in the workers: host:"
        "port*capacity,... (e.g. 127.0.0.1:5555*4,127.0.0.1:5556*4) or a YAML file of endpoints, pools or a fleet. "
        "--env names the env they serve. The slots are divided among rollout workers in contiguous slices; --num_envs_"
        "per_worker becomes each worker's share (typed higher: the most it grows to as slots are added while it "
        "trains). skip:ENV serves each worker's envs (of --env) in-process. See docs/env_services.md.")
    env_service_skip: str = flag("", "env", "POOL=ENV,...: pools of the --env_service YAML file that each worker "
                                 "serves in-process, as skip:ENV does a whole run (e.g. reward=MockReward-v0).")
    env_service_timeout: float = flag(
        5.0, "env", "Seconds an env server may take to answer one request before its slot is marked failed "
        "(the episode on it is dropped and the env moves to another slot).")
    env_service_recheck_interval: float = flag(
        1.0, "env", "Seconds between health checks of a failed slot; a slot that answers again is re-admitted.")
    env_service_down_timeout: float = flag(
        300.0, "env", "Training stops (naming the addresses) when a worker's envs have found no healthy slot for this "
        "many seconds while slots are failed (or none is left); until then they wait while the other workers train.")

    # --- rollout
    num_workers: int = flag(max(1, os.cpu_count() or 1), "rollout", "Rollout worker processes (on a cluster, per node). Untyped: one per usable core, or one per 2 where a native vector env steps 256 envs or more a worker (sf_core/machine/fit.py).")
    num_envs_per_worker: int = flag(8, "rollout", "Envs each rollout worker steps. Untyped and not set by a preset: 8, or 16 with a GPU.")
    worker_num_splits: int = flag(2, "rollout", "Groups a worker's envs are split into; one group steps while another waits for actions.")
    policy_workers_per_policy: int = flag(1, "rollout", "Inference workers (batched policy forward passes). Untyped: one per 8 rollout workers (at most 4, one per 4 cores).")
    inference_in_rollout_workers: bool = flag(False, "rollout", "Each rollout worker runs the policy on its own envs, on the CPU, instead of asking an inference worker (none is started): no messages or process switches per step, the better choice for small models on few cores (docs/performance.md). One policy.")
    rollout: int = flag(32, "rollout", "Trajectory length in env steps, the unit the learner trains on.")
    batched_sampling: bool = flag(
        True, "rollout", "True: step each split's single-agent envs as one batch (the fast path). False: step "
        "each env on its own, one trajectory per agent: needed for multi-agent envs (PettingZoo included), works "
        "for any env.")
    env_vectorization: str = flag(
        "auto", "rollout", "How a split's envs are built: none (one gymnasium env each, one call each), gymnasium "
        "(the id's vector_entry_point, e.g. CartPole-v1), user (register_env(..., vectorized=True)), ale (ale-py's "
        "AtariVectorEnv), mujoco (MuJoCo v5 locomotion ids stepped in batch), auto (a native vector env "
        "where the env has one, else none; not yet ale). See docs/environments.md.",
        choices=("auto", "none", "gymnasium", "user", "ale", "mujoco"))
    serial_mode: bool = flag(False, "rollout", "Run every component on one event loop in this process.")
    async_rl: bool = flag(
        True, "rollout", "Keep sampling while the learner trains (policy lag is measured). False: workers wait "
        "for new weights after each dataset (lag 0 when the dataset is a multiple of workers×envs×rollout).")
    num_batches_to_accumulate: int = flag(
        0, "rollout", "With --async_rl: at most this many datasets are collected ahead of the one the learner "
        "trains on; sampling then waits for it to finish (a policy lag of about this many versions, the work of "
        "sampling and training overlapped). 0: sampling runs ahead as far as the buffers allow (about one dataset "
        "and one round of every worker's envs beyond the one being filled).")

    # --- learning
    algo: str = flag("APPO", "learning", "Algorithm graph: APPO, PPO, REINFORCE, APPO_TEACHER (--teacher), "
                     "APPO_RND, or one registered with sf_core.algo.registry.register_algorithm.")
    batch_size: int = flag(1024, "learning", "Minibatch size for SGD, in samples.")
    num_batches_per_epoch: int = flag(1, "learning", "Minibatches in one training iteration's dataset.")
    num_epochs: int = flag(1, "learning", "Passes over each dataset.")
    learning_rate: float = flag(1e-4, "learning", "Adam learning rate.")
    lr_schedule: str = flag("constant", "learning", "Learning-rate schedule over train_for_env_steps.",
                            choices=("constant", "linear_decay"))
    adam_eps: float = flag(1e-6, "learning", "Adam epsilon.")
    adam_beta1: float = flag(0.9, "learning", "Adam beta1.")
    adam_beta2: float = flag(0.999, "learning", "Adam beta2.")
    gamma: float = flag(0.99, "learning", "Discount factor.")
    gae_lambda: float = flag(0.95, "learning", "GAE lambda (also the trace-cutting lambda of V-trace).")
    with_vtrace: bool = flag(False, "learning", "V-trace targets (off-policy correction) instead of GAE.")
    recompute_values: bool = flag(
        False, "learning", "Recompute values with the current model before GAE (one more forward pass per "
        "dataset). Off: use the values inference computed while acting, as PPO does. V-trace always recomputes.")
    vtrace_rho: float = flag(1.0, "learning", "V-trace importance-weight clip for the value target (rho bar).")
    vtrace_c: float = flag(1.0, "learning", "V-trace trace-cutting clip (c bar).")
    ppo_clip_ratio: float = flag(0.1, "learning", "PPO policy ratio clip: ratio is kept in [1-x, 1+x].")
    ppo_clip_value: float = flag(1.0, "learning", "Value clipping around old values (normalized units); 0 disables.")
    value_loss_coeff: float = flag(0.5, "learning", "Weight of the value loss.")
    exploration_loss_coeff: float = flag(0.003, "learning", "Weight of the entropy bonus.")
    max_grad_norm: float = flag(4.0, "learning", "Gradient norm clip; 0 disables.")
    normalize_advantage: bool = flag(True, "learning", "Normalize advantages per minibatch.")
    max_policy_lag: int = flag(1000, "learning", "Samples older than this many policy versions are not trained on.")
    rnd_int_coeff: float = flag(1.0, "learning", "APPO_RND: weight of the intrinsic (curiosity) advantages in the "
                                "policy's advantages.")
    rnd_ext_coeff: float = flag(2.0, "learning", "APPO_RND: weight of the extrinsic (env reward) advantages.")
    rnd_gamma: float = flag(0.99, "learning", "APPO_RND: discount of the intrinsic returns (non-episodic: they "
                            "run on across episode ends).")
    rnd_update_proportion: float = flag(0.25, "learning", "APPO_RND: fraction of each dataset's samples the RND "
                                        "predictor trains on (a random draw per dataset).")
    rnd_learning_rate: float = flag(1e-3, "learning", "APPO_RND: Adam learning rate of the RND predictor and the "
                                    "intrinsic critic.")
    rnd_hidden: int = flag(128, "learning", "APPO_RND: width of the hidden layers of the RND target, predictor "
                           "and intrinsic critic (the RND embedding is as wide); on images, after a conv trunk.")
    shuffle_minibatches: bool = flag(True, "learning", "Shuffle samples across minibatches each epoch.")
    mixed_precision: bool = flag(
        False, "learning", "Model forward passes (inference and learner) and the backward under bfloat16 autocast "
        "(weights, optimizer, losses and sampling stay float32). SGD steps 2.2-2.5x faster on a CPU with AMX "
        "(scripts/bench_sgd_step.py); also for recent GPUs; slower where bf16 is emulated.")
    cuda_graphs: bool = flag(
        True, "rollout", "On a GPU, inference workers replay their forward pass and sampling as CUDA graphs, one per "
        "batch-size bucket (feed-forward policies; a recurrent core runs eagerly): one launch instead of dozens.")
    cuda_sync: str = flag(
        "spin", "rollout", "How an inference worker waits for its GPU: spin (a busy core, the fastest wake-up) or "
        "yield (the driver sleeps, leaving the core to envs). Pong on an H100: within run-to-run noise (docs/gpu.md).",
        choices=("spin", "yield"))
    sgd_cuda_graphs: bool = flag(False, "learning", "On a GPU, one learner replays the actor-critic's SGD step as a "
                                 "CUDA graph: one launch instead of hundreds (docs/gpu.md).")
    overlap_graph_nodes: bool = flag(
        False, "learning", "Run the algorithm graph's independent nodes at once: threads on a CPU, a CUDA stream "
        "each on a GPU; results are those of running them one by one (docs/algorithms.md).")
    model_devices: str = flag(
        "", "learning", "Where the algorithm's other models run, as NAME=DEVICE pairs, comma-separated (e.g. "
        "teacher=cuda:1,rnd_target=cpu); unnamed ones run where the algorithm places them (by default on --device).")
    offload_models: str = flag(
        "", "learning", "Comma-separated frozen models (e.g. teacher) kept in host memory between training "
        "iterations and copied to their device ahead of their calls (on the CPU: nothing to do, a warning).")
    model_ranks: str = flag(
        "", "learning", "With --num_learners: the learner ranks each trained model runs on, as NAME=RANKS pairs "
        "split by ';' (e.g. critic=0,1; actor=2-3); each model trains data-parallel on its own ranks, and rank 0 "
        "receives the new weights of those it lacks after every dataset (docs/algorithms.md).")
    publish_every_sgd_step: bool = flag(
        False, "learning", "Send the weights to the inference workers after every SGD step, not once per dataset: "
        "samples are acted on by fresher weights (lower policy lag). Policy versions then count SGD steps, and so "
        "does --max_policy_lag.")
    teacher: str = flag(
        "", "learning", "--algo=APPO_TEACHER: a checkpoint of this project (a .pt file or an experiment folder, "
        "whose best or latest checkpoint is taken) whose policy the student is pulled towards.")
    teacher_kl_coeff: float = flag(0.5, "learning", "--algo=APPO_TEACHER: weight of KL(teacher ‖ student) in the loss.")
    num_learners: int = flag(1, "learning", "Learner processes training one policy together (torch.distributed: "
                             "gloo on the CPU, NCCL with a GPU per rank): each trains on 1/N of every dataset in "
                             "minibatches of --batch_size / N; gradients are averaged, as one learner with the whole "
                             "--batch_size would train. Not with --serial_mode or --with_pbt (docs/distributed.md).")

    # --- policies (docs/multi_policy.md)
    num_policies: int = flag(
        1, "policies", "Policies trained at once, each with its own weights, inference workers, batcher and learner. "
        "Agents are assigned to policies by --policy_mapping at every episode start.")
    policy_mapping: str = flag(
        "auto", "policies", "Which policy controls which agent, chosen at each episode start: random (each agent "
        "of each env draws a policy), spread (env k of E always plays policy k * num_policies // E: contiguous "
        "blocks, so a split serves one policy), or a name registered with "
        "sf_core.sampling.policy_mapping.register_policy_mapping. auto: random for multi-agent envs, spread otherwise.")
    policy_processes: str = flag(
        "auto", "policies", "Async mode with several policies. own: every inference worker and learner in a process "
        "of its own. shared: inference worker i of every policy on one event loop in one process, and every learner "
        "in one process (each policy keeps its own objects, weights, datasets and batcher). auto: shared when own "
        "would start more processes than there are cores (docs/multi_policy.md has the measurements).",
        choices=("auto", "own", "shared"))
    policy_hyperparams: list[str] = flag(
        [], "policies", "Per-policy values of numeric learning flags, for ablations on the same samples or a PBT "
        "population's start: K:name=value[,name=value...] per entry, e.g. 1:learning_rate=3e-6 "
        "2:gamma=0.95,exploration_loss_coeff=0.01. Policies not named use the flags.")
    with_pbt: bool = flag(
        False, "policies", "Population-based training: every --pbt_period_env_steps the worst policies take the "
        "weights and hyperparameters of the best and mutate them (needs --num_policies >= 2).")
    pbt_period_env_steps: int = flag(5_000_000, "policies", "Env frames (of each policy) between PBT updates.")
    pbt_start_mutation: int = flag(20_000_000, "policies", "No PBT replacement before a policy has this many env "
                                   "frames (it needs time to show what its hyperparameters do).")
    pbt_replace_fraction: float = flag(0.3, "policies", "Fraction of the population (at least one policy) "
                                       "replaced by the best at each PBT update, and the fraction counted as best.")
    pbt_mutation_rate: float = flag(0.15, "policies", "Probability of each hyperparameter to mutate when a "
                                    "policy is replaced.")
    pbt_perturb_min: float = flag(1.1, "policies", "A mutation multiplies or divides by a factor drawn from "
                                  "[pbt_perturb_min, pbt_perturb_max].")
    pbt_perturb_max: float = flag(1.5, "policies", "See --pbt_perturb_min.")
    pbt_replace_reward_gap: float = flag(
        0.1, "policies", "Replace a policy only if the best objective exceeds its own by this fraction of the "
        "objectives' spread (|best| + 1e-6).")
    pbt_target_objective: str = flag(
        "episode_return", "policies", "What PBT ranks policies by: episode_return (mean recent return), "
        "win_rate (2-player games: mean win rate against the other policies), or the name of a number the env "
        "puts in the info dict of an episode's last step (at its top level or in its episode_extra_stats).")
    pbt_hyperparams: list[str] = flag(
        ["learning_rate", "exploration_loss_coeff", "ppo_clip_ratio", "gamma"], "policies",
        "Hyperparameters PBT copies and mutates: names of numeric learning flags (gamma and gae_lambda are "
        "mutated as 1 - x, so they stay below 1).")

    # --- model
    encoder_mlp_layers: list[int] = flag([512, 512], "model", "Hidden layer sizes of the MLP encoder (1-D and other "
                                         "non-image Box observations, flattened).")
    encoder_conv_architecture: str = flag(
        "auto", "model", "Conv encoder for image observations (a Box with 3 dims, [C, H, W] or [H, W, C]): "
        "convnet_atari is the Nature-DQN CNN (conv 32 8x8/4, 64 4x4/2, 64 3x3/1; images of at least 36x36), "
        "resnet_impala the IMPALA ResNet (3 stages of conv, max-pool and 2 residual blocks; 16, 32, 32 channels), "
        "convnet_small three padded 3x3 convs (32, 64, 64 channels) with stride 2 along a side while it is at "
        "least 8 pixels (any size from 1x1). auto: convnet_atari where it fits, else convnet_small (the choice "
        "is logged at start); an architecture named explicitly that does not fit the image stops the run. "
        "uint8 images are scaled by 1/255.",
        choices=("auto", "convnet_atari", "resnet_impala", "convnet_small"))
    encoder_conv_mlp_layers: list[int] = flag([512], "model", "Fully connected layers after the conv encoder.")
    nonlinearity: str = flag("elu", "model", "Activation function.", choices=("elu", "relu", "tanh"))
    actor_critic_share_weights: bool = flag(True, "model", "One encoder for actor and critic, or one each.")
    split_actor_critic: bool = flag(False, "model", "Actor and critic as two models of the graph, each with its own "
                                    "optimizer (at once with --overlap_graph_nodes); implies one body each.")
    critic_mlp_layers: list[int] = flag(
        [], "model", "Hidden layer sizes of the critic's MLP encoder where it has a body of its own "
        "(--actor_critic_share_weights=False or --split_actor_critic=True); empty: --encoder_mlp_layers.")
    normalize_input: bool = flag(True, "model", "Normalize observations with running mean/std (per element for vectors;"
                                 " one scalar mean/std for float images; never for uint8 images, scaled by 1/255).")
    normalize_returns: bool = flag(True, "model", "Learn values in units normalized by running return stats.")
    continuous_tanh_scale: float = flag(0.0, "model", "If > 0, Gaussian means are tanh(x)·scale.")
    initial_log_std: float = flag(0.0, "model", "Initial log std of Gaussian actions.")
    use_rnn: bool = flag(False, "model", "A recurrent core between encoder and heads; its state is kept per env "
                         "and zeroed at episode starts. Needed when the observation does not show everything "
                         "the policy must remember.")
    rnn_type: str = flag("gru", "model", "Recurrent cell of the core.", choices=("gru", "lstm"))
    rnn_size: int = flag(128, "model", "Hidden size of the recurrent core (an LSTM stores twice this per env).")
    recurrence: int = flag(
        -1, "model", "Truncated-BPTT length: the learner unrolls the core over chunks of this many steps, each "
        "starting from the state recorded while acting. -1: the whole --rollout with --use_rnn, else 1. Must "
        "divide --rollout and --batch_size.")
    decoder_mlp_layers: list[int] = flag([], "model", "Fully connected layers between the core (or encoder) and "
                                         "the heads.")
    encoder_custom: str = flag("", "model", "An encoder registered with sf_core.algo.custom_models.register_encoder "
                               "(empty: the built-in conv/MLP encoder).")
    core_custom: str = flag("", "model", "A core registered with sf_core.algo.custom_models.register_core (empty: "
                            "the built-in one, see --use_rnn).")
    decoder_custom: str = flag("", "model", "A decoder registered with sf_core.algo.custom_models.register_decoder "
                               "(empty: --decoder_mlp_layers).")

    # --- logging
    experiment_summaries_interval: float = flag(2.0, "logging", "Seconds between TensorBoard summaries.")
    report_interval: float = flag(5.0, "logging", "Seconds between console status lines.")
    time_report: bool = flag(False, "logging", "At the end of the run, log where each kind of component's time "
                             "went (env steps, forward passes, copies, SGD, waiting) and the start-up timeline. "
                             "training_summary.json holds both in any case (time_accounting, startup).")
    stats_window: int = flag(100, "logging", "Episodes averaged for the reported mean return.")
    with_wandb: bool = flag(False, "logging", "Also log to Weights & Biases (the wandb extra): the TensorBoard "
                            "scalars, the config, and enjoy's video and results. WANDB_MODE=offline writes the run "
                            "under {train_dir}/{experiment}/wandb/ for a later `wandb sync`.")
    wandb_user: str = flag("", "logging", "W&B entity (user or team); empty: your default entity.")
    wandb_project: str = flag("sf_core", "logging", "W&B project.")
    wandb_group: str = flag("", "logging", "W&B group (e.g. one per sweep); empty: none.")
    wandb_job_type: str = flag("SF", "logging", "W&B job type.")
    wandb_tags: list[str] = flag([], "logging", "W&B tags.")
    wandb_unique_id: str = flag("", "logging", "W&B run id; empty: the experiment's previous run id when it resumes, "
                                "else a new one (kept in config.json, so enjoy and resumed runs log to the same run).")

    # --- system
    device: str = flag("cpu", "system", "Device of the learner and inference workers: cpu, cuda, cuda:N or gpu (falls back to cpu, with a warning, if there is no GPU).")
    torch_threads: int = flag(1, "system", "torch threads per component process in async mode (1 is best when processes ≥ cores).")
    learner_torch_threads: int = flag(
        0, "system", "torch threads of a learner process (0: --torch_threads). With --async_rl=False sampling waits "
        "while the learner trains, so a learner on the CPU may use the cores the samplers leave idle then.")
    mp_start_method: str = flag(
        "auto", "system", "multiprocessing start method for component processes. auto: fork on Linux with a CPU device "
        "(fastest start); forkserver on Linux with a GPU, with components of several torch threads, or in a cluster "
        "sampler (neither CUDA, OpenMP's pool nor Ray's threads survive a fork; torch imported once); spawn elsewhere.",
        choices=("auto", "spawn", "forkserver", "fork"))
    # not a flag: the flags parse_args fitted to the machine, as neither typed nor preset (sf_core/machine/fit.py)
    machine_fit: list[str] = field(default_factory=list, metadata={"group": "system", "cli": False})
    heartbeat_timeout: float = flag(60.0, "system", "Seconds a component may go without a heartbeat before it counts "
                                    "as hung: the run stops, naming it (a rollout worker under --env_fault_policy="
                                    "restart is killed and replaced instead).")
    max_recoveries: int = flag(5, "system", "Deaths of a learner's process (with its batcher), a learner rank or an "
                               "inference worker recovered from, each from the newest checkpoint (docs/faults.md).")
    sampling_only: bool = flag(False, "system", "Benchmarking: sample with inference but skip SGD (no learning).")

    # --- cluster (docs/distributed.md)
    ray_address: str = flag(
        "", "cluster", "Sample on a Ray cluster: auto (the cluster this machine belongs to), HOST:PORT (its head), "
        "or local (start one on this machine). Empty: this machine only, without Ray.")
    num_samplers: int = flag(0, "cluster", "Sampler actors (each runs the rollout and inference workers these flags "
                             "describe on one node); 0: one per node of the cluster.")
    shards_in_flight: int = flag(2, "cluster", "Shards (one learner dataset each) a sampler may have ready or "
                                 "under way beyond the one the learner trains on: bounds policy lag across nodes.")
    sampler_cpus: float = flag(1.0, "cluster", "Ray CPUs each sampler reserves (its placement bundle).")
    max_sampler_restarts: int = flag(20, "cluster", "Samplers replaced (a crash, a lost node) before training stops.")
    learner_cpus: float = flag(1.0, "cluster", "Ray CPUs each learner rank after the first reserves (--num_learners: "
                               "they are Ray actors on the cluster's nodes; with --device=cuda each takes a GPU too).")
    learner_resources: str = flag("", "cluster", "Custom Ray resources those ranks need, NAME:AMOUNT,... (e.g. "
                                  "learner:1, for nodes started with ray start --resources='{\"learner\": 1}').")

    def validate(self) -> None:
        """Every registered check (sf_core/config/checks.py, then each feature's own): ConfigError on the first
        flag value that cannot work."""
        for check in registered_checks():
            check(self)

    def policy_overrides(self) -> dict[int, dict[str, float]]:
        """--policy_hyperparams parsed: policy -> {flag: value}."""
        return parse_policy_hyperparams(self.policy_hyperparams, self.num_policies, NUMERIC_LEARNING_FLAGS)

    def policy_config(self, policy: int) -> "Config":
        """The config policy `policy` starts from: the flags with its --policy_hyperparams applied."""
        values = self.policy_overrides().get(policy)
        return dataclasses.replace(self, **values) if values else self

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> "Config":
        """A saved config (config.json, a checkpoint's); flags this version no longer has are dropped."""
        return cls(**{k: v for k, v in saved.items() if k in _FIELDS})


def default(name: str) -> Any:
    """A flag's default. Typed views of the config (sf_core.algo.model.ModelSpec, sf_core.algo.params.LearningParams)
    take their defaults from here, so each default is written once, in `Config`."""
    f = _FIELDS[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
# what --policy_hyperparams sets per policy and PBT copies and mutates
NUMERIC_LEARNING_FLAGS = tuple(f.name for f in dataclasses.fields(Config)
                               if f.metadata["group"] == "learning" and f.type == "float")
