"""Per-token logprobs of samples under a causal LM, computed the way the samplers record them.

A sampled token's logprob is ``log_softmax(logits / temperature)[token]`` (before any top-p
truncation), as `BuiltinBackend` records it. Only the positions that predict a loss-mask-1 token
go through the LM head (``logits_to_keep`` with the positions), so a long trajectory made mostly
of tool output costs one hidden state per token and a vocabulary row only per sampled token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.chat import ImagePart
from core.errors import ForgetuiError
from core.train.types import Sample


@dataclass
class Batch:
    """Right-padded samples; the (B, K) tensors cover the K positions whose next token any sample trains on."""

    input_ids: Any  # (B, L) long
    attention_mask: Any  # (B, L) long
    positions: Any  # (K,) long: index p predicts token p + 1
    targets: Any  # (B, K) long: the token at p + 1
    mask: Any  # (B, K) float: 1 where the token at p + 1 was sampled by the model
    recorded: Any  # (B, K) float: the recorded logprob of that token (0 where mask is 0)
    advantages: Any  # (B, K) float: the sample's advantage on every position (masked by `mask`)
    # what else the forward takes: a vision-language batch's pixel values, image grids and 3D positions
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Trainable tokens in the batch."""
        return int(self.mask.sum().item())


ImageInputs = Callable[[Any, Any, list[ImagePart]], dict[str, Any]]


def collate(samples: Sequence[Sample], pad_id: int, device: Any = "cpu", image_inputs: ImageInputs | None = None) -> Batch:
    """Pad samples to one batch and pick the positions that predict a sampled token.

    Samples with images need `image_inputs(input_ids, attention_mask, images)`: the forward's
    pixel inputs for the batch's images in row order (`core.tokens.vision.forward_inputs`).
    """
    import torch

    width = max(len(s.token_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.float32)
    recorded = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        size = len(s.token_ids)
        if not (len(s.loss_mask) == len(s.logprobs) == size):
            raise ForgetuiError(
                f"sample {s.sample_id}: {size} tokens, {len(s.loss_mask)} mask entries, {len(s.logprobs)} "
                "logprobs; they must be aligned one per token"
            )
        ids[i, :size] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[i, :size] = 1
        loss_mask[i, :size] = torch.tensor(s.loss_mask, dtype=torch.float32)
        recorded[i, :size] = torch.tensor(s.logprobs, dtype=torch.float32)
    # the first token has no prediction: a sample's first sampled token comes after its prompt
    loss_mask[:, 0] = 0.0
    positions = torch.nonzero(loss_mask[:, 1:].sum(dim=0) > 0).squeeze(-1)
    nxt = positions + 1
    adv = torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32).unsqueeze(-1)
    mask = loss_mask[:, nxt]
    inputs: dict[str, Any] = {}
    images = [image for s in samples for image in s.images]
    if images:
        if image_inputs is None:
            raise ForgetuiError("these samples carry images, and the model being trained takes text only")
        inputs = image_inputs(ids.to(device), attn.to(device), images)
    return Batch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        positions=positions.to(device),
        targets=ids[:, nxt].to(device),
        mask=mask.to(device),
        recorded=recorded[:, nxt].to(device),
        advantages=(adv * mask).to(device),
        inputs=inputs,
    )


def token_logprobs(
    model: Any, batch: Batch, temperature: float, *, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Any, Any]:
    """(logprobs (B, K), entropy (B, K) or None) of the batch's target tokens under `model`.

    Gradients flow through the logprobs when the caller has them enabled; through the entropy
    (of the temperature-scaled distribution) only with `entropy_grad` (an entropy bonus).
    """
    import torch

    if batch.positions.numel() == 0:
        empty = torch.zeros_like(batch.mask)
        return empty, (empty if with_entropy else None)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        logits_to_keep=batch.positions,
        use_cache=False,
        **batch.inputs,
    )
    logits = out.logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = torch.gather(logp, -1, batch.targets.unsqueeze(-1)).squeeze(-1) * batch.mask
    entropy = None
    if with_entropy:
        from verl.utils.torch_functional import entropy_from_logits

        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach()) * batch.mask
    return picked, entropy


def sampler_temperature(temperature: float, greedy_below: float = 1e-5) -> float:
    """The temperature logprobs are recomputed with: the sampler's, or 1 for greedy (as recorded)."""
    return 1.0 if temperature < greedy_below else float(temperature)
