"""The toy task families: a parameter generator, the task text/files, a checker and a reference solution."""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

from envs.toy.workspace import Workspace

# No word is a substring of another, so "lines containing the word" is unambiguous.
WORDS = (
    "apple", "banana", "cherry", "delta", "ember", "forest", "garnet", "harbor", "island", "jungle",
    "kettle", "lemon", "meadow", "nectar", "orbit", "pepper", "quartz", "river", "saddle", "tiger",
    "umbra", "violet", "walnut", "xenon", "yonder", "zephyr", "copper", "lantern", "marble", "pebble",
)  # fmt: skip
FILENAMES = (
    "note.txt",
    "greeting.txt",
    "answer.txt",
    "out.txt",
    "message.txt",
    "word.txt",
    "label.txt",
    "memo.txt",
)
EXTENSIONS = (
    ("txt", "md"),
    ("log", "txt"),
    ("csv", "tsv"),
    ("jpeg", "jpg"),
    ("htm", "html"),
    ("yml", "yaml"),
)
DIR_ROOTS = ("src", "docs", "data", "tests", "build", "assets", "config", "scripts")
DIR_LEAVES = ("core", "utils", "raw", "clean", "images", "fonts", "unit", "api", "v1", "old")

Outcome = tuple[float, str, dict[str, float]]  # score, detail, per-check scores (rollouts.meta.checks)


class Family:
    """One kind of task; parameters are plain JSON data stored in the task's meta."""

    name: ClassVar[str]

    def params(self, rng: random.Random) -> dict[str, Any]:
        raise NotImplementedError

    def instruction(self, p: dict[str, Any]) -> str:
        raise NotImplementedError

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        raise NotImplementedError

    def solution(self, p: dict[str, Any]) -> str:
        """A shell script that solves the task when run in the workspace (for tests and demos)."""
        raise NotImplementedError


async def _exact(ws: Workspace, rel: str, expected: str) -> Outcome:
    text = await ws.read(rel)
    if text is None:
        return 0.0, f"{rel} is missing", {rel: 0.0}
    if text.strip() == expected:
        return 1.0, f"{rel} is correct", {rel: 1.0}
    return 0.0, f"{rel} contains {text.strip()[:80]!r}, expected {expected!r}", {rel: 0.0}


@dataclass(frozen=True)
class Hello(Family):
    """The fixed smoke task every split carries."""

    name: ClassVar[str] = "hello"

    def params(self, rng: random.Random) -> dict[str, Any]:
        return {}

    def instruction(self, p: dict[str, Any]) -> str:
        return "Create a file hello.txt containing hi in the workspace"

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, "hello.txt", "hi")

    def solution(self, p: dict[str, Any]) -> str:
        return "echo hi > hello.txt"


@dataclass(frozen=True)
class WriteFile(Family):
    name: ClassVar[str] = "write-file"

    def params(self, rng: random.Random) -> dict[str, Any]:
        return {"path": rng.choice(FILENAMES), "content": rng.choice(WORDS)}

    def instruction(self, p: dict[str, Any]) -> str:
        return f"Create a file {p['path']} in the workspace containing exactly the text: {p['content']}"

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, p["path"], p["content"])

    def solution(self, p: dict[str, Any]) -> str:
        return f"printf '%s\\n' {shlex.quote(p['content'])} > {shlex.quote(p['path'])}"


@dataclass(frozen=True)
class SumNumbers(Family):
    name: ClassVar[str] = "sum-numbers"

    def params(self, rng: random.Random) -> dict[str, Any]:
        return {"numbers": [rng.randint(1, 99) for _ in range(rng.randint(3, 8))]}

    def instruction(self, p: dict[str, Any]) -> str:
        return (
            "The file numbers.txt in the workspace lists integers, one per line. "
            "Write their sum (just the number) to a file named sum.txt."
        )

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {"numbers.txt": "".join(f"{x}\n" for x in p["numbers"])}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, "sum.txt", str(sum(p["numbers"])))

    def solution(self, p: dict[str, Any]) -> str:
        return "python3 -c 'print(sum(int(x) for x in open(\"numbers.txt\")))' > sum.txt"


@dataclass(frozen=True)
class Rename(Family):
    name: ClassVar[str] = "rename"

    def params(self, rng: random.Random) -> dict[str, Any]:
        old, new = rng.choice(EXTENSIONS)
        stems = sorted(rng.sample(WORDS, rng.randint(2, 5)))
        return {"from": old, "to": new, "stems": stems}

    def instruction(self, p: dict[str, Any]) -> str:
        return (
            f"Rename every .{p['from']} file in the workspace so it ends in .{p['to']} instead "
            f"(keep the rest of the name and the content; e.g. a.{p['from']} becomes a.{p['to']})."
        )

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {f"{s}.{p['from']}": f"{s} data\n" for s in p["stems"]}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        notes: list[str] = []
        checks: dict[str, float] = {}  # one check per file to rename
        for stem in p["stems"]:
            old, new = f"{stem}.{p['from']}", f"{stem}.{p['to']}"
            noted = len(notes)
            text = await ws.read(new)
            if text is None:
                notes.append(f"{new} missing")
            elif text.strip() != f"{stem} data":
                notes.append(f"{new} has the wrong content")
            elif await ws.exists(old):
                notes.append(f"{old} still exists")
            checks[new] = 1.0 if len(notes) == noted else 0.0  # met: this stem added no note
        good, total = int(sum(checks.values())), len(p["stems"])
        return good / total, f"renamed {good}/{total}" + (f" ({'; '.join(notes)})" if notes else ""), checks

    def solution(self, p: dict[str, Any]) -> str:
        return f'for f in *.{p["from"]}; do mv "$f" "${{f%.{p["from"]}}}.{p["to"]}"; done'


@dataclass(frozen=True)
class CountLines(Family):
    name: ClassVar[str] = "count-lines"

    def params(self, rng: random.Random) -> dict[str, Any]:
        vocab = rng.sample(WORDS, 6)
        lines = [
            " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(6, 14))
        ]
        return {"word": vocab[0], "lines": lines}

    def instruction(self, p: dict[str, Any]) -> str:
        return (
            f"Count the lines of log.txt in the workspace that contain the word {p['word']}, "
            "and write that count (just the number) to a file named count.txt."
        )

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {"log.txt": "".join(f"{line}\n" for line in p["lines"])}

    @staticmethod
    def answer(p: dict[str, Any]) -> int:
        return sum(1 for line in p["lines"] if p["word"] in line.split())

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, "count.txt", str(self.answer(p)))

    def solution(self, p: dict[str, Any]) -> str:
        return f"grep -cw {shlex.quote(p['word'])} log.txt > count.txt"


@dataclass(frozen=True)
class MakeDirs(Family):
    name: ClassVar[str] = "make-dirs"

    def params(self, rng: random.Random) -> dict[str, Any]:
        roots = rng.sample(DIR_ROOTS, rng.randint(1, 3))
        dirs = sorted(
            f"{root}/{leaf}" for root in roots for leaf in rng.sample(DIR_LEAVES, rng.randint(1, 2))
        )
        return {"dirs": dirs}

    def instruction(self, p: dict[str, Any]) -> str:
        return "Create these directories in the workspace: " + ", ".join(p["dirs"])

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        checks = {d: 1.0 if await ws.is_dir(d) else 0.0 for d in p["dirs"]}
        missing = [d for d, met in checks.items() if not met]
        good = len(p["dirs"]) - len(missing)
        detail = f"{good}/{len(p['dirs'])} directories exist"
        return good / len(p["dirs"]), detail + (f" (missing: {', '.join(missing)})" if missing else ""), checks

    def solution(self, p: dict[str, Any]) -> str:
        return "mkdir -p " + " ".join(shlex.quote(d) for d in p["dirs"])


FAMILIES: dict[str, Family] = {
    f.name: f for f in (WriteFile(), SumNumbers(), Rename(), CountLines(), MakeDirs())
}
HELLO = Hello()
