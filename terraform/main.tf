# Commerce Flywheel on AWS: VPC, EKS with CPU and GPU (H100 p5, B200 p6-b200) node groups, S3 zones,
# RDS PostgreSQL for Airflow and MLflow metadata, IAM roles for service accounts, a container registry.
# `terraform output -json cluster_profile` fills the flywheel's `cluster` profile.

locals {
  name = "flywheel-${var.environment}"
}

module "network" {
  source             = "./modules/network"
  name               = local.name
  cidr               = var.vpc_cidr
  availability_zones = var.availability_zones
  kms_key_arn        = module.storage.kms_key_arn
}

module "storage" {
  source = "./modules/storage"
  name   = local.name
}

module "eks" {
  source             = "./modules/eks"
  name               = local.name
  kubernetes_version = var.kubernetes_version
  subnet_ids         = module.network.private_subnet_ids
  cpu_nodes          = var.cpu_nodes
  gpu_node_groups    = var.gpu_node_groups
  admin_cidrs        = var.admin_cidrs
  kms_key_arn        = module.storage.kms_key_arn
}

module "database" {
  source                = "./modules/database"
  name                  = local.name
  vpc_id                = module.network.vpc_id
  subnet_ids            = module.network.private_subnet_ids
  client_security_group = module.eks.node_security_group_id
  instance_class        = var.db_instance_class
  allocated_storage_gb  = var.db_allocated_storage_gb
  kms_key_arn           = module.storage.kms_key_arn
}

module "iam" {
  source            = "./modules/iam"
  name              = local.name
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_issuer       = module.eks.oidc_issuer
  namespace         = "flywheel"
  buckets           = module.storage.bucket_arns
  kms_key_arn       = module.storage.kms_key_arn
  db_secret_arn     = module.database.master_secret_arn
  projects          = var.projects
}
