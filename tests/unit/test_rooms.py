"""The package's folders are its rooms (docs/design.md, "Module map"): few modules at the top, the
rooms importing each other without a cycle, each server's code in its own room, modules of a size
one can read, and nothing that re-execs a process."""

import ast
import re
from collections import defaultdict
from pathlib import Path

from ts_compiled_handlers.runtime import package_files

PACKAGE = package_files.PACKAGE
NAME = package_files.NAME
TOOLS = set(package_files.TOOLS)


def modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts and path.parts[len(PACKAGE.parts)] not in TOOLS
    )


def room(path: Path) -> str:
    """`servers/torchserve/adapter.py` -> `servers.torchserve`; a top-level module -> ``."""
    return ".".join(path.relative_to(PACKAGE).parts[:-1])


def room_of_module(dotted: str) -> str | None:
    """The room of an imported `ts_compiled_handlers.x.y` (a module or a name in one)."""
    parts = dotted.split(".")[1:]
    for length in range(len(parts), 0, -1):
        folder = PACKAGE.joinpath(*parts[:length])
        if folder.is_dir():
            return ".".join(parts[:length])
        if folder.with_suffix(".py").is_file():
            return ".".join(parts[: length - 1])
    return "" if not parts else None


def runtime_imports(tree: ast.Module):
    """Every import node outside `if TYPE_CHECKING:` blocks (type-only imports cannot cycle at run time)."""
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    return [
        node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in type_only
    ]


def imported_names(node) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    if node.module == NAME:
        return [f"{NAME}.{alias.name}" for alias in node.names]
    return [node.module]


def top_room(name: str) -> str:
    return name.split(".")[0]


def test_the_top_holds_only_the_package_s_init_and_at_least_six_rooms():
    top = [path.name for path in PACKAGE.iterdir() if path.is_file()]
    rooms = [path for path in PACKAGE.iterdir() if (path / "__init__.py").is_file() and path.name not in TOOLS]
    assert top == ["__init__.py"], top
    assert len(rooms) >= 6, rooms


def test_one_torchserve_handler_file_and_it_is_the_one_every_archive_names():
    """The per-task handler files went: one BaseHandler subclass (the adapter's) and one file an
    archive names, which subclasses it and nothing else."""
    subclassing = {
        path.relative_to(PACKAGE).as_posix(): node.name
        for path in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and {ast.unparse(base) for base in node.bases} & {"BaseHandler", "TorchServeHandler"}
    }
    assert subclassing == {"servers/torchserve/adapter.py": "TorchServeHandler", package_files.HANDLER: "Handler"}


def test_the_rooms_import_each_other_without_a_cycle():
    edges = defaultdict(set)
    for path in modules():
        here = top_room(room(path))
        for node in runtime_imports(ast.parse(path.read_text())):
            for name in imported_names(node):
                if name.startswith(f"{NAME}."):
                    there = room_of_module(name)
                    if there is not None and top_room(there) not in (here, "") and here:
                        edges[here].add(top_room(there))

    def reaches(start, goal, seen=()):
        return any(step == goal or (step not in seen and reaches(step, goal, (*seen, step))) for step in edges[start])

    cycles = [(a, b) for a in list(edges) for b in edges[a] if reaches(b, a)]
    assert not cycles, dict(edges)


def test_each_server_is_imported_only_in_its_own_room():
    """`ts` only under servers/torchserve, `ray` only under servers/ray."""
    for path in modules():
        imported = {
            name.split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in imported_names(node)
        }
        where = room(path)
        if "ts" in imported:
            assert where == "servers.torchserve", path
        if "ray" in imported:
            assert where == "servers.ray", path


def test_only_the_torchserve_room_reads_a_context():
    """TorchServe's `context` (its manifest, system properties, metrics) is read in its room alone."""
    for path in modules():
        tree = ast.parse(path.read_text())
        arguments = {arg.arg for node in ast.walk(tree) if isinstance(node, ast.arguments) for arg in node.args}
        if "context" in arguments:
            assert room(path) == "servers.torchserve", path


def test_no_module_is_over_450_lines_and_none_re_execs_a_process():
    for path in modules():
        text = path.read_text()
        assert len(text.splitlines()) <= 450, path
        assert "execve" not in text and "orig_argv" not in text, path


def test_no_function_is_over_50_lines():
    long = [
        f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1})"
        for path in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50
    ]
    assert not long, long


def test_no_server_asks_which_loop_or_task_class_it_holds():
    """Every loop says its kind and serves through one interface; a server never dispatches on the
    class of a loop or a task (`isinstance`), so a new loop or task needs no server's change."""
    rooms = [PACKAGE / "loops", PACKAGE / "tasks"]
    classes = {
        node.name
        for room in rooms
        for path in room.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    asked = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in (PACKAGE / "servers").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "isinstance"
        and set(ast.unparse(node.args[1]).strip("()").replace(" ", "").split(",")) & classes
    ]
    assert classes and not asked, asked


def test_the_tasks_import_neither_compiling_nor_quantizing_and_configuration_sits_below_them():
    """A task is a plain object a worker builds with: how it is compiled or quantized is the startup
    room's business (not even a type-only import), and the configuration it reads imports no room
    above it."""

    def rooms_imported(path: Path, nodes) -> set[str]:
        names = [name for node in nodes for name in imported_names(node) if name.startswith(f"{NAME}.")]
        return {top_room(room_of_module(name)) for name in names}

    for path in (PACKAGE / "tasks").rglob("*.py"):
        every = [
            node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
        assert not rooms_imported(path, every) & {"compiling", "quantizing"}, path
    for path in (PACKAGE / "configuration").rglob("*.py"):
        assert rooms_imported(path, runtime_imports(ast.parse(path.read_text()))) <= {"configuration", "request"}, path


def test_design_md_s_module_map_names_every_module_where_it_lives_and_no_other():
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    mapped = design[design.index("## Module map") :]
    mapped = mapped[: mapped.index("\n## ", 3)]
    sections = dict(re.findall(r"\*\*`([a-z_]+)/`\*\*\n((?:- .*\n(?:  .*\n)*)+)", mapped))
    entry = r"`([a-z_/0-9]+\.py)`(?=(?:, `[a-z_/0-9]+\.py`)*:)"  # `name.py`: (or `a.py`, `b.py`:) what it holds
    listed = {f"{room}/{name}" for room, text in sections.items() for name in re.findall(entry, text)}
    tree = {path.relative_to(PACKAGE).as_posix() for path in modules() if path.name != "__init__.py"}
    tree |= {f"{room}/__init__.py" for room in ("tasks", "protocols")}  # their contract lives there
    assert listed == tree, (sorted(tree - listed), sorted(listed - tree))
