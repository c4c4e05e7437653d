"""Traffic that is not the agent's own logs: the synthetic generator, its product catalogue, the tau-bench retail
replay, and the importers of real public data."""
