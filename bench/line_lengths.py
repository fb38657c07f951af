"""Mean length of code lines (issue 13 item 8). Run: python3 bench/line_lengths.py [FILE ...]

A code line is one that is not blank, not only a comment and not inside a docstring; its length
counts the indentation. With no arguments: the runtime modules. The anchors: bottle 41.5,
mini-swe-agent 45.5. A figure to read, not a budget: issue 21 dropped the rule (it bought reflow).
"""
import io
import sys
import tokenize
from pathlib import Path

RUNTIME = ("events.py", "kernel.py", "context.py", "khaelor.py", "tools.py", "model.py",
           "permissions.py", "ui.py", "sandbox.py")


def code_lines(path):
    """Lines holding code: not blank, not only a comment, not inside a docstring."""
    src = Path(path).read_text()
    doc = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.STRING and tok.line.strip().startswith(('"""', "'''", 'r"""')):
            if tok.start[0] != tok.end[0] or tok.line.strip() == tok.string:
                doc.update(range(tok.start[0], tok.end[0] + 1))
    out = []
    for n, line in enumerate(src.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or n in doc:
            continue
        out.append(len(line.rstrip()))
    return out


def main() -> None:
    total = []
    root = Path(__file__).resolve().parent.parent
    for f in sys.argv[1:] or [str(root / name) for name in RUNTIME]:
        lens = code_lines(f)
        total += lens
        print(f"{Path(f).name:16} {len(lens):5} lines  mean {sum(lens)/len(lens):5.1f}")
    print(f"{'all':16} {len(total):5} lines  mean {sum(total)/len(total):5.1f}")


if __name__ == "__main__":
    main()
