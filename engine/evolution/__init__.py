"""The evolve path every evolver takes (``pipeline.py``): select the traces, fit the evolver,
gate its patch against the current library and land it as a new version or a candidate.

Framework, not a method: it sits above the method packages (it runs any evolver through the
contract of ``whetstone.engine.methods.base``) and below the faces that call it
(``Engine.evolve``, ``whetstone evolve``). See docs/architecture.md, "Layers".
"""
