"""The import rules of DESIGN §1, checked by parsing every module with ast."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = {"khaelor", "events", "model", "kernel", "tools", "permissions", "context", "ui", "sandbox"}
ALLOWED = {
    "events": set(),
    "permissions": {"sandbox"},
    "model": {"events"},
    "tools": {"events", "sandbox"},
    "sandbox": set(),
    "context": {"events", "model"},
    "kernel": {"events", "model", "tools", "permissions", "context"},
    "ui": {"events"},
    "khaelor": OURS - {"khaelor"},
}
WORLD_MODULES = {"subprocess", "shutil"}   # only tools.py runs programs or moves files around
MAY_TOUCH_WORLD = {"tools"}


def imported_names(module: str) -> list[tuple[str, bool]]:
    """(top-level module name, imported inside a function) for every import in the file."""
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    found = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0:
                found.append((child.module.split(".")[0], inner))
            visit(child, inner)

    visit(tree, False)
    return found


def test_each_module_imports_only_what_the_design_allows():
    for module, allowed in ALLOWED.items():
        ours = {name for name, _ in imported_names(module) if name in OURS}
        assert ours <= allowed, f"{module}.py imports {sorted(ours - allowed)}"


def test_only_khaelor_imports_ui():
    for module in OURS - {"khaelor", "ui"}:
        assert "ui" not in {name for name, _ in imported_names(module)}, module


def test_anthropic_is_imported_only_lazily_in_model():
    for module in OURS:
        for name, nested in imported_names(module):
            if name in ("anthropic", "httpx2", "httpx"):
                assert module == "model" and nested, f"{module}.py imports {name} at module level"


def test_only_tools_runs_subprocesses():
    for module in OURS - MAY_TOUCH_WORLD:
        names = {name for name, _ in imported_names(module)}
        assert not names & WORLD_MODULES, f"{module}.py imports {sorted(names & WORLD_MODULES)}"


def test_cold_import_does_not_load_the_sdk():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import khaelor"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.splitlines() if "|" in line}
    assert "khaelor" in loaded
    assert "anthropic" not in loaded and "kernel" not in loaded
    # `khaelor --version` imports only khaelor and events: asyncio alone takes tens of ms
    assert "asyncio" not in loaded



def test_a_full_collection_does_not_walk_the_sdk_once_it_is_loaded():
    """The SDK's objects, loaded once for the process's life, are frozen out of the collector's
    sight: a full collection walked all of them and held the event loop 65-110 ms in a session."""
    code = "import gc, model; model._sdk(); print(gc.get_freeze_count(), len(gc.get_objects()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    frozen, walked = map(int, out.split())
    assert frozen > 10 * walked, out


def test_permissions_and_kernel_name_no_tool():
    """Issue 21 item 5: a tool is added in tools.py alone. permissions.py judges subject kinds and
    kernel.py asks tools.py what a call is judged on (tools.permission_subject), so neither holds
    the name of a tool that is not also a kind, nor compares a call's name with any string.
    ("bash", "read" and "write" are tools and kinds too: a comparison with them must not read
    a `name`.)"""
    import tools
    kinds = {"bash", "read", "write", "feed", "held", "unknown"}
    for module in ("permissions", "kernel"):
        tree = ast.parse((ROOT / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value in kinds or node.value not in tools.TOOLS, (module, node.lineno)
            if isinstance(node, ast.Compare) and any(
                    isinstance(n, ast.Constant) and n.value in tools.TOOLS for n in ast.walk(node)):
                assert "name" not in ast.unparse(node), (module, ast.unparse(node))
