"""The desktop tasks: a real program open on an X desktop, and a programmatic check of what it left behind.

Each kind draws its parameters from a seeded generator; its check reads the files the program
saved (a spreadsheet through Gnumeric's own `ssconvert`), never the screen.
"""

from __future__ import annotations

import csv
import io
import random
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core.adapter import Sandbox

HOME = "/root/work"  # the tasks' working directory: the terminal starts here, the files live here
BUS = "/tmp/forgetui-gui/bus"  # the desktop's session bus (`gui start`): settings are read through it
WORDS = ("amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island", "juniper", "kestrel", "lumen")
Check = Callable[[Sandbox, dict[str, Any]], Awaitable[tuple[float, str]]]


async def read(sandbox: Sandbox, rel: str) -> str | None:
    """A file under HOME as text, or None when it does not exist."""
    try:
        return (await sandbox.get_file(f"{HOME}/{rel}")).decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


async def sheet(sandbox: Sandbox, rel: str) -> list[list[str]] | None:
    """A Gnumeric workbook's first sheet as rows of cell values (ssconvert to CSV), None when unreadable."""
    out = f"/tmp/forgetui-check-{rel.replace('/', '_')}.csv"
    res = await sandbox.exec(["ssconvert", "--export-type=Gnumeric_stf:stf_csv", f"{HOME}/{rel}", out], timeout_s=60)
    if res.exit_code != 0:
        return None
    text = await read_abs(sandbox, out)
    return list(csv.reader(io.StringIO(text or "")))


async def read_abs(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.get_file(path)).decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


def cell(rows: list[list[str]] | None, row: int, col: int) -> str | None:
    if rows is None or row >= len(rows) or col >= len(rows[row]):
        return None
    return rows[row][col].strip()


def verdict(ok: bool, detail: str) -> tuple[float, str]:
    return (1.0 if ok else 0.0), detail


@dataclass(frozen=True)
class Kind:
    """One desktop task kind: its program, parameters, workspace files, instruction and check."""

    name: str
    app: str  # the program to open (a shell command line, run in HOME)
    params: Callable[[random.Random], dict[str, Any]]
    instruction: Callable[[dict[str, Any]], str]
    check: Check
    files: Callable[[dict[str, Any]], dict[str, str]] = field(default=lambda p: {})
    prepare: str = ""  # shell run in HOME before the program opens


TERMINAL = "A terminal (xterm) is open on the desktop, in the folder " + HOME + ". "
EDITOR = "A text editor (Mousepad) is open on the desktop. "
SPREADSHEET = "A spreadsheet (Gnumeric) is open on the desktop with the workbook " + HOME + "/book.gnumeric. "


async def _term_write(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = await read(sb, "out/hello.txt")
    return verdict(got is not None and got.strip() == p["text"], f"out/hello.txt = {got!r}")


async def _term_mkdirs(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    paths = [f"{HOME}/out/projects/{d}" for d in (p["a"], p["b"])]
    res = await sb.exec(["sh", "-c", 'for d in "$@"; do test -d "$d" || echo "missing $d"; done', "check", *paths], timeout_s=30)
    return verdict(res.ok and not res.stdout.strip(), res.stdout.strip() or "both folders exist")


async def _term_count(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = (await read(sb, "out/count.txt") or "").strip()
    return verdict(got == str(p["n"]), f"out/count.txt = {got!r}, data.txt has {p['n']} lines")


async def _term_copy(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = await read(sb, "out/backup/report.txt")
    return verdict(got == p["report"], "out/backup/report.txt " + ("matches" if got == p["report"] else f"= {got!r}"))


async def _term_exit(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    res = await sb.exec(["sh", "-c", "ps -eo comm | grep -qx xterm && echo running || echo gone"], timeout_s=30)
    return verdict(res.stdout.strip() == "gone", f"xterm is {res.stdout.strip()}")


async def _editor_write(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = await read(sb, "out/note.txt")
    return verdict(got is not None and got.strip() == p["text"], f"out/note.txt = {got!r}")


async def _editor_append(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = await read(sb, "todo.txt") or ""
    lines = [ln.strip() for ln in got.splitlines() if ln.strip()]
    return verdict(lines == [*p["lines"], p["add"]], f"todo.txt lines = {lines}")


async def _editor_replace(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = (await read(sb, "status.txt") or "").splitlines()
    want = ["status: final", *p["rest"]]
    return verdict([ln.rstrip() for ln in got if ln.strip()] == want, f"status.txt = {got}")


async def _editor_clear(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = await read(sb, "scratch.txt")
    return verdict(got is not None and got.strip() == "", f"scratch.txt = {got!r}")


async def _sheet_fill(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = cell(await sheet(sb, "book.gnumeric"), 2, 1)
    return verdict(got == str(p["n"]), f"B3 = {got!r}")


async def _sheet_sum(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    rows = await sheet(sb, "book.gnumeric")
    got = cell(rows, 4, 0)
    return verdict(got == str(sum(p["values"])), f"A5 = {got!r}, want {sum(p['values'])}")


async def _sheet_header(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    got = cell(await sheet(sb, "book.gnumeric"), 0, 2)
    return verdict(got == p["word"], f"C1 = {got!r}")


async def _line_numbers(sb: Sandbox, p: dict[str, Any]) -> tuple[float, str]:
    key = ["gsettings", "get", "org.xfce.mousepad.preferences.view", "show-line-numbers"]
    res = await sb.exec(["sh", "-c", 'DBUS_SESSION_BUS_ADDRESS="unix:path=$0" exec "$@"', BUS, *key], timeout_s=30)
    got = res.stdout.strip()
    return verdict(got == "true", f"show-line-numbers = {got or res.stderr.strip()!r}")


def _column_csv(p: dict[str, Any]) -> dict[str, str]:
    return {"book.csv": "".join(f"{v}\n" for v in p["values"])}


def _table_csv(p: dict[str, Any]) -> dict[str, str]:
    return {"book.csv": "name,qty\nbolt,4\nnut,9\nwasher,2\n"}


TO_GNUMERIC = "ssconvert book.csv book.gnumeric >/dev/null 2>&1 && rm book.csv"
MOUSEPAD = "mousepad {file}"

KINDS: dict[str, Kind] = {
    k.name: k
    for k in [
        Kind("term-write-file", "xterm", lambda r: {"text": f"hello {r.choice(WORDS)} {r.randint(10, 99)}"},
             lambda p: TERMINAL + f"Use it to create the file {HOME}/out/hello.txt containing exactly the line: {p['text']}",
             _term_write),
        Kind("term-make-folders", "xterm", lambda r: dict(zip(("a", "b"), r.sample(WORDS, 2), strict=True)),
             lambda p: TERMINAL + f"Use it to create the folders {p['a']} and {p['b']} inside {HOME}/out/projects/.",
             _term_mkdirs),
        Kind("term-count-lines", "xterm", lambda r: {"n": r.randint(5, 40)},
             lambda p: TERMINAL + f"Use it to write the number of lines of {HOME}/data.txt (just the number) into {HOME}/out/count.txt.",
             _term_count, files=lambda p: {"data.txt": "".join(f"row {i}\n" for i in range(p["n"]))}),
        Kind("term-copy-file", "xterm", lambda r: {"report": f"quarterly report: {r.choice(WORDS)}\ntotal: {r.randint(100, 999)}\n"},
             lambda p: TERMINAL + f"Use it to copy {HOME}/report.txt to {HOME}/out/backup/report.txt (the folder does not exist yet).",
             _term_copy, files=lambda p: {"report.txt": p["report"]}),
        Kind("term-exit", "xterm", lambda r: {},
             lambda p: TERMINAL + "Close the terminal by typing exit in it and pressing Enter.", _term_exit),
        Kind("editor-write-note", MOUSEPAD.format(file="out/note.txt"), lambda r: {"text": f"Meeting at {r.randint(8, 17)}am in room {r.choice(WORDS)}"},
             lambda p: EDITOR + f"It has the new file {HOME}/out/note.txt open. Type the text `{p['text']}` into it and save it (ctrl+s).",
             _editor_write, prepare="mkdir -p out"),
        Kind("editor-append-line", MOUSEPAD.format(file="todo.txt"), lambda r: {"lines": r.sample(WORDS, 2), "add": f"call {r.choice(WORDS)}"},
             lambda p: EDITOR + f"It has {HOME}/todo.txt open. Add the line `{p['add']}` after its last line and save the file.",
             _editor_append, files=lambda p: {"todo.txt": "".join(f"{w}\n" for w in p["lines"])}),
        Kind("editor-replace-word", MOUSEPAD.format(file="status.txt"), lambda r: {"rest": [f"owner: {r.choice(WORDS)}", f"due: day {r.randint(1, 28)}"]},
             lambda p: EDITOR + f"It has {HOME}/status.txt open. Change its first line `status: draft` to `status: final`, leave the other lines as they are, and save.",
             _editor_replace, files=lambda p: {"status.txt": "status: draft\n" + "".join(f"{x}\n" for x in p["rest"])}),
        Kind("editor-clear-file", MOUSEPAD.format(file="scratch.txt"), lambda r: {"junk": " ".join(r.sample(WORDS, 5))},
             lambda p: EDITOR + f"It has {HOME}/scratch.txt open. Delete all of its text and save the now empty file.",
             _editor_clear, files=lambda p: {"scratch.txt": p["junk"] + "\n"}),
        Kind("editor-line-numbers", MOUSEPAD.format(file="notes.txt"), lambda r: {},
             lambda p: EDITOR + "Turn on the display of line numbers in it (a setting in its View menu).",
             _line_numbers, files=lambda p: {"notes.txt": "one\ntwo\nthree\n"}),
        Kind("sheet-fill-cell", "gnumeric book.gnumeric", lambda r: {"n": r.randint(10, 999)},
             lambda p: SPREADSHEET + f"Enter the number {p['n']} in cell B3 and save the workbook (ctrl+s).",
             _sheet_fill, files=_table_csv, prepare=TO_GNUMERIC),
        Kind("sheet-sum-column", "gnumeric book.gnumeric", lambda r: {"values": [r.randint(1, 50) for _ in range(4)]},
             lambda p: SPREADSHEET + "Cells A1 to A4 hold numbers. Put their sum in cell A5 (a formula is fine) and save the workbook.",
             _sheet_sum, files=_column_csv, prepare=TO_GNUMERIC),
        Kind("sheet-header", "gnumeric book.gnumeric", lambda r: {"word": r.choice(WORDS).capitalize()},
             lambda p: SPREADSHEET + f"Type `{p['word']}` into cell C1 and save the workbook.",
             _sheet_header, files=_table_csv, prepare=TO_GNUMERIC),
    ]
}  # fmt: skip


def setup_script(kind: Kind, params: dict[str, Any], wait_s: float) -> str:
    """Prepare the files, then start the desktop with the kind's program open (`gui start`)."""
    import json

    start = ["gui", "start", "--app", kind.app, "--task", kind.name, "--params", json.dumps(params), "--wait", f"{wait_s:g}"]
    lines = ["set -e", "mkdir -p out"]
    if kind.prepare:
        lines.append(kind.prepare)
    lines.append(" ".join(shlex.quote(a) for a in start))
    return "\n".join(lines)


__all__ = ["HOME", "KINDS", "Kind", "setup_script"]
