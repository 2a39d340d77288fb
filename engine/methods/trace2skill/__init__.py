"""Trace2Skill: evolve one skill directory from many traces in parallel.

    evolver.py    ``Trace2Skill`` (``whetstone evolve trace2skill``): map, merge, apply
    edits.py      the section-anchored patch format its analysts write, and applying it
    skill_limits.py  keeping an evolved skill inside the Agent Skills rules
    ray_map.py    the map on a Ray cluster (``--executor ray``)
    example_edits.py  worked examples kept from verified runs (``examples=True``)
    report.py     what ``whetstone evolve trace2skill`` prints of the map and reduce
"""

from ...prompts import Prompts
from ..registry import MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="trace2skill",
    evolver="whetstone.engine.methods.trace2skill.evolver:Trace2Skill",
    prompts=PROMPTS,
    summary="whetstone.engine.methods.trace2skill.report:summary",
)
