"""Sampling across a Ray cluster (--ray_address): one sampler actor per node, shards to the driver's learner.

    driver (python -m sf_core.train)                 each node
    runner ── learner ◀─ batch_ready ── ShardIngest ◀── shards ── Sampler actor (sampler.py)
                 │                          │  (call callbacks,       rollout + inference workers,
                 └─ weights (shared memory) ┘   bounded per sampler)  batcher ─▶ ShardEmitter
                                            └── one ray.put per weights version ──▶ every sampler

A shard (shards.py) is one learner dataset, sample-schema rows as numpy arrays, tagged with the sampler, its
start (incarnation) and node. Ray places the samplers (placement.py) and moves shards and weights; nothing
here replaces it. docs/distributed.md has the design, the flags, node loss and the measured costs.
"""
