"""The `claw-bench` environment: the 222 tool-use tasks of PyPI claw-bench 0.1.0, verified by their own pytest suites.

The sandbox reproduces the layout claw-bench's own runner gives a task: the task folder's
`environment/` (setup.sh and data/) lives at /opt/claw-bench/<domain>/<task>/, setup.sh runs
from the task folder with the workspace as $1, then environment/data/* is copied into the
workspace. `workspace/` in the instruction becomes the absolute workspace path, as claw-bench
does. After the harness exits, the task's verifier (and the suite's root conftest.py, which
registers `--workspace`) is copied OUTSIDE the workspace and run with pytest; the score is the
fraction of its tests that passed (a few verifiers read <task>/workspace instead of --workspace: a
symlink points there). The image gets pytest, PyYAML and requests, visible to the sandbox's python3,
and `python` → python3: the tasks, their reference solutions and verifiers expect all of that.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from pydantic import Field, field_validator

from core.adapter import (
    INSTALL_ROOT,
    AdapterOptions,
    ConfigError,
    Environment,
    ImageLayer,
    Names,
    Sandbox,
    Score,
    Task,
    pip_layer,
)
from envs.claw_bench.loader import ClawTask, find_tasks_dir, load_tasks, tree_files
from envs.claw_bench.report import parse_junit

log = logging.getLogger(__name__)

STAGE = ".claw-task"  # where Task.files land in the workspace before setup moves them out
TASK_ROOT = "/opt/claw-bench"  # tasks/<domain>/<task> as the setup scripts see it
VERIFIER_ROOT = "/opt/forgetui/claw-verifier"  # copied in only after the harness exited
JUNIT = "/tmp/forgetui-claw-junit.xml"
PYTEST = "pytest"  # the wrapper the image layer installs
REQUIREMENTS = ["pytest==9.2.0", "PyYAML==6.0.4", "requests==2.34.2"]  # what the tasks, solutions and verifiers import
VERIFY_TIMEOUT_S = 300.0
_WORKSPACE_REF = re.compile(r"(?<![\w/.-])workspace/")


def setup_script(task: ClawTask) -> str:
    """Move the staged task folder out of the workspace, run setup.sh the way claw-bench does, copy data/ in."""
    # $FORGETUI_SANDBOX_ROOT is set (and absolute paths re-rooted under it) only by the local runtime
    where = '"$T"'
    return "\n".join([
        "set -e",
        'ws="$PWD"',
        f'T="${{FORGETUI_SANDBOX_ROOT:-}}"{shlex.quote(f"{TASK_ROOT}/{task.rel}")}',
        f"rm -rf {where} && mkdir -p {where}",
        f'if [ -d "$ws/{STAGE}" ]; then cp -a "$ws/{STAGE}/." {where}/ && rm -rf "$ws/{STAGE}"; fi',
        f"cd {where}",
        # claw-bench's runner ignores the setup script's exit status; so do we, but say so in the log
        'if [ -f environment/setup.sh ]; then bash environment/setup.sh "$ws" >/dev/null || echo "setup.sh exited $?" >&2; fi',
        'if [ -d environment/data ]; then cp -a environment/data/. "$ws"/; fi',
    ])  # fmt: skip


def verifier_command(rel: str, workdir: str) -> str:
    """The pytest run of one task's verifier (a shell line; paths re-rooted under the local runtime's root)."""
    vdir = shlex.quote(f"{VERIFIER_ROOT}/{rel}/verifier")
    args = [
        f'"$R"{vdir}', f'--workspace="$R"{shlex.quote(workdir)}', f'--rootdir="$R"{VERIFIER_ROOT}', "-p", "no:cacheprovider",
        "-q", "-rA", "--tb=short", "--no-header", f'--junitxml="$R"{JUNIT}',
    ]  # fmt: skip
    return (
        'R="${FORGETUI_SANDBOX_ROOT:-}"; P=' + PYTEST + '; command -v "$P" >/dev/null || P="python3 -m pytest"; '
        f'cd "$R"{VERIFIER_ROOT} && exec $P ' + " ".join(args)
    )


def instruction_text(raw: str, workdir: str) -> str:
    """claw-bench's prompt: the absolute workspace first, relative `workspace/` paths made absolute."""
    ws = workdir.rstrip("/") or "/"
    body = _WORKSPACE_REF.sub(ws + "/", raw)
    return f"Your workspace is {ws}/ (the current directory). Write all output files there, using that absolute path.\n\n{body}"


class ClawBenchEnv(Environment):
    """Options: ``domains``, ``levels`` (L1..L4), ``ids`` (task ids or folder names), ``tasks_dir``, ``workdir`` (/workspace)."""

    name = "claw-bench"
    version = "0.1.0"

    class Options(AdapterOptions):
        domains: Names | None = Field(None, description="the domains to run (unset: all 14)")
        levels: Names | None = Field(None, description="the levels to run, L1..L4 (unset: all)")
        ids: Names | None = Field(None, description="task ids (cal-001) or folder names (cal-001-create-meeting)")
        tasks_dir: str | None = Field(None, description="a claw-bench tasks folder (unset: the installed package's)")
        workdir: str = Field("/workspace", description="the agent's workspace, as the instruction names it")

        @field_validator("levels")
        @classmethod
        def _upper(cls, levels: list[str] | None) -> list[str] | None:
            return [level.upper() for level in levels or []] or None

    opts: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.root = find_tasks_dir(self.opts.tasks_dir)
        self._all = load_tasks(self.root)
        self._by_id = {t.id: t for t in self._all}
        self._check_filters()

    def _check_filters(self) -> None:
        known = {t.domain for t in self._all}
        bad = sorted(set(self.opts.domains or []) - known)
        if bad:
            raise ConfigError(f"claw-bench: unknown domains {bad}; known: {', '.join(sorted(known))}")
        levels = {t.level for t in self._all}
        bad = sorted(set(self.opts.levels or []) - levels)
        if bad:
            raise ConfigError(f"claw-bench: unknown levels {bad}; known: {', '.join(sorted(levels))}")
        names = set(self._by_id) | {t.name for t in self._all}
        bad = sorted(set(self.opts.ids or []) - names)
        if bad:
            raise ConfigError(f"claw-bench: unknown task ids {bad[:10]} (ids look like cal-001 or cal-001-create-meeting)")

    def selected(self) -> list[ClawTask]:
        """The task folders the options select, in suite order."""
        domains, levels, ids = self.opts.domains, self.opts.levels, self.opts.ids
        return [
            t
            for t in self._all
            if (domains is None or t.domain in domains) and (levels is None or t.level in levels) and (ids is None or t.id in ids or t.name in ids)
        ]

    def tasks(self) -> list[Task]:
        return [self.make_task(t) for t in self.selected()]

    def make_task(self, ct: ClawTask) -> Task:
        instruction = (ct.path / "instruction.md").read_text(encoding="utf-8") if (ct.path / "instruction.md").is_file() else str(ct.config.get("description", ""))
        files = {f"{STAGE}/environment/{rel}": data for rel, data in tree_files(ct.path / "environment").items()}
        solution = ct.path / "solution" / "solve.sh"
        meta: dict[str, Any] = {
            "domain": ct.domain,
            "level": ct.level,
            "name": ct.name,
            "title": ct.config.get("title", ""),
            "capabilities": ct.config.get("capabilities", []),
            "timeout": ct.config.get("timeout"),
        }
        timeout = ct.config.get("timeout")
        return Task(
            id=ct.id,
            instruction=instruction_text(instruction, self.opts.workdir),
            files=files,  # type: ignore[arg-type]
            setup=setup_script(ct),
            timeout_s=float(timeout) if timeout else None,
            meta=meta,
            solution=str(solution) if solution.is_file() else None,
        )

    def image_layer(self) -> ImageLayer:
        site = f"{INSTALL_ROOT}/claw-bench/site"
        # The tasks' own python3 sees the packages too (solutions import yaml, code tasks requests and
        # pytest), and `python` is python3 (many reference solutions call `python`).
        extra = (
            "RUN d=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p \"$d\" "
            f"&& echo {site} > \"$d/forgetui-claw-bench.pth\" "
            "&& (command -v python >/dev/null || ln -s \"$(command -v python3)\" /usr/local/bin/python)"
        )
        return pip_layer("claw-bench", REQUIREMENTS, scripts={PYTEST: "pytest"}, extra=extra)

    def _task_folder(self, task: Task) -> ClawTask:
        ct = self._by_id.get(task.id)
        if ct is None:
            raise ConfigError(f"claw-bench: {task.id!r} is not a task of {self.root}")
        return ct

    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        try:
            ct = self._task_folder(task)
        except ConfigError as exc:
            return self.score(0.0, str(exc))
        vdir = f"{VERIFIER_ROOT}/{ct.rel}/verifier"
        await sandbox.exec('R="${FORGETUI_SANDBOX_ROOT:-}"; rm -rf "$R"' + f"{VERIFIER_ROOT} \"$R\"{JUNIT}", timeout_s=60)
        await sandbox.put_file(f"{VERIFIER_ROOT}/conftest.py", (self.root / "conftest.py").read_bytes())
        for rel, data in tree_files(ct.path / "verifier").items():
            await sandbox.put_file(str(PurePosixPath(vdir) / rel), data)
        # a few verifiers ignore --workspace and read <task>/workspace, as in claw-bench's own layout
        link = 'R="${FORGETUI_SANDBOX_ROOT:-}"; mkdir -p "$R$2" && ln -sfn "$R$1" "$R$2/workspace"'
        await sandbox.exec(["bash", "-c", link, "link", workdir, f"{VERIFIER_ROOT}/{ct.rel}"], timeout_s=60)
        result = await sandbox.exec(verifier_command(ct.rel, workdir), timeout_s=VERIFY_TIMEOUT_S, env={"PYTHONDONTWRITEBYTECODE": "1"})
        if result.timed_out:
            return self.score(0.0, f"the verifier ran past {VERIFY_TIMEOUT_S:g} s")
        try:
            report = parse_junit(await sandbox.get_file(JUNIT))
        except (ValueError, FileNotFoundError) as exc:
            tail = (result.stdout + result.stderr)[-1500:]
            return self.score(0.0, f"pytest wrote no report (exit {result.exit_code}; {exc}): {tail}")
        score = self.score(report.fraction, report.summary())
        score.checks = report.cases  # one check per test: plan completion for multi-test tasks
        return score


__all__ = ["ClawBenchEnv", "instruction_text", "setup_script", "verifier_command"]
