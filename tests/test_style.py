"""Issue 13 item 8, kept: the runtime reads like its anchors. No chained conditional expressions,
no assignment of three or more unrelated values from one tuple, and a mean code line of at most
48 characters (bench/line_lengths.py measures it; bottle 41.5, mini-swe-agent 45.5). model.py is
the example the issue keeps as it is."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from line_lengths import RUNTIME, code_lines  # noqa: E402

KEPT_AS_IS = {"model.py"}


def compressions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        chained = isinstance(node, ast.IfExp) and (
            isinstance(node.body, ast.IfExp) or isinstance(node.orelse, ast.IfExp))
        if chained:
            found.append(f"{path.name}:{node.lineno}: a chained conditional expression")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and len(target.elts) >= 3:
                    found.append(f"{path.name}:{node.lineno}: {len(target.elts)} values in one assignment")
    return sorted(found)


def test_no_chained_conditionals_or_packed_assignments():
    found = []
    for name in RUNTIME:
        if name not in KEPT_AS_IS:
            found += compressions(ROOT / name)
    assert found == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("a = 1 if x else 2 if y else 3\nb, c, d = 1, [], None\ne, f = 1, 2\n")
    assert compressions(sample) == ["sample.py:1: a chained conditional expression",
                                    "sample.py:2: 3 values in one assignment"]


def test_the_mean_code_line_is_within_the_budget():
    lengths = []
    for name in RUNTIME:
        lengths += code_lines(ROOT / name)
    assert sum(lengths) / len(lengths) <= 48
