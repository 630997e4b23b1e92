"""Head-to-head evaluation of two players in a two-agent env (a 2-player game such as `nim21`).

    result = play_matches(env, (trained, None), games=200, seed=0)   # None: a uniformly random player
    result["win_rate"]                                                # player 0's, a tie counting half

Player 0 takes seat (agent) 0 in even games and seat 1 in odd ones, so a game that favours one seat
favours neither player. The env follows the multi-agent contract (envs/multi_agent.py) and resets
itself; a game ends once both agents have ended an episode, and the player with the higher return
wins it. Each player remembers (recurrent state) only its own seat's observations.

`python -m sf_core.enjoy --experiment=E --opponent=random|K` plays an experiment's policy this way
against a random player or against policy K of the same experiment (`versus_opponent`).
"""

from __future__ import annotations

import argparse
import copy
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import num_agents
from sf_core.config import ConfigError
from sf_core.evaluation.policy import PolicyCheckpoint, TrainedPolicy, load_checkpoint
from sf_core.records.experiment import write_eval_results

log = logging.getLogger("sf_core")

class Player(Protocol):
    """What can take a seat: a TrainedPolicy, or anything that acts like one (a scripted player)."""

    def start_episode(self, agents: int = 1) -> Any: ...

    def act(self, observations: Sequence[Any], episode: Any) -> list[Any]: ...


class _Contestant:
    """One player of the match: how it chooses, and its recurrent state in the current game."""

    def __init__(self, player: Player | None, action_space: gym.Space, seed: int):
        self.player = player
        self.space = copy.deepcopy(action_space)  # a private, seeded copy: the env's own space stays untouched
        self.space.seed(seed)
        self.state = player.start_episode() if player is not None else None

    def new_game(self) -> None:
        if self.player is not None:
            self.state = self.player.start_episode()

    def act(self, obs: Any) -> Any:
        if self.player is None:
            return self.space.sample()
        return self.player.act([obs], self.state)[0]


def play_matches(env: gym.Env, players: tuple[Player | None, Player | None], games: int, seed: int = 0) -> dict:
    """Play `games` games of the two-agent `env` between `players[0]` and `players[1]` (None: a
    uniformly random player, drawing from a copy of the action space seeded from `seed`), seats
    alternating from game to game (player 0 on seat 0 first). Returns player 0's wins, losses, ties
    and win rate (ties count half), and per game `returns` ([player 0's, player 1's]), `seats`
    (player 0's seat) and `lengths` (env steps)."""
    if num_agents(env) != 2:
        raise ValueError(f"head-to-head play needs a two-agent env, got {num_agents(env)} agent(s)")
    if games < 1:
        raise ValueError(f"games must be at least 1, got {games}")
    contestants = [_Contestant(player, env.action_space, seed + 1 + k) for k, player in enumerate(players)]
    obs, infos = env.reset(seed=seed)
    returns: list[list[float]] = []
    seat_of_player0: list[int] = []
    lengths: list[int] = []
    total, ended, length = np.zeros(2), np.zeros(2, dtype=bool), 0
    while len(returns) < games:
        game = len(returns)
        by_agent = contestants if game % 2 == 0 else contestants[::-1]  # the player on agent 0, then on agent 1
        active = [info.get("is_active", True) for info in infos]
        obs, rewards, terminated, truncated, infos = env.step([by_agent[a].act(obs[a]) for a in range(2)])
        length += 1
        for agent in range(2):
            if active[agent] and not ended[agent]:
                total[agent] += float(rewards[agent])
                ended[agent] = bool(terminated[agent] or truncated[agent])
        if ended.all():
            seat0 = game % 2
            returns.append([float(total[seat0]), float(total[1 - seat0])])
            seat_of_player0.append(seat0)
            lengths.append(length)
            total[:], ended[:], length = 0.0, False, 0
            for contestant in contestants:
                contestant.new_game()
    return _summary(returns, seat_of_player0, lengths)


def _summary(returns: list[list[float]], seats: list[int], lengths: list[int]) -> dict:
    wins = sum(1 for mine, theirs in returns if mine > theirs)
    losses = sum(1 for mine, theirs in returns if mine < theirs)
    ties = len(returns) - wins - losses
    return {"games": len(returns), "wins": wins, "losses": losses, "ties": ties,
            "win_rate": (wins + 0.5 * ties) / len(returns), "returns": returns, "seats": seats, "lengths": lengths}


def load_opponent(opponent: str, experiment_path: str, loaded: PolicyCheckpoint, env: gym.Env,
                  args: argparse.Namespace) -> tuple[Player | None, str]:
    """`--opponent`: `random`, or the index K of a policy of the same experiment (its `--checkpoint`
    choice, latest or best, from `checkpoint_p{K}/` of a multi-policy run). Returns the player and
    the checkpoint file it came from ("random" for the random player)."""
    if opponent == "random":
        return None, "random"
    num_policies = getattr(loaded.cfg, "num_policies", 1)
    if not opponent.isdigit() or int(opponent) >= num_policies:
        raise ConfigError(f"--opponent must be 'random' or a policy index below {num_policies} (the experiment's "
                          f"--num_policies), got {opponent!r}")
    which = args.checkpoint if args.checkpoint in ("latest", "best") else "latest"
    rival = load_checkpoint(experiment_path, which, args.device, policy_index=int(opponent))
    path = rival.path
    return rival.policy(env.observation_space, env.action_space, args.eval_deterministic, args.device), path


def versus_opponent(env: gym.Env, policy: TrainedPolicy, loaded: PolicyCheckpoint, experiment_path: str,
                    args: argparse.Namespace) -> dict:
    """`sf_core.enjoy --opponent=...`: `--max_num_episodes` games of the loaded policy (player 0)
    against the opponent; logs the win rate and writes eval_results.json."""
    if args.save_video:
        raise ConfigError("--save_video is not supported with --opponent")
    opponent, opponent_path = load_opponent(str(args.opponent), experiment_path, loaded, env, args)
    log.info("playing %s (policy v%d) against %s for %d games", loaded.path, loaded.version, opponent_path,
             args.max_num_episodes)
    played = play_matches(env, (policy, opponent), args.max_num_episodes, args.seed)
    mine = [mine for mine, _ in played["returns"]]
    results = {"opponent": str(args.opponent), "opponent_checkpoint": opponent_path,
               **{key: played[key] for key in ("wins", "losses", "ties", "win_rate", "returns", "seats", "lengths")},
               "episodes": played["games"], "mean_return": float(np.mean(mine)), "std_return": float(np.std(mine)),
               "mean_length": float(np.mean(played["lengths"])), "checkpoint": loaded.path,
               "policy_version": loaded.version, "env_frames": loaded.env_frames, "env": args.env or loaded.cfg.env,
               "policy_index": loaded.policy_index,
               "deterministic": bool(args.eval_deterministic)}
    log.info("against %s: %d wins, %d losses, %d ties in %d games: win rate %.3f", args.opponent, played["wins"],
             played["losses"], played["ties"], played["games"], played["win_rate"])
    write_eval_results(experiment_path, results, loaded.cfg, args.with_wandb)
    return results
