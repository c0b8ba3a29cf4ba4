#!/usr/bin/env python3
"""`gui`: look at and act on the sandbox's browser from the shell (runs inside the sandbox).

A long-lived server (`gui start`, run by the task's setup) drives a headless Chromium through
chromedriver (Debian's chromium, chromium-driver and python3-selenium) with one MiniWoB++ task
page loaded and its episode started from a fixed seed. Every other subcommand is a client that
sends one request over a unix socket and prints the answer:

    gui observe [--json]        the task, the page as a pruned element tree with ids, a screenshot path
    gui click ID                click an element by its id (from `observe`)
    gui click-xy X Y            click at page coordinates (pixels of the screenshot)
    gui drag X1 Y1 X2 Y2        drag with the left button from (X1, Y1) to (X2, Y2)
    gui type TEXT [--into ID]   type into the focused element (or click ID first)
    gui key KEY                 press a key: Enter, Tab, Backspace, ctrl+a, ...
    gui scroll DY [--at ID]     scroll by DY pixels (positive = down)
    gui select ID OPTION        choose OPTION (its text) in a <select> element
    gui status [--json]         whether the episode is done and its reward

Exit codes: 0 done, 1 the action failed (bad id, episode over: the message says why), 2 usage,
3 the browser or its server is gone (an infrastructure failure, not the agent's).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import subprocess
import sys
import time
from typing import Any

STATE_DIR = os.environ.get("FORGETUI_GUI_DIR", "/tmp/forgetui-gui")
SOCKET = os.path.join(STATE_DIR, "sock")
LOG = os.path.join(STATE_DIR, "server.log")
EXIT_OK, EXIT_ACTION, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3
MAX_TEXT = 80
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
QUIET_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1",
)  # fmt: skip
KEYS = {
    "enter": "ENTER", "return": "RETURN", "tab": "TAB", "backspace": "BACKSPACE", "delete": "DELETE",
    "escape": "ESCAPE", "esc": "ESCAPE", "space": "SPACE", "up": "ARROW_UP", "down": "ARROW_DOWN",
    "left": "ARROW_LEFT", "right": "ARROW_RIGHT", "home": "HOME", "end": "END", "pageup": "PAGE_UP",
    "pagedown": "PAGE_DOWN", "ctrl": "CONTROL", "control": "CONTROL", "shift": "SHIFT", "alt": "ALT",
    "meta": "META", "cmd": "META",
}  # fmt: skip
INTERACTIVE = {"button", "a", "select", "textarea", "label", "option", "li", "svg", "circle", "rect", "polygon"}


class ActionError(Exception):
    """The agent's action cannot be done (unknown id, episode over): a message for the agent."""


# ---------------------------------------------------------------- the server (selenium)


class Browser:
    """One Chromium with one MiniWoB++ task page, its episode started from a seed."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = cfg.get("chromium", CHROMIUM)
        for flag in QUIET_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={cfg.get('width', 500)},{cfg.get('height', 320)}")
        service = Service(executable_path=cfg.get("chromedriver", CHROMEDRIVER), log_output=os.path.join(STATE_DIR, "chromedriver.log"))
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(float(cfg.get("load_timeout", 30)))
        self.cfg = cfg
        self.shots = 0
        self.dom: dict[int, dict[str, Any]] = {}
        self.start_episode()

    def start_episode(self) -> None:
        cfg, d = self.cfg, self.driver
        d.get(cfg["url"])
        deadline = time.monotonic() + float(cfg.get("load_timeout", 30))
        while not d.execute_script("return typeof core !== 'undefined' && typeof genProblem === 'function' && !!document.getElementById('sync-task-cover');"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the task page {cfg['url']} did not load within {cfg.get('load_timeout', 30)} s")
            time.sleep(0.05)
        d.execute_script(
            "Math.seedrandom(arguments[0]); core.setDataMode(arguments[1]); core.EPISODE_MAX_TIME = arguments[2]; core.startEpisodeReal();",
            str(cfg["seed"]), cfg.get("mode", "train"), int(float(cfg["timeout"]) * 1000),
        )
        for _ in range(200):
            if d.execute_script("return WOB_TASK_READY;"):
                break
            time.sleep(0.05)
        self.started = time.time()

    # --- reading the page

    def status(self) -> dict[str, Any]:
        s = self.driver.execute_script(
            "return {done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON ? String(WOB_REWARD_REASON) : null};"
        )
        s["task"] = self.cfg["task"]
        s["seed"] = self.cfg["seed"]
        s["elapsed_s"] = round(time.time() - self.started, 3)
        return s

    def refresh(self) -> list[dict[str, Any]]:
        """The page's visible elements (MiniWoB's own core.getDOMInfo), flattened in document order with depth."""
        root = self.driver.execute_script("return core.getDOMInfo();")
        flat: list[dict[str, Any]] = []

        def walk(node: dict[str, Any], depth: int) -> None:
            node["depth"] = depth
            flat.append(node)
            for child in node.get("children") or []:
                walk(child, depth + 1)

        if root:
            walk(root, 0)
        selects = [n["ref"] for n in flat if str(n.get("tag", "")).upper() == "SELECT"]
        if selects:
            options = self.driver.execute_script(
                "return arguments[0].map(function (r) { var e = core.previousDOMInfo[r]; return e ? Array.from(e.options).map(function (o) { return o.text; }) : []; });",
                selects,
            )
            for ref, opts in zip(selects, options, strict=False):
                next(n for n in flat if n["ref"] == ref)["options"] = opts
        self.dom = {int(n["ref"]): n for n in flat}
        return flat

    def screenshot(self) -> dict[str, Any]:
        """A PNG of the task area (MiniWoB's #wrap; the whole viewport when it has none), saved under STATE_DIR."""
        rect = self.driver.execute_script(
            "var w = document.getElementById('wrap'); if (!w) return null; var r = w.getBoundingClientRect();"
            "return {x: r.left, y: r.top, width: r.width, height: r.height};"
        )
        if rect and rect["width"] > 0 and rect["height"] > 0:
            import base64

            clip = {"x": 0, "y": 0, "width": rect["x"] + rect["width"], "height": rect["y"] + rect["height"], "scale": 1}
            data = base64.b64decode(self.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip})["data"])
        else:
            data = self.driver.get_screenshot_as_png()
        self.shots += 1
        path = os.path.join(STATE_DIR, f"screen-{self.shots:04d}.png")
        with open(path, "wb") as fh:
            fh.write(data)
        return {"path": path, "bytes": len(data)}

    def observe(self, screenshot: bool = True) -> dict[str, Any]:
        out = {**self.status(), "utterance": self.driver.execute_script("return core.getUtterance();")}
        out["elements"] = [{k: v for k, v in n.items() if k != "children"} for n in self.refresh()]
        if screenshot:
            out["screenshot"] = self.screenshot()
        return out

    # --- acting

    def _live(self) -> None:
        s = self.status()
        if s["done"]:
            raise ActionError(f"the episode is over (reward {s['reward']}); nothing more can be done")

    def _node(self, ref: int) -> dict[str, Any]:
        self.refresh()
        node = self.dom.get(int(ref))
        if node is None:
            raise ActionError(f"no element with id {ref} on the page now; run `gui observe` for the current ids")
        return node

    def _element(self, ref: int) -> Any:
        return self.driver.execute_script("return core.previousDOMInfo[arguments[0]] || null;", int(ref))

    def _click_at(self, x: float, y: float) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        chain = ActionChains(self.driver, duration=0)
        chain.w3c_actions.pointer_action.move_to_location(int(x), int(y))
        chain.w3c_actions.pointer_action.click()
        chain.w3c_actions.perform()

    def click(self, ref: int) -> str:
        from selenium.common.exceptions import (
            ElementClickInterceptedException,
            ElementNotInteractableException,
        )

        self._live()
        node = self._node(ref)
        element = self._element(ref) if int(ref) > 0 else None
        what = describe(node)
        if element is None:  # a text run (negative id): a real click at its centre
            self._click_at(node["left"] + node["width"] / 2, node["top"] + node["height"] / 2)
            return f"clicked {what}"
        try:
            element.click()
        except (ElementClickInterceptedException, ElementNotInteractableException):
            result = self.driver.execute_script("return core.elementClick(arguments[0]);", int(ref))
            if result is not True:
                raise ActionError(f"cannot click {what}: {result}") from None
        return f"clicked {what}"

    def click_xy(self, x: float, y: float) -> str:
        self._live()
        width, height = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")
        if not (0 <= x < width and 0 <= y < height):
            raise ActionError(f"({x:g}, {y:g}) is outside the page ({width}x{height} pixels)")
        self._click_at(x, y)
        return f"clicked at ({x:g}, {y:g})"

    def drag(self, x1: float, y1: float, x2: float, y2: float) -> str:
        from selenium.webdriver.common.action_chains import ActionChains

        self._live()
        width, height = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")
        for x, y in ((x1, y1), (x2, y2)):
            if not (0 <= x < width and 0 <= y < height):
                raise ActionError(f"({x:g}, {y:g}) is outside the page ({width}x{height} pixels)")
        chain = ActionChains(self.driver, duration=50)
        pointer = chain.w3c_actions.pointer_action
        pointer.move_to_location(int(x1), int(y1))
        pointer.pointer_down()
        pointer.move_to_location(int((x1 + x2) / 2), int((y1 + y2) / 2))  # pages listen for the moves in between
        pointer.move_to_location(int(x2), int(y2))
        pointer.pointer_up()
        chain.w3c_actions.perform()
        return f"dragged from ({x1:g}, {y1:g}) to ({x2:g}, {y2:g})"

    def type(self, text: str, into: int | None = None) -> str:
        from selenium.webdriver.common.action_chains import ActionChains

        self._live()
        if into is not None:
            self.click(into)
        ActionChains(self.driver, duration=0).send_keys(text).perform()
        return f"typed {json.dumps(text)}"

    def key(self, combo: str) -> str:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        self._live()
        parts = [p for p in combo.replace("-", "+").split("+") if p] if len(combo) > 1 else [combo]
        keys = []
        for part in parts:
            name = KEYS.get(part.lower())
            if name is not None:
                keys.append(getattr(Keys, name))
            elif len(part) == 1:
                keys.append(part)
            else:
                raise ActionError(f"unknown key {part!r}; known: {', '.join(sorted(KEYS))} or one character")
        chain = ActionChains(self.driver, duration=0)
        for k in keys[:-1]:
            chain.key_down(k)
        chain.send_keys(keys[-1])
        for k in reversed(keys[:-1]):
            chain.key_up(k)
        chain.perform()
        return f"pressed {combo}"

    def scroll(self, dy: int, at: int | None = None) -> str:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

        self._live()
        if at is None:
            ActionChains(self.driver).scroll_by_amount(0, int(dy)).perform()
            return f"scrolled the page by {dy}"
        node = self._node(at)
        element = self._element(at)
        if element is None:
            raise ActionError(f"element {at} cannot be scrolled (it is a text run)")
        ActionChains(self.driver).scroll_from_origin(ScrollOrigin.from_element(element), 0, int(dy)).perform()
        return f"scrolled {describe(node)} by {dy}"

    def select(self, ref: int, option: str) -> str:
        from selenium.common.exceptions import NoSuchElementException
        from selenium.webdriver.support.ui import Select

        self._live()
        node = self._node(ref)
        if str(node.get("tag", "")).upper() != "SELECT":
            raise ActionError(f"{describe(node)} is not a <select> element")
        chooser = Select(self._element(ref))
        try:
            chooser.select_by_visible_text(option)
        except NoSuchElementException:
            known = ", ".join(json.dumps(o) for o in node.get("options") or [])
            raise ActionError(f"{describe(node)} has no option {option!r}; its options: {known}") from None
        return f"selected {option!r} in {describe(node)}"

    def close(self) -> None:
        try:
            self.driver.quit()
        except Exception:  # noqa: BLE001 - already gone
            pass


def serve(cfg: dict[str, Any]) -> int:
    """Run the server until `gui stop`; a failure to start is written to the log and exits 1."""
    from selenium.common.exceptions import WebDriverException

    try:
        browser = Browser(cfg)
    except Exception as exc:  # noqa: BLE001 - reported to `gui start`, which waits on us
        with open(os.path.join(STATE_DIR, "failed"), "w") as fh:
            fh.write(f"{type(exc).__name__}: {exc}")
        return 1
    actions = {
        "observe": lambda a: browser.observe(a.get("screenshot", True)),
        "status": lambda a: browser.status(),
        "screenshot": lambda a: browser.screenshot(),
        "click": lambda a: {"message": browser.click(int(a["id"]))},
        "click_xy": lambda a: {"message": browser.click_xy(float(a["x"]), float(a["y"]))},
        "drag": lambda a: {"message": browser.drag(float(a["x1"]), float(a["y1"]), float(a["x2"]), float(a["y2"]))},
        "type": lambda a: {"message": browser.type(str(a["text"]), a.get("into"))},
        "key": lambda a: {"message": browser.key(str(a["key"]))},
        "scroll": lambda a: {"message": browser.scroll(int(a["dy"]), a.get("at"))},
        "select": lambda a: {"message": browser.select(int(a["id"]), str(a["option"]))},
        "ping": lambda a: {"pong": True},
    }

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            try:
                request = json.loads(self.rfile.readline() or b"{}")
                op = request.get("op")
                if op == "stop":
                    reply: dict[str, Any] = {"ok": True}
                    self.server.stopping = True  # type: ignore[attr-defined]
                elif op not in actions:
                    reply = {"ok": False, "error": f"unknown request {op!r}"}
                else:
                    result = actions[op](request)
                    reply = {"ok": True, **result}
                    if op not in ("observe", "status", "screenshot", "ping"):
                        reply["status"] = browser.status()
            except ActionError as exc:
                reply = {"ok": False, "error": str(exc)}
            except WebDriverException as exc:
                reply = {"ok": False, "infra": True, "error": f"the browser failed: {exc.msg or exc}"}
            except (KeyError, ValueError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            self.wfile.write(json.dumps(reply).encode() + b"\n")

    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    server = socketserver.UnixStreamServer(SOCKET, Handler)
    server.stopping = False  # type: ignore[attr-defined]
    with open(os.path.join(STATE_DIR, "ready"), "w") as fh:
        fh.write(str(os.getpid()))
    try:
        while not server.stopping:  # type: ignore[attr-defined]
            server.handle_request()
    finally:
        server.server_close()
        browser.close()
        for name in (SOCKET, os.path.join(STATE_DIR, "ready")):
            if os.path.exists(name):
                os.unlink(name)
    return 0


def start(cfg: dict[str, Any], wait_s: float) -> int:
    """Spawn the server detached (it outlives this command) and wait until its page is up."""
    os.makedirs(STATE_DIR, exist_ok=True)
    for name in ("ready", "failed"):
        if os.path.exists(os.path.join(STATE_DIR, name)):
            os.unlink(os.path.join(STATE_DIR, name))
    with open(os.path.join(STATE_DIR, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
        )  # fmt: skip
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(STATE_DIR, "ready")):
            print(f"gui: {cfg['task']} (seed {cfg['seed']}) is up")
            return EXIT_OK
        failed = os.path.join(STATE_DIR, "failed")
        if os.path.exists(failed) or proc.poll() is not None:
            detail = open(failed).read() if os.path.exists(failed) else f"the server exited {proc.poll()}; see {LOG}"
            print(f"gui: the browser did not start: {detail}", file=sys.stderr)
            return EXIT_INFRA
        time.sleep(0.1)
    proc.kill()
    print(f"gui: the browser was not up after {wait_s:g} s (see {LOG})", file=sys.stderr)
    return EXIT_INFRA


# ---------------------------------------------------------------- the client


class ServerGone(Exception):
    """The server does not answer: it was never started, crashed or was stopped."""


def request(op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
    """One request to the server; its JSON answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(SOCKET)
        conn.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise ServerGone(f"the GUI server does not answer ({exc}); it is started by the task's setup and is gone") from None
    finally:
        conn.close()
    if not data:
        raise ServerGone("the GUI server closed the connection without an answer (it crashed?)")
    return json.loads(data)


def describe(node: dict[str, Any]) -> str:
    """One element as the text observation shows it: [id] tag#dom-id "text" value=... (focused)."""
    tag = str(node.get("tag", "")).lower()
    parts = [f"[{node.get('ref')}]", "text" if tag == "t" else tag + (f"#{node['id']}" if node.get("id") else "")]
    text = str(node.get("text") or "").strip()
    if text:
        parts.append(json.dumps(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"))
    if "value" in node and node["value"] is not None:
        value = node["value"]
        parts.append(f"checked={str(value).lower()}" if isinstance(value, bool) else f"value={json.dumps(value)}")
    if node.get("options"):
        parts.append("options=" + json.dumps(node["options"]))
    if node.get("focused"):
        parts.append("(focused)")
    return " ".join(parts)


def keep(node: dict[str, Any]) -> bool:
    """Whether the pruned tree shows an element: anything with text, a value, a DOM id or an interactive tag."""
    tag = str(node.get("tag", "")).lower().split("_")[0]
    return bool(str(node.get("text") or "").strip() or "value" in node or node.get("id") or tag in INTERACTIVE or tag == "input")


def render(obs: dict[str, Any]) -> str:
    """The text observation: the task, the episode state, the pruned element tree with ids and centres."""
    lines = [f"task: {obs.get('utterance', '')}"]
    state = f"done: {str(obs.get('done')).lower()}"
    if obs.get("done"):
        state += f" reward: {obs.get('reward')}"
    lines.append(state)
    if obs.get("screenshot"):
        lines.append(f"screenshot: {obs['screenshot']['path']}")
    lines.append("elements ([id] tag \"text\" @ centre x,y):")
    shown_depths: list[int] = []
    for node in obs.get("elements") or []:
        if not keep(node):
            continue
        while shown_depths and shown_depths[-1] >= node["depth"]:
            shown_depths.pop()
        indent = "  " * len(shown_depths)
        shown_depths.append(node["depth"])
        cx, cy = node["left"] + node["width"] / 2, node["top"] + node["height"] / 2
        lines.append(f"{indent}{describe(node)} @ {cx:.0f},{cy:.0f}")
    return "\n".join(lines)


def print_reply(reply: dict[str, Any]) -> int:
    if not reply.get("ok"):
        print(f"error: {reply.get('error')}", file=sys.stderr)
        return EXIT_INFRA if reply.get("infra") else EXIT_ACTION
    print(reply.get("message", "ok"))
    status = reply.get("status") or {}
    if status.get("done"):
        print(f"the episode is over: reward {status.get('reward')}")
    return EXIT_OK


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gui", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the browser server (the task's setup does this)")
    s.add_argument("--task", required=True)
    s.add_argument("--url", required=True)
    s.add_argument("--seed", required=True)
    s.add_argument("--timeout", type=float, default=120.0, help="the episode's clock in seconds")
    s.add_argument("--mode", default="train")
    s.add_argument("--wait", type=float, default=60.0)
    s.add_argument("--load-timeout", type=float, default=30.0, help="seconds the task page may take to load")
    sub.add_parser("serve", help=argparse.SUPPRESS)
    sub.add_parser("stop", help="stop the server")
    o = sub.add_parser("observe", help="the task, the element tree with ids, and a screenshot")
    o.add_argument("--json", action="store_true")
    o.add_argument("--no-screenshot", action="store_true")
    sub.add_parser("screenshot", help="save a screenshot and print its path")
    st = sub.add_parser("status", help="whether the episode is done, and its reward")
    st.add_argument("--json", action="store_true")
    c = sub.add_parser("click", help="click an element by id")
    c.add_argument("id", type=int)
    cx = sub.add_parser("click-xy", help="click at page coordinates")
    cx.add_argument("x", type=float)
    cx.add_argument("y", type=float)
    dr = sub.add_parser("drag", help="drag with the left button from (X1, Y1) to (X2, Y2)")
    for name in ("x1", "y1", "x2", "y2"):
        dr.add_argument(name, type=float)
    t = sub.add_parser("type", help="type text into the focused element")
    t.add_argument("text")
    t.add_argument("--into", type=int, help="click this element id first")
    k = sub.add_parser("key", help="press a key or combination (Enter, ctrl+a)")
    k.add_argument("key")
    sc = sub.add_parser("scroll", help="scroll by DY pixels (positive = down)")
    sc.add_argument("dy", type=int)
    sc.add_argument("--at", type=int, help="scroll inside this element")
    se = sub.add_parser("select", help="choose an option of a <select> element")
    se.add_argument("id", type=int)
    se.add_argument("option")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cmd == "serve":
        with open(os.path.join(STATE_DIR, "config.json")) as fh:
            return serve(json.load(fh))
    if args.cmd == "start":
        cfg = {"task": args.task, "url": args.url, "seed": args.seed, "timeout": args.timeout, "mode": args.mode, "load_timeout": args.load_timeout}
        return start(cfg, args.wait)
    try:
        if args.cmd == "observe":
            reply = request("observe", screenshot=not args.no_screenshot)
            if reply.get("ok"):
                print(json.dumps(reply) if args.json else render(reply))
                return EXIT_OK
            return print_reply(reply)
        if args.cmd in ("status", "screenshot"):
            reply = request(args.cmd)
            if reply.get("ok") and args.cmd == "status":
                print(json.dumps(reply) if args.json else f"done: {str(reply['done']).lower()} reward: {reply['reward']}")
                return EXIT_OK
            if reply.get("ok"):
                print(reply["path"])
                return EXIT_OK
            return print_reply(reply)
        ops = {
            "click": lambda: request("click", id=args.id),
            "click-xy": lambda: request("click_xy", x=args.x, y=args.y),
            "drag": lambda: request("drag", x1=args.x1, y1=args.y1, x2=args.x2, y2=args.y2),
            "type": lambda: request("type", text=args.text, into=args.into),
            "key": lambda: request("key", key=args.key),
            "scroll": lambda: request("scroll", dy=args.dy, at=args.at),
            "select": lambda: request("select", id=args.id, option=args.option),
            "stop": lambda: request("stop"),
        }
        return print_reply(ops[args.cmd]())
    except ServerGone as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INFRA


if __name__ == "__main__":
    sys.exit(main())
