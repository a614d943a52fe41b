"""`python -m fuzz.sum_stats OUT FILE...`: the counters of several fuzz runs summed into one record.

For runs side by side (several pytest processes of the engine fuzzer, each writing its counters to its
own `$TWINFER_FUZZ_STATS_LIVE` file as it goes, or the session-end files of fuzz/conftest.py): every
file's `machines` (label -> counter -> count) are added, a file that cannot be read is named and left
out, and OUT gets the sums, the totals (fuzz/stats_report.py) and the files summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fuzz.stats_report import totals, write_record


def sum_machines(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    summed: dict[str, dict[str, int]] = {}
    for record in records:
        for label, counters in record.get("machines", record.get("run", {}).get("machines", {})).items():
            target = summed.setdefault(label, {})
            for name, value in counters.items():
                target[name] = target.get(name, 0) + int(value)
    return dict(sorted(summed.items()))


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) < 2:
        print("usage: python -m fuzz.sum_stats OUT FILE...", file=sys.stderr)
        return 2
    out, paths = Path(arguments[0]), [Path(name) for name in arguments[1:]]
    records, unreadable = [], []
    for path in paths:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as error:
            unreadable.append(f"{path}: {error}")
    machines = sum_machines(records)
    write_record(
        out,
        {"files": [str(p) for p in paths], "unreadable": unreadable, "totals": totals(machines), "machines": machines},
    )
    engine_steps = sum(counters.get("engine_steps", 0) for counters in machines.values())
    print(f"{len(records)} files summed ({len(unreadable)} unreadable): {engine_steps:,} engine steps: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
