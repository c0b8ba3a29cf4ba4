"""The local trainer: one policy-gradient update per `step(samples)` on a transformers causal LM.

The math is veRL's (policy loss, loss aggregation, KL penalty, entropy), called, not copied;
this module does the batching, gradient accumulation, optimizer, LoRA and checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field

from core.chat import ImagePart
from core.config import (
    InProcessSettings,
    LossAggMode,
    PolicyLossSettings,
    RolloutCorrection,
    TrainConfig,
    UpdateSettings,
)
from core.errors import ConfigError, TrainingDataError
from core.models.precision import resolve_dtype
from core.options import validated
from core.tokens.vision import forward_inputs, vision_prompt
from core.train import weights as W
from core.train.checkpoints import PRUNED, TRAINER_STATE
from core.train.logprobs import Batch, collate, pack, token_logprobs
from core.train.types import Sample

log = logging.getLogger(__name__)

STATE_VERSION = 1
OldLogprobs = Literal["recorded", "recomputed"]
# the choices as tuples, from the one declaration of each (the config's Literals and OldLogprobs)
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
OLD_LOGPROBS: tuple[str, ...] = get_args(OldLogprobs)
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)
AGREEMENT = 1e-3  # |recorded − recomputed| logprob beyond which "auto" applies the rollout correction


class LocalTrainerConfig(UpdateSettings, PolicyLossSettings, InProcessSettings):
    """Hyperparameters of `LocalTrainer`; the defaults are chosen for on-policy RL on agent trajectories.

    The settings a run config gives it are the three [train] groups it is built from (core.config: declared and
    checked there, once); the fields below are the ones only code sets (benchmarks, tests, a library caller).

    loss_agg_mode="token-mean": every trainable token in the step weighs the same. A rollout may
    arrive as several branch samples (the harness compacted or rewrote its history) and a sample
    merges several calls; under token-mean a rollout's weight is its number of sampled tokens
    however it was split into samples, so splitting a rollout into three branches does not triple
    its say, and a short branch (a title call) does not outweigh a long one token for token, as it
    would under "seq-mean-token-mean" (each sample weighs the same, each of its tokens 1/len).
    Token-mean is also what DAPO and Dr.GRPO recommend against the length bias of per-sequence
    means. The denominator is the trainable tokens of the samples trained in the step (samples
    with advantage 0 are skipped and not counted, as DAPO's dynamic sampling drops flat groups).

    old_logprobs="recorded": the PPO ratio is taken against the logprobs the sampler recorded
    (the behaviour policy), so the clip bounds the update relative to the weights that actually
    sampled the tokens, also when a sample is a step or more stale. "recomputed" uses the current
    weights before the update (ratio 1, clipping never fires: plain on-policy policy gradient).
    Either way `logprob_diff_*` reports how far the recorded logprobs are from the recomputed.

    rollout_correction="auto": where the sampler's and the trainer's logprobs of a micro-batch
    disagree by more than 1e-3 (a bfloat16 sampler or trainer, a different kernel), veRL's own
    rollout correction is applied instead of ignoring the gap: the PPO ratio is taken against the
    trainer's recomputed logprobs and each token's loss is weighted by the truncated importance
    weight min(π_trainer / π_sampler, rollout_is_threshold) (`compute_rollout_correction_weights`,
    token level; "sequence": one weight per sample). "token"/"sequence" apply it always, "off" never.

    lr=1e-6 and max_grad_norm=1.0 are veRL's actor defaults for full fine-tuning; LoRA usually
    wants 1e-5 to 1e-4. weight_decay=0: decoupled decay pulls weights toward zero, not toward the
    pretrained weights, which rewards nothing. dtype: what the forward and backward compute in;
    the weights and the optimizer stay float32 (a bfloat16 weight cannot take a 1e-6 update), and
    "bfloat16" runs them under autocast; "auto" is bfloat16 on a CUDA GPU and float32 on a CPU
    (core.models.precision; float32 gives exact logprob agreement). The model is kept in eval
    mode (no dropout), so recomputed logprobs match the sampler's.

    Samples are packed (`core.train.logprobs`): each forward runs up to `pack_samples` samples
    and `pack_tokens` tokens end to end with no padding (gradients accumulate over a step's forwards,
    exactly: the two bound speed and memory, not what is learned). share_prefix: samples of a forward that
    begin alike (a harness's system prompt, a GRPO group's prompt) run their common beginning once
    (exact; see `core.train.logprobs`), and rows are filled in token order so that they do. gradient_checkpointing: recompute each
    layer's activations in the backward pass (memory per step grows far slower with sample length).
    """

    weight_decay: float = Field(0.0, description="AdamW's decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decay rates")
    eps: float = Field(1e-8, description="AdamW's epsilon")
    pack_tokens: int = Field(8192, ge=1, description="tokens per forward at most (a longer sample runs alone)")
    clip_ratio_low: float | None = Field(None, description="the lower ratio clip (unset: clip_ratio)")
    clip_ratio_high: float | None = Field(None, description="the upper ratio clip (unset: clip_ratio)")
    clip_ratio_c: float = Field(3.0, description="dual-clip bound for negative advantages")
    old_logprobs: OldLogprobs = Field("recorded", description="what the PPO ratio is taken against")
    lora_target_modules: str | list[str] = Field("all-linear", description="the modules LoRA adapts (peft's target_modules)")
    lora_dropout: float = Field(0.0, description="LoRA's dropout")
    rollout_is_threshold: float = Field(2.0, gt=1, description="truncation of the rollout correction's importance weights (veRL's default)")
    device: str = Field("auto", description="where the model trains (auto: CUDA when there is one, else the CPU)")


# the [train] groups a run config gives the local trainer (the rest of LocalTrainerConfig only code sets)
FROM_TRAIN: tuple[type, ...] = LocalTrainerConfig.__bases__


class LocalTrainer:
    """A causal LM trained in-process on recorded samples (full fine-tuning or LoRA)."""

    def __init__(
        self,
        model: str | Path | Any,
        *,
        tokenizer: Any = None,
        config: LocalTrainerConfig | None = None,
        **overrides: Any,
    ) -> None:
        """`model`: a built-in name ("tiny"), a local HF folder, or an already-loaded transformers model."""
        import torch

        base = config or LocalTrainerConfig()
        self.config = validated(LocalTrainerConfig, {**base.model_dump(), **overrides}) if overrides else base
        cfg = self.config
        self._torch = torch
        self.device = W.pick_device(cfg.device)
        self.compute_dtype = resolve_dtype(cfg.dtype, self.device)
        if isinstance(model, str | Path):
            model, loaded_tokenizer = W.load_model(model, "float32")  # master weights; compute_dtype under autocast
            tokenizer = tokenizer or loaded_tokenizer
        self.tokenizer = tokenizer
        model.to(self.device)
        self.packed = W.use_packed_attention(model)  # else one sample per forward (still no padding)
        if cfg.gradient_checkpointing:
            W.enable_checkpointing(model)
        self._ref = None
        if cfg.kl_coef > 0 and not cfg.lora_rank:
            self._ref = copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)
        if cfg.lora_rank:
            model = W.add_lora(
                model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, cfg.lora_dropout
            )
        model.eval()  # no dropout: recomputed logprobs must match the sampler's
        self.model = model
        self._checkpointed = W.checkpointed_layers(model) if cfg.gradient_checkpointing else []
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warmup) if warmup > 0 else 1.0
        )
        self.updates = 0  # optimizer steps taken
        # a vision-language model (Qwen2-VL style) trains on samples with images: their pixels go in each forward
        vl = hasattr(W.base_model(model).config, "vision_config")
        self.vision = vision_prompt(tokenizer) if vl and tokenizer is not None else None
        self._policy_loss, self._actor = self._veRL_policy_loss()

    # ------------------------------------------------------------------ setup

    def _check_images(self, sample: Sample) -> None:
        """A sample's image tokens are exactly its loaded images' runs (else the forward would read pads as text)."""
        assert self.vision is not None
        pads = sum(1 for t in sample.token_ids if t == self.vision.pad_id)
        need = sum(self.vision.pad_count(image) for image in sample.images)
        sampled = sum(1 for t, m in zip(sample.token_ids, sample.loss_mask, strict=False) if m and t == self.vision.pad_id)
        if sampled:
            raise TrainingDataError(
                f"sample {sample.sample_id}: the policy sampled {sampled} image placeholder token(s), which no image fills; "
                "a backend serving a vision model must not sample its image markers (the built-in one never does)"
            )
        if pads != need:
            raise TrainingDataError(
                f"sample {sample.sample_id} holds {pads} image tokens but its {len(sample.images)} loaded image(s) make {need}; "
                "load a sample's images from the store with core.train.vision.sample_images"
            )

    def _image_inputs(self, input_ids: Any, attention_mask: Any, images: list[ImagePart]) -> dict[str, Any]:
        """A batch's pixel inputs and 3D positions, from the model's own rope index."""
        inputs = forward_inputs(W.base_model(self.model), self.vision, input_ids, images, attention_mask)
        inputs.pop("rope_deltas")
        return inputs

    def _veRL_policy_loss(self) -> tuple[Any, Any]:
        """veRL's policy-loss function and the actor config it reads (clip ratios, global batch info)."""
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config.actor import FSDPActorConfig

        cfg = self.config
        try:
            fn = get_policy_loss_fn(cfg.policy_loss)
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"policy_loss {cfg.policy_loss!r}: {exc}") from None
        actor = FSDPActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_mini_batch_size=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=cfg.clip_ratio,
            clip_ratio_low=cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c,
            loss_agg_mode=cfg.loss_agg_mode,
        )
        return fn, actor

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ logprobs

    def _micro_batches(self, samples: Sequence[Sample]) -> Iterator[tuple[list[Sample], Batch]]:
        """Samples packed `pack_samples` (and at most `pack_tokens` tokens) to a forward, alike lengths together."""
        if self.vision is not None:
            for sample in samples:
                self._check_images(sample)
        cfg = self.config
        alone = not self.packed or self.vision is not None  # images: 3D positions span a whole row
        share = cfg.share_prefix and not alone
        for chunk in pack(samples, cfg.pack_samples, cfg.pack_tokens, alone=alone, share_prefix=share):
            yield chunk, collate(chunk, self.device, self._image_inputs if self.vision is not None else None, share_prefix=share)

    @contextlib.contextmanager
    def _compute(self) -> Iterator[None]:
        """The forward's precision (autocast to `dtype` over float32 weights) and gradient checkpointing, for one pass."""
        torch = self._torch
        for layer in self._checkpointed:  # transformers checkpoints a layer only while it is "training"; nothing else changes
            layer.training = torch.is_grad_enabled()
        try:
            if self.compute_dtype == torch.float32:
                yield
            else:
                with torch.autocast(device_type=self.device.split(":")[0], dtype=self.compute_dtype):
                    yield
        finally:
            for layer in self._checkpointed:
                layer.training = False

    def _logprobs(self, model: Any, batch: Batch, temperature: float, **kw: Any) -> tuple[Any, Any]:
        with self._compute():
            return token_logprobs(model, batch, temperature, **kw)

    def logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Each sample's logprobs under the current weights, aligned with its tokens (0.0 where loss_mask is 0)."""
        torch = self._torch
        out: dict[int, list[float]] = {}
        with torch.no_grad():
            for chunk, batch in self._micro_batches(samples):
                logp, _ = self._logprobs(self.model, batch, self.config.temperature)
                values = logp.cpu().tolist()
                for row, s in enumerate(chunk):
                    lps = [0.0] * len(s.token_ids)
                    trained = [p + 1 for p in range(len(s.token_ids) - 1) if s.loss_mask[p + 1]]
                    for k, pos in enumerate(trained):
                        lps[pos] = values[row][k]
                    out[id(s)] = lps
        return [out[id(s)] for s in samples]

    def logprob_agreement(self, samples: Sequence[Sample]) -> dict[str, float]:
        """max and mean |recorded − recomputed| logprob over every loss-mask-1 token (no update)."""
        torch = self._torch
        worst, total, count = 0.0, 0.0, 0
        with torch.no_grad():
            for _, batch in self._micro_batches(samples):
                logp, _ = self._logprobs(self.model, batch, self.config.temperature)
                diff = (logp - batch.recorded).abs() * batch.mask
                worst = max(worst, float(diff.max())) if diff.numel() else worst
                total += float(diff.sum())
                count += batch.tokens
        return {
            "logprob_diff_max": worst,
            "logprob_diff_mean": total / count if count else 0.0,
            "tokens": float(count),
        }

    def _ref_logprobs(self, batch: Batch) -> Any:
        """The batch's logprobs under the frozen reference (the starting weights)."""
        torch = self._torch
        with torch.no_grad():
            if self._ref is not None:
                return self._logprobs(self._ref, batch, self.config.temperature)[0]
            with self.model.disable_adapter():  # LoRA: the base weights are the reference
                return self._logprobs(self.model, batch, self.config.temperature)[0]

    # ------------------------------------------------------------------ the update

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step over all `samples` (gradients accumulated over micro-batches); its metrics.

        Samples with advantage 0 (or no sampled token) are skipped: they would add no policy
        gradient; they are counted in `samples` and `samples_skipped`. The `logprob_diff_*`
        metrics compare recorded logprobs with those of the current weights before the update,
        over the trained samples' tokens, or over every sample's when none trains (a flat step);
        `logprob_diff_tokens` says over how many tokens.
        """
        samples = list(samples)
        active = [s for s in samples if s.advantage != 0.0 and _trainable(s) > 0]
        tokens = sum(_trainable(s) for s in active)
        metrics: dict[str, float] = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "pg_clipfrac": 0.0,
            "ppo_kl": 0.0,
            "kl": 0.0,
            "entropy": 0.0,
            "grad_norm": 0.0,
            "lr": self.lr,
            "samples": float(len(samples)),
            "samples_trained": float(len(active)),
            "samples_skipped": float(len(samples) - len(active)),
            "tokens": float(tokens),
            "logprob_diff_max": 0.0,
            "logprob_diff_mean": 0.0,
            "logprob_diff_tokens": float(tokens),
            "optimizer_step": 0.0,
        }
        if not active:
            log.info("step: no sample with a non-zero advantage among %d; no update", len(samples))
            return self._flat_step(metrics, samples)
        batch_info = {
            "dp_size": 1,
            "batch_num_tokens": tokens,
            "global_batch_size": len(active),
            "loss_scale_factor": max(len(s.token_ids) for s in active),
        }
        self._actor.global_batch_info.clear()
        self._actor.global_batch_info.update(batch_info)
        self.optimizer.zero_grad(set_to_none=True)
        metrics["rollout_is_max"] = 0.0
        sums = {"diff": 0.0, "is": 0.0, "corrected": 0.0}
        started, ran = time.perf_counter(), 0
        for _, batch in self._micro_batches(active):
            ran += batch.width
            self._policy_backward(batch, batch_info, metrics, sums)
        metrics["logprob_diff_mean"] = sums["diff"] / tokens
        metrics["rollout_is_tokens"] = sums["corrected"]  # tokens whose loss the rollout correction weighted
        metrics["rollout_is_mean"] = sums["is"] / sums["corrected"] if sums["corrected"] else 1.0
        out = self._apply_gradients(metrics, "step")
        return self._speed(out, ran, time.perf_counter() - started)

    def _flat_step(self, metrics: dict[str, float], samples: list[Sample]) -> dict[str, float]:
        """A step with nothing to train: still check the sampler against the trainer (else a perfect 0.0, unmeasured)."""
        measurable = [s for s in samples if _trainable(s) > 0]
        if measurable:
            agreement = self.logprob_agreement(measurable)
            metrics["logprob_diff_max"] = agreement["logprob_diff_max"]
            metrics["logprob_diff_mean"] = agreement["logprob_diff_mean"]
            metrics["logprob_diff_tokens"] = agreement["tokens"]
        return metrics

    def _policy_backward(self, batch: Batch, batch_info: dict[str, Any], metrics: dict[str, float], sums: dict[str, float]) -> None:
        """One micro-batch's policy loss (+ KL and entropy terms), backward; its share added to `metrics` and `sums`."""
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

        torch = self._torch
        cfg = self.config
        n, tokens = batch.tokens, batch_info["batch_num_tokens"]
        logp, entropy = self._logprobs(self.model, batch, cfg.temperature, with_entropy=True, entropy_grad=cfg.entropy_coef > 0)
        with torch.no_grad():
            diff = (logp.detach() - batch.recorded).abs() * batch.mask
            worst = float(diff.max())
            metrics["logprob_diff_max"] = max(metrics["logprob_diff_max"], worst)
            sums["diff"] += float(diff.sum())
        old = batch.recorded if cfg.old_logprobs == "recorded" else logp.detach()
        is_weights = self._rollout_correction(logp.detach(), batch, worst)
        if is_weights is not None:  # veRL's decoupled mode: the ratio against the trainer's own logprobs
            old = logp.detach()
            sums["corrected"] += n
            sums["is"] += float((is_weights * batch.mask).sum())
            metrics["rollout_is_max"] = max(metrics["rollout_is_max"], float(is_weights.max()))
        pg_loss, pg_metrics = self._policy_loss(
            old_log_prob=old,
            log_prob=logp,
            advantages=batch.advantages,
            response_mask=batch.mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=self._actor,
            rollout_is_weights=is_weights,
        )
        loss = pg_loss
        if cfg.kl_coef > 0:
            kl = agg_loss(kl_penalty(logp, self._ref_logprobs(batch), cfg.kl_type), batch.mask, cfg.loss_agg_mode, **batch_info)
            loss = loss + cfg.kl_coef * kl
            metrics["kl"] += float(kl.detach())
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * agg_loss(entropy, batch.mask, cfg.loss_agg_mode, **batch_info)
        loss.backward()  # checkpointed layers recompute under the forward's autocast state (torch keeps it)
        metrics["loss"] += float(loss.detach())
        metrics["pg_loss"] += float(pg_loss.detach())
        metrics["pg_clipfrac"] += _metric(pg_metrics, "pg_clipfrac") * n / tokens
        metrics["ppo_kl"] += _metric(pg_metrics, "ppo_kl") * n / tokens
        metrics["entropy"] += float(entropy.sum()) / tokens

    def _rollout_correction(self, recomputed: Any, batch: Batch, worst: float) -> Any:
        """veRL's truncated importance weights π_trainer/π_sampler for this micro-batch, or None where none apply."""
        mode = self.config.rollout_correction
        if mode == "off" or (mode == "auto" and worst <= AGREEMENT):
            return None
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

        weights, _ = compute_rollout_correction_weights(
            recomputed - batch.recorded,
            batch.mask,
            rollout_is="sequence" if mode == "sequence" else "token",
            rollout_is_threshold=self.config.rollout_is_threshold,
        )
        return weights

    def _speed(self, metrics: dict[str, float], ran: int, seconds: float) -> dict[str, float]:
        """The update's own throughput: tokens run through forward + backward (no padding: packed) per second."""
        metrics["train_tokens"] = float(ran)
        metrics["train_s"] = seconds
        metrics["train_tokens_per_s"] = ran / seconds if seconds > 0 else 0.0
        return metrics

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One supervised optimizer step: token-mean NLL of the loss-mask-1 tokens of all `samples` (at temperature 1).

        Every trainable token of the step weighs the same (the sum over micro-batches is divided
        by the step's trainable tokens); advantages and recorded logprobs are not used.
        """
        active = [s for s in samples if _trainable(s) > 0]
        tokens = sum(_trainable(s) for s in active)
        metrics: dict[str, float] = {"loss": 0.0, "grad_norm": 0.0, "lr": self.lr, "tokens": float(tokens), "samples": float(len(samples)), "optimizer_step": 0.0}
        if not active:
            log.info("sft_step: no trainable token among %d samples; no update", len(samples))
            return metrics
        self.optimizer.zero_grad(set_to_none=True)
        started, ran = time.perf_counter(), 0
        for _, batch in self._micro_batches(active):
            ran += batch.width
            logp, _ = self._logprobs(self.model, batch, 1.0)
            loss = -(logp * batch.mask).sum() / tokens
            loss.backward()
            metrics["loss"] += float(loss.detach())
        return self._speed(self._apply_gradients(metrics, "sft_step"), ran, time.perf_counter() - started)

    def _apply_gradients(self, metrics: dict[str, float], caller: str) -> dict[str, float]:
        """Clip, then take the optimizer and schedule step (skipped on a non-finite gradient norm)."""
        torch = self._torch
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm))
        metrics["grad_norm"] = grad_norm
        if not math.isfinite(grad_norm):
            log.warning("%s: gradient norm is %s; update skipped", caller, grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
            return metrics
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        metrics["optimizer_step"] = 1.0
        return metrics

    # ------------------------------------------------------------------ weights out

    def state_dict_for_backend(self) -> dict[str, Any]:
        """The full weights (LoRA merged in) on the CPU, under plain-model names: for `BuiltinBackend.reload_weights`."""
        return W.merged_state_dict(self.model)

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write a transformers folder (merged weights + tokenizer; `builtin:PATH` loads it) and the trainer state."""
        torch = self._torch
        path = Path(path).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        W.save_hf_folder(self.model, self.tokenizer, path, self.state_dict_for_backend())
        lora = None
        if W.is_peft(self.model):
            from peft import get_peft_model_state_dict

            lora = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.model).items()}
        state = {
            "version": STATE_VERSION,
            "updates": self.updates,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "config": self.config.model_dump(),
            "lora": lora,
        }
        tmp = path / (TRAINER_STATE + ".tmp")
        torch.save(state, tmp)
        tmp.replace(path / TRAINER_STATE)  # written last: its presence marks a complete checkpoint
        log.info("checkpoint after %d updates written to %s", self.updates, path)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore weights, optimizer and schedule from `save_checkpoint`'s folder.

        Build the trainer the way the checkpointed one was built (same starting model, same LoRA
        settings): a LoRA checkpoint restores the adapter onto this trainer's base weights, and
        the KL reference stays this trainer's starting weights.
        """
        torch = self._torch
        path = Path(path).expanduser()
        state_file = path / TRAINER_STATE
        if not state_file.exists():
            raise ConfigError(
                f"{path} is not a trainer checkpoint (no {TRAINER_STATE}); save one with save_checkpoint"
            )
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        if state.get(PRUNED):
            raise ConfigError(
                f"{path} kept its weights only (its trainer state was pruned: train.keep_states keeps the newest); "
                "resume from a newer checkpoint, or serve this one as builtin:PATH"
            )
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"{state_file}: trainer state version {state.get('version')}, this trainer reads {STATE_VERSION}"
            )
        saved_lora = state.get("lora") is not None
        if saved_lora != W.is_peft(self.model):
            kind = "LoRA" if saved_lora else "full fine-tuning"
            raise ConfigError(
                f"{path} is a {kind} checkpoint; build the trainer the same way (lora_rank) to resume it"
            )
        if saved_lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state["lora"])
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ConfigError(f"{path}: LoRA weights do not fit this trainer's adapter: {unexpected[:5]}")
        else:
            W.load_full_weights(self.model, W.read_weights(path))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
        log.info("resumed from %s after %d updates", path, self.updates)


def _trainable(sample: Sample) -> int:
    """Loss-mask-1 tokens that have a prediction (every one after the first token)."""
    return sum(sample.loss_mask[1:])


def _metric(metrics: dict[str, Any], name: str) -> float:
    """A veRL metric by its short name ("actor/pg_clipfrac" or "pg_clipfrac"); 0 when absent."""
    value = metrics.get(f"actor/{name}", metrics.get(name, 0.0))
    return float(value.item() if hasattr(value, "item") else value)


def trainer_settings(train: TrainConfig) -> dict[str, Any]:
    """The LocalTrainerConfig fields a run config's [train] section sets: every field of the groups in FROM_TRAIN."""
    return {name: getattr(train, name) for group in FROM_TRAIN for name in group.model_fields}
