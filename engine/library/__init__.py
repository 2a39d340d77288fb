"""The library layer: the product's rules for a library version and how every face opens one.

    checks.py    what every commit runs: the Agent Skills rules and the learned-tool check
    folders.py   ``Folders``: the methods' folders and their validators, as data
    opening.py   ``open_library`` (the methods' ``Folders`` given, never imported),
                 ``may_create_library``, ``Pin`` (the version a host reads and its gate)

It sits above ``skills/`` and ``tools/``, whose rules it joins, and below the runtime, the
methods and every face, which open libraries through it (docs/architecture.md, "Layers").
"""
