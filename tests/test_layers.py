"""The layers of the package hold (docs/architecture.md): the import-linter contracts of
``.importlinter``, and no import cycle between any two modules. Imports inside functions count:
a lazy import is still an import."""
from __future__ import annotations

import ast
import pathlib

import grimp
import pytest
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / ".importlinter")


def _kept(contract: str, capsys) -> tuple[bool, str]:
    configuration.configure()        # what the lint-imports command does first
    capsys.readouterr()
    kept = lint_imports(config_filename=CONFIG, limit_to_contracts=(contract,), cache_dir=None,
                        no_logo=True)
    return kept, capsys.readouterr().out


def test_no_module_imports_a_wing_or_layer_above_it(capsys):
    """errors < limits < _util < messages, exporter < schedule < stores < settings < the wings
    (beat | worker | operate) < the glue (command, testing, overview)."""
    kept, report = _kept("wings", capsys)
    assert kept, report


def test_beat_worker_and_operate_never_import_each_other(capsys):
    """A worker process loads no scheduler, beat loads no command line, and the operator's commands
    load neither: the wings are independent layers, chains through other modules included."""
    kept, report = _kept("wings", capsys)
    assert kept, report
    graph = grimp.build_graph("celery_anarchon")
    wings = ("beat", "worker", "operate")
    for wing in wings:
        for other in wings:
            if other != wing:
                chain = graph.find_shortest_chain(importer=f"celery_anarchon.{wing}",
                                                  imported=f"celery_anarchon.{other}",
                                                  as_packages=True)
                assert chain is None, f"{wing} reaches {other}: {chain}"


def test_the_schedule_wing_is_layered_and_pure(capsys):
    """plan, as_data < definition, task_options < timing < slots < zones; nothing in it reaches a
    store, a wing or the settings."""
    kept, report = _kept("schedule", capsys)
    assert kept, report
    graph = grimp.build_graph("celery_anarchon")
    for above in ("stores", "settings", "beat", "worker", "operate"):
        chain = graph.find_shortest_chain(importer="celery_anarchon.schedule",
                                          imported=f"celery_anarchon.{above}", as_packages=True)
        assert chain is None, f"schedule reaches {above}: {chain}"


def test_the_slots_are_one_module_per_kind_on_their_base(capsys):
    """cron_text < wall_clock | interval | solar_slots | custom < base."""
    kept, report = _kept("slots", capsys)
    assert kept, report


def test_the_beat_wing_is_layered_and_its_engine_free_of_celery(capsys):
    """scheduler < publisher | entries | metrics < engine: only the Scheduler holds the parts;
    no module of the engine imports Celery or kombu (its send is a callback)."""
    kept, report = _kept("beat", capsys)
    assert kept, report
    graph = grimp.build_graph("celery_anarchon", include_external_packages=True, cache_dir=None)
    engine = "celery_anarchon.beat.engine"
    for module in sorted({engine} | graph.find_children(engine)):
        celery = graph.find_modules_directly_imported_by(module) & {"celery", "kombu"}
        assert not celery, f"{module} imports {sorted(celery)}"


def test_the_operators_wing_is_layered(capsys):
    """cli < web < page < overview < checks, overview_entries < overdue < overview_instances <
    schedules < session, run_now < listing < config < names: the schedules API never imports a
    view of it."""
    kept, report = _kept("operate", capsys)
    assert kept, report


#: the longest module and the longest class, lines: past them a module wants splitting by
#: responsibility
MAX_MODULE_LINES, MAX_CLASS_LINES = 500, 250


def _sized_modules() -> list[pathlib.Path]:
    """Every module of the package: each wing, the stores and the plumbing at the top."""
    return sorted((ROOT / "celery_anarchon").rglob("*.py"))


@pytest.mark.parametrize("path", _sized_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_500_lines_and_no_class_over_250(path):
    """Every module of the package is at most 500 lines long, and every class in it at most 250
    (from its ``class`` line to its last line)."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name}: {lines} lines, more than {MAX_MODULE_LINES}"
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef)
            and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert not long, f"{path.name}: classes over {MAX_CLASS_LINES} lines: {long}"


def test_each_store_backend_stands_on_the_contract_never_on_another(capsys):
    kept, report = _kept("stores", capsys)
    assert kept, report


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    """No two modules of the package import each other, directly or through others (a package's
    ``__init__`` counts as a module)."""
    graph = grimp.build_graph("celery_anarchon", cache_dir=None)
    cycles = _cycles(graph)
    shown = []
    for component in cycles:
        first, *rest = component
        chains = [graph.find_shortest_chain(importer=first, imported=m) for m in rest[:1]]
        back = [graph.find_shortest_chain(importer=m, imported=first) for m in rest[:1]]
        shown.append(f"{component}: e.g. {' -> '.join(chains[0] or ())} and back "
                     f"{' -> '.join(back[0] or ())}")
    assert not cycles, "import cycles:\n" + "\n".join(shown)


@pytest.mark.parametrize("module", ["celery_anarchon._util", "celery_anarchon.limits",
                                    "celery_anarchon.errors"])
def test_the_leaf_helpers_import_nothing_of_ours_but_errors_and_the_limits(module):
    graph = grimp.build_graph("celery_anarchon", cache_dir=None)
    ours = {m for m in graph.find_modules_directly_imported_by(module)}
    below = {"celery_anarchon._util": {"celery_anarchon.errors", "celery_anarchon.limits"},
             "celery_anarchon.limits": {"celery_anarchon.errors"}}
    assert ours <= below.get(module, set()), ours
