"""Commands that outlive their exec stream: run detached in the pod, output to files, collected by short execs.

A command (a rollout's harness, for the whole rollout) does not hang on one websocket: a control-plane
upgrade or a load-balancer reset would end it, and with it the rollout. Instead:

1. the *launch* exec unpacks the command's script (and stdin) into ``/tmp/.forgetui-run-<tag>/``, starts it
   in the background with its stdout and stderr going to files there and its exit code to ``rc`` when it
   ends, then waits for it (``wait``, so a short command answers at once) for up to a window;
2. either way it reports: a header line ``<rc or -> <stdout bytes> <stderr bytes>``, then the new stdout on
   stdout and the new stderr on stderr;
3. while there is no ``rc``, *poll* execs report again from the byte offsets already received, each waiting
   up to a window for the end. A stream that drops (or an API server that is away for a while) costs a
   poll, not the command: the next poll reattaches and reads from the same offsets, so no byte is lost or
   doubled.

A finished command's folder is removed by the next launch in the pod (no extra round trip); the pod's
deletion takes the last one. Everything runs with plain ``sh``, ``tar``, ``head``, ``tail``, ``wc``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import SandboxError

WINDOW_S = 20  # how long one launch or poll exec waits for the command to end before it reports
RUN_DIR = "/tmp/.forgetui-run-"
SCRIPT = "cmd.sh"
STDIN = "stdin"
NO_FOLDER, NOT_STARTED, VANISHED = 45, 46, 47  # poll exit codes

# The report both scripts end with: rc first (so when it is there the sizes are final), then the sizes, then
# exactly those bytes past the offsets $o and $e.
_REPORT = (
    'r=$(cat "$d/rc" 2>/dev/null); os=$(($(wc -c <"$d/out"))); es=$(($(wc -c <"$d/err"))); '
    "printf '%s %s %s\\n' \"${r:--}\" \"$os\" \"$es\"; "
    'tail -c "+$((o+1))" "$d/out" | head -c "$((os-o))"; '
    'tail -c "+$((e+1))" "$d/err" | head -c "$((es-e))" >&2'
)
# sh -c LAUNCH sh <archive bytes> <folder> <window> [finished folders to remove...]
LAUNCH = (
    'n=$1; d=$2; w=$3; shift 3; if [ $# -gt 0 ]; then rm -rf -- "$@"; fi; '
    'head -c "$n" | tar xf - -C / || { rm -rf -- "$d"; exit 126; }; '  # a cut upload leaves no half folder
    f'( sh "$d/{SCRIPT}" </dev/null >"$d/out" 2>"$d/err"; echo $? >"$d/rc.tmp"; mv "$d/rc.tmp" "$d/rc" ) </dev/null >/dev/null 2>&1 & '
    'p=$!; echo "$p" >"$d/pid"; trap "w=0" USR1; '
    '( sleep "$w"; kill -USR1 $$ ) </dev/null >/dev/null 2>&1 & t=$!; '
    'wait "$p"; kill "$t" 2>/dev/null; o=0; e=0; ' + _REPORT
)
# sh -c POLL sh <folder> <stdout offset> <stderr offset> <window>
POLL = (
    f'd=$1; o=$2; e=$3; w=$4; [ -d "$d" ] || exit {NO_FOLDER}; '
    f'if [ ! -f "$d/pid" ] && [ ! -f "$d/rc" ]; then exit {NOT_STARTED}; fi; '
    'i=0; while [ ! -f "$d/rc" ] && [ "$i" -lt "$w" ]; do '
    # the job's subshell writes rc before it ends; one that is gone (or a zombie: pid 1 is `sleep`) without it was killed
    '  case "$(cat "/proc/$(cat "$d/pid")/stat" 2>/dev/null)" in ""|*") Z "*) '
    f'    [ -f "$d/rc" ] || exit {VANISHED};; esac; '
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


def parse(stdout: bytes, stderr: bytes, offsets: tuple[int, int]) -> Report:
    """A report's header and bytes; SandboxError when the header is not there or the sizes disagree."""
    head, sep, body = stdout.partition(b"\n")
    fields = head.decode(errors="replace").split()
    if not sep or len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
        raise SandboxError(f"a detached command's report is unreadable: {stdout[:200]!r} {stderr[-300:]!r}")
    code = None if fields[0] == "-" else int(fields[0])
    want_out, want_err = int(fields[1]) - offsets[0], int(fields[2]) - offsets[1]
    if (len(body), len(stderr)) != (want_out, want_err):
        raise SandboxError(f"a detached command's report is short: {len(body)}/{want_out} stdout and {len(stderr)}/{want_err} stderr bytes")
    return Report(code, body, stderr)


__all__ = ["LAUNCH", "NOT_STARTED", "NO_FOLDER", "POLL", "Report", "VANISHED", "WINDOW_S", "folder", "parse"]
