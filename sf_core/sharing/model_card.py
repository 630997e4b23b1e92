"""The model card (README.md) of an agent on the Hub: YAML metadata the Hub indexes (library, env,
mean reward ± std in the `model-index` format the RL leaderboards read), then how to load, watch and
retrain it."""

from __future__ import annotations

import dataclasses
import shlex

import yaml

from sf_core.config import Config, default

LIBRARY = "sf_core"
# differ per machine or launch, and do not change what is learned
UNREPRODUCED = ("machine_fit", "experiment", "train_dir", "num_workers", "device", "torch_threads", "learner_torch_threads",
                "mp_start_method", "with_wandb", "wandb_project", "wandb_user", "wandb_group", "wandb_tags",
                "wandb_job_type", "wandb_unique_id")


def train_command(cfg: Config) -> str:
    """The command that trains this agent again: every flag whose value differs from its default (the
    env preset's values and those fitted to the env's spaces included, which is harmless: neither overrides
    typed flags). Fields that are not flags (the preset's name, what was fitted) are the run's record only."""
    parts = ["python", "-m", "sf_core.train"]
    for f in dataclasses.fields(Config):
        value = getattr(cfg, f.name)
        not_typed = not f.metadata.get("cli", True) or f.name in UNREPRODUCED or f.name in cfg.machine_fit
        if not_typed or value == default(f.name):
            continue
        if isinstance(value, list):
            parts.append(f"--{f.name}" + "".join(f" {shlex.quote(str(v))}" for v in value))
        else:
            parts.append(f"--{f.name}={shlex.quote(str(value))}")
    return " ".join(parts)


def metadata(cfg: Config, results: dict) -> dict:
    reward = f"{results['mean_return']:.2f} +/- {results['std_return']:.2f}"
    return {
        "library_name": LIBRARY,
        "tags": ["deep-reinforcement-learning", "reinforcement-learning", LIBRARY, cfg.env],
        "model-index": [{
            "name": cfg.algo,
            "results": [{
                "task": {"type": "reinforcement-learning", "name": "reinforcement-learning"},
                "dataset": {"name": cfg.env, "type": cfg.env},
                "metrics": [{"type": "mean_reward", "value": reward, "name": "mean_reward", "verified": False}],
            }],
        }],
    }


def _which_policy(cfg: Config, results: dict) -> str:
    if cfg.num_policies == 1:
        return ""
    return f"policy {results.get('policy_index', '?')} of the {cfg.num_policies} trained together, "


def model_card(cfg: Config, results: dict, repo_id: str, files: list[str]) -> str:
    """README.md: metadata front matter, then the agent's results and the commands to use it."""
    experiment = repo_id.split("/")[-1]
    front = yaml.safe_dump(metadata(cfg, results), sort_keys=False)
    video = "![replay](replay.mp4)\n\n" if "replay.mp4" in files else ""
    curve = "![learning curve](learning_curve.png)\n\n" if "learning_curve.png" in files else ""
    which = _which_policy(cfg, results)
    return f"""---
{front}---

# {cfg.algo} agent playing {cfg.env}

Trained with sf_core ({cfg.algo}, asynchronous reinforcement learning). Mean return over
{results['episodes']} evaluation episodes: **{results['mean_return']:.2f} ± {results['std_return']:.2f}**
({which}policy version {results.get('policy_version', '?')}, {'deterministic' if results.get('deterministic') else 'sampled'}
actions).

{video}{curve}## Use it

```bash
pip install -e ".[huggingface]"          # in a clone of sf_core
python -m sf_core.huggingface.load_from_hub --hf_repository={repo_id} --train_dir=train_dir
python -m sf_core.enjoy --experiment={experiment} --train_dir=train_dir
```

## Train it again

```bash
{train_command(cfg)} --experiment={experiment}
```

## Files

{chr(10).join(f"- `{name}`" for name in files)}
"""
