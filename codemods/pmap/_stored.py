"""A step stored on an object (`self.step = jax.pmap(...)` in a method): what blocks it.

The program-level form does not rewrite a step kept in an attribute (its mesh and sharding would
have to be kept there too). Which value blocks it is still worth saying: the methods of the class
calling `self.step(...)` are followed as if the step were a name made outside them (each method
read with `self.step` as that name, for the diagnosis only: nothing of it is rewritten). The
first reason found there is the site's reason, with its code (big_vision's evaluators: `params`,
a parameter of `run`, passed by the trainers).
"""

from __future__ import annotations

import libcst as cst

from jaxmigrate.toolkit.emit import code

from ._flow import Options, analyze_calls, unnamed_step
from ._forms import Qualname, single_name
from ._program import Decline, NotVisible
from ._reach import nodes_in, replaced


def stored_on_self(
    klass: cst.ClassDef,
    maker: cst.FunctionDef,
    assign: cst.Assign,
    options: Options,
    body: cst.FunctionDef,
    qualname: Qualname,
) -> NotVisible:
    """Why the step `assign` stores on `self` in `maker`, a method of `klass`, is not taken: the
    first value blocking it in a method calling it, else that it is stored in an attribute."""
    stored = unnamed_step(assign, maker.name.value)
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not isinstance(target, cst.Attribute) or _self(maker) != code(target.value):
        return stored
    attr, name = target.attr.value, f"_stored_{target.attr.value}"
    methods = [m for m in klass.body.body if isinstance(m, cst.FunctionDef)]
    for method in methods:
        me = _self(method)
        if me is None or method is maker:
            continue
        reads = [  # `self.<attr>`, outside nested defs and classes (their `self` is another)
            a
            for a in nodes_in(method.body, cst.Attribute, (cst.FunctionDef, cst.ClassDef))
            if single_name(a.value) == me and a.attr.value == attr
        ]
        if not reads:
            continue  # does not read `self.<attr>`
        renamed = replaced(method, {id(read): cst.Name(name) for read in reads})
        try:
            analyze_calls(renamed, name, options, body, qualname)
        except NotVisible as why:
            text = why.why.replace(f"`{name}`", f"`self.{attr}`").replace(name, f"self.{attr}")
            where = f"{klass.name.value}.{method.name.value}"
            return NotVisible(
                f"the step stored in `self.{attr}` is called in `{where}`: {text}", why.code
            )
    return stored


def _self(method: cst.FunctionDef) -> str | None:
    """The name of a method's first parameter (`self`), None without one or for a static one."""
    params = method.params.params
    static = any(code(d.decorator) == "staticmethod" for d in method.decorators)
    return params[0].name.value if params and not static else None


def returned_into_self(
    module: cst.Module,
    factory: cst.FunctionDef,
    options: Options,
    body: cst.FunctionDef,
    qualname: Qualname,
) -> NotVisible | None:
    """Why a step that `factory`, a def of the module, makes and returns (`return _eval_fn`) is
    not taken, when a method stores what it returns on `self` (big_vision's cached
    `get_eval_fn`, `self.eval_fn = get_eval_fn(...)`): the value blocking it where it is called
    (`params`, a parameter of `run`); None when no method of the module does that, or nothing
    there blocks it (it is used other than called in `factory` then)."""
    name = factory.name.value
    lines = factory.body.body if isinstance(factory.body, cst.IndentedBlock) else ()
    smalls = [s for line in lines if isinstance(line, cst.SimpleStatementLine) for s in line.body]
    if not any(
        isinstance(s, cst.Return) and code(s.value or cst.Name("_")) == body.name.value
        for s in smalls
    ):
        return None  # the factory does not return the step itself
    for klass in (c for c in module.body if isinstance(c, cst.ClassDef)):
        for method in (m for m in klass.body.body if isinstance(m, cst.FunctionDef)):
            lines = method.body.body if isinstance(method.body, cst.IndentedBlock) else ()
            for line in lines:
                small = line.body if isinstance(line, cst.SimpleStatementLine) else ()
                assign = small[0] if len(small) == 1 else None
                value = assign.value if isinstance(assign, cst.Assign) else None
                called = (name, f"{_self(method)}.{name}")  # a def, or a method (fewshot_lsr)
                if not (isinstance(value, cst.Call) and code(value.func) in called):
                    continue
                assert isinstance(assign, cst.Assign)
                why = stored_on_self(klass, method, assign, options, body, qualname)
                if why.code is Decline.NOT_NAMED:
                    return None
                text = f"the step is returned by `{name}`, and {why.why}"
                return NotVisible(text, why.code)
    return None
