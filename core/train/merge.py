"""Weight interpolation between two checkpoints of one model: `start + α · (end − start)`.

The field's remedy for a fine-tuned policy that gained on what it trained on and drifted on what it did not
(WiSE-FT, Wortsman et al. 2022; WARP's interpolation towards the initialisation, Ramé et al. 2024): part of the
way back towards the start keeps most of the gain where the update agreed and undoes the drift where it was
noise. Here `start` is the SFT checkpoint and `end` the GRPO one (`grpo.merge` in a learning recipe).
Written by hand: the tensors are a few hundred MB on a CPU, and no library we depend on ships it (mergekit
would be a whole toolchain for one line of arithmetic).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from core.errors import ModelError
from core.train import weights as W
from core.train.checkpoints import TRAINER_STATE

log = logging.getLogger(__name__)


def interpolate(start: Path, end: Path, alpha: float, out: Path) -> Path:
    """A model folder `out` holding `start + alpha · (end − start)`, tensor by tensor, in `end`'s dtypes; `end`'s config and
    tokenizer files beside it (not its trainer state: the folder is a model to serve, not a point to resume from).

    alpha 1 is `end`, 0 is `start`. Both must hold the same tensors with the same shapes (one model's checkpoints).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"merge alpha must be in [0, 1] (0: the start checkpoint, 1: the end one), not {alpha}")
    return _combine([(Path(start), 1.0 - alpha), (Path(end), alpha)], out)


def average(checkpoints: Sequence[Path], out: Path) -> Path:
    """A model folder `out` holding the uniform mean of `checkpoints` (one model's, same tensors and shapes), in the last
    one's dtypes, with the last one's config and tokenizer files: weight averaging along one run (LAWA, Kaddour 2022;
    SWA, Izmailov et al. 2018), which smooths the step-to-step noise of a short RL run."""
    if not checkpoints:
        raise ValueError("average needs at least one checkpoint")
    share = 1.0 / len(checkpoints)
    return _combine([(Path(c), share) for c in checkpoints], out)


def _combine(weighted: list[tuple[Path, float]], out: Path) -> Path:
    """`out` holding Σ wᵢ · checkpointᵢ tensor by tensor in the last checkpoint's dtypes (float32 arithmetic), its small files beside."""
    states = [(path, W.read_weights(path), w) for path, w in weighted]
    last_path, last, _ = states[-1]
    for path, state, _ in states[:-1]:
        if state.keys() != last.keys():
            only_a, only_b = sorted(state.keys() - last.keys())[:3], sorted(last.keys() - state.keys())[:3]
            raise ModelError(f"cannot combine {path} and {last_path}: they hold different tensors "
                             f"(only in the first: {only_a}, only in the second: {only_b}); all must be checkpoints of one model")
    merged = {}
    for name, theirs in last.items():
        for path, state, _ in states[:-1]:
            if state[name].shape != theirs.shape:
                raise ModelError(f"cannot combine {path} and {last_path}: {name} is {tuple(state[name].shape)} in one, "
                                 f"{tuple(theirs.shape)} in the other")
        if not all(state[name].is_floating_point() for _, state, _ in states):
            merged[name] = theirs.clone()  # an integer buffer (none in today's models) is not a weight to blend
            continue
        total = sum(w * state[name].float() for _, state, w in states)
        merged[name] = total.to(theirs.dtype)
    return _write(merged, last_path, out)


def _write(state: dict, end: Path, out: Path) -> Path:
    """`state` as out/model.safetensors (`weights.write_weights`: whole, then renamed in), with `end`'s small files beside it."""
    out.mkdir(parents=True, exist_ok=True)
    for f in end.iterdir():
        # not the weights (an index of shards included: the merged weights are one file), not the trainer state
        if f.is_file() and ".safetensors" not in f.name and f.name != TRAINER_STATE and not f.name.endswith(".tmp"):
            shutil.copy2(f, out / f.name)
    W.write_weights(state, out)
    log.info("combined %d tensors into %s", len(state), out)
    return out
