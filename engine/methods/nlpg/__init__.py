"""NLPG: natural-language policy notes per runtime module, learned by propagating outcome
feedback backwards through the module graph, with bounded updates.

    evolver.py   ``NLPG`` (``whetstone evolve nlpg``): rollouts, backward pass, bounded update
    backward.py  the backward pass over one trace, and folding corrections per (module, route)
    curator.py   corrections -> ADD / EDIT / AGREE / REMOVE operations (analyst or rules)
    memory.py    the notes per module, the bounded update, counters and retirement
    plugin.py    ``NLPGPlugin`` (``--methods nlpg``): each module's notes in its own prompt
    notes.py     the file format and checks of ``policies/<module>.md``, the folder it owns
    commands.py  ``whetstone policies ls | show``
"""

from ...prompts import Prompts
from ..registry import LibraryRoot, MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="nlpg",
    evolver="whetstone.engine.methods.nlpg.evolver:NLPG",
    runtime="whetstone.engine.methods.nlpg.plugin:NLPGPlugin",
    roots=(LibraryRoot("policies", "policies/<module>.md: one module's policy notes, one per line",
                       validator="whetstone.engine.methods.nlpg.notes:validate_policies"),),
    commands="whetstone.engine.methods.nlpg.commands:commands",
    prompts=PROMPTS,
)
