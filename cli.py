"""``whetstone`` — the command line. It only mounts the command groups of ``engine/commands``;
each command there is a thin call into ``whetstone.engine.api`` (see docs/architecture.md).

Exit codes: each error class in ``whetstone.engine.errors`` carries its own, the other outcomes are the
``EXIT_*`` constants there; docs/cli.md has the table, with the environment variables.
"""

from __future__ import annotations

import os

import click

from .engine.commands.common import QUIET, configure_logging, fail
from .engine.commands.corpus import corpus_group
from .engine.commands.data import data_group
from .engine.commands.eval import eval_cmd
from .engine.commands.evolve import evolve_group
from .engine.commands.learn import learn
from .engine.commands.library import library_group, skill_group
from .engine.commands.mcp import mcp
from .engine.commands.methods import methods_cmd
from .engine.commands.models import models
from .engine.commands.run import run
from .engine.commands.serve import serve
from .engine.commands.tools import tools_group
from .engine.commands.traces import traces_group
from .engine.errors import WhetstoneError
from .engine.methods.registry import default_registry


class WhetstoneGroup(click.Group):
    """The top-level group: the core commands, plus each method's own (``MethodSpec.commands``,
    from the method registry), loaded when the command line is first listed or dispatched."""

    def _method_commands(self, ctx: click.Context) -> dict[str, click.Command]:
        # Once per invocation (the methods installed may change between two in one process).
        found = ctx.meta.get("whetstone.method_commands")
        if found is None:
            # lazy: `whetstone --help` imports every command module
            from .engine.commands.kit import Kit

            registry = ctx.meta.setdefault("whetstone.methods", default_registry())
            found = {c.name: c for c in registry.commands(Kit())
                     if c.name and c.name not in self.commands}
            ctx.meta["whetstone.method_commands"] = found
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._method_commands(ctx)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or self._method_commands(ctx).get(name)


@click.group(cls=WhetstoneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="whetstone-engine")
@click.option("--verbose", "-v", count=True,
              help="Show the engine's log: -v info, -vv debug (default: warnings; env "
                   "WHETSTONE_LOG_LEVEL).")
@click.option("--quiet", "-q", is_flag=True,
              help="Print results and errors only: no progress, notes or warnings on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Whetstone: adapt frozen models at inference time with skills, tools and notes
    learned from their own traces."""
    # Its one error is the logging options' (no Ctrl-C to catch yet): reported here rather
    # than through handle_errors, whose wrapper would call back up into this module.
    try:
        configure_logging(verbose, quiet, os.environ.get("WHETSTONE_LOG_LEVEL"))
    except WhetstoneError as exc:
        fail(exc)
    ctx.meta[QUIET] = quiet


for _command in (run, traces_group, models, serve, library_group, skill_group, eval_cmd,
                 evolve_group, learn, methods_cmd, corpus_group, tools_group,
                 data_group, mcp):
    cli.add_command(_command)


def main() -> None:
    # The CLI shows its own spinner and progress; transformers' "Loading weights" bar would
    # only interleave with it. Set HF_HUB_DISABLE_PROGRESS_BARS=0 to have it back.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    cli(prog_name="whetstone")


if __name__ == "__main__":
    main()
