"""Screenshots on the token path: a vision-language model (`tiny-vl`, Qwen2.5-VL) served by the built-in backend.

Each image becomes a run of ``<|image_pad|>`` tokens as long as the model's image processor makes
it; the recorded prompt ids hold those runs, so the calls merge into one sample like text calls do,
and the trainer rebuilds the pixels from the store's blobs: the model's own forward over the
sample, with those pixels, gives back the logprobs recorded while sampling.
"""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any

import httpx
import pytest

from core.chat import ImagePart
from core.errors import TrainingDataError
from core.tokens.vision import IMAGE_PAD, VISION_END, VISION_START, forward_inputs

pytest.importorskip("PIL")


def _png(size: tuple[int, int], colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


SHOT_A, SHOT_B = _png((160, 120), (200, 30, 30)), _png((100, 200), (20, 180, 40))


def _user(text: str, shot: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(shot).decode()
    return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `token` in `ids`."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


@pytest.fixture
def vlm(live_proxy):
    proxy = live_proxy("builtin:tiny-vl")
    return proxy, proxy.app.policy.backend


def _chat(proxy: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    resp = httpx.post(proxy.base + "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 6, "temperature": 1.0}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]


def _record_two_screens(proxy: Any, done: bool = False) -> None:
    """Two calls of one rollout: a screenshot, the model's answer, then a second screenshot (the first still in history)."""
    first = [_user("Click the red button.", SHOT_A)]
    answer = _chat(proxy, first)
    _chat(proxy, [*first, {"role": "assistant", "content": answer["content"]}, _user("Now the green one.", SHOT_B)])
    if done:
        proxy.store.upsert_rollout({"rollout_id": "rollout-1", "run_id": "run-test", "status": "done", "reward": 1.0})
        proxy.store.flush()


def test_each_image_is_a_placeholder_run_as_long_as_the_processor_makes_it(vlm) -> None:
    proxy, backend = vlm
    assert backend.capabilities.images and backend.vision is not None
    vision, tok = backend.vision, backend.tokenizer
    _record_two_screens(proxy)
    rows = proxy.rows("SELECT seq, prompt_token_ids, prefix_tokens, extends_parent, image_hashes FROM calls_full ORDER BY seq")
    assert len(rows) == 2
    pad, start, end = (tok.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VISION_START, VISION_END))
    want = [vision.pad_count(ImagePart(hashlib.sha256(s).hexdigest(), "image/png", s)) for s in (SHOT_A, SHOT_B)]
    assert want[0] != want[1] and all(n > 1 for n in want)  # two sizes: two run lengths
    for (_, prompt, _, _, hashes), images in zip(rows, (1, 2), strict=True):
        runs = _runs(list(prompt), pad)
        assert [n for _, n in runs] == want[:images]  # one run per image, each as long as its grid says
        assert all(prompt[s - 1] == start and prompt[s + n] == end for s, n in runs)
        assert list(hashes) == [hashlib.sha256(s).hexdigest() for s in (SHOT_A, SHOT_B)[:images]]
    # the second call's prompt starts with the first call's prompt + answer, images and all: one branch
    assert rows[1][3] is True and rows[1][2] > len(rows[0][1])


def test_the_trainer_rebuilds_the_pixels_from_blobs_and_gets_the_recorded_logprobs_back(vlm) -> None:
    import torch

    from core.train.samples import samples_for_run
    from core.train.vision import sample_images

    proxy, backend = vlm
    _record_two_screens(proxy, done=True)
    (sample,) = samples_for_run(proxy.store, "run-test")  # the two calls merge: their prompts extend each other
    assert sample.n_calls == 2 and sample.trainable_tokens == 12
    images = sample_images(proxy.store.cursor(), sample)
    assert [i.data for i in images] == [SHOT_A, SHOT_B]  # bytes from `blobs`, in prompt order
    ids = torch.tensor([sample.token_ids])
    inputs = forward_inputs(backend.model, backend.vision, ids, images)
    inputs.pop("rope_deltas")
    with torch.inference_mode():
        logits = backend.model(input_ids=ids, **inputs).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    sampled = [p for p, m in enumerate(sample.loss_mask) if m]
    recomputed = [float(logp[p - 1, sample.token_ids[p]]) for p in sampled]
    recorded = [sample.logprobs[p] for p in sampled]
    assert recomputed == pytest.approx(recorded, abs=1e-4)
    # and without the pixels (the image tokens' own embeddings) the same tokens score otherwise: the pixels matter
    with torch.inference_mode():
        blind = torch.log_softmax(backend.model(input_ids=ids).logits[0].float(), dim=-1)
    assert max(abs(float(blind[p - 1, sample.token_ids[p]]) - r) for p, r in zip(sampled, recorded, strict=True)) > 1e-3


def test_a_text_model_still_refuses_images_and_the_vision_model_takes_text_alone(live_proxy) -> None:
    text_only = live_proxy("builtin:tiny")
    resp = httpx.post(text_only.base + "/v1/chat/completions", json={"model": "m", "messages": [_user("look", SHOT_A)], "max_tokens": 2}, timeout=60)
    assert resp.status_code == 400 and "takes text only" in resp.json()["error"]["message"]
    vlm = live_proxy("builtin:tiny-vl")
    message = _chat(vlm, [{"role": "user", "content": "no picture today"}])
    assert isinstance(message["content"], str)
    ((prompt,),) = vlm.rows("SELECT prompt_token_ids FROM calls_full")
    assert vlm.app.policy.backend.vision.pad_id not in list(prompt)


def test_the_local_trainer_steps_on_a_screenshot_sample_and_the_backend_takes_the_new_weights(vlm) -> None:
    from core.train.local import LocalTrainer
    from core.train.samples import samples_for_run
    from core.train.vision import sample_images

    proxy, backend = vlm
    _record_two_screens(proxy, done=True)
    (sample,) = samples_for_run(proxy.store, "run-test")
    sample.advantage = 1.0
    # small enough that the first (sign-like) Adam step's first-order gain beats its curvature whatever was sampled
    trainer = LocalTrainer("tiny-vl", tokenizer=backend.tokenizer, lr=1e-3, seed=0)
    assert trainer.vision is not None
    with pytest.raises(TrainingDataError, match=r"holds \d+ image tokens but its 0 loaded image"):  # never a silent text-only step
        trainer.step([sample])
    sample.images = sample_images(proxy.store.cursor(), sample)
    before = trainer.logprobs([sample])[0]
    metrics = trainer.step([sample])
    # the trainer's own forward (pixels and 3D positions rebuilt) agrees with the sampler before the update
    assert metrics["optimizer_step"] == 1.0 and metrics["logprob_diff_max"] < 1e-4 and metrics["tokens"] == 12
    after = trainer.logprobs([sample])[0]
    sampled = [p for p, m in enumerate(sample.loss_mask) if m]
    assert sum(after[p] for p in sampled) > sum(before[p] for p in sampled)  # a positive advantage made them likelier
    backend.reload_weights(trainer.state_dict_for_backend())
    assert backend.weights_version == 1



def test_the_backend_never_samples_an_image_marker_and_the_trainer_names_one_that_was(vlm) -> None:
    from core.train.local import LocalTrainer
    from core.train.samples import samples_for_run
    from core.train.vision import sample_images

    proxy, backend = vlm
    vocab = backend.tokenizer.get_vocab()
    markers = {vocab[t] for t in (VISION_START, IMAGE_PAD, VISION_END)}
    assert markers <= set(backend._banned.tolist())
    _record_two_screens(proxy, done=True)
    (sample,) = samples_for_run(proxy.store, "run-test")
    sample.images = sample_images(proxy.store.cursor(), sample)
    at = next(p for p, m in enumerate(sample.loss_mask) if m)
    sample.token_ids[at] = vocab[IMAGE_PAD]  # as a backend without the ban could have sampled
    trainer = LocalTrainer("tiny-vl", tokenizer=backend.tokenizer, lr=1e-3, seed=0)
    with pytest.raises(TrainingDataError, match=r"sampled 1 image placeholder token"):
        trainer.step([sample])


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_gui_training_step_with_screenshots_on_the_token_path(docker_client, base_image) -> None:
    """MiniWoB in real Chromium, react sending screenshots, tiny-vl sampling them, one local GRPO step over the samples."""
    import asyncio

    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = [
        "env.name=miniwob", 'env.options.names=["click-test"]', 'harness.name="react"', 'harness.options.gui="image"',
        'policy.backend="builtin:tiny-vl"', "runtime.kind=docker", "run.n_samples=2", "run.timeout_s=300",
        "train.steps=1", "train.seed=0",
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    assert summary.infra_errors == 0
    with duckdb.connect(summary.store, read_only=True) as con:
        calls = con.execute("SELECT count(*), min(len(image_hashes)), count(DISTINCT weights_version) FROM calls WHERE status = 'ok'").fetchone()
        blobs = con.execute("SELECT count(*), min(media_type) FROM blobs").fetchone()
        (metrics,) = con.execute("SELECT metrics FROM train_steps WHERE step = 0").fetchone()
    n_calls, fewest_images, _ = calls
    assert n_calls >= 2 and fewest_images >= 1  # every call the policy answered carried the screen
    assert blobs[0] >= 1 and blobs[1] == "image/png"
    import json

    metrics = json.loads(metrics) if isinstance(metrics, str) else metrics
    # the trainer recomputed the sampled tokens' logprobs with each sample's screenshots rebuilt from the blobs
    assert metrics["logprob_diff_tokens"] > 0 and metrics["logprob_diff_max"] < 1e-3, metrics
