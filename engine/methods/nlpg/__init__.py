"""NLPG: natural-language policy notes per runtime module, learned by propagating outcome
feedback backwards through the module graph, with bounded updates.

    evolver.py   ``NLPG`` (``whetstone evolve nlpg``): rollouts, backward pass, bounded update
    backward.py  the backward pass over one trace, and folding corrections per (module, route)
    curator.py   corrections -> ADD / EDIT / AGREE / REMOVE operations (analyst or rules)
    memory.py    the notes per module, the bounded update, counters and retirement
    plugin.py    ``NLPGPlugin`` (``--methods nlpg``): each module's notes in its own prompt

The file format of ``policies/<module>.md`` lives in ``whetstone.skills.policies``.
"""

from whetstone.engine.methods.nlpg.evolver import NLPG, NLPGConfig
from whetstone.engine.methods.nlpg.plugin import (
           ModuleNotes,
           NLPGPlugin,
           NLPGRuntimeConfig,
           policy_notes,
)

__all__ = ["NLPG", "ModuleNotes", "NLPGConfig", "NLPGPlugin", "NLPGRuntimeConfig",
           "policy_notes"]
