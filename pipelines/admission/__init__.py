"""Who gets in and when: per-project quotas and usage, fair turns at the shared model, and the gateway replicas'
exchange that keeps the turns fair across them."""
