"""The package layout: imports go one way (see README, "Layout"), at module top, with no cycles; a
function-level import only for an optional heavy dependency, with a comment saying so."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "keepsight"

# package -> layer; a module may import its own package and packages of the same or a lower layer
LAYERS = {
    "keepsight": 0, "atomic": 0, "checks": 0, "methods": 0, "openmp": 0, "cores": 0, "fingerprint": 0, "determinism": 0, "jsonl": 0, "ops": 0, "metrics": 0,
    "bridge": 1,  # projector modules on ops (a bridged LLaVA is an architecture the loader builds)
    "models": 2, "probes": 2,
    "pvm": 3, "diffusion": 3, "baselines": 3,
    "data": 4, "train": 4,
    "inference": 5,
    "integrations": 6,
    # the demo application on top of the library: the world decodes and scores through inference, like every user
    "world": 7,
    "experiments": 8, "bench": 8, "report": 8,
    "demo": 9, "profiles": 9,
    "commands": 10, "cli": 11, "launch": 12,  # the command line: the library's commands and the demo's
}
LIBRARY = {p for p, layer in LAYERS.items() if layer <= LAYERS["integrations"]}
APPLICATION = {"world", "experiments", "bench", "report", "demo", "profiles"}

# the only third-party modules a function may import (optional extras), each with a comment on that line
OPTIONAL = {"trl", "peft", "lmms_eval", "deepspeed", "torchvision"}


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, path.name == "__init__.py"


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _existing(target: str) -> str:
    """``target`` cut back to the longest name that is a keepsight module (a name imported from a module
    stands for that module); non-keepsight names come back as they are."""
    names = {name for name, _, _ in _modules()}
    if not target.startswith("keepsight"):
        return target.rsplit(".", 1)[0] if target.count(".") and target.rsplit(".", 1)[0] else target
    while target not in names and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def _imports():
    """(module, imported keepsight module, line, at top level?) for every keepsight import, and the
    function-level imports of anything else."""
    own, foreign = [], []
    for name, path, is_pkg in _modules():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        lines = path.read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node)
                # "from pkg import x" may import submodule x (or a name defined in pkg)
                targets = [_existing(f"{base}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [_existing(a.name) if a.name.startswith("keepsight") else a.name for a in node.names]
            else:
                continue
            for t in targets:
                entry = (name, t, node.lineno, id(node) in top, lines[node.lineno - 1])
                (own if t.split(".")[0] == "keepsight" else foreign).append(entry)
    return own, foreign


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "keepsight"


def test_every_package_has_a_layer():
    packages = {_package(name) for name, _, _ in _modules()}
    assert packages <= set(LAYERS), f"packages without a layer in this test: {sorted(packages - set(LAYERS))}"


def test_the_demo_application_sits_above_the_library():
    """No library package imports the world, the experiments, the benchmarks, the report or the demo: each of those
    is on a layer above every library one."""
    assert min(LAYERS[p] for p in APPLICATION) > max(LAYERS[p] for p in LIBRARY)
    assert not APPLICATION & LIBRARY
    own, _ = _imports()
    wrong = [f"{m}:{line} imports {t}" for m, t, line, *_ in own if _package(m) in LIBRARY and _package(t) in APPLICATION]
    assert not wrong, "the library imports the demo application:\n" + "\n".join(wrong)


def test_imports_go_one_way_and_sit_at_module_top():
    own, _ = _imports()
    wrong, inner = [], []
    for module, target, line, at_top, _ in own:
        src, dst = _package(module), _package(target)
        if LAYERS[dst] > LAYERS[src]:
            wrong.append(f"{module}:{line} imports {target} ({src} is layer {LAYERS[src]}, {dst} {LAYERS[dst]})")
        if not at_top and not module.endswith("__init__"):
            inner.append(f"{module}:{line} imports {target} inside a function")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)
    assert not inner, "keepsight imports must sit at module top:\n" + "\n".join(inner)


def test_function_level_imports_are_optional_dependencies_with_a_comment():
    _, foreign = _imports()
    bad = []
    for module, target, line, at_top, text in foreign:
        if at_top:
            continue
        if target.split(".")[0] not in OPTIONAL or "#" not in text:
            bad.append(f"{module}:{line}: {text.strip()}")
    assert not bad, "function-level imports (only optional dependencies, commented):\n" + "\n".join(bad)


def test_no_import_cycles():
    own, _ = _imports()
    names = {name for name, _, _ in _modules()}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for module, target, *_ in own:
        if target in names and target != module:
            graph[module].add(target)
    # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
    for name in names:
        graph[name] = {t for t in graph[name] if not (t.startswith(name + ".") and name in names)}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(n, stack):
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle.extend(stack[stack.index(m):] + [m] if m in stack else [n, m])
                return True
            if m not in state and visit(m, stack + [m]):
                return True
        state[n] = 2
        return False

    for n in sorted(graph):
        if n not in state and visit(n, [n]):
            break
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_readme_module_table_matches_the_packages():
    readme = (SRC.parents[1] / "README.md").read_text()
    listed = set(re.findall(r"^\| `keepsight\.([a-z_]+)`", readme, flags=re.M))
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert listed == packages, f"README lists {sorted(listed - packages)} that do not exist; misses {sorted(packages - listed)}"


def test_tests_mirror_the_packages():
    """``tests/<package>/`` for a package's tests; the tests of top-level modules (``keepsight.atomic``, ``.demo``,
    ...), the cross-cutting ones (README, layout, configs, properties) and shared helpers sit at the top."""
    tests = SRC.parents[1] / "tests"
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders - {"fixtures", "lmms"} <= packages, f"test folders without a package: {folders - packages}"
    top = {p.stem for p in tests.glob("test_*.py")}
    modules = {f"test_{p.stem}" for p in SRC.glob("*.py")}  # keepsight.atomic, keepsight.demo, ...
    assert top <= modules | {"test_readme", "test_layout", "test_configs", "test_properties"}, top
