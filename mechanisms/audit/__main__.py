"""``make audit``: every audit entry at ``size="full"``, as a markdown table.

Writes the table to stdout and to ``var/audit.md`` (``--out``). An entry that
raises is reported as failing, and the others still run; the exit status is 1
if any mechanism fails or any negative control is not caught.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from mechanisms.audit.entries import AuditReport, AuditSize, entries

HEADER = ("| mechanism | notion | events tried | certified bound | charged | passed"
          " | control caught | seconds |\n|---|---|---|---|---|---|---|---|")


def _num(x: float) -> str:
    return "-inf" if math.isinf(x) and x < 0 else f"{x:.3g}"


def row(report: AuditReport, seconds: float) -> str:
    return (f"| `{report.mechanism}` | {report.notion} | {report.events_tried} |"
            f" {_num(report.certified)} | {_num(report.charged)} |"
            f" {'yes' if report.passed else '**NO**'} |"
            f" {'yes' if report.control_caught else '**NO**'} | {seconds:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mechanisms.audit")
    parser.add_argument("--size", choices=("ci", "full"), default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="var/audit.md")
    parser.add_argument("mechanisms", nargs="*", help="default: every entry")
    args = parser.parse_args(argv)
    size: AuditSize = args.size
    table = entries()
    names = args.mechanisms or sorted(table)
    lines, details, ok = [HEADER], [], True
    print(HEADER, flush=True)
    for name in names:
        start = time.perf_counter()
        try:
            report = table[name](name, size, args.seed)
        except Exception as exc:  # one broken entry must not hide the others
            report = AuditReport(name, "?", 0, math.nan, math.nan, False, False,
                                 f"entry raised {type(exc).__name__}")
        line = row(report, time.perf_counter() - start)
        ok &= report.passed and report.control_caught
        lines.append(line)
        details.append(f"- `{name}`: {report.detail}")
        print(line, flush=True)
    text = "\n".join(lines) + "\n\n" + "\n".join(details) + "\n"
    print("\n" + "\n".join(details))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
