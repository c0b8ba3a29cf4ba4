"""Commands that outlive their exec stream: run detached in the pod, output to files, collected by short execs.

A command (a rollout's harness, for the whole rollout) does not hang on one websocket: a control-plane
upgrade or a load-balancer reset would end it, and with it the rollout. Instead:

1. the *launch* exec unpacks the command's script (and stdin) into ``/tmp/.forgetui-run-<tag>/``, starts it
   in the background with its stdout and stderr going to files there and its exit code to ``rc`` when it
   ends, then waits for it (``wait``, so a short command answers at once) for up to a window;
2. either way it reports: a first line with the exit code (``-`` while it runs), then the new stdout on
   stdout and the new stderr on stderr;
3. while there is no ``rc``, *poll* execs report again from the byte offsets already received, each waiting
   up to a window for the end. A stream that drops (or an API server that is away for a while) costs a
   poll, not the command: the next poll reattaches and reads from the same offsets, so no byte is lost or
   doubled.

A finished command's folder is removed by the next launch in the pod (no extra round trip); the pod's
deletion takes the last one. Everything runs with plain ``sh``, ``tar``, ``head``, ``tail``, ``sleep``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import SandboxError

WINDOW_S = 20  # how long one launch or poll exec waits for the command to end before it reports
RUN_DIR = "/tmp/.forgetui-run-"
SCRIPT = "cmd.sh"
STDIN = "stdin"
NO_FOLDER, NOT_STARTED, VANISHED = 45, 46, 47  # poll exit codes

# The report both scripts end with: the exit code if there is one, then the output past the offsets $o and $e.
# Shell builtins wherever they do (every fork counts: a short command is one launch exec). The client counts
# the bytes it receives: a report whose stream ends with a status arrived whole, and the next poll reads on.
_REPORT = (
    'r=-; if [ -s "$d/rc" ]; then read -r r <"$d/rc"; fi; echo "$r"; '
    'if [ -s "$d/out" ]; then tail -c "+$((o+1))" "$d/out"; fi; '
    'if [ -s "$d/err" ]; then tail -c "+$((e+1))" "$d/err" >&2; fi'
)
# sh -c LAUNCH sh <archive bytes> <folder> <window> [finished folders to remove...]
LAUNCH = (
    'n=$1; d=$2; w=$3; shift 3; if [ $# -gt 0 ]; then rm -rf -- "$@"; fi; '
    'head -c "$n" | tar xf - -C / || { rm -rf -- "$d"; exit 126; }; '  # a cut upload leaves no half folder
    f'( sh "$d/{SCRIPT}" </dev/null >"$d/out" 2>"$d/err"; echo $? >"$d/rc" ) </dev/null >/dev/null 2>&1 & '
    'p=$!; echo "$p" >"$d/pid"; trap "w=0" USR1; '
    # the window's timer wakes the `wait` below; killed when the command ends first, it takes its `sleep` along
    '( trap \'kill "$s" 2>/dev/null; exit 0\' TERM; sleep "$w" & s=$!; wait "$s"; kill -USR1 $$ ) </dev/null >/dev/null 2>&1 & t=$!; '
    'wait "$p"; kill "$t" 2>/dev/null; o=0; e=0; ' + _REPORT
)
# sh -c POLL sh <folder> <stdout offset> <stderr offset> <window>
POLL = (
    f'd=$1; o=$2; e=$3; w=$4; [ -d "$d" ] || exit {NO_FOLDER}; '
    f'if [ ! -f "$d/pid" ] && [ ! -s "$d/rc" ]; then exit {NOT_STARTED}; fi; '
    'i=0; while [ ! -s "$d/rc" ] && [ "$i" -lt "$w" ]; do '
    # the job's subshell writes rc before it ends; one that is gone (or a zombie: pid 1 is `sleep`) without it was killed
    '  case "$(cat "/proc/$(cat "$d/pid")/stat" 2>/dev/null)" in ""|*") Z "*) '
    f'    [ -s "$d/rc" ] || exit {VANISHED};; esac; '
    "  sleep 1; i=$((i+1)); done; " + _REPORT
)


@dataclass(frozen=True)
class Report:
    """One launch's or poll's answer: the exit code once the command ended, and the output past the offsets."""

    code: int | None
    stdout: bytes
    stderr: bytes


def folder(tag: str) -> str:
    return f"{RUN_DIR}{tag}"


def parse(stdout: bytes, stderr: bytes) -> Report:
    """A report's exit code line and bytes; SandboxError when the first line is neither ``-`` nor a number."""
    head, sep, body = stdout.partition(b"\n")
    field = head.decode(errors="replace").strip()
    if not sep or not (field == "-" or field.lstrip("-").isdigit()):
        raise SandboxError(f"a detached command's report is unreadable: {stdout[:200]!r} {stderr[-300:]!r}")
    return Report(None if field == "-" else int(field), body, stderr)


__all__ = ["LAUNCH", "NOT_STARTED", "NO_FOLDER", "POLL", "Report", "VANISHED", "WINDOW_S", "folder", "parse"]
