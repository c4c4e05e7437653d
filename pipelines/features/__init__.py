"""Feast features: computed by Spark from clean logs; served offline (point-in-time) and online."""
