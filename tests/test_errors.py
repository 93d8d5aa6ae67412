"""One exception tree: every exception kioku defines is in `kioku.errors`, under `KiokuError`,
drawn in the module's docstring, and none shadows a builtin."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import kioku
from kioku import errors

PACKAGE = Path(kioku.__file__).parent
EXCEPTION_NAMES = {
    name
    for name, v in vars(builtins).items()
    if isinstance(v, type) and issubclass(v, BaseException)
} | {name for name, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}


def exception_classes(source: str) -> list[str]:
    """Classes in this source whose bases name an exception (directly, not through a chain)."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and any(
            (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "")
            in EXCEPTION_NAMES
            for b in node.bases
        )
    ]


def test_exceptions_live_in_errors() -> None:
    elsewhere = {
        str(p.relative_to(PACKAGE)): found
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "errors.py" and (found := exception_classes(p.read_text(encoding="utf-8")))
    }
    assert elsewhere == {}, "define exceptions in kioku/errors.py, under KiokuError"


def test_the_check_sees_an_exception() -> None:
    assert exception_classes("class Lost(StoreError):\n    pass\n") == ["Lost"]
    assert exception_classes("class Oops(Exception):\n    pass\n") == ["Oops"]
    assert exception_classes("class Fine(Protocol):\n    pass\n") == []


def drawn(doc: str) -> dict[str, int]:
    """Each class named in the drawing, with its depth in the tree."""
    out: dict[str, int] = {}
    for line in doc.splitlines():
        stripped = line.lstrip(" │├└─")
        name = stripped.split(" ", 1)[0]
        if name.isidentifier() and name[0].isupper() and name not in out:
            out[name] = (len(line) - len(stripped)) // 4
    return out


def test_one_tree_drawn_in_the_docstring() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__
    ]
    assert len(classes) > 10
    tree = drawn(errors.__doc__ or "")
    for c in classes:
        assert issubclass(c, errors.KiokuError), c
        assert c.__name__ not in vars(builtins), f"{c.__name__} shadows a builtin"
        assert c.__name__ in tree, f"{c.__name__} is missing from the tree in the docstring"
        if c is not errors.KiokuError:  # drawn one level under its parent
            assert tree[c.__name__] == tree[c.__mro__[1].__name__] + 1, c
