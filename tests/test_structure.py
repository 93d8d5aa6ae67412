"""Size floors that hold for code not written yet (issue 44): no kioku module over 600 lines,
no function in `kioku/service/` over 80 lines. A module past them holds more than one concept,
a function more than one step: split it by what it does, not by where the limit falls."""

from __future__ import annotations

import ast
from pathlib import Path

import kioku

PACKAGE = Path(kioku.__file__).parent
MAX_MODULE_LINES = 600
MAX_SERVICE_FUNCTION_LINES = 80


def long_modules(root: Path, limit: int) -> dict[str, int]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[str(p.relative_to(root))] = n
    return out


def long_functions(source: str, limit: int) -> dict[str, int]:
    """Functions (nested ones too, each on its own: a nested function counts in its parent's
    lines as well) whose body, decorators and signature run over `limit` lines."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - first + 1
            if n > limit:
                out[f"{node.name}:{node.lineno}"] = n
    return out


def test_no_kioku_module_is_over_600_lines() -> None:
    assert len(list(PACKAGE.rglob("*.py"))) > 100  # the walk does see the package
    assert long_modules(PACKAGE, MAX_MODULE_LINES) == {}


def test_no_function_in_service_is_over_80_lines() -> None:
    found = {
        f"{p.relative_to(PACKAGE)}:{name}": n
        for p in sorted((PACKAGE / "service").rglob("*.py"))
        for name, n in long_functions(
            p.read_text(encoding="utf-8"), MAX_SERVICE_FUNCTION_LINES
        ).items()
    }
    assert found == {}


def test_the_checks_see_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    source = f"@decorated\ndef long():\n{body}\ndef short():\n    pass\n"
    assert long_functions(source, 80) == {"long:2": 82}
    (tmp_path / "big.py").write_text("\n" * 601, encoding="utf-8")
    (tmp_path / "small.py").write_text("\n" * 600, encoding="utf-8")
    assert long_modules(tmp_path, 600) == {"big.py": 601}
