"""Entry point of a training pod (`python -m pipelines.train.pod`): train one variant of a sweep.

The DAG's plan (`pipelines.tasks.train_pods`) passes the resolved sweep as JSON, so every pod trains
exactly the plan's variants and computes the same sweep id; the variant is logged as that sweep's
child run (metrics, validation scores, adapter), where the `train` task collects it.
"""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from pipelines.config import ConfigError, load_settings
from pipelines.train.sweep import run_sweep
from pipelines.train.sweep_config import SweepConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.train.pod", description=__doc__)
    parser.add_argument("--sweep-json", required=True, help="the resolved sweep (SweepConfig as JSON)")
    parser.add_argument("--index", type=int, required=True, help="the variant this pod trains")
    parser.add_argument("--reference-days", default="", help="drift retrain: comma-separated reference days")
    parser.add_argument("--window", default=None, help="the training set's window label (START_END)")
    parser.add_argument("--project", default=None, help="the AI project the run trains (its data and MLflow runs)")
    args = parser.parse_args(argv)
    try:  # bad input (settings, the plan's JSON) is one `error:` line and exit 2, never a traceback
        settings = load_settings(**({"project": args.project} if args.project else {}))
        sweep = SweepConfig.model_validate(json.loads(args.sweep_json))
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    except (json.JSONDecodeError, ValidationError) as exc:
        parser.exit(2, f"error: --sweep-json: {' '.join(str(exc).split())[:500]}\n")
    if settings.train.runner != "local":
        parser.error("a training pod trains its variant itself: FLYWHEEL_TRAIN__RUNNER must be local")
    days = [d for d in args.reference_days.split(",") if d] or None
    result = run_sweep(settings, sweep, reference_days=days, only=[args.index], window=args.window)
    variant = result.variants[0]
    print(
        json.dumps(
            {
                "sweep_id": result.sweep_id,
                "variant": variant.index,
                "run_id": variant.run_id,
                "status": variant.status,
                "metrics": variant.metrics,
            }
        )
    )
    return 0  # a diverged variant is a result too (recorded in its run); errors raise


if __name__ == "__main__":
    sys.exit(main())
