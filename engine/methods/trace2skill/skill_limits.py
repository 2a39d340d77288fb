"""Keep an evolved skill inside the Agent Skills rules, dropping the least-supported edits.

The rules themselves are ``whetstone.skills.format``'s: SKILL.md at most ``MAX_BODY_LINES`` lines with
valid front matter, reference files at most ``MAX_REFERENCE_LINES`` lines. On top of them an
evolved skill keeps at most ``MAX_REFERENCES`` reference files, and a reference file and its
link in SKILL.md are kept or dropped together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ....skills.format import MAX_BODY_LINES, MAX_REFERENCE_LINES, parse_skill_md
from .edits import SkillPatch, apply_patch

# Counted over the whole file (front matter included), so an evolved skill stays a little
# inside the body limit rather than on its edge.
MAX_SKILL_LINES = MAX_BODY_LINES
MAX_REFERENCES = 5  # an evolver's own cap: more reference files than this are not kept
_REF_LINK = re.compile(r"references/([\w.-]+\.md)")


def _lines(text: str) -> int:
    return len(text.rstrip("\n").split("\n"))


def _support_of(path: str, patch: SkillPatch) -> int:
    return max((len(e.support) for e in patch.edits if e.file == path), default=0)


def _pair_links(skill_md: str, refs: set[str]) -> tuple[str, list[str]]:
    """Drop lines linking to missing references; link every reference that is not linked."""
    notes: list[str] = []
    kept = []
    for line in skill_md.rstrip("\n").split("\n"):
        missing = [m for m in _REF_LINK.findall(line) if f"references/{m}" not in refs]
        if missing:
            notes.append(f"removed a link to missing references/{missing[0]}")
            continue
        kept.append(line)
    text = "\n".join(kept)
    unlinked = sorted(r for r in refs if r not in text)
    if unlinked:
        if not re.search(r"^## References\s*$", text, re.MULTILINE):
            text += "\n\n## References"
        text += "\n" + "\n".join(f"- [{r.split('/')[-1]}]({r})" for r in unlinked)
        notes += [f"linked {r} from SKILL.md" for r in unlinked]
    return text.rstrip("\n") + "\n", notes


def front_matter_problem(skill_md: str, skill: str) -> str | None:
    """None when ``skill_md`` follows the Agent Skills rules for a skill named ``skill``;
    otherwise the first problem, in words."""
    parsed = parse_skill_md(skill_md, folder=skill)
    if parsed.problems:
        first = parsed.problems[0]
        return f"SKILL.md breaks the rule [{first.rule}]: {first.detail}"
    return None


def _fit_references(files: dict[str, str], base: Mapping[str, str], patch: SkillPatch
                    ) -> list[str]:
    drops = []
    for path in sorted(p for p in files if p.startswith("references/")):
        if _lines(files[path]) > MAX_REFERENCE_LINES and files[path] != base.get(path):
            drops.append(f"dropped {path}: {_lines(files[path])} lines > {MAX_REFERENCE_LINES}")
            if path in base:
                files[path] = base[path]
            else:
                del files[path]
    refs = [p for p in files if p.startswith("references/")]
    new = sorted((p for p in refs if p not in base), key=lambda p: _support_of(p, patch))
    while len(refs) > MAX_REFERENCES and new:
        victim = new.pop(0)
        del files[victim]
        refs.remove(victim)
        drops.append(f"dropped {victim}: more than {MAX_REFERENCES} reference files")
    return drops


def enforce_limits(files: Mapping[str, str], base: Mapping[str, str], skill: str,
                   patch: SkillPatch) -> tuple[dict[str, str], list[str]]:
    """The evolved files made valid, and a note for each thing dropped or fixed."""
    out = dict(files)
    drops = _fit_references(out, base, patch)
    if _lines(out.get("SKILL.md", "")) > MAX_SKILL_LINES and patch.edits:
        # Re-apply without the least-supported SKILL.md edits until it fits.
        edits = sorted(patch.edits, key=lambda e: len(e.support), reverse=True)
        while edits and _lines(out.get("SKILL.md", "")) > MAX_SKILL_LINES:
            dropped = edits.pop()
            drops.append(f"dropped an edit ({dropped.op} {dropped.file}) to keep SKILL.md "
                         f"under {MAX_SKILL_LINES} lines")
            out, _ = apply_patch(base, SkillPatch(edits=tuple(edits)))
        drops += _fit_references(out, base, patch)
    if _lines(out.get("SKILL.md", "")) > MAX_SKILL_LINES:
        drops.append(f"SKILL.md stayed over {MAX_SKILL_LINES} lines; kept the previous SKILL.md")
        out["SKILL.md"] = base["SKILL.md"]
    refs = {p for p in out if p.startswith("references/")}
    out["SKILL.md"], notes = _pair_links(out["SKILL.md"], refs)
    drops += notes
    problem = front_matter_problem(out["SKILL.md"], skill)
    if problem:
        drops.append(f"{problem}; kept the previous SKILL.md")
        out["SKILL.md"], _ = _pair_links(base["SKILL.md"], refs)
    return out, drops
