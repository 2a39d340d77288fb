"""MARCH: a solver, a proposer and a checker with information asymmetry against hallucination.

    verifier.py   ``MarchVerifier``, ``March`` (``--methods march``), the verification trace
    records.py    ``Claim``, ``CheckRequest``, ``Verdict``
    format.py     the proposer's and checker's line formats, agreement and the vote
    commands.py   ``whetstone verify``
    display.py    how a ``verify`` step prints
"""

from ...prompts import Prompts
from ..registry import MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="march",
    runtime="whetstone.engine.methods.march.verifier:March",
    commands="whetstone.engine.methods.march.commands:commands",
    endpoints={"verify": "whetstone.engine.methods.march.verifier:verify_answer"},
    prompts=PROMPTS,
    step_kinds={"verify": "whetstone.engine.methods.march.display:print_verify"},
    exit_codes={9: "`verify`: the answer is flagged as a hallucination"},
)
