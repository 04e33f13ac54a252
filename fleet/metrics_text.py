"""Prometheus text of several replicas as one exposition, each sample labelled `replica`.

The text format wants each metric family's samples together under one HELP/TYPE, so the
replicas' texts are merged family by family rather than concatenated.
"""

import re

# `name{labels} value` or `name value`
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def labelled(line: str, replica: str) -> str:
    """One sample line with `replica="..."` first among its labels."""
    match = _SAMPLE.match(line)
    if match is None:
        return line
    name, labels, rest = match.groups()
    inner = labels[1:-1] if labels else ""
    label = f'replica="{replica}"' + ("," + inner if inner else "")
    return f"{name}{{{label}}}{rest}"


def merge_metrics(texts: dict[str, str]) -> str:
    """`texts`: replica id -> its /metrics text."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for replica, text in texts.items():
        family = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    meta, _ = families.setdefault(family, ([], []))
                    if line not in meta:
                        meta.append(line)
                continue
            families.setdefault(family, ([], []))[1].append(labelled(line, replica))
    lines = [line for meta, samples in families.values() for line in (*meta, *samples)]
    return "\n".join(lines) + "\n"
