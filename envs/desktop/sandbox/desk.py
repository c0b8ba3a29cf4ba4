#!/usr/bin/env python3
"""`gui` for the desktop sandbox: look at and act on an X desktop from the shell (runs inside the sandbox).

`gui start` (the task's setup) starts Xvfb, the openbox window manager and the task's programs,
detached, on display :99. Every other subcommand acts through xdotool and scrot on that display:

    gui observe [--json]        the open windows as [id] window "title" @ x,y WxH, and a screenshot path
    gui click ID                focus (activate and raise) window ID
    gui click-xy X Y            click at screen coordinates (pixels of the screenshot)
    gui double-click-xy X Y     double-click there
    gui drag X1 Y1 X2 Y2        drag with the left button
    gui type TEXT [--into ID]   type text into the focused window (or focus window ID first)
    gui key KEY                 press a key or combination, xdotool names: Return, Tab, ctrl+s, ctrl+a
    gui scroll DY [--at ID]     scroll by DY wheel steps' worth of pixels (positive = down)
    gui find TITLE              the id of the first window whose title contains TITLE
    gui status [--json]         the desktop's state (a desktop task ends when the agent stops)

Exit codes: 0 done, 1 the action failed (bad window id: the message says why), 2 usage, 3 the X
server is gone (an infrastructure failure, not the agent's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

STATE_DIR = os.environ.get("FORGETUI_GUI_DIR", "/tmp/forgetui-gui")
DISPLAY = os.environ.get("FORGETUI_DISPLAY", ":99")
SCREEN = "1024x768x24"
EXIT_OK, EXIT_ACTION, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3
SCROLL_STEP_PX = 40
APP_WAIT_S, APP_TRIES = 20.0, 3


class ActionError(Exception):
    """The agent's action cannot be done: a message for the agent."""


class XGone(Exception):
    """The X server does not answer."""


BUS = os.path.join(STATE_DIR, "bus")


def _env() -> dict[str, str]:
    # the sandbox's own session bus on a path socket: the default (an abstract socket, or X11 autolaunch)
    # lives in the network namespace, which sandboxes on the host's network share
    return {**os.environ, "DISPLAY": DISPLAY, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={BUS}"}


def x(*args: Any, check: bool = True) -> str:
    """Run an X client (xdotool, scrot, xwininfo) on the display; its stdout."""
    try:
        proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=_env(), timeout=30)
    except subprocess.TimeoutExpired:
        raise XGone(f"{args[0]} did not answer within 30 s: the X server is stuck") from None
    if proc.returncode != 0 and check:
        if "Can't open display" in proc.stderr or "cannot open display" in proc.stderr.lower():
            raise XGone(f"the X server on {DISPLAY} is gone: {proc.stderr.strip()}")
        raise ActionError(f"{args[0]} {args[1] if len(args) > 1 else ''} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def spawn(argv: list[str], name: str) -> subprocess.Popen:
    """Start a long-lived program detached from this command (it outlives `gui start`)."""
    log = open(os.path.join(STATE_DIR, f"{name}.log"), "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_env(), start_new_session=True, close_fds=True)


def task_info() -> dict[str, Any]:
    """The task `gui start` was given (name and parameters)."""
    try:
        with open(os.path.join(STATE_DIR, "task.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def x_alive() -> bool:
    try:
        return subprocess.run(["xdotool", "getdisplaygeometry"], capture_output=True, env=_env(), timeout=10).returncode == 0
    except subprocess.TimeoutExpired:  # a server still starting on a busy machine: not up yet (the caller's deadline decides)
        return False


def start(apps: list[str], wait_s: float, task: dict[str, Any]) -> int:
    """Xvfb, openbox, then each app (a shell command line), waiting until each app's window is mapped."""
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, "task.json"), "w") as fh:
        json.dump(task, fh)
    # no TCP and no abstract-namespace socket: sandboxes on the host's network share that namespace,
    # and one sandbox's programs must never reach another's X server
    # -noreset: by default Xvfb resets when its last client leaves, and a client connecting then fails
    spawn(["Xvfb", DISPLAY, "-screen", "0", SCREEN, "-nolisten", "tcp", "-nolisten", "local", "-noreset"], "xvfb")
    deadline = time.monotonic() + wait_s
    while not x_alive():
        if time.monotonic() > deadline:
            print(f"gui: the X server did not start within {wait_s:g} s", file=sys.stderr)
            return EXIT_INFRA
        time.sleep(0.1)
    spawn(["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--address=unix:path={BUS}"], "dbus")
    if not _wait(lambda: os.path.exists(BUS), 10.0):
        print(f"gui: the session bus did not start (see {STATE_DIR}/dbus.log)", file=sys.stderr)
        return EXIT_INFRA
    for _ in range(3):  # the window manager, checked: it sets _NET_SUPPORTING_WM_CHECK on the root window
        spawn(["openbox"], "openbox")
        if _wait(wm_running, min(10.0, max(0.0, deadline - time.monotonic()))):
            break
    else:
        print(f"gui: the window manager did not start (see {STATE_DIR}/openbox.log)", file=sys.stderr)
        return EXIT_INFRA
    for i, app in enumerate(apps):
        before = set(windows_ids())
        for _ in range(APP_TRIES):  # a program that shows no window in APP_WAIT_S is killed and started again
            proc = spawn(["sh", "-c", app], f"app{i}")
            if _wait(lambda known=before: bool(set(windows_ids()) - known), min(APP_WAIT_S, max(0.0, deadline - time.monotonic()))):
                break
            with open(os.path.join(STATE_DIR, f"app{i}.log"), "a") as fh:
                fh.write(f"[gui] no window after {APP_WAIT_S:g} s: restarting {app!r}\n")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            print(f"gui: {app!r} opened no window in {APP_TRIES} tries (see {STATE_DIR}/app{i}.log)", file=sys.stderr)
            return EXIT_INFRA
    time.sleep(0.5)  # let the last window take focus and draw
    with open(os.path.join(STATE_DIR, "started"), "w") as fh:
        json.dump({"apps": apps, "at": time.time()}, fh)
    print(f"gui: desktop up with {len(apps)} program(s)")
    return EXIT_OK


def wm_running() -> bool:
    out = subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], capture_output=True, text=True, env=_env(), timeout=10)
    return out.returncode == 0 and "window id" in out.stdout


def _wait(ready: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ready():
            return True
        time.sleep(0.1)
    return ready()


def windows_ids() -> list[str]:
    out = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", ""], capture_output=True, text=True, env=_env(), timeout=10)
    return [w for w in out.stdout.split() if w.strip()]


def windows() -> list[dict[str, Any]]:
    """The visible top-level windows with a title: id, title, geometry, focus."""
    focused = x("xdotool", "getwindowfocus", check=False).strip()
    out = []
    for wid in windows_ids():
        title = x("xdotool", "getwindowname", wid, check=False).strip()
        geo = x("xdotool", "getwindowgeometry", "--shell", wid, check=False)
        g = dict(line.split("=", 1) for line in geo.splitlines() if "=" in line)
        if not title or not g:
            continue
        w, h = int(g.get("WIDTH", 0)), int(g.get("HEIGHT", 0))
        if w < 20 or h < 20:
            continue
        out.append({"id": int(wid), "title": title, "x": int(g.get("X", 0)), "y": int(g.get("Y", 0)), "width": w, "height": h, "focused": wid == focused})
    return out


def screenshot() -> dict[str, Any]:
    os.makedirs(STATE_DIR, exist_ok=True)
    n = len([f for f in os.listdir(STATE_DIR) if f.startswith("screen-")]) + 1
    path = os.path.join(STATE_DIR, f"screen-{n:04d}.png")
    x("scrot", "--overwrite", path)
    return {"path": path, "bytes": os.path.getsize(path)}


def observe(shot: bool) -> dict[str, Any]:
    if not x_alive():
        raise XGone(f"the X server on {DISPLAY} is gone")
    out: dict[str, Any] = {"done": False, "windows": windows(), "screen": SCREEN.rsplit("x", 1)[0]}
    if shot:
        out["screenshot"] = screenshot()
    return out


def render(obs: dict[str, Any]) -> str:
    lines = [f"desktop {obs['screen']} (click-xy takes screen pixels)"]
    if obs.get("screenshot"):
        lines.append(f"screenshot: {obs['screenshot']['path']}")
    lines.append("windows ([id] window \"title\" @ x,y WxH):")
    for w in obs["windows"]:
        lines.append(f"[{w['id']}] window {json.dumps(w['title'])} @ {w['x']},{w['y']} {w['width']}x{w['height']}" + (" (focused)" if w["focused"] else ""))
    return "\n".join(lines)


def _window(wid: int) -> dict[str, Any]:
    for w in windows():
        if w["id"] == int(wid):
            return w
    raise ActionError(f"no window with id {wid}; run `gui observe` for the open windows")


def focus(wid: int) -> str:
    w = _window(wid)
    x("xdotool", "windowactivate", "--sync", w["id"], check=False)
    x("xdotool", "windowfocus", "--sync", w["id"], check=False)
    return f"focused window {json.dumps(w['title'])}"


def _in_screen(px: float, py: float) -> None:
    width, height = (int(v) for v in SCREEN.split("x")[:2])
    if not (0 <= px < width and 0 <= py < height):
        raise ActionError(f"({px:g}, {py:g}) is outside the {width}x{height} screen")


def act(args: argparse.Namespace) -> str:
    if not x_alive():
        raise XGone(f"the X server on {DISPLAY} is gone")
    cmd = args.cmd
    if cmd == "click":
        return focus(args.id)
    if cmd in ("click-xy", "double-click-xy"):
        _in_screen(args.x, args.y)
        x("xdotool", "mousemove", "--sync", int(args.x), int(args.y), "click", "--repeat", 2 if cmd == "double-click-xy" else 1, 1)
        return f"{'double-' if cmd == 'double-click-xy' else ''}clicked at ({args.x:g}, {args.y:g})"
    if cmd == "drag":
        for px, py in ((args.x1, args.y1), (args.x2, args.y2)):
            _in_screen(px, py)
        x("xdotool", "mousemove", "--sync", int(args.x1), int(args.y1), "mousedown", 1)
        x("xdotool", "mousemove", "--sync", int(args.x2), int(args.y2), "mouseup", 1)
        return f"dragged from ({args.x1:g}, {args.y1:g}) to ({args.x2:g}, {args.y2:g})"
    if cmd == "type":
        if args.into is not None:
            focus(args.into)
        x("xdotool", "type", "--delay", "12", "--", args.text)
        return f"typed {json.dumps(args.text)}"
    if cmd == "key":
        x("xdotool", "key", "--clearmodifiers", "--", *args.key.split())
        return f"pressed {args.key}"
    if cmd == "scroll":
        if args.at is not None:
            w = _window(args.at)
            x("xdotool", "mousemove", "--sync", w["x"] + w["width"] // 2, w["y"] + w["height"] // 2)
        button = 5 if args.dy > 0 else 4
        steps = max(1, abs(int(args.dy)) // SCROLL_STEP_PX)
        x("xdotool", "click", "--repeat", steps, button)
        return f"scrolled {'down' if args.dy > 0 else 'up'} {steps} step(s)"
    if cmd == "select":
        raise ActionError("the desktop has no <select> elements: click the option, or type into the focused widget")
    raise ActionError(f"unknown command {cmd}")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gui", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start Xvfb, the window manager and the task's programs (the task's setup does this)")
    s.add_argument("--app", action="append", default=[], help="a program to start (a shell command line); repeatable")
    s.add_argument("--wait", type=float, default=60.0)
    s.add_argument("--task", default="")
    s.add_argument("--params", default="{}", help="the task's parameters (JSON), kept for `gui status`")
    f = sub.add_parser("find", help="the id of the first window whose title contains TITLE")
    f.add_argument("title")
    o = sub.add_parser("observe")
    o.add_argument("--json", action="store_true")
    o.add_argument("--no-screenshot", action="store_true")
    sub.add_parser("screenshot")
    st = sub.add_parser("status")
    st.add_argument("--json", action="store_true")
    c = sub.add_parser("click", help="focus a window by id")
    c.add_argument("id", type=int)
    for name in ("click-xy", "double-click-xy"):
        cx = sub.add_parser(name)
        cx.add_argument("x", type=float)
        cx.add_argument("y", type=float)
    d = sub.add_parser("drag")
    for a in ("x1", "y1", "x2", "y2"):
        d.add_argument(a, type=float)
    t = sub.add_parser("type")
    t.add_argument("text")
    t.add_argument("--into", type=int)
    k = sub.add_parser("key")
    k.add_argument("key")
    sc = sub.add_parser("scroll")
    sc.add_argument("dy", type=int)
    sc.add_argument("--at", type=int)
    se = sub.add_parser("select")
    se.add_argument("id", type=int)
    se.add_argument("option")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.cmd == "start":
            return start(args.app, args.wait, {"task": args.task, "params": json.loads(args.params)})
        if args.cmd == "observe":
            obs = observe(not args.no_screenshot)
            print(json.dumps(obs) if args.json else render(obs))
        elif args.cmd == "screenshot":
            print(screenshot()["path"])
        elif args.cmd == "status":
            if not x_alive():
                raise XGone(f"the X server on {DISPLAY} is gone")
            state = {"done": False, "windows": len(windows()), **task_info()}
            print(json.dumps(state) if args.json else f"done: false windows: {state['windows']}")
        elif args.cmd == "find":
            hit = next((w for w in windows() if args.title.lower() in w["title"].lower()), None)
            if hit is None:
                raise ActionError(f"no open window's title contains {args.title!r}")
            print(hit["id"])
        else:
            print(act(args))
        return EXIT_OK
    except ActionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ACTION
    except XGone as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INFRA


if __name__ == "__main__":
    sys.exit(main())

