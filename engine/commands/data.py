"""``whetstone data``: data sets that are fetched into the cache rather than installed as
packages (``fetch``, ``ls``). Today one: ``bigbench``, the task.json files of the
``bigbench==1.0.0`` sdist behind the ``bigbench:<task>`` task sets."""

from __future__ import annotations

from pathlib import Path

import click

from .common import console, emit_json, handle_errors, json_option

DATA_SETS = ("bigbench",)


@click.group("data")
def data_group() -> None:
    """Data sets fetched into the cache ($WHETSTONE_CACHE or $WHETSTONE_HOME/cache)."""


@data_group.command("fetch")
@click.argument("name", type=click.Choice(DATA_SETS))
@click.option("--from", "sdist", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Use this sdist (bigbench-1.0.0.tar.gz) instead of "
                                 "downloading it; its sha256 is checked all the same.")
@click.option("--keep", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Keep the downloaded sdist in this folder (default: discard it).")
@click.option("--force", is_flag=True, help="Extract again over an existing cache.")
@json_option
@handle_errors
def fetch_cmd(name: str, sdist: Path | None, keep: Path | None, force: bool,
              as_json: bool) -> None:
    """Fetch a data set into the cache: BIG-bench's task.json files.

    Without --from, pip downloads the bigbench==1.0.0 sdist by name (through your pip
    configuration) with pip 23.2.1 in a throwaway venv: newer pips refuse that sdist's
    metadata. Only bigbench/benchmark_tasks/**/task.json is extracted (about 1.7 GB)."""
    # lazy: loads filelock and 53 more of our modules
    from ..evaluation import bigbench

    err = console(stderr=True)
    if sdist is None and not (bigbench.data_dir().exists() and not force):
        err.print(f"downloading {bigbench.SDIST} with pip (358 MB) ...")
    elif sdist is not None:
        err.print(f"checking and extracting {sdist} ...")
    result = bigbench.fetch(sdist=sdist, force=force, keep=keep)
    row = {"name": name, "path": str(result.path), "files": result.files,
           "bytes": result.bytes, "sha256": result.sha256,
           "download_s": round(result.download_s, 1), "extract_s": round(result.extract_s, 1),
           "replaced": result.replaced}
    if as_json:
        emit_json(row)
        return
    if not result.bytes:
        console().print(f"already cached: {result.path} ({result.files} task files; "
                        "--force extracts again)")
        return
    console().print(f"{result.files} task files ({result.bytes / 1e6:.0f} MB) in {result.path}"
                    f"  (download {result.download_s:.0f} s, extract {result.extract_s:.0f} s)")


@data_group.command("ls")
@click.option("--tasks", "show_tasks", is_flag=True, help="List every cached task name.")
@json_option
@handle_errors
def ls_cmd(show_tasks: bool, as_json: bool) -> None:
    """What is cached, where, and how to fetch what is not."""
    # lazy: loads filelock and 53 more of our modules
    from ..evaluation import bigbench

    info = bigbench.describe()
    if as_json:
        emit_json([info])
        return
    out = console()
    if not info["cached"]:
        out.print(f"bigbench {info['version']}: not fetched  ->  {info['fetch']}")
        return
    tasks = info.get("tasks", [])
    out.print(f"bigbench {info['version']}: {len(tasks)} tasks, "
              f"{int(info.get('bytes', 0)) / 1e6:.0f} MB in {info['path']}  "
              "(task sets bigbench:<task>)")
    if show_tasks:
        for t in tasks:
            out.print(f"  bigbench:{t}", soft_wrap=True)
