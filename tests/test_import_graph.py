"""The house has no import circles, and a turn leaves nothing on its conversation for another
module to read back (issue 23).

Every module's imports are read from its source (those under TYPE_CHECKING and inside functions
included: a circle through a type or a late import is still a circle); a module that imports a
name from a package depends on that name's module when it is one, else on the package."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import kioku

PACKAGE = Path(kioku.__file__).parent
ROOT = PACKAGE.parent


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kioku modules `name` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        graph[name] |= imports_of(name, path, known)
    return graph


def test_no_module_takes_part_in_an_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the walk does see the package
    assert circles(graph) == []


def test_the_check_sees_a_circle_through_a_type_or_a_late_import(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    known = {"kioku.x": Path("x.py"), "kioku.y": Path("y.py")}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kioku.y import Y\n"
    probe = tmp_path / "x.py"
    probe.write_text(source + "def f():\n    from kioku import y\n", encoding="utf-8")
    assert imports_of("kioku.x", probe, known) == {"kioku.y"}


def _set_in_a_turn() -> set[str]:
    """Attributes `Conversation`'s methods set (its constructor aside): what a turn leaves."""
    tree = ast.parse((PACKAGE / "engine.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Conversation"]
    names: set[str] = set()
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name != "__init__":
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
    return names


def test_no_attribute_a_turn_sets_on_its_conversation_is_read_by_another_module() -> None:
    left = _set_in_a_turn()
    assert left  # the walk does see the turn's own caches (the raw window, the last prompt)
    readers = {
        f"{p.relative_to(PACKAGE)}: .{node.attr}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "engine.py"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in left
    }
    assert readers == set()


def _slot_attributes() -> set[str]:
    """`Slot`'s attributes, public and private: what a turn learns of its conversation."""
    from kioku.service.slot import Slot

    public = {n for n, v in vars(Slot).items() if isinstance(v, property)}
    return public | {s.lstrip("_") for s in Slot.__slots__} | set(Slot.__slots__)


def slot_writes(source: str) -> set[str]:
    """Where `source` sets an attribute of a slot (`slot.x = …`, `ticket.slot.x += …`,
    `setattr(slot, …)`): each as `line: name`."""
    names = _slot_attributes()

    def is_slot(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and "slot" in node.id.lower()) or (
            isinstance(node, ast.Attribute) and "slot" in node.attr.lower()
        )

    out = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store | ast.Del)
            and node.attr in names
            and is_slot(node.value)
        ):
            out.add(f"{node.lineno}: {node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and is_slot(node.args[0])
        ):
            out.add(f"{node.lineno}: {node.func.id}")
    return out


def test_a_slot_is_written_by_its_own_methods_only() -> None:
    """A turn's state has one writer (issue 44): no module but slot.py sets a slot's
    attributes, and a slot refuses an assignment from outside at run time too."""
    from kioku.service.slot import Slot

    writes = {
        f"{p.relative_to(PACKAGE)}:{w}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "service" / "slot.py"
        for w in slot_writes(p.read_text(encoding="utf-8"))
    }
    assert writes == set()
    slot = Slot()
    for name in ("conv", "system", "character", "last_prompt", "user", "transcripts", "lone"):
        try:
            setattr(slot, name, None)
        except AttributeError:
            continue
        raise AssertionError(f"Slot.{name} can be set from outside")


def test_the_slot_check_sees_an_assignment_and_a_setattr() -> None:
    source = (
        "slot.conv = None\n"
        "ticket.slot.transcripts = True\n"
        "setattr(slot, 'user', 'x')\n"
        "other.conv = None\n"
    )
    assert slot_writes(source) == {"1: conv", "2: transcripts", "3: setattr"}
