"""Co-ReAct: a rubric before each decision, and optionally the decision checked against it.

    plugin.py   ``CoReAct`` (``--methods co_react``): the rubric node and the check
"""

from whetstone.engine.methods.registry import MethodSpec
from whetstone.engine.prompts import Prompts

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="co_react",
    runtime="whetstone.engine.methods.co_react.plugin:CoReAct",
    prompts=PROMPTS,
)
