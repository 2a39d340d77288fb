"""The repo stage: a company's monorepo served read-only by @modelcontextprotocol/server-
filesystem, and questions an engineer asks about it: who owns a service, its port, its
release, its language, whom to page.

    .venv/bin/python benchmarks/env_repo.py            # writes benchmarks/fixtures/env_repo/

writes ``tree/`` (the folder the server is given) and ``tasks.jsonl`` (``servers.json`` is
kept as it is: the npm server 2026.8.31 on ``tree``, its read tools only by allow-list).
The tree:

- ``services/<area>/<service>/``: 200 made-up services in 11 product areas, each with a
  ``VERSION`` file and one config file whose format and keys vary: ``service.yaml``
  (``toolchain``, ``bind_addr`` host:port, ``upstreams``), ``service.toml`` (``lang``,
  ``[server] http_port``, ``[deps] calls``), ``service.json`` (``runtime``, ``net.ingress``,
  ``requires``) or ``service.ini`` (``stack``, ``[endpoint] tcp``, ``[links] depends``);
- ``.github/CODEOWNERS``: an owning team per area, overridden for some services (the last
  matching line wins, as on GitHub);
- ``teams/<handle>.yaml``: a team's display name, ``tech_lead``, ``oncall_channel`` and
  members, reached from a service through CODEOWNERS (a join over files);
- ``docs/runbooks/<service>.md``: when to escalate a sev-1.

Nine kinds of question, each a file read or two once the layout is known; labels are parsed
from the written files (``label``), never taken from the generator's own data. The server
resolves a relative path against its folder, so ``services/...`` works without knowing the
root. The same seed gives the same bytes (files written in sorted order, no timestamps).
"""

from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
import random
import re
import shutil
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import stage_kit as kit
import yaml

OUT = Path(__file__).resolve().parent / "fixtures" / "env_repo"
SEED = 4602
PER_KIND = 190
ORG = "tessellate"
AREAS = ("billing", "identity", "search", "payments", "messaging", "analytics", "storage",
         "scheduling", "media", "compliance", "logistics")
ROLES = ("api", "worker", "gateway", "sync", "relay", "indexer", "cron", "store", "proxy", "web")
LANGUAGES = ("go", "rust", "typescript", "kotlin", "python", "java", "elixir", "scala")
FORMATS = ("yaml", "toml", "json", "ini")
MINUTES = (10, 15, 20, 25, 30, 45, 60, 90)

PHRASINGS = {
    "owner": ("Which team owns {svc}?", "What team is responsible for {svc}?",
              "{svc} is owned by which team?"),
    "lead": ("Who leads the team that owns {svc}?",
             "Which person leads the team responsible for {svc}?",
             "The team that owns {svc} is led by whom?"),
    "channel": ("Which on-call channel should I page about {svc}?",
                "What is the on-call channel for {svc}?",
                "Where do I reach the on-call people for {svc}: which channel?"),
    "port": ("Which port does {svc} listen on?", "What port is {svc} served on?",
             "On which port can I reach {svc}?"),
    "release": ("Which release is {svc} on?", "What is the current release number of {svc}?",
                "{svc} is at which release?"),
    "language": ("What programming language is {svc} written in?",
                 "Which language is {svc} built with?", "{svc} is written in which language?"),
    "area": ("Which product area is {svc} part of?", "Under which product area is {svc} kept?",
             "{svc} belongs to which product area?"),
    "dependencies": ("How many dependencies does {svc} have?",
                     "How many other components does {svc} depend on?",
                     "On how many others does {svc} rely?"),
    "escalation": ("After how many minutes should a sev-1 on {svc} be escalated?",
                   "How many minutes do we wait before escalating a sev-1 on {svc}?",
                   "A sev-1 on {svc}: after how many minutes is it escalated?"),
}


# -- the tree ---------------------------------------------------------------------------------


def make_tree(rng: random.Random) -> dict[str, str]:
    """Every file of the tree: relative path -> text."""
    words = kit.made_up_words(rng, 520, syllables=(2, 2), avoid=AREAS + ROLES + LANGUAGES)
    team_words, svc_words, people_words, chan_words = (words[:22], words[22:222],
                                                       words[222:480], words[480:])
    people = sorted({f"{rng.choice(people_words[:100])} {rng.choice(people_words[100:])}"
                     for _ in range(200)})
    rng.shuffle(people)
    files: dict[str, str] = {"README.md": "# Platform\n\nEvery deployable lives here. Ask in "
                                          "#eng-help if you cannot find something.\n"}
    handles = [w.lower() for w in team_words]
    for i, handle in enumerate(handles):
        members = people[i * 7:i * 7 + rng.randint(3, 7)]
        files[f"teams/{handle}.yaml"] = yaml.safe_dump(
            {"display": handle.capitalize(), "tech_lead": rng.choice(members),
             "oncall_channel": f"#{chan_words[i % len(chan_words)].lower()}-"
                               f"{rng.choice(('pager', 'oncall', 'alerts'))}",
             "members": members}, sort_keys=False)
    services = sorted(f"{w.lower()}-{rng.choice(ROLES)}" for w in svc_words)
    area_of = {svc: rng.choice(AREAS) for svc in services}
    ports = iter(rng.sample(range(3000, 9900), len(services)))
    for svc in services:
        base = f"services/{area_of[svc]}/{svc}"
        files[f"{base}/VERSION"] = f"{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 40)}\n"
        deps = rng.sample([s for s in services if s != svc], rng.randint(1, 6))
        fmt = rng.choice(FORMATS)
        files[f"{base}/service.{fmt}"] = config_text(fmt, svc, rng.choice(LANGUAGES),
                                                     next(ports), deps, rng.randint(1, 12))
        files[f"docs/runbooks/{svc}.md"] = (
            f"# {svc}\n\nPaging: the owning team's on-call channel (see CODEOWNERS and the "
            f"team's file).\n\n## Escalation\n\nEscalate a sev-1 to the team's tech lead after "
            f"{rng.choice(MINUTES)} minutes without a mitigation.\n\n## Dashboards\n\n"
            f"- https://grafana.{ORG}.internal/d/{svc}\n")
    files[".github/CODEOWNERS"] = codeowners(rng, services, area_of, handles)
    return files


def config_text(fmt: str, svc: str, language: str, port: int, deps: list[str],
                replicas: int) -> str:
    """A service's config in one of four formats, each with its own keys."""
    if fmt == "yaml":
        return yaml.safe_dump({"id": svc, "toolchain": language, "bind_addr": f"0.0.0.0:{port}",
                               "replicas": replicas, "upstreams": deps}, sort_keys=False)
    if fmt == "toml":
        calls = ", ".join(f'"{d}"' for d in deps)
        return (f'[meta]\nid = "{svc}"\nlang = "{language}"\n\n[server]\nhttp_port = {port}\n'
                f"workers = {replicas}\n\n[deps]\ncalls = [{calls}]\n")
    if fmt == "json":
        return json.dumps({"id": svc, "runtime": language, "net": {"ingress": port},
                           "scale": replicas, "requires": deps}, indent=2) + "\n"
    return (f"[app]\nid = {svc}\nstack = {language}\n\n[endpoint]\ntcp = {port}\n"
            f"instances = {replicas}\n\n[links]\ndepends = {', '.join(deps)}\n")


def codeowners(rng: random.Random, services: list[str], area_of: Mapping[str, str],
               handles: list[str]) -> str:
    """An owning team per area, then per-service lines for about a third of the services."""
    lines = ["# Owners of each path. The last matching pattern takes precedence.",
             f"*  @{ORG}/{handles[0]}", ""]
    for area in AREAS:
        lines.append(f"/services/{area}/  @{ORG}/{rng.choice(handles)}")
        lines += [f"/services/{area}/{svc}/  @{ORG}/{rng.choice(handles)}"
                  for svc in services if area_of[svc] == area and rng.random() < 0.35]
        lines.append("")
    return "\n".join(lines)


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for rel in sorted(files):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8", newline="\n")


# -- labels, read back from the files ---------------------------------------------------------


def read_config(name: str, text: str) -> dict[str, Any]:
    """A config file's language, port and dependencies, whatever its format."""
    if name.endswith(".yaml"):
        d = yaml.safe_load(text)
        return {"language": d["toolchain"], "port": int(d["bind_addr"].rsplit(":", 1)[1]),
                "dependencies": list(d["upstreams"])}
    if name.endswith(".toml"):
        d = tomllib.loads(text)
        return {"language": d["meta"]["lang"], "port": d["server"]["http_port"],
                "dependencies": list(d["deps"]["calls"])}
    if name.endswith(".json"):
        d = json.loads(text)
        return {"language": d["runtime"], "port": d["net"]["ingress"],
                "dependencies": list(d["requires"])}
    ini = configparser.ConfigParser()
    ini.read_string(text)
    return {"language": ini["app"]["stack"], "port": int(ini["endpoint"]["tcp"]),
            "dependencies": [d.strip() for d in ini["links"]["depends"].split(",")]}


def owner_handle(codeowners_text: str, path: str) -> str:
    """The team handle CODEOWNERS gives ``path`` (``/services/a/b/``): its last matching
    line."""
    owner = ""
    for line in codeowners_text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pattern, team = line.split()[:2]
        if pattern == "*" or path.startswith(pattern) or fnmatch.fnmatch(path, pattern):
            owner = team.rsplit("/", 1)[1]
    return owner


def service_dir(root: Path, svc: str) -> Path:
    [found] = [p for p in (root / "services").glob(f"*/{svc}") if p.is_dir()]
    return found


def label(root: Path, kind: str, svc: str) -> Any:
    """A kind's label for one service, from the files under ``root``."""
    where = service_dir(root, svc)
    if kind == "area":
        return where.parent.name
    if kind == "release":
        return (where / "VERSION").read_text(encoding="utf-8").strip()
    if kind in ("port", "language", "dependencies"):
        [cfg] = sorted(where.glob("service.*"))
        value = read_config(cfg.name, cfg.read_text(encoding="utf-8"))[kind]
        return len(value) if kind == "dependencies" else value
    if kind == "escalation":
        text = (root / "docs" / "runbooks" / f"{svc}.md").read_text(encoding="utf-8")
        return int(re.search(r"after (\d+) minutes", text).group(1))  # type: ignore[union-attr]
    handle = owner_handle((root / ".github" / "CODEOWNERS").read_text(encoding="utf-8"),
                          f"/{where.relative_to(root).as_posix()}/")
    team = yaml.safe_load((root / "teams" / f"{handle}.yaml").read_text(encoding="utf-8"))
    return {"owner": team["display"], "lead": team["tech_lead"],
            "channel": team["oncall_channel"]}[kind]


def questions(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    services = sorted(p.name for p in (root / "services").glob("*/*") if p.is_dir())
    by_kind = {}
    for kind, texts in PHRASINGS.items():
        by_kind[kind] = [kit.task("repo", kind, i, kit.phrase(rng, texts, svc=svc),
                                  label(root, kind, svc))
                         for i, svc in enumerate(rng.sample(services, PER_KIND))]
    return kit.interleave(by_kind)


def generate(out: Path) -> dict[str, int]:
    """Write the tree and the tasks into ``out``; the split sizes."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    write_tree(out / "tree", make_tree(rng))
    tasks = questions(out / "tree", rng)
    kit.write_tasks(out / "tasks.jsonl", tasks)
    return kit.check_splits(tasks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    counts = generate(args.out)
    print(f"wrote {args.out}: tree/ and tasks.jsonl ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
