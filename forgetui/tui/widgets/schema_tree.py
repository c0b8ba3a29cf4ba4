"""The store's schema as a tree: tables and views, their columns with types and the README's meanings.
Selecting a node posts Picked with the name to insert into the query."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import Tree

from core.store.schema import BEHAVIOUR_VIEWS, TABLES, VIEWS


class SchemaTree(Tree[str]):
    """Tables → columns; Enter on a table or column inserts its name into the editor."""

    DEFAULT_CSS = """
    SchemaTree { border: round $primary-darken-1; }
    SchemaTree:focus { border: round $accent; }
    """

    class Picked(Message):
        """A table or column name was chosen."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    BORDER_TITLE = "Schema"

    def __init__(self, **kwargs: object) -> None:
        super().__init__("store", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        for name, about, columns, _ in TABLES:
            node = self.root.add(Text(name, style="bold"), data=name)
            node.add_leaf(Text(about, style="dim italic"), data=None)
            for column, kind, meaning in columns:
                label = Text(column)
                label.append(f" {kind}", style="cyan")
                label.append(f"  {meaning}", style="dim")
                node.add_leaf(label, data=column)
        # the behaviour views are TEMP views since schema 6 (not in the file), made for any query that names them
        for name, about, _ in (*VIEWS, *BEHAVIOUR_VIEWS):
            node = self.root.add(Text(name, style="bold magenta"), data=name)
            node.add_leaf(Text(about, style="dim italic"), data=None)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        event.stop()
        if event.node.data:
            self.post_message(self.Picked(event.node.data))
