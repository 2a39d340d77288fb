"""MARCH: a solver, a proposer and a checker with information asymmetry against hallucination.

    verifier.py   ``MarchVerifier``, ``March`` (``--methods march``), the verification trace
    format.py     rendering a verification report
    commands.py   ``whetstone verify``
"""

from whetstone.engine.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="march",
    runtime="whetstone.engine.methods.march.verifier:March",
    commands="whetstone.engine.methods.march.commands:commands",
    verify="whetstone.engine.methods.march.verifier:verify_answer",
    prompts=("march", "march_checker", "march_proposer", "march_revise", "march_solver"),
)
