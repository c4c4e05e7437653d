"""Tool-calling evaluation: metrics, conditions (zero-shot, few-shot, tuned), reports."""
