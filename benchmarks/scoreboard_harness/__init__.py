"""The scoreboard harness (not part of the installed package): ``runner.py`` runs the rows of
``benchmarks/scoreboard.yaml`` once and keeps their results, ``page.py`` renders
docs/results.md from them. Driven by ``benchmarks/scoreboard.py``; scripts put
``benchmarks/`` on ``sys.path`` to import it."""
