"""OpenCode's edit-tool tests, run through our real edit tool (tests/data/opencode_edit.json).

Each case is a file's content, an edit call and OpenCode's outcome: the file's exact content
after, or the kind of error. Our edit must give the same outcome, except where the case says
`expect_ours`: there our outcome is kept on purpose (stricter or more careful) and the case gives
it as `ours`. Every case runs on a real file in a temp project, read before it is edited.
"""

import json
from pathlib import Path

import pytest

from test_tools import box  # noqa: F401  (the fixture: a Toolbox on a temp project)

CORPUS = json.loads((Path(__file__).parent / "data" / "opencode_edit.json").read_text())
CASES = CORPUS["cases"]

# OpenCode's error kinds, as the `error` our edit tool puts in its result's meta.
ERROR_KINDS = {
    "not found": "not_found",
    "multiple matches": "ambiguous",
    "identical strings": "no_change",
    "is a directory": "is_directory",
    "empty old_string": "empty_old_string",
}


def wanted(case: dict) -> dict:
    if "expect_ours" in case:
        return case["ours"]
    return case["opencode"]


def prepare(box, case: dict) -> Path:
    target = box.root / case.get("path", "f.txt")
    if case.get("directory"):
        target.mkdir(parents=True)
    elif case["before"] is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(case["before"].encode("utf-8"))
        box.call("read", file_path=str(target.relative_to(box.root)))
    return target


def edit(box, target: Path, old: str, new: str, replace_all: bool):
    shown = str(target.relative_to(box.root))
    return box.call("edit", file_path=shown, old_string=old, new_string=new,
                    replace_all=replace_all)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_opencode_edit_case(box, case):  # noqa: F811
    target = prepare(box, case)
    result = edit(box, target, case["old_string"], case["new_string"], case["replace_all"])
    outcome = wanted(case)
    if "error" in outcome:
        assert result.is_error, result.text
        assert result.meta.get("error") == ERROR_KINDS[outcome["error"]], result.text
        assert case.get("message", "") in result.text
        if case["before"] is None:
            assert case.get("directory") or not target.exists()
        else:
            unchanged = case["before"].encode("utf-8")
            assert target.read_bytes() == unchanged, "a refused edit changed the file"
        return
    assert not result.is_error, result.text
    if "added" in case:
        assert (result.meta["added"], result.meta["removed"]) == (case["added"], case["removed"])
    second = case.get("then")
    if second:
        result = edit(box, target, second["old_string"], second["new_string"], False)
        assert not result.is_error, result.text
    if "contains" in outcome:
        # OpenCode's test asserts only this much.
        assert outcome["contains"] in target.read_text()
        return
    assert target.read_bytes() == outcome["after"].encode("utf-8")


def test_every_case_names_its_source_and_every_kept_difference_says_why():
    files = {entry.split(" ")[0] for entry in CORPUS["source"]["files"]}
    for case in CASES:
        assert case["source"]["file"] in files and case["source"]["test"], case["name"]
        assert ("ours" in case) == ("expect_ours" in case), case["name"]
        if "expect_ours" in case:
            assert case["ours"] != case["opencode"], case["name"]
            assert len(case["expect_ours"].strip()) > 20, case["name"]
    kinds = {wanted(case).get("error") for case in CASES} - {None}
    assert kinds == set(ERROR_KINDS), "every error kind is exercised"
    assert len(CASES) >= 92          # the measured corpus: no case dropped silently


def test_a_block_quoted_without_its_indentation_keeps_the_files(box):  # noqa: F811
    # The table cases above in Python, where losing the indentation breaks the program.
    target = box.root / "f.py"
    target.write_text("def f(x):\n    if x:\n        return 1\n    return 0\n")
    box.call("read", file_path="f.py")
    result = edit(box, target, "if x:\nreturn 1", "if x:\nreturn 2", False)
    assert not result.is_error, result.text
    assert result.meta["strategy"] == "line_trimmed"
    assert target.read_text() == "def f(x):\n    if x:\n        return 2\n    return 0\n"


# aider's search/replace tests (Aider-AI/aider tests/basic/test_editblock.py, the
# replace_most_similar_chunk cases): (test, file, old_string, new_string, file after). aider
# replaces the first of several matches; our edit, as Claude Code's, refuses an ambiguous one.
AIDER_CASES = [
    ("test_replace_part_with_missing_varied_leading_whitespace",
     "\n    line1\n    line2\n        line3\n    line4\n", "line2\n    line3\n",
     "new_line2\n    new_line3\n", "\n    line1\n    new_line2\n        new_line3\n    line4\n"),
    ("test_replace_part_with_missing_leading_whitespace", "    line1\n    line2\n    line3\n",
     "line1\nline2\n", "new_line1\nnew_line2\n", "    new_line1\n    new_line2\n    line3\n"),
    ("test_replace_part_with_just_some_missing_leading_whitespace",
     "    line1\n    line2\n    line3\n", " line1\n line2\n", " new_line1\n     new_line2\n",
     "    new_line1\n        new_line2\n    line3\n"),
    # a blank first line the file does not have: not found, before trimmed_boundary trimmed lines
    ("test_replace_part_with_missing_leading_whitespace_including_blank_line",
     "    line1\n    line2\n    line3\n", "\n  line1\n  line2\n", "  new_line1\n  new_line2\n",
     "    new_line1\n    new_line2\n    line3\n"),
    ("test_full_edit", "one\ntwo\nthree\n", "two\n", "new\n", "one\nnew\nthree\n"),
    ("test_replace_multiple_matches (ours: ambiguous)", "line1\nline2\nline1\nline3\n",
     "line1\n", "new_line\n", None),
    ("test_replace_multiple_matches_missing_whitespace (ours: ambiguous)",
     "    line1\n    line2\n    line1\n    line3\n", "line1\n", "new_line\n", None),
]


@pytest.mark.parametrize("test, before, old, new, after", AIDER_CASES,
                         ids=[case[0] for case in AIDER_CASES])
def test_aider_edit_block_case(box, test, before, old, new, after):  # noqa: F811
    check_edit_case(box, before, old, new, after, "ambiguous")


def check_edit_case(box, before, old, new, after, error):
    """Edit a read f.txt holding `before`: it then holds `after`, or (None) is refused as `error`."""
    target = box.root / "f.txt"
    target.write_text(before)
    box.call("read", file_path="f.txt")
    result = edit(box, target, old, new, False)
    if after is None:
        assert result.is_error and result.meta["error"] == error, result.text
        assert target.read_text() == before
    else:
        assert not result.is_error, result.text
        assert target.read_text() == after


# Codex's apply-patch context matching (openai/codex codex-rs/apply-patch/src/seek_sequence.rs:
# its tests, and the typographic punctuation its last pass reads as ASCII): (test, file,
# old_string, new_string, file after; None: not found).
CODEX_CASES = [
    ("test_exact_match_finds_sequence", "foo\nbar\nbaz\n", "bar\nbaz", "BAR\nBAZ",
     "foo\nBAR\nBAZ\n"),
    ("test_rstrip_match_ignores_trailing_whitespace", "foo   \nbar\t\t\n", "foo\nbar",
     "FOO\nBAR", "FOO\nBAR\n"),
    ("test_trim_match_ignores_leading_and_trailing_whitespace", "    foo   \n   bar\t\n",
     "foo\nbar", "FOO\nBAR", "    FOO\n   BAR\n"),
    ("test_pattern_longer_than_input_returns_none", "just one line\n", "too\nmany\nlines", "x",
     None),
    ("normalise: an em dash typed as a hyphen", "x = a \u2014 b\n", "x = a - b", "x = a + b",
     "x = a + b\n"),
    ("normalise: an en dash and curly double quotes typed plain",
     "x = a \u2013 b  # \u201cnote\u201d\n", 'x = a - b  # "note"', 'x = a + b  # "note"',
     "x = a + b  # \u201cnote\u201d\n"),
    ("normalise: a non-breaking space typed as a space", "s = 'a\u00a0b'\n", "s = 'a b'",
     "s = 'a c'", "s = 'a c'\n"),
    ("normalise: curly quotes typed where the file has straight ones", "s = 'it'\n",
     "s = \u2018it\u2019", "s = \u2018ok\u2019", "s = 'ok'\n"),
    ("normalise: a minus sign typed as a hyphen", "y = 2 \u2212 1\n", "y = 2 - 1", "y = 3 - 1",
     "y = 3 - 1\n"),
]


@pytest.mark.parametrize("test, before, old, new, after", CODEX_CASES,
                         ids=[case[0] for case in CODEX_CASES])
def test_codex_seek_sequence_case(box, test, before, old, new, after):  # noqa: F811
    check_edit_case(box, before, old, new, after, "not_found")
