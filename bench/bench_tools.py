"""bench_tools.py: timings for tools.py against the budgets in DESIGN.md §11 and issue 3.

    python bench/bench_tools.py            # prints a table of medians

Measures: edit on a 10,000-line file where only fuzzy strategies match (budget < 100 ms), grep and
glob over a 5,000-file git tree with ripgrep and with the Python fallback, and Toolbox.run's own
overhead (input checking, dispatch, budgeting) with the tool's work subtracted (budget < 5 ms).
Also what opening without links costs (issue 19 item 4): a 4 KB read by plain open, by openat2
and by the O_NOFOLLOW walk, Workspace.read_file against Path.read_bytes, and the forked child that
gives the Python grep's regex its time budget, in this small process and with 200 MB touched.
"""

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tools  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def make_module(n_lines: int) -> str:
    """A Python-looking file of n_lines: many small methods, all alike (the hard case for anchors)."""
    lines, n = ["class Big:"], 0
    while len(lines) < n_lines:
        lines += [f"    def method_{n}(self, value):", f"        total = value + {n}",
                  f"        if total > {n * 2}:", "            return total", "        return None", ""]
        n += 1
    return "\n".join(lines[:n_lines]) + "\n"


EDIT_CASES = {
    # strategy: (old_string, new_string) against method_1000 (about line 6,000) in the 10,000-line file
    "line_trimmed": ("def method_1000(self, value):\n    total = value + 1000",
                     "def method_1000(self, value):\n    total = value + 1"),
    "block_anchor": ("def method_1000(self, value):\n    total = value + 1000\n    if total > 2001:\n"
                     "        return total\n    return None", "def method_1000(self, value):\n    return value"),
    "whitespace_normalized": ("total  =  value + 1000", "total = value + 1"),
}


async def bench_edit(root: Path, box: tools.Toolbox, runs: int) -> dict[str, float]:
    target = root / "big.py"
    original = make_module(10_000)
    results = {}
    for strategy, (old, new) in EDIT_CASES.items():
        samples = []
        for n in range(runs):
            target.write_text(original)
            read = await box.run("read", {"file_path": "big.py"}, f"r{n}")   # an edit needs a read
            tools.events.note_seen(box.state(), read.meta)   # as the log's fold would
            started = time.perf_counter()
            result = await box.run("edit", {"file_path": "big.py", "old_string": old, "new_string": new}, f"e{n}")
            samples.append(time.perf_counter() - started)
            assert result.meta.get("strategy") == strategy, (strategy, result.text[:300])
        results[f"edit 10K lines ({strategy})"] = median_ms(samples)
    return results


def make_tree(root: Path, n_files: int) -> None:
    for n in range(n_files):
        folder = root / f"pkg{n % 50}" / f"mod{n % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def f{n}_{k}(x):\n    return x + {k}\n" for k in range(20))
        if n % 100 == 0:
            body += "# NEEDLE: find me\n"
        (folder / f"file{n}.py").write_text(body)
    (root / ".gitignore").write_text("ignored/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)


async def bench_search(root: Path, box: tools.Toolbox, runs: int) -> dict[str, float]:
    results = {}
    engines = [("python", None)] + ([("ripgrep", shutil.which("rg"))] if shutil.which("rg") else [])
    for label, engine in engines:
        box.ripgrep = engine
        for name, tool_input in [("grep", {"pattern": "NEEDLE"}), ("grep", {"pattern": r"return x \+ 19"}),
                                 ("glob", {"pattern": "**/mod3/*.py"})]:
            samples = []
            for n in range(runs):
                started = time.perf_counter()
                result = await box.run(name, tool_input, f"s{n}")
                samples.append(time.perf_counter() - started)
                assert not result.is_error, result.text
            results[f"{name} {tool_input['pattern']!r} 5K files ({label})"] = median_ms(samples)
    return results


async def bench_dispatch(root: Path, box: tools.Toolbox, runs: int) -> dict[str, float]:
    (root / "small.txt").write_text("hello\n" * 20)
    tool_input = {"file_path": "small.txt", "limit": 10}
    through_run, direct, unknown = [], [], []
    for n in range(runs):
        started = time.perf_counter()
        await box.run("read", tool_input, f"d{n}")
        through_run.append(time.perf_counter() - started)
        started = time.perf_counter()
        await tools.TOOLS["read"](box, dict(tool_input), f"d{n}", tools.DEFAULT_CONFINE)
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        await box.run("no_such_tool", tool_input, f"u{n}")
        unknown.append(time.perf_counter() - started)
    return {"Toolbox.run overhead (read, tool work subtracted)": median_ms(through_run) - median_ms(direct),
            "Toolbox.run on an unknown tool (dispatch only)": median_ms(unknown)}


def bench_open(root: Path, box: tools.Toolbox, runs: int) -> dict[str, float]:
    small = root / "pkg" / "mod" / "small.txt"
    small.parent.mkdir(parents=True)
    small.write_bytes(b"x" * 4096)
    real = os.path.realpath(small)
    places = [str(box.workspace.cwd)]

    def read_with(opener) -> None:
        fd = opener(real, os.O_RDONLY)
        os.read(fd, 8192)
        os.close(fd)
    cases = {
        "read 4 KB: os.open": lambda: read_with(os.open),
        "read 4 KB: openat2 RESOLVE_NO_SYMLINKS": lambda: read_with(tools.sandbox.open_no_links),
        "read 4 KB: O_NOFOLLOW walk (no openat2)": lambda: read_with(tools.sandbox.walk_open),
        "read 4 KB: Path.read_bytes": small.read_bytes,
        "read 4 KB: Workspace.read_file (realpath, check, openat2)":
            lambda: box.workspace.read_file(small, places),
        "grep's forked child, empty work": lambda: tools._in_child(dict),
    }
    results = {}
    for name, case in cases.items():
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            case()
            samples.append(time.perf_counter() - started)
        results[name] = median_ms(samples)
    ballast = bytearray(200_000_000)
    for offset in range(0, len(ballast), 4096):
        ballast[offset] = 1
    samples = []
    for _ in range(runs // 10):
        started = time.perf_counter()
        tools._in_child(dict)
        samples.append(time.perf_counter() - started)
    results["grep's forked child, empty work, 200 MB touched"] = median_ms(samples)
    return results


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        project, tree = tmp_path / "project", tmp_path / "tree"
        project.mkdir()
        tree.mkdir()
        make_tree(tree, 5000)
        # no log: the bench folds what an edit needs (the read stamps) itself
        state = tools.events.State()
        box = tools.Toolbox(tools.Workspace(project), tmp_path / "home", lambda *a, **k: {},
                            lambda: state)
        tree_box = tools.Toolbox(tools.Workspace(tree), tmp_path / "home", lambda *a, **k: {},
                                 tools.events.State)
        rows = {}
        rows.update(await bench_edit(project, box, 15))
        rows.update(await bench_search(tree, tree_box, 5))
        rows.update(await bench_dispatch(project, box, 200))
        rows.update(bench_open(project, box, 500))
        await box.close()
        await tree_box.close()
    width = max(map(len, rows))
    print(f"{'benchmark':<{width}}  median ms")
    print(f"{'-' * width}  ---------")
    for name, value in rows.items():
        print(f"{name:<{width}}  {value:9.3f}")


if __name__ == "__main__":
    asyncio.run(main())
