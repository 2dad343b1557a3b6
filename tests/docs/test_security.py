"""docs/security.md stays true to the sign-on code: its table of who sees what is
``scopes.POLICIES``, its table of settings names every ``GPUGAP_WEB_SIGNON_*`` variable with
its default, and the sections the code's messages point at exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpugap.warehouse.embedded import scopes
from gpugap.web.signon.settings import SignOnSettings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "security.md").read_text()
RULES = {
    name: getattr(scopes, name)
    for name in ("OWNED", "TEAM_TOTALS", "RECOMMENDATIONS", "DECISIONS", "EVERYONE", "UNSCOPED")
}


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else None]


def rows(text: str) -> list[list[str]]:
    """The cells of every table row in ``text`` (header and rule lines included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_who_sees_what_table_is_the_engines_policies() -> None:
    table = {
        cells[0].strip("`"): RULES[cells[1].strip("`")]
        for cells in rows(section("Who sees what"))
        if len(cells) == 4 and cells[1].strip("`") in RULES
    }
    assert table == scopes.POLICIES


def test_every_sign_on_setting_is_documented_with_its_default() -> None:
    documented = {
        name: cells[1]
        for cells in rows(section("Sign-on"))
        for name in re.findall(r"`(GPUGAP_WEB_SIGNON_\w+)`", cells[0])
    }
    for field, info in SignOnSettings.model_fields.items():
        name = f"GPUGAP_WEB_SIGNON_{field.upper()}"
        assert name in documented, name
        default = info.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(default)
        if default in (None, "", {}) and not isinstance(default, dict):
            assert documented[name] == "-", name
        elif default == {}:
            assert documented[name] == "`{}`", name
        else:
            assert documented[name].startswith(f"`{default}`"), (name, documented[name])


def test_the_sections_the_code_points_at_exist() -> None:
    headings = {slug(line.lstrip("#")) for line in DOC.splitlines() if line.startswith("#")}
    tracked = subprocess.run(
        ["git", "ls-files", "gpugap", "warehouse", "deploy"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    pointed = set()
    for path in (ROOT / p for p in tracked):
        if not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(errors="replace")
        pointed |= set(re.findall(r"security\.md#((?:sign-on|who-sees|row-policies)[\w-]*)", text))
    assert pointed == {"sign-on", "who-sees-what", "row-policies-on-a-clickhouse-server"}
    assert pointed <= headings
