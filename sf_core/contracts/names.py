"""What each policy has of its own is named for it: its components (the addresses signals and heartbeats
use) and its checkpoint folder. A run of one policy keeps the plain names, so its folders and logs read as
they did before --num_policies existed."""


def per_policy(name: str, policy: int, num_policies: int) -> str:
    """`name` in a run of one policy; `name_p{policy}` for each policy of several."""
    return name if num_policies == 1 else f"{name}_p{policy}"
