"""Elastic Horizon: each run's step budget from similar tasks' traces.

    plugin.py       ``ElasticHorizon`` (``--methods horizon``): ``adjust_config`` per task
    controller.py   the budget controller over the library's traces
"""

from ..registry import MethodSpec

METHOD = MethodSpec(name="horizon", runtime="whetstone.engine.methods.horizon.plugin:ElasticHorizon")
