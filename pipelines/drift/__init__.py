"""Drift monitoring: metrics, the reference summaries of the champion's training set, the monitor."""
