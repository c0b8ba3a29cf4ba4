"""Each TUI widget carries its own look in its DEFAULT_CSS; the .tcss files hold only the app's and screens' layout
(issue 46, item 4). Checked on the text alone: no app is started."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from textual.widget import Widget

TUI = Path(__file__).resolve().parents[1] / "forgetui" / "tui"
STYLED = ("behaviour_table.BehaviourTable", "call_inspector.CallInspector", "call_json.CallJson", "calls_pane.CallsPane",
          "line_table.LineTable", "live_run.LiveRun", "pass_table.PassTable", "result_table.ResultTable",
          "reward_chart.RewardChart", "rollouts_pane.RolloutsPane", "schema_tree.SchemaTree", "sql_console.SqlConsole",
          "token_view.TokenView", "train_curves.TrainCurves")


def widget_names() -> set[str]:
    """The class names of every widget defined under forgetui/tui/widgets/."""
    names = set()
    for path in (TUI / "widgets").glob("*.py"):
        names.update(re.findall(r"^class (\w+)\(", path.read_text(), flags=re.M))
    return names


def rule_heads(tcss: str) -> list[str]:
    """The first compound selector of each rule in a flat .tcss text (comments dropped)."""
    text = re.sub(r"/\*.*?\*/", "", tcss, flags=re.S)
    heads = []
    for selectors in re.findall(r"([^{}]+)\{", text):
        heads += [s.split()[0] for s in selectors.split(",") if s.strip()]
    return heads


def test_no_tcss_rule_starts_at_a_widget() -> None:
    """A rule that starts at a widget is that widget's own look: it belongs in the widget's DEFAULT_CSS."""
    names = widget_names()
    assert {"LineTable", "SqlConsole", "TokenView"} <= names
    found = [f"{path.relative_to(TUI)}: {head}" for path in sorted(TUI.rglob("*.tcss")) for head in rule_heads(path.read_text())
             if re.split(r"[.:#]", head)[0] in names]
    assert not found, found


def test_the_styled_widgets_carry_their_own_default_css() -> None:
    """The widgets whose look the .tcss files held before issue 46 now say it themselves."""
    for dotted in STYLED:
        module, name = dotted.split(".")
        cls = getattr(importlib.import_module(f"forgetui.tui.widgets.{module}"), name)
        assert issubclass(cls, Widget)
        assert name in cls.__dict__.get("DEFAULT_CSS", ""), f"{dotted} has no DEFAULT_CSS of its own"
