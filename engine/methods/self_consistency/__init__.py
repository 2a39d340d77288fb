"""Self-consistency: solve a task N times with sampling and answer with the majority.

    plugin.py   ``SelfConsistency`` (``--methods self_consistency``)
"""

from ..registry import MethodSpec

METHOD = MethodSpec(name="self_consistency",
                    runtime="whetstone.engine.methods.self_consistency.plugin:SelfConsistency")
