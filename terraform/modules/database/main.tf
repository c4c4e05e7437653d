# RDS PostgreSQL 15 for Airflow and MLflow metadata (and the Feast registry): private, encrypted,
# the master password generated and kept in Secrets Manager by RDS (never in state or in the repo).
variable "name" { type = string }
variable "vpc_id" { type = string }
variable "subnet_ids" { type = list(string) }
variable "client_security_group" { type = string }
variable "instance_class" { type = string }
variable "allocated_storage_gb" { type = number }
variable "kms_key_arn" { type = string }

resource "aws_db_subnet_group" "this" {
  name       = var.name
  subnet_ids = var.subnet_ids
}

resource "aws_security_group" "db" {
  name        = "${var.name}-postgres"
  description = "PostgreSQL from the EKS nodes only"
  vpc_id      = var.vpc_id
}

resource "aws_vpc_security_group_ingress_rule" "from_nodes" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from the EKS cluster security group"
  referenced_security_group_id = var.client_security_group
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_db_parameter_group" "this" {
  name   = "${var.name}-pg15"
  family = "postgres15"
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
}

# Enhanced monitoring: OS metrics every minute, published by RDS under this role.
resource "aws_iam_role" "monitoring" {
  name = "${var.name}-rds-monitoring"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "monitoring.rds.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
}

resource "aws_iam_role_policy_attachment" "monitoring" {
  role       = aws_iam_role.monitoring.name
  policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "this" {
  identifier                          = var.name
  engine                              = "postgres"
  engine_version                      = "15"
  instance_class                      = var.instance_class
  allocated_storage                   = var.allocated_storage_gb
  db_name                             = "airflow"
  username                            = "flywheel"
  manage_master_user_password         = true
  db_subnet_group_name                = aws_db_subnet_group.this.name
  vpc_security_group_ids              = [aws_security_group.db.id]
  parameter_group_name                = aws_db_parameter_group.this.name
  publicly_accessible                 = false
  storage_encrypted                   = true
  kms_key_id                          = var.kms_key_arn
  multi_az                            = true
  backup_retention_period             = 14
  deletion_protection                 = true
  iam_database_authentication_enabled = true
  performance_insights_enabled        = true
  performance_insights_kms_key_id     = var.kms_key_arn
  auto_minor_version_upgrade          = true
  copy_tags_to_snapshot               = true
  enabled_cloudwatch_logs_exports     = ["postgresql"]
  monitoring_interval                 = 60
  monitoring_role_arn                 = aws_iam_role.monitoring.arn
  skip_final_snapshot                 = false
  final_snapshot_identifier           = "${var.name}-final"
}

output "endpoint" { value = aws_db_instance.this.endpoint }
output "databases" { value = ["airflow", "mlflow", "mlflow_auth", "feast"] }
output "master_secret_arn" { value = aws_db_instance.this.master_user_secret[0].secret_arn }
output "settings" {
  value = {
    publicly_accessible         = aws_db_instance.this.publicly_accessible
    storage_encrypted           = aws_db_instance.this.storage_encrypted
    manage_master_user_password = aws_db_instance.this.manage_master_user_password
  }
}
