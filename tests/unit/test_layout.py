"""The house rules of the code, checked on the source: one-way imports, one owner per layout.

- tuner's packages import only what stands below them in the data flow (LAYERS), and no two
  modules import each other, directly or round a circle, lazily or only for type checking;
- modules inside tuner never import the public facade (``tuner/__init__.py``): it is for
  objectives/, benchmarks/ and users, and importing it from inside would tie every module to all;
- objectives/ and benchmarks/ import only that facade and ``tuner.testing`` (the test doubles
  and replay harness the tests share with the benchmarks, public like ``optuna.testing``; the
  benchmarks' own tests may reach inside, as tests/ does), and nothing edits ``sys.path``;
- tests/ never imports benchmarks, benchmarks/ (its tests included) never imports tests, and
  tuner imports neither;
- only public Optuna APIs are used, and no module reaches into the private members of another
  object of tuner's classes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tuner"

# Top first. A unit may import units of its own row or below; same-row imports are allowed but
# the circle check below still forbids two of them importing each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    # test doubles and the replay harness: they drive a whole study, and nothing imports them
    ("testing",),
    ("cli", "cli_deployment", "composition", "console"),
    ("deployment",),
    ("export",),
    ("review",),
    ("study",),
    ("executor",),
    # the simulated GPU host's process: a server made of the plan's estimates
    ("simulation",),
    ("plan",),
    ("trial",),
    ("server", "loadgen", "telemetry", "quality"),
    ("scoring",),
    ("measurement", "search", "host", "traffic"),
    ("paths", "redact", "schema"),
    ("config",),
    ("errors",),
)
RANK = {unit: len(LAYERS) - i for i, row in enumerate(LAYERS) for unit in row}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def tuner_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, package: str) -> Iterator[tuple[str, int]]:
    """Every module name imported anywhere in the file (functions and TYPE_CHECKING too).

    ``from a.b import c`` yields ``a.b.c`` when that is a module of tuner, else ``a.b``.
    """
    modules = tuner_modules()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from tuner.review import plots` names a module
                sub = f"{base}.{alias.name}"
                yield (sub if sub in modules else base), node.lineno


def internal_edges() -> dict[str, set[str]]:
    modules = tuner_modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, _ in imports_of(path, package):
            if target in modules and target != name and target != "tuner":
                edges[name].add(target)
    return edges


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_layer() -> None:
    units = {unit(m) for m in tuner_modules()} - {""}
    assert units <= set(RANK), f"add {sorted(units - set(RANK))} to LAYERS"


def test_no_import_runs_upward() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in internal_edges().items()
        for dst in targets
        if unit(src) and unit(dst) and RANK[unit(dst)] > RANK[unit(src)]
    ]
    assert not upward, "imports that run up the data flow:\n" + "\n".join(sorted(upward))


def test_no_import_cycle() -> None:
    edges = internal_edges()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_inside_modules_do_not_import_the_facade() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in tuner_modules().items()
        if name != "tuner"
        for target, line in imports_of(path, name)
        if target == "tuner"
    ]
    assert not bad, "import from tuner's submodules, not the facade, at: " + ", ".join(bad)


@pytest.mark.parametrize("folder", ["objectives", "benchmarks"])
def test_outside_code_imports_only_the_public_api(folder: str) -> None:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        # benchmarks/tests, like tests/, may reach inside tuner: a test checks the internals
        internals_ok = path.is_relative_to(ROOT / "benchmarks" / "tests")
        for target, line in imports_of(path, folder):
            if target.startswith("tuner.") and not internals_ok and not _is_public(target):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
        if "sys.path" in path.read_text(encoding="utf-8"):
            bad.append(f"{path.relative_to(ROOT)} edits sys.path")
    assert not bad, "\n".join(bad)


# Each tree may not import the other: what tests/ and benchmarks/ both need lives in
# tuner.testing, so that either runs, moves or is left out of a package without the other.
# tuner itself imports neither.
FORBIDDEN = {"tests": ("benchmarks",), "benchmarks": ("tests",), "tuner": ("benchmarks", "tests")}
IMPORT_CALLS = {"import_module", "__import__"}


def imported_names(path: Path) -> Iterator[tuple[str, int]]:
    """Every absolute module name the file imports: ``import x``, ``from x import y`` (anywhere,
    functions and TYPE_CHECKING included) and a string literal handed to
    ``importlib.import_module`` or ``__import__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module, node.lineno
        elif isinstance(node, ast.Call) and node.args and _is_str(node.args[0]):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in IMPORT_CALLS:
                yield node.args[0].value, node.lineno  # type: ignore[attr-defined]


def crossings(path: Path, banned: tuple[str, ...]) -> list[tuple[str, int]]:
    """The imports of ``path`` whose top-level package is one of ``banned``."""
    return [(name, line) for name, line in imported_names(path) if name.split(".")[0] in banned]


def test_tests_and_benchmarks_do_not_import_each_other() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for folder, banned in FORBIDDEN.items()
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, line in crossings(path, banned)
    ]
    assert not bad, "put what both need in tuner.testing:\n" + "\n".join(bad)


def test_the_crossing_check_sees_every_form_of_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import benchmarks\nimport benchmarks.replay as r\nfrom benchmarks import replay\n"
        "from benchmarks.scoring import HV_AT\nimport importlib\n"
        "m = importlib.import_module('benchmarks.replay')\n"
        "def f():\n    from benchmarks import gpu_replay\n    return __import__('benchmarks')\n"
        "from tuner.testing import lookup\nimport benchmarks_like\nx = 'benchmarks.replay'\n"
    )
    lines = [line for _, line in crossings(sample, ("benchmarks",))]
    assert lines == [1, 2, 3, 4, 6, 8, 9], lines


def _is_public(target: str) -> bool:
    """``from tuner import X`` yields ``tuner.X``: fine when X is in the facade's __all__;
    ``tuner.testing`` and its modules are public as a whole."""
    import tuner

    if target == "tuner.testing" or target.startswith("tuner.testing."):
        return True
    name = target.removeprefix("tuner.")
    return "." not in name and name in tuner.__all__


def test_the_facade_exports_what_it_lists() -> None:
    import tuner

    missing = [name for name in tuner.__all__ if getattr(tuner, name, None) is None]
    assert not missing, f"tuner.__all__ lists names it cannot give: {missing}"


PRIVATE_OPTUNA = re.compile(r"\._trial_id\b|\._study_id\b|\._get_\w+|\b(?:study|trial)\._storage\b")


def test_only_public_optuna_apis() -> None:
    bad = []
    for folder in ("tuner", "objectives", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PRIVATE_OPTUNA.search(line):
                    bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "private Optuna attributes:\n" + "\n".join(bad)


ATTR_CALLS = {"set_user_attr", "set_trial_user_attr", "set_system_attr"}
STUDY_NAME_PARTS = re.compile(r"^baseline:$|^:confirm$")


def _schema_literals(path: Path) -> Iterator[tuple[int, str]]:
    """String literals used as attribute keys or study-name parts (tuner.schema's job)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            reads = node.func.attr == "get" and _is_user_attrs(node.func.value)
            if (node.func.attr in ATTR_CALLS or reads) and _is_str(first):
                yield node.lineno, f"attr key {first.value!r}"  # type: ignore[union-attr]
            for kw in node.keywords:
                if kw.arg in ("user_attrs", "system_attrs") and isinstance(kw.value, ast.Dict):
                    keys = [k for k in kw.value.keys if _is_str(k)]
                    yield from ((node.lineno, f"attr key {k.value!r}") for k in keys)  # type: ignore[union-attr]
        elif isinstance(node, ast.Subscript) and _is_user_attrs(node.value) and _is_str(node.slice):
            yield node.lineno, f"attr key {node.slice.value!r}"  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare) and _is_str(node.left) and _in_attrs(node):
            yield node.lineno, f"attr key {node.left.value!r}"  # type: ignore[attr-defined]
        elif _is_str(node) and STUDY_NAME_PARTS.search(node.value):  # type: ignore[attr-defined]
            # the pieces of f"baseline:{key}" and f"{name}:confirm"
            yield node.lineno, f"study name part {node.value!r}"  # type: ignore[attr-defined]


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _in_attrs(node: ast.Compare) -> bool:
    return any(_is_user_attrs(c) for c in node.comparators)


def _is_user_attrs(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in ("user_attrs", "system_attrs", "attrs")


def test_study_names_and_attribute_keys_are_spelled_only_in_schema() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "schema.py"
        for line, what in _schema_literals(path)
    ]
    assert not bad, "name these through tuner.schema:\n" + "\n".join(bad)


def test_the_schema_check_sees_a_literal_key(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "t.set_user_attr('role', 1)\nx = t.user_attrs.get('stage')\ny = t.user_attrs['folder']\n"
        "z = 'decision' in s.user_attrs\nname = f'{n}:confirm'\n"
    )
    found = [what for _, what in _schema_literals(sample)]
    assert len(found) == 5, found


def _python_files() -> Iterator[Path]:
    for folder in ("tuner", "objectives", "tests", "benchmarks", "scripts"):
        yield from (ROOT / folder).rglob("*.py")


def test_layout_is_left_to_the_formatter() -> None:
    """`ruff format` decides layout everywhere: a hand-kept table behind a marker drifts from
    the style the rest of the tree follows and is skipped by `ruff format --check`."""
    marked = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _python_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#\s*fmt:\s*(skip|off)\b", line)
    ]
    assert not marked, f"formatter markers left: {marked[:10]}"


def test_no_two_modules_share_a_file_name() -> None:
    """Each room has its own name: a reader (and an import alias) never has to tell two
    ``space.py`` apart. Package ``__init__`` files and ``__main__`` entry points excepted."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, shared


def _private_members(tree: ast.AST) -> set[str]:
    """The private methods and attributes tuner's classes define (``_name``, not dunders)."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def reached_privates(trees: dict[str, ast.AST]) -> list[str]:
    """Where code reaches a private member of one of tuner's classes through anything but
    ``self``, ``cls`` or ``super()``: another object's insides, which its class cannot change
    without breaking the caller (a stage loop once drove the runner through eight of them)."""
    private = set().union(*(_private_members(t) for t in trees.values()))
    found = []
    for where, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in private:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super":
                continue
            found.append((where, node.lineno, ast.unparse(node)))
    return [f"{where}:{line}: {text}" for where, line, text in sorted(found)]


def test_no_module_reaches_into_another_objects_private_members() -> None:
    trees = {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    found = reached_privates(trees)
    assert not found, "make these public, or move the code into the class:\n" + "\n".join(found)


def test_the_private_check_sees_a_reach_across(tmp_path: Path) -> None:
    code = (
        "class Runner:\n    def _land(self):\n        self._n = 1\n"
        "class Loop:\n    def run(self, host):\n        host._land()\n        self._own()\n"
        "        super()._own()\n        return host._n\n"
    )
    found = reached_privates({"sample.py": ast.parse(code)})
    assert found == ["sample.py:6: host._land", "sample.py:9: host._n"], found
