"""permissions.py: what a tool call may do, decided before it runs.

Owns: judging subjects, never tools (tools.permission_subject says what a call is judged on):
"bash" a shell command line, "read" a path read, "write" a path written, "feed" text fed to a
running process, "held" an act on a process judged when it started; any other kind is denied.
The capabilities a subject needs (file.read, file.write.project, filesystem.outsideProject,
process.execute, git.modify, network.access), rules {capability, pattern, action} evaluated
last-match-wins, the layers rules come from and whether a layer may grant (the trust model), the
POLICY table (one row per program: what it is, its read-only options, its "always" arity) and the
one option parser that reads it, the hardline floor beneath the rules and the destroy-work tier,
shell-word parsing of bash commands, "always" suggestions, Claude Code's rule syntax mapped onto
all this, the modes (plan, acceptEdits), the sandbox shape a decision grants (`Decision.confine`,
a sandbox.Confine) and the config-dict edit that persists a grant.
Must not: import our other modules but sandbox (the one secret vocabulary, Confine and the glob
translator are defined there), write files or run anything. It only reads the world:
os.path.realpath resolves symlinks, glob expands wildcards, expanduser reads $HOME (and the user
database for ~user), a bounded walk looks for secret files under a directory a command searches
recursively (and for what a tree copied or removed holds), PATH's entries are looked at to see
whether a program would come from inside the project, and the diff patch applies and the archive
tar or unzip extracts are read for the files they name.

What a rule's pattern is matched against (fnmatch, case-sensitive; `*` also crosses `/`):
  file.read, file.write.project  the project-relative POSIX path after resolving `..` and
                                 symlinks: "src/app.py"
  filesystem.outsideProject      the absolute resolved path: "/etc/hosts" (a "~" starting a
                                 pattern is expanded)
  process.execute, git.modify,   one simple command's words, each quoted as a user would type it
  network.access                 (shlex.quote), joined by single spaces: "git commit -m 'fix bug'".
                                 A pattern ending in " *" also matches the bare command ("ls *"
                                 matches "ls").
A bash line is split into the simple commands it runs (&&, ||, ;, |, &, newlines, $( ), backticks,
subshells, heredocs, bash -c, eval, find -exec); each needs one of process.execute / git.modify /
network.access, plus file.read or filesystem.outsideProject for each argument that may name a file,
and file.write.project for each output redirection (and, met only by a deny or ask a rule file
wrote, for each file its POLICY row says it writes: cp x f, sed -i f). Every request is judged; the
strictest answer wins (deny > ask > allow). An allow naming a program reaches its options that
write or run more (git log --output, find -fprint, awk's system()) only by naming them (_ESCAPES).

Silence is earned, not assumed: by default a command runs without asking only when it is provably
read-only (POLICY below: literal words, listed commands and options spelled out, no writing
redirection). Grammar the parser does not follow exactly ({fd}< redirections, $"...", brace
expansion, cd -) is never silent, and judging stops after DECIDE_BUDGET_SECONDS of CPU time: past
it, the call asks.
Trust comes only from the user: rules from the user's own files grant; a repository's files may
tighten (ask, deny) at once but grant nothing until `khaelor trust` recorded their hash.

"Always" suggestions: a bash command gets its POLICY arity prefix plus " *" ("git push *");
destructive programs (rm, dd, curl, sudo ...), options before the subcommand, and asks made by a
specific rule get the exact command; a line with operators or redirections gets none, and so does
a command that destroys work in the repository (it asks every time). A project write suggests the
file's directory subtree ("src/api/*", or the file itself at the root); a secret read or anything
outside the project suggests the exact path.
"""

import contextvars
import fnmatch
import gc
import glob
import itertools
import json
import os
import posixpath
import re
import shlex
import stat
import struct
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import sandbox

# --------------------------------------------------------------- policy tables

# The capabilities a tool call may need (see the module docstring for what each rule matches).
FILE_READ = "file.read"
FILE_WRITE = "file.write.project"
OUTSIDE = "filesystem.outsideProject"
EXECUTE = "process.execute"
GIT_MODIFY = "git.modify"
NETWORK = "network.access"
CAPABILITIES = (FILE_READ, FILE_WRITE, OUTSIDE, EXECUTE, GIT_MODIFY, NETWORK)
# in order of strictness
ACTIONS = ("allow", "ask", "deny")
_STRICTNESS = {action: n for n, action in enumerate(ACTIONS)}
_COMMAND_CAPABILITIES = (EXECUTE, GIT_MODIFY, NETWORK)
_RULE_KEYS = ("capability", "pattern", "action")
# and optional: "scope", "read" or "write" (an "always" to reading an outside path saves "read")
_RULE_SCOPES = ("read", "write")

# entries a recursive search's tree is scanned for secrets, at most
_SECRET_WALK_CAP = 20_000


class Program(NamedTuple):
    """One row of POLICY: what a program (or `git SUB`) is to the judge of a bash line."""
    # what it is, any of: read (read-only by intent, with the options below), modify (a git
    # subcommand that changes the repository), known (a git built-in: not an alias), forms (a git
    # subcommand read-only only in the shapes of its three-word rows), wrapper (runs the rest of its
    # words), shell, interpreter, runner (runs what it reads), installer (a package manager), exact
    # (an "always" names the whole command: rm *, curl * would grant far more than the user saw),
    # moded (an option picks what it does, tar -t lists, -x extracts: an "always" keeps it),
    # pattern (its first operand is a pattern, not a file), recursive (may read a whole tree: grep
    # -r), what it writes (see _written): writes (every operand: rm, tee), writes-last (cp SRC
    # DEST), writes-rest (all but the first: chmod MODE F), writes-second (uniq IN OUT), writes-of
    # (dd of=F), in-place (every operand, given -i: sed -i, perl -i), into (its last operand may be
    # a directory the others go into: cp F DIR/), patches (patch: its file, or the diff's), counts
    # (-5 is a count: head -5, git log -5), data (every word is data: echo, test), sets (changes
    # what later commands run: export, read, alias, hash -p), disk and power (the floor's)
    kinds: str = ""
    # read: the options that keep it read-only; otherwise (a wrapper, tar) its options that take a
    # value (both written as below: "n:" and "lines=" take a value)
    options: tuple[str, str] = ("", "")
    # the subcommands that download or publish, comma-separated ("" among them: the bare command);
    # "*": it always reaches the network (curl, `git push`)
    network: str = ""
    # how many leading words name the command for "always" (`git push origin` -> `git push *`); 0:
    # its leading plain words (see _arity)
    arity: int = 0
    # wrapper: plain words before the command it runs (timeout 5 CMD, chroot DIR CMD)
    skip: int = 0
    # a read-only shape of a forms subcommand: how many plain words it reads with at most (None:
    # any number)
    most: int | None = None

    def has(self, kind: str) -> bool:
        return kind in self.kinds.split()

    def takes_value(self, option: str) -> bool:
        """Whether option ("-n", "--lines", as _parse names it) takes a value."""
        short, longs = self.options
        if option.startswith("--"):
            return option[2:] + "=" in longs.split() and option[2:] not in longs.split()
        return option[1:] + ":" in short

    def reads_value(self, option: str) -> bool:
        """takes_value, as the program reads its words: a long option also by a prefix of one
        that takes a value (getopt_long reads `--max 1` as --max-count 1, `sudo --us root`)."""
        if not option.startswith("--") or self.lists(option):
            return self.takes_value(option)
        longs = self.options[1].split()
        valued = [e[:-1] for e in longs if e.endswith("=") and e[:-1] not in longs]
        return _abbreviates(option, *valued)

    def lists(self, option: str) -> bool:
        """Whether option is among the row's options."""
        short, longs = self.options
        if option.startswith("--"):
            return option[2:] in {e.rstrip("=") for e in longs.split()}
        return option[1] in short.replace(":", "")


def _each(names: str, row: Program, prefix: str = "") -> dict[str, Program]:
    """The same row for each of names (comma-separated when a name holds a space)."""
    separator = "," if "," in names else None
    return {prefix + " ".join(name.split()): row for name in names.split(separator)}


# The read-only options, in "read" rows. Short options in getopt form ("n:" takes a value, given
# attached or as the next word; an option whose value is optional, like date -I, is listed as a
# plain flag); long options, "=" when they take one. A value given as the next word must not look
# like an option, so no option can hide behind one. A long option counts only spelled out (the
# program expands an abbreviation among all its options, listed or not). Everything absent asks.
# Repository configuration cannot run code in the read-only git subcommands either: tools.py's
# environment for read-only commands turns off hooks, fsmonitor, external diff, pagers, textconv
# and filters. (sed reads only with scripts that print lines by number (_SED_PRINT); xxd is not
# listed: its options are single-dash words like -ps, which getopt-style parsing would misread.)
_GREP = ("EFGPiyvwxcLlmoqsbHhnTZzrRUaIe:f:m:A:B:C:d:D:", """
    extended-regexp fixed-strings basic-regexp perl-regexp regexp= file=
    ignore-case no-ignore-case word-regexp line-regexp count color colour
    color= colour= files-without-match files-with-matches max-count=
    only-matching quiet silent no-messages byte-offset with-filename
    no-filename label= line-number initial-tab null null-data
    after-context= before-context= context= text binary-files= devices=
    directories= exclude= exclude-dir= include= recursive
    dereference-recursive line-buffered invert-match""")
# (not -c: it reads the files its list names, which no rule sees)
_SUMS = ("btwz", """
    binary text tag quiet status warn strict zero ignore-missing""")
_GIT_LOG = ("pusznNmtrMCRBDiEFS:G:L:U:O:", """
    oneline stat stat= shortstat numstat name-only name-status graph all
    branches branches= tags tags= remotes remotes= decorate decorate=
    no-decorate format= pretty pretty= abbrev-commit abbrev abbrev=
    no-abbrev-commit no-abbrev author= committer= since= until= after=
    before= grep= all-match invert-grep regexp-ignore-case extended-regexp
    fixed-strings perl-regexp max-count= skip= reverse follow no-merges
    merges min-parents= max-parents= first-parent date= relative-date patch
    no-patch unified= color color= no-color word-diff word-diff=
    ignore-space-change ignore-all-space ignore-blank-lines
    ignore-space-at-eol left-right cherry-pick cherry-mark cherry topo-order
    date-order author-date-order full-history simplify-by-decoration
    ancestry-path boundary source parents children summary diff-filter=
    find-renames find-renames= find-copies find-copies= minimal patience
    histogram diff-algorithm= full-diff cc combined raw binary full-index
    src-prefix= dst-prefix= no-prefix relative relative= exit-code quiet
    cached staged merge-base submodule submodule= dirstat dirstat= text
    function-context compact-summary no-renames no-textconv no-ext-diff
    ignore-submodules ignore-submodules= check name-rev notes no-notes
    show-notes expand-tabs no-expand-tabs log-size no-walk no-walk= do-walk
    walk-reflogs grep-reflog= count in-reverse remerge-diff""")
# where `git config` reads from, and how it shows what it read
_GIT_CONFIG_READ = ("z", "global system local worktree show-origin show-scope name-only null "
                         "includes no-includes type= default=")

POLICY: dict[str, Program] = {
    "ls": Program("read", ("aAbBcCdfFgGhHiklLmnNopqQrRsStuUvxXZ1T:w:I:", """
        all almost-all escape ignore-backups classify file-type directory dired full-time
        group-directories-first no-group human-readable si dereference
        dereference-command-line inode kibibytes numeric-uid-gid literal hide-control-chars
        show-control-chars quote-name recursive reverse size sort= time= time-style= color
        color= width= tabsize= ignore= hide= format= indicator-style= quoting-style=
        block-size= context zero""")),
    "cat": Program("read", ("AbeEnstTuv", """
        show-all number-nonblank show-ends number squeeze-blank show-tabs show-nonprinting""")),
    **_each("""
        head tail""", Program("read counts", ("c:n:qvz", """
        bytes= lines= quiet silent verbose zero-terminated"""))),
    "wc": Program("read", ("clmwL", """
        bytes chars lines words max-line-length total=""")),
    "pwd": Program("read", ("LP", "")),
    **_each("whoami cksum rev sleep numfmt", Program("read", ("", ""))),
    **_each("true false test [ echo", Program("read data")),
    "which": Program("read", ("as", "all")),
    "type": Program("read", ("afptP", "")),
    "id": Program("read", ("gGnruzZ", """
        group groups name real user zero context""")),
    "uname": Program("read", ("asnrvmpio", """
        all kernel-name nodename kernel-release kernel-version machine processor
        hardware-platform operating-system""")),
    "date": Program("read", ("uRId:r:", """
        utc universal rfc-email iso-8601 iso-8601= rfc-3339= date= reference= debug""")),
    "stat": Program("read", ("Lftc:", """
        dereference file-system terse format= printf=""")),
    "du": Program("read", ("0abchHklLmsSxd:t:B:", """
        null all apparent-size bytes total human-readable si summarize max-depth=
        one-file-system exclude= threshold= block-size= time inodes dereference""")),
    "df": Program("read", ("ahHiklPTt:x:B:", """
        all human-readable si inodes local portability print-type type= exclude-type= total
        output output= block-size=""")),
    # (tree takes -L's, -P's and -I's value from the next word, the rest as options: -Lo 2 out)
    "tree": Program("read", ("adfgilpsuDFhCnNqrtvxAJXLPI", """
        noreport dirsfirst charset= filelimit= gitignore prune matchdirs ignore-case du si
        sort= version""")),
    **_each("grep egrep fgrep", Program("read pattern recursive", _GREP)),
    "rg": Program("read pattern recursive", ("iSsFwxvcnNHhlLoquUaje:g:t:T:m:A:B:C:d:M:r:E:", """
        ignore-case smart-case case-sensitive fixed-strings word-regexp line-regexp
        invert-match count count-matches files-with-matches files-without-match files
        line-number no-line-number with-filename no-filename only-matching regexp= glob=
        iglob= type= type-not= max-count= max-depth= hidden no-ignore no-ignore-vcs follow
        context= after-context= before-context= heading no-heading color= json vimgrep
        sort= sortr= multiline multiline-dotall pcre2 trim column no-column null stats
        max-filesize= threads= type-list unrestricted passthru replace= quiet text binary
        max-columns= encoding=""")),
    "sort": Program("read", ("bdfgiMhnRrVcCmsuzk:t:S:", """
        ignore-leading-blanks dictionary-order ignore-case general-numeric-sort
        ignore-nonprinting month-sort human-numeric-sort numeric-sort random-sort reverse
        version-sort check check= merge key= field-separator= stable unique zero-terminated
        buffer-size= parallel= debug""")),
    "cut": Program("read", ("nszb:c:d:f:", """
        bytes= characters= delimiter= fields= complement only-delimited output-delimiter=
        zero-terminated""")),
    "tr": Program("read", ("cCdst", """
        complement delete squeeze-repeats truncate-set1""")),
    "sed": Program("read pattern exact in-place", ("ne:", "quiet silent")),
    "diff": Program("read recursive", ("abBdEilNpqrsStTuwyZU:C:x:X:I:W:", """
        brief report-identical-files unified unified= context context= side-by-side
        recursive new-file ignore-case ignore-all-space ignore-space-change
        ignore-blank-lines ignore-matching-lines= text strip-trailing-cr exclude=
        exclude-from= label= minimal color color= no-dereference normal
        ignore-tab-expansion expand-tabs show-c-function show-function-line= width=
        suppress-common-lines from-file= to-file= unidirectional-new-file""")),
    "cmp": Program("read", ("blsi:n:", """
        print-bytes ignore-initial= verbose bytes= quiet silent""")),
    "basename": Program("read", ("asz", "multiple suffix= zero")),
    "dirname": Program("read", ("z", "zero")),
    "realpath": Program("read", ("eLmPqsz", """
        canonicalize-existing canonicalize-missing logical physical quiet strip no-symlinks
        zero relative-to= relative-base=""")),
    "readlink": Program("read", ("efmnqsvz", """
        canonicalize canonicalize-existing canonicalize-missing no-newline quiet silent
        verbose zero""")),
    "nl": Program("read", ("pb:d:f:h:i:l:n:s:v:w:", "")),
    **_each("md5sum sha1sum sha256sum sha512sum b2sum", Program("read", _SUMS)),
    "file": Program("read", ("bcEhiLNknprsv0F:e:m:P:", """
        brief mime mime-type mime-encoding dereference no-dereference keep-going raw
        special-files""")),
    # not -P/--pager, -H/--html (a browser), -p (preprocessors), -C (a config), -M (pages from
    # elsewhere), -c and -u (they write man's caches), -l (a page's .so reads any file): those ask
    "man": Program("read", ("adDfhiIkKwWL:m:S:s:e:E:R:", """
        all apropos whatis where path location where-cat location-cat ignore-case
        match-case regex wildcard names-only sections= locale= systems= extension= encoding=
        recode= no-hyphenation no-justification help version usage debug default""")),
    "uniq": Program("read writes-second", ("cdDiuzf:s:w:", """
        count repeated all-repeated unique ignore-case skip-fields= skip-chars=
        check-chars= zero-terminated""")),
    "comm": Program("read", ("123z", """
        check-order nocheck-order output-delimiter= total zero-terminated""")),
    "paste": Program("read", ("szd:", "delimiters= serial zero-terminated")),
    "fold": Program("read", ("bsw:", "bytes spaces width=")),
    "expand": Program("read", ("it:", "initial tabs=")),
    "tac": Program("read", ("brs:", "before regex separator=")),
    "nproc": Program("read", ("", "all")),
    "seq": Program("read", ("wf:s:", "equal-width format= separator=")),
    "od": Program("read", ("bcdfiloxsvwA:j:N:t:", """
        address-radix= skip-bytes= read-bytes= format= output-duplicates width=""")),
    "hexdump": Program("read", ("bcCdovxn:s:e:f:", "")),
    "strings": Program("read", ("afwn:t:e:", """
        all print-file-name bytes= radix= encoding=""")),
    "base64": Program("read", ("diw:", "decode ignore-garbage wrap=")),
    "jq": Program("read pattern", ("rjacnsSeCMt", """
        raw-output join-output ascii-output compact-output null-input slurp sort-keys
        exit-status color-output monochrome-output tab indent= arg= argjson= raw-input""")),
    "git status": Program("read", ("sbvzu:", """
        short branch porcelain porcelain= long verbose untracked-files untracked-files=
        ignored ignored= ignore-submodules ignore-submodules= show-stash ahead-behind
        no-ahead-behind renames no-renames find-renames find-renames= column no-column null""")),
    **_each("log show", Program("read counts", _GIT_LOG), prefix="git "),
    "git diff": Program("read", _GIT_LOG),
    "git shortlog": Program("read counts", ("nsec", """
        numbered summary email committer format= group= all""")),
    "git blame": Program("read", ("blstfnseMwcCL:S:", """
        porcelain line-porcelain incremental show-name show-number show-email show-stats
        date= root minimal score-debug abbrev= ignore-rev= ignore-revs-file= color-lines
        color-by-age""")),
    "git branch": Program("read", ("arvl", """
        list all remotes verbose merged merged= no-merged no-merged= contains contains=
        no-contains no-contains= show-current format= sort= points-at= color color=
        no-color column no-column ignore-case""")),
    "git tag": Program("read", ("ln:", """
        list contains= no-contains= points-at= merged= no-merged= sort= format= column
        no-column color ignore-case""")),
    "git describe": Program("read", ("", """
        tags all always long abbrev= match= exclude= dirty dirty= contains first-parent
        candidates= exact-match""")),
    "git rev-parse": Program("read", ("q", """
        show-toplevel abbrev-ref abbrev-ref= short short= verify quiet git-dir
        is-inside-work-tree is-inside-git-dir show-prefix show-cdup symbolic
        symbolic-full-name all branches tags remotes git-common-dir absolute-git-dir
        is-bare-repository is-shallow-repository show-superproject-working-tree sq-quote
        default= since= until= local-env-vars show-object-format path-format= revs-only
        no-revs flags no-flags""")),
    "git ls-files": Program("read", ("cdmoiskutvzfx:X:", """
        cached deleted modified others ignored stage unmerged killed exclude= exclude-from=
        exclude-per-directory= exclude-standard error-unmatch full-name recurse-submodules
        abbrev abbrev= eol directory no-empty-directory format= debug sparse""")),
    "git ls-tree": Program("read", ("rdtlz", """
        name-only name-status full-name full-tree abbrev abbrev= long object-only format=""")),
    "git cat-file": Program("read", ("tpsev", "allow-unknown-type")),
    "git merge-base": Program("read", ("a", """
        all octopus independent is-ancestor fork-point""")),
    "git show-ref": Program("read", ("dqs", """
        heads tags head verify dereference hash hash= abbrev abbrev= quiet exists branches""")),
    "git grep": Program("read", ("ivwlLnhHcEFGPozaIe:f:A:B:C:m:", """
        ignore-case word-regexp line-number column files-with-matches files-without-match
        count extended-regexp fixed-strings basic-regexp perl-regexp cached
        recurse-submodules max-depth= after-context= before-context= context= show-function
        function-context heading break all-match and or not full-name null only-matching
        quiet threads= max-count= no-color color color= exclude-standard text""")),
    "git count-objects": Program("read", ("vH", "verbose human-readable")),
    "git version": Program("read", ("", "build-options")),
    # Subcommands that read only in the shapes of their three-word rows, with no option but the log
    # options given and at most `most` plain words (`git remote -v show origin` is not `git remote
    # -v`: it contacts origin); in another shape they change the repository.
    **_each("stash worktree config", Program("known forms", arity=3), prefix="git "),
    **_each("remote submodule", Program("known read forms", most=0, arity=3), prefix="git "),
    "git notes": Program("known read forms", most=0),
    "git reflog": Program("known read forms counts", _GIT_LOG, most=1),
    **_each("remote -v, remote --verbose", Program("read", most=0), prefix="git "),
    "git worktree list": Program("read", ("vz", "porcelain verbose"), most=0),
    **_each("config -l, config --list", Program("read", _GIT_CONFIG_READ, most=0), prefix="git "),
    "git remote get-url": Program("read", ("", "push all"), most=1),
    **_each("notes list, notes show", Program("read", most=1), prefix="git "),
    **_each("config --get, config --get-all, config --get-regexp",
            Program("read", _GIT_CONFIG_READ, most=2), prefix="git "),
    **_each("submodule status, submodule summary", Program("read", most=99), prefix="git "),
    "git stash list": Program("read counts", _GIT_LOG, most=0),
    **_each("stash show, reflog show", Program("read counts", _GIT_LOG, most=1), prefix="git "),
    **_each("""
        annotate bugreport bundle check-attr check-ignore check-mailmap
        check-ref-format checkout-index cherry column commit-graph credential
        credential-cache credential-store daemon diagnose diff-files diff-index diff-tree
        difftool fast-export fast-import fmt-merge-msg for-each-ref for-each-repo
        format-patch fsck-objects get-tar-commit-id help hook http-backend http-push
        imap-send index-pack init-db instaweb interpret-trailers mailinfo mailsplit
        merge-file merge-index merge-octopus merge-one-file merge-ours merge-recursive
        merge-resolve merge-subtree merge-tree mergetool multi-pack-index name-rev
        pack-objects pack-redundant patch-id pickaxe prune-packed quiltimport range-diff
        receive-pack rerere rev-list shell show-branch show-index stage stripspace subtree
        unpack-file unpack-objects update-server-info upload-archive var verify-commit
        verify-pack verify-tag whatchanged""", Program("known"), prefix="git "),
    **_each("""
        archive clone fetch fetch-pack http-fetch ls-remote p4 pull push remote-ext
        request-pull send-email send-pack svn upload-pack""", Program(network="*"), prefix="git "),
    **_each("remote update, remote prune, submodule update, submodule add, submodule sync, "
            "submodule foreach", Program(network="*"), prefix="git "),
    **_each("""
        add am apply bisect cherry-pick clean commit commit-tree filter-branch
        fsck gc hash-object init lfs maintenance merge mktag mktree mv pack-refs prune
        read-tree rebase repack replace reset revert rm sparse-checkout switch
        symbolic-ref update-index update-ref write-tree""", Program("modify"), prefix="git "),
    **_each("checkout restore", Program("modify writes"), prefix="git "),
    **_each("aria2c dig ftp host http https netcat nslookup ping whois", Program(network="*")),
    **_each("curl sftp wget", Program("exact", network="*")),
    **_each("rsync scp", Program("exact writes-last into", network="*")),
    # (its options with an optional value are plain; so are list, sparse and xattrs, which would
    # otherwise be read as short for listed-incremental=, sparse-version= and xattrs-include=)
    "tar": Program("moded", ("b:C:f:F:g:H:I:K:L:N:T:V:X:", """
        add-file= after-date= blocking-factor= checkpoint-action= directory= exclude= exclude-from=
        exclude-ignore= exclude-ignore-recursive= exclude-tag= exclude-tag-all= exclude-tag-under=
        file= files-from= format= group= group-map= hole-detection= index-file= info-script=
        label= level= listed-incremental= mode= mtime= new-volume-script= newer= newer-mtime=
        no-quote-chars= owner= owner-map= pax-option= quote-chars= quoting-style= record-size=
        rmt-command= rsh-command= sort= sparse-version= starting-file= strip-components= suffix=
        tape-length= to-command= transform= use-compress-program= volno-file= warning=
        xattrs-exclude= xattrs-include= xform= atime-preserve backup checkpoint occurrence
        one-top-level totals list sparse xattrs""")),
    **_each("""
        bunzip2 bzip2 cpio gunzip gzip lz4 unxz unzip unzstd xz zip zstd""", Program("moded")),
    "gh": Program(network="*", arity=3),
    **_each("nc ncat ssh telnet", Program("runner exact", network="*")),
    "socat": Program("runner", network="*"),
    **_each("pip pip3", Program("installer", network="download,install", arity=2)),
    "pipx": Program("installer", network="install,run,upgrade", arity=2),
    "uv": Program("installer", network="add,lock,pip,run,sync,tool", arity=2),
    "npm": Program("installer", network="add,ci,exec,i,install,publish,update,x", arity=2),
    "npx": Program("installer", network=",", arity=2),
    "pnpm": Program("installer", network="add,dlx,i,install,update", arity=2),
    "yarn": Program("installer", network=",add,dlx,install,upgrade", arity=2),
    "bun": Program("installer interpreter", network="add,i,install,update,x", arity=2),
    "cargo": Program("installer", network="add,build,fetch,install,publish,run,test,update",
                     arity=2),
    "go": Program("installer", network="build,get,install,mod,run,test", arity=2),
    **_each("gem bundle", Program("installer", network="install,update", arity=2)),
    "brew": Program("installer", network="install,tap,update,upgrade", arity=2),
    **_each("apt apt-get", Program("installer", network="install,update,upgrade", arity=2)),
    "docker": Program("installer runner", network="build,login,pull,push,run", arity=2),
    "poetry": Program("installer", network="add,install,update", arity=2),
    "composer": Program("installer", network="install,require,update", arity=2),
    **_each("aws gcloud az", Program(network=",", arity=3)),
    "sudo": Program("wrapper runner exact", ("C:D:R:T:U:a:c:g:h:p:r:t:u:", """
        chdir= chroot= close-from= command-timeout= group= host= login-class= other-user= prompt=
        role= type= user=""")),
    "doas": Program("wrapper runner exact", ("C:a:u:", "")),
    "pkexec": Program("wrapper", ("", "user=")),
    "run0": Program("wrapper", ("D:g:u:", """
        background= chdir= description= group= machine= nice= property= setenv= slice= unit=
        user=""")),
    "runuser": Program("wrapper shell", ("G:g:s:u:w:", """
        group= shell= supp-group= user= whitelist-environment=""")),
    "setpriv": Program("wrapper", ("", """
        ambient-caps= bounding-set= groups= inh-caps= regid= reuid= securebits= selinux-label=""")),
    "chroot": Program("wrapper", ("", "groups= userspec="), skip=1),
    "unshare": Program("wrapper", ("G:R:S:w:", """
        boottime= map-group= map-groups= map-user= map-users= monotonic= propagation= root=
        setgid= setgroups= setuid= wd=""")),
    **_each("""firejail setsid nohup unbuffer chronic command builtin dbus-run-session dbus-launch
            catchsegv linux32 linux64""", Program("wrapper")),
    "screen": Program("wrapper", ("S:T:c:e:h:p:s:t:", "")),
    "prlimit": Program("wrapper", ("o:p:", "output= pid=")),
    "ssh-agent": Program("wrapper", ("E:O:P:a:t:", "")),
    "sshpass": Program("wrapper", ("P:d:f:p:", "")),
    "xvfb-run": Program("wrapper", ("e:f:n:p:s:w:", """
        auth-file= error-file= server-args= server-num= wait= xauth-protocol=""")),
    "caffeinate": Program("wrapper", ("t:w:", "")),
    "torsocks": Program("wrapper", ("a:P:p:u:", "address= pass= port= user=")),
    "env": Program("wrapper exact", ("C:S:a:u:", "argv0= chdir= split-string= unset=")),
    "nice": Program("wrapper", ("n:", "adjustment=")),
    "ionice": Program("wrapper", ("c:n:p:P:u:", "")),
    **_each("setarch sg taskset", Program("wrapper", skip=1)),
    "chrt": Program("wrapper", ("D:P:T:", "sched-deadline= sched-period= sched-runtime="),
                    skip=1),
    "stdbuf": Program("wrapper", ("e:i:o:", "error= input= output=")),
    "timeout": Program("wrapper", ("k:s:", "kill-after= signal="), skip=1),
    "time": Program("wrapper", ("f:o:", "format= output=")),
    # (-d takes its value only attached: -d=permanent)
    "watch": Program("wrapper", ("n:q:", "equexit= interval=")),
    "flock": Program("wrapper", ("E:w:", "conflict-exit-code= timeout="), skip=1),
    "systemd-run": Program("wrapper", ("E:H:M:p:u:", """
        description= gid= host= machine= nice= on-active= on-boot= on-calendar= on-startup=
        on-unit-active= on-unit-inactive= path-property= property= service-type= setenv= slice=
        socket-property= timer-property= uid= unit= working-directory=""")),
    "exec": Program("wrapper exact", ("a:", "")),
    "busybox": Program("wrapper runner"),
    "strace": Program("wrapper", ("E:I:O:P:S:U:X:a:b:e:o:p:s:u:", """
        attach= columns= env= output= signal= status= string-limit= summary-sort-by= trace=
        trace-path= user=""")),
    "ltrace": Program("wrapper", ("A:D:F:a:e:l:n:o:p:s:u:w:x:", """
        align= config= indent= library= output=""")),
    "proxychains": Program("wrapper", ("f:", "")),
    "fakeroot": Program("wrapper", ("b:i:l:s:", "faked= lib=")),
    "faketime": Program("wrapper", ("", "date-prog="), skip=1),
    "numactl": Program("wrapper", ("C:N:P:i:m:p:", """
        cpunodebind= interleave= membind= physcpubind= preferred= preferred-many=""")),
    "valgrind": Program("wrapper"),         # (its options take their values only attached)
    "proot": Program("wrapper", ("0b:k:m:p:q:r:w:", """
        bind= cwd= kernel-release= mount= qemu= rootfs=""")),
    "nsenter": Program("wrapper", ("G:S:t:", "setgid= setuid= target=")),
    # (-i, -e and -l take their value only attached: -i{})
    "xargs": Program("wrapper runner exact", ("E:I:L:P:a:d:n:s:", """
        arg-file= delimiter= max-args= max-chars= max-procs= process-slot-var=""")),
    "parallel": Program("wrapper runner", ("j:", "")),
    **_each("mksh csh ksh ash tcsh script at batch", Program("shell")),
    "su": Program("shell runner exact"),
    **_each("fish sh zsh dash bash", Program("shell exact")),
    **_each("""
        R Rscript erl ghci guile iex irb jshell julia lua luajit mongo nodejs php python2
        racket scala sqlite3 tclsh wish""", Program("interpreter")),
    **_each("""
        deno mongosh mysql node psql python python3 redis-cli ruby""",
            Program("interpreter", arity=2)),
    "ipython": Program("interpreter runner"),
    "perl": Program("interpreter exact in-place"),
    "awk": Program("runner pattern exact"),
    **_each("""
        bpython ed emacs ex expect gawk gdb ipython3 lldb mawk nawk nvim
        pdb vi vim""", Program("runner")),
    **_each("kubectl podman", Program("runner", arity=2)),
    **_each("""
        badblocks blkdiscard cfdisk fdisk gdisk mkdosfs mke2fs mkntfs mkswap parted sfdisk
        sg_format sg_sanitize sgdisk wipefs""", Program("disk")),
    **_each("cryptsetup luksFormat, cryptsetup erase, cryptsetup luksErase, nvme format, nvme "
            "sanitize, hdparm --security-erase, hdparm --security-erase-enhanced, hdparm "
            "--trim-sector-ranges, hdparm --write-sector, hdparm --make-bad-sector, hdparm "
            "--fwdownload, hdparm --fwdownload-mode3, hdparm --fwdownload-mode3-max, hdparm "
            "--fwdownload-mode7", Program("disk")),
    **_each("halt, poweroff, reboot, shutdown, init 0, init 6, telinit 0, telinit 6",
            Program("power")),
    # systemctl reboot, loginctl suspend, systemctl isolate rescue.target: any word naming one
    **{f"{ctl} {verb}{unit}": Program("power") for ctl in ("systemctl", "loginctl")
       for unit in ("", ".target") for verb in """emergency halt hibernate hybrid-sleep kexec
       poweroff reboot rescue soft-reboot suspend""".split()},
    **_each("""
        alias declare enable export getopts hash local mapfile read readarray readonly typeset
        unset""", Program("sets", arity=1)),
    "ps": Program(arity=1),
    **_each("mkdir touch", Program("writes", arity=1)),
    **_each(". eval find kill killall pkill source", Program("exact")),
    **_each("rm rmdir shred tee truncate", Program("exact writes")),
    **_each("chgrp chmod chown", Program("exact writes-rest")),
    **_each("cp install ln", Program("exact writes-last into")),
    "mv": Program("exact writes into"),
    "dd": Program("exact writes-of"),
    "patch": Program("patches", ("B:D:F:V:Y:d:g:i:o:p:r:z:", """
        backup-if-mismatch ifdef= directory= fuzz= get= input= output= prefix= reject-file=
        read-only= strip= suffix= version-control= basename-prefix= quoting-style=
        reject-format=""")),
    **_each("""
        ./gradlew ansible artisan bazel buildah bunx cabal cdk cf cmake conda consul crictl
        dart docker-compose dotnet dune eksctl firebase flutter flyctl git gradle hatch
        helm heroku hugo ip istioctl just k3d kind kustomize lein lerna make mc minikube
        mix mvn ng nix nvm nx opam openssl packer pdm pipenv pixi pod pre-commit pulumi
        pyenv rails rake rbenv ruff rustup rye sbt serverless skaffold sls sst stack swift
        systemctl terraform tmux turbo ufw vagrant vault vercel volta wp zig""", Program(arity=2)),
    **_each("""
        az group, az vm, bun run, bun x, bundle exec, cargo add, cargo run, conda env,
        consul kv, deno task, docker builder, docker compose, docker container, docker
        image, docker network, docker volume, doctl, eksctl create, gcloud auth, gcloud
        config, gcloud projects, go mod, helm repo, ip addr, ip link, ip netns, ip route,
        kind create, kubectl config, kubectl kustomize, kubectl rollout, mc admin, npm
        exec, npm init, npm run, npm view, openssl req, openssl x509, pnpm dlx, pnpm exec,
        pnpm run, podman container, podman image, poetry run, pulumi stack, python -m,
        python manage.py, python3 -m, python3 manage.py, sfdx, terraform state, terraform
        workspace, uv pip, uv run, uv tool, vault auth, vault kv, yarn dlx, yarn run""",
            Program(arity=3)),
    **_each("az storage, doctl kubernetes, gcloud compute, gcloud container", Program(arity=4)),
}
NOBODY = Program()
# jq programs can read the environment ($ENV, env), other files and modules.
_JQ_UNSAFE = re.compile(
    r"\benv\b|\$\s*ENV|\$\s*__|\binput_filename\b|\bimport\b|\binclude\b"
    r"|\bgetpath\b|\bdebug\b|\bstderr\b|\binput|\bmodulemeta\b|\bget_search_list\b"
)
# sed scripts that only print: line N or lines M to N (1,5p).
_SED_PRINT = re.compile(r"([0-9]+,)?[0-9]+p")
# find: the predicates that only read and print; a ":" marks those that take a value.
_FIND_SAFE = frozenset("""
    -name: -iname: -path: -ipath: -wholename: -iwholename: -regex: -iregex: -regextype: -type:
    -xtype: -maxdepth: -mindepth: -size: -empty -newer: -anewer: -cnewer: -mtime: -mmin: -atime:
    -amin: -ctime: -cmin: -perm: -user: -group: -uid: -gid: -nouser -nogroup -links: -inum:
    -samefile: -lname: -ilname: -readable -writable -executable -print -print0 -printf: -ls -prune
    -quit -true -false -not -and -or -a -o -depth -d -xdev -mount -follow -noleaf -daystart
    -ignore_readdir_race -fstype: -used: -newermt: -newerct: -newerat: -newermm: -neweraa:
    -newercc: -L -H -P ( ) ! ,
""".split())
# git's global options that take the next word as their value; those that keep a read-only
# command read-only
_GIT_VALUED = frozenset("""
    -C -c --git-dir --work-tree --namespace --config-env --exec-path --super-prefix""".split())
_GIT_READ_ONLY = frozenset("""
    -C --no-pager -P --no-optional-locks --literal-pathspecs --no-replace-objects
    --version""".split())
# config keys that define commands for later: aliases, included files
_GIT_URL = re.compile(
    r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:|ext::|fd::)", re.I
)
_KEYWORDS = frozenset(
    "if then else elif fi do done while until ! { } esac".split()
)
_SKIPPED_STATEMENTS = frozenset(("for", "select", "case", "function"))
# The floor's targets: deleting or chmod-ing these recursively is never
# what anyone wanted.
_PROTECTED_DIRS = frozenset("""
    / /bin /boot /dev /etc /home /lib /lib32 /lib64 /opt /proc /root /sbin
    /srv /sys /usr /var /Users /System /Library /Applications /private /mnt
    /media /snap /run /usr/bin /usr/sbin /usr/lib /usr/lib32 /usr/lib64
    /usr/libexec /usr/include /usr/share /usr/local /usr/src /var/lib
    /boot/efi /etc/ssh /etc/systemd
""".split())
_SAFE_DEVICES = frozenset(sandbox.NULL_DEVICES + sandbox.READABLE_DEVICES
                          + "/dev/stdout /dev/stderr /dev/stdin /dev/tty".split())
# longest first, so that ">>" is not read as ">" twice
_OPERATORS = (
    *"&& || ;; |& &>> &> >> >| >& <<< <<- << <& <> > < | & ; ( )".split(),
    "\n",
)
_OPERATOR_START = frozenset("&|;<>()\n")
# what the lexer reads in one step: characters with no meaning to it, the
# body of $'...' and of `...` (up to their closing quote), text in "..."
_ORDINARY = re.compile(r"[^ \t\n\\'\"`$<>&|;()]*")
_ANSI_C_BODY = re.compile(r"(?:[^'\\]|\\.)*", re.S)
_BACKTICK_BODY = re.compile(r"(?:[^`\\]|\\.)*", re.S)
_DOUBLE_QUOTED = re.compile(r'[^"\\`$]*')
_SUBSTITUTION_MARK = re.compile(r"\\.|`|\$\(", re.S)
_SEPARATORS = frozenset((*"&& || ;; |& | & ; ( )".split(), "\n"))
_WRITE_REDIRECTS = frozenset("> >> >| &> &>> <> >&".split())
# paths one glob or brace argument expands to, at most
_MAX_GLOB = 100
# the longest path the kernel opens (PATH_MAX)
_PATH_MAX = 4096
# $( bash -c "eval ..." ) deeper than this is refused as unparsable
_MAX_NESTING = 8
# characters a line's expansions may add beyond twice its length
_EXPANSION_ROOM = 65_536
# A judgement that takes longer than this asks: a pathological line (300 KB
# of nesting or quotes) must not stall the session, nor pass unjudged. It is
# the judging thread's CPU time: on a loaded machine a 0.5 ms judgement was
# measured taking 17 ms of wall time, and ordinary commands must not ask at
# random.
DECIDE_BUDGET_SECONDS = 0.05
# when (in time.thread_time) the judgement running in this thread must end
_DEADLINE = contextvars.ContextVar("deadline", default=float("inf"))
_TICKS = itertools.count()
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
# $NAME, ${NAME}, and ${NAME<operator>word} (${HOME:?}, ${X:-/}, ${IFS:0:1});
# a longer operator is left as written (bounded: each match stays short).
_PARAMETER = re.compile(
    r"\$(?:\{(?P<b>[A-Za-z_]\w*|[0-9@*#?$!-])(?P<op>[^}]{0,256})\}"
    r"|(?P<n>[A-Za-z_]\w*|[0-9@*#?$!-]))"
)
_BRACES = re.compile(r"\{([^{},]*+,[^{}]*+)\}")
# the tmux commands that run a command line (a window's or a popup's command, keys typed into a
# shell, a pipe's reader, if-shell's test)
_TMUX_RUNS = frozenset("""
    new new-session new-window neww split-window splitw send-keys send respawn-pane respawnp
    respawn-window respawnw run-shell run display-popup popup pipe-pane pipep if-shell
    if""".split())
# the tmux commands that keep or read tmux commands (run-shell among them) to run later: a hook, a
# key binding, a file, a prompt's template, a menu, an option (default-command, a hook as option)
_TMUX_STORES = frozenset("""
    set-hook bind-key bind source-file source command-prompt confirm-before confirm display-menu
    menu set-option set set-window-option setw""".split())
# ${X:-a b} and ${X:-"a b" /} are one run of a word, blanks and quotes and all
_BRACED = re.compile(r"""\$\{(?:[^{}\n'"`$\\;&|<>()]|(['"])[^'"\n`$\\()]*\1)*+\}""")
# A fork bomb defines a function and pipes it into itself in the
# background. Two linear scans (names are matched possessively, ++): names
# defined as functions, NAME | NAME & uses.
_NAME = r"(?<![^\s;&|(){}])(?P<n>[^\s(){}|&;<>]++)"
_FUNCTION_DEFINITION = re.compile(
    rf"{_NAME}\s*\(\s*\)|\bfunction\s+(?P<f>[^\s(){{}}|&;<>]++)"
)
# ${x@P} expands x's value as a prompt string, which runs the $(...) and `...` in it
_PROMPT_EXPANSION = re.compile(r"@P\s*\}")
_SELF_PIPE = re.compile(rf"{_NAME}\s*\|(?!\|)\s*(?P=n)\s*&")
# (a bomb's body is short: bounded, so nested definitions stay linear)
_FUNCTION_BODY = re.compile(r"\s*(?:\(\s*\)\s*)?\{([^}]{0,1000})\}")
# an escaped character, and quoted strings (an unterminated one to the
# end, so no scan restarts)
_QUOTED = re.compile(
    r"\\(.)|'[^']*+(?:'|\Z)|\"(?:\\.|[^\"\\])*+(?:\"|\\?\Z)", re.S)


class PermissionConfigError(ValueError):
    """A config file's "permissions" list is malformed; the message names the file and entry."""


class _ParseError(ValueError):
    """A bash line this parser cannot follow: it is then never allowed without asking."""


class _OutOfTime(Exception):
    """The judgement used up DECIDE_BUDGET_SECONDS: the call asks."""


# ------------------------------------------------------------------ data types

@dataclass(frozen=True)
class Rule:
    # a capability name, or an fnmatch pattern over them ("*", "file.*")
    capability: str
    # fnmatch pattern over the request's subject (see the module docstring)
    pattern: str
    # "allow" | "ask" | "deny"
    action: str
    # "default" or the file the rule came from (with its line, for Claude
    # Code's)
    source: str = "default"
    # "default", "user" (the user's own files) or "project" (a repository's
    # file)
    layer: str = "default"
    # a gitignore-style path glob (Claude Code's Read/Edit rules): a path is covered when it, a
    # directory above it, or (a directory) its every entry matches, or it is the pattern as written
    glob: bool = False
    # "read" or "write": applies only to requests that read (or write) a path
    scope: str = ""
    # from an untrusted file: it may make a verdict stricter, never looser
    tighten_only: bool = False


@dataclass(frozen=True)
class Layer:
    """One config file's rules, and whether it may grant."""
    # the file, as shown to the user
    source: str
    # its parsed content
    config: dict
    # "user": the user's own state; "project": a file inside the repository
    kind: str = "user"
    # a project file grants only once `khaelor trust` recorded its hash
    trusted: bool = True
    # Claude Code's settings: its rules keep its precedence, deny > ask >
    # allow
    claude: bool = False
    # for a Claude Code layer: its rules, already mapped (claude_layer)
    rules: tuple = ()
    # for a Claude Code layer: (where, rule, why it maps onto nothing)
    ignored: tuple = ()
    # the file's text, so each rule can name its line
    text: str = ""


@dataclass(frozen=True)
class Decision:
    # "allow" | "ask" | "deny"
    action: str
    # the capability that decided (the first strictest request)
    capability: str
    # what the user is asked about: the command or the path
    descriptor: str
    # the deciding rule; None for the floor or when nothing matched
    rule: Rule | None = None
    # True when the hardline floor refused (no rule can override)
    floor: bool = False
    # {"capability", "pattern"} an "always" would persist, or None
    suggestion: dict | None = None
    # one line for the model and the user: the rule or the floor item
    reason: str = ""
    # what decided: floor, read-only, default, user, project, sandbox,
    # destructive
    layer: str = "default"
    # every command in it is provably read-only
    read_only: bool = False
    # why not, for a command that is not
    not_read_only: str = ""
    # why it destroys work in the repository: --yes alone never approves it
    destructive: str = ""
    # the sandbox this call runs in (see _confine); None for calls that start nothing
    confine: sandbox.Confine | None = None


class _Request(NamedTuple):
    capability: str
    # what rule patterns are matched against
    subject: str
    # the pattern an "always" grant would save, or None
    suggestion: str | None
    # a command proven read-only: allowed where only a default rule matches
    read_only: bool = False
    # reads a secret file or location
    secret: bool = False
    # the resolved absolute path, for path requests
    path: str = ""
    # a path request that writes (an outside path is one capability for
    # both)
    writes: bool = False
    # a command's words without wrappers: deny and ask rules also match these
    core: str = ""
    # how many words come before the command a wrapper runs (`timeout 5 make`: 2)
    wrapped_at: int = 0
    # that command, standing alone, provably only reads (`timeout 5 ls`)
    wrapped_reads: bool = False
    # its options that write or run more than the program's name says (see _ESCAPES)
    escapes: tuple[str, ...] = ()
    # it prints files from git's objects (log -p, show, diff, grep --cached): see _prints_history
    history: bool = False
    # a path only read (a provably reading command's operand, a `<` target): see Confine.read_paths
    only_read: bool = False


class _Part(NamedTuple):
    """One simple command of a bash line."""
    # after quote removal and expansion; joined, what rules match
    words: tuple[str, ...]
    # without assignments and wrappers (sudo, env ...); program basename
    core: tuple[str, ...]
    # (operator, expanded target)
    redirects: tuple[tuple[str, str], ...]
    # where it runs (follows `cd` earlier in the line)
    cwd: str
    # why its words are not all literal (an expansion, a glob into an
    # option)
    unliteral: str | None = None
    # every directory the line has been in by then: `(cd x)`, `cd -` and a
    # failing cd leave bash elsewhere than the last cd says
    cwds: tuple[str, ...] = ()


# ------------------------------------------------------------------ public API

def default_rules() -> list[Rule]:
    """Reads allowed (secrets ask), everything else asks; provably read-only
    commands are allowed by the evaluator, not by a rule, so no pattern can be
    stretched to cover more."""
    table = [
        (FILE_READ, "*", "allow"),
        *((FILE_READ, p, "ask") for p in _anywhere(sandbox.SECRET_NAMES)),
        *((FILE_READ, p, "allow") for p in _anywhere(sandbox.SECRET_TEMPLATES)),
        *((capability, "*", "ask") for capability in CAPABILITIES if capability != FILE_READ),
    ]
    return [Rule(c, p, a, "default") for c, p, a in table]


def validate_config_rules(obj) -> str | None:
    """None when obj (a parsed config dict, or its "permissions" list) is
    well-formed; otherwise one message naming the bad entry and showing what a
    good one looks like."""
    if isinstance(obj, dict):
        obj = obj.get("permissions", [])
    elif obj is None:
        return None
    elif not isinstance(obj, list):
        return 'the config must be a JSON object, e.g. {"permissions": []}'
    example = ('{"capability": "process.execute", "pattern": "git push *", '
               '"action": "allow"}')
    if not isinstance(obj, list):
        return f'"permissions" must be a list of rules like {example}'
    for index, entry in enumerate(obj):
        problem = _entry_problem(entry, example)
        if problem:
            return f"permissions[{index}]{problem}"
    return None


def load_rules(layers) -> list[Rule]:
    """Defaults, then each layer in order: pass the user's before the
    project's, so project rules come later and win. A layer is a Layer, or a
    (source, config) pair of the user's. An untrusted project layer contributes
    only its ask and deny rules: it can tighten, never grant. Claude Code's
    rules keep its precedence: their allows and asks come first (so any KHAELOR
    rule or saved answer refines them) and their denies last, so no allow
    undoes one. Raises PermissionConfigError."""
    claude = {"allow": [], "ask": [], "deny": []}
    ours = []
    for layer in map(_as_layer, layers):
        # a Claude Code layer's rules are mapped already; a KHAELOR config's are its entries
        rules = list(layer.rules)
        if not layer.claude:
            problem = validate_config_rules(layer.config)
            if problem:
                raise PermissionConfigError(f"{layer.source}: {problem}")
            for entry in (layer.config or {}).get("permissions", []):
                where = _where(layer, json.dumps(entry["pattern"]))
                rules.append(Rule(entry["capability"], entry["pattern"], entry["action"], where,
                                  layer.kind, scope=entry.get("scope", "")))
        for rule in rules:
            if layer.trusted or rule.action != "allow":
                rule = replace(rule, tighten_only=not layer.trusted)
                (claude[rule.action] if layer.claude else ours).append(rule)
    return (default_rules() + claude["allow"] + claude["ask"] + ours
            + claude["deny"])


def untrusted_grants(layers) -> list[Rule]:
    """The allow rules of untrusted project layers: what `khaelor trust` would
    grant (nothing from a file whose rules are malformed: no session loads it)."""
    grants = []
    for layer in map(_as_layer, layers):
        if not layer.trusted and (layer.claude or not validate_config_rules(layer.config)):
            rules = load_rules([replace(layer, trusted=True)])
            grants += [r for r in rules if r.action == "allow" and r.layer != "default"]
    return grants


def claude_layer(source: str, text: str, project_root: Path,
                 kind: str = "user", trusted: bool = True) -> Layer:
    """A Claude Code settings file (settings.json, settings.local.json) read as
    it is: its permissions.allow / ask / deny lists in Claude Code's rule
    syntax, mapped onto capabilities. Nothing in it stops khaelor: bad JSON or
    a rule that maps onto nothing is listed as ignored."""
    layer = Layer(source, {}, kind, trusted, claude=True, text=text)
    try:
        settings = json.loads(text) if text.strip() else {}
    except ValueError as e:
        why = f"not valid JSON ({e.msg} at line {e.lineno}); no rule read"
        return replace(layer, ignored=((source, "", why),))
    block = settings.get("permissions", {}) if isinstance(settings, dict) else None
    if not isinstance(block, dict):
        why = "must be an object with allow, ask and deny lists"
        return replace(layer, ignored=((source, "permissions", why),))
    return config_layer(source, {"permissions": block}, text, project_root, kind, trusted)


def claude_rules(layer: Layer, block: dict, root: str) -> Layer:
    """The layer with block's {"allow": [...], "ask": [...], "deny": [...]} mapped in."""
    rules, ignored = [], []
    for action in ACTIONS:
        entries = block.get(action, [])
        if not isinstance(entries, list):
            why = "must be a list of rule strings"
            ignored.append((layer.source, f"permissions.{action}", why))
            continue
        for entry in entries:
            needle = json.dumps(entry) if isinstance(entry, str) else str(entry)
            where = _where(layer, needle)
            mapped, why = _claude_rule(entry, action, where, layer.kind, root)
            rules += mapped
            if why:
                ignored.append((where, str(entry), why))
    # a misspelt "alow" granted nothing without a word (nor do Claude Code's defaultMode and
    # additionalDirectories do anything here)
    for key in block:
        if key not in ACTIONS:
            ignored.append((layer.source, f"permissions.{key}",
                            "not read: khaelor takes allow, ask and deny from here"))
    return replace(layer, rules=tuple(rules), ignored=tuple(ignored))


def content_hash(data: bytes) -> str:
    """What a trust record holds for a file: any change to the bytes withdraws the trust."""
    import hashlib      # here: loading OpenSSL costs 3 ms of every start
    return hashlib.sha256(data).hexdigest()


def decide(kind: str, fields: dict, project_root: Path,
           rules: list[Rule], *, sandboxed: bool = True,
           process_command: str | None = None,
           mode: str = "default") -> Decision:
    """The floor first, then every capability the subject (kind, fields) needs;
    the strictest answer wins.
    sandboxed: whether commands run under the OS sandbox; without it every
    command asks (the floor still refuses).
    process_command: for "feed", the command the process runs.
    mode: "plan" runs only what reads; "acceptEdits" writes project files
    without asking."""
    if not isinstance(fields, dict):
        fields = {}
    # A garbage collection falling inside the judgement would count against its CPU budget (a
    # full one takes 100+ ms in a large heap) and turn a floor refusal into a question.
    collecting = gc.isenabled()
    gc.disable()
    deadline = _DEADLINE.set(time.thread_time() + DECIDE_BUDGET_SECONDS)
    try:
        decision = _decide(kind, fields, project_root, rules,
                           sandboxed, process_command)
    except _OutOfTime:
        decision = None
    finally:
        _DEADLINE.reset(deadline)
        if collecting:
            gc.enable()
    if decision is None:
        decision = _out_of_time(kind, fields, str(project_root), rules)
    if mode == "plan" and _plan_refuses(kind, decision):
        reason = ("plan mode: only tools that read run; "
                  "describe the change instead of making it")
        return replace(decision, action="deny", rule=None, suggestion=None,
                       reason=reason, layer="mode")
    if mode == "acceptEdits" and _accepts_edit(kind, decision):
        reason = "acceptEdits mode: project files are written without asking"
        return replace(decision, action="allow", reason=reason, layer="mode")
    return decision


def _out_of_time(kind: str, fields: dict, root: str,
                 rules: list[Rule]) -> Decision:
    """What a call gets when judging it took too long: a question (or a deny
    rule's answer, or the floor's refusal), never a silent run."""
    text = str(fields.get("command") or fields.get("input") or "")
    request = _Request(EXECUTE, text.strip(), None)
    why = (f"{kind}: not judged within "
           f"{DECIDE_BUDGET_SECONDS * 1000:.0f} ms")
    floor = _text_floor(text, root) if kind == "bash" else None
    return _judge(text.strip(), [request], rules, floor=floor, at_least="ask",
                  not_read_only=why, in_time=False)


def _text_floor(command: str, root: str) -> str | None:
    """The floor read from the line's text alone, as for an unparsable line, on a budget of its
    own: a line whose judgement ran out of time (cat big/* globs 100,000 files, a zip or a tree
    listed) still refuses rm -rf / (the starved judgement never reached the floor's answer).
    Not a line over 10,000 characters: single regular expressions over 300 KB take a second."""
    if len(command) > 10_000:
        return None
    home = posixpath.normpath(os.path.expanduser("~"))
    deadline = _DEADLINE.set(time.thread_time() + DECIDE_BUDGET_SECONDS)
    try:
        return _fork_bomb(command) or _unparsed_floor(command, root, home)
    except (_OutOfTime, RecursionError):
        return None
    finally:
        _DEADLINE.reset(deadline)


def _on_time() -> None:
    """Called in every loop that grows with the command's length; reads the
    clock every 64th call (a thread's CPU clock costs a system call)."""
    if next(_TICKS) % 64 == 0 and time.thread_time() > _DEADLINE.get():
        raise _OutOfTime


def _plan_refuses(kind: str, decision: Decision) -> bool:
    """Plan mode denies what does not read: a path read runs, a command or an
    act on a process only when it is read-only; a floor or a deny stands."""
    if decision.floor or decision.action == "deny" or kind == "read":
        return False
    return kind not in ("bash", "held") or not decision.read_only


def _accepts_edit(kind: str, decision: Decision) -> bool:
    """acceptEdits writes a project file where only the default rule asked, but what runs later."""
    shape = (kind, decision.action, decision.capability, decision.layer)
    if shape != ("write", "ask", FILE_WRITE, "default"):
        return False
    return not runs_later(decision.descriptor)


def runs_later(descriptor: str, hooks: str = "") -> bool:
    """Whether writing this project path plants what runs later, unconfined, so that only a person
    approves it (not acceptEdits, not --yes): any repository's .git (its config's core.fsmonitor,
    its hooks; .GIT on a file system that ignores case), sandbox.GUARDED_DIRS (what the bash guard
    holds too: .vscode/'s tasks, .claude/'s permissions), and `hooks`, the folder core.hooksPath
    names (husky's .husky/_)."""
    parts = descriptor.lower().split("/")
    hooked = bool(hooks) and sandbox.within(descriptor.lower(), [hooks.lower()])
    return ".git" in parts or sandbox.within("/".join(parts), sandbox.GUARDED_DIRS) or hooked


def _decide(kind: str, fields: dict, project_root: Path,
            rules: list[Rule], sandboxed: bool,
            process_command: str | None) -> Decision:
    root = os.path.realpath(project_root)

    def arg(key: str) -> str:
        value = fields.get(key)
        return "" if value is None else str(value)

    if kind == "feed":
        return _decide_process_write(arg("input"), process_command or "",
                                     root, rules)
    if kind == "held":
        # list/read/stop only touch processes that were judged when they
        # started
        return Decision("allow", EXECUTE, arg("action"), read_only=fields.get("read_only") is True)
    if kind == "bash":
        decision = _decide_bash(arg("command"), arg("workdir"), root, rules)
        if sandboxed:
            return decision
        return _without_sandbox(decision)
    if kind in ("read", "write"):
        capability = FILE_WRITE if kind == "write" else FILE_READ
        request = _path_request(arg("file_path"), root, root, capability)
        return _judge(request.subject, [request], rules,
                      read_only=capability == FILE_READ)
    # a tool tools.py declares no subject for ("unknown", {"tool": name})
    what = arg("tool") or kind
    return Decision("deny", "unknown", what, reason=f"unknown tool {what!r}")


def check(kind: str, value: str, project_root: Path, rules: list[Rule], *,
          sandboxed: bool = True) -> dict:
    """What would happen, without doing anything: `khaelor permissions check --json`."""
    if kind not in ("bash", "read", "write"):
        raise ValueError("check kind must be bash, read or write, "
                         f"not {kind!r}")
    field = "command" if kind == "bash" else "file_path"
    decision = decide(kind, {field: value}, project_root, rules,
                      sandboxed=sandboxed)
    rule = None
    if decision.rule:
        rule = rule_text(decision.rule)
    elif decision.floor:
        rule = decision.reason
    suggestion = decision.suggestion["pattern"] if decision.suggestion else None
    as_is = ("layer", "reason", "read_only", "not_read_only", "destructive")
    return {
        "decision": decision.action,
        "capability": decision.capability,
        "rule": rule,
        "floor": decision.floor,
        "suggestion": suggestion,
        **{field: getattr(decision, field) for field in as_is},
        "confine": _as_json(decision.confine),
    }


def _as_json(confine: sandbox.Confine | None) -> dict:
    """A Confine as `khaelor permissions check --json` shows it: tuples as lists."""
    if confine is None:
        return {}
    fields = asdict(confine)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def describe_rules(rules: list[Rule]) -> list[str]:
    """One line per rule in evaluation order (the last matching line wins), with its source."""
    width = max((len(r.capability) for r in rules), default=0)
    return [f"{n:>3}  {rule.action:<5}  {rule.capability:<{width}}"
            f"  {rule.pattern:<24}  {rule.source}" for n, rule in enumerate(rules, 1)]


def rule_text(rule: Rule) -> str:
    return f'{rule.action} {rule.capability} "{rule.pattern}" ({rule.source})'


def add_grant(config: dict, rule: dict) -> dict:
    """A copy of config whose last permission is rule ({capability, pattern,
    action="allow"}), so it wins; an identical earlier entry is moved there,
    never duplicated."""
    entry = {key: rule.get(key, "allow" if key == "action" else None) for key in _RULE_KEYS}
    if rule.get("scope"):
        entry["scope"] = rule["scope"]
    problem = validate_config_rules([entry]) or validate_config_rules(config)
    if problem:
        message = problem.replace("permissions[0]", "grant", 1)
        raise PermissionConfigError(message)
    kept = [e for e in config.get("permissions", []) if e != entry]
    return {**config, "permissions": [*kept, entry]}


def khaelor_home() -> str:
    """khaelor's own state ($KHAELOR_HOME): the floor refuses every write into it."""
    home = os.environ.get("KHAELOR_HOME") or os.path.expanduser("~/.khaelor")
    return os.path.realpath(home)


# --------------------------------------------------- config entries and layers

def _entry_problem(entry, example: str) -> str | None:
    if not isinstance(entry, dict):
        return f" must be an object like {example}"
    missing = [key for key in _RULE_KEYS if key not in entry]
    if missing:
        return f" is missing {', '.join(missing)}; a rule looks like {example}"
    unknown = sorted(set(entry) - {*_RULE_KEYS, "scope"})
    if unknown:
        return (f" has unknown key {', '.join(unknown)}; "
                "allowed: capability, pattern, action, scope")
    if entry.get("scope", "read") not in _RULE_SCOPES:
        return '.scope must be "read" or "write"'
    for key in _RULE_KEYS:
        if not isinstance(entry[key], str) or not entry[key]:
            return f".{key} must be a non-empty string"
    action = entry["action"]
    if action not in ACTIONS:
        return f'.action "{action}" is not one of allow, ask, deny'
    capability = entry["capability"]
    if not any(fnmatch.fnmatchcase(c, capability) for c in CAPABILITIES):
        known = ", ".join(CAPABILITIES)
        return (f'.capability "{capability}" names no capability; '
                f"known: {known}")
    return None


# Claude Code's tools, by what their rules govern here; the tools khaelor
# does not have.
_CLAUDE_TOOLS = {
    "Bash": "command",
    "Read": "read", "Grep": "read", "Glob": "read", "LS": "read",
    "Edit": "write", "Write": "write", "MultiEdit": "write",
    "NotebookEdit": "write",
}
_CLAUDE_ABSENT = {
    **dict.fromkeys(("WebFetch", "WebSearch"),
                    "khaelor has no web tool, so this rule matches nothing"),
    **dict.fromkeys(("Task", "Agent"), "khaelor has no subagents"),
    "TodoWrite": "khaelor has no todo tool",
    "NotebookRead": "khaelor reads notebooks with Read",
}


def _claude_rule(entry, action: str, where: str, kind: str,
                 root: str) -> tuple[list[Rule], str | None]:
    """One Claude Code rule ("Bash(npm run test:*)", "Read(./.env)",
    "Edit(src/**)") as rules here, or why it maps onto nothing."""
    if not isinstance(entry, str):
        return [], "a rule must be a string like \"Bash(npm test)\""
    match = re.fullmatch(r"\s*([A-Za-z_][\w-]*)\s*(?:\((.*)\))?\s*",
                         entry, re.S)
    if not match:
        return [], "not in Claude Code's rule syntax, Tool or Tool(specifier)"
    tool = match[1]
    spec = (match[2] or "").strip()
    if tool.startswith("mcp__"):
        return [], "khaelor has no MCP tools"
    if tool in _CLAUDE_ABSENT:
        return [], _CLAUDE_ABSENT[tool]
    what = _CLAUDE_TOOLS.get(tool)
    if what is None:
        return [], f"unknown tool {tool!r}"
    if what == "command":
        # Bash(kill:*) is "kill *", not killall: Claude Code's matcher ends a prefix at a word. Its
        # docs read curl http://x/:* as a plain prefix: a deny or ask so (it catches more), an allow
        # as the matcher does
        word = action == "allow" or re.search(r"\w:\*$", spec)
        pattern = _quoted_as_matched(re.sub(r":\*$", " *" if word else "*", spec)) or "*"
        rules = [Rule(c, pattern, action, where, kind)
                 for c in _COMMAND_CAPABILITIES]
        return rules, None
    capability = FILE_READ if what == "read" else FILE_WRITE
    if spec in ("", "*", "**"):
        return [Rule(capability, "*", action, where, kind)], None
    return _claude_path(spec, capability, what, action, where, kind, root), None


def _claude_path(spec: str, capability: str, scope: str, action: str,
                 where: str, kind: str, root: str) -> list[Rule]:
    """gitignore-style paths: //abs is absolute, ~/ the home, /p and ./p from
    the project root, a bare name (no slash but a last one: a directory) at any depth."""
    anywhere = "/" not in spec.rstrip("/")
    if spec.endswith("/"):
        spec += "**"
    outside = None
    if spec.startswith("//"):
        outside = "/" + spec.lstrip("/")
    elif spec.startswith("~/"):
        outside = spec
    if outside is not None:
        rules = [Rule(OUTSIDE, outside, action, where,
                      kind, glob=True, scope=scope)]
        absolute = os.path.expanduser(outside)
        if absolute == root or absolute.startswith(root + "/"):
            inside = absolute[len(root) + 1:] or "**"
            rules.append(Rule(capability, inside, action, where, kind,
                              glob=True))
        return rules
    if spec.startswith("/"):
        relative = spec.lstrip("/")
    elif spec.startswith("./"):
        relative = spec[2:]
    elif not anywhere:
        relative = spec
    else:
        relative = "**/" + spec
    return [Rule(capability, relative, action, where, kind, glob=True)]


def _where(layer: Layer, needle: str) -> str:
    """file:line of the first line holding needle, or the file alone."""
    for number, line in enumerate(layer.text.splitlines(), 1):
        if needle in line:
            return f"{layer.source}:{number}"
    return layer.source


def _as_layer(layer) -> Layer:
    if isinstance(layer, Layer):
        return layer
    source, config = layer
    return Layer(source, config)


def _anywhere(names: tuple[str, ...]) -> list[str]:
    """File name patterns as rule patterns over project paths: at the root and in any directory."""
    return [pattern for name in names for pattern in (name, "*/" + name)]


# ------------------------------------------------------------------ evaluation

def _judge(descriptor: str, requests: list[_Request], rules: list[Rule], *,
           floor: str | None = None, at_least: str = "allow",
           read_only: bool = False, not_read_only: str = "",
           destructive: str = "", code: tuple[str, ...] = (), in_time: bool = True) -> Decision:
    floor = floor or _protected_write(requests)
    confine = _confine(requests, read_only, rules)
    if floor:
        return Decision("deny", EXECUTE, descriptor, floor=True, reason=f"hardline floor: {floor}",
                        layer="floor", not_read_only=not_read_only, confine=confine)
    if not requests:
        return Decision(at_least, EXECUTE, descriptor, read_only=read_only,
                        not_read_only=not_read_only, confine=confine)
    verdicts = [_verdict(request, rules) for request in requests]
    strictest = max(verdicts, key=lambda v: _STRICTNESS[v[0]])
    action, rule, request, layer = strictest
    if any(v[0] == "ask" and v[1] and v[2].capability == FILE_READ for v in verdicts):
        # the user is asked about a read a rule asks for: approving it opens what such rules hide,
        # not the secret files (a repository's ask of README.md would open .env to what rides along)
        confine = replace(confine, hide_paths=confine.deny_paths, rule_asked=True)
    if destructive and action == "allow":
        action = "ask"
        rule = None
        layer = "destructive"
    elif _STRICTNESS[at_least] > _STRICTNESS[action]:
        action = at_least
        rule = None
    # (a checkpoint undoes a git reset --hard, which --yes then runs, not what a deny refuses
    # beside it: `git reset --hard; npx touch m`)
    undoable = not destructive or checkpoint_undoes(destructive)
    runs_denied = ""
    if action == "ask" and undoable:
        runs_denied = _runs_denied(verdicts, rules, code, in_time)
    suggestion = None if destructive or runs_denied else _one_suggestion(verdicts, action)
    reason = f"no rule allows {request.capability} {request.subject}"
    if runs_denied:
        # (the kernel's --yes approves nothing that is "destructive")
        destructive = runs_denied
        reason = f"{runs_denied}: asks every time, --yes alone never approves it"
    elif destructive and action != "deny":
        reason = (f"destroys work in the repository ({destructive}): "
                  "asks every time, --yes alone never approves it")
    elif rule:
        reason = rule_text(rule)
    elif layer == "read-only":
        reason = "provably read-only"
    elif layer == "history":
        reason = "git prints from its objects what your read rules deny or ask about"
    elif layer == "escape":
        reason = f"no allow rule names {' '.join(request.escapes)}, which writes or runs more"
    return Decision(action, request.capability, descriptor, rule, False,
                    suggestion, reason, layer=layer, read_only=read_only,
                    not_read_only=not_read_only, destructive=destructive,
                    confine=confine)


def _runs_denied(verdicts: list[tuple], rules: list[Rule], code: tuple[str, ...],
                 in_time: bool = True) -> str:
    """What an asked command may run that a deny rule of the user's or the project's refuses:
    `poetry run touch m`, `gdb --args touch m`, `npx touch m` under a deny of `touch *`, or code
    that names the program (`python3 -c 'os.system("touch m")'`). The judge unwraps the wrappers
    POLICY lists, not every program that runs the words after it, and reads no code, so such a
    command keeps asking a person, and --yes does not answer for them."""
    denies = [rule for rule in rules if rule.action == "deny" and rule.layer != "default"
              and fnmatch.fnmatchcase(EXECUTE, rule.capability)]
    if not denies:
        return ""
    if not in_time:
        # (its words, unread in the judgement's budget, are not read again on another)
        return "it may run what a deny rule refuses (it could not be read in time)"
    deadline = _DEADLINE.set(min(_DEADLINE.get(), time.thread_time() + DECIDE_BUDGET_SECONDS))
    try:
        return _denied_tail(verdicts, denies) or _code_names_denied(code, denies)
    except (ValueError, _OutOfTime):   # an unclosed quote, or too long to read
        return "it may run what a deny rule refuses (its words could not be read in time)"
    finally:
        _DEADLINE.reset(deadline)


def _denied_tail(verdicts: list[tuple], denies: list[Rule]) -> str:
    programs = {rule.pattern.split()[0] for rule in denies if rule.pattern.strip()}
    any_program = any(ch in program for program in programs for ch in "*?[")
    for action, _, request, _ in verdicts:
        if action != "ask" or request.capability not in _COMMAND_CAPABILITIES:
            continue
        if len(request.subject) > 10_000:
            # shlex reads 300 KB for 150 ms, unclocked, and each tail below is joined anew
            raise _OutOfTime
        words = shlex.split(request.subject)
        for start in range(len(words)):
            _on_time()
            program = posixpath.basename(words[start])
            # (/usr/bin/t?uch m: bash may expand a glob to a denied program's name, first too)
            if any(ch in program for ch in "*?["):
                program = next((p for p in programs if fnmatch.fnmatchcase(p, program)), program)
            elif not start:
                continue
            shell = _row(program).has("shell")
            if program in programs or any_program or shell:
                if time.thread_time() > _DEADLINE.get():    # (each tail is joined anew)
                    raise _OutOfTime
                tail = shlex.join([program, *words[start + 1:]])
                # (npx sh -c 'touch m': what the shell runs, each command of it)
                tails = [tail, *_shell_commands(tail)] if shell else [tail]
                for tail in tails:
                    rule = _last_match(denies, request._replace(capability=EXECUTE, subject=tail))
                    if rule is not None:
                        return f"it may run `{tail}`, which {rule_text(rule)} refuses"
    return ""


def _code_names_denied(code: tuple[str, ...], denies: list[Rule]) -> str:
    """A denied program named as a word in code an interpreter or make runs: a call to it, most
    likely (`system("touch m")`, `["touch", "m"]`); a string that only mentions it asks too."""
    for rule in denies:
        words = _named_words(rule.pattern)
        if not words:
            continue
        named = [re.compile(rf"(?<![\w.-]){re.escape(word)}(?![\w.-])") for word in words]
        for text in code:
            _on_time()
            if all(word.search(text) for word in named):
                return f"its code names `{' '.join(words)}`, which {rule_text(rule)} refuses"
    return ""


def _named_words(pattern: str) -> list[str]:
    """The program a deny names and its literal words after it, options aside (`git push *`: git
    and push; code that runs `git log` does not ask every time); none if the program is a glob."""
    words = []
    for word in pattern.split():
        if any(ch in word for ch in "*?["):
            break
        if not word.startswith("-"):
            words.append(word)
    return words if pattern.split()[:1] == words[:1] else []


def _shell_commands(line: str) -> list[str]:
    """The simple commands a shell line runs, nested ones included, as a deny rule reads them."""
    parts = _ShellLine(line, "/", posixpath.expanduser("~")).parts
    return [shlex.join(part.core) for part in parts if part.core]


def _verdict(request: _Request, rules: list[Rule]) -> tuple:
    """(action, rule, request, layer) for one request. A provably read-only
    command is allowed unless a rule the user or the project wrote says
    otherwise. Deny and ask rules also match the command without its wrappers
    (`timeout 5 rm -rf x` is still `rm *`); allows do not (`sudo rm` is not
    `rm *`), and an allow that names only the wrapper does not reach what it
    runs (`timeout *` allows `timeout 5 make`, not `timeout 5 rm -rf src`):
    that command is judged alone."""
    _on_time()
    rule = _last_match(rules, request)
    if rule is not None and rule.action == "allow" and request.core \
            and request.core != request.subject and not _names_the_wrapped(rule.pattern, request):
        alone = request._replace(subject=request.core, read_only=request.wrapped_reads)
        return _verdict(alone, rules)
    if rule is not None and rule.tighten_only:
        # an untrusted file's ask after the user's deny must not loosen it
        trusted = [r for r in rules if not r.tighten_only]
        underneath = _last_match(trusted, request)
        if underneath is not None and _stricter(underneath, rule):
            rule = underneath
    if request.core and request.core != request.subject:
        tightening = [r for r in rules
                      if r.action != "allow" and r.layer != "default"]
        without_wrappers = request._replace(subject=request.core)
        stricter = _last_match(tightening, without_wrappers)
        if stricter and (rule is None or _stricter(stricter, rule)):
            rule = stricter
    if rule is None:
        return "ask", None, request, "default"
    unnamed = [e for e in request.escapes if not _names(rule.pattern, e)]
    if unnamed and rule.action == "allow" and rule.layer != "default" and rule.pattern != "*":
        # `git log *` allowed is not `git log --output=F` nor --ext-diff
        return "ask", None, request, "escape"
    silent = rule.action == "allow" or (request.read_only and rule.layer == "default")
    if request.history and silent and _reads_kept_out(rules):
        # git's objects hold every version of a file the user's read rules keep out of reach on
        # disk (the sandbox hides the file, not its history)
        return "ask", None, request, "history"
    if request.read_only and rule.layer == "default":
        return "allow", None, request, "read-only"
    if request.secret and rule.layer == "default" and rule.action == "allow":
        # a secret whose spelling the default patterns miss
        return "ask", None, request, "default"
    return rule.action, rule, request, rule.layer


def _stricter(rule: Rule, than: Rule) -> bool:
    return _STRICTNESS[rule.action] > _STRICTNESS[than.action]


def _one_suggestion(verdicts: list[tuple], action: str) -> dict | None:
    """One "always" can only cover one asking request. A specific ask rule
    exists to catch its form; a wildcard grant would undo it for every later
    case, so it grants this exact subject."""
    if action != "ask":
        return None
    asking = set()
    for verdict_action, matched, request, _ in verdicts:
        if verdict_action != "ask":
            continue
        pattern = request.suggestion
        specific = matched is not None and matched.pattern != "*"
        if pattern is not None and specific:
            pattern = _escape(request.subject)
        # an outside path read: "always" allows reading it, not writing (cat ~/.bashrc)
        scope = "read" if request.capability == OUTSIDE and not request.writes else ""
        asking.add((request.capability, pattern, scope))
    if len(asking) != 1:
        return None
    capability, pattern, scope = asking.pop()
    if not pattern:
        return None
    return {"capability": capability, "pattern": pattern, **({"scope": scope} if scope else {})}


def _last_match(rules: list[Rule], request: _Request) -> Rule | None:
    capability = request.capability
    subject = request.subject

    def matches(rule: Rule) -> bool:
        if rule.scope and (rule.scope == "write") != request.writes:
            return False
        pattern = rule.pattern
        if capability == OUTSIDE and pattern.startswith("~"):
            pattern = os.path.expanduser(pattern)
        if rule.glob:
            regex = _path_regex(pattern, is_glob=True)
            probes = [subject] + [subject + "/\0"] * os.path.isdir(request.path)  # NUL: any entry
            return any(re.fullmatch(regex, probe) for probe in probes)
        if fnmatch.fnmatchcase(subject, pattern):
            return True
        # "ls *" also matches "ls"
        bare = capability in _COMMAND_CAPABILITIES and pattern.endswith(" *")
        return bare and fnmatch.fnmatchcase(subject, pattern[:-2])

    for_capability = (r for r in reversed(rules) if fnmatch.fnmatchcase(capability, r.capability))
    return next(filter(matches, for_capability), None)


def _path_regex(pattern: str, is_glob: bool) -> str:
    """The regex a path rule's subject matches whole: a glob as Rule.glob says, else fnmatch's."""
    if is_glob:
        return f"(?:{re.escape(pattern)}|{sandbox.glob_regex(pattern)})(?s:/.*)?"
    return fnmatch.translate(pattern)


def _protected_write(requests: list[_Request]) -> str | None:
    """The agent must not be able to grant itself permissions, not even under
    --yes: no write into $KHAELOR_HOME, nor into a permission file the project
    keeps."""
    written = (r.path for r in requests if r.capability != FILE_READ and r.path)
    return next(filter(None, map(_protected, written)), None)


def _protected(path: str) -> str | None:
    """Why writing path would change who may do what: khaelor's state, the
    user's own permission folders (~/.khaelor, ~/.claude), a project's
    permission file. Compared case-insensitively, as a macOS or Windows file
    system compares them."""
    lowered = path.lower()
    places = (khaelor_home(), os.path.expanduser("~/.khaelor"),
              os.path.expanduser("~/.claude"))
    for place in map(str.lower, places):
        if sandbox.within(lowered, [place]):
            return ("khaelor's own state and the user's permission files "
                    f"({place}) are changed only by the user")
    if "/".join(lowered.split(os.sep)[-2:]) in PROJECT_FILES:
        return f"a permission file ({path}) is changed only by the user"
    return None


def _confine(requests: list[_Request], read_only: bool, rules: list[Rule]) -> sandbox.Confine:
    """The sandbox a decision grants (enforced by tools.py): writes only when
    the command is not read-only, network only when asked for, the outside
    paths it named, and the project paths read rules ask about or deny, which no
    command reads unnamed (a later allow is not weighed: a read naming one is)."""
    paths = {r.path for r in requests if r.capability == OUTSIDE and r.path}
    # (an approved `cat ~/.bashrc > out && make` must not let make write ~/.bashrc)
    read_paths = paths - {r.path for r in requests if r.capability == OUTSIDE and not r.only_read}
    network = [r for r in requests if r.capability == NETWORK]
    installs = []
    if any(_row(*r.core.split()[:1]).has("installer") for r in network):
        installs = _package_locations()
        paths.update(installs)
    # --yes gives the network only to a line whose every program is known to need it: never to
    # an interpreter, a script or an unknown program riding along (`curl x; python3 payload.py`);
    # and of the outside paths only where an approved install puts packages: nothing outside the
    # project can be rewound, and what it reads (a shell history) could leave with the answer.
    # Nor to a program run with variables set for it (GIT_SSH_COMMAND=, LD_PRELOAD=: it runs the
    # repository's code).
    known = not any(r.capability == EXECUTE or _sets_variables(r) for r in requests)
    return sandbox.Confine(
        write=not read_only,
        network=bool(network),
        paths=tuple(sorted(paths)),
        read_paths=tuple(sorted(read_paths)),
        secrets=any(r.secret for r in requests),
        secret_paths=tuple(sorted({r.path for r in requests if r.secret and r.path})),
        hide=sandbox.SECRET_NAMES,
        **rule_paths(rules),
        unattended_network=bool(network) and known,
        git_network=known and all(map(_keeps_git_credentials, requests)),
        unattended_paths=tuple(sorted(installs)) if known else (),
    )


def _keeps_git_credentials(request: _Request) -> bool:
    """A part of a line that may read .git/config with its credentials (Confine.git_network): git
    reaching a remote by its subcommand (not by a URL-like word: `git commit -F .git/config
    --trailer https://x` kept the token in a commit), `git config KEY VALUE` of a plain key (a CI
    job sets user.email), or a word of theirs; no redirection (`git ls-remote --get-url > f`)."""
    words = tuple(request.core.split())
    if not words:
        return request.capability == FILE_READ and not request.only_read
    if words[0] != "git" or request.escapes:
        return False
    _, sub, rest = _git_split(words[1:])
    if sub == "config":
        plain = len(rest) == 2 and not rest[1].startswith("-")
        return plain and bool(sandbox.GIT_CONFIG_PLAIN.fullmatch(rest[0]))
    first = rest[0] if rest else ""
    by_name = _row("git", sub).network or _row("git", sub, first).network
    return request.capability == NETWORK and bool(by_name)


def _sets_variables(request: _Request) -> bool:
    """A command run with NAME=value words before it (its own, or env's)."""
    words = shlex.split(request.subject)[:request.wrapped_at] if request.wrapped_at else []
    return any(map(_ASSIGNMENT.match, words))


def rule_paths(rules: list[Rule]) -> dict[str, tuple[str, ...]]:
    """Confine's hide_paths and deny_paths, the paths the user's and the project's read rules
    ask about or deny; its frozen_paths, those their write rules deny; and its frozen_files, the
    project's own permission files (`khaelor sandbox` takes them too)."""
    reads = [r for r in rules if r.layer != "default" and r.scope != "write"
             and fnmatch.fnmatchcase(FILE_READ, r.capability)]
    writes = [r for r in rules if r.layer != "default" and r.action == "deny"
              and r.scope != "read" and fnmatch.fnmatchcase(FILE_WRITE, r.capability)]
    return {"hide_paths": tuple(_path_regex(r.pattern, r.glob)
                                for r in reads if r.action != "allow"),
            "deny_paths": tuple(_path_regex(r.pattern, r.glob)
                                for r in reads if r.action == "deny"),
            "frozen_paths": tuple(_path_regex(r.pattern, r.glob) for r in writes),
            "frozen_files": PROJECT_FILES}


# Where package managers install and cache, under $HOME: an approved `pip
# install` or `npm install` may write there (and into this interpreter's
# site-packages), or it could not do what was approved.
_PACKAGE_HOME_DIRS = (
    ".cache", ".local", ".npm", ".cargo", ".rustup", "go", ".gem", ".m2",
    ".gradle", ".yarn", ".pnpm-store", ".bun", ".deno", ".nuget", ".pyenv",
)


def _package_locations() -> list[str]:
    import sysconfig
    home = os.path.expanduser("~")
    places = [os.path.join(home, name) for name in _PACKAGE_HOME_DIRS]
    places += [sysconfig.get_paths()[key] for key in ("purelib", "platlib", "scripts", "data")]
    return [os.path.realpath(p) for p in places]


def _without_sandbox(decision: Decision) -> Decision:
    """Without the whole OS boundary (Landlock and seccomp) nothing holds a
    command to its decision, whatever the parser thought of it: every command
    asks."""
    if decision.action != "allow":
        return decision
    reason = ("no OS sandbox here (see khaelor permissions): every command "
              "asks")
    return replace(decision, action="ask", rule=None, reason=reason, layer="sandbox",
                   read_only=False)


# ----------------------------------------------------------------------- paths

def _path_request(path_text: str, base: str, root: str,
                  capability: str) -> _Request:
    """The request to touch path_text (relative to base). realpath resolves
    `..` and symlinks, so a link inside the project that points out of it is
    outside."""
    writes = capability == FILE_WRITE
    resolved = _word_path(path_text, base)
    if not resolved:
        return _Request(OUTSIDE, path_text, None, writes=writes)
    if not sandbox.within(resolved, [root]):
        secret = sandbox.is_secret_path(resolved, os.path.expanduser("~"))
        return _Request(OUTSIDE, resolved,
                        _escape(resolved), secret=secret, path=resolved,
                        writes=writes)
    subject = Path(resolved).relative_to(root).as_posix()
    directory = posixpath.dirname(subject)
    secret = capability == FILE_READ and sandbox.is_secret_name(subject)
    if capability == FILE_WRITE and directory:
        return _Request(capability, subject, _escape(directory) + "/*",
                        path=resolved)
    return _Request(capability, subject, _escape(subject), secret=secret,
                    path=resolved)


def _word_path(word: str, cwd: str) -> str:
    """word (relative to cwd) resolved, or "" for an embedded NUL and the like: nowhere we can
    vouch for."""
    try:
        return os.path.realpath(os.path.join(cwd, os.path.expanduser(word)))
    except (ValueError, OSError):
        return ""


def _wildcard_base(target: str, cwd: str) -> str | None:
    """The directory a wildcard in target lists, resolved: the one rule for
    what a glob may delete (None: no wildcard)."""
    if not any(ch in target for ch in "*?[{"):
        return None
    return _resolve(sandbox.glob_base(target), cwd)


# a shell word: unquoted characters, backslash escapes, '…' and "…" strings
_SHELL_WORD = re.compile(r"""(?:[^\s'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+""", re.S)


def _quoted_as_matched(pattern: str) -> str:
    """A rule's command with each quoted word quoted as shlex.join quotes a command's words, so
    Bash(git commit -m "fix bug") matches the command it names. Unquoted words keep their
    wildcards as written; one with an unmatched quote is left as it is."""
    if _SHELL_WORD.sub("", pattern).strip():
        return pattern
    words = []
    for word in _SHELL_WORD.findall(pattern):
        if any(mark in word for mark in "'\"\\"):
            word = shlex.join(shlex.split(word))
        words.append(word)
    return " ".join(words)


def _escape(text: str) -> str:
    """fnmatch-quote text so a suggested pattern matches itself literally."""
    return text.translate({ord(c): f"[{c}]" for c in "*?["})


def _secrets_under(directory: str, include_hidden: bool,
                   follows: bool = False) -> list[str]:
    """Secret files a recursive search of directory would read (a bounded walk;
    .git skipped), and when it follows symlinks, each link that leads out of
    directory."""
    found = []
    seen = 0
    top = os.path.realpath(directory)
    for parent, dirs, files in os.walk(directory):
        # pruned in place, so the walk does not descend into them
        dirs[:] = [d for d in dirs if d != ".git" and (include_hidden or d[:1] != ".")]
        _on_time()
        for name in files + (dirs if follows else []):
            seen += 1
            path = os.path.join(parent, name)
            if not include_hidden and name.startswith("."):
                continue
            if sandbox.is_secret_name(name) and name not in dirs:
                found.append(path)
            elif follows and os.path.islink(path):
                if not sandbox.within(os.path.realpath(path), [top]):
                    found.append(path)
        if seen > _SECRET_WALK_CAP or len(found) >= 5:
            break
    return found


# -------------------------------------------------------- bash: judging a line

def _row(*words: str) -> Program:
    """POLICY's row for a program, or for `git SUB` given as two words; NOBODY when it has none. A
    word holding a space names no row: quoted, 'git status' is one word, a program no one has."""
    if any(len(word.split()) != 1 for word in words):
        return NOBODY
    return POLICY.get(" ".join(words), NOBODY)


def _git_split(args: tuple[str, ...]) -> tuple[list[str], str | None, tuple[str, ...]]:
    """(git's global options, without their values; the subcommand or None; its words), the one
    pass over `git -C dir -c k=v --no-pager SUB ...`."""
    options = []
    k = 0
    while k < len(args) and args[k].startswith("-"):
        options.append(args[k])
        k += 2 if args[k] in _GIT_VALUED else 1
    if k >= len(args):
        return options, None, ()
    return options, args[k], args[k + 1:]


def _decide_bash(command: str, workdir: str, root: str,
                 rules: list[Rule]) -> Decision:
    home = posixpath.normpath(os.path.expanduser("~"))
    requests = []
    cwd = root
    if workdir:
        request = _path_request(workdir, root, root, FILE_READ)
        outside = request.capability == OUTSIDE
        cwd = request.subject if outside else os.path.join(root, request.subject)
        requests.append(request._replace(suggestion=None))
    try:
        line = _ShellLine(command, cwd, home)
    except (_ParseError, RecursionError) as e:
        why = str(e) or "nested too deeply"
        return _unparsable(command, cwd, home, rules, why)
    not_read_only = ""
    destructive = ""
    writing = []
    # (the same command twice asks the same things)
    for part in dict.fromkeys(line.parts):
        _on_time()
        problem = _not_read_only(part, root)
        if problem:
            writing.append(part)
            not_read_only = not_read_only or f"{' '.join(part.words)[:80]}: {problem}"
        # a write redirection asks as a file write; the command itself may
        # still only read
        only_redirected = not problem or _not_read_only(part._replace(redirects=()), root) is None
        requests += _part_requests(part, root, line.compound, only_redirected)
        destructive = destructive or _destroys_work(part, root)
    for fed in line.fed:
        destructive = destructive or _destroys_work(fed, root)
    if _FUNCTION_DEFINITION.search(command):
        line.unfollowed = ("it defines a shell function, "
                           "which can stand in for any command")
    if _PROMPT_EXPANSION.search(command):
        line.unfollowed = "its ${x@P} expansion runs the commands a variable's value holds"
    if line.unfollowed and not not_read_only:
        not_read_only = line.unfollowed
        requests = [r._replace(read_only=False) for r in requests]
    if line.unfollowed:
        # what it runs is not known (ssh -F CONFIG): no program of it counts as known to --yes
        requests.append(_Request(EXECUTE, command.strip(), None))
    floor = line.floor or _state_write(writing)
    return _judge(command.strip(), requests, rules, floor=floor,
                  at_least="ask" if line.unfollowed else "allow",
                  read_only=not not_read_only, not_read_only=not_read_only,
                  destructive=destructive, code=tuple(line.code))


def _unparsable(command: str, cwd: str, home: str, rules: list[Rule],
                why: str) -> Decision:
    """Bash runs the lines before a syntax error, so the floor still reads
    every line, split at its operators, and so does a deny or ask of one of its
    commands; what cannot be parsed is never allowed without asking."""
    floor = _fork_bomb(command) or _unparsed_floor(command, cwd, home)
    requests = [_Request(EXECUTE, command.strip(), None)]
    for words, core in _unparsed_commands(command, home):
        requests.append(_Request(EXECUTE, shlex.join(words), None,
                                 core=shlex.join(_rule_core(core))))
    return _judge(command.strip(), list(dict.fromkeys(requests)), rules, floor=floor,
                  at_least="ask",
                  not_read_only=f"the line cannot be parsed ({why})")


def _unparsed_floor(command: str, cwd: str, home: str) -> str | None:
    """The floor over each command _unparsed_commands finds."""
    for words, core in _unparsed_commands(command, home):
        floor = _floor_reason(_Part(words, core, (), cwd), home)
        if floor:
            return floor
    return None


def _unparsed_commands(command: str, home: str):
    """(words, core) of each command of a line split at its operators, quotes dropped; into the
    command a wrapper runs elsewhere (env -C DIR CMD is `sh -c 'cd DIR && CMD'`); read again
    without redirections and their targets, which may come first (>>x rm -rf ~), and variables,
    which may be empty."""
    again = re.sub(r"[<>]+&?\s*\S*|\$\{?\w+\}?\s", "\n", command)
    for text in re.split(r"[\n;&|()<>]+", command + "\n" + again):
        _on_time()
        unquoted = re.sub(r"[\"'\\]", "", text)
        unquoted = unquoted.replace("${HOME}", home).replace("$HOME", home)
        words = re.sub(r"(?<!\S)~(?=/|\s|$)", home, unquoted).split()
        core = _core(words)
        if core[:2] == ["sh", "-c"] and len(core) == 3:
            yield from _unparsed_commands(core[2], home)
        elif words:
            yield tuple(words), tuple(core)


def _part_requests(part: _Part, root: str, compound: bool,
                   read_only: bool) -> list[_Request]:
    """What one simple command needs: its command capability, its redirections,
    the files its arguments may name, and the secrets a recursive search of a
    directory would read."""
    capability = _classify(part.core)
    command = shlex.join(part.words)
    suggestion = None if compound else _suggest(part.words)
    # (find -delete: the rm it stands for is none of its words)
    deletes = part.core[:1] == ("find",) and "-delete" in part.core
    wrapped_at = _wrapped_at(part.words, _rule_core(part.core) if deletes else part.core)
    if suggestion and not read_only and capability == EXECUTE:
        words = _rule_core(part.core)
        if any(_row(*words[:n]).has("read") for n in (1, 2, 3)):
            # it asks because of an option or a form (sort --co=…, git log
            # --output=…): a wildcard over its arguments would grant exactly
            # that form from then on
            suggestion = _escape(command)
    escapes = _escapes(part.core)
    if suggestion and escapes:
        suggestion = _escape(command)
    requests = [_Request(
        capability, command, suggestion,
        read_only=read_only and capability == EXECUTE,
        core=shlex.join(_rule_core(part.core)), wrapped_at=wrapped_at,
        wrapped_reads=capability == EXECUTE and _wrapped_reads(part, wrapped_at, root),
        escapes=escapes, history=_prints_history(part.core),
    )]
    places = part.cwds or (part.cwd,)
    for op, target in part.redirects:
        if target.startswith(("/dev/tcp/", "/dev/udp/")):
            # bash opens a socket for these
            requests.append(_Request(NETWORK, f"{op} {target}", None))
            continue
        writes = _redirect_writes(op, target)
        if (writes or op == "<") and target not in _SAFE_DEVICES:
            access = FILE_WRITE if writes else FILE_READ
            for place in places:
                found = _word_requests(target, place, root, access)
                requests += [request._replace(only_read=not writes) for request in found]
    suggest_paths = not compound and len(places) == 1
    # (git -C DIR and a work tree move where git's path arguments start)
    places = tuple(_git_place(part, place) for place in places)
    # test -f .env, [ -s .env ]: it looks at the file, and prints no byte of it
    looks = _row(*part.core[:1]).has("data")
    named_from = len(requests)
    for word in _path_arguments(part.core):
        _on_time()
        for place in places:
            found = _word_requests(word, place, root, FILE_READ, suggest=suggest_paths)
            found = map(_looked_at, found) if looks else found
            requests += [request._replace(only_read=read_only) for request in found]
    named_to = len(requests)
    for word in _git_object_paths(part.core, root):
        for place in places:
            requests += _word_requests(word, place, root, FILE_READ, suggest=suggest_paths)
    for place in places:
        written = _written(part.core, place, root)
        if _row(*part.core[:1]).has("patches"):
            written = _patched(part.core, part.redirects, place)
        for word in dict.fromkeys(written):
            requests += map(_as_written, _word_requests(word, place, root, FILE_READ))
        # a wrapper's output (time -o F ls) is judged as a redirection's: an allow of `time *`
        # reaches only the command it wraps, judged alone
        for word in _wrappers_written(part):
            if word not in _SAFE_DEVICES:
                requests += _word_requests(word, place, root, FILE_WRITE)
    for place in places:
        for secret in _recursive_secrets(part._replace(cwd=place)):
            request = _path_request(secret, place, root, FILE_READ)
            requests.append(request._replace(suggestion=None))
    # an argument naming a file it makes (cp .env.example .env, no .env yet): no bytes to read
    made = {r.path for r in requests if r.writes and r.path and not os.path.lexists(r.path)}
    named = requests[named_from:named_to]
    requests[named_from:named_to] = [_looked_at(r) if r.path in made else r for r in named]
    return list(dict.fromkeys(requests))


# git subcommands that print past versions of files from its objects (log only with a patch
# option; diff only given a revision; blame names its file, which the path rules judge)
_GIT_HISTORY = frozenset("""
    archive cat-file diff difftool format-patch grep range-diff reflog show stash
    whatchanged""".split())
_GIT_LOG_PATCH = ("-p", "-u", "-U", "-L", "-c", "--cc", "--patch", "--unified", "--full-diff")


def _prints_history(core: tuple[str, ...]) -> bool:
    """git log -p, show, diff, grep, cat-file, archive…: what it prints may come from any version
    of any file in the repository's history."""
    if core[:1] != ("git",):
        return False
    sub, rest = _git_split(core[1:])[1:]
    if sub == "log":
        return any(word.startswith(_GIT_LOG_PATCH) for word in rest)
    if sub in ("diff", "difftool"):
        # the work tree against the index (`git diff`, `git diff --stat`) shows no past version
        return any(not word.startswith("-") or word in ("--cached", "--staged") for word in rest)
    return sub in _GIT_HISTORY


def _reads_kept_out(rules: list[Rule]) -> bool:
    """A read deny or ask the user or the project wrote (the default secret rules aside: their
    values are masked in every output)."""
    return any(rule.layer != "default" and rule.action != "allow"
               and fnmatch.fnmatchcase(FILE_READ, rule.capability) for rule in rules)


def _git_object_paths(core: tuple[str, ...], root: str) -> list[str]:
    """The files git reads from its objects, named REV:PATH (git show HEAD:secrets/key, :0:PATH):
    a read of PATH, from the top of the repository (./PATH from where git runs). Not :/TEXT,
    which searches commit messages."""
    if core[:1] != ("git",):
        return []
    paths = []
    for word in core[1:]:
        match = re.fullmatch(r"([^:/-][^:]*|):(?:[0-3]:)?([^/].*)", word)
        if match and not _GIT_URL.match(word):
            path = match[2]
            paths.append(path if path.startswith(("./", "../")) else os.path.join(root, path))
    return paths


def _git_place(part: _Part, place: str) -> str:
    """Where git's path arguments start: -C moves it (each relative to the last); a work tree
    (--work-tree, -c core.worktree, GIT_WORK_TREE) the directory is not inside is where they
    start then (`git --work-tree=sub checkout -- x` writes sub/x)."""
    if part.core[:1] != ("git",):
        return place
    tree = next((w[14:] for w in part.words if w.startswith("GIT_WORK_TREE=")), None)
    for option in _parse(part.core[1:], _GIT_VALUED.__contains__, stop=True)[0]:
        value = option.value or ""
        if option.name == "-C":
            place = posixpath.normpath(posixpath.join(place, os.path.expanduser(value)))
        elif option.name == "--work-tree":
            tree = value
        elif option.name == "-c" and value.lower().startswith("core.worktree="):
            tree = value.partition("=")[2]
    if tree is None:
        return place
    tree = posixpath.normpath(posixpath.join(place, os.path.expanduser(tree)))
    return place if sandbox.within(place, [tree]) else tree


# Options by which a program the user allowed by name writes a file or runs something unseen:
# find -fprint F, git log --output=F or --ext-diff (the configured diff program), less +!CMD, vim
# -c CMD, zip -TT CMD, an awk program read from a file. An allow rule reaches them only by naming
# them in its own words (`git log --output=* *`); otherwise they ask.
_VIM = ("vi", "vim", "nvim", "ex", "view")
_ESCAPES = {
    **dict.fromkeys(("sort", "shuf"), "-o --output"),
    "find": "-fprint -fprint0 -fprintf -fls",
    "git": "--output --ext-diff",
    "less": "+ -k --lesskey-file --lesskey-src",
    **dict.fromkeys(_VIM, "+ -c --cmd -S"),
    "zip": "-TT --unzip-command",
    **dict.fromkeys(("awk", "gawk", "mawk", "nawk"), "-f --file"),
}
# what in an awk program runs a command or writes a file: system(), a pipe (not ||), print >
_AWK_ESCAPE = re.compile(r"system|(?<!\|)\|(?!\|)|print[^;{}\n]*>|@load")


def _escapes(core: tuple[str, ...]) -> tuple[str, ...]:
    """The options of _ESCAPES in a command (the letter in a cluster: sort -ro F), and what
    _AWK_ESCAPE finds in an awk program."""
    name = core[0] if core else ""
    args = core[1:]
    found = []
    # (git archive and format-patch write their --output by nature)
    makes = name == "git" and _git_split(args)[1] in ("archive", "format-patch")
    for token in "" if makes else _ESCAPES.get(name, "").split():
        letter = token[1:] if len(token) == 2 else ""
        for word in args:
            given = word == token or _abbreviates(word, token) or letter in _short_flags(word)
            if token == "+":
                # (+N and + only go to a line)
                given = word.startswith("+") and not re.fullmatch(r"\+\d*", word)
            if given:
                found.append(token)
                break
    if name in ("awk", "gawk", "mawk", "nawk"):
        found += [m[0] for word in args for m in _AWK_ESCAPE.finditer(word)]
    if name == "sed":
        found += _sed_written(args)
    return tuple(dict.fromkeys(found))


def _names(pattern: str, escape: str) -> bool:
    """Whether a rule's pattern names an escape: an option as a word of its own (`sort -o *`,
    `git log --output=* *`), what an awk program holds anywhere in it."""
    if escape[:1] not in ("-", "+"):
        return escape in pattern
    return any(word.startswith(escape) for word in pattern.split())


def _as_written(request: _Request) -> _Request:
    """A path a command writes (cp x f) as a write of it: only a user's deny or ask of the write
    meets it (read_only), as the command itself asks anyway."""
    capability = FILE_WRITE if request.capability == FILE_READ else request.capability
    return request._replace(capability=capability, writes=True, read_only=True,
                            suggestion=None, secret=False)


def _looked_at(request: _Request) -> _Request:
    """A project file a command only looks at or makes, as no read of it: allowed but by a user's
    deny or ask of reading it, and no secret (the kernel keeps the secret files closed to what
    --yes approves and to what runs unasked, so a wrong judgement costs a failed command)."""
    if request.capability != FILE_READ:
        return request
    return request._replace(read_only=True, secret=False, suggestion=None)


def _redirect_writes(op: str, target: str) -> bool:
    """A redirection that writes a file: not a descriptor copy (2>&1) or close (>&-); `> 2`,
    `&> -` and `>> 1` write files named 2, - and 1."""
    return op in _WRITE_REDIRECTS and not (op == ">&" and (_is_number(target) or target == "-"))


def _tmux_scripts(args: tuple[str, ...]) -> tuple[list[str], str]:
    """The command lines `tmux ARGS` runs (tmux -c CMD; new -s x 'CMD' or CMD ARG...; send-keys
    'CMD' Enter: the words after a command's options), in each of its commands (`tmux ls \\;
    run 'CMD'`), and the first command that keeps tmux commands for later, or ""."""
    options, _, at = _parse(args, lambda o: o[1:] in "cfLST", stop=True)
    scripts = [o.value for o in options if o.name == "-c"]
    stored = ""
    command = []
    for word in (*args[at:], ";"):
        if word != ";" and not word.endswith(";"):
            command.append(word)
            continue
        if word != ";":
            command.append(word[:-1])           # tmux ends a command at a word's last `;` too
        if command and command[0] in _TMUX_RUNS:
            end = _parse(command[1:], lambda o: o[1:] in "cefFlnpstTxy", stop=True)[2]
            runs = command[1 + end:]
            scripts += [*runs, " ".join(runs)] if runs else []
        elif command and command[0] in _TMUX_STORES:
            stored = stored or command[0]
        command = []
    return scripts, stored


def _wrapped_at(words: tuple[str, ...], core: tuple[str, ...]) -> int:
    """How many words come before the command the wrappers run: `sudo -u root rm x` 3, `rm x` and
    `/bin/rm x` 0; all of them where the command is not the words' tail (`env -S 'rm x'`)."""
    before = len(words) - len(core)
    if before >= 0 and words[before + 1:] == tuple(core[1:]):
        return before
    return len(words)


def _wrapped_reads(part: _Part, wrapped_at: int, root: str) -> bool:
    """Whether the command the wrappers run provably only reads, alone; never after a runner,
    which adds words of its own (`xargs git` may run `git push`)."""
    before, command = part.words[:wrapped_at], part.words[wrapped_at:]
    if not before or not command or any(_row(posixpath.basename(w)).has("runner") for w in before):
        return False
    return _not_read_only(part._replace(words=command, redirects=()), root) is None


def _names_the_wrapped(pattern: str, request: _Request) -> bool:
    """Whether an allow rule names the command a wrapper runs, not only the wrapper: `timeout 5
    make *` and `timeout 5 make` do, `timeout *` and `env *` do not."""
    # ([*] is the escape of a literal *)
    literal = re.split(r"[*?[]", re.sub(r"\[.\]", "x", pattern), maxsplit=1)
    if len(literal) == 1:
        return True                     # no wildcard: the exact command the user allowed
    words = _SHELL_WORD.findall(literal[0])
    if literal[0] and not literal[0][-1].isspace():
        words = words[:-1]              # `timeout 5 ma*`: the last word is not named whole
    return len(words) > request.wrapped_at


def _rule_core(core: tuple[str, ...]) -> tuple[str, ...]:
    """What deny and ask rules also match: the command without wrappers, and
    for git without its global options (`git --no-pager -C . push` is
    `git push`)."""
    if core[:1] == ("find",) and "-delete" in core:
        # find -delete is an rm of what it finds: `rm *` denied or asked holds for it, and an allow
        # of find alone does not reach it
        return ("rm", _find_roots(core[1:])[0])
    if core[:1] != ("git",):
        return core
    _, sub, rest = _git_split(core[1:])
    return ("git",) if sub is None else ("git", sub, *rest)


def _decide_process_write(text: str, process_command: str, root: str,
                          rules: list[Rule]) -> Decision:
    """Text written to a shell is a command line, judged as one; to an
    interpreter it is code no one can read in advance, so it asks; anything
    else (a prompt, a REPL of data) is allowed."""
    program = _stdin_reader(process_command, root)
    if _row(program).has("shell"):
        decision = _decide_bash(text, "", root, rules)
        return replace(decision, descriptor=f"{program} ← {text.strip()}")
    if _runs_code(program):
        request = _Request(EXECUTE,
                           f"{program} -c {text.strip()}", None)
        return _judge(f"{program} ← {text.strip()}", [request], rules,
                      at_least="ask", code=(text,),
                      not_read_only=f"code written to {program} runs unread")
    return Decision("allow", EXECUTE, "process write")


def _runs_code(program: str) -> bool:
    """An interpreter, or a program that runs what it reads."""
    row = _row(program)
    if row.has("interpreter") or row.has("runner"):
        return True
    return program.startswith(("python", "pypy", "node", "ruby", "perl", "php"))


def _stdin_reader(command: str, root: str) -> str:
    """The program of a background process that reads what `process write`
    sends: a shell or an interpreter anywhere in its line counts."""
    try:
        parts = _ShellLine(command, root, os.path.expanduser("~")).parts
    except (_ParseError, RecursionError):
        # unknown: judge what is written as a command line
        return "sh"
    for part in parts:
        for word in part.words:
            name = posixpath.basename(word)
            if _row(name).has("shell") or _runs_code(name):
                return name
    if parts and parts[0].core:
        return parts[0].core[0]
    return ""


def _classify(core: tuple[str, ...]) -> str:
    """The one command capability a simple command needs."""
    if not core:
        return EXECUTE
    name, args = core[0], core[1:]
    if name == "git":
        return _classify_git(args)
    subcommand = next((a for a in args if not a.startswith("-")), "")
    network = _row(name).network
    if network == "*" or (network and subcommand in network.split(",")):
        return NETWORK
    return EXECUTE


def _classify_git(args: tuple[str, ...]) -> str:
    """git reaching another machine is network access; changing the repository is git.modify."""
    if any(_GIT_URL.match(a) or "::" in a for a in args):
        return NETWORK
    _, sub, rest = _git_split(args)
    if sub is None:
        return EXECUTE
    first = rest[0] if rest else ""
    # (git remote show -n answers from the local config)
    shows_remote = sub == "remote" and first == "show" and "-n" not in rest
    if _row("git", sub).network or _row("git", sub, first).network or shows_remote:
        return NETWORK
    if _row("git", sub).has("modify"):
        return GIT_MODIFY
    if sub in ("branch", "tag"):
        listing = {"-l", "--list"} & set(rest)
        options, names = _operands(("git", *rest))
        # (git branch -a lists all branches; git tag -a annotates a new tag)
        letters = "dDmMcCfuse" if sub == "branch" else "dDmMcCfusea"
        changes_refs = _has(options, "--delete", "--move", "--copy", "--force",
                            "--set-upstream-to", "--unset-upstream", "--annotate", "--sign",
                            "--edit", short=letters)
        if changes_refs or (names and not listing):
            return GIT_MODIFY
        return EXECUTE
    if _row("git", sub).has("forms") and _git_form_problem(sub, rest):
        contacting = {"show", "update", "prune", "set-head"}
        if sub == "remote" and set(rest) & contacting:
            # `git remote -v show origin` contacts origin
            return NETWORK
        return GIT_MODIFY
    return EXECUTE


def _gives_pattern(option: str) -> bool:
    """Whether this option word may hold or name grep's pattern (sed's, awk's
    or jq's program): -e P, -ex, -fFILE, --reg=P, --file F. The first operand
    is then a file."""
    return _has([option], "regexp", "file", "expression", "from-file", "source",
                short="ef")


def _path_arguments(core: tuple[str, ...]) -> list[str]:
    """Words that may name files: operands (and F of @F, which strings reads), option values."""
    if not core or core[0] in ("echo", "printf"):
        return []
    options, operands = _operands(core)
    # --output=/x, of=/dev/x
    values = [a.partition("=")[2] for a in core[1:] if "=" in a]
    # -m.env, -f~/.cargo/credentials, -ifsecrets.json: a value attached to a
    # short option can name a file too, after any of the cluster's letters
    # (a longer one than PATH_MAX could not be opened)
    attached = []
    for arg in options:
        if arg[1:2] != "-":
            first = max(2, len(arg) - _PATH_MAX)
            attached += [arg[k:] for k in range(first, len(arg))]
    words = operands + values + attached + [w[1:] for w in operands if w[:1] == "@"]
    return [w for w in words if w and w not in _SAFE_DEVICES]


def _operands(core: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(option words, operands): after --, every word is an operand (grep --
    -x .env reads .env); a pattern-first program's pattern is left out."""
    args = core[1:]
    end = args.index("--") if "--" in args else len(args)
    options = [a for a in args[:end] if a[:1] == "-" and a != "-"]
    operands = [a for a in args[:end] if a[:1] != "-"] + [*args[end + 1:]]
    pattern_first = core[:1] and _row(core[0]).has("pattern")
    if pattern_first and not any(map(_gives_pattern, options)):
        operands = operands[1:]
    return options, operands


def _written(core: tuple[str, ...], cwd: str = "", root: str = "") -> list[str]:
    """The words naming the files a command writes, by its row's kinds (the Program docstring) and
    _WRITE_OPTIONS: cp x f, tee f, dd of=f, sed -i ... f, git checkout -- f, sort -o f; cp x DIR
    and cp -t DIR x also write DIR/x (a directory is known as one by its trailing / or in cwd);
    what is copied, removed or extracted into the project root is listed (see _copied_tree)."""
    git = core[:1] == ("git",)
    if git:
        _, sub, rest = _git_split(core[1:])
        core = ("git", sub or "", *rest)
    row = _row(*core[:1 + git])
    options, operands = _operands(core[git:])
    words = _option_written(core) + (_sed_written(core[1:]) if core[:1] == ("sed",) else [])
    if core[:1] in (("tar",), ("unzip",), ("zip",)):
        words += _archive_written(core, cwd, root)
    if row.has("in-place") and _edits_in_place(core[0], options):
        return operands + words
    directories = list(words) if core[:1] in (("cp",), ("install",), ("ln",), ("mv",)) else []
    last = operands[-1:]
    if row.has("into") and not directories and last:
        into = last[0].endswith("/") or os.path.isdir(os.path.join(cwd, last[0]))
        directories = last if into else []
        operands = operands[:-1] if into else operands
    sources = [path for word in operands for path in _expanded(word, cwd) or [word]]
    copies = [(o, _copy_target(core[0], o, d)) for d in directories for o in sources]
    words += [target for _, target in copies]
    if row.has("into") and not directories and len(operands) == 2:
        # cp -r DIR NEW and mv make NEW the copy of DIR; rsync makes NEW/DIR (NEW itself for DIR/)
        renamed = core[0] != "rsync"
        copies.append((operands[0], last[0] if renamed else _copy_target("rsync", *operands)))
    for source, target in copies:
        if core[:1] in (("cp",), ("mv",), ("rsync",), ("scp",)):
            words += _copied_tree(source, target, cwd, root)
    picked = {"writes": operands, "writes-last": last, "writes-second": operands[1:2],
              "writes-rest": operands[int(_chmod_mode(core, options)):],
              "writes-of": [a[3:] for a in core[1:] if a.startswith("of=")]}
    words += next((ws for kind, ws in picked.items() if row.has(kind)), [])
    # rm -r DIR, chmod -R, git checkout -- DIR: every entry below it too
    if _recursive(core) or core[:2] in (("git", "checkout"), ("git", "restore")):
        words += [entry for word in words for entry in _copied_tree(word, word, cwd, root)]
    return words


def _archive_written(core: tuple[str, ...], cwd: str, root: str) -> list[str]:
    """What tar, zip and unzip write: the archive they make (tar -c/-r/-u/-A -f A, zip A ...), and
    what they extract (tar -x, unzip): each member the archive lists (the first _MAX_GLOB, read by
    tarfile or zipfile) below tar -C's or unzip -d's directory, and that directory."""
    if core[0] == "zip":
        return _operands(core)[1][:1]
    if core[0] == "unzip":
        options, operands, _ = _parse(core[1:], lambda o: o in ("-d", "-x"))
        names = {o.name for o in options}
        directory = next((o.value for o in options if o.name == "-d"), ".")
        if names & {"-l", "-t", "-v", "-z", "-Z", "-p"}:
            return []                   # it lists, tests or prints
        return [directory] + _members(operands[:1], directory, cwd, root)
    options = _parse(_tar_arguments(core[1:]), POLICY["tar"].reads_value)[0]
    archive = _option_value(options, "-f", "file")
    extracts = any(o.name == "-x" or _abbreviates(o.name, "--extract", "--get") for o in options)
    # (--delete rewrites the archive too)
    modes = ("create", "append", "update", "catenate", "concatenate", "delete")
    makes = any(o.name in ("-c", "-r", "-u", "-A") or _abbreviates(o.name, *modes) for o in options)
    if makes:
        return [archive] if archive else []
    if not extracts:
        return []
    directory = _option_value(options, "-C", "directory") or "."
    return [directory] + _members([archive] if archive else [], directory, cwd, root)


def _tar_arguments(args: tuple[str, ...]) -> list[str]:
    """tar's words with an old-style first cluster spelled out: `xfC A DIR` is `-x -f A -C DIR`
    (its letters take their values from the next words, in order)."""
    if not args or args[0].startswith("-"):
        return list(args)
    rest = iter(args[1:])
    spelled = []
    for letter in args[0]:
        _on_time()      # (`tar vvvv…f A`: a cluster 600 KB long took 460 ms)
        spelled.append("-" + letter)
        if POLICY["tar"].takes_value("-" + letter):
            spelled.append(next(rest, ""))
    return spelled + list(rest)


def _members(archives: list[str], directory: str, cwd: str, root: str) -> list[str]:
    """directory/MEMBER for the first _MAX_GLOB members an archive lists (none when unreadable,
    or extracted outside the project root)."""
    import tarfile
    import zipfile
    if not _in_project(directory, cwd, root):
        return []
    names = []
    for archive in archives:
        try:
            with _open_regular(os.path.join(cwd, archive)) as f:
                if zipfile.is_zipfile(f):
                    names += _zip_names(f)
                    continue
                f.seek(0)
                # never a compressed tar: its members are found only by inflating it, and a
                # repository's few KB of xz can inflate to gigabytes (the judge would hang on it)
                with tarfile.open(fileobj=f, mode="r:") as opened:
                    for member in itertools.islice(opened, _MAX_GLOB):
                        _on_time()
                        names.append(member.name)
        except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError, struct.error):
            continue
    names = [name for name in names if len(name) <= _PATH_MAX]
    return [posixpath.join(directory, name.lstrip("/")) for name in names]


def _open_regular(path: str):
    """path opened for reading when it is a regular file; OSError for a FIFO or a device (a FIFO
    blocks the judge until a writer comes, /dev/zero never ends, /dev/stdin is the session's)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def _zip_names(f) -> list[str]:
    """The first _MAX_GLOB names a zip's central directory lists, record by record (ZipFile reads
    every record: a 30 MB zip can list a million names, seconds of work)."""
    import zipfile
    end = zipfile._EndRecData(f)
    if not end:
        raise zipfile.BadZipFile
    start = end[zipfile._ECD_LOCATION] - end[zipfile._ECD_SIZE]
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    f.seek(start)
    names = []
    for _ in range(min(_MAX_GLOB, end[zipfile._ECD_ENTRIES_TOTAL])):
        record = struct.unpack(zipfile.structCentralDir, f.read(zipfile.sizeCentralDir))
        if record[0] != zipfile.stringCentralDir:
            break
        name = f.read(record[zipfile._CD_FILENAME_LENGTH])
        f.seek(record[zipfile._CD_EXTRA_FIELD_LENGTH] + record[zipfile._CD_COMMENT_LENGTH], 1)
        utf8 = record[zipfile._CD_FLAG_BITS] & 0x800
        names.append(name.decode("utf-8" if utf8 else "cp437", "replace"))
    return names


def _in_project(path: str, cwd: str, root: str) -> bool:
    return bool(root) and sandbox.within(_word_path(path, cwd), [root])


def _expanded(word: str, cwd: str) -> list[str] | None:
    """The paths a glob word names (cat .e*, cp *.yml DIR/), or the word itself when it is none
    or matches nothing; None when it matches more than _MAX_GLOB."""
    if not any(ch in word for ch in "*?["):
        return [word]
    matches = _glob(os.path.join(cwd, os.path.expanduser(_bash_glob(word))))
    return matches if matches is None else matches or [word]


def _copy_target(name: str, source: str, directory: str) -> str:
    """Where source lands in directory: DIR/NAME, or for rsync's `SRC/` DIR itself."""
    if name == "rsync" and source.endswith("/"):
        return directory
    return posixpath.join(directory, posixpath.basename(source.rstrip("/")))


def _copied_tree(source: str, target: str, cwd: str, root: str) -> list[str]:
    """What copying (or moving) the directory source to target writes: target/ENTRY for each
    entry below it, the first _MAX_GLOB met, nearest first (a deny of a file deeper in a bigger
    tree is not seen here: the command asks anyway). Only in the project root: outside it, every
    write asks, and each path would cost a look for secrets (rm -rf / must stay quick)."""
    found = []
    pending = [""] if _in_project(target, cwd, root) else []
    while pending and len(found) < _MAX_GLOB:
        below = pending.pop(0)
        try:
            with os.scandir(os.path.join(cwd, source, below)) as entries:
                # (scandir reads a directory lazily: a huge one costs only what is taken)
                for entry in itertools.islice(entries, _MAX_GLOB - len(found)):
                    _on_time()
                    found.append(posixpath.join(target, below, entry.name))
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(posixpath.join(below, entry.name))
        except OSError:
            continue
    return found


# the options whose value is a file a program writes: (short letters, long names); for git any
# subcommand's --output (git log --output=F), for cp, install, ln and mv a target directory
_WRITE_OPTIONS = {
    **dict.fromkeys(("cp", "install", "ln", "mv"), ("t", "target-directory")),
    **dict.fromkeys(("sort", "shuf", "time", "strace", "ltrace"), ("o", "output")),
    "curl": ("o", "output"),
    "wget": ("O", "output-document"),
    "patch": ("o", "output"),
    "tar": ("g", "listed-incremental index-file volno-file"),
    "valgrind": ("", "log-file xml-file"),
    "fakeroot": ("s", ""),
    "git": ("", "output"),
    "git archive": ("o", "output"),
    "git format-patch": ("o", "output-directory output"),
}


def _option_written(core: tuple[str, ...]) -> list[str]:
    """The values of the options in _WRITE_OPTIONS (and find's -fprint F, see _ESCAPES) in core."""
    if core[:1] == ("find",):
        writes_to = _ESCAPES["find"].split()
        return [value for option, value in zip(core, core[1:]) if option in writes_to]
    key = " ".join(core[:2])
    short, longs = _WRITE_OPTIONS.get(key) or _WRITE_OPTIONS.get(core[0] if core else "", ("", ""))
    skip = 1 + (key in _WRITE_OPTIONS or core[:1] == ("git",))
    row = _row(*core[:skip])

    def writes(option: str) -> bool:
        if core[:1] == ("valgrind",):   # (it takes no abbreviation: --xml=yes names no file)
            return option in ("--log-file", "--xml-file")
        return _has([option], *longs.split(), short=short)

    # (a wrapper's options end at the command it runs: time -o F sort -o G)
    stop = row.has("wrapper")
    args = _tar_arguments(core[skip:]) if core[:1] == ("tar",) else core[skip:]
    options = _parse(args, lambda o: writes(o) or row.reads_value(o), stop)[0]
    return [o.value for o in options if writes(o.name) and o.value]


def _wrappers_written(part: _Part) -> list[str]:
    """What the wrappers before a command write (time -o F, strace -o F, sudo time -o F make,
    valgrind --log-file=F, fakeroot -s F)."""
    before = part.words[:_wrapped_at(part.words, part.core)]
    written = []
    for k, word in enumerate(before):
        if posixpath.basename(word) in ("time", "strace", "ltrace", "valgrind", "fakeroot"):
            written += _option_written((posixpath.basename(word), *part.words[k + 1:]))
    return written


def _edits_in_place(name: str, options: list[str]) -> bool:
    """sed -i, perl -pi: an -i in a cluster before a letter that takes the rest of the word
    (perl -Mstrict loads strict; sed -es/i/x/ is a script)."""
    rest = {"sed": "efl", "perl": "CDEFIMVdemx"}.get(name, "")
    for option in options:
        if name == "sed" and _abbreviates(option, "in-place"):
            return True
        letters = option[1:] if option[1:2] != "-" else ""
        before = re.split(f"[{re.escape(rest)}]", letters, maxsplit=1)[0] if rest else letters
        if "i" in before:
            return True
    return False


def _chmod_mode(core: tuple[str, ...], options: list[str]) -> bool:
    """Whether chmod's (chown's, chgrp's) first operand is its mode (owner, group), not a file:
    not after --reference, nor for a mode written as an option (chmod -w f)."""
    modes = [o for o in options if re.fullmatch(r"-[rwxXstugoa0-7=+,-]+", o)]
    return not (core[:1] == ("chmod",) and modes) and not _has(options, "--reference")


def _patched(core: tuple[str, ...], redirects, cwd: str) -> list[str]:
    """The files patch writes: its first operand and -o's value; without a file operand, each file
    the diff names (read from -i F or < F; a diff from a pipe is not read), with every leading
    directory stripped or not, as -p may have it; below -d's directory."""
    options, operands, _ = _parse(core[1:], _row("patch").reads_value)
    directory = _option_value(options, "-d", "directory") or "."
    diff = _option_value(options, "-i", "input")
    diffs = [diff] if diff else []
    diffs += [target for op, target in redirects if op == "<"]
    written = operands[:1]
    if operands:
        diffs = []                      # it patches the file named, whatever the diff says
    for diff in diffs[:1]:
        try:
            with _open_regular(os.path.join(cwd, diff)) as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            continue
        # (the first _MAX_GLOB names: a MB of +++ lines, or one of 4,000 directories, is
        # seconds of work and its last names are never seen; the patch asks anyway)
        names = {}
        for named in re.finditer(r"^(?:---|\+\+\+) ([^\t\n]+)", text, re.M):
            _on_time()
            if len(names) == _MAX_GLOB:
                break
            if len(named[1]) <= _PATH_MAX:
                names[named[1]] = None
        for named in names:
            parts = named.strip().split("/")[-_MAX_GLOB:]
            written += ["/".join(parts[k:]) for k in range(len(parts)) if parts[k:] != ["null"]]
    written = [posixpath.join(directory, word) for word in written[:_MAX_GLOB]]
    return written + _option_written(core)


def _bash_glob(word: str) -> str:
    """A bash glob as Python's glob reads them: [^x] is [!x], POSIX classes
    become ranges, and a [ that no ] follows in its path component is literal
    (fnmatch would look for its ] from every one of them)."""
    word = word.replace("[^", "[!")
    word = re.sub(r"\[:(\w+):\]",
                  lambda m: sandbox.POSIX_CLASSES.get(m[1], m[0]), word)
    components = []
    for component in word.split("/"):
        closed = component.rfind("]") + 1
        tail = component[closed:].replace("[", "[[]")
        components.append(component[:closed] + tail)
    return "/".join(components)


def _word_requests(word: str, cwd: str, root: str, capability: str,
                   suggest=False) -> list[_Request]:
    """A shell word naming files. Globs are expanded (`cat .e*` reads .env); a
    value we cannot know ($F, $(...)) might be anywhere, so it counts as
    outside the project."""
    if "$(" in word or "`" in word or _PARAMETER.search(word):
        return [_Request(OUTSIDE, word, None)]
    paths = _expanded(word, cwd)
    if paths is None:
        # too many to vouch for each
        return [_Request(OUTSIDE, word, None)]
    requests = [_path_request(path, cwd, root, capability) for path in paths]
    if suggest and len(paths) == 1:
        return requests
    return [r._replace(suggestion=None) for r in requests]


def _glob(pattern: str, root_dir: str | None = None) -> list[str] | None:
    """The paths pattern matches, sorted; None when more than _MAX_GLOB, or
    when the pattern is longer than any path (its regex would take long to
    build)."""
    if len(pattern) > _PATH_MAX:
        return None
    found = []
    for path in glob.iglob(pattern, root_dir=root_dir):
        _on_time()
        found.append(path)
        if len(found) > _MAX_GLOB:
            return None
    return sorted(found)


def _recursive_secrets(part: _Part) -> list[str]:
    """grep -r, rg and diff -r read every file below their directories: the
    secrets there, and with -R / -L / --follow the places outside that symlinks
    lead to."""
    core = part.core
    name = core[0] if core else ""
    if not _row(name).has("recursive"):
        return []
    recursive, follows, hidden = _search_shape(name, core[1:])
    if not recursive:
        return []
    options, paths = _operands(core)
    targets = []
    for word in paths:
        matches = [os.path.join(part.cwd, path) for path in _expanded(word, part.cwd) or [word]]
        targets += [match for match in matches if os.path.isdir(match)]
    # grep -r PATTERN and rg PATTERN search the working directory; so may
    # rg -g*.ref WORD, where WORD may be the pattern or a file
    lone = len(paths) == 1 and any(map(_gives_pattern, options))
    # and rg -A 2 PATTERN: the operands as the program reads them, option values aside
    operands = _parse(core[1:], _row(name).reads_value)[1]
    searched = operands if any(map(_gives_pattern, options)) else operands[1:]
    if name != "diff" and (not paths or lone or not searched):
        targets.append(part.cwd)
    return [secret for target in targets for secret in _secrets_under(target, hidden, follows)]


def _search_shape(name: str,
                  args: tuple[str, ...]) -> tuple[bool, bool, bool]:
    """(recurses, follows symlinks, reads hidden files) for grep, rg or diff, reading options as
    the program does: abbreviations (--rec), -d recurse, --directories=recurse, -uu. Every word
    that looks like an option counts, even after -- or as another option's value."""
    options = [arg for arg in args if arg.startswith("-")]
    follows = _has(options, "dereference-recursive", "follow")
    if name == "rg":
        # rg recurses by default and skips hidden files
        unrestricted = sum(_abbreviates(arg, "unrestricted") for arg in options)
        unrestricted += sum(len(_short_flags(arg)) and arg.count("u") for arg in options)
        hidden = _has(options, "hidden", "unrestricted", short=".") or unrestricted >= 2
        return True, follows or _has(options, short="L"), hidden
    recursive = _has(options, "recursive", "dereference-recursive", short="rR")
    for arg, value in zip(args, (*args[1:], "")):
        option, given, directories = arg.partition("=")
        if _abbreviates(option, "directories"):
            recursive |= (directories if given else value) == "recurse"
        elif _short_flags(arg):
            recursive |= arg == "-drecurse" or (arg.endswith("d") and value == "recurse")
    # grep -r and diff -r read hidden files
    return recursive, follows or _has(options, short="R"), True


def _suggest(words: tuple[str, ...]) -> str | None:
    """The narrowest useful pattern for an "always" grant, matched against shlex.join(words)."""
    if not words:
        return None
    exact = _escape(shlex.join(words))
    program = posixpath.basename(words[0])
    # an assignment, a wrapper, a path or a name with a space first; a destructive program
    unusual_start = (_ASSIGNMENT.match(words[0]) or _row(program).has("wrapper")
                     or words[0].startswith("/") or len(words[0].split()) != 1)
    destructive = (_row(program).has("exact") or program == "mkfs"
                   or program.startswith("mkfs."))
    if unusual_start or destructive:
        return exact
    options = [word for word in words if word.startswith("-")]
    if _row(program).has("moded") and options:
        # `tar -tf x.tar` is `tar -tf *`, never `tar *`: that would grant -x and --to-command;
        # with its options elsewhere too (tar -f x -t), which one picks the mode is not kept
        return _escape(shlex.join(words[:2])) + " *" if options == [words[1]] else exact
    if program == "git" and _has(options, "--force", "--hard", short="fD"):
        # granting the whole subcommand would grant its forced form (-rf, --force-with-lease too)
        return exact
    shape = _arity(words)
    if shape is None:
        # an unknown CLI with a plain word after an option: its shape is
        # unknown
        return exact
    key_length, arity = shape
    naming = words[key_length:arity]
    if len(words) < arity or any(w.startswith("-") for w in naming):
        # "make" alone, "git -C dir push", "python -c code"
        return exact
    return _escape(shlex.join(words[:arity])) + " *"


def _arity(words: tuple[str, ...]) -> tuple[int, int] | None:
    """(words in the matching table key, words that name the command). A known
    CLI: its table entry. An unknown one: its leading plain words, so a
    multi-level CLI we do not know gets the narrowest rule (`foo s3 ls b` ->
    `foo s3 ls b *`); None when a plain word follows an option."""
    for n in (3, 2, 1):
        arity = _row(*words[:n]).arity
        if len(words) >= n and arity:
            return n, arity
    plain_word = r"[a-z][a-z0-9_-]*"
    plain = 1
    while plain < len(words) and re.fullmatch(plain_word, words[plain]):
        plain += 1
    rest = [w for w in words[plain:] if not w.startswith("-")]
    if plain < len(words) and any(re.fullmatch(plain_word, w) for w in rest):
        return None
    return 1, plain


# ---------------------------------------------------- bash: provably read-only

def _not_read_only(part: _Part, root: str = "") -> str | None:
    """None when this simple command provably only reads; otherwise why not."""
    if part.unliteral:
        return part.unliteral
    for op, target in part.redirects:
        if _redirect_writes(op, target) and target not in _SAFE_DEVICES:
            return f"the redirection {op} {target} writes a file"
    words = part.words
    if not words:
        return None
    if _ASSIGNMENT.match(words[0]):
        return "it assigns a variable"
    name, args = words[0], words[1:]
    if "/" in name:
        return f"it runs {name} by path"
    # the programs read by a parser of their own
    own_parser = {"git": _git_problem, "find": _find_problem, "cd": _cd_problem}.get(name)
    if own_parser:
        return own_parser(args)
    if name == "printf":
        if args and args[0].startswith("-v"):
            return "printf -v assigns a variable"
        return None
    if name in ("test", "[") and {"-v", "-R"} & set(args):
        return (f"{name} -v evaluates an array subscript, "
                "which can run a command")
    if name == "command":
        if args[:1] in (("-v",), ("-V",)):
            return None
        return "command runs another program"
    row = _row(name)
    if not row.has("read"):
        return f"{name} is not on the read-only list"
    own = _project_program(name, root)
    if own:
        return (f"{name} would run the project's own {own} "
                "(a directory of the project is on PATH)")
    if row.has("data"):
        return None
    problem, positional, values = _options_problem(name, args, row)
    if problem:
        return problem
    if row.has("writes-second") and len(positional) > 1:
        return f"{name} writes its second file argument"
    if name == "jq" and any(_JQ_UNSAFE.search(w) for w in positional):
        return "the jq program reads the environment or other files"
    if name == "man" and any("/" in w for w in positional):
        return "man: a page file's .so requests read other files"
    if name == "sed":
        # its scripts: -e's values, else the first operand
        for script in values or positional[:1] or [""]:
            if not _SED_PRINT.fullmatch(script):
                return (f"sed: the script {script!r} is not a print of line N "
                        "or lines M,N (Np, M,Np)")
    return None


def _cd_problem(args: tuple[str, ...]) -> str | None:
    """cd DIR is followed; not what else cd does: options (-P resolves links
    another way), `-` ($OLDPWD), no directory ($HOME), and a relative name
    bash first looks up in the $CDPATH it inherits."""
    if len(args) != 1 or args[0].startswith("-"):
        return "cd is followed only with one directory (no option, - or none)"
    own = args[0].startswith(("/", "./", "../")) or args[0] in (".", "..")
    if os.environ.get("CDPATH") and not own:
        return f"cd {args[0]} may be found through $CDPATH"
    return None


_BUILTINS = frozenset(
    "echo printf cd pwd test [ true false type command".split()
)


def _project_program(name: str, root: str) -> str | None:
    """Where PATH finds an external program when that is inside the project (an
    activated .venv/bin holding a committed `cat`); commands get only PATH's
    absolute entries."""
    if not root or name in _BUILTINS:
        return None
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        found = os.path.join(entry, name)
        if not os.path.isabs(entry):
            continue
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return found if sandbox.within(os.path.realpath(found), [root]) else None
    return None


class _Option(NamedTuple):
    # "--name" as written before any "=", or "-x" for one letter of a cluster
    name: str
    # which word of the arguments it is in
    at: int
    # its value, or None for a flag
    value: str | None = None
    # the value is the next word (-n 5, --lines 5), not attached (-n5, --lines=5)
    separate: bool = False


def _parse(args, takes_value, stop: bool = False,
           numeric: bool = False) -> tuple[list[_Option], list[str], int]:
    """(options, operands, the index where parsing stopped): the one option parser, as getopt_long
    reads argv. "--" ends the options; a cluster -abc is -a -b -c, and its first letter that takes a
    value (takes_value("-n")) takes the rest of the word or the next word; --name=value, or
    --name value when takes_value("--name"). stop: the first operand ends the options (a wrapper's
    command, git's subcommand): the index returned is that operand's, or the one after "--".
    numeric: -5 is a count (head -5) and is skipped."""
    options = []
    operands = []
    k = 0
    while k < len(args):
        _on_time()
        at = k
        arg = args[k]
        k += 1
        if arg == "--":
            operands += args[k:]
            return options, operands, k
        if arg.startswith("--"):
            name, attached, value = arg.partition("=")
            if attached:
                options.append(_Option(name, at, value))
            elif takes_value(name):
                following = args[k] if k < len(args) else ""
                options.append(_Option(name, at, following, True))
                k += 1
            else:
                options.append(_Option(name, at))
        elif arg.startswith("-") and len(arg) > 1:
            if numeric and _is_number(arg[1:]):
                continue
            for i, letter in enumerate(arg[1:], 2):
                _on_time()
                if not takes_value("-" + letter):
                    options.append(_Option("-" + letter, at))
                elif arg[i:]:
                    options.append(_Option("-" + letter, at, arg[i:]))
                    break
                else:
                    following = args[k] if k < len(args) else ""
                    options.append(_Option("-" + letter, at, following, True))
                    k += 1
        elif stop:
            return options, operands, k - 1
        else:
            operands.append(arg)
    return options, operands, k


def _options_problem(name: str, args: tuple[str, ...], row: Program):
    """(why an option is not safe or None, the positional arguments, the options' values), by
    the rules above POLICY (sort --comp, an abbreviation of --compress-program, is not listed)."""
    options, positional, _ = _parse(args, row.takes_value, numeric=row.has("counts"))
    for option in options:
        if not row.lists(option.name):
            problem = f"{name}: the option {option.name} is not on its read-only list"
            return problem, positional, []
        # (a long option's value may not even be "-"; a short one's may: stdin)
        dash = option.value == "-" and not option.name.startswith("--")
        if option.separate and option.value.startswith("-") and not dash:
            problem = f"{name}: the value of {option.name} looks like an option ({option.value})"
            return problem, positional, []
    values = [o.value for o in options if o.value is not None]
    return None, positional, values


def _abbreviates(word: str, *names: str) -> bool:
    """Whether option word --x or --x=v may stand for one of names (given
    with or without their dashes): GNU and git accept any unambiguous
    prefix."""
    given = word.partition("=")[0]
    if not given.startswith("--") or given == "--":
        return False
    return any(name.lstrip("-").startswith(given[2:]) for name in names)


def _git_problem(args: tuple[str, ...]) -> str | None:
    options, sub, rest = _git_split(args)
    for option in options:
        flag = option.partition("=")[0]
        if flag not in _GIT_READ_ONLY:
            return f"git: the option {flag} is not on the read-only list"
    if sub is None:
        return None
    row = _row("git", sub)
    if row.has("read") and not row.has("forms") and _classify_git(args) != EXECUTE:
        # `git branch NAME`, `git tag NAME`: a listing command in a shape that changes refs
        return f"git {sub} with these arguments changes the repository"
    return _git_form_problem(sub, rest)


def _git_form_problem(sub: str, rest: tuple[str, ...]) -> str | None:
    """None when `git SUB REST` is listed with its options, or for a forms subcommand has one of
    the read-only shapes of its three-word rows."""
    row = _row("git", sub)
    name = f"git {sub}"
    if row.has("forms") and rest:
        row = _row("git", sub, rest[0])
        name = f"git {sub} {rest[0]}"
        rest = rest[1:]
    if not row.has("read"):
        return f"{name} is not on the read-only list"
    problem, plain, _ = _options_problem(name, rest, row)
    if problem:
        return problem
    if row.most is not None and len(plain) > row.most:
        return f"{name} takes at most {row.most} argument(s) in its read-only form"
    return None


def _find_problem(args: tuple[str, ...]) -> str | None:
    k = 0
    while k < len(args):
        arg = args[k]
        k += 1
        if arg + ":" in _FIND_SAFE:
            k += 1
        elif arg.startswith("-") or arg in ("(", ")", "!", ","):
            if arg not in _FIND_SAFE:
                return f"find: {arg} is not on the read-only list"
    return None


# ------------------------------------------------ bash: work in the repository

def _destroys_work(part: _Part, root: str) -> str:
    """Why this command destroys work that exists only in this repository, or
    "". These ask every time, whatever the rules, and --yes alone does not
    approve them."""
    core = part.core
    name = core[0] if core else ""
    if name == "git":
        # GIT_CONFIG_PARAMETERS=..., GIT_CONFIG_COUNT=... set what git -c sets
        before = part.words[:len(part.words) - len(core)]
        if any(_ASSIGNMENT.match(w) and w.startswith("GIT_CONFIG") for w in before):
            return ("git configuration in the environment (GIT_CONFIG_*) can redefine what "
                    "any git command does")
        return _git_destroys(core[1:], part.cwd)
    if name == "rm":
        verb = "rm -r" if _recursive(core) else "rm"
        targets = _operands(core)[1]
        return next(filter(None, (_rm_destroys(t, part.cwd, root, verb) for t in targets)), "")
    if name == "find" and "-delete" in core:
        unfiltered = {"-delete", "-mindepth", "-maxdepth", "-depth", "-print",
                      "-xdev", "-L", "-H", "-P"}
        options = [w for w in core[1:] if w.startswith("-")]
        if all(w in unfiltered for w in options):
            for start in _find_roots(core[1:]):
                if _resolve(start, part.cwd) == root:
                    return "find -delete over the whole project"
                why = _rm_destroys(start, part.cwd, root, "find -delete")
                if why:
                    return why
    remote = _remote_destroys(core)
    if remote:
        return remote
    if _publishes(core):
        return f"{' '.join(core[:2])} puts a release in a public registry for good"
    copy = _rsync_deletes(core)
    if copy:
        return _rm_destroys(copy, part.cwd, root, "rsync --delete")
    return ""


# What puts a package in a registry for everyone: --yes runs the network its program needs (an
# install), but a publish cannot be taken back (npm forbids a version published once, forever)
PUBLISHES = frozenset(tuple(entry.split()) for entry in """
    npm publish, pnpm publish, yarn publish, yarn npm publish, bun publish, cargo publish,
    twine upload, gem push, poetry publish, uv publish, hatch publish, flit publish,
    dotnet nuget push, docker push, gh release create, gh release upload""".split(","))


def _publishes(core: tuple[str, ...]) -> bool:
    """npm publish, cargo publish, twine upload, docker push, gh release create…: its program and
    first subcommand, or its first two (yarn npm publish, dotnet nuget push), are a row above."""
    words = tuple(word for word in core[:4] if not word.startswith("-"))
    return words[:2] in PUBLISHES or words[:3] in PUBLISHES


# An HTTP DELETE as curl, wget and gh api spell it: -X DELETE, -sXDELETE, --request DELETE,
# --method=DELETE (the method's case is the server's business: any case asks)
_HTTP_DELETE = re.compile(r"(?:^| )(?:-[a-zA-Z]*X ?|--request[= ]|--method[= ])DELETE\b", re.I)


def _remote_destroys(core: tuple[str, ...]) -> str:
    """Why a command takes from a host for good what no checkpoint holds, or "": gh
    repo|release|issue|... delete (delete-asset), an HTTP DELETE (curl, wget, gh api, httpie's
    method operand), a secret overwritten (gh secret set), a repository made public."""
    name = core[0] if core else ""
    subcommands = [word for word in core[1:4] if not word.startswith("-")]
    options = " ".join(core[1:])
    if name == "gh" and any(word.startswith("delete") for word in subcommands[1:]):
        return "a gh deletion removes from the host what no checkpoint holds"
    if name in ("curl", "wget") or core[:2] == ("gh", "api"):
        if _HTTP_DELETE.search(options):
            return f"an HTTP DELETE ({name}) removes from a host what no checkpoint holds"
    if name in ("http", "https", "xh", "xhs"):
        if any(word.upper() == "DELETE" for word in core[1:]):
            return f"an HTTP DELETE ({name}) removes from a host what no checkpoint holds"
    if name == "gh" and subcommands[:2] == ["secret", "set"]:
        return "gh secret set replaces a secret on the host, and its old value is gone for good"
    if name == "gh" and subcommands[:1] == ["repo"] and re.search(r"--(visibility[= ]|)public\b",
                                                                   options):
        return "a repository made public cannot be made unseen"
    return ""


def _rm_destroys(target: str, cwd: str, root: str, verb: str = "rm -r") -> str:
    """rm -r (or verb) of .git (or inside it), of the project, of a directory holding it,
    or of everything at its root (*, ?*, .[!.]*, ../* from a subdirectory); plain rm, which
    deletes files only, of a file in .git (a pack, a ref; a stale lock aside)."""
    target = target.replace("$PWD", cwd).replace("${PWD}", cwd)
    recursive = verb != "rm"
    # (compared lowered: on macOS and Windows, .GIT is .git)
    root = root.lower()
    path = _resolve(target, cwd).lower()
    base = _wildcard_base(target, cwd)
    if base is not None:
        parent = _resolve(posixpath.dirname(target) or ".", cwd).lower()
        if recursive and base.lower() == root == parent:
            return f"{verb} of everything at the project's root ({target})"
        path = base.lower()
    git_dir = posixpath.join(root, ".git")
    if sandbox.within(path, [git_dir]) and (recursive or not target.endswith(".lock")):
        return f"{verb} of the repository's history ({target})"
    if recursive and sandbox.within(root, [path]):
        return f"{verb} of the project or a directory holding it ({target})"
    return ""


def _git_destroys(args: tuple[str, ...], cwd: str = "") -> str:
    global_options, sub, rest = _git_split(args)
    if any(o == "-c" or o.startswith("--config-env") for o in global_options):
        return ("git -c can redefine what any git command does "
                "(an alias, clean.requireForce)")
    if any(o.startswith("--exec-path=") for o in global_options):
        return "git --exec-path=DIR runs git's own programs (git-SUB) from DIR"
    if sub is None:
        return ""
    # (after --, -n is a path: git clean -fdx -- -n . deletes)
    options, plain = _operands(("git", *rest))

    if sub == "clone" and _has(options, "--config", short="c"):
        return "git clone -c sets the new repository's config before its fetch (core.gitProxy)"
    # (git 2.46's `git config set KEY VALUE`)
    keys = plain[1:2] if plain[:1] == ["set"] else plain[:1]
    running = [key for key in keys if not sandbox.GIT_CONFIG_PLAIN.fullmatch(key)]
    if sub == "config" and running and _git_form_problem(sub, rest):
        return (f"git config {running[0]} defines what a later git command may run (a credential "
                "helper, an alias), later in this line too, before the guard puts it back")
    if sub == "reset" and _has(options, "--hard", "--merge", "--keep"):
        return "git reset --hard discards uncommitted changes"
    if sub == "clean" and not _has(options, "--dry-run", short="n"):
        if _has(options, short="xX"):
            return "git clean -x deletes ignored files, which no checkpoint holds"
        return "git clean deletes untracked files"
    if sub == "push":
        forced = _has(options, "--force", "--force-with-lease", "--mirror", "--delete",
                      "--prune", short="fd")
        # a refspec +main forces, :main deletes
        forced_refspec = any(a.startswith(("+", ":")) for a in plain)
        if forced or forced_refspec:
            return ("a forced push (or a deletion) rewrites "
                    "the remote's history")
    if sub == "checkout" and _has(options, short="B"):
        return "git checkout -B resets a branch of that name"
    if sub == "checkout":
        forced = "--" in rest or _has(options, "--force", "--pathspec-from-file", short="f")
        paths = [a for a in plain if a == "." or a.startswith(":")
                 or os.path.exists(os.path.join(cwd, a))]
        if forced or len(plain) >= 2 or paths:
            return "git checkout over paths discards uncommitted changes"
    # the index copied over the work tree
    index_over = sub == "checkout-index" and _has(options, "--force", short="f")
    if index_over or (sub == "read-tree" and _has(options, "--reset") and _has(options, short="u")):
        return f"git {sub} overwrites uncommitted changes"
    if sub == "restore":
        worktree = _has(options, "--worktree", short="W")
        if worktree or not _has(options, "--staged", short="S"):
            return "git restore discards uncommitted changes"
    if sub == "rm" and not _has(options, "--cached"):
        if _has(options, "--force", short="f") or "." in plain:
            return "git rm -f deletes files with their uncommitted changes"
    if sub == "stash" and {"drop", "clear"} & set(plain):
        return "git stash drop/clear deletes stashed work"
    if sub == "branch":
        deletes = _has(options, "--delete", short="d")
        forced = _has(options, "--force", short="f")
        if _has(options, short="D") or (deletes and forced):
            return "git branch -D deletes an unmerged branch"
        # (-M is --move --force, -C --copy --force; -f NAME resets NAME)
        if _has(options, short="MC") or (forced and plain):
            return "git branch -M/-C overwrites a branch of that name"
    if sub == "update-ref" and _has(options, "--delete", short="d"):
        return "git update-ref -d deletes a ref with its reflog"
    if sub == "worktree" and "remove" in plain and _has(options, "--force", short="f"):
        return "git worktree remove --force discards that work tree's uncommitted changes"
    reflog_edit = sub == "reflog" and {"expire", "delete"} & set(plain)
    if sub in ("filter-branch", "filter-repo") or reflog_edit:
        return f"git {sub} rewrites history"
    if sub == "switch" and _has(options, "--discard-changes", "--force", short="f"):
        return "git switch --discard-changes discards uncommitted changes"
    if sub == "switch" and _has(options, "--force-create", short="C"):
        return "git switch -C resets a branch of that name"
    # a git command this policy knows by name is not an alias (git lfs, svn and send-email are
    # installed apart from git: where one is missing, an alias of its name runs)
    if sub in ("lfs", "svn", "send-email") or _row("git", sub) is NOBODY:
        return (f"git {sub} may be an alias (or a program on PATH), which "
                "can stand for any command: reset --hard, !sh -c ...")
    return ""


# What a work-tree checkpoint brings back (issue 20): the files, HEAD, the branch and the index. Not
# another machine (a push), ignored files, stashes, other branches, history, or the .git that holds
# the objects a checkpoint borrows: those keep asking under --yes.
_UNDONE_BY_CHECKPOINT = (
    "git reset --hard", "git clean deletes untracked", "git checkout over paths",
    "git restore", "git rm -f", "git switch --discard-changes", "git checkout-index",
    "git read-tree",
)


def checkpoint_undoes(destructive: str) -> bool:
    """Whether a rewind to the checkpoint taken before it brings back what this destroys."""
    return destructive.startswith(_UNDONE_BY_CHECKPOINT)


def _recursive(core: tuple[str, ...]) -> bool:
    """rm -r, -R or --recursive (--rec: GNU takes any prefix); for chmod,
    chown and chgrp only -R, since their -r is a mode; no other program."""
    letters = {"rm": "rR", "chmod": "R", "chown": "R", "chgrp": "R"}.get(core[0] if core else "")
    return letters is not None and _has(_operands(core)[0], "--recursive", short=letters)


def _state_write(writing: list[_Part]) -> str | None:
    """A command that is not provably read-only naming a path in khaelor's own
    state: cp, mv, tee, sed -i, install, ln, rsync, dd of=, git checkout --, a
    script given the path ..."""
    for part in writing:
        for word in _path_arguments(part.core):
            _on_time()
            path = _word_path(word, part.cwd)
            why = _protected(path) if path else None
            if why:
                return why
    return None


# ---------------------------------------------------- bash: the hardline floor

def _fork_bomb(command: str) -> str | None:
    if "(" not in command and "function" not in command:
        return None     # no function is defined (the scans below took 100 ms in 600 KB)
    unquoted = _QUOTED.sub(lambda m: m[1] or "''", command)
    defined = set()
    bombs = []
    for definition in _FUNCTION_DEFINITION.finditer(unquoted):
        _on_time()
        name = definition["n"] or definition["f"]
        defined.add(name)
        body = _FUNCTION_BODY.match(unquoted, definition.end())
        body = body[1] if body else ""
        calls = [word for word in re.findall(_NAME, body) if word == name]
        # f(){ f & f; }: it calls itself twice, once in the background
        if len(calls) >= 2 and "&" in body:
            bombs.append(name)
    bombs += [m["n"] for m in _SELF_PIPE.finditer(unquoted)
              if m["n"] in defined]
    if bombs:
        return f"fork bomb ({bombs[0]})"
    return None


def _floor_reason(part: _Part, home: str) -> str | None:
    """Why this simple command is refused outright, or None. Reads the
    de-obfuscated core."""
    for op, target in part.redirects:
        if op not in _WRITE_REDIRECTS:
            continue
        if _is_device(target):
            return f"write to device {target}"
        if _kernel_control(target):
            return f"write to the kernel's controls ({target})"
    name = part.core[0] if part.core else ""
    args = part.core[1:]
    cwd = part.cwd
    options, targets = _operands(part.core)
    doomed = None
    if _recursive(part.core) or name == "mv":
        # (each operand once: `npx rm rm rm …`, 3,000 words, took 100 ms in every command)
        doomed = next((t for t in dict.fromkeys(targets) if _catastrophic(t, home, cwd)), None)
    if _recursive(part.core) and doomed:
        verb = "delete" if name == "rm" else name
        return f"recursive {verb} of {doomed}"
    if name == "mv" and doomed:
        return f"moving {doomed} away"
    if name == "mkfs" or name.startswith("mkfs.") or name == "mke2fs":
        return f"formatting a filesystem ({name})"
    only_shows = {"-l", "--list", "-s", "--show", "--help", "--version"}
    # (a disk or power row may be the program, or the program and one of its words: nvme format)
    kinds = " ".join(_row(name, *args[k:k + 1]).kinds for k in range(-1, len(args))).split()
    if "disk" in kinds and not set(options) & only_shows:
        return f"rewriting a disk ({name})"
    # what it writes: cp's first argument is what it copies from (cat counts: cat x /dev/sda)
    written = {"cp": targets[1:], "ddrescue": targets[1:], "tee": targets, "shred": targets,
               "cat": targets}.get(name, [])
    if name == "dd":
        # (only dd's: _written reads the world, globs and trees, which the floor must not wait on)
        written = _written(part.core)
    if any(_is_device(t) for t in written):
        return f"{name} onto a device"
    control = next((t for t in written if _kernel_control(t)), None)
    if control and name != "cat":
        return f"write to the kernel's controls ({control})"
    if name == "find":
        roots = _find_roots(args)
        doomed_root = next((r for r in roots if _catastrophic(r, home, cwd)), None)
        runs = {"-exec", "-execdir", "-ok", "-okdir"}
        if doomed_root and "-delete" in args:
            return f"find -delete from {doomed_root}"
        if doomed_root and set(args) & runs:
            return f"find -exec over {doomed_root}"
    if "power" in kinds:
        return f"changing the machine's power state ({' '.join(part.core)})"
    if name == "kill" and _kills_everything(args):
        return "kill -1 signals every process"
    if name == "killall5":
        return "killall5 signals every process"
    copy = _rsync_deletes(part.core)
    if copy and _catastrophic(copy, home, cwd):
        return f"rsync --delete into {copy}"
    return None


def _rsync_deletes(core: tuple[str, ...]) -> str | None:
    """Where rsync --delete (--del is --delete-during) deletes what its source lacks, or None."""
    options, operands = _operands(core)
    deletes = any(o == "--del" or o.startswith("--delete") for o in options)
    if core[:1] == ("rsync",) and operands and deletes:
        return operands[-1]
    return None


def _has(options: list[str], *longs: str, short: str = "") -> bool:
    """Whether option words name any of these long options (--ha for --hard: GNU and git take any
    unambiguous prefix) or short letters (in a cluster: -rf)."""
    return any(_abbreviates(o, *longs) or _short_flags(o) & set(short) for o in options)


def _option_value(options: list[_Option], short: str, long: str) -> str | None:
    """The value of the last -s or --long in options (--dir=D for --directory: GNU takes any
    unambiguous prefix), or None."""
    value = None
    for option in options:
        if option.value is not None and (option.name == short or _abbreviates(option.name, long)):
            value = option.value
    return value


def _short_flags(word: str) -> set[str]:
    """The letters of a cluster of short options (-rf); none for --long."""
    if word[:1] == "-" and word[1:2] != "-":
        return set(word[1:])
    return set()


def _find_roots(args: tuple[str, ...]) -> tuple[str, ...]:
    """find's starting points: after its -L/-H/-P/-D/-O options, before the first expression."""
    k = 0
    while k < len(args):
        arg = args[k]
        if arg not in ("-L", "-H", "-P") and not arg.startswith(("-D", "-O")):
            break
        # -D takes the next word (its debug options)
        k += 2 if arg == "-D" else 1
    end = k
    while end < len(args) and args[end][:1] not in ("-", "(", "!"):
        end += 1
    return args[k:end] or (".",)


def _kills_everything(args: tuple[str, ...]) -> bool:
    """kill -9 -1, kill -KILL -1, kill -s KILL -1, kill -- -1: -1 as the target
    is every process (in kill -1 PID, -1 is the signal: SIGHUP)."""
    k = 0
    if args[:1] in (("-s",), ("-n",), ("--signal",)):
        k = 2
    elif len(args) > 1 and args[0][:1] == "-" and args[0] != "--":
        k = 1
    if args[k:k + 1] == ("--",):
        k += 1
    return "-1" in args[k:]


def _catastrophic(target: str, home: str, cwd: str) -> bool:
    """Would a recursive delete of target take a system directory or the home
    directory? A variable we could not resolve may well be unset, and bash
    expands an unset variable to nothing: `rm -rf "$BUILD_DIR/"` is `rm -rf /`
    when BUILD_DIR is unset."""
    target = _PARAMETER.sub("", target)
    if not target:
        return False
    # "/*", "~/*", "/u*", "/home/al*": a wildcard in a protected directory may
    # name any of its entries, the home directory among them
    base = _wildcard_base(target, cwd)
    path = _resolve(target, cwd) if base is None else base
    # a system directory, the home directory, or a directory holding it
    return path in _PROTECTED_DIRS or sandbox.within(home, [path])


def _resolve(target: str, cwd: str) -> str:
    absolute = _absolute(target)
    if absolute:
        return absolute
    return posixpath.normpath(posixpath.join(cwd, target))


def _kernel_control(target: str) -> bool:
    return (_absolute(target) or "").startswith(("/proc/sys", "/sys/"))


def _is_device(target: str) -> bool:
    path = _absolute(target) or ""
    if not path.startswith("/dev/") or path in _SAFE_DEVICES:
        return False
    # descriptors, terminals, shared memory and bash's sockets
    not_devices = ("/dev/fd/", "/dev/pts/", "/dev/shm/", "/dev/tcp/",
                   "/dev/udp/")
    return not path.startswith(not_devices)


def _absolute(target: str) -> str | None:
    # "//", "/./" and "/home/.." all mean "/"; normpath keeps a leading "//",
    # so strip it first
    if not target.startswith("/"):
        return None
    return posixpath.normpath("/" + target.lstrip("/"))


def _core(words) -> list[str]:
    """Strip assignments and wrappers (sudo, env, nice, xargs ...) down to the
    program that really runs, named by its basename (/usr/bin/rm -> rm)."""
    words = list(words)
    while words:
        if _ASSIGNMENT.match(words[0]):
            words = words[1:]
            continue
        name = posixpath.basename(words[0]) or words[0]
        if name.startswith("python") and words[1:3] == ["-m", "pip"]:
            # python -m pip is pip
            return ["pip", *words[3:]]
        if not _row(name).has("wrapper"):
            return [name, *words[1:]]
        words = _unwrap(name, words[1:])
    return words


# the options by which a wrapper runs its command in another directory
_CHDIR = {"env": ("-C", "--chdir"), "sudo": ("-D", "--chdir"), "run0": ("-D", "--chdir"),
          "unshare": ("-w", "--wd"), "systemd-run": ("", "--working-directory")}


def _unwrap(name: str, args: list[str]) -> list[str]:
    """The words after a wrapper's own options, read by _parse (`sudo -Eu root rm` skips root as
    the value of -u); for env also its NAME=value words, `-` (-i), and -S: the string split into
    the command's words (`env -S 'rm -rf x'`, `-iS…`, `--spl …`); see _in_directory for -C."""
    scripts = _shell_scripts((name, *args), (), None) if name == "runuser" else []
    if scripts:
        # runuser -l root -c CMD (--command=CMD, --session-command CMD) runs CMD through a shell
        return ["sh", "-c", "\n".join(scripts)]
    short_chdir, long_chdir = _CHDIR.get(name, ("", ""))
    directory = None
    k = 0
    while True:
        options, _, end = _parse(args[k:], _row(name).reads_value, stop=True)
        for option in options:
            if option.name == short_chdir or (long_chdir and _abbreviates(option.name, long_chdir)):
                directory = option.value
            if name == "command" and args[k + option.at] in ("-v", "-V"):
                # only prints where the program is
                return []
            if name == "env" and (option.name == "-S" or _abbreviates(option.name, "split-string")):
                # its string is env's own words again (quotes dropped, \_ a blank): -S '-i sh -c x'
                after = k + option.at + 1 + option.separate
                split = _SHELL_WORD.findall(option.value.replace("\\_", " "))
                words = [re.sub(r"['\"\\]", "", word) for word in split] + args[after:]
                return _in_directory(directory, _unwrap(name, words))
        k += end
        env_word = name == "env" and k < len(args) and args[k - 1:k] != ["--"]
        if env_word and (args[k] == "-" or "=" in args[k]):
            k += 1
            continue
        break
    rest = args[k + _row(name).skip:]
    if name == "flock" and rest[:1] in (["-c"], ["--command"]):
        # flock FILE -c COMMAND runs it through sh
        return ["sh", "-c", *rest[1:]]
    if name == "parallel" and ":::" in rest:
        # parallel CMD ::: ARG... runs CMD for each ARG (at {}, else at the end); no CMD: each ARG
        at = rest.index(":::")
        template = " ".join(rest[:at])
        template += "" if "{}" in template else " {}"
        return ["sh", "-c", "\n".join(template.replace("{}", arg) for arg in rest[at + 1:])]
    if name == "sg" and rest:
        # sg GROUP [-c] COMMAND runs it through sh
        return ["sh", "-c", " ".join(rest[rest[:1] == ["-c"]:])]
    if name == "watch" and not _has(args[:k], "--exec", short="x"):
        # watch runs its words through sh -c, joined by spaces (with -x, as they are); plain
        # words read the same either way
        if any(shlex.quote(word) != word for word in rest):
            return ["sh", "-c", " ".join(rest)]
    return _in_directory(directory, rest)


def _in_directory(directory: str | None, words: list[str]) -> list[str]:
    """A command run in another directory (env -C DIR CMD) is `sh -c 'cd DIR && CMD'`."""
    if directory is None or not words:
        return words
    return ["sh", "-c", f"cd {shlex.quote(directory)} && {shlex.join(words)}"]


# ------------------------------------------------------- bash: simple commands

class _ShellLine:
    """Every simple command one bash line runs, in order, nested ones included (the list is in
    the module docstring)."""

    def __init__(self, command: str, cwd: str, home: str):
        self.home = home
        self.parts: list[_Part] = []
        # operators, redirections or nesting: no "always" suggestion
        self.compound = False
        self.floor: str | None = None
        # a construct that makes no command provably read-only, and no rule may allow unasked
        self.unfollowed: str | None = None
        # the statement that changed what later commands run (export GIT_PAGER=…)
        self.setter: str | None = None
        # the working directories the line may run in
        self.visited: list[str] = [cwd]
        # xargs commands with what is piped into them (for the destroy-work tier)
        self.fed: list[_Part] = []
        # the code interpreters and make are given: words, heredocs, what is piped in
        self.code: list[str] = []
        # characters expansions may still add: A=xx; A+=$A; A+=$A ... doubles
        self.room = 2 * len(command) + _EXPANSION_ROOM
        self._parse(command, cwd, 0)

    def _spend(self, text_length: int) -> None:
        self.room -= text_length
        if self.room < 0:
            raise _ParseError("it expands to far more text than it holds")

    def _parse(self, command: str, cwd: str, depth: int) -> None:
        if depth > _MAX_NESTING:
            raise _ParseError("nested too deeply")
        if "$\\\n" in command:
            # bash joins the lines first: $\<newline>'…' is $'…', "$\<newline>(…)" runs (…)
            raise _ParseError("a line continuation right after $ is not followed")
        self.floor = self.floor or _fork_bomb(command)
        tokens, _ = _lex(command)
        segments = _segments(tokens)
        has_operator = any(k == "op" and v != "\n" for k, v in tokens)
        self.compound |= len(segments) > 1 or has_operator
        # variables assigned earlier in this line; $PWD (and ~+) is where it runs
        env: dict[str, str] = {"PWD": cwd}
        # what the previous command printed, when known, if it is piped here; whether that is
        # only where find started
        piped: str | None = None
        found = False
        for words, redirects, after_pipe in segments:
            _on_time()
            redirect_targets = [target for _, target in redirects]
            for pieces in [*words, *redirect_targets]:
                for kind, value in pieces:
                    # a command substitution runs too
                    if kind in ("sub", "dqsub"):
                        self.compound = True
                        self._parse(value, cwd, depth + 1)
            # (the positions of the words an expansion made)
            expanded, made = [], set()
            for pieces in words:
                fields = self._expand(pieces, env)
                if _unliteral([pieces], cwd):
                    made.update(range(len(expanded), len(expanded) + len(fields)))
                expanded += fields
            while expanded and expanded[0] in (*_KEYWORDS, "coproc", "function"):
                # coproc NAME { …; }, function NAME { …; }: the body runs
                named = expanded[0] in ("coproc", "function") and expanded[2:3] == ["{"]
                if expanded[0] == "function" and not named:
                    break
                if expanded[0] == "coproc":
                    self.unfollowed = "it starts a coprocess"
                drop = 2 if named else 1
                del expanded[:drop]
                made = {k - drop for k in made}
            if len(expanded) - len(_core(expanded)) in made:
                # ${X:-ls} runs $X when it is set, $c what the loop gave it
                self.unfollowed = "its command word is made by an expansion"
            while expanded and expanded[-1] == "}":
                expanded.pop()
            targets = tuple((op, " ".join(self._expand(t, env)))
                            for op, t in redirects)
            skipped = bool(expanded) and expanded[0] in _SKIPPED_STATEMENTS
            if skipped:
                self.unfollowed = f"its {expanded[0]} statement sets variables not followed here"
            for word in expanded[3:] if expanded[:1] == ["for"] else []:
                # for c in echo "rm -rf ~"; do $c; done: a word may be run as a command line
                self.floor = self.floor or _unparsed_floor(word, cwd, self.home)
            unliteral = _unliteral([*words, *redirect_targets], cwd)
            # (> x for y: a word after a redirection is no keyword; bash runs `for` and writes x)
            if (expanded or targets) and (targets or not skipped):
                self._remember_assignments(expanded, env)
                stdin_text = piped if after_pipe else None
                cwd = self._add(tuple(expanded), targets, cwd, depth, env,
                                unliteral, stdin_text, found and after_pipe)
            piped = _printed(expanded)
            found = expanded[:1] == ["find"]
            if found:
                # find / | xargs rm -rf: what it prints starts at its roots
                piped = " ".join(_find_roots(tuple(expanded[1:])))

    def _add(self, words: tuple[str, ...], redirects, cwd: str, depth: int, env: dict,
             unliteral: str | None = None,
             stdin_text: str | None = None, found: bool = False) -> str:
        """Record one simple command and what it runs in turn; return the cwd
        after it. found: stdin_text is where a find started (the floor reads it so; the
        destroy-work tier does not: find . -name '*.tmp' need not print .)."""
        core = tuple(_core(words))
        if self.setter:
            self.unfollowed = f"it runs after {self.setter}, which changes what it does"
        if cwd not in self.visited:
            self.visited.append(cwd)
        part = _Part(words, core, redirects, cwd, unliteral,
                     tuple(self.visited))
        self.parts.append(part)
        self.floor = self.floor or _floor_reason(part, self.home)
        if re.fullmatch(r"\$\{?[A-Za-z_]\w*\}?", words[0] if words else ""):
            # $x rm -rf ~: a variable not set here may be empty, and then what follows it runs
            self._add(words[1:], redirects, cwd, depth, env, unliteral)
        name = core[0] if core else ""
        scripts = []
        if _row(name).has("shell"):
            # bash -c SCRIPT, or a script fed by <<EOF, <<< or a pipe
            scripts = _shell_scripts(core, redirects, stdin_text)
        elif name == "eval":
            scripts = [" ".join(core[1:])]
        elif name == "alias":
            # alias ll='CMD …': ll runs CMD on a later line
            scripts = [word.partition("=")[2] for word in core[1:]]
        elif name == "trap":
            # trap CMD SIGNAL... runs CMD when the signal (or EXIT) comes
            args = core[2:] if core[1:2] == ("--",) else core[1:]
            scripts = args[:1] if len(args) > 1 and args[0][:1] != "-" else []
        elif name == "git":
            scripts = _git_scripts(core[1:])
        elif name in _COMMAND_OPTIONS:
            scripts = _option_scripts(name, core[1:])
        elif name in _VIM:
            scripts = _vim_shell_lines(core[1:])
        elif name in ("fd", "fdfind"):
            # fd -x CMD ARG...: the words after -x (--exec, -X, --exec-batch) are a command
            runs = ("-x", "--exec", "-X", "--exec-batch")
            at = next((k for k, word in enumerate(core) if word in runs), 0)
            scripts = [shlex.join(core[at + 1:])] if at else []
        elif name in _SSH_VALUED or name == "sed":
            scripts, unread = (_sed_scripts if name == "sed" else _ssh_scripts)(name, core[1:])
            self.unfollowed = self.unfollowed or unread
        elif name == "tmux":
            scripts, stored = _tmux_scripts(core[1:])
            if stored:
                self.unfollowed = f"tmux {stored} keeps commands to run later, not read here"
        # strace -o '|CMD' (or '!CMD') pipes its trace into CMD, which a shell runs
        scripts = [*scripts, *(w[1:] for w in _wrappers_written(part) if w[:1] in ("|", "!"))]
        if _runs_code(name) or name == "make":
            # python3 -c CODE, awk PROGRAM, make -f - <<< 'all:; CMD': see _runs_denied
            fed = [target for op, target in redirects if op in ("<<", "<<-", "<<<")]
            self.code.append(" ".join([*core[1:], *fed, stdin_text or ""]))
        program = posixpath.basename(words[0] if words else "")
        if stdin_text and program == "xargs":
            # echo / | xargs rm -rf: what is piped in becomes the command's
            # arguments
            fed = part._replace(core=(*core, *stdin_text.split()))
            self.floor = self.floor or _floor_reason(fed, self.home)
            if not found:
                self.fed.append(fed)
        for script in scripts:
            self.compound = True
            self._parse(script, cwd, depth + 1)
        if name == "find":
            self._add_find_commands(core, cwd, depth)
        printf_v = name == "printf" and core[1:2] and core[1].startswith("-v")
        if (words and not core) or _row(name).has("sets") or printf_v:
            # export GIT_PAGER=…, unset GIT_CONFIG_COUNT, read X, hash -p ./x ls
            self.setter = self.setter or " ".join(words)[:40]
        if name in ("cd", "pushd", "popd"):
            # where cd -, cd $X, pushd +N or popd went ($PWD, ~+) is unknown
            env.pop("PWD", None)
            # (pushd alone swaps the top two directories)
            default = self.home if name == "cd" else "-"
            target = core[-1] if len(core) > 1 else default
            if target[:1] not in ("-", "+") and "$" not in target:
                cwd = posixpath.normpath(posixpath.join(cwd, target))
                env["PWD"] = cwd
        return cwd

    def _add_find_commands(self, core: tuple[str, ...], cwd: str,
                           depth: int) -> None:
        """find -exec CMD {} ; runs CMD too; {} stands for what find found,
        which starts at its first starting point."""
        start = _find_roots(core[1:])[0]
        for k, word in enumerate(core):
            if word not in ("-exec", "-execdir", "-ok", "-okdir"):
                continue
            end = next((j for j in range(k + 1, len(core)) if core[j] in (";", "+")), len(core))
            command = core[k + 1:end]
            if command:
                words = tuple(start if w == "{}" else w for w in command)
                self._add(words, (), cwd, depth + 1, {})

    def _remember_assignments(self, words: list[str], env: dict) -> None:
        declarations = ("export", "declare", "local", "readonly", "typeset")
        if words[:1] and words[0] in declarations:
            # declare -x C=...
            words = [w for w in words[1:] if not w.startswith("-")]
        if words and all(_ASSIGNMENT.match(w) for w in words):
            for word in words:
                name, _, value = word.partition("=")
                # NAME+=value appends to what NAME held
                before = env.get(name[:-1], "") if name.endswith("+") else ""
                env[name.rstrip("+")] = before + value

    def _expand(self, pieces: list, env: dict) -> list[str]:
        """Quote removal and the expansions a word can hide behind: braces, ~,
        $HOME, $IFS, variables assigned earlier in the line, $(echo ...).
        Returns the resulting words."""
        if len(pieces) == 1 and pieces[0][0] == "raw" and _BRACES.search(pieces[0][1]):
            words = []
            for word in _brace_expand(pieces[0][1]):
                self._spend(len(word))
                words += self._expand([("raw", word)], env)
            return words
        # A="x y" and A=$B are not word-split
        assignment = (pieces and pieces[0][0] == "raw"
                      and _ASSIGNMENT.match(pieces[0][1]))
        split = not assignment
        chunks = []
        quoted = False
        for index, (kind, text) in enumerate(pieces):
            if kind == "raw":
                if index == 0:
                    # ~ starting a word or an assignment's value; ~+ is $PWD, ~user
                    # that user's home
                    text = re.sub(r"^([A-Za-z_]\w*\+?=)?~(\+|[A-Za-z_][\w.-]*)?(?=/|$)",
                                  lambda m: self._tilde(m, env), text)
                chunks.append(self._substitute(text, env, split))
            elif kind in ("dq", "lit", "arith", "locale"):
                quoted = True
                if kind == "dq":
                    text = self._substitute(text, env, False)
                chunks.append(text)
            else:
                # a command substitution: its output is known only for plain
                # echo/printf
                output = self._static_output(text, env)
                quoted |= kind == "dqsub"
                self._spend(len(output or ""))
                if output is None:
                    chunks.append(f"$({text})")
                elif kind == "sub" and split:
                    chunks.append(re.sub(r"\s+", "\0", output.strip()))
                else:
                    chunks.append(output)
        fields = [f for f in "".join(chunks).split("\0") if f]
        if fields:
            return fields
        return [""] if quoted else []

    def _tilde(self, match: re.Match, env: dict) -> str:
        directory = self.home
        if match[2] == "+":
            directory = env.get("PWD")
        elif match[2]:
            directory = os.path.expanduser("~" + match[2])
        if directory is None or directory.startswith("~"):
            return match[0]
        return (match[1] or "") + directory

    def _substitute(self, text: str, env: dict, split: bool) -> str:
        """Parameter expansion; "\\0" marks where an unquoted value splits into
        words. What we cannot know stays as written (and counts as unknown to
        the floor and the path checks)."""
        def value(match):
            name = match["b"] or match["n"]
            found = self._parameter(name, match["op"] or "", env)
            if found is None:
                return match[0]
            self._spend(len(found))
            if found == "\0":
                return "\0" if split else " "
            return re.sub(r"\s+", "\0", found) if split else found
        return _PARAMETER.sub(value, text)

    def _parameter(self, name: str, op: str, env: dict) -> str | None:
        """The value of ${name<op>...} when it is knowable: $HOME, variables
        set earlier in the line, defaults of unset variables (${X:-/}), $IFS (a
        word break, also ${IFS:0:1}), a known value trimmed (${HOME%/*}, ${HOME:0:1})."""
        if name == "IFS":
            return "\0"
        if name == "KHAELOR_HOME" and name not in env:
            return khaelor_home()
        known = name in env or name == "HOME"
        found = env.get(name, self.home) if known else None
        if op == "" or op.startswith((":?", "?")):
            return found
        if op.startswith((":-", ":=")):
            return found if found else self._word(op[2:], env)
        if op[:1] in "-=":
            return found if found is not None else self._word(op[1:], env)
        if op.startswith((":+", "+")) and found is not None:
            return self._word(op.removeprefix(":")[1:], env) if found or op[0] == "+" else ""
        if found is None or len(found) > _PATH_MAX:
            return None
        substring = re.fullmatch(r":\s*(-?[0-9]*)(?::\s*(-?[0-9]*))?", op)
        if substring:
            start = int(substring[1] or 0)
            if substring[2] is None:
                return found[start:]
            length = int(substring[2] or 0)
            return found[start:][:length] if length >= 0 else found[start:length]
        if op[0] in "%#" and not re.search(r"[$`'\"\\]", op):
            return _trimmed(found, op)
        return None

    def _word(self, word: str, env: dict) -> str:
        """The word of ${X:-word}, expanded: ${X:-$HOME}, ${X:-~}."""
        word = self._substitute(word, env, False)
        if word[:1] == "~" and word[1:2] in ("", "/"):
            return self.home + word[1:]
        return word

    def _static_output(self, inner: str, env: dict) -> str | None:
        """What $(inner) prints, when it is plain echo, printf or pwd."""
        try:
            segments = _segments(_lex(inner)[0])
        except _ParseError:
            return None
        if len(segments) != 1 or segments[0][1]:
            return None
        words = []
        for pieces in segments[0][0]:
            words += self._expand(pieces, env)
        if words[:1] == ["pwd"] and set(words[1:]) <= {"-L", "-P"}:
            return env.get("PWD")
        return _printed(words)


def _trimmed(value: str, op: str) -> str:
    """${X%pattern} (the shortest suffix matching it removed), %%, # and ## (prefixes)."""
    longest = op[:2] in ("%%", "##")
    pattern = op[1 + longest:]
    # what is left, from the longest cut to the shortest
    cuts = range(len(value) + 1)
    if op[0] == "%":
        kept = [value[:i] for i in cuts if fnmatch.fnmatchcase(value[i:], pattern)]
    else:
        kept = [value[i:] for i in reversed(cuts) if fnmatch.fnmatchcase(value[:i], pattern)]
    if not kept:
        return value
    return kept[0] if longest else kept[-1]


def _brace_expand(word: str) -> list[str]:
    """{rm,-rf,/} -> rm -rf /; depth-first and capped, so {a,b}{a,b}... cannot
    explode."""
    done = []
    todo = [word]
    # each step finishes a word or opens one brace
    for _ in range(2 * _MAX_GLOB):
        _on_time()
        if not todo or len(done) >= _MAX_GLOB:
            break
        word = todo.pop(0)
        match = _BRACES.search(word)
        if not match:
            done.append(word)
            continue
        alternatives = match[1].split(",")[:_MAX_GLOB]
        todo[:0] = [word[:match.start()] + alt + word[match.end():] for alt in alternatives]
    return done


def _shell_scripts(core: tuple[str, ...], redirects,
                   stdin_text: str | None) -> list[str]:
    """What a shell runs: its -c argument, else a heredoc, here-string or piped
    text we know. Both readings of -c count: the word after it (fish's -c CMD) and bash's
    command, the first word after all the options (bash -c -e CMD, -oc errexit CMD, -c -- CMD)."""
    scripts = []
    for i, word in enumerate(core[1:], 1):
        following = list(core[i + 1:i + 2])
        # --command CMD, --session-command=CMD (su, runuser, script, fish; by any prefix), each
        option, given, value = word.partition("=")
        if _abbreviates(option, "command", "session-command"):
            scripts += [value] if given else following
        # -c, or a cluster of short options holding it (-lc)
        elif word[:1] == "-" and word[1:2] != "-" and "c" in word and following:
            operand = _shell_operand(core)
            scripts += following + list(core[operand:operand + 1]) * (operand > i + 1)
    fed = [target for op, target in redirects if op in ("<<", "<<-", "<<<")]
    return scripts or fed or ([stdin_text] if stdin_text else [])


# git subcommands: their options whose value is a command line git runs here
_GIT_RUNS = {entry.split()[0]: tuple(entry.split()[1:]) for entry in """
    rebase -x exec, difftool -x extcmd, grep -O open-files-in-pager, fetch upload-pack,
    pull upload-pack, ls-remote upload-pack, clone -u upload-pack, fetch-pack upload-pack exec,
    push receive-pack exec, send-pack receive-pack exec, archive exec""".split(",")}


def _git_scripts(args: tuple[str, ...]) -> list[str]:
    """The command lines a git subcommand runs: rebase --exec CMD, difftool --extcmd CMD, bisect
    run CMD..., submodule foreach CMD..., grep -OCMD, and for a remote on this machine (a path,
    file://) the program it starts there: fetch --upload-pack CMD, push --receive-pack CMD."""
    _, sub, rest = _git_split(args)
    runs = _GIT_RUNS.get(sub)
    if runs:
        def takes(option: str) -> bool:
            return option in runs or _abbreviates(option, *runs)
        return [o.value for o in _parse(rest, takes)[0] if takes(o.name) and o.value]
    if sub == "bisect" and rest[:1] == ("run",):
        return [shlex.join(rest[1:])]
    if sub == "submodule" and "foreach" in rest:
        command = rest[rest.index("foreach") + 1:]
        while command and command[0].startswith("-"):
            command = command[1:]
        return [" ".join(command)] if command else []
    return []


# options whose value is a command line the program runs (tar --to-command=CMD, -I CMD;
# sort --compress-program=CMD; rg --pre CMD)
_COMMAND_OPTIONS = {
    "tar": ("-I", "-F", "to-command", "use-compress-program", "info-script", "new-volume-script",
            "rsh-command", "checkpoint-action"),
    "sort": ("compress-program",),
    "rg": ("pre",),
    "man": ("-P", "pager", "-H", "html"),
    "nix-shell": ("run", "command"),
    "wget": ("use-askpass",),
}
# an Ex command that runs a shell line: `!CMD`, also after silent, read or write (`r !CMD`)
_EX_BANG = re.compile(r"[\s:]*(?:(?:sil(?:ent)?!?|r(?:ead)?|w(?:rite)?)\s*)*!(.*)", re.S)


def _vim_shell_lines(args: tuple[str, ...]) -> list[str]:
    """What the Ex commands vim runs at start (-c CMD, --cmd CMD, +CMD) run in a shell."""
    commands = [args[k + 1] for k in range(len(args) - 1) if args[k] in ("-c", "--cmd")]
    commands += [arg[1:] for arg in args if arg.startswith("+")]
    return [match[1] for match in map(_EX_BANG.match, commands) if match]


def _option_scripts(name: str, args: tuple[str, ...]) -> list[str]:
    """The command lines named by the options of _COMMAND_OPTIONS (`--checkpoint-action=exec=CMD`
    too)."""
    runs = _COMMAND_OPTIONS[name]
    if name == "tar":
        args = _tar_arguments(args)     # `tar xIf CMD A` is `tar -x -I CMD -f A`

    def named(option: str) -> bool:
        # (tar's --checkpoint is an option of its own, not short for --checkpoint-action)
        return option in runs or (_abbreviates(option, *runs) and option != "--checkpoint")
    scripts = []
    for option in _parse(args, lambda o: named(o) or _row(name).reads_value(o))[0]:
        value = option.value or ""
        if named(option.name) and _abbreviates(option.name, "checkpoint-action"):
            if value.startswith("exec="):
                scripts.append(value[len("exec="):])
        elif named(option.name):
            scripts.append(value)
    return scripts


# GNU sed's e command at a command's place (after its address, !): `1e CMD` runs CMD, a bare e
# the pattern space; and s///e, whose e flag runs what the substitution made
_SED_E = re.compile(r"(?:^|[;\n{}])(?:/(?:[^/\\\n]|\\.)*/[IM]*|\\(.).*?\1|[\d$,~+!\s])*e"
                    r"(?:[ \t]+([^\n]*)|(?=[;\n}]|$))")
_SED_S_E = re.compile(r"s(.)(?:(?!\1)[^\\\n]|\\.)*\1(?:(?!\1)[^\\\n]|\\.)*\1[0-9gpiImM]*e")
# sed's w and W commands and s///w: each writes the file named to the end of its line
_SED_W = re.compile(r"(?:^|[;\n{}])(?:/(?:[^/\\\n]|\\.)*/[IM]*|\\(.).*?\1|[\d$,~+!\s])*[wW]"
                    r"[ \t]*([^\n]*)|s(.)(?:(?!\3)[^\\\n]|\\.)*\3(?:(?!\3)[^\\\n]|\\.)*\3"
                    r"[0-9gpiImMe]*w[ \t]*([^\n]*)")


def _sed_takes(option: str) -> bool:
    return option in ("-e", "-f", "-l") or _abbreviates(option, "expression", "file", "line-length")


def _sed_script(args: tuple[str, ...]) -> str:
    """sed's script: -e's values joined by newlines, or its first operand."""
    options, operands, _ = _parse(args, _sed_takes)
    given = [o.value or "" for o in options if o.name == "-e" or _abbreviates(o.name, "expression")]
    return "\n".join(given or operands[:1])


def _sed_written(args: tuple[str, ...]) -> list[str]:
    """The files sed's w commands write (sed -n '/x/w out' f; s/a/b/w out)."""
    found = [m[2] or m[4] for m in _SED_W.finditer(_sed_script(args))]
    return [name for name in found if name and name not in ("/dev/stdout", "/dev/stderr")]


def _sed_scripts(_: str, args: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The command lines GNU sed's e commands run, and why not all can be read: s///e and a bare e
    run text sed makes, -f a script file."""
    options = _parse(args, _sed_takes)[0]
    if any(o.name == "-f" or _abbreviates(o.name, "file") for o in options):
        return [], "sed -f reads its script from a file not read here"
    script = _sed_script(args)
    lines = [m.group(2) for m in _SED_E.finditer(script) if (m.group(2) or "").strip()]
    if _SED_S_E.search(script) or len(lines) < len(_SED_E.findall(script)):
        return lines, "sed's e runs text sed makes as a command"
    return lines, None


# the short options that take a value, of the programs that run ssh (or a command in its place)
_SSH_VALUED = {"ssh": "BbcDEeFIiJLlmOopQRSWw", "scp": "cDFiJloPSX", "sftp": "BbcDFiJloPRSsX",
               "rsync": "BMTef"}
# ssh's options (-o NAME=VALUE) whose value is a command it runs on this machine
_SSH_LOCAL_COMMANDS = ("proxycommand", "localcommand", "knownhostscommand")


def _ssh_scripts(name: str, args: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The command lines ssh, scp, sftp or rsync runs here: `-o ProxyCommand=CMD` (LocalCommand,
    KnownHostsCommand), scp's and sftp's -S PROGRAM, rsync's -e/--rsh CMD; and why not all can be
    read: -F names an ssh config, which may hold such a command."""
    def takes(option: str) -> bool:
        if option.startswith("--"):
            return name == "rsync" and _abbreviates(option, "rsh")
        return option[1:] in _SSH_VALUED[name]
    runs = {"scp": "-S", "sftp": "-S", "rsync": "-e"}.get(name)
    scripts, unread = [], None
    for option in _parse(args, takes)[0]:
        # -o NAME=VALUE, -o "NAME VALUE"
        key, _, command = re.sub(r"\s*=\s*|\s+", "=", option.value or "", count=1).partition("=")
        if option.name == "-o" and key.lower() in _SSH_LOCAL_COMMANDS:
            scripts.append(command)
        elif option.name == runs or (option.name.startswith("--") and takes(option.name)):
            try:
                words = shlex.split(option.value or "")
            except ValueError:
                words = []
            if posixpath.basename(words[0] if words else "") != "ssh":
                scripts.append(option.value)
                continue
            # `rsync -e 'ssh -p 2222'`: ssh itself is what rsync is for; what ssh runs is read
            more, unread_too = _ssh_scripts("ssh", tuple(words[1:]))
            scripts += more
            unread = unread or unread_too
        elif option.name == "-F" and option.value != "/dev/null":
            unread = f"{name} -F {option.value} reads an ssh config, which may run commands"
    return scripts, unread


def _shell_operand(core: tuple[str, ...]) -> int:
    """Where a shell's first word after its options is, as bash reads them: -o and -O (+o, +O)
    take the next word, as do --rcfile and --init-file; - and -- end the options."""
    k = 1
    while k < len(core) and core[k][:1] in ("-", "+"):
        word = core[k]
        k += 1
        if word in ("-", "--"):
            break
        if word[1:2] == "-":
            k += word in ("--rcfile", "--init-file")
        else:
            k += word.count("o") + word.count("O")
    return k


def _printed(words: list[str]) -> str | None:
    """What echo or printf with literal words prints, or None."""
    if words[:1] == ["echo"]:
        # from the first word that is not one of echo's options
        options = ("-n", "-e", "-E")
        start = next((k for k, word in enumerate(words) if k and word not in options), len(words))
        return " ".join(words[start:])
    if words[:1] == ["printf"] and len(words) == 2 and "%" not in words[1]:
        return words[1].replace("\\n", "\n")
    return None


_EXPANSION = re.compile(r"\$[\w{(@*#?$!-]")
_BRACE_MARKS = re.compile(r"[{},]|\.\.")


def _unliteral(words: list, cwd: str) -> str | None:
    """Why a simple command's words are not all literal: an expansion, a
    substitution, brace expansion, ~user, or a glob that expands to an option
    (a file named --co=bash)."""
    for pieces in words:
        for index, (kind, text) in enumerate(pieces):
            if kind in ("sub", "dqsub"):
                return "it runs a command substitution"
            if kind == "arith":
                return "it uses arithmetic expansion"
            if kind == "locale":
                return 'it uses a $"..." string, which the locale translates'
            if kind in ("raw", "dq") and _EXPANSION.search(text):
                return "it expands a variable"
            if kind == "raw" and index == 0 and re.match(r"~[^/]", text):
                return "it uses ~user expansion"
        # what bash sees unquoted: quoted text cannot open a brace or bracket
        unquoted = "".join(t if k == "raw" else "_" for k, t in pieces)
        if _brace_expansion(unquoted):
            return "it uses brace expansion"
        opening = unquoted.find("[")
        if opening >= 0 and "]" in unquoted[opening:]:
            return ("it uses a bracket glob, which bash and this check "
                    "may read differently")
        problem = _glob_into_option(pieces, cwd)
        if problem:
            return problem
    return None


def _brace_expansion(unquoted: str) -> bool:
    """Whether bash brace-expands this: a {...} holding a comma or a sequence
    (..) at its own level, however deep ({a,b}, {1..3}, x{a,{b}}). One pass,
    with a stack of the braces still open."""
    separated = []
    for mark in _BRACE_MARKS.finditer(unquoted):
        _on_time()
        if mark[0] == "{":
            separated.append(False)
        elif mark[0] != "}" and separated:
            separated[-1] = True
        elif mark[0] == "}" and separated and separated.pop():
            return True
    return False


def _glob_into_option(pieces: list, cwd: str) -> str | None:
    wildcard = any(kind == "raw" and any(c in text for c in "*?[")
                   for kind, text in pieces)
    if not wildcard:
        return None
    # only the unquoted pieces are a pattern
    parts = [_bash_glob(text) if kind == "raw" else glob.escape(text) for kind, text in pieces]
    try:
        matches = _glob("".join(parts), root_dir=cwd)
    except (OSError, ValueError):
        return "a glob could not be expanded"
    if matches is None:
        return f"a glob matches more than {_MAX_GLOB} paths"
    option = next((match for match in matches if match.startswith("-")), None)
    return f"a glob expands to an option ({option})" if option else None


# ---------------------------------------------------------------- bash: tokens

def _segments(tokens: list) -> list[tuple[list, list, bool]]:
    """Split tokens at separators into (words, [(redirection, target)], after a
    pipe) per simple command."""
    segments = [([], [], False)]
    stream = iter(tokens)
    for kind, value in stream:
        if kind == "word":
            segments[-1][0].append(value)
        elif value in _SEPARATORS:
            # the next simple command
            segments.append(([], [], value in ("|", "|&")))
        else:
            # a redirection: its target is the next token
            target = next(stream, ("op", None))
            if target[0] != "word":
                raise _ParseError(f"redirection {value} has no target")
            segments[-1][1].append((value, target[1]))
    return [s for s in segments if s[0] or s[1]]


def _lex(text: str, i: int = 0, closing: bool = False) -> tuple[list, int]:
    """(tokens, the index after them): ("op", operator) and ("word",
    pieces); a piece is (kind, text), kind one of raw (unquoted), dq
    (double-quoted), lit (single-quoted or escaped), locale (the mark of a
    $"..." string), arith (an arithmetic expansion's text), sub and dqsub
    (the source of a command substitution). A heredoc body becomes its `<<`
    word's content. closing: the body of a $( ), ended by its unmatched ")"
    just as bash ends it (comments and heredocs included)."""
    tokens = []
    pieces = []
    raw = []
    heredocs = []
    # set after << until its delimiter word is read
    delimiter_op = None
    # ( opened inside a $( ) body and not yet closed
    depth = 0
    n = len(text)

    def piece(kind, value):
        if raw:
            pieces.append(("raw", "".join(raw)))
            raw.clear()
        if kind:
            pieces.append((kind, value))

    def end_word():
        nonlocal delimiter_op
        piece(None, None)
        if pieces == [("raw", "=~")]:
            # [[ a =~ (a)# ]]; reboot: the regex's ( ) | # are not what they are elsewhere
            raise _ParseError("a [[ =~ ]] regular expression is not followed")
        if pieces:
            tokens.append(("word", list(pieces)))
            if delimiter_op:
                heredocs.append((delimiter_op, tokens[-1][1]))
                delimiter_op = None
            pieces.clear()

    while i < n:
        _on_time()
        c = text[i]
        at_word_start = not pieces and not raw
        # <(cmd) and >(cmd) starting a word are process substitutions
        process_substitution = (c in "<>" and text[i + 1:i + 2] == "("
                                and at_word_start)
        arithmetic_command = text.startswith("((", i) and at_word_start
        if c == "\\":
            # backslash-newline continues the line
            if text[i + 1:i + 2] != "\n":
                piece("lit", text[i + 1:i + 2])
            i += 2
        elif c == "'" or text.startswith("$'", i):
            i = _lex_single(text, i, piece)
        elif c == '"' or text.startswith('$"', i):
            if c == "$":
                # $"..." is looked up in the locale's message catalogue
                # (TEXTDOMAIN): it may stand for any text
                piece("locale", "")
            i = _lex_double(text, i + 1 + (c == "$"), piece)
        elif c == "`" or text.startswith("$(", i) or process_substitution:
            i, literal, commands = _substitution(text, i)
            piece("arith" if literal else None, literal)
            for command in commands:
                piece("sub", command)
        elif text.startswith("$[", i) or arithmetic_command:
            # bash reads these as arithmetic, where `<<`, `#` and `,` mean
            # other things than here
            raise _ParseError("arithmetic as (( )) or $[ ] is not followed")
        elif c == "#" and at_word_start:
            # a comment, to the end of the line
            i = text.find("\n", i)
            if i < 0:
                i = n
        elif c in " \t":
            end_word()
            i += 1
        elif c in _OPERATOR_START:
            op = next(o for o in _OPERATORS if text.startswith(o, i))
            if op == "(" and (pieces or raw) and not text.startswith("()", i):
                # a=(x)#y; reboot: after an array's ")" bash reads on, no comment
                raise _ParseError("an array assignment or a pattern's ( is not followed")
            if op not in _SEPARATORS:
                _redirection_word(pieces, raw, op)
            end_word()
            i += len(op)
            depth += (op == "(") - (op == ")")
            if closing and depth < 0:
                if ("word", [("raw", "case")]) in tokens:
                    # bash ends $( ) at its own `)`, not at a case pattern's: `$(case x in x) …)`
                    raise _ParseError("a case statement inside $( ) is not followed")
                return tokens, i
            tokens.append(("op", op))
            if op in ("<<", "<<-"):
                delimiter_op = op
            elif op == "\n" and heredocs:
                i = _read_heredocs(text, i, heredocs)
                heredocs.clear()
        else:
            # a run of characters that mean nothing special here (in a ${…}, its quotes dropped:
            # ${U:-"x" /} reads as x and /, and "a b" as a and b, which is only ever stricter)
            braced = _BRACED.match(text, i)
            end = braced.end() if braced else _ORDINARY.match(text, i + 1).end()
            raw.append(re.sub("['\"]", "", text[i:end]))
            i = end
    if closing:
        raise _ParseError("unbalanced parenthesis")
    end_word()
    return tokens, i


def _redirection_word(pieces: list, raw: list, op: str) -> None:
    """The word written right before a redirection: a descriptor number (2>)
    is dropped; {name}> makes bash store a new descriptor's number in the
    variable name (`{PATH}<<<x` sets PATH to 10), which is not followed."""
    head = "".join(text for _, text in pieces) + "".join(raw)
    if head.startswith("{") and head.endswith("}"):
        raise _ParseError(f"{head}{op} assigns a descriptor number to "
                          "a variable")
    if op[0] in "<>" and not pieces and _is_number(head):
        raw.clear()


def _lex_single(text: str, i: int, piece) -> int:
    """Lex '...' (literal) or $'...' (backslash escapes decoded) at i; return the index after it."""
    ansi_c = text[i] == "$"
    start = i + 1 + ansi_c
    end = _ANSI_C_BODY.match(text, start).end() if ansi_c else text.find("'", start)
    if text[end:end + 1] != "'":
        raise _ParseError("unterminated quote")
    body = text[start:end]
    piece("lit", _ansi_c(body) if ansi_c else body)
    return end + 1


def _lex_double(text: str, i: int, piece) -> int:
    """Lex a double-quoted string from just after its quote; return the index after it."""
    buf = []

    def flush(kind=None, value=None):
        # always a piece, so "" is still an (empty) word
        piece("dq", "".join(buf))
        buf.clear()
        if kind:
            piece(kind, value)

    while i < len(text):
        _on_time()
        c = text[i]
        if c == '"':
            flush()
            return i + 1
        if c == "\\" and text[i + 1:i + 2] in ("$", "`", '"', "\\", "\n"):
            flush("lit", text[i + 1].strip("\n"))
            i += 2
        elif text.startswith("$[", i):
            raise _ParseError("arithmetic as $[ ] is not followed")
        elif c == "`" or text.startswith("$(", i):
            i, literal, commands = _substitution(text, i)
            buf.append(literal or "")
            for command in commands:
                flush("dqsub", command)
        else:
            end = _DOUBLE_QUOTED.match(text, i + 1).end()
            buf.append(text[i:end])
            i = end
    raise _ParseError("unterminated double quote")


def _substitution(text: str, i: int) -> tuple[int, str | None, list[str]]:
    """At "$(", "<(", ">(" or "`": (index after it, its literal text when it is
    arithmetic, the commands it runs). Arithmetic is data, except the
    substitutions inside it."""
    if text[i] == "`":
        end = _BACKTICK_BODY.match(text, i + 1).end()
        if text[end:end + 1] != "`":
            raise _ParseError("unterminated backtick")
        return end + 1, None, [re.sub(r"\\([`$\\\"])", r"\1", text[i + 1:end])]
    if text.startswith("$((", i):
        # its end is found as a $( )'s is, at the ")" that closes it
        _, end = _lex(text, i + 2, closing=True)
        return end, text[i:end], _nested_subs(text[i + 3:end - 2])
    start = i + 2
    _, end = _lex(text, start, closing=True)
    return end, None, [text[start:end - 1]]


def _read_heredocs(text: str, i: int, heredocs: list) -> int:
    """Consume the bodies after a line; each becomes its `<<` word's only
    content, and an unquoted body's substitutions run. heredocs: (<< or <<-, the word)."""
    for op, target in heredocs:
        delimiter = "".join(value for _, value in target)
        quoted = any(kind != "raw" for kind, _ in target)
        if not re.fullmatch(r"[\w.-]+", delimiter):
            raise _ParseError(f"heredoc delimiter {delimiter!r} "
                              "is not a plain word")
        lines = []
        while i < len(text):
            end = text.find("\n", i)
            if end < 0:
                line, i = text[i:], len(text)
            else:
                line, i = text[i:end], end + 1
            closing = line.lstrip("\t") if op == "<<-" else line
            if closing == delimiter:
                break
            lines.append(line)
        body = "\n".join(lines)
        if not quoted and any(line.endswith("\\") for line in lines):
            raise _ParseError("a heredoc line ends in a backslash, "
                              "which bash joins with the next")
        if quoted:
            target[:] = [("lit", body)]
        else:
            # an unquoted body is expanded like a double-quoted string
            subs = [("sub", s) for s in _nested_subs(body)]
            target[:] = [("dq", body)] + subs
    return i


def _nested_subs(text: str) -> list[str]:
    """The $( ) and backtick commands in text that quotes do not protect
    (heredoc bodies, arithmetic)."""
    found, i = [], 0
    while True:
        _on_time()
        mark = _SUBSTITUTION_MARK.search(text, i)
        if mark is None:
            return found
        i = mark.end()
        if mark[0][0] != "\\":
            i, _, commands = _substitution(text, mark.start())
            found += commands


def _ansi_c(body: str) -> str:
    """Decode bash's $'...' escapes ($'\\x72\\m' is "rm", $'\\U2d' is "-")."""
    named = {
        "n": "\n", "t": "\t", "r": "\r", "e": "\x1b", "E": "\x1b",
        "a": "\a", "b": "\b", "f": "\f", "v": "\v",
        "\\": "\\", "'": "'", '"': '"', "?": "?",
    }

    def decode(match):
        _on_time()
        code = match[1]
        if code[0] in "xuU" and code[1:]:
            value = int(code[1:], 16)
            if value > 0x10FFFF:
                raise _ParseError("an escape beyond Unicode")
            return chr(value)
        if code[0] in "01234567":
            return chr(int(code, 8))
        if code[0] == "c":
            return chr(ord(code[1:2].upper() or "@") & 0x1F)
        return named.get(code, "\\" + code)

    escape = (r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}"
              r"|[0-7]{1,3}|c.?|.)")
    # a NUL ends the string: $'re\0x'boot is "reboot"
    return re.sub(escape, decode, body, flags=re.S).partition("\0")[0]


def _is_number(text: str) -> bool:
    """ASCII digits only: "٣".isdigit() is True, but bash takes it as a file name."""
    return text.isascii() and text.isdigit()


# ------------------------------------------------ the trust model: which files' rules may grant
# khaelor.py (the composition root) reads the files and the trust records; what follows decides
# from the bytes it is given, and writes nothing.

# a repository's own permission files, as `khaelor trust` reviews them
PROJECT_FILES = (".khaelor/config.json", ".claude/settings.json", ".claude/settings.local.json")


def trust_key(path: Path) -> str | None:
    """What a trust record is kept under: the file's own place in this project. A permission file
    reached through a symlink (the file or a folder on its way) can never be trusted: it could be
    another project's trusted file, or change without this project changing."""
    folder = Path(os.path.realpath(path.parent.parent))
    place = folder / path.parent.name / path.name
    if os.path.realpath(path) != str(place):
        return None
    return str(place)


def is_trusted(records: dict, path: Path, data: bytes) -> bool:
    """Trusted: `records` (trust.json) holds the hash of exactly these bytes (the file's one read)
    for this place: the user ran `khaelor trust` on them."""
    key = trust_key(path)
    if key is None or not data:
        return False
    return records.get(key) == content_hash(data)


def config_layer(source: str, config: dict, text: str, project_root: Path, kind: str,
                 trusted: bool) -> Layer:
    """A KHAELOR config file's rules (`config`: its checked content); a Claude-style permissions
    block pasted into it ({"allow": [...], "deny": [...]}) is read in Claude Code's syntax."""
    if isinstance(config.get("permissions"), dict):
        layer = Layer(source, {}, kind, trusted, claude=True, text=text)
        return claude_rules(layer, config["permissions"], os.path.realpath(project_root))
    return Layer(source, config, kind, trusted, text=text)


def trust_notice(layers) -> str | None:
    """One line when a repository's file grants something that is ignored until trusted."""
    ignored = untrusted_grants(layers)
    if not ignored:
        return None
    # one rule as written: a Claude Code "Bash(…)" line stands for a rule per command capability
    kinds = dict.fromkeys(_COMMAND_CAPABILITIES, "command")
    written = {(r.source, r.pattern, r.action, kinds.get(r.capability, r.capability))
               for r in ignored}
    # "settings.json:4": the file, not each line
    files = {re.sub(r":\d+$", "", rule.source) for rule in ignored}
    count = f"{len(written)} permission" + "s" * (len(written) != 1)
    return (f"{', '.join(sorted(files))} would grant {count};"
            " they are ignored until you review and trust them with `khaelor trust`")
