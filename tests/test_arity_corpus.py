""""Always" never grants more than was asked, measured against OpenCode's arity dictionary (issue 11, item 5).

tests/data/opencode_arity.json holds OpenCode's prefix->arity table and command->prefix cases (its
arity test, and the example command each dictionary entry's comment gives). For every case the
pattern khaelor would save on "always" must be no broader than OpenCode's `prefix *`: the exact
command, or `words *` whose words start with OpenCode's prefix. Multi-level CLIs must get the
narrowest rule (`aws s3 ls *`, never `aws *`). A suggestion exists only when the decision is "ask":
commands allowed without a question have none and are counted and reported, not passed silently.
Nothing here runs a command; each is only passed to permissions.check as a string.
"""

import json
from pathlib import Path

import pytest

import permissions

CORPUS = json.loads((Path(__file__).parent / "data" / "opencode_arity.json").read_text())
GLOB_CHARACTERS = set("*?[")
COMMAND_CAPABILITIES = ("process.execute", "git.modify", "network.access")
# The measured figures of the 156 cases, pinned (lower them when they improve):
MAX_SKIPPED = 9          # no command rule to judge: allowed (cat, ls ...) 8, decided by a path 1
MAX_NO_SUGGESTION = 2    # asked with no suggestion at all (a vacuous pass if it were common)

# (command, the words the saved rule must at least name). The verb is part of the command for
# these CLIs, so a rule that stops before it would also allow the destructive siblings.
MULTI_LEVEL = [
    ("aws s3 ls b", "aws s3 ls"),
    ("aws ec2 describe-instances --region eu-west-1", "aws ec2 describe-instances"),
    ("aws s3 rm s3://bucket/key", "aws s3 rm"),
    ("gcloud compute instances list", "gcloud compute instances list"),
    ("gcloud config set project demo", "gcloud config set"),
    ("gcloud auth print-access-token", "gcloud auth print-access-token"),
    ("az storage blob list --container-name c", "az storage blob list"),
    ("az vm list", "az vm list"),
    ("kubectl get pods", "kubectl get"),
    ("kubectl delete pod api-1", "kubectl delete"),
    ("kubectl rollout restart deploy/api", "kubectl rollout restart"),
    ("docker compose up -d", "docker compose up"),
    ("docker image prune", "docker image prune"),
    ("docker volume rm data", "docker volume rm"),
    ("gh pr list", "gh pr list"),
    ("gh repo delete octo/demo", "gh repo delete"),
    ("terraform workspace select prod", "terraform workspace select"),
    ("doctl kubernetes cluster list", "doctl kubernetes cluster list"),
    ("helm repo add bitnami https://charts.example.test", "helm repo add"),
    ("vault kv get secret/api", "vault kv get"),
    ("npm run test", "npm run test"),
]


@pytest.fixture
def project(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(tmp_path / "khaelor-home"))
    root = tmp_path / "project"
    (root / ".git").mkdir(parents=True)
    (root / "file.txt").write_text("hello\n")
    (root / "script.sh").write_text("echo hi\n")
    return root


def words_of(text):
    return text.split()


def no_broader(suggestion, command, prefix):
    """True when every command the saved pattern matches is also matched by `prefix *`."""
    prefix_words = words_of(prefix)
    if not GLOB_CHARACTERS & set(suggestion):       # an exact command: this one, or one under the prefix
        exact = words_of(suggestion)
        return exact == words_of(command) or exact[:len(prefix_words)] == prefix_words
    if not suggestion.endswith(" *") or GLOB_CHARACTERS & set(suggestion[:-2]):
        return False       # a wildcard anywhere but a final " *" can match outside the prefix
    literal = words_of(suggestion[:-2])
    return literal[:len(prefix_words)] == prefix_words


def suggest(command, project):
    return permissions.check("bash", command, project, permissions.load_rules([]))


def test_always_is_never_broader_than_opencode(project):
    allowed, by_path, unsuggested, broader = [], [], [], []
    for case in CORPUS["cases"]:
        result = suggest(case["command"], project)
        if result["decision"] == "allow":
            allowed.append(case["command"])
        elif result["capability"] not in COMMAND_CAPABILITIES:
            by_path.append(case["command"])      # "cd /path/to/dir": the grant would be for that path
        elif result["decision"] == "ask" and result["suggestion"] is None:
            unsuggested.append(case["command"])
        elif result["decision"] == "ask" and not no_broader(result["suggestion"], case["command"], case["prefix"]):
            broader.append(f"{case['command']!r}: saves {result['suggestion']!r}, OpenCode {case['prefix']} *")
    total = len(CORPUS["cases"])
    figure = (f"arity cases: {total}, allowed without a question (no suggestion) {len(allowed)}, "
              f"decided by a path {len(by_path)}, asked without a suggestion {len(unsuggested)}, "
              f"broader than OpenCode {len(broader)}")
    print(f"\n{figure}\nallowed: {allowed}\nby a path: {by_path}\nasked without a suggestion: {unsuggested}")
    assert not broader, f"{figure}:\n" + "\n".join(broader)
    skipped = allowed + by_path
    assert len(skipped) == MAX_SKIPPED, f"{figure}; skipped: {skipped}"
    assert len(unsuggested) == MAX_NO_SUGGESTION, f"{figure}; no suggestion: {unsuggested}"


@pytest.mark.parametrize("command, narrowest", MULTI_LEVEL)
def test_multi_level_cli_gets_the_narrowest_rule(project, command, narrowest):
    result = suggest(command, project)
    assert result["decision"] == "ask", result
    suggestion = result["suggestion"]
    if result["destructive"]:
        # it asks every time, whatever the rules (gh repo delete): an "always" would never apply
        assert suggestion is None, result
        return
    assert suggestion, f"{command!r} asks but offers no 'always'"
    cli = words_of(command)[0]
    assert suggestion != f"{cli} *", f"{command!r} would save {suggestion!r}, which allows every {cli} command"
    assert no_broader(suggestion, command, narrowest), f"{command!r} saves {suggestion!r}; at most {narrowest} *"


def test_disputed_cases_still_ask_and_stay_narrow(project):
    """OpenCode counts an option as a subcommand in a few of its own examples ("mysql -u"), so its
    prefix is no command name; the saved rule must still be no broader than it (the exact command
    passes), because `mysql *` or `python *` would allow anything those programs can run."""
    for case in CORPUS["disputed"]:
        result = suggest(case["command"], project)
        assert result["decision"] != "allow", (case, result)
        if result["suggestion"]:
            assert no_broader(result["suggestion"], case["command"], case["prefix"]), (case, result)
