"""Harness and env options as typed models: a bad one is a ConfigError naming it, valid ones build what they built before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.config import load_config
from core.env import Environment, Score, Task
from core.errors import ConfigError
from core.registry import (
    ENV_GROUP,
    HARNESS_GROUP,
    available,
    check_options,
    env_class,
    harness_class,
    load_env,
    load_harness,
)
from core.session.setup import env_kwargs
from tests import adapter_snapshots as snap
from tests.harness_fixtures import ShellHarness

GOLDEN_HARNESSES = json.loads((snap.FIXTURES / "harness_launches.json").read_text())
GOLDEN_ENVS = json.loads((snap.FIXTURES / "env_tasks.json").read_text())


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(("name", "options"), snap.HARNESS_CASES, ids=[snap.case_id(n, o) for n, o in snap.HARNESS_CASES])
def test_harness_launches_what_the_hand_parsed_options_launched(name: str, options: dict[str, Any], tmp_path: Path) -> None:
    """Command, environment and config files for a plain and an MCP task, as main's code made them."""
    assert _plain(snap.harness_snapshot(name, options, tmp_path)) == GOLDEN_HARNESSES[snap.case_id(name, options)]


@pytest.mark.parametrize(("name", "options"), snap.ENV_CASES, ids=[snap.case_id(n, o) for n, o in snap.ENV_CASES])
def test_env_makes_the_tasks_the_hand_parsed_options_made(name: str, options: dict[str, Any]) -> None:
    """Every task's id and content hash (instruction, setup, meta, files, image, verifier), timeout and threshold."""
    assert _plain(snap.env_snapshot(name, options)) == GOLDEN_ENVS[snap.case_id(name, options)]


# (kind, name, options, the error): one wrong value per adapter, named as the config writes it
BAD = [
    ("harness", "react", {"max_steps": "many"}, r"invalid config: harness\.options\.max_steps: Input should be a valid integer"),
    ("harness", "react", {"max_steps": 7.5}, r"harness\.options\.max_steps: Input should be a valid integer, got a number with a fractional part"),
    ("harness", "react", {"gui": "video"}, r"harness\.options\.gui: Input should be 'auto', 'off', 'text', 'image' or 'both'"),
    ("harness", "react", {"max_step": 3}, r"harness 'react' has no option 'max_step'; it accepts: command_timeout, gui, max_steps, max_tokens, stream, temperature \(remove the option from \[harness\.options\]"),
    ("harness", "codex", {"context_window": "big"}, r"harness\.options\.context_window: Input should be a valid integer"),
    ("harness", "codex", {"extra_args": "--profile x"}, r"harness\.options\.extra_args: Input should be a valid list"),
    ("harness", "codex", {"binary": "/usr/bin/codex"}, r"harness\.binary: the codex harness runs no binary you provide"),
    ("harness", "codex", {"version": "latest"}, r"harness\.version = 'latest' is not an exact release of codex"),
    ("harness", "claude-code", {"max_turns": "ten"}, r"harness\.options\.max_turns: Input should be a valid integer"),
    ("harness", "claude-code", {"mcp": "sometimes"}, r"harness\.options\.mcp: Input should be a valid boolean"),
    ("harness", "openclaw", {"api": "openai-chat"}, r"harness\.options\.api: Input should be 'openai-completions', 'openai-responses' or 'anthropic-messages'"),
    ("harness", "openclaw", {"timeout_s": "soon"}, r"harness\.options\.timeout_s: Input should be a valid number"),
    ("harness", "opencode", {"title_call": "maybe"}, r"harness\.options\.title_call: Input should be a valid boolean"),
    ("harness", "pi", {"max_tokens": [4096]}, r"harness\.options\.max_tokens: Input should be a valid integer"),
    ("harness", "pi", {"thinking": True}, r"harness\.options\.thinking: Input should be a valid string"),
    ("harness", "gemini-cli", {"max_session_turns": "lots"}, r"harness\.options\.max_session_turns: Input should be a valid integer"),
    ("harness", "mini-swe-agent", {"extra_config": "agent.step_limit=3"}, r"harness\.options\.extra_config: Input should be a valid list"),
    ("harness", "mini-swe-agent", {"retries": None}, r"harness\.options\.retries: Input should be a valid integer"),
    ("harness", "zeroclaw", {"wire_api": "messages"}, r"harness\.options\.wire_api: Input should be 'chat_completions' or 'responses'"),
    ("harness", "oracle", {"max_steps": 3}, r"harness 'oracle' has no option 'max_steps'; it accepts: none"),
    ("harness", "noop", {"gui": "off"}, r"harness 'noop' has no option 'gui'; it accepts: none"),
    ("harness", "react", {"version": "1.0.0"}, r"harness\.version = '1\.0\.0': the react harness has no installable version"),
    ("env", "claw-bench", {"levels": 3}, r"invalid config: env\.options\.levels: Input should be a valid list"),
    ("env", "claw-bench", {"split": "eval"}, r"env 'claw-bench' has no option 'split'; it accepts: domains, ids, levels, tasks_dir, workdir"),
    ("env", "harbor", {"threshold": "high"}, r"env\.options\.threshold: Input should be a valid number"),
    ("env", "harbor", {"split": "train", "seed": 3}, r"env 'harbor' has no option 'seed', 'split'; it accepts: path, strict, threshold"),
    ("env", "miniwob", {"instances": 0}, r"env\.options\.instances: Input should be greater than or equal to 1"),
    ("env", "miniwob", {"timeout": 0}, r"env\.options\.timeout: Input should be greater than 0"),
    ("env", "miniwob", {"time_penalty": "sometimes"}, r"env\.options\.time_penalty: Input should be a valid boolean"),
    ("env", "desktop", {"seed": "abc"}, r"env\.options\.seed: Input should be a valid integer"),
    ("env", "desktop", {"mode": "test"}, r"env 'desktop' has no option 'mode'; it accepts: instances, names, seed, timeout"),
]


@pytest.mark.parametrize(("kind", "name", "options", "error"), BAD, ids=[f"{k}:{n}:{json.dumps(o)}" for k, n, o, _ in BAD])
def test_a_bad_option_is_a_config_error_naming_it(kind: str, name: str, options: dict[str, Any], error: str) -> None:
    """Building the adapter and checking without building (a form's way) raise the same error."""
    with pytest.raises(ConfigError, match=error) as built:
        (load_harness if kind == "harness" else load_env)(name, **options)
    with pytest.raises(ConfigError) as checked:
        check_options(kind, name, options)  # type: ignore[arg-type]
    assert str(checked.value) == str(built.value)


def test_a_config_s_bad_option_is_named_as_the_config_writes_it() -> None:
    cfg = load_config(None, ['harness.options.max_steps="a few"', "harness.options.temperature=0.3", "env.name=miniwob", "env.options.instances=-1"])
    with pytest.raises(ConfigError, match=r"^invalid config: harness\.options\.max_steps: Input should be a valid integer"):
        load_harness(cfg.harness.name, **cfg.harness.adapter_options())
    with pytest.raises(ConfigError, match=r"^invalid config: env\.options\.instances: Input should be greater than or equal to 1"):
        load_env(cfg.env.name, **env_kwargs(cfg))
    cfg = load_config(None, ["harness.name=zeroclaw", 'harness.binary="/opt/zeroclaw"', "harness.options.timeout_secs=30", "env.name=harbor", "env.strict=true"])
    harness = load_harness(cfg.harness.name, **cfg.harness.adapter_options())
    assert harness.binary == Path("/opt/zeroclaw") and harness.opts.timeout_secs == 30
    assert load_env(cfg.env.name, **env_kwargs(cfg)).opts.strict is True


def test_checking_builds_nothing() -> None:
    """check_options reads no task folder and no binary: what building the adapter would do fails, the check passes."""
    with pytest.raises(ConfigError, match="not a claw-bench tasks folder"):
        load_env("claw-bench", tasks_dir="/nonexistent")
    check_options("env", "claw-bench", {"tasks_dir": "/nonexistent", "levels": "l1,l2"})
    with pytest.raises(ConfigError, match="/nonexistent is not a folder of tasks"):
        load_env("harbor", path="/nonexistent")
    check_options("env", "harbor", {"path": "/nonexistent"})
    check_options("harness", "zeroclaw", {"binary": "/nonexistent/zeroclaw", "wire_api": "responses"})
    check_options("harness", "codex", {"version": "0.1.0", "mcp": False})
    with pytest.raises(ConfigError, match=r"env 'toy' has no option 'path'; it accepts: families, n, practice_held_out, seed, split, wording"):
        check_options("env", "toy", {"path": "/x", "seed": 1})
    with pytest.raises(ConfigError, match=r"env\.options\.split: Input should be 'train', 'eval', 'eval-phrasing' or 'all'"):
        check_options("env", "toy", {"split": "test"})
    with pytest.raises(ConfigError, match=r"env\.options\.n: Input should be greater than or equal to 0"):
        check_options("env", "toy", {"n": -1})
    check_options("env", "toy", {"seed": 1, "split": "eval"})
    with pytest.raises(ConfigError, match="kind must be"):
        check_options("runtime", "docker", {})  # type: ignore[arg-type]


def test_values_written_as_they_were_before_build_the_same() -> None:
    """Numbers as strings, whole floats and comma-separated lists worked when options were parsed by hand; they still do."""
    task, endpoint = Task(id="t", instruction="x", timeout_s=30.0), snap.ENDPOINT
    loose = load_harness("react", max_steps="7", temperature=1, max_tokens=64.0, command_timeout="30").launch(task, endpoint, "/w")
    exact = load_harness("react", max_steps=7, temperature=1.0, max_tokens=64, command_timeout=30.0).launch(task, endpoint, "/w")
    assert loose == exact and "--temperature" in exact.command and exact.command[exact.command.index("--temperature") + 1] == "1.0"
    args = load_harness("codex", extra_args=["-c", 5, 1.5]).launch(task, endpoint, "/w").command
    assert args[-4:-1] == ["-c", "5", "1.5"]  # numbers in a list of arguments become text, as str() made them
    assert load_harness("claude-code", tools="Bash,Read").launch(task, endpoint, "/w").command[-2:] == ["--tools", "Bash,Read"]
    assert load_env("claw-bench", levels="l1, L2", domains=["calendar"]).opts.levels == ["L1", "L2"]


def test_a_boolean_written_as_text_means_what_it_says() -> None:
    """`mcp = "false"` used to be bool("false") == True: the task's MCP servers started anyway."""
    from envs.miniwob import MiniWoBEnv

    task = MiniWoBEnv(names="click-test").tasks()[0]
    assert task.mcp_servers
    for name in ("codex", "claude-code", "openclaw", "opencode", "gemini-cli"):
        on, off = (load_harness(name, mcp=value).launch(task, snap.ENDPOINT, "/w") for value in ("true", "false"))
        assert "gui-mcp" in json.dumps(on.files) + json.dumps(on.command), name
        assert "gui-mcp" not in json.dumps(off.files) + json.dumps(off.command), name


def test_every_adapter_declares_typed_options_with_descriptions() -> None:
    """What a form shows: each option's name, default and description; `accepted_options` is derived from them."""
    classes = [harness_class(n) for n in available(HARNESS_GROUP)] + [env_class(n) for n in available(ENV_GROUP)]
    for cls in classes:
        assert cls.Options is not None, cls.name
        assert cls.accepted_options == frozenset(cls.Options.model_fields), cls.name
        assert all(field.description for field in cls.Options.model_fields.values()), cls.name
    assert env_class("harbor").accepted_options == {"path", "strict", "threshold"}
    assert harness_class("noop").accepted_options == frozenset()


def test_an_adapter_without_typed_options_still_takes_a_dict() -> None:
    """A third-party (or test) harness that declares no `Options` reads `self.options` as before, unchecked."""
    harness = ShellHarness(command="echo {task}", anything=1)
    assert harness.opts is None and harness.options == {"command": "echo {task}", "anything": 1}
    assert harness.launch(Task(id="t1", instruction="x"), snap.ENDPOINT, "/w").command[-1] == "echo t1"

    class ListedEnv(Environment):  # a third-party env that only lists the names it takes
        name = "listed"
        accepted_options = frozenset({"split"})

        def tasks(self) -> list[Task]:
            return [Task(id=self.options["split"], instruction="x")]

        async def verify(self, sandbox: Any, task: Task, workdir: str) -> Score:
            return Score(1.0, True)

    env = ListedEnv(split="eval")
    assert env.opts is None and env.tasks()[0].id == "eval"
    with pytest.raises(ConfigError, match=r"env 'listed' has no option 'path'; it accepts: split"):
        ListedEnv.check_options({"path": "/x"})


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_options_check(path: Path) -> None:
    config = load_config(path)
    check_options("harness", config.harness.name, config.harness.adapter_options())
    check_options("env", config.env.name, env_kwargs(config))
