"""Dynamo: co-evolve reasoning skills and executable tools from the model's own attempts.

    evolver.py   ``Dynamo`` (``whetstone evolve dynamo``): rounds of attempt, diagnose, propose, gate
    maker.py     the tool maker: candidate tools searched against held-in training labels
    parts.py     diagnoses, proposals and repairs: the parsed analyst replies
    sandbox.py   running candidate tools on training tasks in the sandbox
"""

from whetstone.engine.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="dynamo",
    evolver="whetstone.engine.methods.dynamo.evolver:Dynamo",
    prompts=("dynamo_diagnose", "dynamo_maker", "dynamo_maker_repair", "dynamo_maker_retry",
             "dynamo_maker_skill", "dynamo_maker_unchanged", "dynamo_parts", "dynamo_skill",
             "dynamo_system", "dynamo_tool", "dynamo_when"),
)
