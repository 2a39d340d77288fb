"""Trace2Skill: evolve one skill directory from many traces in parallel.

    evolver.py    ``Trace2Skill`` (``whetstone evolve trace2skill``): map, merge, apply
    examples.py   worked examples kept from verified runs (``examples=True``)
"""

from whetstone.engine.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="trace2skill",
    evolver="whetstone.engine.methods.trace2skill.evolver:Trace2Skill",
    prompts=("trace2skill_batch", "trace2skill_batch_run", "trace2skill_draft",
             "trace2skill_examples", "trace2skill_failure", "trace2skill_success",
             "trace2skill_system"),
)
