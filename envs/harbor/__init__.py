"""The `harbor` environment: a folder of tasks in Harbor's (Terminal-Bench 2) format.

One task per folder::

    task.toml             [agent].timeout_sec, [verifier].timeout_sec and .pass_threshold, [metadata], [environment]
    instruction.md        what the agent is told
    environment/Dockerfile  the task's image (its folder is the build context)
    tests/test.sh         the verifier: writes a reward in [0, 1] to /logs/verifier/reward.txt
                          (or {"reward": x} to /logs/verifier/reward.json)
    solution/solve.sh     the reference solution (the `oracle` harness runs it from /solution)

Each task brings its own image (`Task.image`): the engine builds the Dockerfile (its FROM must be
pullable or already present on the Docker engine; nothing is pulled here when no registry is
reachable). On Docker the harness is not copied into it: it is mounted read-only from one shared
volume (core.runtime.harness_volume). A task.toml with `[environment].docker_image` and no
Dockerfile uses that prebuilt image. The verifier runs after the harness exits: tests/ is copied to
/tests (absent until then), /logs/verifier is emptied, then `bash /tests/test.sh` runs from the
image's WORKDIR; the rollout's recorded conversation is at /logs/agent/trajectory.jsonl (OpenAI chat
messages), /logs/agent/trajectory.json (harbor's ATIF) and, as harbor keeps Claude Code's,
/logs/agent/sessions/projects/<cwd-slug>/<uuid>.jsonl (core.rollout.trajectory_formats).

A task passes when its reward reaches `[verifier].pass_threshold` (else the env's `threshold`
option, else 1.0). `[metadata]` category, difficulty and tags feed the eval report's breakdown.
A task folder that does not load (bad task.toml, no tests/test.sh, no image) is skipped with a
warning naming it and why; only a folder where none loads is an error (or any, with `strict`).
The task hash covers the verifier's files, so editing tests/ changes `rollouts.task_hash`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field

from core.adapter import AdapterOptions, ConfigError, Environment, Sandbox, Score, Task, TaskImage

log = logging.getLogger(__name__)

TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
DEFAULT_VERIFY_TIMEOUT_S = 600.0
EXAMPLES = Path(__file__).with_name("examples")
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class HarborTask:
    """One task folder and its parsed task.toml."""

    path: Path
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return self.path.name

    def section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}


def is_task_dir(path: Path) -> bool:
    """A folder meant as a task: it has a task.toml or an instruction.md (a broken one is reported, not ignored)."""
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file()


def task_folders(path: Path) -> list[Path]:
    """The task folders of `path` (a task folder itself, or a folder of them), sorted by name."""
    if not path.is_dir():
        raise ConfigError(f"harbor: {path} is not a folder of tasks")
    folders = [path] if is_task_dir(path) else sorted(p for p in path.iterdir() if p.is_dir() and is_task_dir(p))
    if not folders:
        raise ConfigError(f"harbor: no tasks in {path} (a task folder has task.toml, instruction.md, environment/Dockerfile, tests/test.sh)")
    return folders


def read_task(folder: Path) -> HarborTask:
    """One task folder; ConfigError saying what is wrong with it."""
    if not (folder / "task.toml").is_file():
        raise ConfigError(f"{folder.name}: no task.toml")
    if not (folder / "instruction.md").is_file():
        raise ConfigError(f"{folder.name}: no instruction.md")
    try:
        config = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{folder.name}: cannot read task.toml: {exc}") from exc
    if not (folder / "tests" / "test.sh").is_file():
        raise ConfigError(f"{folder.name}: no tests/test.sh")
    return HarborTask(folder, config)


def load_folder(path: Path) -> list[HarborTask]:
    """Every task in `path`; the first unreadable one raises ConfigError (`HarborEnv` skips them instead)."""
    return [read_task(folder) for folder in task_folders(path)]


def verifier_digest(tests: Path) -> str:
    """sha256 of the verifier's files (tests/, by relative path): part of the task's content hash."""
    h = hashlib.sha256()
    for path in sorted(p for p in tests.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(tests).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def image_of(task: HarborTask) -> TaskImage:
    """The task's image recipe: environment/Dockerfile, or FROM [environment].docker_image."""
    env_dir = task.path / "environment"
    dockerfile = env_dir / "Dockerfile"
    if dockerfile.is_file():
        return TaskImage(dockerfile=dockerfile.read_text(encoding="utf-8"), context=env_dir)
    prebuilt = task.section("environment").get("docker_image")
    if prebuilt:
        return TaskImage(dockerfile=f"FROM {prebuilt}\n", context=None)
    raise ConfigError(f"harbor: {task.path} has neither environment/Dockerfile nor [environment].docker_image")


def image_workdir(dockerfile: str) -> str | None:
    """The last absolute WORKDIR a Dockerfile sets (where harbor runs the agent and the tests)."""
    found = [w for w in _WORKDIR.findall(dockerfile) if w.startswith("/")]
    return found[-1] if found else None


def read_reward(text: str, kind: str) -> float:
    """The reward in reward.txt (a number) or reward.json ({"reward": x}, or a single number); ValueError if none."""
    if kind == "txt":
        return float(text.strip().split()[0])
    data = json.loads(text)
    if isinstance(data, int | float):
        return float(data)
    if isinstance(data, dict):
        if "reward" in data:
            return float(data["reward"])
        numbers = [v for v in data.values() if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) == 1:
            return float(numbers[0])
    raise ValueError(f"no reward in {text[:200]!r}")


class HarborEnv(Environment):
    """Options: ``path`` (a folder of harbor tasks, or one task; default: the two shipped examples),
    ``strict`` (fail on the first task that does not load instead of skipping it with a warning),
    ``threshold`` (the score that passes, for every task without its own ``[verifier].pass_threshold``).
    """

    name = "harbor"
    version = "1"
    graders_read_trajectory = True  # harbor graders may read the transcript (/logs/agent/trajectory.json[l])

    class Options(AdapterOptions):
        path: str | None = Field(None, description="a folder of harbor tasks, or one task (env.path; unset: the shipped examples)")
        strict: bool = Field(False, description="fail on the first task that does not load (env.strict)")
        threshold: float | None = Field(None, description="the score that passes a task without its own [verifier].pass_threshold")

    opts: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.path = Path(self.opts.path or EXAMPLES).expanduser()
        self._tasks: dict[str, HarborTask] = {}
        self._made: dict[str, Task] = {}
        self.skipped: dict[str, str] = {}  # task folder name → why it did not load
        for folder in task_folders(self.path):
            try:
                ht = read_task(folder)
                self._made[ht.id] = self.make_task(ht)
                self._tasks[ht.id] = ht
            except (ConfigError, ValueError, TypeError, OSError) as exc:
                if self.opts.strict:
                    raise ConfigError(f"harbor (env.strict): task {folder.name} does not load: {exc}") from exc
                self.skipped[folder.name] = str(exc)
        if self.skipped:
            log.warning(
                "harbor: skipped %d task(s) of %s that do not load (env.strict = true makes this an error):\n%s",
                len(self.skipped), self.path, "\n".join(f"  {name}: {why}" for name, why in sorted(self.skipped.items())),
            )
        if not self._made:
            raise ConfigError(f"harbor: no task of {self.path} loads:\n" + "\n".join(f"  {n}: {w}" for n, w in sorted(self.skipped.items())))

    def tasks(self) -> list[Task]:
        return list(self._made.values())

    def make_task(self, ht: HarborTask) -> Task:
        image = image_of(ht)
        agent, verifier = ht.section("agent"), ht.section("verifier")
        metadata = ht.section("metadata")
        meta: dict[str, Any] = {"metadata": metadata, "verifier_timeout_s": float(verifier.get("timeout_sec", DEFAULT_VERIFY_TIMEOUT_S))}
        for key in ("category", "difficulty", "tags"):  # what the eval report breaks scores down by
            if metadata.get(key) is not None:
                meta[key] = metadata[key]
        workdir = image_workdir(image.dockerfile)
        if workdir:
            meta["workdir"] = workdir
        solution = ht.path / "solution" / "solve.sh"
        timeout = agent.get("timeout_sec")
        threshold = verifier.get("pass_threshold", self.opts.threshold)
        return Task(
            id=ht.id,
            instruction=(ht.path / "instruction.md").read_text(encoding="utf-8"),
            timeout_s=float(timeout) if timeout else None,
            meta=meta,
            image=image,
            workdir=workdir,
            solution=str(solution) if solution.is_file() else None,
            verifier=verifier_digest(ht.path / "tests"),
            threshold=float(threshold) if threshold is not None else None,
        )

    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        ht = self._tasks.get(task.id)
        if ht is None:
            return self.score(0.0, f"harbor: {task.id!r} is not a task of {self.path}", task)
        await sandbox.exec(["bash", "-c", f"rm -rf {TESTS_DIR} {LOGS_DIR} && mkdir -p {TESTS_DIR} {LOGS_DIR}"], timeout_s=60)
        tests = ht.path / "tests"
        for path in sorted(tests.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                await sandbox.put_file(str(PurePosixPath(TESTS_DIR) / path.relative_to(tests).as_posix()), path.read_bytes(), mode=0o755)
        timeout = float(task.meta.get("verifier_timeout_s", DEFAULT_VERIFY_TIMEOUT_S))
        result = await sandbox.exec(["bash", f"{TESTS_DIR}/test.sh"], timeout_s=timeout, workdir=task.workdir or workdir)
        tail = (result.stdout + ("\n" + result.stderr if result.stderr else ""))[-1500:]
        if result.timed_out:
            return self.score(0.0, f"tests/test.sh ran past {timeout:g} s\n{tail}", task)
        for kind in ("txt", "json"):
            try:
                text = (await sandbox.get_file(f"{LOGS_DIR}/reward.{kind}")).decode("utf-8", "replace")
            except FileNotFoundError:
                continue
            try:
                value = read_reward(text, kind)
            except (ValueError, IndexError, json.JSONDecodeError) as exc:
                return self.score(0.0, f"unreadable {LOGS_DIR}/reward.{kind}: {exc}\n{tail}", task)
            return self.score(value, f"reward {value:g} (test.sh exit {result.exit_code})\n{tail}", task)
        return self.score(0.0, f"tests/test.sh (exit {result.exit_code}) wrote no {LOGS_DIR}/reward.txt or reward.json\n{tail}", task)


__all__ = ["HarborEnv", "image_workdir", "load_folder", "read_reward", "verifier_digest"]
