"""The shape of the code, read from the source: imports run one way.

Apps (catalog, tenancy, fleet, mirror) import the kernel (llmgw/core/) and one another;
the root (the rest of llmgw: settings, urls, asgi, celery, the API, the CLI, the gateway;
and benchmarks/) imports apps; the kernel imports no app and nothing of the root; and no
module reaches itself again through its imports, counting imports made inside functions.
An app meets another only at its front doors (its selectors, services, models and pure
rules), at the top of a module. The pure rules and the agent import no Django, however
far down. docs/architecture.md draws it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("llmgw", "catalog", "tenancy", "fleet", "mirror", "benchmarks")
APPS = frozenset({"catalog", "tenancy", "fleet", "mirror"})
KERNEL = "llmgw.core"
# Where an app meets another (issue 38): the reads, the writes, the rows (for relations)
# and the pure rules. A package of one (fleet.selectors.*) counts whole.
DOORS = ("selectors", "services", "models", "domain")
PURE_RULES = ("tenancy.quota", "tenancy.scopes", "tenancy.bands")
# Doors of one module each, with why.
NAMED_DOORS = {
    "tenancy.auth": "who may call an API: every app's API names tenancy's tokens and sessions",
    "mirror.transfer": "the mirror's HTTP client, with no Django: the mirror's worker fetches"
    " from the hub with it, and agents (fleet.agent) from the mirror",
}
# The rules are pure (style.md) and the agent runs on nodes with no Django installed.
NO_DJANGO = (
    "catalog.domain",
    "fleet.domain",
    "mirror.domain",
    "tenancy.bands",
    "tenancy.budgets",
    "tenancy.quota",
    "tenancy.scopes",
    "fleet.agent",
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {
        _name(f): f
        for package in PACKAGES
        for f in (ROOT / package).rglob("*.py")
        if "migrations" not in f.parts
    }


def _known(name: str) -> str | None:
    """The project's module `name` is, or lies in; None when it is not the project's."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _import_nodes(tree: ast.AST, inside: bool = False):
    """Each import statement under `tree`, with whether it is made inside a function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, inside
        else:
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _import_nodes(node, inside or function)


@cache
def statements() -> dict[str, tuple[tuple[str, bool], ...]]:
    """Each module's imports, as (what it names, made inside a function)."""
    out = {}
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = []
        for node, inside in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from package import module` imports the module; else the names are in base.
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base
                    for a in node.names
                ]
            found += [(target, inside) for target in targets]
        out[name] = tuple(found)
    return out


@cache
def imports() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each module's imports: (the project's modules, the other top-level packages)."""
    out = {}
    for name, found in statements().items():
        ours, theirs = set(), set()
        for target, _ in found:
            known = _known(target)
            if known is None:
                theirs.add(target.partition(".")[0])
            elif known != name:
                ours.add(known)
        out[name] = (frozenset(ours), frozenset(theirs))
    return out


def _room(name: str) -> str:
    top = name.partition(".")[0]
    if top in APPS:
        return "app"
    if name == KERNEL or name.startswith(KERNEL + "."):
        return "kernel"
    # The package itself only says its version, which every room may read.
    return "package" if name == "llmgw" else "root"


def test_the_graph_is_read_from_the_source():
    graph = imports()
    assert {"fleet.reconciler.run", "llmgw.core.clock", "llmgw.gateway.app"} <= graph.keys()
    assert "fleet.selectors.snapshot" in graph["fleet.reconciler.run"][0]
    assert "django" in graph["fleet.reconciler.run"][1]


def test_no_app_imports_the_root():
    wrong = [
        f"{name} imports {target}"
        for name, (ours, _) in sorted(imports().items())
        if _room(name) == "app"
        for target in sorted(ours)
        if _room(target) == "root"
    ]
    assert not wrong, "apps import the kernel and one another, never the root:\n" + "\n".join(wrong)


def test_the_kernel_imports_no_app_and_nothing_of_the_root():
    wrong = [
        f"{name} imports {target}"
        for name, (ours, _) in sorted(imports().items())
        if _room(name) == "kernel"
        for target in sorted(ours)
        if _room(target) in ("app", "root")
    ]
    assert not wrong, "the kernel imports no app and nothing of the root:\n" + "\n".join(wrong)


def circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Every set of modules that reach one another through their imports (Tarjan's
    strongly connected components, of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_circles_are_found_where_there_are_some():
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_no_module_reaches_itself_through_its_imports():
    found = circles({name: ours for name, (ours, _) in imports().items()})
    assert not found, "modules that import one another:\n" + "\n".join(map(", ".join, found))


def test_the_pure_rules_and_the_agent_import_no_django_however_far_down():
    graph = imports()
    wrong = []
    for name in sorted(graph):
        if not name.startswith(NO_DJANGO):
            continue
        seen, todo = {name}, [name]
        while todo:
            here = todo.pop()
            ours, theirs = graph[here]
            if "django" in theirs:
                wrong.append(f"{name} reaches django through {here}")
                break
            todo += [m for m in ours if m not in seen]
            seen.update(ours)
    assert not wrong, "\n".join(wrong)


def cross_app_imports() -> list[tuple[str, str, bool]]:
    """Each import of one app's module by another app's: (importer, imported, inside a
    function)."""
    return sorted(
        {
            (name, known, inside)
            for name, found in statements().items()
            if _room(name) == "app"
            for target, inside in found
            if (known := _known(target)) is not None
            and _room(known) == "app"
            and known.partition(".")[0] != name.partition(".")[0]
        }
    )


def is_door(name: str) -> bool:
    app, _, rest = name.partition(".")
    return (
        rest.partition(".")[0] in DOORS
        or name in NAMED_DOORS
        or name.startswith(tuple(f"{r}." for r in PURE_RULES) + PURE_RULES)
    )


def test_doors_are_told_from_back_rooms():
    assert is_door("fleet.selectors.state") and is_door("catalog.selectors")
    assert is_door("fleet.domain.placement") and is_door("tenancy.quota")
    assert is_door("catalog.models") and is_door("tenancy.auth")
    assert not is_door("fleet.console.samples") and not is_door("mirror.builds")
    assert not is_door("fleet") and not is_door("catalog.admin")


def test_apps_meet_only_at_their_front_doors():
    wrong = [
        f"{name} imports {target}, which is not one of {target.partition('.')[0]}'s doors"
        for name, target, _ in cross_app_imports()
        if not is_door(target)
    ]
    assert not wrong, (
        f"an app imports another app's {', '.join(DOORS)} and {', '.join(PURE_RULES)}"
        f" ({', '.join(NAMED_DOORS)} named), nothing else:\n" + "\n".join(wrong)
    )


def test_no_app_imports_another_inside_a_function():
    wrong = [
        f"{name} imports {target} inside a function"
        for name, target, inside in cross_app_imports()
        if inside
    ]
    assert not wrong, (
        "an app imports another at the top of a module; one inside a function hides a circle"
        " to untangle:\n" + "\n".join(wrong)
    )
