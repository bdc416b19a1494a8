"""Look-ups over the one ordered tuple of passes in `jaxmigrate.codemods`."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterable

from jaxmigrate.model import Options
from jaxmigrate.toolkit.passes import Pass


class UnknownRule(ValueError):
    """A rule code or name that no pass has."""


def all_passes() -> tuple[type[Pass], ...]:
    """Return every registered pass, in the order they run."""
    from jaxmigrate.codemods import PASSES

    return PASSES


def find_pass(code_or_name: str) -> type[Pass]:
    """Return the pass with this code (`JM201`) or name (`pmap`); raise UnknownRule."""
    wanted = code_or_name.strip()
    for p in all_passes():
        if wanted.upper() == p.CODE or wanted.lower().replace("_", "-") == p.NAME:
            return p
    raise UnknownRule(f"unknown rule {code_or_name!r}; `jaxmigrate rules` lists them")


def _matches(p: type[Pass], selectors: Iterable[str]) -> bool:
    for sel in selectors:
        sel = sel.strip()
        if sel.upper() == "ALL" or p.CODE.startswith(sel.upper()) or p.NAME == sel.lower():
            return True
    return False


def select_passes(select: Iterable[str], ignore: Iterable[str]) -> tuple[type[Pass], ...]:
    """Return the passes chosen by code prefixes or names; an unknown selector is an error."""
    select, ignore = tuple(select), tuple(ignore)
    passes = all_passes()
    for sel in (*select, *ignore):
        if not any(_matches(p, [sel]) for p in passes):
            raise UnknownRule(f"unknown rule selector {sel!r}; `jaxmigrate rules` lists them")
    chosen = [p for p in passes if not select or _matches(p, select)]
    return tuple(p for p in chosen if not _matches(p, ignore))


def chosen_passes(options: Options) -> tuple[type[Pass], ...]:
    """Return the registered passes a run with `options` uses, in registry order."""
    return select_passes(options.select, options.ignore)


def rule_doc(pass_cls: type[Pass]) -> str:
    """Return the rule's documentation: its module docstring, headed by code and name."""
    return f"# {pass_cls.CODE} {pass_cls.NAME} ({pass_cls.SAFETY})\n\n{_doc(pass_cls)}\n"


def _doc(pass_cls: type[Pass]) -> str:
    module = sys.modules[pass_cls.__module__]
    return inspect.cleandoc(module.__doc__ or pass_cls.__doc__ or "")


_SKIP_CODE = re.compile(r"\[?\s*([A-Z]{2}\d{3})\s*\]?")
_SKIP_IN_MESSAGE = re.compile(r"\[([A-Z]{2}\d{3})\]")  # `... not taken: [PL301] ...`


def skip_codes(message: str) -> list[str]:
    """The skip codes a site's message gives (`[PL301]`), in order."""
    return _SKIP_IN_MESSAGE.findall(message)


def skip_doc(query: str) -> str | None:
    """Return the documentation of the skip code `query` names (`find_skip`), headed by the code
    and its rule; None when no rule documents such a skip."""
    found = find_skip(query)
    if found is None:
        return None
    rule, code, entry = found
    return (
        f"# {code}: a form {rule.CODE} {rule.NAME} does not take\n\n{entry}\n\n"
        "The site keeps the form its message names, and the message names the value that "
        f"blocks. `jaxmigrate explain {rule.CODE}` documents the whole rule, its "
        "`[tool.jaxmigrate]` settings included.\n"
    )


def find_skip(query: str) -> tuple[type[Pass], str, str] | None:
    """Return the pass whose `## Skips` documents the code `query` names (`PL301`, or `[PL301]`
    as a site's message writes it), the code, and that entry of the list (its bullet, with the
    other codes it shares a bullet with); None when no pass's skips document it. A rule's own
    code (`JM202`) is a rule, not a skip: `find_pass` answers for it."""
    found = _SKIP_CODE.fullmatch(query.strip().upper())
    if found is None:
        return None
    code = found.group(1)
    for p in all_passes():
        if p.CODE == code:
            return None
        entry = _skip_entry(_doc(p), code)
        if entry:
            return p, code, entry
    return None


def _skip_entry(doc: str, code: str) -> str:
    """The bullet of the `## Skips` section of `doc` that documents `code` (the one naming it
    first, as a bullet shared by several codes names each where its part begins), joined into
    one paragraph; "" when there is none."""
    lines = doc.partition("## Skips")[2].partition("\n## ")[0].splitlines()
    bullets: list[str] = []
    depth: list[int] = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith("- "):
            bullets.append(line.strip()[2:])
            depth.append(indent)
        elif bullets and line.strip() and indent > depth[-1]:
            bullets[-1] += " " + line.strip()
    named = [b for b in bullets if f"`{code}`" in b]
    return min(named, key=lambda b: b.index(f"`{code}`"), default="")


def find_by_text(text: str) -> list[type[Pass]]:
    """Return the passes whose documentation mentions `text` (pasted error messages, APIs);
    else those the names in the error point at (`names_in_error`): a pass that handles the
    legacy API it names (`cannot import name 'PartitionSpec' from 'jax.experimental'`,
    `jax.device_put_replicated is deprecated`), else the passes whose documentation mentions
    the most of the names it quotes or calls (`pjit() got an unexpected keyword argument
    'in_axis_resources'`)."""
    needle = " ".join(text.lower().split())
    found = []
    for p in all_passes():
        doc = " ".join(rule_doc(p).lower().split())
        if needle and needle in doc:
            found.append(p)
    return found or _by_names(text)


_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
_NO_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_DOTTED = re.compile(r"(?<![\w./:-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w/])")
_QUOTED = re.compile(r"""['"`]([A-Za-z_][\w.]*)['"`]""")
_CALLED = re.compile(r"\b([A-Za-z_][\w.]*)\(\)")


def names_in_error(text: str) -> tuple[set[str], set[str], set[str]]:
    """Return the qualified names, the modules and the bare names an error message names."""
    qualified = {f"{m}.{n}" for n, m in _CANNOT_IMPORT.findall(text)}
    qualified |= {f"{m}.{n}" for m, n in _NO_ATTRIBUTE.findall(text)}
    qualified |= set(_DOTTED.findall(text))
    modules = set(_NO_MODULE.findall(text))
    bare = {n for n in _QUOTED.findall(text) + _CALLED.findall(text)}
    bare |= {n.rpartition(".")[2] for n in qualified}
    return qualified, modules, bare


def _by_names(text: str) -> list[type[Pass]]:
    qualified, modules, bare = names_in_error(text)
    handled = [
        p
        for p in all_passes()
        if any(
            q == name or q.startswith(name + ".") and name in modules or name.startswith(q + ".")
            for q in p.QUALNAMES
            for name in qualified | modules
        )
    ]
    if handled:
        return handled
    scores = {}
    for p in all_passes():
        doc = rule_doc(p)
        scores[p] = sum(1 for n in bare if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", doc))
    best = max(scores.values(), default=0)
    return [p for p, score in scores.items() if best and score == best]
