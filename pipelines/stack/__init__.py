"""The local servers' processes (started and stopped by `flywheel up` / `down`)."""
