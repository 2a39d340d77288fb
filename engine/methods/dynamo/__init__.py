"""Dynamo: co-evolve reasoning skills and executable tools from the model's own attempts.

    evolver.py   ``Dynamo`` (``whetstone evolve dynamo``): rounds of attempt, diagnose, propose, gate
    maker.py     the tool maker: candidate tools searched against held-in training labels
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
