"""The README, `make help` and the example configs stay true to the code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core.config import load_config
from core.registry import ENV_GROUP, HARNESS_GROUP, available
from core.store.schema import SCHEMA_DOC

REPO = Path(__file__).resolve().parents[1]


def test_readme_has_the_current_store_schema():
    assert SCHEMA_DOC.strip() in (REPO / "README.md").read_text()


def test_make_help_lists_the_targets_the_readme_names():
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for target in ("install", "test", "demo", "bench", "lint", "clean"):
        assert f"make {target}" in out


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load_and_name_real_adapters(path):
    config = load_config(path)
    assert config.env.name in available(ENV_GROUP)
    assert config.harness.name in available(HARNESS_GROUP)


def test_examples_demo_is_what_make_demo_runs():
    from forgetui.demo import demo_config

    assert load_config(REPO / "examples" / "demo.toml") == demo_config("builtin:smollm2-135m")
