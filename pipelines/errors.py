"""Errors that retrying cannot fix (an empty window, a failed quality gate, a bad parameter).

Airflow tasks turn them into a fast failure without retries; anything else is retried with backoff.
"""


class NotRetryable(RuntimeError):
    """The run must stop here; the message says why and what to do."""
