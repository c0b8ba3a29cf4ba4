"""The README, the docs site, `make help` and the example configs stay true to the code."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

import pytest

from core.config import RunConfig, load_config
from core.registry import ENV_GROUP, HARNESS_GROUP, available
from core.store.schema import SCHEMA_DOC

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
sys.path.insert(0, str(REPO / "tools"))
import gen_docs  # noqa: E402

README_MAX_LINES = 200


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def all_text() -> str:
    return "\n".join(p.read_text() for p in [README, *doc_pages()])


def code_spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        spans += block.splitlines()
    return spans


# --- the README ------------------------------------------------------------------------------------------

def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/"


def test_readme_keeps_the_ci_test_command() -> None:
    text = README.read_text()
    assert "make test" in text and "make demo" in text


def test_readme_config_loads_and_names_real_adapters(tmp_path: Path) -> None:
    block = re.search(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert block, "the README's example config is gone"
    path = tmp_path / "readme.toml"
    path.write_text(block.group(1))
    config = load_config(path)
    assert config.env.name in available(ENV_GROUP)
    assert config.harness.name in available(HARNESS_GROUP)


def _anchors(page: Path) -> set[str]:
    """The anchors a page offers: its headings' slugs (as GitHub and MkDocs make them) and explicit ids."""
    text = page.read_text()
    out = set(re.findall(r"\{#([\w-]+)\}", text)) | set(re.findall(r'id="([\w.-]+)"', text))
    out |= set(re.findall(r"^::: ([\w.]+)", text, re.M))  # mkdocstrings: each object's anchor is its path
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))  # GitHub's
        # markdown.extensions.toc.slugify, restated: Markdown comes with the docs extra, which `make test` does not install
        ascii_heading = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
        out.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_heading).strip().lower()))  # Python-Markdown's toc (MkDocs)
    return out


@pytest.mark.parametrize("page", [README, REPO / "benchmarks" / "README.md", *doc_pages()], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_name_files_and_anchors_that_exist(page: Path) -> None:
    """mkdocs --strict checks the site's own links; this checks the READMEs' too (GitHub renders them)."""
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target!r}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: link to {target!r}: no such heading in {dest.name}"


# --- commands and keys the docs name ---------------------------------------------------------------------

def test_make_help_lists_every_target_the_docs_name() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    named = set(re.findall(r"\bmake ([a-z][a-z-]*)\b", "\n".join(code_spans(all_text()))))
    assert {"test", "demo", "docs"} <= named, "the README and docs must name make test, make demo and make docs"
    named |= {"install", "test", "demo", "bench", "lint", "clean", "docs", "docs-build", "docs-gen"}
    missing = sorted(t for t in named if f"make {t} " not in out)
    assert not missing, f"the docs name make targets the Makefile does not have: {missing}"


def _subcommands(parser) -> dict[str, object]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_forgetui_command_and_flag_the_docs_name_exists() -> None:
    from forgetui.cli import build_parser

    top = build_parser()
    commands = _subcommands(top)
    problems = []
    for span in code_spans(all_text()):
        # a command line: at the start (after VAR=value prefixes), after .venv/bin/, a pipe, ; or && or $(
        m = re.search(r"(?:^\s*(?:\w+=\S*\s+)*|\.venv/bin/|[;&|]\s*|\$\()forgetui ([a-z][a-z-]*)(.*)", span)
        if not m:
            continue
        name, rest = m.group(1), m.group(2)
        if name not in commands:
            if not re.match(r"[a-z-]+\.", name):  # `forgetui demo`, not `forgetui.tui...`
                problems.append(f"`forgetui {name}` in {span!r}")
            continue
        sub = commands[name]
        words = rest.split()
        nested = _subcommands(sub)
        known = _flags(sub) | _flags(top)
        if nested and words:  # `images build`, or the alternatives `images bootstrap|list|build`
            for alt in words[0].replace("\\|", "|").split("|"):
                if alt in nested:
                    known |= _flags(nested[alt])
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", rest.split("|")[0] if name == "sql" else rest):
            if flag not in known and flag != "--":
                problems.append(f"`forgetui {name}` has no {flag} (in {span!r})")
    assert not problems, "\n".join(sorted(set(problems)))


# dotted names the docs use that are not config keys
NOT_CONFIG_KEYS = {"runtime.images": "the Runtime.images attribute", "runtime.make_runtime": "core.runtime's function"}


def _config_key_exists(key: str) -> bool:
    from core.runtime.k8s.config import LEGACY_KEYS

    if key in NOT_CONFIG_KEYS or key in {f"runtime.{k}" for k in LEGACY_KEYS}:  # moved keys still load, with a warning
        return True
    model: object = RunConfig
    for part in key.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        if part == "options":  # [harness.options] / [env.options]: each adapter's own (the config reference)
            return True
        model = fields[part].annotation
    return True


def test_every_config_key_the_docs_name_exists() -> None:
    sections = set(RunConfig.model_fields)
    named = set()
    for span in code_spans(all_text()):
        for key in re.findall(r"(?<![\w./-])([a-z]+(?:\.[a-z_]+)+)(?=\s*(?:=|$|`|\s|,|\)))", span):
            if key.split(".")[0] in sections and not key.endswith((".py", ".toml", ".md", ".json")):
                named.add(key)
    assert len(named) > 40, f"found only {len(named)} config keys in the docs: is the scan broken?"
    missing = sorted(k for k in named if not _config_key_exists(k))
    assert not missing, f"the docs name config keys RunConfig does not have: {missing}"


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load_and_name_real_adapters(path):
    config = load_config(path)
    assert config.env.name in available(ENV_GROUP)
    assert config.harness.name in available(HARNESS_GROUP)


def test_examples_demo_is_what_make_demo_runs():
    from forgetui.demo import demo_config

    assert load_config(REPO / "examples" / "demo.toml") == demo_config("builtin:smollm2-135m")


# --- generated pages ---------------------------------------------------------------------------------------

def test_store_page_has_the_current_store_schema():
    assert SCHEMA_DOC.strip() in (DOCS / "store.md").read_text(), f"docs/store.md is stale: run {gen_docs.COMMAND}"


def test_generated_pages_are_current():
    stale = [str(p.relative_to(REPO)) for p in gen_docs.stale()]
    assert not stale, f"generated docs pages are stale: {stale}; regenerate them with `{gen_docs.COMMAND}` (or `make docs-gen`) and commit"


def test_config_reference_names_every_key_with_its_default():
    page = (DOCS / "reference" / "config.md").read_text()
    for key in ("train.lora_rank", "run.n_samples", "runtime.kubernetes.namespace", "policy.backend"):
        assert f"| `{key}` |" in page
    assert "| `harness.options.max_steps` | int | `20` |" in page  # react's Options


def test_cli_reference_names_every_subcommand():
    from forgetui.cli import build_parser

    page = (DOCS / "reference" / "cli.md").read_text()
    for name in _subcommands(build_parser()):
        assert f"## `forgetui {name}`" in page


# --- the site ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install -e '.[docs]'; CI installs it)")
def test_site_builds_strict_without_warnings(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"}, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="core.harness.Harness"' in api and 'id="core.env.Environment"' in api  # mkdocstrings rendered them


def test_every_page_is_in_the_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in doc_pages() if str(p.relative_to(DOCS)) not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


# --- the worked examples -----------------------------------------------------------------------------------

def _block(page: str, title: str) -> str:
    text = (DOCS / "plugins" / page).read_text()
    m = re.search(r'```\w+ title="' + re.escape(title) + r'"\n(.*?)```', text, re.S)
    assert m, f"{page}: no code block titled {title}"
    return m.group(1)


def _forgetui(cwd: Path, *args: str) -> dict:
    import os

    env = dict(os.environ, PYTHONPATH=str(cwd), COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "forgetui.cli", "run", "arith.toml", "--no-ui", *args],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_worked_examples_run_as_the_docs_say(tmp_path: Path):
    """The env and harness of docs/plugins/, saved and run as their pages say (local runtime, scripted policy)."""
    import duckdb

    (tmp_path / "my_arith.py").write_text(_block("add-environment.md", "my_arith.py"))
    (tmp_path / "arith-script.json").write_text(_block("add-environment.md", "arith-script.json"))
    (tmp_path / "arith.toml").write_text(_block("add-environment.md", "arith.toml"))
    (tmp_path / "my_harness.py").write_text(_block("add-harness.md", "my_harness.py"))
    (tmp_path / "one-shot-script.json").write_text(_block("add-harness.md", "one-shot-script.json"))
    assert tomllib.loads((tmp_path / "arith.toml").read_text())["env"]["name"] == "my_arith:ArithEnv"

    env_run = _forgetui(tmp_path)
    assert (env_run["rollouts"], env_run["passed"]) == (4, 4)
    harness_run = _forgetui(tmp_path, "--set", "harness.name=my_harness:OneShotHarness", "--set", "harness.options.max_tokens=8",
                            "--set", "policy.backend=scripted:one-shot-script.json")
    assert (harness_run["rollouts"], harness_run["passed"]) == (4, 4)
    with duckdb.connect(harness_run["store"], read_only=True) as db:
        rows = db.execute("SELECT r.harness, count(c.call_id) FROM rollouts r JOIN calls c USING (rollout_id) GROUP BY 1").fetchall()
    assert rows == [("one-shot", 4)]  # one recorded call a rollout, under the example's harness name


def test_every_run_config_key_says_what_it_does():
    """A key added without a description would show a blank row on the config reference."""
    from pydantic import BaseModel

    from core.config import RunConfig

    blank: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, f"{prefix}{name}.")
            elif not field.description:
                blank.append(prefix + name)

    walk(RunConfig, "")
    assert not blank, f"config keys without a description (Field(..., description=...)): {blank}"
