output "cluster_profile" {
  description = "Values for the flywheel's cluster profile (FLYWHEEL_* variables or the FLYWHEEL_CONFIG YAML); database passwords stay in Secrets Manager"
  value = {
    profile                      = "cluster"
    root                         = "s3://${module.storage.bucket_names["curated"]}"
    raw_zone                     = "s3://${module.storage.bucket_names["raw"]}"
    mlflow_artifacts_destination = "s3://${module.storage.bucket_names["mlflow"]}"
    postgres_endpoint            = module.database.endpoint
    postgres_databases           = module.database.databases
    postgres_master_secret_arn   = module.database.master_secret_arn
    kubernetes_cluster           = module.eks.cluster_name
    kubernetes_endpoint          = module.eks.endpoint
    gpu_node_selectors           = module.eks.gpu_node_selectors
    container_registry           = module.storage.registry_url
    service_account_roles        = module.iam.role_arns
    project_roles                = module.iam.project_role_arns
  }
}
