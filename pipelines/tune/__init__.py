"""Tuning after SFT: preference pairs from what the platform collects and DPO on top of the SFT adapter."""
