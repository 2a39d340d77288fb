"""Workflows: verified calls of the host's tools, learned from the runs that worked and offered
as tools the agent only has to call (Agent Workflow Memory, made callable).

    records.py   ``Workflow`` and the file ``workflows/<name>.yaml``, the folder this method owns
    values.py    whether a tool's result holds an answer, and where
    induce.py    a run's calls -> a workflow: the question's values become slots
    harvest.py   the host-tool calls of a run, the ones that reached its label, what looking
                 around showed
    explore.py   the analyst's search for calls on questions no run answered
    runner.py    running a workflow through the host's tools
    evolver.py   ``Workflows`` (``whetstone evolve workflows``): harvest, induce, explore, verify
    plugin.py    ``WorkflowsPlugin`` (``--methods workflows``): the workflows that fit a task,
                 offered (and required) as tools
"""

from whetstone.engine.methods.registry import LibraryRoot, MethodSpec
from whetstone.engine.prompts import Prompts

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(
    name="workflows",
    evolver="whetstone.engine.methods.workflows.evolver:Workflows",
    runtime="whetstone.engine.methods.workflows.plugin:WorkflowsPlugin",
    roots=(LibraryRoot("workflows", "workflows/<name>.yaml: verified calls of the host's tools, "
                       "offered as tools",
                       validator="whetstone.engine.methods.workflows.files:validate_workflows"),),
    prompts=PROMPTS,
)
