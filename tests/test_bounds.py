"""Issue 44 items 4 and 5: every numeric CLI flag and config field is bounded, and wrong inputs are messages, not tracebacks.

The walks are systematic on purpose: a flag or field added later without a bound fails here.
"""

from __future__ import annotations

import argparse
import logging
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from core import config as config_module
from core.config import RunConfig, load_config
from core.errors import ConfigError
from forgetui.argtypes import Bounded
from forgetui.cli import build_parser, main

HUGE = "99999999999999999999"  # past 64 bits
NOT_FINITE = ("nan", "inf", "-inf")


def _actions(parser: argparse.ArgumentParser, where: str = "forgetui") -> list[tuple[str, argparse.Action]]:
    """Every argument of every (sub)command, with the command it belongs to."""
    out = []
    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public list
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += _actions(sub, f"{where} {name}")
        else:
            out.append((where, action))
    return out


def _numeric_actions() -> list[tuple[str, argparse.Action]]:
    return [(w, a) for w, a in _actions(build_parser()) if a.type in (int, float) or isinstance(a.type, Bounded)]


def test_the_walk_finds_the_numeric_flags():
    names = {a.option_strings[0] for _, a in _numeric_actions()}
    assert {"--port", "--call-timeout", "--max-body-bytes", "--min-reward", "--nnodes", "--tp"} <= names


@pytest.mark.parametrize("where,action", _numeric_actions(), ids=lambda x: x if isinstance(x, str) else x.option_strings[0])
def test_every_numeric_flag_is_bounded(where, action):
    assert isinstance(action.type, Bounded), f"{where} {action.option_strings}: use forgetui.argtypes (int_range/float_range), not a bare {action.type}"
    for text in (*NOT_FINITE, HUGE, "-" + HUGE):
        with pytest.raises(argparse.ArgumentTypeError):
            action.type(text)
    if action.type.low >= 0:
        with pytest.raises(argparse.ArgumentTypeError):
            action.type("-1")
    if action.default is not None:
        assert action.type.low <= action.default <= action.type.high


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["proxy", "--backend", "scripted:x.json", "--port", "99999"], "out of range"),
        (["proxy", "--backend", "scripted:x.json", "--port", "-1"], "out of range"),
        (["proxy", "--backend", "scripted:x.json", "--call-timeout", "-5"], "out of range"),
        (["proxy", "--backend", "scripted:x.json", "--call-timeout", "nan"], "not a finite number"),
        (["serve-model", "tiny", "--port", "70000"], "out of range"),
    ],
)
def test_bad_numbers_are_refused_at_parse_time(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel], str, Any]]:
    """(dotted key, model, field name, annotation) of every field reachable from `model`."""
    out = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        out.append((key, model, name, info.annotation))
        for arg in _flat(info.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _fields(arg, f"{key}.")
    return out


def _flat(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    return [a for arg in args for a in _flat(arg)]


def _numeric(annotation: Any) -> bool:
    kinds = [a for a in _flat(annotation) if a is not type(None)]
    return bool(kinds) and all(a in (int, float) for a in kinds) and not isinstance(annotation, types.GenericAlias)


NUMERIC_FIELDS = [f for f in _fields(RunConfig) if _numeric(f[3])]
OWN_FIELDS = [f for f in NUMERIC_FIELDS if f[1].__module__ == config_module.__name__]


def test_the_config_walk_finds_the_numeric_fields():
    keys = {f[0] for f in NUMERIC_FIELDS}
    assert {"run.n_samples", "run.call_timeout_s", "run.seed", "train.lr", "proxy.port", "runtime.kubernetes.schedule_timeout_s"} <= keys


@pytest.mark.parametrize("key,model,name,annotation", OWN_FIELDS, ids=[f[0] for f in OWN_FIELDS])
def test_every_numeric_config_field_declares_both_bounds(key, model, name, annotation):
    metadata = model.model_fields[name].metadata
    low = [m for m in metadata if getattr(m, "ge", None) is not None or getattr(m, "gt", None) is not None]
    high = [m for m in metadata if getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None]
    assert low and high, f"{key}: give it ge/gt and le/lt in core/config.py"
    assert model.model_config.get("allow_inf_nan") is False, f"{model.__name__}: allow_inf_nan=False"


@pytest.mark.parametrize("key", [f[0] for f in NUMERIC_FIELDS])
def test_every_numeric_config_field_refuses_unworkable_values(key):
    for raw in (*NOT_FINITE, HUGE, "-" + HUGE):
        with pytest.raises(ConfigError):
            load_config(None, [f"{key}={raw}"])


def test_huge_numbers_in_free_form_options_are_refused():
    with pytest.raises(ConfigError, match="env.options.big"):
        load_config(None, [f"env.options.big={HUGE}"])


def test_defaults_still_validate():
    load_config(None, [])


def _run_cli(argv: list[str], caplog) -> int:
    caplog.set_level(logging.ERROR)
    return main(argv)


def test_run_on_a_directory_is_a_message(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    assert _run_cli(["run", str(tmp_path), "--no-ui"], caplog) == 2
    assert "is a folder, not a config file" in caplog.text


def test_a_config_that_is_not_utf8_is_a_message(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[run]\nn_samples = 1\n# caf\xe9\n')
    assert _run_cli(["run", str(bad), "--no-ui"], caplog) == 2
    assert "is not UTF-8 text" in caplog.text


def test_config_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)
