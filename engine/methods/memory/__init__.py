"""Retrieval memory: the model's own verified runs kept as demonstrations.

    method.py   ``Memory`` (``whetstone evolve memory``) and ``MemoryPlugin`` (``--methods memory``)
    files.py    the format and checks of ``memory/<name>.md``, the folder this method owns
"""

from ..registry import LibraryRoot, MethodSpec

METHOD = MethodSpec(
    name="memory",
    evolver="whetstone.engine.methods.memory.method:Memory",
    runtime="whetstone.engine.methods.memory.method:MemoryPlugin",
    roots=(LibraryRoot("memory", "memory/<name>.md: verified runs kept as worked examples",
                       validator="whetstone.engine.methods.memory.files:validate_memory"),),
)
