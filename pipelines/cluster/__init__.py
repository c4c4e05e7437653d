"""Every Kubernetes manifest the platform writes: Triton, the gateway, the training pods, the settings ConfigMap and
Airflow's Helm values."""
