"""The one exception type for bad input, and the translation of OS errors into it."""

from __future__ import annotations

import difflib
import errno
import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class FathomError(Exception):
    """An error caused by the user's input; the message names the problem and the fix.

    The CLI prints it without a traceback and exits with status 2. Some carry what a caller
    acts on, set where they are raised and absent otherwise (read them with ``getattr(e,
    name, default)``): ``errno`` of the OS error behind it (:func:`os_error`), ``holder_pid``
    of the process that holds a lock (:class:`fathom.rundir.lock.DirLock`) and
    ``space_advised`` once a full disk's advice was added
    (:func:`fathom.train.guards.disk_full_advice`).
    """

    errno: int | None
    holder_pid: int | str
    space_advised: bool


class InvalidValue(FathomError, ValueError):
    """A value refused by a check that config validation and a constructor share (the model
    checks of :mod:`fathom.config.models`): pydantic takes it as a ``ValueError`` and names
    the config field, a constructor's caller gets a :class:`FathomError`."""


SUGGEST_CUTOFF = 0.6
"""``difflib`` similarity ``2 M / T`` (matched characters over both lengths) a known name needs
to be offered for a mistyped one (``ciresan-fsat`` -> ``ciresan-fast``: 0.92)."""


def did_you_mean(word: str, known: Iterable[str], n: int = 1, prefix: str = "") -> str:
    """``"did you mean 'ciresan-fast'?"`` naming the known names closest to ``word`` (at most
    ``n``, similarity >= :data:`SUGGEST_CUTOFF`), each shown after ``prefix``; ``""`` when
    none is close."""
    close = difflib.get_close_matches(word, sorted(set(known)), n=n, cutoff=SUGGEST_CUTOFF)
    return f"did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""


def with_suggestion(message: str, word: str, known: Iterable[str]) -> str:
    """``message (did you mean ...?)`` when a known name is close to ``word``, else ``message``."""
    hint = did_you_mean(word, known)
    return f"{message} ({hint})" if hint else message


def _dotted(tree: dict, prefix: str = "") -> list[str]:
    """Every key of a nested dict as a dotted path, sections included: ``optim``, ``optim.lr``."""
    out = []
    for k, v in tree.items():
        out += [f"{prefix}{k}", *(_dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [])]
    return out


def unknown_key(key: str, tree: dict) -> FathomError:
    """The error for a dotted ``key`` (``--set optim.lrr=0.1``) that nested ``tree`` lacks.

    When only the last part is wrong the closest sibling is offered (``optim.lr``) and the
    section's keys are listed; otherwise the closest dotted key of the whole tree.
    """
    *parents, last = key.split(".")
    node: object = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        hint = did_you_mean(last, node, prefix=key[: -len(last)])
        where = f"; valid keys here: {', '.join(node)}"
    else:
        hint, where = did_you_mean(key, _dotted(tree)), ""
    return FathomError(f"unknown config key {key!r}{f' ({hint})' if hint else ''}{where}")


def table_given_a_value(key: str, table: dict, value: object) -> FathomError:
    """The error for ``--set optim.schedule=cosine``: ``key`` names a table of keys, not one
    value. The fix names the table's keys and the syntax that sets one of them (``kind`` when
    the table has one and a word was given: ``--set optim.schedule.kind=cosine``)."""
    shown = value if isinstance(value, str) else json.dumps(value)
    sub = "kind" if "kind" in table and isinstance(value, str) else next(iter(table), "KEY")
    return FathomError(
        f"{key!r} is a table of keys ({', '.join(table)}), not a single value (got {shown!r}); "
        f"set one of its keys, e.g. --set {key}.{sub}={shown}, or give the whole table as "
        f"JSON: --set '{key}={{\"{sub}\": ...}}'"
    )


def _unknown_tag(loc: str, ctx: dict) -> str:
    """``model.kind: unknown kind 'resnet'; choose one of ciresan, ...`` for a table whose tag
    names no member of its union (pydantic's ``union_tag_invalid``, whose own message dumps
    the whole table); ``ctx`` is that error's context."""
    field = str(ctx.get("discriminator", "'kind'")).strip("'")
    tag = str(ctx.get("tag", ""))
    known = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
    head = with_suggestion(f"{loc}.{field}: unknown {field} {tag!r}", tag, known)
    return f"{head}; choose one of {', '.join(known)}"


def _choice_hint(err: dict) -> str:
    """`` (did you mean 'warmup_cosine'?)`` for a pydantic error of a value outside a list of
    choices (``literal_error``) when one choice is close to the value given, else ``""``."""
    if err.get("type") != "literal_error" or not isinstance(err.get("input"), str):
        return ""
    hint = did_you_mean(err["input"], re.findall(r"'([^']*)'", str(err.get("ctx", {}))))
    return f" ({hint})" if hint else ""


def validation_message(e: ValidationError, origin: str) -> str:
    """A pydantic :class:`~pydantic.ValidationError` of a config read from ``origin`` as one
    message, a line per error: an unknown key (remove it or check its spelling), a table's
    unknown ``kind`` (:func:`_unknown_tag`: the kinds there are), else the field's own
    message with the value given and, for a value outside a list of choices, the nearest
    choice (:func:`_choice_hint`). Every config family's validator raises it as a
    :class:`FathomError`."""
    lines = [f"invalid configuration ({origin}):"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  - unknown key {loc!r}: remove it or check its spelling")
        elif err["type"] == "union_tag_invalid":  # a table's `kind` names no known member
            lines.append(f"  - {_unknown_tag(loc, err.get('ctx') or {})}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = f" (got {err.get('input')!r})" if err["loc"] else ""  # not the whole config
            lines.append(f"  - {loc}: {msg}{got}{_choice_hint(err)}")
    return "\n".join(lines)


DISTRIBUTION = "fathom-depth"
"""The distribution name (``pip``); ``fathom`` on PyPI is an unrelated project."""


def install_hint(extra: str) -> str:
    """How to install an optional extra from a Fathom checkout (there is no PyPI release)."""
    return f"pip install -e '.[{extra}]' in the Fathom checkout (distribution {DISTRIBUTION})"


_FIX = {
    errno.ENOSPC: "the disk is full: free space (or choose another {where}) and rerun",
    errno.EDQUOT: "the disk quota is exhausted: free space (or choose another {where}) and rerun",
    errno.EROFS: "the file system is read-only: choose a writable {where} "
    "(or copy the run directory somewhere writable)",
    errno.EACCES: "permission denied: fix the permissions or choose another {where}",
    errno.EPERM: "operation not permitted (an immutable or protected file?): "
    "check `lsattr`/permissions or choose another {where}",
    errno.ENOTDIR: "a file stands where a directory is expected: move it away or choose "
    "another {where}",
    errno.EISDIR: "a directory stands where a file is expected: give a file's path (an "
    "output's: move the directory away or choose another {where})",
    errno.EEXIST: "a file of that name already exists: move it away",
}


def os_error(e: OSError, doing: str, where: str = "--runs-dir") -> FathomError:
    """``FathomError`` for ``e`` raised while ``doing`` (e.g. "write history.jsonl").

    The message keeps the OS name of the error (``ENOSPC``, ``EROFS``, ...), says what it
    means and what to do; ``where`` names the option that picks another location
    (``--runs-dir``, ``--out``). A full disk is reported as a full disk, never as a
    missing or corrupt file. The errno is kept as ``.errno``.
    """
    code = errno.errorcode.get(e.errno or 0, "OSError")
    fix = _FIX.get(e.errno or 0, "check the path and its file system").format(where=where)
    name = getattr(e, "filename", None)
    where_it = f" ({name})" if name and str(name) not in doing else ""
    err = FathomError(f"cannot {doing}{where_it}: {code} {e.strerror or e}; {fix}")
    err.errno = e.errno
    return err
