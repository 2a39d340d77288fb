"""Keep an evolved skill inside the Agent Skills limits, dropping the least-supported edits.

SKILL.md at most 500 lines with valid front matter; reference files at most 300 lines and at
most 5 of them; a reference file and its link in SKILL.md are kept or dropped together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from engine.methods.skill_edits import SkillPatch, apply_patch

MAX_SKILL_LINES = 500
MAX_REFERENCE_LINES = 300
MAX_REFERENCES = 5
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


def _front_matter_ok(skill_md: str, skill: str) -> str | None:
    """None when the front matter is valid; otherwise why not."""
    import yaml

    if not skill_md.startswith("---\n"):
        return "SKILL.md lost its front matter"
    end = skill_md.find("\n---", 4)
    if end < 0:
        return "SKILL.md front matter is not closed"
    try:
        meta = yaml.safe_load(skill_md[4:end])
    except yaml.YAMLError as exc:
        return f"front matter is not valid YAML ({exc})"
    if not isinstance(meta, dict) or meta.get("name") != skill:
        return f"front matter name must be {skill!r}"
    desc = meta.get("description")
    if not isinstance(desc, str) or not desc.strip() or len(desc) > 1024:
        return "front matter description must be 1-1024 characters"
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
    problem = _front_matter_ok(out["SKILL.md"], skill)
    if problem:
        drops.append(f"{problem}; kept the previous SKILL.md")
        out["SKILL.md"], _ = _pair_links(base["SKILL.md"], refs)
    return out, drops
