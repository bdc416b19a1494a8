"""Why the program-level pmap form is not taken: the stable codes (the rule's `## Skips`) and the
exception that carries one from wherever the analysis stops."""

from __future__ import annotations

import enum


class Decline(enum.Enum):
    """Why the program-level form is not taken: one stable code each (the rule's `## Skips`),
    written first in the site's message."""

    NOT_NAMED = "PL101"  # the step is not assigned to a name by a statement of its own
    NOT_A_DEF = "PL102"  # the pmapped function is not a def of the module (attribute, import)
    CALLED_WHERE_MADE = "PL103"  # `jax.pmap(f)(x)`
    MADE_OUTSIDE = "PL104"  # made in a class body, a lambda, a block at module level
    NESTED = "PL105"  # a nested pmap
    DECORATORS = "PL106"  # the def has other decorators
    REBOUND = "PL107"  # the step's name is bound more than once
    OPTION = "PL108"  # a pmap option this form does not take (`devices=`, computed `in_axes`)
    UNNAMED_AXIS = "PL109"  # the mapped axis has no literal name
    SIGNATURE = "PL110"  # the body's parameters (`*args`, `partial` binding, names clashing)
    MADE_PER_CALL = "PL111"  # made in a function the module calls again: compiled at each call
    NOT_CALLED_ONLY = "PL201"  # the step is used other than called (passed as a value)
    USED_OUTSIDE = "PL202"  # used outside the module's functions, or declared `global`
    CALLED_NESTED = "PL203"  # the step is called in a nested function
    CALLS_DIFFER = "PL204"  # its calls pass different arguments, `*args`, keywords out of order
    NOT_CALLED = "PL205"  # the step is not called where it is followed
    RESULTS_UNNAMED = "PL206"  # a call's results are not bound to plain names
    ARGUMENT_UNKNOWN = "PL301"  # an argument's layout comes from outside the function
    ARGUMENT_MIXED = "PL302"  # an argument is stacked on one path and not on another
    STACKED_READ = "PL303"  # a value stacked for the step is read other than passed to it
    CLOSURE = "PL304"  # the body reads a value of the function whose layout changes
    KEYS_OUTSIDE = "PL305"  # per-device keys for a step that cannot take its own key
    PART_OF_DEVICES = "PL306"  # an argument stacked over devices not visibly all of the process
    RESULT_READ = "PL401"  # a result is read other than as device 0's copy or fed back
    RESULT_VARIES = "PL402"  # a result that differs between devices is read other than flat
    METRICS_LIST = "PL403"  # a list of results is read other than by `get_metrics`
    BODY = "PL501"  # the body's code is not followed (no final return, `try`, `global`)
    MESH = "PL601"  # another mesh or pmap would clash with the step's, or a batch made under it
    SETUP = "PL602"  # no one function calls every one calling the step, or no block to set it
    VERIFICATION = "PL603"  # the program-level form failed verification


# Reasons given in more than one place, word for word.
NOT_NAMED = "the pmapped step is not simply assigned to a name"
NESTED = "a nested pmap: its calls are not followed (yet)"
DECORATORS = "the def has other decorators than pmap's"


class NotVisible(Exception):
    """The flow around the step is not fully visible or not of the shape taken: why, by code."""

    def __init__(self, why: str, code: Decline) -> None:
        super().__init__(why)
        self.why, self.code = why, code

    def __str__(self) -> str:
        return f"[{self.code.value}] {self.why}"
