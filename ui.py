"""ui.py: KHAELOR's hand-written ANSI terminal interface: inline, never full-screen.

Owns: drawing (finished lines printed once into the terminal's scrollback above a bounded live
region), streaming markdown with settled blocks, the fold from events to timeline lines, the
composer and its key decoder, the permission panel, the status line, raw mode and restoring it.
Must not: import anything of ours but `events` (the closed-response rule, USER_SHELL_ID), touch
the network, write any file but the composer history file it is given, or do anything at import
time.

Public API (only khaelor.py imports this module):

    code = await run_app(controller, *, stdin_fd=0, stdout=None, history_path=None,
                         replay=(), color=None, notices=(), welcome="")
        The interactive session. Raw mode + bracketed paste on `stdin_fd` (must be a terminal),
        frames written to `stdout` (a binary stream with a fileno; default sys.stdout.buffer).
        `replay`: earlier events of a resumed session; its last REPLAY_TURNS user turns are
        printed first as scrollback. `color`: None = auto (stdout is a TTY and NO_COLOR is
        unset). Calls controller.quit() once the user has left, then returns
        0 when the user quits (Ctrl-D, a second Ctrl-C, a command returning QUIT), 143 on
        SIGTERM, 129 on SIGHUP. Cancelling the task also ends it. The terminal is restored on
        every path; an exception in the UI or a task it runs ends it and is raised, once.
    render_transcript(log, width, color=False, max_turns=None) -> list[str]   as lines
    Controller, QUIT, TRANSCRIPT                                   see below

While a question is open, typing goes to the composer (Enter sends it as steering); the letters
it lists (y/a/n, y/e/n for a plan) answer only on an empty composer and never as capitals, Up/Down
+ Enter always. `busy` covers a running `!` command too (Esc stops it: interrupt()); its
UserShellRan settles its card. Ctrl-O opens or closes the newest card
while it is live; what has settled is read in the transcript view (Ctrl-R, or a command returning
TRANSCRIPT), on the alternate screen, so the scrollback is never written twice.
Controller methods may return an awaitable; the UI runs it as a task and shows its failure as an
error line. run_command may return a str (shown as markdown), QUIT (ends the app), TRANSCRIPT
or a question (a dict as PermissionRequested's): its panel opens; the choice goes to its `answer`,
whose result shows as the answer to the question's `command` (the line typed).
Tool metadata read from ToolCompleted/ToolFailed `meta`: lines (start, end: the part read),
matches, files, exit_code, duration_ms, timed_out, truncated; FileModified: ±lines, coloured diff.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import errno
import functools
import heapq
import inspect
import itertools
import json
import os
import re
import signal
import sys
import termios
import threading
import time
import tty
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Protocol

import events


# ════ The controller: what khaelor.py implements for the UI ════

class Controller(Protocol):
    # a turn is running: Enter queues steering, Esc interrupts
    busy: bool
    # slash commands offered for completion, e.g. ["/help", "/model"]
    command_names: list[str]
    # optional: "/model" -> "[id] show or change the model"
    command_descriptions: dict[str, str]
    # optional: "/effort" -> ["low", "medium", …]: typing "/effort " picks one from a menu
    command_choices: dict[str, list[str]]

    # every event; {"type": "Typed", "text": …} is handled as if typed and sent (`khaelor "/help"`)
    def subscribe(self, fn: Callable[[dict], None]) -> Callable[[], None]: ...
    # a user message (steering when busy)
    def submit(self, text: str) -> object: ...
    # "!cmd" typed in the composer
    def run_shell(self, command: str) -> object: ...
    # "/cmd args"; a str result is shown (its CommandAnswered is drawn only in a replay)
    def run_command(self, line: str) -> object: ...
    # Esc while busy
    def interrupt(self) -> object: ...
    def answer_permission(self, tool_use_id: str, choice: str,
                          feedback: str) -> object: ...
    # model, tokens, thinking_tokens, cost, context_pct, cache_share, reasoning, processes, branch,
    # mode
    def status(self) -> dict: ...
    # Shift-Tab: the next permission mode (default → acceptEdits → plan), from the next turn
    def cycle_mode(self) -> object: ...
    # a plan is ready: "acceptEdits" or "default" proceed in that mode; "deny" keeps planning
    def proceed_with_plan(self, choice: str) -> object: ...
    # paths for "@" completion, as last listed; a FilesListed event says a new list is ready
    def mention_candidates(self, prefix: str) -> list[str]: ...
    # the user is leaving
    def quit(self) -> object: ...


QUIT = type("Quit", (), {"__repr__": lambda self: "ui.QUIT"})()
TRANSCRIPT = type("Transcript", (), {"__repr__": lambda self: "ui.TRANSCRIPT"})()


# ════ Escape sequences: the one table (nothing else in this file spells "\x1b[") ════

ESC = "\x1b"
CSI = ESC + "["
CURSOR_UP = CSI + "{}A"
CURSOR_DOWN = CSI + "{}B"
CURSOR_FORWARD = CSI + "{}C"
CARRIAGE_RETURN = "\r"
# raw mode turns off output processing: a newline needs its CR
NEWLINE = "\r\n"
# The live region's rows and all below. Not a plain CSI J: at the screen's top-left corner tmux
# (scroll-on-clear) and others take that for a clear screen and keep a copy in the scrollback.
ERASE_DOWN = CSI + "2K" + ESC + "7" + CSI + "B" + CSI + "J" + ESC + "8"
CURSOR_HOME = CSI + "H"
ERASE_LINE_END = CSI + "K"
SHOW_CURSOR = CSI + "?25h"
HIDE_CURSOR = CSI + "?25l"
# the transcript view: the alternate screen, which leaves the scrollback untouched
ALT_SCREEN_ON = CSI + "?1049h" + HIDE_CURSOR
ALT_SCREEN_OFF = CSI + "?1049l" + SHOW_CURSOR
BRACKETED_PASTE_ON = CSI + "?2004h"
BRACKETED_PASTE_OFF = CSI + "?2004l"
# synchronized output: terminals that know it paint a frame whole
SYNC_BEGIN = CSI + "?2026h"
SYNC_END = CSI + "?2026l"
SGR = CSI + "{}m"
SGR_RESET = CSI + "0m"
PASTE_END = CSI + "201~"

# captures, so SGR_RE.split keeps them
SGR_RE = re.compile(r"(\x1b\[[0-9;]*m)")
# Terminal input, one key per match: a CSI sequence, an SS3 key (ESC O), Esc before Esc, Alt+char,
# a control character, a run of text. KEY_PARTIAL_RE: the buffer ends inside a sequence.
KEY_RE = re.compile(
    # ESC before a sequence is Alt (ESC ESC [ A: Alt+Up where the terminal sends Meta as ESC)
    r"\x1b(?P<meta>\x1b)?\[(?P<params>[0-?]*)[ -/]*(?P<final>[@-~])"
    r"|\x1bO(?P<ss3>[\s\S])"
    r"|(?P<esc>\x1b)(?=\x1b)"
    r"|\x1b(?P<alt>[\s\S])"
    r"|(?P<control>[\x00-\x1a\x1c-\x1f\x7f])"
    r"|(?P<text>[^\x00-\x1f\x7f]+)")
KEY_PARTIAL_RE = re.compile(r"\x1b(?:\x1b?\[[0-?]*[ -/]*|O)?\Z")
# Semantic style roles -> SGR parameters. Monochrome draws none of them, so every role that
# carries meaning also has a symbol (● ✗ ○ + − ⚠ ›) that survives without colour.
ROLE_SGR = {
    # plain attributes
    "bold": "1", "dim": "2", "italic": "3",
    "underline": "4", "strike": "9",
    # markdown
    "heading": "1;36", "code": "36", "link": "34;4",
    "bullet": "36", "quote": "2",
    # code
    "keyword": "35", "string": "32",
    "comment": "2;3", "number": "33",
    # diffs and outcomes
    "added": "32", "removed": "31", "hunk": "36",
    "ok": "32", "error": "31", "warning": "33",
    # the composer and menus
    "prompt": "1;35", "user": "1", "selected": "7",
}


# ════ Cell width and untrusted text ════

@functools.lru_cache(maxsize=8192)
def char_width(ch: str) -> int:
    """Terminal cells for one code point: 0 combining/format, 2 wide or fullwidth (CJK, emoji)."""
    if unicodedata.combining(ch):
        return 0
    if unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def cell_width(text: str) -> int:
    return len(text) if text.isascii() else sum(map(char_width, text))


def visible_width(line: str) -> int:
    """Cells of a styled line (SGR sequences take none)."""
    if ESC in line:
        line = SGR_RE.sub("", line)
    return cell_width(line)


def split_at_width(text: str, cells: int) -> tuple[str, str]:
    """The longest head of `text` fitting `cells` (may be empty: a wide char needs two)."""
    if text.isascii():
        cut = max(0, cells)
        return text[:cut], text[cut:]
    used = 0
    for i, ch in enumerate(text):
        used += char_width(ch)
        if used > cells:
            return text[:i], text[i:]
    return text, ""


def clip(line: str, width: int) -> str:
    """Cut a styled line to `width` cells, marking the cut with an ellipsis."""
    if visible_width(line) <= width:
        return line
    out = []
    # one cell for the ellipsis
    room = width - 1
    reset = SGR_RESET if ESC in line else ""
    for piece in SGR_RE.split(line):
        if not piece.startswith(ESC):
            piece, cut = split_at_width(piece, room)
            room -= cell_width(piece)
            if cut:
                return "".join(out) + piece + "…" + reset
        out.append(piece)
    return line


def fold(line: str, width: int) -> list[str]:
    """A styled line cut into rows of `width` cells, each row's style closed and reopened on the
    next (the transcript view draws whole rows; it cannot let the terminal wrap them)."""
    rows = []
    # the row so far, its cells, the style open at its end
    row, used = "", 0
    active = ""
    for piece in SGR_RE.split(line):
        if piece.startswith(ESC):
            row += piece
            active = "" if piece == SGR_RESET else piece
            continue
        while piece:
            head, piece = split_at_width(piece, width - used)
            # narrower than one wide char: overflow by one
            if not head and used == 0:
                head, piece = piece[:1], piece[1:]
            row += head
            used += cell_width(head)
            if piece:
                rows.append(row + SGR_RESET * bool(active))
                row, used = active, 0
    return rows + [row]


def more_lines(n: int, what: str = "line") -> str:
    """"… 1 more line", "… 12 more lines"."""
    return "… " + events.counted(n, f"more {what}")


def sanitize(text: str) -> str:
    """Model and tool text is untrusted: drop escape sequences and control characters, let a
    carriage return overwrite its line as a terminal would (progress bars), expand tabs."""
    return events.plain_text(text).expandtabs(4)


def shown(text: str) -> str:
    """A command or a path the user judges: every character shown, none interpreted."""
    return events.visible_controls(text).expandtabs(4)


# ════ Styles ════

@dataclass(frozen=True)
class Style:
    # False: NO_COLOR or not a TTY; no escape sequences in any text
    color: bool = True

    def paint(self, text: str, *roles: str) -> str:
        if not self.color or not roles or not text:
            return text
        params = ";".join(ROLE_SGR[role] for role in roles)
        return SGR.format(params) + text + SGR_RESET


def detect_color(stream, env=None) -> bool:
    env = os.environ if env is None else env
    try:
        return not env.get("NO_COLOR") and stream.isatty()
    except (AttributeError, ValueError):
        return False


# a run of text and the style roles it carries
Span = tuple[str, tuple[str, ...]]


def join_runs(runs: list[list], style: Style) -> str:
    return "".join([style.paint(text, *roles) for text, roles in runs])


def _add_run(runs: list[list], text: str, roles: tuple) -> None:
    if runs and runs[-1][1] == roles:
        runs[-1][0] += text
    else:
        runs.append([text, roles])


def wrap_spans(spans: Iterable[Span], width: int, style: Style,
               first: str = "", rest: str = "",
               hard: bool = False) -> list[str]:
    """Wrap styled spans to `width` cells behind the styled prefixes `first` (first line) and
    `rest`. Word wrap collapses whitespace to single spaces and breaks only a word longer than a
    line; `hard` keeps every space and breaks anywhere (code, diffs)."""
    rest_width = visible_width(rest)
    # the current line: where its text starts, the cells used, its runs (`rows`: every line's)
    start = visible_width(first)
    width = max(width, start + 1, rest_width + 1)
    used = start
    runs = []
    rows = [runs]
    space = False
    for text, roles in spans:
        space = not hard and (space or text[:1].isspace())
        words = [text] if hard else text.split()
        for word in words:
            w = cell_width(word)
            gap = 1 if space and used > start else 0
            too_long = used + gap + w > width
            if not hard and too_long and used > start:
                runs = []
                rows.append(runs)
                start = used = rest_width
                gap = 0
            if gap:
                # between two runs of one style the space shares it (an underline goes on)
                space_roles = runs[-1][1] if runs[-1][1] == roles else ()
                _add_run(runs, " ", space_roles)
            # a link longer than a whole line is not broken: the terminal wraps it, as it does a
            # long code line, so that clicking or copying it gives the whole link
            unbroken = not hard and used == start and "://" in word
            # longer than the room left: break it
            while word and not unbroken and used + gap + w > width:
                head, word = split_at_width(word, width - used - gap)
                # narrower than one wide char: overflow by one
                if not head and used == start:
                    head, word = word[:1], word[1:]
                if head:
                    _add_run(runs, head, roles)
                used += gap + cell_width(head)
                gap, w = 0, cell_width(word)
                if word:
                    runs = []
                    rows.append(runs)
                    start = used = rest_width
            if word:
                _add_run(runs, word, roles)
                used += gap + w
            space = not hard
        if not hard and text:
            space = text[-1:].isspace()
    return [first + join_runs(rows[0], style)] + [rest + join_runs(r, style) for r in rows[1:]]


# ════ Markdown: inline styles, blocks, code, tables, diffs ════

# any indent: fences in list items
FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+#.-]*)")
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HR_RE = re.compile(r"^ {0,3}([-*_])(?:\s*\1){2,}\s*$")
LIST_RE = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$")
QUOTE_RE = re.compile(r"^ {0,3}>\s?(.*)$")
TABLE_SEPARATOR_RE = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
INLINE_RE = re.compile(
    r"\\(?P<escaped>[!-/:-@\[-`{-~])"
    r"|(?P<ticks>`+)(?P<code>.+?)(?P=ticks)"
    r"|\*\*(?P<bold>\S(?:.*?\S)?)\*\*"
    r"|__(?P<bold2>\S(?:.*?\S)?)__"
    r"|~~(?P<strike>\S(?:.*?\S)?)~~"
    r"|(?<![\w*])\*(?P<italic>[^\s*](?:.*?[^\s*])?)\*(?![\w*])"
    r"|(?<!\w)_(?P<italic2>[^\s_](?:.*?[^\s_])?)_(?!\w)"
    r"|\[(?P<link>[^\]]+)\]\((?P<url>[^)\s]+)\)")
# \* is a literal star, not emphasis
ESCAPED_RE = re.compile(r"\\([!-/:-@\[-`{-~])")
# deeper quotes draw no more bars (1,000 levels must still render)
QUOTE_MAX_BARS = 6
# A table column's alignment, by the colons that start and end its separator cell (GitHub tables:
# `---:` right, `:---:` center, else left), as the share of a cell's spare room put before it.
ALIGN_SHARES = {(False, True): 1, (True, True): 0.5}

KEYWORDS = frozenset("""
    and as assert async await break case catch class const
    continue def default defer del do elif else enum except
    export extends false final finally fn for from func function
    go if impl import in interface is lambda let loop match mod
    mut new nil none not null or package pass pub raise return
    self static struct super switch this throw true try type
    typeof use var void while with yield True False None
    """.split())
# The regex of a language's line comments, by its fence tag (unknown: either # or //).
COMMENT_RES = {lang: comment for comment, langs in (
    ("#", """python py sh bash zsh shell console ruby rb yaml yml toml
             perl r make makefile dockerfile ini conf cfg elixir ex nim
             ps1 powershell"""),
    ("//", """c h cpp cc hpp cs java js jsx ts tsx javascript typescript
              go rust rs swift kotlin kt scala dart php json jsonc zig"""),
    (r"--\s", "sql lua haskell hs elm"),
) for lang in langs.split()}


@functools.cache
def code_token_re(comment: str) -> re.Pattern:
    """One token per match, its group named for its style role. Compiled on first use: the four
    patterns take 8 ms, which every start would pay before its first paint."""
    keywords = "|".join(sorted(KEYWORDS, key=len, reverse=True))
    return re.compile(
        rf"(?P<comment>(?:{comment}).*$)"
        r"|(?P<string>\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|`[^`]*`)"
        r"|(?P<number>\b\d[\w.]*)"
        rf"|\b(?P<keyword>{keywords})\b")


def regex_spans(pattern: re.Pattern, text: str, styled: Callable,
                roles: tuple = ()) -> list[Span]:
    """`text` cut at `pattern`'s matches: styled(match) gives a match's spans. Neighbours of one
    style are one span (an escaped `\\_` in a path): a wrap breaks between spans, never inside
    a word of one."""
    spans: list[Span] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            spans.append((text[pos:m.start()], roles))
        spans += styled(m)
        pos = m.end()
    if pos < len(text):
        spans.append((text[pos:], roles))
    merged: list[Span] = []
    for span in spans:
        if merged and merged[-1][1] == span[1]:
            merged[-1] = (merged[-1][0] + span[0], span[1])
        else:
            merged.append(span)
    return merged


def inline_spans(text: str, style: Style, roles: tuple = ()) -> list[Span]:
    """Bold, italic, strike, `code` and [links](url) as spans. Monochrome keeps the markdown as
    written: the markers are the meaning there."""
    has_markup = any(c in text for c in "*_`[~\\")
    if not style.color and has_markup:
        return regex_spans(INLINE_RE, text, lambda m: [(as_written(m), roles)], roles)
    if not style.color or not has_markup:
        return [(text, roles)]

    def styled(m: re.Match) -> list[Span]:
        if m["escaped"]:
            return [(m["escaped"], roles)]
        if code := m["code"]:
            # one space at each end is padding (CommonMark: `` `x` `` shows `x`)
            if code[:1] == code[-1:] == " " and len(code) > 2:
                code = code[1:-1]
            return [(code, roles + ("code",))]
        if link := m["link"]:
            url = m["url"]
            spans = inline_spans(link, style, roles + ("link",))
            # the address too, when it says more than the text (an anchor does not)
            if url != link and not url.startswith("#"):
                spans.append((f" ({url})", roles + ("dim",)))
            return spans
        emphasis = ("bold", "bold2", "strike", "italic", "italic2")
        name = next(k for k in emphasis if m[k])
        return inline_spans(m[name], style, roles + (name.rstrip("2"),))

    return regex_spans(INLINE_RE, text, styled, roles)


def as_written(m: re.Match) -> str:
    """Monochrome: markup as written, but an escape (`\\*`) is its character, outside a code span
    as anywhere else (a code span keeps its backslashes)."""
    if m["code"]:
        return m[0]
    return ESCAPED_RE.sub(r"\1", m[0])


def highlight_code(line: str, lang: str) -> list[Span]:
    """Light syntax colouring of one line: comments, strings, numbers, keywords."""
    lang = lang.lower()
    if lang in ("diff", "patch"):
        role = {"+": "added", "-": "removed", "@": "hunk"}.get(line[:1])
        return [(line, (role,) if role else ())]
    pattern = code_token_re(COMMENT_RES.get(lang, "#|//"))
    return regex_spans(pattern, line, lambda m: [(m[0], (m.lastgroup,))])


def render_code_line(line: str, lang: str, style: Style) -> str:
    """One line of a code block, never cut: the terminal wraps it, so copying it (or a URL in
    it) from the scrollback gives the line as written."""
    if not style.color:
        return line
    return join_runs(highlight_code(line, lang), style)


def render_fence_line(line: str, width: int, style: Style) -> list[str]:
    return [clip(style.paint(line.strip(), "dim"), width)]


def render_list_item(indent: str, marker: str, text: str, width: int,
                     style: Style) -> list[str]:
    level = min(len(indent.expandtabs(4)) // 2, 6)
    bullet = "•◦"[level % 2]
    if marker[0].isdigit():
        bullet = marker
    if box := {"[ ] ": "☐", "[x] ": "☑", "[X] ": "☑"}.get(text[:4]):
        bullet = box
        text = text[4:]
    first = "  " * level + style.paint(bullet, "bullet") + " "
    rest = " " * visible_width(first)
    return wrap_spans(inline_spans(text, style), width, style, first, rest)


def table_cells(row: str) -> list[str]:
    inner = row.strip().removeprefix("|").removesuffix("|")
    return [cell.strip() for cell in inner.split("|")]


def render_table(rows: list[str], width: int, style: Style, separator: str) -> list[str]:
    """The header row, then the body rows; `separator` (|---|--:|:-:|) aligns the columns."""
    grid = [table_cells(row) for row in rows]
    n_cols = max(len(r) for r in grid)
    grid = [r + [""] * (n_cols - len(r)) for r in grid]
    widths = [max(1, *(cell_width(r[c]) for r in grid)) for c in range(n_cols)]
    # the cells and a " │ " between columns
    total = sum(widths) + 3 * (n_cols - 1)
    # shrink the widest column until it fits
    while total > width and max(widths) > 3:
        widths[widths.index(max(widths))] -= 1
        total -= 1
    ends = [(cell.startswith(":"), cell.endswith(":")) for cell in table_cells(separator)]
    shares = [ALIGN_SHARES.get(colons, 0) for colons in ends] + [0] * (n_cols - len(ends))
    sep = style.paint(" │ ", "dim")
    out = []
    for r, row in enumerate(grid):
        roles = ("bold",) if r == 0 and style.color else ()
        cells = [wrap_spans(inline_spans(text, style, roles), w, style)
                 for text, w in zip(row, widths)]
        # a row is as tall as its tallest cell
        for parts in itertools.zip_longest(*cells, fillvalue=""):
            aligned = [_align(part, w, a) for part, w, a in zip(parts, widths, shares)]
            out.append(sep.join(aligned).rstrip())
        if r == 0:
            out.append(style.paint("─┼─".join("─" * w for w in widths), "dim"))
    return [clip(line, width) for line in out]


def _align(text: str, width: int, share: float) -> str:
    """`text` padded to `width` cells, `share` of the padding before it."""
    room = max(0, width - visible_width(text))
    before = int(room * share)
    return " " * before + text + " " * (room - before)


def render_quote(lines: list[str], width: int, style: Style) -> list[str]:
    """Quoted lines (each starts with `>`). Each line's depth is counted, and runs of one depth
    are rendered once behind that many bars: no recursion, so 1,000 levels render."""
    def unquoted(line: str) -> tuple[int, str]:
        depth = 0
        while m := QUOTE_RE.match(line):
            line, depth = m.group(1), depth + 1
        return depth, line

    out: list[str] = []
    for depth, run in itertools.groupby(map(unquoted, lines), key=lambda pair: pair[0]):
        bars = min(depth, QUOTE_MAX_BARS)
        bar = style.paint("│ " * bars, "quote")
        rows = render_block([line for _, line in run], max(width - 2 * bars, 8), style)
        out += [bar + row for row in rows]
    return [clip(row, width) for row in out]


def _starts_block(lines: list[str], i: int) -> bool:
    line = lines[i]
    if not line.strip():
        return True
    if any(pattern.match(line) for pattern in (HEADING_RE, HR_RE, FENCE_RE, QUOTE_RE, LIST_RE)):
        return True
    return _starts_table(lines, i)


def _starts_table(lines: list[str], i: int) -> bool:
    """A row with a pipe, and a separator row under it."""
    if "|" not in lines[i] or i + 1 >= len(lines):
        return False
    return bool(TABLE_SEPARATOR_RE.match(lines[i + 1]))


def render_block(lines: list[str], width: int, style: Style) -> list[str]:
    """Render markdown lines holding no open fence (a settled block or the live tail)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        # j: where the next block starts
        line, j = lines[i], i + 1
        if not line.strip():
            out.append("")
        elif m := HEADING_RE.match(line):
            out += render_heading(m[1], m[2], width, style)
        elif HR_RE.match(line):
            out.append(style.paint("─" * width, "dim"))
        elif FENCE_RE.match(line):
            out += render_fence_line(line, width, style)
        elif _starts_table(lines, i):
            j = i + 2
            while j < len(lines) and "|" in lines[j] and lines[j].strip():
                j += 1
            # the header row, the separator row, the body rows
            rows = [line] + lines[i + 2:j]
            out += render_table(rows, width, style, lines[i + 1])
        elif QUOTE_RE.match(line):
            while j < len(lines) and QUOTE_RE.match(lines[j]):
                j += 1
            out += render_quote(lines[i:j], width, style)
        else:
            # a list item or a paragraph, with its continuation lines
            while j < len(lines) and not _starts_block(lines, j):
                j += 1
            m = LIST_RE.match(line)
            first = m.group(3) if m else line.strip()
            rest = [row.strip() for row in lines[i + 1:j]]
            text = " ".join([first] + rest)
            if m:
                out += render_list_item(m.group(1), m.group(2), text, width, style)
            else:
                out += wrap_spans(inline_spans(text, style), width, style)
        i = j
    return out


def render_heading(hashes: str, text: str, width: int,
                   style: Style) -> list[str]:
    """`#` and `##` in the heading colour (`#` underlined), deeper ones bold;
    monochrome keeps the hashes."""
    if not style.color:
        return wrap_spans([(f"{hashes} {text}", ())], width, style)
    roles = {1: ("heading", "underline"), 2: ("heading",)}.get(len(hashes), ("bold",))
    return wrap_spans(inline_spans(text, style, roles), width, style)


# diff sign -> (the sign shown, its style)
DIFF_SIGNS = {"+": ("+", ("added",)), "-": ("−", ("removed",))}


def render_diff(diff: str, width: int, style: Style,
                max_lines: int = 80) -> list[str]:
    """A unified diff with line numbers: + added, − removed (signs carry it without colour)."""
    out: list[str] = []
    old = new = 0
    in_hunk = False
    rows = sanitize(diff).split("\n")
    for n, raw in enumerate(rows):
        if len(out) >= max_lines:
            out.append(style.paint("     " + more_lines(len(rows) - n, "diff line"), "dim"))
            break
        if m := re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", raw):
            old, new = map(int, m.groups())
            in_hunk = True
            out.append(style.paint(clip(raw, width), "hunk"))
            continue
        if not in_hunk or not raw:
            continue
        sign, body = raw[0], raw[1:]
        # "\ No newline at end of file"
        if sign == "\\":
            out.append(style.paint(clip(raw, width), "dim"))
            continue
        number = old if sign == "-" else new
        # a removed line counts in the old file, an added one in the new,
        # a context line in both
        if sign != "+":
            old += 1
        if sign != "-":
            new += 1
        mark, roles = DIFF_SIGNS.get(sign, (" ", ()))
        gutter = f"{number:>4} {mark} "
        out += wrap_spans([(gutter, roles), (body, roles)], width, style,
                          rest=" " * 7, hard=True)
    return out


# ════ Markdown stream: settled blocks and a live tail ════

# source lines in the live block before it settles anyway
MAX_BLOCK_LINES = 40
# characters likewise: bounds the per-frame re-render of the tail
MAX_BLOCK_CHARS = 3000
# a line longer than this (no newline yet) is cut at a space
MAX_LINE_CHARS = 2000
# a table needs its rows together (column widths): it may grow more
TABLE_CAP_FACTOR = 3


class MarkdownStream:
    """Assistant text arriving in deltas. Complete source lines are classified once; a block
    settles (closed fence, blank line, heading, rule, the caps above) and is rendered exactly once
    at the width of that moment. Lines inside a fence settle one by one, so a 5,000-line code
    block costs the same per frame as a 5-line one. Only the unsettled tail is re-rendered.
    Every decision depends on the text alone, never on how it was chunked."""

    def __init__(self, style: Style, width: int):
        self.style, self.width = style, width
        # characters fed so far (also the live-render cache key)
        self.n_fed = 0
        self._settled: list[str] = []
        # complete source lines of the unsettled block
        self._block: list[str] = []
        # the incomplete last line
        self._partial = ""
        # closing marker of the open fence, "" outside one
        self._fence = ""
        self._lang = ""
        self._emitted = False
        self._blank_pending = False
        self._live_cache: tuple = (None, [])

    def feed(self, text: str) -> None:
        self.n_fed += len(text)
        *complete, partial = (self._partial + text).split("\n")
        for line in complete:
            self._take_line(self._cut_long(line))
        self._partial = self._cut_long(partial)

    def finish(self) -> None:
        if self._partial:
            self._take_line(self._partial)
        self._settle_block()
        self._partial = ""
        self._fence = ""
        self._live_cache = (None, [])

    def take_settled(self) -> list[str]:
        lines, self._settled = self._settled, []
        return lines

    def live_lines(self) -> list[str]:
        key = (self.n_fed, self.width)
        if self._live_cache[0] != key:
            self._live_cache = (key, self._render_live())
        return self._live_cache[1]

    def _render_live(self) -> list[str]:
        partial = sanitize(self._partial)
        if not self._fence:
            block = self._block + ([partial] if partial.strip() else [])
            # the blank line it will settle behind, shown now: no jump when it settles
            gap = [""] * (self._blank_pending and bool(block))
            return gap + render_block(block, self.width, self.style)
        if partial:
            return [render_code_line(partial, self._lang, self.style)]
        return []

    def _cut_long(self, line: str) -> str:
        """Take an over-long line in pieces cut at a space (a soft line break in markdown, so
        nothing changes meaning); returns the rest."""
        while len(line) > MAX_LINE_CHARS:
            cut = line.rfind(" ", 0, MAX_LINE_CHARS)
            if cut > 0:
                head, line = line[:cut], line[cut + 1:]
            else:
                head, line = line[:MAX_LINE_CHARS], line[MAX_LINE_CHARS:]
            self._take_line(head)
        return line

    def _take_line(self, line: str) -> None:
        line = sanitize(line)
        if self._fence:
            if self._closes_fence(line):
                self._emit(render_fence_line(line, self.width, self.style))
                self._fence = ""
            else:
                self._emit([render_code_line(line, self._lang, self.style)])
        elif not line.strip():
            self._settle_block()
            self._blank_pending = self._emitted
        elif m := FENCE_RE.match(line):
            self._settle_block()
            self._fence, self._lang = m.group(1), m.group(2)
            self._emit(render_fence_line(line, self.width, self.style))
        elif HEADING_RE.match(line) or HR_RE.match(line):
            self._settle_block()
            self._emit(render_block([line], self.width, self.style))
        else:
            self._block.append(line)
            factor = TABLE_CAP_FACTOR if _starts_table(self._block, 0) else 1
            too_many = len(self._block) >= MAX_BLOCK_LINES * factor
            too_long = sum(map(len, self._block)) >= MAX_BLOCK_CHARS * factor
            if too_many or too_long:
                self._settle_block()

    def _closes_fence(self, line: str) -> bool:
        """The open fence's marker (or a longer run of it), alone on the line."""
        marker = line.strip()
        return (marker.startswith(self._fence)
                and not marker.strip(self._fence[0]))

    def _settle_block(self) -> None:
        if self._block:
            self._emit(render_block(self._block, self.width, self.style))
            self._block = []

    def _emit(self, lines: list[str]) -> None:
        # blank lines are written only between blocks, never trailing
        if self._blank_pending:
            self._settled.append("")
            self._blank_pending = False
        self._settled.extend(lines)
        self._emitted = True


# ════ Timeline: events folded into settled lines and live state ════

THINKING_TAIL_CHARS = 400
# thinking opened with Ctrl-O while it streams shows its newest rows, at most this many
THINKING_OPEN_ROWS = 12
PREVIEW_LINES = 3
# a finished card shows its output's first and last lines
PREVIEW_HEAD, PREVIEW_TAIL = 2, 3
# Ctrl-O shows up to this many lines of the last card
EXPANDED_MAX_LINES = 400
# bash's own footer
EXIT_CODE_LINE_RE = re.compile(r"Exit code: -?\d+(?: \(killed by \w+\))?")
USER_MESSAGE_MAX_LINES = 30
# An attachment's path, as kernel.attachments wraps it.
ATTACHED_RE = re.compile(r'\A<attached-file path="([^"\n]*)">')
# Events shown as one dim line; fields are filled from the event ("?" when missing).
NOTE_FORMATS = {
    "ContextPruned": "◇ Context: old tool results pruned ({n_pruned}; /context says why)",
    "ContextCompacted": "◇ Context compacted: earlier turns are now a summary",
    "VerificationRequested": "◇ Checking the work before answering",
    "ProcessExited": "◆ process {process_id}: {ended}",
    "SessionRenamed": "◇ Session: {title}",
    "ModelChanged": "◇ Model: {model}",
    "Rewound": "◇ Rewound the work tree to before step {step}",
    "ThinkingChanged": "◇ {chosen} from the next message",
}
# Events that only change what the spinner says (None: leaves it) and clear the Status text.
PHASES = {
    "ModelStarted": "waiting for the model",
    "ToolInputDelta": "preparing a tool call",
    "TextDelta": "writing",
    "ThinkingDelta": "thinking",
    "ToolStarted": None,
    **dict.fromkeys(["ToolRequested", "ModelResponseCompleted", *events.TURN_END_EVENTS], ""),
}
# Deltas whose characters count toward "↓ ~N tokens" in the status line (text field of each).
STREAMED_FIELDS = {
    "TextDelta": "text",
    "ThinkingDelta": "text",
    "ToolInputDelta": "partial_json",
}
RESPONSE_ENDS = events.TURN_END_EVENTS | {"ModelResponseCompleted", "ModelRequestFailed"}
# Events that first settle whatever is still streaming (text, thinking).
FLUSHING = frozenset({"UserMessageCreated", "ToolRequested", "PermissionRequested",
                      "ModelResponseCompleted", *events.TURN_END_EVENTS})
ERROR_WORDS = {
    "retryable": "The API is unavailable right now",
    "context_overflow": "The conversation no longer fits in the model's context",
    "auth": "The API did not accept the credentials",
    "invalid_request": "The API rejected the request",
}


def one_line(text: str) -> str:
    """A card's summary as one line: `src/app.py`, `pytest -q`, `start npm run dev`."""
    lines = shown(text).strip().split("\n")
    return lines[0] + " …" if len(lines) > 1 else lines[0]


# a finished call's flags, in the card line's words
META_FLAGS = (("timed_out", "timed out"), ("truncated", "truncated"))


def meta_facts(meta: dict) -> list[str]:
    facts = []
    if meta.get("start", 1) != 1 or meta.get("end", meta.get("lines")) != meta.get("lines"):
        # a read of part of a file: which part ("1–897 of 200000 lines"), not the file's length
        meta = dict(meta, lines=f"{meta.get('start')}–{meta.get('end')} of {meta.get('lines')}")
    for key, one in (("lines", "line"), ("matches", "match"), ("files", "file")):
        if isinstance(meta.get(key), (int, str)):
            facts.append(f"{meta[key]} {one if meta[key] == 1 else key}")
    if meta.get("exit_code") is not None:
        facts.append(f"exit {meta['exit_code']}")
    if isinstance(meta.get("duration_ms"), (int, float)):
        facts.append(events.duration(meta["duration_ms"] / 1000))
    facts += [words for key, words in META_FLAGS if meta.get(key)]
    return facts


def change_counts(change: dict) -> str:
    return f"+{change.get('added', 0)} −{change.get('removed', 0)}"


def rule_text(suggestion: dict) -> str:
    """An "always" rule in plain words: `python3 -m pytest …`, editing `src/**`."""
    capability = suggestion.get("capability", "?")
    pattern = events.visible_controls(str(suggestion.get("pattern", "*")), one_line=True)
    if pattern.endswith(" *"):
        # "and whatever follows", as a reader would write it
        pattern = pattern[:-1] + "…"
    return RULE_WORDS.get(capability, "") + f"`{pattern}`"


@dataclass
class ToolCard:
    name: str
    summary: str
    # what the permission panel previews
    tool_input: dict = field(default_factory=dict)
    # time.monotonic() at ToolStarted (live elapsed)
    started: float | None = None
    # the event's ts in unix ms (durations on replay)
    started_ts: int | None = None
    output_tail: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=PREVIEW_LINES))
    # FileModified events of this call
    changes: list[dict] = field(default_factory=list)
    # of a finished card's output: "none", "head" or "tail" (tools.TOOL_VIEWS)
    output: str = "tail"


class FinishedCard(NamedTuple):
    """A finished call as drawn: the card line and diffs, then its output (collapsed unless
    expanded with Ctrl-O)."""
    head: list[str]
    # sanitized non-blank output lines (bash's exit-code footer removed): all of them, so the
    # collapsed card's tail is the output's (a tool's output is bounded: tools.OUTPUT_BUDGET_CHARS)
    output: list[str]
    # grep, glob: the first lines say most, the rest is "… N more lines"
    head_only: bool


def card_output(event: dict, meta: dict) -> list[str]:
    # (what the model was told: hidden text removed, and a note saying so)
    output = sanitize(events.without_hidden_text(str(event.get("output") or "")))
    lines = [line for line in output.split("\n") if line.strip()]
    if meta.get("process_id"):
        # what the process tool tells the model ("Poll it with process action …") is not output
        told = f"Started {meta['process_id']}."
        lines = [line for line in lines if not line.startswith(told)]
    # the card line says `exit N` already: drop the footer, one of the last three lines
    if meta.get("exit_code") is not None:
        for k in reversed(range(max(len(lines) - 3, 0), len(lines))):
            if EXIT_CODE_LINE_RE.fullmatch(lines[k].strip()):
                del lines[k]
                break
    return lines


def note_text(event: dict) -> str:
    """The one line an event of NOTE_FORMATS is shown as (/export writes it too)."""
    chosen = [f"{key} {event[key]}" for key in ("thinking", "effort") if event.get(key)]
    fields = collections.defaultdict(lambda: "?", event,
                                     n_pruned=len(event.get("tool_use_ids") or []),
                                     ended=events.process_end(event), chosen=", ".join(chosen))
    return NOTE_FORMATS[str(event["type"])].format_map(fields)


class Timeline:
    """The conversation as the user sees it. `apply` folds one event; finished lines queue in
    `take_settled()` (printed once into scrollback); `live_lines()` is what is still moving."""

    def __init__(self, style: Style, width: int = 80):
        self.style, self.width = style, width
        # by tool_use_id, until the call ends
        self.cards: dict[str, ToolCard] = {}
        # PermissionRequested events awaiting the user
        self.permissions: list[dict] = []
        # the latest Status event ("retrying in 4s")
        self.status_text = ""
        # what the model is doing, for the spinner
        self.phase = ""
        self._settled: list[str] = []
        # the model failure last shown, which the TaskFailed that follows repeats
        self._failure_shown = ""
        self._text: MarkdownStream | None = None
        # _text has settled lines already
        self._text_started = False
        # the thinking block streaming: its text so far (None: none streams)
        self._thinking: str | None = None
        # when it began (time.monotonic()), and whether Ctrl-O opened it
        self._thinking_since = 0.0
        self._thinking_open = False
        # PermissionRequested until Granted or Denied
        self._requests: dict[str, dict] = {}
        # the closed-response rule, from events.py
        self._attempt = events.Attempt()
        self._any = False
        # the newest card, live until something follows; Ctrl-O toggles it expanded
        self._held: FinishedCard | None = None
        self._held_expanded = False
        # every card and thinking settles expanded (the transcript view)
        self.expanded = False
        # steering notes waiting for the stream's block to end
        self._queued: list[list[str]] = []
        # TextCheckpoint text of the block in _text
        self._checkpointed = ""
        # SteeringQueued texts not injected yet
        self._steering: list[str] = []
        # monotonic time of the running model call
        self._model_started: float | None = None
        # characters it has streamed (the token estimate)
        self._n_streamed = 0
        # the model wrote text since the user's message (what an interruption keeps)
        self._wrote = False
        # the command line last shown above its own ◇ line (`typed`): live, its answer then
        # follows without it (App._show_result reads and clears it)
        self.last_echo: str | None = None

    # -- folding --

    def apply(self, event: dict) -> None:
        kind = str(event.get("type"))
        if kind in PHASES:
            self.status_text = ""
            if PHASES[kind] is not None:
                self.phase = PHASES[kind]
        if kind in STREAMED_FIELDS:
            streamed = event.get(STREAMED_FIELDS[kind]) or ""
            self._n_streamed += len(streamed)
        elif kind == "ModelStarted":
            self._model_started = time.monotonic()
            self._n_streamed = 0
        elif kind in RESPONSE_ENDS and event.get("retrying"):
            # the same call streams again from the start
            self._n_streamed = 0
        elif kind in RESPONSE_ENDS:
            self._model_started = None
        if kind in ("Interrupted", "ModelRequestFailed") and "thinking" in event:
            # the thinking cut off, as the log keeps it: live and replayed alike
            self._thinking = None
            self._finish_thinking(event["thinking"], event.get("thinking_ms"))
        if kind in FLUSHING:
            self.flush_live()
        if kind in NOTE_FORMATS:
            note = self._dim_lines(note_text(event))
            # a process lost with khaelor: what it had printed, under its line as under a card
            shown = self._card_block(FinishedCard(note, card_output(event, {}), False))
            # after the block that streams (a choice made mid-reply: `/model`)
            self._after_block(self._typed(event) + shown)
        if kind in events.DURABLE:
            # a response retried or interrupted mid-stream: its calls will never run
            outcome, blocks = self._attempt.feed(event)
            if outcome == events.DROPPED:
                for block in blocks:
                    self.cards.pop(block.get("tool_use_id"), None)
        handler = getattr(self, "_on_" + kind, None)
        if handler is not None:
            handler(event)

    def take_settled(self) -> list[str]:
        lines, self._settled = self._settled, []
        return lines

    def note(self, markdown: str) -> None:
        """Text from the controller (a notice, the keys), settled as markdown."""
        self._after_block(self._markdown_lines(markdown))

    def _markdown_lines(self, markdown: str) -> list[str]:
        stream = MarkdownStream(self.style, self.width)
        stream.feed(markdown)
        stream.finish()
        return stream.take_settled()

    def error(self, text: str) -> None:
        self._after_block(self._marked("✗", "error", text))

    def _after_block(self, lines: list[str]) -> None:
        """Lines that must not land inside a text block still streaming: they settle after it.
        Thinking is one line of its own, never in the log before it ends: they settle above it,
        as a replay has them."""
        self._queued.append(lines)
        if self._text is None:
            self._settle_queued()

    def flush_live(self) -> None:
        """Settle whatever is still streaming (on exit or interruption). What streamed of a
        thinking block stays on screen as its line, never sent (an Esc's Interrupted keeps it for
        a replay; a kill -9 does not)."""
        self._finish_text()
        self._finish_thinking(None)
        self._settle_queued()

    def finish(self) -> None:
        """Settle everything, the newest card included (leaving, end of a replay)."""
        self.flush_live()
        self._release_card()

    def expand_last_card(self) -> None:
        """Ctrl-O: thinking that streams, or else the newest card while it is still live, opens or
        closes in place (a card settles as it is shown, thinking settles collapsed). Scrollback
        cannot be redrawn: what has settled is read whole in the transcript view (Ctrl-R)."""
        if self._thinking is not None:
            self._thinking_open = not self._thinking_open
        elif self._held is not None:
            self._held_expanded = not self._held_expanded

    def _hold(self, head: list[str], output: list[str], head_only: bool = False) -> None:
        """A finished card stays live (Ctrl-O can open it) until something follows."""
        self._release_card()
        self._held = FinishedCard(head, output, head_only)

    def _release_card(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            expanded = self._held_expanded or self.expanded
            self._held_expanded = False
            self._settle(self._card_block(held, expanded))

    def _settle(self, lines: list[str], gap: bool = True) -> None:
        # the held card comes first: it happened first
        self._release_card()
        if gap and self._any:
            self._settled.append("")
        self._settled.extend(lines)
        self._any = True

    def _dim_lines(self, text: str) -> list[str]:
        """A note, wrapped (never cut: at width 40 its end is its news); a newline in it (a title,
        a command) is shown escaped, as \\n."""
        text = sanitize(text).replace("\n", "\\n")
        return wrap_spans([(text, ("dim",))], self.width, self.style, "", "  ")

    def _dim(self, text: str, *roles: str) -> str:
        return self.style.paint(clip(text, self.width), "dim", *roles)

    def _marked(self, symbol: str, role: str, text: str) -> list[str]:
        """`✗ text` in `role`, wrapped under its symbol."""
        spans = [(sanitize(text), (role,))]
        first = self.style.paint(symbol + " ", role)
        return wrap_spans(spans, self.width, self.style, first, "  ")

    # -- conversation --

    def _written(self, text: str, role: str, head: str = "") -> list[str]:
        """What the user wrote, under a `›`: line by line, each indented as written (pasted
        code), in USER_MESSAGE_MAX_LINES rows at most (a one-line log is cut, marked `…`), then
        how many lines are left out. A final newline ends the last line, it starts none (as the
        composer counts a paste)."""
        rows = sanitize(text).rstrip("\n").split("\n")
        # the first line follows the `›` and the head
        rows[0] = head + rows[0].lstrip(" ")
        lines = []
        shown = 0
        while shown < len(rows) and len(lines) < USER_MESSAGE_MAX_LINES:
            body = rows[shown].lstrip(" ")
            indent = " " * min(len(rows[shown]) - len(body), self.width // 2)
            first = self.style.paint("› ", "prompt") if not shown else "  "
            lines += wrap_spans([(body, (role,))], self.width, self.style, first + indent,
                                "  " + indent)
            shown += 1
        if len(lines) > USER_MESSAGE_MAX_LINES:
            last = clip(lines[USER_MESSAGE_MAX_LINES - 1] + "…", self.width)
            lines = lines[:USER_MESSAGE_MAX_LINES - 1] + [last]
        if shown < len(rows):
            lines.append(self.style.paint("  " + more_lines(len(rows) - shown), "dim"))
        return lines

    def _on_UserMessageCreated(self, e: dict) -> None:
        # a message queued as the last turn ended is this one (Kernel.send_queued)
        self._on_SteeringInjected(e)
        self._wrote = False
        # a command file's line as typed, not its template
        lines = self._written(e.get("typed") or e.get("text", ""), "user")
        # the @mentions sent with it (kernel.attachments)
        found = [ATTACHED_RE.match(str(attached)) for attached in e.get("attachments") or []]
        names = [m[1] for m in found if m]
        if names:
            lines.append(self._dim("  ⎿ attached " + sanitize(", ".join(names))))
        for mention, why in e.get("skipped") or []:
            lines.append(self._dim(f"  ⎿ not attached {sanitize(f'@{mention}: {why}')}"))
        self._settle(lines)

    def _on_SteeringQueued(self, e: dict) -> None:
        """Shown after the block being streamed, never inside it (a code block, a paragraph)."""
        self._steering.append(e.get("text"))
        shown = e.get("typed") or e.get("text", "")
        self._after_block(self._written(shown, "dim", "Queued instruction: "))

    def _settle_queued(self) -> None:
        queued, self._queued = self._queued, []
        for lines in queued:
            self._settle(lines)

    def _on_TextDelta(self, e: dict) -> None:
        self._finish_thinking(None)
        self._stream().feed(e.get("text", ""))
        self._drain_text()

    def _on_ModelTextBlockCompleted(self, e: dict) -> None:
        stream = self._stream()
        # what the deltas did not bring
        stream.feed(e.get("text", "")[stream.n_fed:])
        self._finish_text()
        self._settle_queued()

    def _stream(self) -> MarkdownStream:
        self._wrote = True
        if self._text is None:
            self._text = MarkdownStream(self.style, self.width)
            self._text_started = False
            self._checkpointed = ""
        self._text.width = self.width
        return self._text

    def _finish_text(self) -> None:
        if self._text is not None:
            self._text.finish()
            self._drain_text()
            self._text = None

    def _drain_text(self) -> None:
        if lines := self._text.take_settled():
            self._settle(lines, gap=not self._text_started)
            self._text_started = True

    def _on_ThinkingDelta(self, e: dict) -> None:
        if self._thinking is None:
            self._thinking, self._thinking_open = "", False
            self._thinking_since = time.monotonic()
        self._thinking += e.get("text", "")

    def _on_ModelThinkingBlockCompleted(self, e: dict) -> None:
        self._finish_thinking(e.get("thinking") or "", e.get("duration_ms"), "redacted" in e)
        if self._text is None:
            self._settle_queued()

    def _finish_thinking(self, full: str | None, duration_ms: int | None = None,
                         redacted: bool = False) -> None:
        """Thinking settles collapsed, as one dim line: how long it took and its opening words
        (`full`: the whole block; None: what streamed of it). Ctrl-R shows it whole."""
        text = self._thinking if full is None else full
        if text is None:
            return
        if duration_ms is None and self._thinking is not None:
            duration_ms = (time.monotonic() - self._thinking_since) * 1000
        head = "✻ Thinking"
        if duration_ms is not None:
            head += f" · {max(1, round(duration_ms / 1000))}s"
        words = " ".join(sanitize(text).split())
        if words:
            head += " · " + words
        if redacted:
            head += " · (redacted)"
        rows = self._thought_rows(text) if self.expanded else []
        self._settle([self._dim(head, "italic")] + rows)
        self._thinking = None

    def _thought_rows(self, text: str) -> list[str]:
        """Thinking text wrapped under its line, dim."""
        paragraphs = [[(line, ("dim", "italic"))] for line in sanitize(text).split("\n")]
        return [row for spans in paragraphs
                for row in wrap_spans(spans, self.width, self.style, "  ", "  ")]

    def _live_thinking(self, now: float) -> list[str]:
        """`✻ Thinking · 4s` and its newest words; opened (Ctrl-O), its newest rows below."""
        head = f"✻ Thinking · {int(now - self._thinking_since)}s"
        if self._thinking_open:
            rows = self._thought_rows(self._thinking)[-THINKING_OPEN_ROWS:]
            hint = self.style.paint(" · ctrl+o closes", "dim")
            return [self._dim(head, "italic") + hint] + rows
        words = " ".join(sanitize(self._thinking[-THINKING_TAIL_CHARS:]).split())
        # nothing to open while the API sends none of the text (display omitted)
        hint = " · ctrl+o opens" if words else ""
        # what the words leave: " · …" before them, a spare cell after
        room = self.width - cell_width(head + hint) - 5
        if words and room > 8:
            head += " · …" + words[-room:]
        return [self._dim(head + hint, "italic")]

    def _typed(self, e: dict) -> list[str]:
        """The command line typed (`› /rename x`) that this event confirms, to go above its ◇
        line, as above a command's answer; none when the event has none (a flag chose it, a log
        from before `typed`)."""
        if not e.get("typed"):
            return []
        self.last_echo = str(e["typed"])
        return self._written(self.last_echo, "user")

    def _on_ModelRequestFailed(self, e: dict) -> None:
        message = sanitize(str(e.get("message") or "")).strip()
        text = ERROR_WORDS.get(e.get("kind"), "The model request failed")
        # 200: the stream broke after the API said OK, so the code tells nothing; the message
        # may name it already ("API error 400 (invalid_request_error): …")
        status = e.get("status") or 0
        if status >= 400 and not message.startswith(f"API error {status}"):
            text += f" ({status})"
        if message:
            text += f": {message}"
        if e.get("retrying"):
            self._drop_failed_attempt()
            self._settle(self._marked("!", "warning", text + " · retrying"))
        else:
            self.flush_live()
            self.error(text)
            self._failure_shown = message

    def _drop_failed_attempt(self) -> None:
        """A reply that broke off and is written again: its unsettled tail leaves the screen, what
        had settled is marked as the failed attempt's, and the retry starts a new block."""
        if self._text is not None and self._text_started:
            self._settle(self._dim_lines("↑ that reply broke off here; it is written again below"))
        self._text = None
        self._thinking = None

    def _on_Interrupted(self, e: dict) -> None:
        why = sanitize(str(e.get("reason") or "")).strip()
        title = "■ Interrupted" + (f" ({why})" if why else "")
        kept = "what it wrote is kept" if self._wrote else "it had said nothing yet"
        hint = f" · {kept}; say what to do next, or “continue”"
        # wrapped between words: the terminal would break the long hint anywhere
        self._settle(wrap_spans([(title, ("warning",)), (hint, ("dim",))], self.width,
                                self.style, "", "  "))
        if self._steering:
            queued = events.counted(len(self._steering), "queued instruction")
            self._settle(self._dim_lines(f"› {queued} will go first with your next message"))

    def _on_SteeringInjected(self, e: dict) -> None:
        if e.get("text") in self._steering:
            self._steering.remove(e.get("text"))

    def _on_TextCheckpoint(self, e: dict) -> None:
        """The saved part of a streaming text block. Live, the deltas showed it already; replayed
        (a resumed session that was cut off mid-reply) it is the only record of that text."""
        if not e.get("text"):
            return                      # only the usage the API reported: nothing to show
        # (a new stream starts with nothing checkpointed: make it before adding this text)
        stream = self._stream()
        self._checkpointed += e.get("text") or ""
        if stream.n_fed < len(self._checkpointed):
            stream.feed(self._checkpointed[stream.n_fed:])
            self._drain_text()

    def _on_TaskFailed(self, e: dict) -> None:
        reason = str(e.get("reason", ""))
        # the shown message was cleaned and stripped: compared as shown
        if reason and sanitize(reason).strip() == self._failure_shown:
            # the API error just shown is why: once is enough
            return
        self.error("Task failed: " + reason)

    def _on_CommandAnswered(self, e: dict) -> None:
        """Replayed: a command's answer, drawn as App drew what run_command returned."""
        self.command_answer(str(e.get("command", "")), str(e.get("text", "")), e.get("failed"),
                            bool(e.get("echoed")))

    def command_answer(self, command: str, text: str, failed: bool, echoed: bool) -> None:
        """The command line as typed (`› /cost`, as Claude Code echoes it), then its answer, or
        why it failed; `echoed`: the line is above the ◇ line of the command's own event."""
        lines = [] if echoed else self._written(command, "user")
        if failed:
            lines += self._marked("✗", "error", f"{RESULT_ERRORS['run_command']}: {text}")
        else:
            lines += self._markdown_lines(text)
        self._after_block(lines)

    def _on_Notice(self, e: dict) -> None:
        # a turn's error the log could not take ended it: no "writing" stays on the status line
        self.phase = ""
        self.note("⚠ " + str(e.get("text", "")))

    def _on_SessionResumed(self, e: dict) -> None:
        """/resume: the session's conversation as it was shown, as at start-up."""
        self._settle(render_transcript(e["events"], self.width, self.style.color,
                                       max_turns=REPLAY_TURNS, open_cards=self.cards))

    def _on_Status(self, e: dict) -> None:
        self.status_text = " ".join(sanitize(str(e.get("text", ""))).split())

    # -- tools and permissions --

    def _on_ToolRequested(self, e: dict) -> None:
        """The card the call declares (the tool says, beside its schema, what its card shows); a
        log written before cards were declared: the first string input, output tail."""
        tool_input = e.get("input")
        if not isinstance(tool_input, dict):
            tool_input = {}
        view = e.get("card")
        if not (isinstance(view, dict) and isinstance(view.get("summary"), str)):
            strings = [v for v in tool_input.values() if isinstance(v, str)]
            view = {"summary": strings[0] if strings else ""}
        card = ToolCard(e.get("name", "?"), one_line(view["summary"]), tool_input,
                        output=view.get("output", "tail"))
        self.cards[e.get("tool_use_id", "")] = card

    def _on_ToolStarted(self, e: dict) -> None:
        # without its ToolRequested the card has no summary, but it is drawn
        card = self.cards.setdefault(e.get("tool_use_id", ""), ToolCard(e.get("name", "tool"), ""))
        card.started = time.monotonic()
        card.started_ts = e.get("ts")

    def _on_ToolOutput(self, e: dict) -> None:
        if card := self.cards.get(e.get("tool_use_id", "")):
            lines = sanitize(e.get("text", "")).split("\n")
            card.output_tail.extend(line for line in lines if line.strip())

    def _on_FileModified(self, e: dict) -> None:
        if card := self.cards.get(e.get("tool_use_id", "")):
            return card.changes.append(e)
        # a change no card holds: its own card line
        symbol = self.style.paint("●", "ok")
        path = sanitize(str(e.get("path", "")))
        line = self._card_line(symbol, "changed", path, [change_counts(e)])
        self._settle([line] + self._diff_lines(e))

    def _on_ToolCompleted(self, e: dict) -> None:
        failed = e.get("type") == "ToolFailed"
        card = self._pop_card(e)
        meta = e.get("meta") if isinstance(e.get("meta"), dict) else {}
        # on replay the events' timestamps give the duration
        if "duration_ms" not in meta and card.started_ts and e.get("ts"):
            if e["ts"] - card.started_ts >= 1000:
                meta = dict(meta, duration_ms=e["ts"] - card.started_ts)
        facts = meta_facts(meta)
        facts += ["new file" if change.get("created") else change_counts(change)
                  for change in card.changes]
        symbol = self.style.paint("●", "ok")
        if meta.get("exit_code") not in (None, 0):
            # it ran, and the command says it did not succeed
            symbol = self.style.paint("✗", "warning")
        if failed:
            symbol = self.style.paint("✗", "error")
        if failed and not facts:
            facts = ["failed"]
        lines = [self._card_line(symbol, card.name, card.summary, facts)]
        lines += [row for change in card.changes for row in self._diff_lines(change)]
        shows_output = failed or (card.output != "none" and not card.changes)
        output = card_output(e, meta) if shows_output else []
        self._hold(lines, output, card.output == "head" and not failed)

    _on_ToolFailed = _on_ToolCompleted

    def start_shell(self, command: str) -> None:
        """A `!` command the user just started: a live card until its UserShellRan."""
        started = time.monotonic()
        self.cards[events.USER_SHELL_ID] = ToolCard("!", one_line(command), started=started)

    def _on_UserShellRan(self, e: dict) -> None:
        """The user's own command, drawn like a bash card: `● ! git status · exit 0 · 0.2s`."""
        self.cards.pop(events.USER_SHELL_ID, None)
        meta = {key: e[key] for key in ("exit_code", "duration_ms") if e.get(key) is not None}
        summary = one_line(str(e.get("command", "")))
        symbol, facts = self.style.paint("✗", "error"), meta_facts(meta)
        if meta.get("exit_code") == 0:
            symbol = self.style.paint("●", "ok")
        if e.get("stopped"):
            symbol, facts = "○", ["stopped"]
        self._hold([self._card_line(symbol, "!", summary, facts)], card_output(e, meta))

    def _on_ToolCancelled(self, e: dict) -> None:
        # a question left open by an interrupted turn is no longer asked
        self._resolve(e)
        card = self._pop_card(e)
        reason = sanitize(str(e.get("reason") or "")).strip()
        facts = ["cancelled" + (f" ({reason})" if reason else "")]
        # what it printed until then stays on screen, as it does for a finished command
        self._hold([self._card_line("○", card.name, card.summary, facts)], card_output(e, {}))

    def _on_TaskCompleted(self, e: dict) -> None:
        """The evidence in one line: `✓ 2 files changed · pytest -q exit 0`. The ✓ only when
        every check passed and nothing is unresolved; a failed check shows as
        `✗ pytest -q exit 1`."""
        e = e.get("evidence") if isinstance(e.get("evidence"), dict) else {}
        facts = []
        if e.get("changed_files"):
            facts.append(events.counted(len(e["changed_files"]), "file") + " changed")
        checks = (e.get("checks") or [])[-3:]
        for check in checks:
            mark = "" if check.get("exit_code") == 0 else "✗ "
            command = shown(str(check.get("command", "")))[:60]
            facts.append(f"{mark}{command} exit {check.get('exit_code')}")
        facts += unresolved_words(e.get("unresolved") or [])
        if not facts:
            return
        passed = not e.get("unresolved") and all(c.get("exit_code") == 0 for c in checks)
        role = "dim" if passed else "warning"
        # wrapped, not clipped: the verdict comes last and must show at any width
        self._settle(self._marked("✓" if passed else "⚠", role, " · ".join(facts)))

    def _on_PermissionRequested(self, e: dict) -> None:
        self._requests[e.get("tool_use_id", "")] = e
        self.permissions.append(e)

    def _on_PermissionGranted(self, e: dict) -> None:
        rule = self._resolve(e).get("suggestion")
        if e.get("scope") == "always" and rule:
            saved = f"Always allowed in this project from now on: {rule_text(rule)}"
            self._settle(self._marked("✓", "dim", saved))

    def _on_PermissionDenied(self, e: dict) -> None:
        # it will not run: no card to keep
        card = self._pop_card(e)
        what = str(self._resolve(e).get("descriptor") or card.summary or card.name)
        feedback = sanitize(str(e.get("feedback") or "")).strip()
        reason = str(e.get("reason") or "")
        # its first line, as the card's: joined, its lines read as another command (`done rm …`)
        text = f"Denied: {one_line(what)}"
        if "plan mode: " in reason:
            text += " · plan mode: only what reads runs (Shift-Tab leaves it)"
        if feedback:
            text += f" · told the model: {feedback}"
        lines = self._marked("✗", "warning", text)
        if e.get("by") == "policy" and "plan mode: " not in reason:
            # the floor's or a rule's why, as the model reads it ("<descriptor>: why")
            why = one_line(reason.removeprefix(what + ": "))
            lines.append(self._dim("  " + why))
        self._settle(lines)

    def _resolve(self, e: dict) -> dict:
        """The answered request ({} if unknown), no longer awaited."""
        tid = e.get("tool_use_id", "")
        self.permissions = [p for p in self.permissions
                            if p.get("tool_use_id") != tid]
        return self._requests.pop(tid, None) or {}

    def _pop_card(self, e: dict) -> ToolCard:
        return self.cards.pop(e.get("tool_use_id", ""), None) or ToolCard(e.get("name", "tool"), "")

    def _card_line(self, symbol: str, name: str, summary: str,
                   facts: list[str]) -> str:
        """`● bash pytest -q · exit 0 · 3.2s`: the summary shrinks so the facts always show."""
        tail = "".join(" · " + f for f in facts)
        # the model names the call: its name is shown, never acted on, like its input
        name = one_line(name)
        room = self.width - cell_width(name) - cell_width(tail) - 3
        summary = " " + clip(summary, max(room, 8)) if summary else ""
        name = self.style.paint(name, "bold")
        tail = self.style.paint(tail, "dim")
        return clip(f"{symbol} {name}{summary}{tail}", self.width)

    def _card_block(self, card: FinishedCard, expanded: bool = False,
                    live: bool = False) -> list[str]:
        """The card's lines; its output collapsed to head and tail unless `expanded`."""
        output, n = card.output, len(card.output)
        hint = " · ctrl+o shows all" if live else ""
        if card.head_only and n > PREVIEW_LINES and not expanded:
            return card.head + self._preview(output[:PREVIEW_LINES], n, hint)
        if expanded or n <= PREVIEW_HEAD + PREVIEW_TAIL + 1:
            return card.head + self._preview(output[:EXPANDED_MAX_LINES], n)
        rows = self._preview(output[:PREVIEW_HEAD], PREVIEW_HEAD)
        hidden = n - PREVIEW_HEAD - PREVIEW_TAIL
        rows.append(self.style.paint(f"    … {hidden} lines …{hint}", "dim"))
        rows += [self._dim("    " + line) for line in output[-PREVIEW_TAIL:]]
        return card.head + rows

    def _preview(self, lines: list[str], n_total: int, hint: str = "") -> list[str]:
        # the first line hangs off the card line
        out = [self._dim("  ⎿ " + line) for line in lines[:1]]
        out += [self._dim("    " + line) for line in lines[1:]]
        if n_total > len(lines):
            out.append(self.style.paint("    " + more_lines(n_total - len(lines)) + hint, "dim"))
        return out

    def _diff_lines(self, change: dict) -> list[str]:
        rows = render_diff(change.get("diff") or "", self.width - 2, self.style)
        return ["  " + row for row in rows]

    # -- the live part --

    def live_lines(self, now: float, spinner: str = "◌") -> list[str]:
        lines = []
        if self._held is not None:
            # a blank line after what came before it, as once it settles
            lines = [""] * self._any
            lines += self._card_block(self._held, self._held_expanded, live=True)
        if self._text is not None:
            text = self._text.live_lines()
            # the blank line its first settled lines will get (`_drain_text`), shown now
            lines += [""] * (bool(text) and not self._text_started and self._any) + text
        if self._thinking is not None:
            lines += self._live_thinking(now)
        for queued in self._queued:
            lines += [""] + queued
        for tid, card in self.cards.items():
            symbol, fact = "○", "queued"
            if card.started is not None:
                symbol, fact = spinner, events.duration(now - card.started)
            if tid in self._requests:
                fact = "waiting for approval"
            # the blank line it will settle behind (`_settle`), shown now: no jump when it ends
            lines += [""] * bool(self._any or lines)
            lines.append(self._card_line(symbol, card.name, card.summary, [fact]))
            lines += self._preview(list(card.output_tail), len(card.output_tail))
        return lines

    def activity(self, now: float) -> str:
        if self.permissions:
            return "waiting for your answer"
        running = [c for c in self.cards.values() if c.started is not None]
        if running:
            card = running[-1]
            # the card above shows its time: one timer
            return f"running {one_line(card.name)} {card.summary}"
        if self.status_text or not self.phase:
            return self.status_text or self.phase
        if self._model_started is None:
            return self.phase
        facts = [f"{int(now - self._model_started)}s"]
        if self._n_streamed:
            # an estimate; the API's count arrives at the end
            tokens = format_count(self._n_streamed / events.CHARS_PER_TOKEN)
            facts.append(f"↓ ~{tokens} tokens")
        return " · ".join([self.phase] + facts)


def render_transcript(log: Iterable[dict], width: int, color: bool = False,
                      max_turns: int | None = None, expanded: bool = False,
                      open_cards: dict | None = None) -> list[str]:
    """Earlier conversation (a resumed session) as settled lines. With `max_turns`, only the
    last that many user turns are drawn, so resuming a long session costs the same as a short
    one (the log keeps everything). `expanded`: every card and thinking whole (Ctrl-R).
    `open_cards` gets the cards of the calls the log leaves open, which its resumed turn asks
    about again (they are live, never settled)."""
    log = list(log)
    timeline = Timeline(Style(color), width)
    timeline.expanded = expanded
    starts = [k for k, e in enumerate(log)
              if e.get("type") == "UserMessageCreated"]
    if max_turns is not None and len(starts) > max_turns:
        hidden = events.counted(len(starts) - max_turns, "earlier turn")
        timeline._settle(timeline._dim_lines(f"… {hidden} not shown"))
        log = log[starts[-max_turns]:]
    for event in log:
        timeline.apply(event)
    if open_cards is not None:
        open_cards.update(timeline.cards)
    timeline.finish()
    return timeline.take_settled()


# ════ Status line and permission panel ════

SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# the status line's badge of a permission mode other than the default, as Claude Code shows it
MODE_BADGES = {"plan": "⏸ plan mode", "acceptEdits": "⏵⏵ accept edits"}
# the question asked when a turn in plan mode has answered with its plan
PLAN_CAPABILITY = "plan.proceed"
# ... and when a /rewind would write over files the user changed since
REWIND_CAPABILITY = "rewind.overwrite"
PANEL_PREVIEW_LINES = 14
# The panel's verb: by what the call's input holds (first match), else by the capability asked.
PANEL_VERBS = (("command", "Run"), ("old_string", "Edit"), ("content", "Write"),
               ("pattern", "Search"), ("file_path", "Read"))
CAPABILITY_VERBS = {"file.write.project": "Edit", "file.read": "Read",
                    "filesystem.outsideProject": "Access"}
# What a capability adds to the question, in words.
CAPABILITY_NOTES = {
    "filesystem.outsideProject": "outside the project",
    "network.access": "uses the network",
    "git.modify": "changes the git repository",
}
# An "always" rule's words before its pattern (commands have none).
RULE_WORDS = {"file.write.project": "editing ", "file.read": "reading ",
              "filesystem.outsideProject": "access to "}


def format_count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.1f}k" if n >= 1e3 else str(int(n))


def render_status_line(status: dict, activity: str, spinner: str,
                       width: int, style: Style) -> str:
    """Activity on the left, facts on the right: (priority, text), the lowest priority is
    dropped first when the line is narrow."""
    segments = status_segments(status)
    left = f"{spinner} {activity}" if activity else ""
    right = " · ".join(text for _, text in segments)
    while right and cell_width(left) + cell_width(right) + 2 > width:
        segments.remove(min(segments, key=lambda s: s[0]))
        right = " · ".join(text for _, text in segments)
    if not right:
        return clip(style.paint(left, "bold"), width) if left else ""
    gap = width - cell_width(left) - cell_width(right)
    return style.paint(left, "bold") + " " * gap + style.paint(right, "dim")


def status_segments(status: dict) -> list[tuple[int, str]]:
    """The facts in the order shown, each with its priority (higher stays longer)."""
    get = status.get
    # an empty text is left out (below)
    segments = [(7, MODE_BADGES.get(get("mode"), "")), (5, str(get("model") or ""))]
    if get("context_pct") is not None:
        segments.append((6, f"ctx {get('context_pct'):.0f}%"))
    if get("tokens"):
        tokens = f"{format_count(get('tokens'))} tok"
        # the part of the output that was thinking, where the API said (inside the total)
        if get("thinking_tokens"):
            tokens += f" ({format_count(get('thinking_tokens'))} thinking)"
        segments.append((3, tokens))
    if "cost" in status:
        segments.append((4, events.dollars(get("cost"), "$?", digits=2)))
    if get("cache_share") is not None:
        segments.append((1, f"cache {get('cache_share') * 100:.0f}%"))
    segments.append((3, str(get("reasoning") or "")))
    if get("processes"):
        segments.append((2, events.counted(get("processes"), "proc")))
    if get("branch"):
        segments.append((2, f"⎇ {get('branch')}"))
    # a branch name is the repository's: every character shown, none acted on
    return [(priority, shown(text)) for priority, text in segments if text]


# What kernel.open_problems says, by a phrase it uses, in the turn summary's words.
UNRESOLVED_WORDS = (("failed (exit", "tests still failing"),
                    ("no check ran", "changes not verified"),
                    ("still running", "a check still running"))


def unresolved_words(problems: list) -> list[str]:
    """The turn's open problems, each kind once: "tests still failing", not "1 unresolved"."""
    return [said for phrase, said in UNRESOLVED_WORDS
            if any(phrase in str(problem) for problem in problems)]


def panel_choices(request: dict) -> list[tuple[str, str, str]]:
    """(key, choice, words) the panel offers; choice "feedback" is a denial with a message."""
    if request.get("capability") == events.LOOP_CAPABILITY:
        return [("y", "once", "continue"), ("n", "feedback", "stop")]
    if request.get("capability") == PLAN_CAPABILITY:
        return [("y", "acceptEdits", "yes, and accept edits"),
                ("e", "default", "yes, and ask for each edit"),
                ("n", "deny", "no, keep planning")]
    if request.get("capability") == REWIND_CAPABILITY:
        return [("y", "overwrite", "overwrite them"), ("n", "keep", "keep them as you left them"),
                ("esc", "stop", "do not rewind")]
    choices = [("y", "once", "allow once")]
    if rule := request.get("suggestion"):
        choices.append(("a", "always", f"always allow {rule_text(rule)} in this project"))
    # as in Claude Code: `n` denies and asks what to do instead; Esc denies and ends the turn
    return choices + [("n", "feedback", "deny"), ("esc", "stop", "stop")]


def panel_preview(request: dict, tool_input: dict) -> str:
    """What the panel shows under the descriptor. The call's own input when the UI saw it: all of
    a write's content (so the count of lines left out is exact), a process's command as lines."""
    if isinstance(tool_input.get("content"), str):
        return tool_input["content"]
    command = tool_input.get("command")
    continuing = request.get("capability") == events.LOOP_CAPABILITY
    if not continuing and isinstance(command, str):
        return command
    if str(request.get("preview")).startswith("---"):
        # an edit's diff, as the tool planned it on the file
        return request["preview"]
    old = tool_input.get("old_string")
    new = tool_input.get("new_string")
    # an edit the tool could not plan yet: every line marked − or +
    if isinstance(old, str) and isinstance(new, str):
        removed = ["- " + line for line in old.split("\n")] if old else []
        added = ["+ " + line for line in new.split("\n")]
        return "\n".join(removed + added)
    return str(request.get("preview") or "")


def preview_rows(text: str, width: int, style: Style,
                 lang: str = "sh") -> list[str]:
    """Lines of code or a command, as lines; after PANEL_PREVIEW_LINES, how many more there are."""
    lines = text.split("\n")
    more = max(0, len(lines) - PANEL_PREVIEW_LINES)
    out = []
    for line in lines[:PANEL_PREVIEW_LINES]:
        spans = highlight_code(line, lang) if style.color else [(line, ())]
        out += wrap_spans(spans, width, style, hard=True)
    if more:
        out.append(style.paint(more_lines(more) + " · Ctrl-R shows them all", "dim"))
    return out


def render_permission_panel(request: dict, width: int, style: Style,
                            feedback: str | None = None,
                            selected: int = 0, composing: bool = False,
                            tool_input: dict | None = None, room: int = 0) -> list[str]:
    """What the call will do and the choices (`selected` is marked); after `n`, the feedback
    line. `composing`: the composer holds text, so Enter sends it instead of answering.
    `tool_input`: the call's input (from its ToolRequested), for a preview that hides nothing.
    `room`: the rows there are, if any fewer than it needs (the answers are always kept)."""
    bar = style.paint("│ ", "warning")
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    head = panel_head(request, width, style, tool_input, bar)
    footer = panel_footer(request, width, style, feedback, selected, composing, bar)
    if room and len(head) + len(footer) > room:
        keep = max(1, room - len(footer) - 1)
        # the question's first line and the count of what is hidden always show; then as many
        # lines of the answers as fit (their keys work whether shown or not), or the newest
        # lines of a denial's message, where it is typed
        if keep < len(head):
            note = f"│ … {len(head) - keep} panel lines hidden (small terminal)"
            head = head[:keep] + [style.paint(note, "warning")]
        fit = max(1, room - len(head))
        footer = footer[-fit:] if feedback is not None else footer[:fit]
    return [clip(line, width) for line in head + footer]


def panel_head(request: dict, width: int, style: Style, tool_input: dict,
               bar: str) -> list[str]:
    """The question in plain words ("Edit calc.py?", "Run `make`?"), then a preview."""
    raw = str(request.get("descriptor", ""))
    descriptor = shown(raw).strip("\n")
    lines = wrap_spans(panel_question(request, tool_input, descriptor), width, style, "", bar)
    if request.get("why"):
        # under --yes: why this one is asked all the same
        because = "--yes does not answer this: " + shown(str(request["why"]))
        lines += wrap_spans([(because, ("dim",))], width, style, bar, bar)
    raw_preview = panel_preview(request, tool_input)
    if events.has_hidden_characters(raw + raw_preview):
        noun = "command" if "command" in tool_input else "call"
        warning = (f"⚠ this {noun} contains hidden or control characters,"
                   " shown as ^[, ␍ or <U+…>")
        lines += wrap_spans([(warning, ("warning",))], width, style, bar, bar)
    rows = []
    # a multi-line command: its lines, not one run-on line
    if "\n" in descriptor:
        rows = preview_rows(descriptor, width - 2, style)
    # a CRLF file's line endings are not hidden characters (has_hidden_characters agrees)
    preview = shown(raw_preview.replace("\r\n", "\n")).rstrip("\n")
    if preview and (preview.strip() not in descriptor or "content" in tool_input):
        is_edit = isinstance(tool_input.get("old_string"), str)
        if preview.startswith(("---", "@@")) or "\n@@ " in preview:
            rows += render_diff(preview, width - 2, style, max_lines=PANEL_PREVIEW_LINES)
        elif request.get("capability") == REWIND_CAPABILITY:
            # /rewind's plan is markdown, as its answer shows it: wrapped between words
            stream = MarkdownStream(style, width - 2)
            stream.feed(preview)
            stream.finish()
            rows += stream.take_settled()
        else:
            rows += preview_rows(preview, width - 2, style, "diff" if is_edit else "sh")
    return lines + [bar + row for row in rows]


def panel_question(request: dict, tool_input: dict, descriptor: str) -> list[Span]:
    """"Edit calc.py?", "Run `python3 -m pytest -q`?": the verb from what the call's input holds
    (else its capability), a multi-line command as "this command" (its lines follow)."""
    capability = str(request.get("capability", ""))
    bold = ("warning", "bold")
    if capability in (events.LOOP_CAPABILITY, REWIND_CAPABILITY):
        return [("⚠ " + descriptor[:1].upper() + descriptor[1:] + "?", bold)]
    if capability == PLAN_CAPABILITY:
        return [("◆ The plan is ready", bold)]
    verbs = [verb for key, verb in PANEL_VERBS if key in tool_input]
    verb = (verbs or [CAPABILITY_VERBS.get(capability, "Run")])[0]
    what = descriptor
    if verb == "Run":
        what = f"`{descriptor}`"
    if "\n" in descriptor:
        what = "this command"
    spans = [(f"⚠ {verb} ", bold), (what, ("bold",)), ("?", bold)]
    if capability in CAPABILITY_NOTES:
        spans.append((f" ({CAPABILITY_NOTES[capability]})", ("dim",)))
    return spans


def panel_footer(request: dict, width: int, style: Style, feedback: str | None,
                 selected: int, composing: bool, bar: str) -> list[str]:
    """The answers (kept whole on a small terminal), or the denial's message line."""
    if feedback is not None:
        ask = "Denied. Tell the model what to do instead (Enter sends, Esc stops):"
        # the message as typed, every space kept: the cursor ends where it ends
        typed = wrap_spans([(feedback, ())], width, style, bar + "  ", bar + "  ", hard=True)
        return wrap_spans([(ask, ("dim",))], width, style, bar, bar) + typed
    choices = panel_choices(request)
    spans = []
    for k, (letter, _, words) in enumerate(choices):
        chosen = k == selected % len(choices)
        if k:
            spans.append((" · ", ("dim",)))
        if chosen:
            spans.append(("› ", ("prompt",)))
        # "esc)" stays whole when a narrow terminal wraps the answers
        spans.append((f"{letter})", ("bold",)))
        spans.append((f" {words}", ("selected",) if chosen else ()))
    lines = wrap_spans(spans, width, style, bar, bar)
    if composing:
        hint = "Enter sends your text as a message; empty the composer to answer"
        lines += wrap_spans([(hint, ("dim",))], width, style, bar, bar)
    return lines


# ════ Keys: decoding raw terminal input ════

class Key(NamedTuple):
    # "text", "enter", "ctrl+a", "alt+b", "up", "paste", "esc", ...
    name: str
    # the characters of "text" and "paste" keys
    text: str = ""


# ESC [ <final> (and ESC O <final>, SS3)
CSI_FINAL_KEYS = {
    "A": "up", "B": "down", "C": "right", "D": "left",
    "H": "home", "F": "end", "Z": "shift+tab",
    "P": "f1", "Q": "f2", "R": "f3", "S": "f4",
}
# ESC [ <number> ~
CSI_TILDE_KEYS = {
    "1": "home", "7": "home", "4": "end", "8": "end",
    "3": "delete", "2": "insert", "5": "pageup", "6": "pagedown",
}
CONTROL_KEYS = {
    "\r": "enter", "\n": "ctrl+j", "\t": "tab",
    "\x7f": "backspace", "\x08": "backspace", "\x00": "ctrl+space",
}
ALT_KEYS = {
    "\r": "alt+enter", "\n": "alt+enter",
    "\x7f": "alt+backspace", "\x08": "alt+backspace",
}


class KeyDecoder:
    """Raw input bytes -> Keys. Pure: feed bytes, get keys; a sequence cut between two reads is
    kept until the rest arrives. A lone ESC is ambiguous (Esc, or the start of a sequence):
    `pending` says so and `flush()` after a short pause turns it into Esc."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._paste: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self._buffer) and self._paste is None

    def flush(self) -> list[Key]:
        keys = []
        if self._buffer.startswith(ESC) and self._paste is None:
            rest, self._buffer = self._buffer[1:], ""
            keys.append(Key("esc") if not rest else Key("alt+" + rest[0]))
            if len(rest) > 1:
                keys += self.feed(rest[1:].encode())
        return keys

    def feed(self, data: bytes) -> list[Key]:
        buf = self._buffer + self._utf8.decode(data)
        keys: list[Key] = []
        i = 0
        while i < len(buf):
            if self._paste is not None:
                # the paste so far was searched already
                seen = max(0, len(self._paste) - len(PASTE_END))
                self._paste += buf[i:]
                end = self._paste.find(PASTE_END, seen)
                if end < 0:
                    i = len(buf)
                    break
                keys.append(Key("paste", self._paste[:end]))
                # what follows the paste is decoded as keys again
                buf = self._paste[end + len(PASTE_END):]
                i = 0
                self._paste = None
                continue
            if KEY_PARTIAL_RE.match(buf, i):
                # an incomplete sequence: wait for more bytes
                break
            m = KEY_RE.match(buf, i)
            i = m.end()
            kind = m.lastgroup
            value = m[kind]
            if kind == "final":
                key = self._csi(m["params"], value, bool(m["meta"]))
            elif kind == "text":
                key = Key("text", value)
            else:
                key = Key(_key_name(kind, value))
            if key is not None:
                keys.append(key)
        self._buffer = buf[i:]
        return keys

    def _csi(self, params: str, final: str, meta: bool = False) -> Key | None:
        fields = params.split(";")
        if final == "~" and fields[0] == "200":
            self._paste = ""
            return None
        # xterm modifiers: ESC [ 1 ; <1 + bits> <final>
        bits = 2 if meta else 0
        if len(fields) > 1 and fields[1].isdigit():
            bits |= max(int(fields[1]) - 1, 0)
        prefix = ("ctrl+" * bool(bits & 4)
                  + "alt+" * bool(bits & 2)
                  + "shift+" * bool(bits & 1))
        if final == "~":
            return Key(prefix + CSI_TILDE_KEYS.get(fields[0], "unknown"))
        return Key(prefix + CSI_FINAL_KEYS.get(final, "unknown"))


def _key_name(kind: str, value: str) -> str:
    """The name of a one-character key: an SS3 key, Esc, Alt+char or a control character."""
    if kind == "ss3":
        return CSI_FINAL_KEYS.get(value, "unknown")
    if kind == "esc":
        return "esc"
    if kind == "alt":
        return ALT_KEYS.get(value, "alt+" + value)
    # Ctrl+letter arrives as the letter's code minus 96
    return CONTROL_KEYS.get(value, f"ctrl+{chr(ord(value) + 96)}")


# What the keys do, for /help and `khaelor --help` (khaelor.py formats it).
KEY_HELP = (
    ("Enter",
     "send; while khaelor works, it is queued as steering for its next step"),
    ("Alt-Enter, Ctrl-J or \\ Enter", "a new line"),
    ("Esc", "interrupt khaelor (what it wrote so far is kept); close a menu"),
    ("Esc Esc", "on an empty input: /rewind, the steps to go back before"),
    ("Ctrl-C", "clear the input, else interrupt; twice in a row quits"),
    ("Ctrl-D", "quit (on an empty input)"),
    ("Ctrl-L", "clear the screen"),
    ("Ctrl-O", "open or close the newest tool card, or the thinking that streams"),
    ("Ctrl-R", "the transcript: everything, every card whole (q leaves)"),
    ("Ctrl-Z", "suspend khaelor (`fg` brings it back)"),
    ("Shift-Tab", "the mode: default → accept edits → plan, from the next message"),
    ("Up, Down", "input history; in a permission question, choose an answer"),
    ("y, a, n",
     "answer a permission question (on an empty input; typing writes a message)"),
    ("@path", "mention a file (Tab or Enter completes)"),
    ("!command",
     "run a shell command yourself; it and its output join the conversation"),
    ("/", "the commands, each with what it does"),
    ("?", "these keys (on an empty input)"),
)


def keys_help() -> str:
    """KEY_HELP as /help and "?" show it: a table, the keys in one column."""
    rows = [f"| {key} | {what} |" for key, what in KEY_HELP]
    return "**Keys**\n\n| key | what it does |\n|---|---|\n" + "\n".join(rows)


# ════ Composer ════

# longer pastes show as one placeholder: [Pasted N lines], [Pasted N characters]
PASTE_COLLAPSE_LINES = 5
PASTE_COLLAPSE_CHARS = 1500
MAX_COMPOSER_ROWS = 10
# rows the completion menu shows at once; it scrolls past them
MAX_MENU_ITEMS = 8
# file matches offered for an @ mention
MAX_MENU_MENTIONS = 50
MAX_HISTORY = 1000
# candidates scored per keystroke, at most
MENTION_SCAN = 1000
MENTION_RE = re.compile(r"(?:^|(?<=\s))@(\S*)\Z")
COMMAND_RE = re.compile(r"^/[A-Za-z][\w-]*$")
# Alt-B / Ctrl-W: back over spaces, then a word
WORD_BEFORE_RE = re.compile(r"\w*\W*\Z")
WORD_AFTER_RE = re.compile(r"\W*\w*")
# Keys that edit as another does (Emacs and arrow spellings of one move).
KEY_ALIASES = {"paste": "text", "alt+enter": "ctrl+j", "ctrl+b": "left", "ctrl+f": "right",
               "home": "ctrl+a", "end": "ctrl+e", "ctrl+h": "backspace", "alt+backspace": "ctrl+w",
               "ctrl+left": "alt+b", "alt+left": "alt+b",
               "ctrl+right": "alt+f", "alt+right": "alt+f"}


def fuzzy_score(query: str, candidate: str) -> float | None:
    """Subsequence match; consecutive letters, word starts and the basename score higher."""
    q, c = query.lower(), candidate.lower()
    score = 0.0
    # where this letter and the one before it matched
    pos = -1
    prev = -2
    for ch in q:
        pos = c.find(ch, pos + 1)
        if pos < 0:
            return None
        if pos == prev + 1:
            score += 3
        if pos == 0 or c[pos - 1] in "/._- ":
            score += 2
        prev = pos
    if q and q in c.rsplit("/", 1)[-1]:
        score += 5
    return score - len(c) * 0.01


def soft_wrap(line: str, cells: int) -> list[str]:
    """`line` cut into rows of at most `cells`, at a space where there is one (the space stays at
    the end of its row); the rows join back to `line` exactly, so the cursor maps onto them."""
    rows = []
    while cell_width(line) > cells:
        # line[:1]: a wide char in a 1-cell row
        head = split_at_width(line, cells)[0] or line[:1]
        # just after the last space that fits
        cut = head.rfind(" ") + 1
        if cut:
            # so no row ends inside a word or starts with " "
            head = head[:cut]
        rows.append(head)
        line = line[len(head):]
    return rows + [line]


class Composer:
    """The multi-line input. `handle(key)` edits and returns the text to send on Enter (pastes
    expanded), else None. History lives in a file of one JSON string per line."""

    def __init__(self, *, history_path: str | os.PathLike | None = None,
                 commands: Callable[[], list[str]] = list,
                 mentions: Callable[[str], list[str]] = lambda prefix: [],
                 about: dict[str, str] | None = None,
                 choices: dict[str, list[str]] | None = None,
                 in_use: Callable[[str], str] = lambda command: ""):
        self.text, self.cursor = "", 0
        self.menu: list[str] = []
        self.menu_index = 0
        # "command" or "mention"
        self._menu_kind = ""
        # where the word being completed starts (its / or @)
        self._menu_start = 0
        # Esc closed it: it stays closed until more is typed
        self._menu_closed = False
        self._commands, self._mentions = commands, mentions
        # a command's one-line description, for the menu
        self._about = about or {}
        # a command's arguments, offered once its name and a space are typed
        self._choices = choices or {}
        # "/model" -> the model in use: the picker opens on it (Enter, Enter changes nothing)
        self._in_use = in_use
        self._pastes: dict[str, str] = {}
        self._kill = ""
        self._history_path = Path(history_path) if history_path else None
        # messages as shown: pastes stay [Pasted N lines]
        self.history: list[str] = []
        # shown text -> its pastes
        self._history_pastes: dict[str, dict[str, str]] = {}
        self._load_history()
        self._history_pos, self._draft = len(self.history), ""
        # the draft's pastes, while history is browsed
        self._draft_pastes: dict[str, str] = {}
        self.recent_mentions: list[str] = []
        # (candidates, query, matches) last time
        self._mention_memo: tuple = (None, "", [])
        self._remember_mentions([p for entry in self.history for p in events.mentions(entry)])

    def _load_history(self) -> None:
        path = self._history_path
        lines = []
        if path and path.exists():
            lines = path.read_text("utf-8", "replace").splitlines()
        if len(lines) > 2 * MAX_HISTORY:
            # the newest are kept: a history that only grew would slow every start
            lines = lines[-MAX_HISTORY:]
            with contextlib.suppress(OSError):
                events.replace_private(path, ("\n".join(lines) + "\n").encode())
        for line in lines[-MAX_HISTORY:]:
            try:
                entry = json.loads(line)
            except ValueError:
                # a torn line (a crash mid-write): load the rest
                continue
            if isinstance(entry, str):
                entry = {"text": entry}
            # a message holding collapsed pastes: {"text": …, "pastes": {label: content}}
            if isinstance(entry, dict) and isinstance(entry.get("text"), str):
                self.history.append(entry["text"])
                self._history_pastes[entry["text"]] = dict(entry.get("pastes") or {})

    # -- editing --

    def handle(self, key: Key) -> str | None:
        name = key.name
        if name == "enter" and self.text == "/":
            # a bare "/" asks for the menu: Enter shows it, never runs its first entry
            self.set_text("/")
            return None
        if self.menu and name in ("up", "down", "tab", "enter"):
            if name in ("up", "down"):
                step = 1 if name == "down" else -1
                self.menu_index = (self.menu_index + step) % len(self.menu)
                return None
            kind = self._menu_kind
            self._accept_menu()
            if name == "tab" and kind == "command":
                # its arguments are typed next ("/fixissue 42", never "/fixissue42")
                self.set_text(self.text + " ")
            if name == "tab" or kind == "mention":
                return None
        if name == "enter" and self._choices.get(self.text.strip()):
            # a command with choices, none given: Enter opens its picker (Enter again picks)
            self.set_text(self.text.strip() + " ")
            return None
        if name == "enter":
            return self._enter()
        name = KEY_ALIASES.get(name, name)
        action = getattr(self, "_key_" + name.replace("+", "_"), None)
        if action is not None:
            action(key)
        self._refresh_menu()
        return None

    def set_text(self, text: str) -> None:
        self.text = text
        self.cursor = len(text)
        self._menu_closed = False
        self._refresh_menu()

    def clear(self) -> None:
        self._pastes.clear()
        self.set_text("")

    def close_menu(self) -> None:
        """Esc: a command's picker goes with its command ("/model ", nothing picked yet)."""
        if self.text.endswith(" ") and self._choices.get(self.text[:-1]):
            self.set_text("")
        self.menu, self._menu_closed = [], True

    def _labels(self) -> list[tuple[int, int]]:
        """Where the paste labels are: each is one unit (its words would be sent, not the paste)."""
        found = [(self.text.find(label), len(label)) for label in self._pastes]
        return [(at, at + n) for at, n in found if at >= 0]

    def _insert(self, text: str) -> None:
        for at, end in self._labels():
            if at < self.cursor < end:
                self.cursor = end
        self.text = self.text[:self.cursor] + text + self.text[self.cursor:]
        self.cursor += len(text)
        self._menu_closed = False

    def _key_text(self, key: Key) -> None:
        text = key.text.replace("\r\n", "\n").replace("\r", "\n")
        if key.name == "paste":
            # a final newline ends the last line, it starts none
            n_lines = text.rstrip("\n").count("\n") + 1
            if n_lines > PASTE_COLLAPSE_LINES or len(text) > PASTE_COLLAPSE_CHARS:
                size = events.counted(n_lines, "line")
                if n_lines <= PASTE_COLLAPSE_LINES:     # "1 line" says nothing of 3,000 chars
                    size = f"{len(text):,} characters"
                label, k = f"[Pasted {size}]", 2
                while label in self._pastes:
                    label, k = f"[Pasted {size} #{k}]", k + 1
                self._pastes[label] = text
                return self._insert(label)
        self._insert(events.plain_text(text.replace("\t", "    ")))

    def _enter(self) -> str | None:
        before = self.text[:self.cursor]
        # "\" then Enter: a newline, as in a shell
        if before.endswith("\\"):
            self.text = before[:-1] + "\n" + self.text[self.cursor:]
            return None
        if not self.text.strip():
            return None
        text = self.text
        # the pastes whose labels are still in the text
        pastes = {label: content for label, content in self._pastes.items() if label in text}
        for label, content in pastes.items():
            text = text.replace(label, content, 1)
        self._remember(self.text, pastes)
        self.clear()
        return text

    def _line_bounds(self) -> tuple[int, int]:
        start = self.text.rfind("\n", 0, self.cursor) + 1
        end = self.text.find("\n", self.cursor)
        return start, len(self.text) if end < 0 else end

    def _word_left(self) -> int:
        return WORD_BEFORE_RE.search(self.text, 0, self.cursor).start()

    def _word_right(self) -> int:
        return WORD_AFTER_RE.match(self.text, self.cursor).end()

    def _cut(self, start: int, end: int, kill: bool = True) -> None:
        """Remove text[start:end]; a kill (not Backspace or Delete, as in readline) keeps it for
        Ctrl-Y."""
        end = min(end, len(self.text))
        for at, label_end in self._labels():
            if at < end and start < label_end:
                start, end = min(start, at), max(end, label_end)
        if end > start:
            if kill:
                self._kill = self.text[start:end]
            self.text = self.text[:start] + self.text[end:]
            self.cursor = start

    def _key_ctrl_j(self, key): self._insert("\n")
    def _key_left(self, key): self.cursor = max(0, self.cursor - 1)
    def _key_right(self, key): self.cursor = min(len(self.text), self.cursor + 1)
    def _key_ctrl_a(self, key): self.cursor = self._line_bounds()[0]
    def _key_ctrl_e(self, key): self.cursor = self._line_bounds()[1]
    def _key_alt_b(self, key): self.cursor = self._word_left()
    def _key_alt_f(self, key): self.cursor = self._word_right()
    def _key_backspace(self, key): self._cut(max(0, self.cursor - 1), self.cursor, kill=False)
    def _key_delete(self, key): self._cut(self.cursor, self.cursor + 1, kill=False)
    def _key_ctrl_w(self, key): self._cut(self._word_left(), self.cursor)
    def _key_alt_d(self, key): self._cut(self.cursor, self._word_right())
    def _key_ctrl_u(self, key): self._cut(self._line_bounds()[0], self.cursor)
    def _key_ctrl_y(self, key): self._insert(self._kill)

    def _key_ctrl_k(self, key):
        end = self._line_bounds()[1]
        self._cut(self.cursor, end if end > self.cursor else end + 1)

    def _key_up(self, key): self._move_line(-1)
    def _key_down(self, key): self._move_line(+1)

    def _move_line(self, step: int) -> None:
        """Up/Down: to the same column of the line above/below; past the first/last line,
        through the history."""
        start, end = self._line_bounds()
        if step < 0:
            at_edge = start == 0
        else:
            at_edge = end == len(self.text)
        if at_edge:
            return self._recall(step)
        column = self.cursor - start
        # onto the end of the line above, or the start of the one below
        self.cursor = start - 1 if step < 0 else end + 1
        start, end = self._line_bounds()
        self.cursor = min(start + column, end)

    # -- history --

    def _recall(self, step: int) -> None:
        pos = self._history_pos + step
        if not 0 <= pos <= len(self.history):
            return
        if self._history_pos == len(self.history):
            self._draft = self.text
            self._draft_pastes = dict(self._pastes)
        self._history_pos = pos
        # a recalled paste stays collapsed, and still sends whole
        if pos < len(self.history):
            self.text = self.history[pos]
            self._pastes = dict(self._history_pastes.get(self.text, {}))
        else:
            self.text = self._draft
            self._pastes = self._draft_pastes
        self.cursor = len(self.text)

    def _remember(self, text: str, pastes: dict[str, str]) -> None:
        """`text` as shown (paste labels in it) and what the labels stand for."""
        self._remember_mentions(events.mentions(text))
        if pastes:
            self._history_pastes[text] = pastes
        if not self.history or self.history[-1] != text:
            self.history.append(text)
            if self._history_path is not None:
                self._history_path.parent.mkdir(parents=True, exist_ok=True)
                entry = {"text": text, "pastes": pastes} if pastes else text
                with open(self._history_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")
        self._history_pos, self._draft = len(self.history), ""

    def _remember_mentions(self, paths: list[str]) -> None:
        """The newest first, each once, at most 50."""
        newest_first = dict.fromkeys([*reversed(paths), *self.recent_mentions])
        self.recent_mentions = list(newest_first)[:50]

    # -- completion: "/" commands and "@" mentions --

    def _refresh_menu(self) -> None:
        self.menu = []
        self.menu_index = 0
        self._menu_kind = ""
        if self._menu_closed:
            return
        before = self.text[:self.cursor]
        # `/effort ` (and what follows, up to a space): its choices, as whole commands
        name, space, partial = before.partition(" ")
        if before.startswith("/") and not any(c.isspace() for c in self.text):
            offered = sorted("/" + str(n).lstrip("/") for n in self._commands())
        elif space and " " not in partial and self._choices.get(name):
            offered = [f"{name} {choice}" for choice in self._choices[name]]
        elif m := MENTION_RE.search(before):
            self.menu = self._mention_matches(m.group(1))[:MAX_MENU_MENTIONS]
            self._menu_kind, self._menu_start = "mention", m.start(1) - 1
            return
        else:
            return
        matches = [n for n in offered if n.startswith(before)]
        # what is typed exactly comes first (Enter runs it); alone, there is nothing to offer
        if matches != [before]:
            self.menu = sorted(matches, key=lambda n: n != before)
        self._menu_kind, self._menu_start = "command", 0
        if space and not partial and f"{name} {self._in_use(name)}" in self.menu:
            self.menu_index = self.menu.index(f"{name} {self._in_use(name)}")

    def _mention_matches(self, query: str) -> list[str]:
        """Typing narrows: while the caller returns the same list and the query only grows,
        filter the previous matches instead of every path. In a big repository only the
        shortest MENTION_SCAN matches holding the query as typed are scored (fuzzy_score is
        Python), so a 100,000-file repository costs milliseconds per keystroke."""
        candidates, lowered = self._mentions(query), query.lower()
        last_candidates, done, matches = self._mention_memo
        fresh = candidates is not last_candidates
        if fresh or not lowered.startswith(done):
            done = ""
            matches = [(path, path.lower(), -1) for path in candidates]
        # matches: (path, lowered path, where the last letter matched); each new letter must
        # come after that
        for ch in lowered[len(done):]:
            found = ((path, low, low.find(ch, at + 1)) for path, low, at in matches)
            matches = [match for match in found if match[2] >= 0]
        self._mention_memo = (candidates, lowered, matches)
        pool = [path for path, _, _ in matches[:MENTION_SCAN]]
        if len(matches) > MENTION_SCAN and lowered:
            literal = [path for path, low, _ in matches if lowered in low]
            shortest_of = literal or [m[0] for m in matches]
            pool = heapq.nsmallest(MENTION_SCAN, shortest_of, key=len)
        # more recently mentioned paths rank higher
        recent = self.recent_mentions
        recency = {path: 10 * (1 - k / len(recent)) for k, path in enumerate(recent)}
        scores = {path: fuzzy_score(query, path) for path in dict.fromkeys(pool + recent)}
        scored = [(score + recency.get(path, 0), path)
                  for path, score in scores.items() if score is not None]
        # best score first, then by name
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [path for _, path in scored]

    def _accept_menu(self) -> None:
        # cleaned as typed text is
        item = events.plain_text(self.menu[self.menu_index])
        if self._menu_kind == "mention":
            self._remember_mentions([item])
            # a path with spaces, quoted; a folder stays open: its files are offered next
            item = f'@"{item}" ' if " " in item else "@" + item + " " * (item[-1:] != "/")
        self.text = self.text[:self._menu_start] + item + self.text[self.cursor:]
        self.cursor = self._menu_start + len(item)
        self._refresh_menu()

    # -- drawing --

    def render(self, width: int, style: Style,
               hint: str = "") -> tuple[list[str], int, int]:
        """(rows, cursor row, cursor column). The first row always starts with `❯ `."""
        prompt = style.paint("❯ ", "prompt")
        if not self.text:
            return [clip(prompt + style.paint(hint, "dim"), width)], 0, 2
        rows: list[str] = []
        cursor_row = 0
        cursor_col = 0
        # where `piece` starts in the text
        offset = 0
        for line in self.text.split("\n"):
            pieces = soft_wrap(line, max(1, width - 2))
            for k, piece in enumerate(pieces):
                end = offset + len(piece)
                # at a row's end the cursor belongs to the next row, if any
                last = k == len(pieces) - 1
                inside = offset <= self.cursor < end
                if inside or self.cursor == end and last:
                    cursor_row = len(rows)
                    cursor_col = 2 + cell_width(piece[:self.cursor - offset])
                rows.append("  " + piece)
                offset = end
            # the newline
            offset += 1
        # cursor just past a full row: show it on the next
        if cursor_col >= width:
            rows.insert(cursor_row + 1, "  ")
            cursor_row += 1
            cursor_col = 2
        # the window of rows shown keeps the cursor in it
        top = min(cursor_row - MAX_COMPOSER_ROWS + 1,
                  len(rows) - MAX_COMPOSER_ROWS)
        top = max(0, top)
        rows = rows[top:top + MAX_COMPOSER_ROWS]
        rows[0] = prompt + rows[0][2:]
        return rows, cursor_row - top, cursor_col

    def menu_lines(self, width: int, style: Style) -> list[str]:
        """A window of MAX_MENU_ITEMS rows that follows the selection; commands with what they
        do; the last row says how many there are when some are out of view."""
        n = len(self.menu)
        top = min(self.menu_index - MAX_MENU_ITEMS + 1, n - MAX_MENU_ITEMS)
        top = max(0, top)
        # the project names its files and command files: shown, never acted on
        column = max((cell_width(shown(item)) for item in self.menu), default=0) + 2
        rows = []
        for k in range(top, min(n, top + MAX_MENU_ITEMS)):
            item = self.menu[k]
            about = self._about.get(item, "") if self._menu_kind == "command" else ""
            label = shown(item)
            if about:
                label += " " * (column - cell_width(label))
            about = style.paint(shown(about), "dim")
            if k == self.menu_index:
                row = style.paint("› " + label, "selected") + about
            else:
                row = "  " + label + about
            rows.append(clip("  " + row, width))
        if n > MAX_MENU_ITEMS:
            where = f"    ↑↓ {self.menu_index + 1} of {n}"
            rows.append(style.paint(clip(where, width), "dim"))
        return rows


# ════ Inline renderer: one write per frame ════

class InlineRenderer:
    """Writes settled lines once above the live region and redraws only the live region: move up
    to the first changed row, erase below, write the rest, put the cursor back. One bytes object
    per frame. It remembers how many rows it drew and where it left the cursor."""

    def __init__(self):
        # the live region as last drawn
        self._lines: list[str] = []
        # (row, column) within it
        self._cursor = (0, 0)
        # the next frame starts at the bottom of the screen (after a widening)
        self._to_bottom = False

    def draw(self, settled: list[str], lines: list[str],
             cursor: tuple[int, int]) -> bytes:
        unchanged = lines == self._lines and cursor == self._cursor
        if not settled and unchanged:
            return b""
        parts = [SYNC_BEGIN]
        # the first row to rewrite
        start = 0
        if self._lines:
            if not (settled or self._to_bottom):
                # where the two frames first differ (the shorter one's end at the latest)
                differ = (k for k, (a, b) in enumerate(zip(self._lines, lines)) if a != b)
                start = min(next(differ, len(lines)), len(self._lines) - 1, len(lines))
            parts.append(move_rows(start - self._cursor[0]))
        parts.append(CARRIAGE_RETURN + ERASE_DOWN)
        if self._to_bottom:
            # CSI 999 B stops at the last row, scrolling nothing
            parts.append(CURSOR_DOWN.format(999) + move_rows(1 - len(settled) - len(lines)))
            self._to_bottom = False
        if settled:
            parts.append(NEWLINE.join(settled) + NEWLINE)
        parts.append(NEWLINE.join(lines[start:]))
        end_row = len(lines) - 1 if start < len(lines) else start
        row, column = cursor
        parts.append(move_rows(row - end_row) + CARRIAGE_RETURN)
        if column:
            parts.append(CURSOR_FORWARD.format(column))
        parts.append(SYNC_END)
        self._lines, self._cursor = list(lines), cursor
        return "".join(parts).encode()

    def close(self, settled: list[str]) -> bytes:
        """Erase the live region, write the last settled lines, leave the cursor on a new line."""
        return self.draw(settled, [], (0, 0)) + SGR_RESET.encode()

    def resize(self, old_width: int, new_width: int) -> None:
        """After a resize, terminals that reflow re-wrap the rows we drew: estimate where the
        region now starts so the next frame erases it (narrowing is what splits rows)."""
        if not self._lines or new_width >= old_width:
            # force a full redraw, same geometry; a wider terminal re-joins the rows above the
            # region and moves it up (tmux keeps the cursor's row when it narrows, pushing what is
            # above into the scrollback): the region goes back to the bottom, so that a later
            # narrowing pushes only rows above it, never a copy of it
            self._lines = [""] * len(self._lines)
            self._to_bottom = bool(self._lines) and new_width > old_width
            return
        row, column = self._cursor
        # the rows each takes now: its width divided by new_width, rounded up
        rows_above = sum(max(1, -(-visible_width(line) // new_width)) for line in self._lines[:row])
        self._cursor = (rows_above + column // new_width, 0)
        self._lines = [""] * (self._cursor[0] + 1)


def move_rows(delta: int) -> str:
    """The cursor `delta` rows down (up if negative); nothing for 0 (CSI 0A would move one)."""
    if delta < 0:
        return CURSOR_UP.format(-delta)
    return CURSOR_DOWN.format(delta) if delta > 0 else ""


# ════ App: keys and events in, frames out (no terminal, no loop: testable) ════

# coalesce: at most one frame per ~16 ms
FRAME_INTERVAL = 0.016
# spinner and elapsed-time refresh while something runs
TICK_INTERVAL = 0.1
# a lone ESC is Esc if nothing follows within this
ESC_TIMEOUT = 0.05
# Esc twice within this, on an empty composer while nothing runs, opens /rewind (as in Claude Code)
DOUBLE_ESC_S = 0.6
# a resumed session shows its last turns (bounded resume time)
REPLAY_TURNS = 30
# What failed, by the controller call that raised.
RESULT_ERRORS = {"run_command": "The command failed", "submit": "The message was not sent",
                 "run_shell": "The shell command did not run"}
# The transcript view's keys (a text key by its character): rows or pages to move (Home and End
# go all the way), and the keys that leave it.
TRANSCRIPT_ROWS = {"up": -1, "k": -1, "down": 1, "j": 1}
TRANSCRIPT_PAGES = {"pageup": -1, "b": -1, "pagedown": 1, " ": 1,
                    "home": -sys.maxsize, "g": -sys.maxsize, "end": sys.maxsize, "G": sys.maxsize}
TRANSCRIPT_LEAVE = frozenset({"q", "esc", "ctrl+r", "ctrl+c", "ctrl+o"})


class App:
    def __init__(self, controller: Controller, *, style: Style,
                 width: int = 80, height: int = 24,
                 history_path: str | os.PathLike | None = None,
                 spawn: Callable[[object], None] | None = None):
        self.controller, self.style = controller, style
        self.width, self.height = width, height
        self.timeline = Timeline(style, width)
        self.composer = Composer(history_path=history_path,
                                 commands=lambda: controller.command_names,
                                 mentions=controller.mention_candidates,
                                 about=getattr(controller, "command_descriptions", None),
                                 choices=getattr(controller, "command_choices", None),
                                 in_use=getattr(controller, "setting_in_use", lambda name: ""))
        self.renderer = InlineRenderer()
        # deny message being typed in the permission panel
        self.feedback: str | None = None
        # the panel's highlighted choice (Up/Down, Enter)
        self.panel_choice = 0
        # the permission mode the running turn began in
        self.turn_mode = "default"
        # `!` commands typed while the model works: each runs when the turn ends
        self.queued_shell: list[str] = []
        # "Press Ctrl-C again to quit": a second one quits
        self.notice = ""
        self.exit_code: int | None = None
        self.on_exit: Callable[[int], None] = lambda code: None
        self._spawn = spawn or asyncio.ensure_future
        # time.monotonic() of the last Esc that did nothing (Esc Esc opens /rewind)
        self._idle_esc = 0.0
        # the durable events so far, a resumed session's included: what the transcript view reads
        self.log: list[dict] = []
        # the transcript view's first row shown; None: the view is closed
        self.transcript_top: int | None = None
        # the view's bytes as last drawn (b"": the alternate screen is off)
        self._view = b""
        # ((events, width), the view's rows)
        self._view_rows: tuple = (None, [])
        # the main screen's width when a resize found the view open (0: none did)
        self._main_width = 0

    # -- input --

    def on_event(self, event: dict) -> None:
        kind = event.get("type")
        # @ completion's list is ready: show it
        if kind == "FilesListed":
            self.composer._refresh_menu()
        if kind == "UserMessageCreated":
            self.turn_mode = self._mode()
        if kind in events.DURABLE:
            self.log.append(event)
        if kind == "SessionResumed":
            self.log = [e for e in event["events"] if e.get("type") in events.DURABLE]
        if kind == "StartFailed":
            # khaelor says why once the terminal is given back
            self.quit(2)
        if kind == "Typed":
            self._dispatch(event["text"])
        try:
            if kind != "CommandAnswered":   # shown already: run_command returned it
                self.timeline.apply(event)
        except Exception as exc:
            # an odd event must never break the session: show it instead
            self.timeline.error(f"ui could not show a {kind} event: {exc!r}")
        if kind == "TaskCompleted":
            self._ask_about_plan()

    def _mode(self) -> str:
        return (self.controller.status() or {}).get("mode") or "default"

    def _ask_about_plan(self) -> None:
        """A turn in plan mode ended with its answer, the plan: proceed? as Claude Code asks."""
        if self.turn_mode == "plan" and self._mode() == "plan":
            self.timeline.permissions.append({"tool_use_id": PLAN_CAPABILITY,
                                              "capability": PLAN_CAPABILITY,
                                              "descriptor": "Proceed with this plan?"})

    def on_key(self, key: Key) -> None:
        if self.transcript_top is not None:
            return self._transcript_key(key)
        if key.name != "ctrl+c":
            self.notice = ""
        permissions = self.timeline.permissions
        if permissions and self._panel_key(permissions[0], key):
            return
        if key.name == "ctrl+d" and not self.composer.text:
            return self.quit(0)
        actions = {"ctrl+c": self._ctrl_c, "esc": self._esc,
                   "ctrl+o": self.timeline.expand_last_card, "ctrl+r": self.open_transcript,
                   "shift+tab": lambda: self.call(self.controller.cycle_mode)}
        if key.name in actions:
            return actions[key.name]()
        if key == Key("text", "?") and not self.composer.text:
            # as in Claude Code: "?" on an empty input shows the keys
            return self.timeline.note(keys_help())
        # Ctrl-D on a non-empty input deletes, as in a shell
        if key.name == "ctrl+d":
            key = Key("delete")
        sent = self.composer.handle(key)
        if sent is not None:
            self._dispatch(sent)

    def _esc(self) -> None:
        """Close the menu, else interrupt, else (twice, on an empty composer) open /rewind."""
        if self.composer.menu:
            self.composer.close_menu()
        elif self.controller.busy:
            self.call(self.controller.interrupt)
        elif not self.composer.text:
            now = time.monotonic()
            if now - self._idle_esc < DOUBLE_ESC_S:
                now = 0.0
                self.call(self.controller.run_command, "/rewind")
            self._idle_esc = now

    def quit(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self.on_exit(code)

    def call(self, fn: Callable, *args) -> None:
        """Call the controller; run an awaitable result as a task; show what comes back."""
        async def finish(awaitable) -> None:
            try:
                self._show_result(fn, await awaitable, args)
            except Exception as exc:
                self._show_result(fn, exc, args)

        try:
            result = fn(*args)
        except Exception as exc:
            result = exc
        if inspect.isawaitable(result):
            self._spawn(finish(result))
        else:
            self._show_result(fn, result, args)

    def answer_question(self, request: dict, choice: str) -> object:
        """A command's question answered: its answer shows under the line typed (`command`)."""
        return request["answer"](choice)

    def _show_result(self, fn: Callable, result: object, args: tuple = ()) -> None:
        if isinstance(result, Exception) and fn == self.controller.run_shell:
            # it failed to run: not running
            self.timeline.cards.pop(events.USER_SHELL_ID, None)
        answered = isinstance(result, Exception) or (isinstance(result, str) and result.strip())
        command = ""
        if fn == self.controller.run_command:
            command = args[0]
        elif fn == self.answer_question:
            command = args[0].get("command", "")
        # the command's own event showed its line (and the line is not kept for a later command)
        echoed = bool(command) and self.timeline.last_echo == command
        if command:
            self.timeline.last_echo = None
        if command and answered:
            # with the line typed, as its CommandAnswered replays it
            self.timeline.command_answer(command, str(result), isinstance(result, Exception),
                                         echoed)
        elif isinstance(result, Exception):
            # in the user's words, not the controller's method name
            what = RESULT_ERRORS.get(getattr(fn, "__name__", ""), "That failed")
            self.timeline.error(f"{what}: {result}")
        elif result is QUIT:
            self.quit(0)
        elif result is TRANSCRIPT:
            self.open_transcript()
        elif isinstance(result, str) and result.strip():
            self.timeline.note(result)
        elif isinstance(result, dict):
            self.timeline.permissions.append(result)

    def _dispatch(self, text: str) -> None:
        stripped = text.strip()
        shell_command = stripped[1:].strip()
        if stripped.startswith("!") and shell_command:
            # nothing typed is lost: while a turn runs, it waits for the turn's end
            self.queued_shell.append(shell_command)
            self._run_queued_shell()
        elif COMMAND_RE.match(stripped.split(None, 1)[0]):
            self.call(self.controller.run_command, stripped)
        else:
            self.call(self.controller.submit, text)

    def _run_queued_shell(self) -> None:
        """The turn has ended: the next queued `!` command runs (one at a time), shown running
        at once."""
        idle = events.USER_SHELL_ID not in self.timeline.cards
        if self.queued_shell and idle and not self.controller.busy:
            command = self.queued_shell.pop(0)
            self.timeline.start_shell(command)
            self.call(self.controller.run_shell, command)

    def _ctrl_c(self) -> None:
        if self.composer.text:
            self.composer.clear()
        elif self.notice:
            self.quit(0)
        else:
            if self.controller.busy:
                self.call(self.controller.interrupt)
            self.notice = "Press Ctrl-C again to quit"

    def _panel_key(self, request: dict, key: Key) -> bool:
        """True if the open question took the key. Typing never answers it: text goes to the
        composer and is kept (Enter sends it as steering). A one-key answer counts only while
        the composer is empty; Up/Down choose and Enter answers whenever it is empty."""
        if self.feedback is not None:
            self._feedback_key(request, key)
            return True
        choices = panel_choices(request)
        empty = not self.composer.text
        if self.composer.menu and key.name in ("up", "down", "tab", "enter", "esc"):
            # the composer's completion menu has them
            return False
        arrows = key.name in ("up", "down")
        if arrows or (empty and key.name in ("left", "right")):
            step = 1 if key.name in ("down", "right") else -1
            self.panel_choice = (self.panel_choice + step) % len(choices)
        elif key.name == "enter" and empty:
            _, choice, _ = choices[self.panel_choice % len(choices)]
            self._choose(request, choice)
        elif key.name == "esc":
            self._stop(request)
        elif key.name == "ctrl+c" and empty:
            # denied, then Ctrl-C as anywhere: the turn stops, and a second one quits
            self._answer(request, "deny", "")
            return False
        elif empty and key.name == "text" and len(key.text) == 1:
            letters = {letter: choice for letter, choice, _ in choices}
            if key.text not in letters:
                # the first letter of a sentence ("Actually, …" never answers `a`)
                return False
            self._choose(request, letters[key.text])
        else:
            return False
        return True

    def _choose(self, request: dict, choice: str) -> None:
        if choice == "feedback":
            self.feedback = ""
        elif choice == "stop":
            self._stop(request)
        else:
            self._answer(request, choice, "")

    def _stop(self, request: dict) -> None:
        """Esc or Ctrl-C at the panel: the call is denied and the turn ends, as in Claude Code. A
        command's question (/rewind's "esc) do not rewind") is only declined: a turn goes on."""
        self._answer(request, "deny", "")
        if "answer" not in request:
            self.call(self.controller.interrupt)

    def _feedback_key(self, request: dict, key: Key) -> None:
        """After `n`: the line is a message to the model that goes with the denial. What is typed
        or pasted is drawn as it comes: cleaned as the composer cleans it."""
        if key.name == "text":
            self.feedback += events.plain_text(key.text)
        elif key.name == "paste":
            self.feedback += " ".join(events.plain_text(key.text).split())
        elif key.name == "backspace":
            self.feedback = self.feedback[:-1]
        elif key.name == "esc" or (key.name == "ctrl+c" and not self.feedback):
            self._stop(request)
        elif key.name in ("ctrl+u", "ctrl+c"):
            self.feedback = ""
        elif key.name == "enter":
            self._answer(request, "deny", self.feedback.strip())

    def _answer(self, request: dict, choice: str, feedback: str) -> None:
        self.feedback = None
        self.panel_choice = 0
        # the Granted/Denied event follows
        self.timeline.permissions.remove(request)
        if request.get("capability") == PLAN_CAPABILITY:
            return self.call(self.controller.proceed_with_plan, choice)
        if "answer" in request:         # a command's question (/rewind's)
            return self.call(self.answer_question, request, choice)
        self.call(self.controller.answer_permission,
                  request.get("tool_use_id", ""), choice, feedback)

    # -- output --

    def frame(self, now: float) -> tuple[list[str], tuple[int, int]]:
        """The live region: timeline tail, permission panel, status line, composer, menu."""
        width, style = self.width, self.style
        busy = bool(self.controller.busy)
        spinner = SPINNER_FRAMES[int(now / TICK_INTERVAL) % len(SPINNER_FRAMES)]
        if self.feedback is not None:
            hint = "typing goes to the denial above · Enter sends it"
        elif self.timeline.permissions:
            hint = "a key or ↑↓ Enter answers · typing writes a message"
        elif busy:
            hint = "Type to steer · Esc to interrupt"
            if events.USER_SHELL_ID in self.timeline.cards:
                hint = "Esc stops the command"
        else:
            hint = "Ask anything · / commands · @ files · ! shell"
        rows, crow, ccol = self.composer.render(width, style, hint)
        menu = self.composer.menu_lines(width, style)
        activity = self.notice or self.timeline.activity(now)
        if not activity and busy:
            activity = "working"
        status = render_status_line(self.controller.status() or {}, activity,
                                    spinner if busy else "·", width, style)
        # rows left above the status line, the composer and its menu
        room = max(1, self.height - 1 - len(rows) - len(menu) - 1)
        panel = self._panel(room)
        live = self.timeline.live_lines(now, style.paint(spinner, "warning"))
        live += [style.paint(f"› queued: !{one_line(command)} · runs when the turn ends", "dim")
                 for command in self.queued_shell]
        asking = self.timeline.permissions[:1]
        if asking and asking[0].get("command"):
            # a command's question (/undo's): its line typed, where it settles once answered
            live += ["", *self.timeline._written(asking[0]["command"], "user")]
        # the newest live lines that fit above the panel
        live = live[max(0, len(live) - room + len(panel)):]
        frame = live + panel + [status] + rows + menu
        lines = [clip(line, width) for line in frame]
        # the cursor in the composer, or at the end of the denial's message
        row, column = len(live) + len(panel) + 1 + crow, ccol
        if self.feedback is not None and panel:
            row, column = len(live) + len(panel) - 1, visible_width(panel[-1])
        cursor = (row, min(column, width - 1))
        # a tiny terminal: the composer wins
        excess = len(lines) - (self.height - 1)
        if excess > 0:
            lines = lines[excess:]
            cursor = (max(0, cursor[0] - excess), cursor[1])
        return lines, cursor

    def _panel(self, room: int) -> list[str]:
        """The open permission question, if any, in at most `room` rows when it can be."""
        if not self.timeline.permissions:
            return []
        request = self.timeline.permissions[0]
        card = self.timeline.cards.get(request.get("tool_use_id", ""))
        return render_permission_panel(request, self.width, self.style, self.feedback,
                                       self.panel_choice, bool(self.composer.text),
                                       card.tool_input if card else None, room)

    def render(self, now: float) -> bytes:
        self.timeline.width = self.width
        self._run_queued_shell()
        if self.transcript_top is not None:
            return self._draw_transcript()
        leaving = self.leave_transcript()
        settled = self.timeline.take_settled()
        lines, cursor = self.frame(now)
        return leaving + self.renderer.draw(settled, lines, cursor)

    def close(self) -> bytes:
        leaving = self.leave_transcript()
        self.timeline.finish()
        return leaving + self.renderer.close(self.timeline.take_settled())

    def clear_screen(self, now: float) -> bytes:
        """Ctrl-L. The live region is erased (no copy of it is kept), then newlines from where it
        was scroll every row above it into the scrollback: the conversation stays there in every
        terminal (CSI 2J discards it in some), and the live region starts again at the bottom,
        where a narrower window cannot push its rows into the scrollback (tmux keeps the blank
        rows below the cursor when it reflows, and a region high on the screen is pushed up)."""
        erase = self.renderer.draw([], [], (0, 0))
        lines, _ = self.frame(now)
        self.renderer = InlineRenderer()
        return erase + (NEWLINE * (self.height - 1) + move_rows(1 - len(lines))).encode()

    # -- the transcript view (Ctrl-R, /transcript) --

    def open_transcript(self) -> None:
        """The conversation on the alternate screen, every card and thinking whole, at its end.
        What settles meanwhile waits, and is printed into the scrollback once the view closes."""
        self.transcript_top = sys.maxsize

    def leave_transcript(self) -> bytes:
        """Close the view; the bytes that give the terminal its main screen back, if it was off."""
        self.transcript_top = None
        leaving = ALT_SCREEN_OFF.encode() if self._view else b""
        self._view = b""
        if self._main_width:
            # tmux reflows the main screen to the width it finds as the view closes
            self.renderer.resize(self._main_width, self.width)
            self._main_width = 0
        return leaving

    def _question_whole(self) -> list[str]:
        """The open question's call in full, at the transcript's end: the panel shows only the
        first lines of a long one (a heredoc's last line may be what it runs)."""
        if not self.timeline.permissions:
            return []
        request = self.timeline.permissions[0]
        card = self.timeline.cards.get(request.get("tool_use_id", ""))
        descriptor = shown(str(request.get("descriptor", "")))
        whole = shown(panel_preview(request, card.tool_input if card else {}))
        title = self.style.paint("⚠ Waiting for your answer; the call in full:", "warning")
        body = descriptor if whole.strip() in descriptor else f"{descriptor}\n{whole}"
        return ["", title, *body.split("\n")]

    def _transcript_key(self, key: Key) -> None:
        page = max(1, self.height - 2)
        # keys typed while a frame is drawn arrive as one run of text: each is a key
        for which in key.text if key.name == "text" else [key.name]:
            if which in TRANSCRIPT_LEAVE:
                self.transcript_top = None
                return
            if which in TRANSCRIPT_ROWS:
                self.transcript_top += TRANSCRIPT_ROWS[which]
            elif which in TRANSCRIPT_PAGES:
                self.transcript_top += TRANSCRIPT_PAGES[which] * page

    def _draw_transcript(self) -> bytes:
        """The screen's rows but the last, then a footer: where the view is and its keys."""
        key = (len(self.log), self.width)
        page = max(1, self.height - 1)
        if self._view_rows[0] != key:
            # at its end (where it opens) the view follows what is added
            if self.transcript_top >= len(self._view_rows[1]) - page:
                self.transcript_top = sys.maxsize
            lines = render_transcript(self.log, self.width, self.style.color, expanded=True)
            lines += self._question_whole()
            rows = [row for line in lines for row in fold(line, self.width)]
            self._view_rows = (key, rows)
        rows = self._view_rows[1]
        self.transcript_top = max(0, min(self.transcript_top, len(rows) - page))
        visible = rows[self.transcript_top:self.transcript_top + page]
        visible += [""] * (page - len(visible))
        last = min(self.transcript_top + page, len(rows))
        footer = (f"q leaves · transcript, rows {self.transcript_top + 1}-{last} of {len(rows)}"
                  " · ↑↓ PgUp PgDn Home End scroll")
        if self.timeline.permissions:
            # the view takes every key: say why nothing moves on
            footer = "⚠ khaelor waits for your answer · " + footer
        footer = self.style.paint(clip(footer, self.width), "dim")
        body = "".join(row + SGR_RESET + ERASE_LINE_END + NEWLINE for row in visible)
        view = (SYNC_BEGIN + CURSOR_HOME + body + footer + ERASE_LINE_END + SYNC_END).encode()
        opening = b"" if self._view else ALT_SCREEN_ON.encode()
        if view == self._view:
            return b""
        self._view = view
        return opening + view

    def resize(self, width: int, height: int) -> None:
        if self._view:
            # the main screen is put away meanwhile: it is reflowed once the view closes
            self._main_width = self._main_width or self.width
        else:
            self.renderer.resize(self.width, width)
        self.width, self.height = width, height


# ════ App shell: raw mode, the event loop, signals ════

def terminal_size(stream) -> tuple[int, int]:
    try:
        columns, rows = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        return 80, 24
    if columns <= 0 or rows <= 0:
        return 80, 24
    return columns, max(rows, 4)


class Shell:
    """run_app's state: the App, the terminal, and one asyncio.TaskGroup holding the input reader,
    the frame ticker and every task the App spawns. A task that fails ends the group: run_app
    restores the terminal and raises its error, once."""

    def __init__(self, controller: Controller, stdin_fd: int, stdout, *, color: bool,
                 history_path: str | os.PathLike | None):
        self.controller = controller
        self.fd, self.stdout = stdin_fd, stdout
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        width, height = terminal_size(stdout)
        self.app = App(controller, style=Style(color), width=width, height=height,
                       history_path=history_path, spawn=self.spawn)
        # the terminal's mode before raw mode; None: not in raw mode
        self.saved: list | None = None
        self.decoder = KeyDecoder()
        # app.quit resolves it with the exit code (app.quit says it once)
        self.done: asyncio.Future[int] = self.loop.create_future()
        self.app.on_exit = self.exit_with
        # set when a frame is wanted; the ticker draws it
        self.wanted = asyncio.Event()
        self.tasks = asyncio.TaskGroup()
        # the group's tasks still running: cancelled once the user has left
        self.running: set[asyncio.Task] = set()

    def exit_with(self, code: int) -> None:
        """The app's exit code; a signal during the teardown finds it already settled."""
        if not self.done.done():
            self.done.set_result(code)

    def write(self, data: bytes) -> None:
        try:
            self.stdout.write(data)
            self.stdout.flush()
        except OSError as error:
            # EIO: the terminal is gone, and this frame came before the SIGHUP that says so
            if error.errno != errno.EIO:
                raise
            self.app.quit(129)

    def enter_raw(self) -> None:
        """Raw mode with bracketed paste."""
        try:
            self.saved = termios.tcgetattr(self.fd)
        except termios.error as exc:
            raise RuntimeError("ui.run_app needs a terminal on stdin; "
                               "use headless mode (-p) otherwise") from exc
        tty.setraw(self.fd, termios.TCSANOW)
        self.write((BRACKETED_PASTE_ON + SHOW_CURSOR).encode())

    def leave_raw(self, last: bytes = b"") -> None:
        """`last` (a final frame), then the terminal as it was; safe to repeat."""
        if self.saved is None:
            return
        saved, self.saved = self.saved, None
        try:
            # the terminal may be gone (SIGHUP): its mode is restored all the same
            with contextlib.suppress(OSError):
                self.write(last + (BRACKETED_PASTE_OFF + SGR_RESET + SHOW_CURSOR).encode())
        finally:
            # a terminal that is gone (EIO after a hangup) has no mode left to restore
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)

    def spawn(self, awaitable) -> None:
        task = self.tasks.create_task(awaitable)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        # what it did (a command's answer, an error line) is drawn
        task.add_done_callback(lambda _: self.wanted.set())

    async def run(self) -> int:
        """The tasks until the user leaves, then controller.quit()."""
        try:
            async with self.tasks:
                self.spawn(self.read_keys())
                self.spawn(self.tick())
                code = await self.done
                # the user has left: nothing more is read or drawn, no task outlives the UI
                for task in self.running:
                    task.cancel()
        except BaseExceptionGroup as group:
            # one failure surfaces as itself, not wrapped in the group's
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        result = self.controller.quit()
        if inspect.isawaitable(result):
            await result
        return code

    async def read_keys(self) -> None:
        """The input reader: keys to the App until the terminal goes away."""
        while True:
            # a lone ESC is Esc, unless more follows soon (an escape sequence)
            wait = ESC_TIMEOUT if self.decoder.pending else None
            try:
                async with asyncio.timeout(wait):
                    await self.readable()
            except TimeoutError:
                self.on_keys(self.decoder.flush())
                continue
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as error:
                # EIO: as in write
                if error.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                # the terminal went away
                return self.app.quit(129)
            self.on_keys(self.decoder.feed(data))

    async def readable(self) -> None:
        """Until stdin_fd has bytes; watched only meanwhile: a stale wakeup would block a read."""
        ready = self.loop.create_future()
        self.loop.add_reader(self.fd, ready.set_result, None)
        try:
            await ready
        finally:
            self.loop.remove_reader(self.fd)

    async def tick(self) -> None:
        """The frame ticker: a frame when one is wanted, at most one per FRAME_INTERVAL, and one
        per TICK_INTERVAL while something moves (the spinner, elapsed times)."""
        # when the next tick is due; None: nothing moves
        next_tick = None
        while True:
            self.wanted.clear()
            # SIGWINCH asks for a frame; the size is read here, so no change is missed
            size = terminal_size(self.stdout)
            if size != (self.app.width, self.app.height):
                self.app.resize(*size)
            data = self.app.render(time.monotonic())
            if data:
                self.write(data)
            if not (self.controller.busy or self.app.timeline.cards or self.app.queued_shell):
                next_tick = None
            elif next_tick is None or next_tick <= self.loop.time():
                # ticks keep their own beat: a frame drawn between two does not push the next
                # back (else it falls in step with what asks for frames, such as resizes)
                next_tick = self.loop.time() + TICK_INTERVAL
            await asyncio.sleep(FRAME_INTERVAL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(next_tick):
                    await self.wanted.wait()

    def on_keys(self, keys: list[Key]) -> None:
        for key in keys:
            if key.name == "ctrl+z":
                self.suspend()
            elif key.name == "ctrl+l" and self.app.transcript_top is None:
                self.write(self.app.clear_screen(time.monotonic()))
            else:
                self.app.on_key(key)
        self.wanted.set()

    def on_event(self, event: dict) -> None:
        """The controller's events, from any thread: the App takes them on the loop's."""
        if threading.get_ident() != self.loop_thread:
            return self.loop.call_soon_threadsafe(self.on_event, event)
        self.app.on_event(event)
        self.wanted.set()

    def suspend(self) -> None:
        """Ctrl-Z: hand the terminal back as it was, stop, and take it again on `fg`."""
        app = self.app
        self.leave_raw(app.leave_transcript() + app.renderer.close(app.timeline.take_settled()))
        # returns once the shell continues us; our handler of an outside `kill -TSTP` is set
        # aside meanwhile, so that the signal stops us
        self.loop.remove_signal_handler(signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGTSTP)
        self.loop.add_signal_handler(signal.SIGTSTP, self.suspend)
        self.enter_raw()


def _stop_handling(loop: asyncio.AbstractEventLoop, signum: int) -> None:
    """The app has closed: a hangup now (the terminal going away sends it after the read that
    ended the app) would kill khaelor mid-teardown, its log unsynced and its processes left
    running. It is quitting already: a hangup is ignored from here on."""
    loop.remove_signal_handler(signum)
    if signum == signal.SIGHUP:
        signal.signal(signum, signal.SIG_IGN)


async def run_app(controller: Controller, *, stdin_fd: int = 0,
                  stdout=None,
                  history_path: str | os.PathLike | None = None,
                  replay: Iterable[dict] = (),
                  color: bool | None = None,
                  notices: Iterable[str] = (), welcome: str = "") -> int:
    """Run the interactive UI until the user quits; see the module docstring. `notices` are said
    once, above the composer, when it opens (an untrusted project config, no OS sandbox)."""
    stdout = stdout or sys.stdout.buffer
    color = detect_color(stdout) if color is None else color
    shell = Shell(controller, stdin_fd, stdout, color=color, history_path=history_path)
    app = shell.app
    signals = {signal.SIGWINCH: shell.wanted.set, signal.SIGTSTP: shell.suspend,
               signal.SIGTERM: lambda: app.quit(143),
               signal.SIGHUP: lambda: app.quit(129)}
    # undone in reverse order, on every path
    with contextlib.ExitStack() as undo:
        shell.enter_raw()
        # the mode comes back even if the last frame fails
        undo.callback(shell.leave_raw)
        undo.callback(lambda: shell.leave_raw(app.close()))
        replay = list(replay)
        app.log = [event for event in replay if event.get("type") in events.DURABLE]
        lines = render_transcript(replay, app.width, color, max_turns=REPLAY_TURNS,
                                  open_cards=app.timeline.cards)
        if welcome:
            # above the replay, as it was above the conversation when it was live
            app.timeline.note(welcome)
            lines = app.timeline.take_settled() + [""] * bool(lines) + lines
        shell.write("".join(line + NEWLINE for line in lines).encode())
        for signum, handler in signals.items():
            try:
                shell.loop.add_signal_handler(signum, handler)
            except (NotImplementedError, RuntimeError, ValueError):
                # not the main thread: the caller handles signals
                continue
            undo.callback(_stop_handling, shell.loop, signum)
        undo.callback(controller.subscribe(shell.on_event))
        for notice in notices:
            app.timeline.note("⚠ " + notice)
        return await shell.run()
