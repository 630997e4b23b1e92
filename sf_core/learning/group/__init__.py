"""A learner group (--num_learners=N): N processes train one policy, data-parallel, with torch.distributed.

Rank 0 is the policy's learner (sf_core/learning/learner.py): the only rank the other components know; it publishes
the weights, saves checkpoints and reports. Ranks 1..N-1 are not event-loop components: each waits for rank
0's next command, a broadcast of a small tensor (train on dataset k with this learning rate and policy
version, keep waiting, or stop), and trains with the same `Trainer`. Each rank takes its contiguous 1/N of
the dataset's trajectories in minibatches of --batch_size / N, and at every SGD step the ranks average their
gradients with one all-reduce: every rank takes the same step from the same weights and optimizer state, so
all hold the same weights, bit for bit (compared when the group stops).

Where the other ranks run:
- one machine: plain processes beside the learner (`follow`), reading their shares of each dataset in
  shared memory (no copy), meeting on the loopback interface;
- --ray_address: Ray actors on the cluster's nodes (sf_core/cluster/learner_ranks.py), GPU nodes with
  --device=cuda. They never touch the driver's memory or files: rank 0 sends each its share of every dataset
  (one message, `ShareLayout`) and, at the start, its weights and optimizer state.
gloo on the CPU, NCCL on GPUs.

flags       what --num_learners > 1 needs of the other flags (checked before anything starts)
network     where the ranks meet: addresses, ports, the interface gloo and NCCL bind
link        the collectives: joining, sharing a dataset, averaging gradients, rank 0's commands
collectives what both kinds of group reduce and gather with, and their one-line failure (GroupError)
meshes      --model_ranks: a process group per model, the hand-over of each model rank 0 lacks to it
followers   ranks 1..N-1 started as processes beside the learner, and their loop
"""
