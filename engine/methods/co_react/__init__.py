"""Co-ReAct: a rubric before each decision, and optionally the decision checked against it.

    plugin.py   ``CoReAct`` (``--methods co_react``): the rubric node and the check
    rubric.py   the ``Rubric`` record: reading, rendering and checking a step rubric
    display.py  how a ``rubric`` step prints
"""

from ...prompts import Prompts
from ..registry import KnobOption, MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="co_react",
    runtime="whetstone.engine.methods.co_react.plugin:CoReAct",
    prompts=PROMPTS,
    step_kinds={"rubric": "whetstone.engine.methods.co_react.display:print_rubric"},
    options=(KnobOption("--rubric-model", "rubric_model", metavar="SPEC",
                        help="Model spec of Co-ReAct's rubric generator and checker "
                             "(default: the agent's model)."),),
)
