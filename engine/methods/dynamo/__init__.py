"""Dynamo: co-evolve reasoning skills and executable tools from the model's own attempts.

    evolver.py   ``Dynamo`` (``whetstone evolve dynamo``): its config, and the rounds
    run.py       one fit in progress: its saved state, the analyst, the tools tests call
    attempts.py  ATTEMPT and CHECK: the agent's runs as attempts
    diagnosis.py DIAGNOSE: failures clustered by cause
    writing.py   MAKE, WRITE and TEST: the round's skills and tools, tested in the sandbox
    maker.py     the tool maker's search: candidate tools against held-in training labels
    maker_code.py    its WRITE: the analyst's reply read as one tool function
    maker_checks.py  its VERIFY: why a candidate failed, how close it came
    maker_skill.py   its SKILL: an admitted tool as a skill folder
    parts.py     diagnoses, proposals and repairs: the parsed analyst replies
    sandbox.py   running candidate tools on training tasks in the sandbox
"""

from ...prompts import Prompts
from ..registry import MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="dynamo",
    evolver="whetstone.engine.methods.dynamo.evolver:Dynamo",
    prompts=PROMPTS,
)
