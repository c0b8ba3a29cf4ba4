"""Weight interpolation between checkpoints (grpo.merge): SFT + α·(GRPO − SFT), a model folder a backend loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.errors import ModelError
from core.train.merge import average, interpolate


def checkpoint(path: Path, tensors: dict[str, torch.Tensor], *, trainer_state: bool = True) -> Path:
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    (path / "tokenizer.json").write_text("{}")
    if trainer_state:
        (path / "trainer_state.pt").write_bytes(b"optimizer moments")
    return path


def test_the_merge_lies_on_the_line_from_start_to_end_in_the_ends_dtypes(tmp_path: Path) -> None:
    start = checkpoint(tmp_path / "sft", {"w": torch.zeros(2, 3), "h": torch.full((4,), 2.0, dtype=torch.bfloat16)})
    end = checkpoint(tmp_path / "grpo", {"w": torch.full((2, 3), 4.0), "h": torch.full((4,), 6.0, dtype=torch.bfloat16)})
    out = interpolate(start, end, 0.25, tmp_path / "merged")
    merged = load_file(str(out / "model.safetensors"))
    assert torch.equal(merged["w"], torch.full((2, 3), 1.0)) and merged["w"].dtype == torch.float32
    assert torch.equal(merged["h"], torch.full((4,), 3.0, dtype=torch.bfloat16)) and merged["h"].dtype == torch.bfloat16
    # a model folder to serve: the end's config and tokenizer, not its optimizer state, no leftover temp file
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    for alpha, want in ((0.0, 0.0), (1.0, 4.0)):
        edge = load_file(str(interpolate(start, end, alpha, tmp_path / f"a{alpha}") / "model.safetensors"))
        assert torch.equal(edge["w"], torch.full((2, 3), want))


def test_the_average_of_a_runs_checkpoints_is_their_mean_in_the_last_ones_dtypes(tmp_path: Path) -> None:
    steps = [checkpoint(tmp_path / f"step-{i}", {"w": torch.full((2,), float(v)), "h": torch.full((2,), float(v), dtype=torch.bfloat16)})
             for i, v in enumerate((1, 2, 6))]
    out = average(steps, tmp_path / "avg")
    mean = load_file(str(out / "model.safetensors"))
    assert mean["w"].tolist() == [3.0, 3.0] and mean["h"].dtype == torch.bfloat16 and mean["h"].tolist() == [3.0, 3.0]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert load_file(str(average(steps[2:], tmp_path / "one") / "model.safetensors"))["w"].tolist() == [6.0, 6.0]
    odd = checkpoint(tmp_path / "odd", {"w": torch.zeros(2)})
    with pytest.raises(ModelError, match="different tensors"):
        average([*steps, odd], tmp_path / "bad")
    with pytest.raises(ValueError, match="at least one"):
        average([], tmp_path / "none")
    assert not (tmp_path / "bad").exists()


def test_a_sharded_end_is_merged_into_one_file_without_its_stale_index(tmp_path: Path) -> None:
    start = checkpoint(tmp_path / "sft", {"a": torch.zeros(2), "b": torch.zeros(2)})
    end = tmp_path / "grpo"
    end.mkdir()
    save_file({"a": torch.ones(2)}, str(end / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(2)}, str(end / "model-00002-of-00002.safetensors"))
    (end / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    (end / "config.json").write_text("{}")
    out = interpolate(start, end, 0.5, tmp_path / "merged")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert {k: v.tolist() for k, v in load_file(str(out / "model.safetensors")).items()} == {"a": [0.5, 0.5], "b": [0.5, 0.5]}


def test_checkpoints_of_different_models_or_an_alpha_off_the_line_are_refused(tmp_path: Path) -> None:
    start = checkpoint(tmp_path / "sft", {"w": torch.zeros(2, 3), "only_start": torch.zeros(1)})
    other = checkpoint(tmp_path / "other", {"w": torch.zeros(2, 3), "only_end": torch.zeros(1)})
    wide = checkpoint(tmp_path / "wide", {"w": torch.zeros(2, 4), "only_start": torch.zeros(1)})
    with pytest.raises(ModelError, match=r"different tensors \(only in the first: \['only_start'\], only in the second: \['only_end'\]\)"):
        interpolate(start, other, 0.5, tmp_path / "m1")
    with pytest.raises(ModelError, match=r"w is \(2, 3\) in one, \(2, 4\) in the other"):
        interpolate(start, wide, 0.5, tmp_path / "m2")
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        interpolate(start, start, 1.5, tmp_path / "m3")
    with pytest.raises(ModelError, match="no safetensors weights"):
        interpolate(tmp_path, start, 0.5, tmp_path / "m4")
    assert not any((tmp_path / m).exists() for m in ("m1", "m2", "m3"))  # nothing half-written


def test_a_merged_real_model_loads_and_sits_halfway_in_every_weight(tmp_path: Path) -> None:
    """The tiny built-in model and a copy with every weight moved: the merge is a folder the trainer's loader takes."""
    from core.models.resolve import resolve_model
    from core.train import weights as W

    base = Path(resolve_model("tiny"))
    moved = {k: v + 0.01 * (i + 1) for i, (k, v) in enumerate(W.read_weights(base).items())}
    end = tmp_path / "grpo"
    end.mkdir()
    save_file({k: v.contiguous() for k, v in moved.items()}, str(end / "model.safetensors"))
    for f in base.iterdir():
        if f.is_file() and ".safetensors" not in f.name:
            (end / f.name).write_bytes(f.read_bytes())
    out = interpolate(base, end, 0.5, tmp_path / "merged")
    model, _ = W.load_model(out)
    state, start = model.state_dict(), W.read_weights(base)
    for i, (name, before) in enumerate(start.items()):
        assert torch.allclose(state[name].float(), before.float() + 0.005 * (i + 1), atol=1e-6), name


def test_a_learning_run_with_grpo_merge_evaluates_the_merged_checkpoint_and_keeps_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import forgetui.learning as learning
    from forgetui.learning import Plan, split_result

    sft = checkpoint(tmp_path / "runs" / "s" / "checkpoints" / "step-00025", {"w": torch.zeros(3)})
    kept = checkpoint(tmp_path / "runs" / "g" / "checkpoints" / "step-00011", {"w": torch.full((3,), 2.0)})
    evaluated: list[str] = []

    def fake_evaluate(plan, backend, label, report=print, events=learning._quiet, wording="templates"):
        evaluated.append(f"{label} {backend}")
        per_task = {f"t{i}": {"family": "rename", "passed": 2, "scored": 4, "reward": 0.0} for i in range(5)}
        return {"stage": label, "backend": backend, "harness": plan.harness, "splits": {s: split_result(per_task, "r") for s in plan.eval_splits}}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    monkeypatch.setattr(learning, "teach", lambda plan, out, report=print: ["teacher-run"])
    monkeypatch.setattr(learning, "sft", lambda plan, runs, report=print: str(sft))
    monkeypatch.setattr(learning, "grpo", lambda plan, start, report=print, events=learning._quiet: (str(kept), [], None))
    monkeypatch.setattr(learning, "plot", lambda result, path: None)
    lines: list[str] = []
    out = learning.learning_curve(Plan(eval_splits=("eval-phrasing",), grpo_merge=0.25), tmp_path / "out", lines.append)
    merged = tmp_path / "runs" / "g" / "merged" / "step-00011-sft-0.25"
    assert out["checkpoints"] == {"sft": str(sft), "grpo": str(merged), "grpo_unmerged": str(kept)}
    assert evaluated[-1] == f"grpo builtin:{merged}" and out["plan"]["grpo_merge"] == 0.25 and "merge" in out["timings_s"]
    assert load_file(str(merged / "model.safetensors"))["w"].tolist() == [0.5, 0.5, 0.5]
    assert any("SFT + 0.25 × (step-00011 − SFT)" in line for line in lines)
    # 1 (the default) keeps GRPO's checkpoint as it is; a merge off the line fails before any stage runs
    evaluated.clear()
    assert learning.learning_curve(Plan(eval_splits=("eval-phrasing",)), tmp_path / "out2", lines.append)["checkpoints"] == {"sft": str(sft), "grpo": str(kept)}
    with pytest.raises(ValueError, match=r"grpo_merge 1.5: in \[0, 1\]"):
        learning.learning_curve(Plan(grpo_merge=1.5), tmp_path / "out3", lines.append)
    assert not (tmp_path / "out3").exists()


def test_a_recipe_sets_grpo_merge_within_the_line(tmp_path: Path) -> None:
    from core.errors import ConfigError
    from forgetui.learning_recipe import load_recipe

    path = tmp_path / "r.toml"
    path.write_text('harness = "react"\n[grpo]\nmerge = 0.5\n')
    assert load_recipe(path).plan_fields()["grpo_merge"] == 0.5
    path.write_text('harness = "react"\n[grpo]\nmerge = 1.2\n')
    with pytest.raises(ConfigError, match="grpo.merge"):
        load_recipe(path)
