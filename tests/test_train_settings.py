"""Issue 46 item 1: each [train] setting is declared once (in one settings group of core.config), checked when the
config loads, and the local trainer is built from those groups instead of a second copy with its own validate()."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from core.config import (
    InProcessSettings,
    LocalGrpoSettings,
    PolicyConfig,
    PolicyLossSettings,
    SftSettings,
    TrainConfig,
    TrainerStateSettings,
    dump_toml,
    load_config,
)
from core.errors import InvalidConfigError
from core.models.precision import DTYPES
from core.options import validated
from core.train.local import (
    FROM_TRAIN,
    LOSS_AGG_MODES,
    OLD_LOGPROBS,
    ROLLOUT_CORRECTIONS,
    LocalTrainerConfig,
    OldLogprobs,
    trainer_settings,
)


def _groups(model: type[BaseModel]) -> list[type[BaseModel]]:
    return [b for b in model.__bases__ if issubclass(b, BaseModel) and b.model_fields]


def test_each_train_setting_is_declared_in_exactly_one_group() -> None:
    groups = _groups(TrainConfig)
    assert len(groups) >= 5, "TrainConfig is made of settings groups (local, sft, verl and the shared ones)"
    seen: dict[str, str] = {}
    for group in groups:
        for name in group.model_fields:
            assert name not in seen, f"train.{name} is declared in both {seen[name]} and {group.__name__}"
            seen[name] = group.__name__
    assert set(seen) == set(TrainConfig.model_fields), "every [train] key belongs to a group, and TrainConfig adds none of its own"


def test_the_local_trainer_takes_the_config_groups_and_redeclares_none() -> None:
    from_config = {name for group in FROM_TRAIN for name in group.model_fields}
    assert set(FROM_TRAIN) <= set(_groups(TrainConfig))
    own = set(LocalTrainerConfig.model_fields) - from_config
    assert not own & set(TrainConfig.model_fields), f"LocalTrainerConfig declares [train] keys again: {sorted(own & set(TrainConfig.model_fields))}"
    for name in from_config:  # inherited, so default, bounds and choices are the config's
        assert repr(LocalTrainerConfig.model_fields[name]) == repr(TrainConfig.model_fields[name]), name
    assert not [c for c in LocalTrainerConfig.__mro__ if c is not BaseModel and "validate" in vars(c)], "pydantic checks it: no hand-written validate()"


def test_the_choices_come_from_one_declaration() -> None:
    fields = TrainConfig.model_fields
    assert typing.get_args(fields["loss_agg_mode"].annotation) == LOSS_AGG_MODES
    assert typing.get_args(fields["rollout_correction"].annotation) == ROLLOUT_CORRECTIONS
    assert typing.get_args(OldLogprobs) == OLD_LOGPROBS == ("recorded", "recomputed")
    assert typing.get_args(fields["dtype"].annotation) == DTYPES == typing.get_args(PolicyConfig.model_fields["dtype"].annotation)
    assert "token-mean" in LOSS_AGG_MODES and "off" in ROLLOUT_CORRECTIONS


@pytest.mark.parametrize(
    "override,key",
    [
        ("train.loss_agg_mode=mean", "train.loss_agg_mode"),  # the old config took any string and failed at the trainer
        ("train.rollout_correction=yes", "train.rollout_correction"),
        ("train.dtype=bf16", "train.dtype"),
        ("train.pack_samples=0", "train.pack_samples"),
        ("train.epochs=0", "train.epochs"),
        ("train.call_discount=1.5", "train.call_discount"),
        ("train.no_such=1", "train.no_such"),
    ],
)
def test_a_bad_trainer_setting_is_refused_when_the_config_loads(override: str, key: str) -> None:
    with pytest.raises(InvalidConfigError) as exc:
        load_config(None, [override])
    assert [loc for loc, _ in exc.value.problems] == [key]
    assert key in str(exc.value)


def test_the_flat_train_table_still_reaches_each_trainer(tmp_path) -> None:
    config = load_config(None, ["train.trainer=sft", "train.from_runs=a,b", "train.epochs=3", "train.lr=1e-4", "train.loss_agg_mode=seq-mean-token-mean", "train.rollout_correction=off", "train.pack_samples=5"])
    train = config.train
    assert (train.trainer, train.from_runs, train.epochs, train.lr) == ("sft", ["a", "b"], 3, 1e-4)
    settings = trainer_settings(train)
    assert sorted(settings) == sorted(name for group in FROM_TRAIN for name in group.model_fields) and len(settings) == 18
    built = LocalTrainerConfig(**settings)
    assert (built.lr, built.loss_agg_mode, built.rollout_correction, built.pack_samples) == (1e-4, "seq-mean-token-mean", "off", 5)
    train.epochs = 2  # learning.py's assignments: checked as the file's values are
    with pytest.raises(ValueError, match="epochs"):
        train.epochs = 0
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(config))
    assert load_config(path) == config  # what a run stores reads back the same


def test_a_bad_local_trainer_option_is_a_config_error_naming_it() -> None:
    for bad, key in (({"old_logprobs": "old"}, "old_logprobs"), ({"rollout_is_threshold": 1.0}, "rollout_is_threshold"), ({"pack_tokens": 0}, "pack_tokens"), ({"loss_agg_mode": "mean"}, "loss_agg_mode"), ({"no_such": 1}, "no_such")):
        with pytest.raises(InvalidConfigError) as exc:
            validated(LocalTrainerConfig, bad)
        assert [loc for loc, _ in exc.value.problems] == [key]


def test_each_trainer_names_the_groups_it_reads_and_every_group_has_a_reader() -> None:
    from core.train.trainers import TRAINERS

    groups = set(_groups(TrainConfig))
    read = {name: set(TRAINERS.load(name).settings) for name in ("local", "sft", "verl")}
    for name, settings in read.items():
        assert settings <= groups, f"{name} names settings groups TrainConfig is not made of"
    assert set().union(*read.values()) == groups, "a [train] group no trainer reads"
    assert set(FROM_TRAIN) <= read["local"] and set(FROM_TRAIN) - read["sft"] == {PolicyLossSettings}  # sft_step takes no policy loss
    assert read["local"] - read["verl"] == {InProcessSettings, LocalGrpoSettings, TrainerStateSettings}  # veRL's check() refuses call_discount; it keeps its own checkpoints
    assert read["sft"] - read["local"] == {SftSettings}


def test_the_local_trainer_refuses_an_unknown_estimator_before_any_rollout() -> None:
    """veRL's trainer takes any name its registry has; the local one takes ESTIMATORS: checked by its check(), not at step 0."""
    from core.errors import ConfigError
    from core.train.loop import LocalTrainerRun

    LocalTrainerRun().check(load_config(None, ["train.steps=1", "train.estimator=rloo"]))
    with pytest.raises(ConfigError, match="estimator 'nope'"):
        LocalTrainerRun().check(load_config(None, ["train.steps=1", "train.estimator=nope"]))
    with pytest.raises(ConfigError, match="norm_by_std"):
        LocalTrainerRun().check(load_config(None, ["train.steps=1", "train.estimator=rloo", "train.norm_adv_by_std=false"]))
