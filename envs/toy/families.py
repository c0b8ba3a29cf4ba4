"""The toy task families: a parameter generator, the task text/files, a checker and a reference solution.

Each family words its instruction with one of several templates (sentence forms, verbs, word order,
where the file name appears, politeness, terse or wordy) and draws its names and words from pools.
Every template and pool is split in two by a fixed rule (the item at position i is *unseen* when
``i % 3 == 2``): the train and eval splits draw only *seen* ones, the eval-phrasing split only
*unseen* ones, so a policy evaluated there meets sentences and names it was never trained on.

Each family also holds *practice* templates: more wordings of the same task, written apart from both
template sets (none is one of them), for training that needs variety (the toy env's ``wording =
"practice"``: GRPO on wordings its teacher never showed). They word only train and eval tasks.
The first twelve a family were written here; the second set (2026-12-06) by someone shown only what
the task means and none of these sentences, any within a difflib ratio of 0.78 of a template or an
earlier practice wording dropped.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from envs.toy.workspace import Workspace

Phrasing = Literal["seen", "unseen"]
PHRASINGS: tuple[Phrasing, ...] = ("seen", "unseen")

# No word is a substring of another, so "lines containing the word" is unambiguous.
WORDS = (
    "apple", "banana", "cherry", "delta", "ember", "forest", "garnet", "harbor", "island", "jungle",
    "kettle", "lemon", "meadow", "nectar", "orbit", "pepper", "quartz", "river", "saddle", "tiger",
    "umbra", "violet", "walnut", "xenon", "yonder", "zephyr", "copper", "lantern", "marble", "pebble",
    "falcon", "glacier", "hazel", "indigo", "juniper", "kiwi", "lotus", "mango", "nutmeg", "olive",
    "puzzle", "raven", "sierra", "tundra", "velvet",
)  # fmt: skip
FILENAMES = (
    "note.txt", "greeting.txt", "response.txt", "output.txt", "message.txt", "word.txt", "label.txt", "memo.txt",
    "reply.txt", "status.txt", "name.txt", "title.txt", "result.md", "entry.log", "value.txt", "motto.txt",
    "tag.dat", "caption.txt",
)  # fmt: skip
NUMBER_FILES = ("numbers.txt", "nums.txt", "values.txt", "input.txt", "data.txt", "figures.txt", "list.txt", "amounts.txt", "scores.txt")
SUM_FILES = ("sum.txt", "total.txt", "result.txt", "answer.txt", "out.txt", "sum.out")
LOG_FILES = ("log.txt", "events.txt", "notes.txt", "lines.txt", "journal.txt", "records.txt", "story.txt", "feed.log", "app.log")
COUNT_FILES = ("count.txt", "hits.txt", "n.txt", "matches.txt", "tally.txt", "found.txt")
EXTENSIONS = (
    ("txt", "md"), ("log", "txt"), ("csv", "tsv"), ("jpeg", "jpg"), ("htm", "html"), ("yml", "yaml"),
    ("text", "txt"), ("conf", "cfg"), ("markdown", "md"), ("dat", "bin"), ("ini", "cfg"), ("tif", "tiff"),
)  # fmt: skip
DIR_ROOTS = ("src", "docs", "data", "tests", "build", "assets", "config", "scripts", "lib", "bin", "static", "public")
DIR_LEAVES = ("core", "utils", "raw", "clean", "images", "fonts", "unit", "api", "v1", "old", "cache", "tmp", "css", "js", "models")

Outcome = tuple[float, str, dict[str, float]]  # score, detail, per-check scores (rollouts.meta.checks)


def is_unseen(index: int) -> bool:
    """Whether the template or pool item at `index` belongs to the held-out (unseen) phrasing."""
    return index % 3 == 2


def pool(items: Sequence[Any], phrasing: Phrasing) -> tuple[Any, ...]:
    """The items of `items` a split with this phrasing draws from."""
    return tuple(x for i, x in enumerate(items) if is_unseen(i) == (phrasing == "unseen"))


def template_indices(templates: Sequence[str], phrasing: Phrasing) -> tuple[int, ...]:
    return tuple(i for i in range(len(templates)) if is_unseen(i) == (phrasing == "unseen"))


class Family:
    """One kind of task; parameters are plain JSON data stored in the task's meta.

    ``params`` holds the template's index (``template``) and everything the checker and the
    reference solution need; ``fields`` turns them into the template's named fields.
    """

    name: ClassVar[str]
    templates: ClassVar[tuple[str, ...]] = ()
    practice_templates: ClassVar[tuple[str, ...]] = ()  # train-only wordings (module docstring); ``params["practice"]`` picks one

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        """The task's parameters (without the template) from this phrasing's pools."""
        raise NotImplementedError

    def params(self, rng: random.Random, phrasing: Phrasing = "seen") -> dict[str, Any]:
        """Parameters and a template of this phrasing, drawn in a fixed order from `rng`."""
        p = self.draw(rng, phrasing)
        p["template"] = rng.choice(template_indices(self.templates, phrasing))
        return p

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        raise NotImplementedError

    def instruction(self, p: dict[str, Any]) -> str:
        if "practice" in p:
            return self.practice_templates[p["practice"]].format(**self.fields(p))
        return self.templates[p.get("template", 0)].format(**self.fields(p))

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
    """The fixed smoke task of the train split (never held out)."""

    name: ClassVar[str] = "hello"
    templates: ClassVar[tuple[str, ...]] = ("Create a file hello.txt containing hi in the workspace",)

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        return {}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, "hello.txt", "hi")

    def solution(self, p: dict[str, Any]) -> str:
        return "echo hi > hello.txt"


@dataclass(frozen=True)
class WriteFile(Family):
    name: ClassVar[str] = "write-file"
    templates: ClassVar[tuple[str, ...]] = (
        "Create a file {path} in the workspace containing exactly the text: {content}",
        "Write the word {content} to a file named {path}.",
        "Please put {content} into {path}.",
        "{path} must contain the single word {content}. Create it.",
        "Make a new file called {path} whose only content is {content}.",
        "I'd like a file {path} holding the text {content}, nothing more.",
        "Save the text {content} in {path}",
        "Could you create {path} with {content} as its content?",
        "Write {content} into {path}, please.",
        "create {path}: {content}",
        "Your job: a file {path} in the current directory containing {content}.",
        "The file {path} should say {content}. Make it so.",
    )
    practice_templates: ClassVar[tuple[str, ...]] = (
        "Store {content} as the only text of a file named {path}.",
        "In the file {path}, write {content}.",
        "Target file: {path}. Text: {content}.",
        "Generate {path}; its content should be {content}.",
        "Can you make {path} and write {content} in it?",
        "A file named {path}, containing {content}, is what I want.",
        "{content} is the text that belongs in {path}. Write it there.",
        "new file {path} with text {content}",
        "Fill a file called {path} with the word {content}.",
        "Create {path}. Its contents: {content}",
        "Using the shell, write {content} to {path}.",
        "We need {path} to read {content}.",
        # the second set (module docstring)
        "Create a file named {path} containing only the word {content}.",
        "Please make a file at {path} whose entire content is the single word {content}.",
        "Task: create {path}. Its contents should be exactly: {content}",
        "I need a file called {path} that says {content} and nothing else.",
        "Could you put the word {content} into a new file {path}?",
        "The word {content} should be the only thing in the file {path}.",
        "Goal: a file {path} exists in the current folder and holds the word {content}.",
        "{path} should contain just {content}. Create it.",
        "echo the word {content} into {path}",
        "Save the text {content} as the full content of {path}, please.",
        "Make a new file. Name it {path}, and write the single word {content} in it.",
        "We are setting up a small test: there must be a file {path} whose only content is the word {content}. Please create it.",
    )

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        return {"path": rng.choice(pool(FILENAMES, phrasing)), "content": rng.choice(pool(WORDS, phrasing))}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {"path": p["path"], "content": p["content"]}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, p["path"], p["content"])

    def solution(self, p: dict[str, Any]) -> str:
        return f"echo {shlex.quote(p['content'])} > {shlex.quote(p['path'])}"


@dataclass(frozen=True)
class SumNumbers(Family):
    name: ClassVar[str] = "sum-numbers"
    templates: ClassVar[tuple[str, ...]] = (
        "The file {src} in the workspace lists integers, one per line. Write their sum (just the number) to a file named {dst}.",
        "Add up the numbers in {src} and write the total to {dst}.",
        "What is the sum of the integers in {src}? Put only the number in {dst}.",
        "Sum the values listed in {src}; save the result in {dst}.",
        "{src} holds one number per line. Compute their total and store it in {dst}.",
        "Please write the sum of all numbers from {src} into {dst}.",
        "Total the integers in {src} and write just that number to {dst}.",
        "Compute the sum of the lines of {src} and write it to {dst}.",
        "I need {dst} to contain the sum of the numbers listed in {src}.",
        "Sum {src} into {dst}.",
        "Read the numbers in {src}, add them together, and write the result (a single integer) to {dst}.",
        "Could you total up {src} and save the answer as {dst}?",
    )
    practice_templates: ClassVar[tuple[str, ...]] = (
        "Into {dst}, write the total of the integers found in {src}.",
        "Put in {dst} the sum of the numbers that {src} lists.",
        "{dst} should end up holding the sum of every number in {src}.",
        "Take the numbers in {src}, sum them, and record the result in {dst}.",
        "Add together all integers listed in {src}. The result goes into {dst}.",
        "Calculate the total of the numbers in {src} and save it to {dst}.",
        "sum of {src} to {dst}",
        "Find the sum of the values in {src}; write only that number into {dst}.",
        "Make {dst} contain the sum of the numbers in {src}, nothing else.",
        "Can you add up what is in {src} and put the total in {dst}?",
        "The numbers in {src} need to be summed. Write the sum to {dst}.",
        "Write into {dst} one number: the sum of the lines of {src}.",
        # the second set (module docstring)
        "sum the numbers in {src}, put the result in {dst}",
        "The file {src} holds one integer per line. Write their sum, and only the sum, to {dst}.",
        "Please compute the sum of all numbers listed in {src} and save it to {dst}.",
        "Task: read the integers from {src}; write their total into {dst}.",
        "I need the total of the values in {src} written to a file named {dst}.",
        "Goal: {dst} contains the sum of every line of {src} (each line is an integer).",
        "{src} -> sum -> {dst}",
        "Could you total up the numbers in the file {src} and store the result in {dst}?",
        "Create {dst} containing nothing but the sum of the integers in {src}.",
        "There is a list of integers, one per line, in {src}. Add them together and record the answer in {dst}.",
        "For a quick report, please take the numbers in {src} in the current folder, add them all up, and put the resulting sum (just the number) in {dst}.",
        "Write to {dst} the sum of the numbers that appear in {src}.",
    )

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        numbers = [rng.randint(1, 99) for _ in range(rng.randint(3, 8))]
        return {"numbers": numbers, "src": rng.choice(pool(NUMBER_FILES, phrasing)), "dst": rng.choice(pool(SUM_FILES, phrasing))}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {"src": p.get("src", "numbers.txt"), "dst": p.get("dst", "sum.txt")}

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {self.fields(p)["src"]: "".join(f"{x}\n" for x in p["numbers"])}

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, self.fields(p)["dst"], str(sum(p["numbers"])))

    def solution(self, p: dict[str, Any]) -> str:
        f = self.fields(p)
        return f"awk '{{s+=$1}} END {{print s}}' {shlex.quote(f['src'])} > {shlex.quote(f['dst'])}"


@dataclass(frozen=True)
class Rename(Family):
    name: ClassVar[str] = "rename"
    templates: ClassVar[tuple[str, ...]] = (
        "Rename every .{from} file in the workspace so it ends in .{to} instead "
        "(keep the rest of the name and the content; e.g. a.{from} becomes a.{to}).",
        "Change the extension of all .{from} files to .{to}.",
        "Every file ending in .{from} should end in .{to} instead; please rename them.",
        "Rename all *.{from} files to *.{to}, keeping their names and contents otherwise.",
        "Turn each .{from} file into a .{to} file by renaming it (for example {example}.{from} becomes {example}.{to}).",
        "Please give the .{from} files in this folder the extension .{to}.",
        "Switch the file extension .{from} to .{to} for every file that has it.",
        "Move each *.{from} to the same name with .{to} at the end.",
        "Make all the .{from} files in the workspace .{to} files instead, without changing their contents.",
        "rename .{from} -> .{to}",
        "The .{from} files here need to be renamed so that they end with .{to}.",
        "Could you replace the .{from} suffix with .{to} on every file that has it?",
    )
    practice_templates: ClassVar[tuple[str, ...]] = (
        "All .{from} files should become .{to} files; rename them.",
        "Rename the files: .{from} becomes .{to} (e.g. {example}.{from} to {example}.{to}).",
        "Give every file that ends in .{from} the ending .{to} instead.",
        "Replace the extension .{from} with .{to} on all matching files.",
        "Can you rename each .{from} file here to use .{to}?",
        "For every *.{from} file, rename it so it ends with .{to}.",
        "Files with the .{from} extension: change them to .{to}.",
        "Use .{to} instead of .{from} as the extension of those files.",
        "Convert the names of the .{from} files to end in .{to}, leaving their contents alone.",
        "mv every .{from} file to .{to}",
        "Each file named like {example}.{from} must be renamed to {example}.{to}, and likewise the other .{from} files.",
        "Rename: .{from} to .{to}, all files.",
        # the second set (module docstring)
        "Rename every .{from} file to have the extension .{to} instead.",
        "change all *.{from} files to *.{to}",
        "Please rename each file ending in .{from} so that it ends in .{to}, keeping the rest of the name.",
        "Rename files so that {example}.{from} becomes {example}.{to}, and do the same for every other file with that extension.",
        "Goal: no .{from} files remain; each one has been renamed to the same name with .{to}.",
        "I need every file with the .{from} extension renamed to use .{to}.",
        "mv *.{from} to *.{to}, same base names",
        "The .{from} files in the current folder should be .{to} files. Rename them, keeping their names otherwise unchanged.",
        "Give every file of this type a new extension, the way {example}.{from} becomes {example}.{to}.",
        "Can you rename all files ending with .{from} to end with .{to}?",
        "We are migrating formats by name only. Please take each file whose extension is .{from} and give it the extension .{to}, without altering the stem.",
        "rename {example}.{from} to {example}.{to}, and likewise for all the others with that extension",
    )

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        old, new = rng.choice(pool(EXTENSIONS, phrasing))
        stems = sorted(rng.sample(pool(WORDS, phrasing), rng.randint(2, 5)))
        return {"from": old, "to": new, "stems": stems}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {"from": p["from"], "to": p["to"], "example": p["stems"][0]}

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
    templates: ClassVar[tuple[str, ...]] = (
        "Count the lines of {src} in the workspace that contain the word {word}, "
        "and write that count (just the number) to a file named {dst}.",
        "How many lines in {src} contain the word {word}? Write the number to {dst}.",
        "Write to {dst} the number of lines of {src} that mention {word}.",
        "Count how many lines of {src} include {word}; save the count in {dst}.",
        "In {src}, find the lines with the word {word} and put how many there are into {dst}.",
        "Please store in {dst} how many lines of {src} have the word {word} in them.",
        "Number of lines in {src} containing {word} -> {dst}",
        "Find the count of lines that contain {word} in the file {src} and write it to {dst}.",
        "I need {dst} to hold the number of lines in {src} where the word {word} appears.",
        "Count lines with {word} in {src}. Output the count to {dst}.",
        "Look through {src}, count every line that contains the word {word}, and write only that count to {dst}.",
        "Could you tell me, in a file called {dst}, how many lines of {src} contain {word}?",
    )
    practice_templates: ClassVar[tuple[str, ...]] = (
        "Into {dst}, write how many lines in {src} contain the word {word}.",
        "{dst} should hold the number of lines of {src} that have {word} in them.",
        "Save to {dst} the count of lines in {src} containing {word}.",
        "Check {src} for lines containing {word} and write the number of such lines to {dst}.",
        "How many of the lines of {src} contain {word}? Answer with the count, in {dst}.",
        "Put in {dst} the number of lines in {src} with the word {word}.",
        "Lines of {src} that include {word}: count them and write the count into {dst}.",
        "Count the {word} lines in {src}, writing the number to {dst}.",
        "Using {src}, count the lines where {word} occurs; the file {dst} gets the number.",
        "count lines matching {word} in {src}, result in {dst}",
        "Can you count the lines of {src} that have {word} and store that number in {dst}?",
        "Write a single number to {dst}: how many lines of {src} contain {word}.",
        # the second set (module docstring)
        "How many lines of {src} mention {word}? Put just that number in {dst}.",
        "I need the number of lines in {src} that include {word}, written to a file named {dst}.",
        "The word {word} appears on some lines of {src}. Count those lines and record the total in {dst}.",
        "{word} in {src}: count matching lines, output to {dst}",
        "Look through {src} for lines with the word {word}; save the number of such lines (only the number) in {dst}.",
        "grep-count {word} in {src} -> {dst}",
        "We want to know how often {word} shows up line-wise in {src}. Please put the number of lines that contain it into the file {dst}.",
        "Write the count of {src} lines containing the word {word} to {dst}, nothing else.",
    )

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        vocab = rng.sample(pool(WORDS, phrasing), 6)
        lines = [
            " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(6, 14))
        ]
        return {"word": vocab[0], "lines": lines, "src": rng.choice(pool(LOG_FILES, phrasing)), "dst": rng.choice(pool(COUNT_FILES, phrasing))}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {"src": p.get("src", "log.txt"), "dst": p.get("dst", "count.txt"), "word": p["word"]}

    def files(self, p: dict[str, Any]) -> dict[str, str]:
        return {self.fields(p)["src"]: "".join(f"{line}\n" for line in p["lines"])}

    @staticmethod
    def answer(p: dict[str, Any]) -> int:
        return sum(1 for line in p["lines"] if p["word"] in line.split())

    async def check(self, ws: Workspace, p: dict[str, Any]) -> Outcome:
        return await _exact(ws, self.fields(p)["dst"], str(self.answer(p)))

    def solution(self, p: dict[str, Any]) -> str:
        f = self.fields(p)
        return f"grep -cw {shlex.quote(f['word'])} {shlex.quote(f['src'])} > {shlex.quote(f['dst'])}"


def _and_list(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class MakeDirs(Family):
    name: ClassVar[str] = "make-dirs"
    templates: ClassVar[tuple[str, ...]] = (
        "Create these directories in the workspace: {dirs}",
        "Make the following folders: {dirs}.",
        "Please create the directories {dirs_and}.",
        "Set up this directory structure: {dirs}",
        "mkdir these (parents included): {dirs}",
        "I need the folders {dirs_and} to exist in the workspace.",
        "Create the directories {dirs_and}, including any parent directories.",
        "Build these paths as directories: {dirs}",
        "Could you make directories named {dirs_and}?",
        "Add the directories {dirs} to the workspace.",
        "The workspace needs the following directories: {dirs}. Create them.",
        "Make sure the directories {dirs_and} exist.",
    )
    practice_templates: ClassVar[tuple[str, ...]] = (
        "Create directories for: {dirs}.",
        "These folders should exist: {dirs_and}. Make them.",
        "Make directories {dirs} (with parents where needed).",
        "Set up the folders {dirs_and} in the workspace.",
        "Can you create the folder paths {dirs}?",
        "New directories needed: {dirs}",
        "Create each of these directory paths: {dirs}.",
        "Make folders {dirs_and}.",
        "The following directories are missing; create them: {dirs}",
        "Every one of {dirs_and} must be a directory; create them.",
        "Lay out the directories {dirs_and} under the workspace.",
        "Create folder structure {dirs}",
        # the second set (module docstring)
        "mkdir -p {dirs}",
        "Task: create the following directories (with parents): {dirs}",
        "Goal: the directories {dirs} all exist.",
        "The project needs {dirs_and} as directories. Create them, parents included.",
        "Create directories {dirs}, creating parent folders as needed.",
        "Please create {dirs_and} in the current folder.",
        "Can you make sure that each of these directories exists: {dirs}?",
        "We are laying out a new workspace. Please create the directories {dirs_and}, along with any parent directories they need.",
        "folders needed: {dirs}",
    )

    def draw(self, rng: random.Random, phrasing: Phrasing) -> dict[str, Any]:
        roots = rng.sample(pool(DIR_ROOTS, phrasing), rng.randint(1, 3))
        leaves = pool(DIR_LEAVES, phrasing)
        return {"dirs": sorted(f"{root}/{leaf}" for root in roots for leaf in rng.sample(leaves, rng.randint(1, 2)))}

    def fields(self, p: dict[str, Any]) -> dict[str, str]:
        return {"dirs": ", ".join(p["dirs"]), "dirs_and": _and_list(p["dirs"])}

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


def most_practice_held_out(families: Sequence[str] = tuple(FAMILIES)) -> int:
    """How many practice templates a family may keep for eval tasks alone: all but one, so every train task keeps a wording."""
    return min(len(FAMILIES[name].practice_templates) for name in families) - 1
