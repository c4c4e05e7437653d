"""Entry point for spark-submit on a cluster (the same prep as `flywheel prep`):

spark-submit --master spark://host:7077 -m ... pipelines/prep/__main__.py --start 2026-11-20 --end 2026-11-20 \
    --project NAME
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pipelines.config import ConfigError, load_settings
from pipelines.prep.pipeline import run_prep
from pipelines.window import DateWindow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipelines.prep")
    parser.add_argument("--start", required=True)
    parser.add_argument("--end", required=True)
    parser.add_argument("--project", default=None, help="the AI project whose window this is (default: the configured)")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_SUBMITTED", "1")
    try:  # bad input (settings, the dates) is one `error:` line and exit 2, never a traceback
        settings = load_settings(**({"project": args.project} if args.project else {}))
        window = DateWindow.parse(args.start, args.end)
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    except ValueError as exc:
        parser.exit(2, f"error: --start/--end: {exc}\n")
    result = run_prep(settings, window)
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
