"""The env-service wire format, shared by the server (sf_core/env_server.py) and the client (sf_core/service/remote_env.py).

A message is a ZeroMQ multipart message: one JSON header frame, then one raw frame per array.

    request  header: {"cmd": "step", "slot": 3, "arrays": [{"dtype": "int64", "shape": []}]}  + action bytes
    reply    header: {"ok": true, "reward": 1.0, "terminated": false, "truncated": false, "info": {...},
                      "arrays": [{"dtype": "float32", "shape": [4]}]}                          + obs bytes
    error    header: {"ok": false, "error": "why"}

Several slots of one server step with one message, `steps`, answered with one reply per slot as each
finishes (so a client sends it from a DEALER socket, which may receive several replies):

    request  header: {"cmd": "steps", "id": 7, "slots": [0, 2], "autoreset": true, "arrays": [...]} + actions
    replies  header: {"ok": true, "id": 7, "slot": 0, "reward": ..., ...}  (or {"ok": false, "id": 7, "slot": 0, ...})

With `autoreset`, an instance whose episode ended is reset on the server: its reply carries the final
observation's arrays, then the new episode's, and a `reset_info`.

Nothing is ever pickled: arrays travel as bytes with a dtype from a fixed allow-list and a shape that the
receiver checks against the env's spaces; spaces travel as JSON (`space_to_json`). A Dict or Tuple
observation travels as one array per leaf, in the order of its space (`obs_arrays`). Infos keep only JSON
scalars (numbers, strings, booleans, None).
"""

from __future__ import annotations

import json
import math
from typing import Any

import gymnasium as gym
import numpy as np

PROTOCOL_VERSION = 2  # 2: `steps`, several slots in one request, one reply per slot
MAX_HEADER_BYTES = 64 * 1024
COMMANDS = ("hello", "ping", "reset", "step", "steps", "restore", "close")
# dtypes an array frame may declare: numeric only, so no frame can smuggle objects
ALLOWED_DTYPES = frozenset(np.dtype(t).str for t in (
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64))


class ProtocolError(ValueError):
    """A message that does not follow the protocol; the server answers it with an error."""


# ------------------------------------------------------------------ arrays


class ServiceError(RuntimeError):
    """An env server did not do what was asked: no answer, a bad answer, or the env failed there."""


def encode_array(array: np.ndarray) -> tuple[dict, bytes]:
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a scalar into shape [1])
        array = array.copy(order="C")
    if array.dtype.str not in ALLOWED_DTYPES:
        raise ProtocolError(f"dtype {array.dtype} cannot be sent")
    return {"dtype": array.dtype.str, "shape": list(array.shape)}, array.tobytes()


def decode_array(spec: Any, frame: bytes | memoryview) -> np.ndarray:
    """A numpy array from its header spec and raw frame, after checking both agree."""
    if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str) or not isinstance(spec.get("shape"), list):
        raise ProtocolError("array spec must be {dtype: str, shape: [int, ...]}")
    if spec["dtype"] not in ALLOWED_DTYPES:
        raise ProtocolError(f"array dtype {spec['dtype']!r} is not allowed")
    shape = spec["shape"]
    if len(shape) > 8 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
        raise ProtocolError(f"bad array shape {shape!r}")
    dtype = np.dtype(spec["dtype"])
    expected = dtype.itemsize * math.prod(shape)
    if len(frame) != expected:
        raise ProtocolError(f"array frame has {len(frame)} bytes, its spec {spec['dtype']}{shape} needs {expected}")
    return np.frombuffer(frame, dtype=dtype).reshape(shape)


# ------------------------------------------------------------------ messages


def pack(header: dict, arrays: list[np.ndarray] = ()) -> list[bytes]:
    specs, frames = [], []
    for array in arrays:
        spec, frame = encode_array(array)
        specs.append(spec)
        frames.append(frame)
    if arrays:
        header = {**header, "arrays": specs}
    return [json.dumps(header, allow_nan=False).encode()] + frames


def unpack(frames: list, max_bytes: int) -> tuple[dict, list[np.ndarray]]:
    """(header, arrays) from received frames; ProtocolError on anything malformed or too big."""
    if not frames:
        raise ProtocolError("empty message")
    total = sum(len(f) for f in frames)
    if total > max_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_bytes}")
    head = bytes(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a JSON object")
    specs = header.get("arrays", [])
    if not isinstance(specs, list) or len(specs) != len(frames) - 1:
        raise ProtocolError(f"header lists {len(specs) if isinstance(specs, list) else '?'} arrays, "
                            f"message has {len(frames) - 1} array frames")
    return header, [decode_array(spec, frame) for spec, frame in zip(specs, frames[1:])]


def error_reply(message: str, tag: dict | None = None) -> list[bytes]:
    """An error answer; `tag` ({"id", "slot"}) says which slot of a `steps` request it answers."""
    return pack({"ok": False, **(tag or {}), "error": message})


def json_info(info: dict) -> dict:
    """The JSON-scalar part of an env's info (numpy scalars converted), and of the dicts in it (such as
    `episode_extra_stats`); the rest stays on the server."""
    out = {}
    for key, value in info.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, np.generic) and value.shape == ():
            value = value.item()
        if isinstance(value, dict):
            out[key] = json_info(value)
        elif value is None or isinstance(value, (bool, int, str)):
            out[key] = value
        elif isinstance(value, float) and math.isfinite(value):
            out[key] = value
    return out


# ------------------------------------------------------------------ spaces


def _floats(array: np.ndarray) -> list:
    """JSON has no infinities: write them as strings."""
    return [x if math.isfinite(x) else ("inf" if x > 0 else "-inf") for x in np.asarray(array, np.float64).ravel().tolist()]


def space_to_json(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": space.dtype.str,
                "low": _floats(space.low), "high": _floats(space.high)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(space.start).tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.atleast_1d(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": [[str(key), space_to_json(sub)] for key, sub in space.spaces.items()]}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(sub) for sub in space.spaces]}
    raise ProtocolError(f"{type(space).__name__} spaces cannot be served yet (Box, Discrete, MultiDiscrete, "
                        f"MultiBinary, and Dict or Tuple of them can)")


def space_from_json(data: Any) -> gym.Space:
    try:
        kind = data["type"]
        if kind == "Box":
            shape = tuple(int(n) for n in data["shape"])
            dtype = np.dtype(data["dtype"])
            if dtype.str not in ALLOWED_DTYPES:
                raise ProtocolError(f"Box dtype {dtype} is not allowed")
            low = np.array([float(x) for x in data["low"]], np.float64).reshape(shape)
            high = np.array([float(x) for x in data["high"]], np.float64).reshape(shape)
            return gym.spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(int(data["n"]), start=int(data["start"]))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(np.array(data["nvec"], np.int64), start=np.array(data["start"], np.int64))
        if kind == "MultiBinary":
            n = data["n"]
            return gym.spaces.MultiBinary(n[0] if len(n) == 1 else n)
        if kind == "Dict":  # a list of pairs: JSON objects need not keep their order, the leaves' frames do
            return gym.spaces.Dict({str(key): space_from_json(sub) for key, sub in data["spaces"]})
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_json(sub) for sub in data["spaces"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad space description {data!r}: {exc}") from None
    raise ProtocolError(f"unknown space type {data.get('type') if isinstance(data, dict) else data!r}")


def is_structured(space: gym.Space) -> bool:
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


def leaf_spaces(space: gym.Space) -> list[gym.Space]:
    """The non-structured spaces inside `space`, in the order their arrays travel."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in leaf_spaces(sub)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in leaf_spaces(sub)]
    return [space]


def obs_arrays(space: gym.Space, value: Any) -> list[np.ndarray]:
    """An observation as the arrays that go on the wire: one per leaf of a Dict/Tuple space."""
    if isinstance(space, gym.spaces.Dict):
        return [array for key, sub in space.spaces.items() for array in obs_arrays(sub, value[key])]
    if isinstance(space, gym.spaces.Tuple):
        return [array for sub, item in zip(space.spaces, value, strict=True) for array in obs_arrays(sub, item)]
    return [space_array(space, value)]


def obs_value(space: gym.Space, arrays: list[np.ndarray]) -> Any:
    """The arrays of `obs_arrays` back as the observation (dicts and tuples rebuilt); the caller has
    checked each array against its leaf space."""
    leaves = iter(arrays)

    def build(sub: gym.Space) -> Any:
        if isinstance(sub, gym.spaces.Dict):
            return {key: build(s) for key, s in sub.spaces.items()}
        if isinstance(sub, gym.spaces.Tuple):
            return tuple(build(s) for s in sub.spaces)
        return next(leaves)
    return build(space)


def space_array(space: gym.Space, value: Any) -> np.ndarray:
    """An element of `space` as the array that goes on the wire."""
    if isinstance(space, gym.spaces.Discrete):
        return np.asarray(value, dtype=np.int64).reshape(())
    return np.asarray(value, dtype=space.dtype).reshape(space.shape)


def space_value(space: gym.Space, array: np.ndarray) -> Any:
    """The wire array back as what the env expects (an int for Discrete), checked against the space."""
    if isinstance(space, gym.spaces.Discrete):
        if array.shape != () or array.dtype.kind not in "iu":
            raise ProtocolError(f"a Discrete value must be an integer scalar, got {array.dtype}{list(array.shape)}")
        value: Any = int(array)
    else:
        if tuple(array.shape) != tuple(space.shape):
            raise ProtocolError(f"value shape {list(array.shape)} does not match the space's {list(space.shape)}")
        if array.dtype != space.dtype:
            raise ProtocolError(f"value dtype {array.dtype} does not match the space's {space.dtype}")
        value = array.copy()  # frombuffer views are read-only and tied to the message
    # Box values are left to the env (most clip); a discrete value outside its range is an error
    if not isinstance(space, gym.spaces.Box) and not space.contains(value):
        raise ProtocolError(f"value {value!r} is outside the space {space}")
    return value


def max_message_bytes(*spaces: gym.Space) -> int:
    """What one message may weigh: a header plus a few times the largest value (all its arrays), at least 1 MiB."""
    biggest = max(sum(int(np.prod(leaf.shape or (1,))) * max(np.dtype(leaf.dtype or np.int64).itemsize, 8)
                      for leaf in leaf_spaces(s)) for s in spaces)
    return MAX_HEADER_BYTES + max(4 * biggest, 1 << 20)
