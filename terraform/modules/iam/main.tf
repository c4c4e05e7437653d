# IAM roles for Kubernetes service accounts (IRSA), least privilege per workload:
# airflow (raw+curated read/write), mlflow (its artifact bucket), training (read curated, write mlflow),
# triton (read the model repository), each limited to its own bucket prefixes and the data key.
variable "name" { type = string }
variable "oidc_provider_arn" { type = string }
variable "oidc_issuer" { type = string }
variable "namespace" { type = string }
variable "buckets" { type = map(string) }
variable "kms_key_arn" { type = string }
variable "db_secret_arn" { type = string }

locals {
  issuer = replace(var.oidc_issuer, "https://", "")
  access = {
    airflow  = { read = ["raw", "curated", "mlflow", "models"], write = ["raw", "curated", "models"], secrets = true }
    mlflow   = { read = ["mlflow"], write = ["mlflow"], secrets = true }
    training = { read = ["curated", "mlflow"], write = ["mlflow"], secrets = false }
    triton   = { read = ["models"], write = [], secrets = false }
  }
}

data "aws_iam_policy_document" "trust" {
  for_each = local.access
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.issuer}:sub"
      values   = ["system:serviceaccount:${var.namespace}:${each.key}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "access" {
  for_each = local.access
  statement {
    sid       = "List"
    actions   = ["s3:ListBucket"]
    resources = [for b in each.value.read : var.buckets[b]]
  }
  statement {
    sid       = "Read"
    actions   = ["s3:GetObject", "s3:GetObjectVersion"]
    resources = [for b in each.value.read : "${var.buckets[b]}/*"]
  }
  dynamic "statement" {
    for_each = length(each.value.write) > 0 ? [1] : []
    content {
      sid       = "Write"
      actions   = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
      resources = [for b in each.value.write : "${var.buckets[b]}/*"]
    }
  }
  statement {
    sid       = "DataKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
  dynamic "statement" {
    for_each = each.value.secrets ? [1] : []
    content {
      sid       = "DatabaseSecret"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [var.db_secret_arn]
    }
  }
}

resource "aws_iam_role" "workload" {
  for_each           = local.access
  name               = "${var.name}-${each.key}"
  assume_role_policy = data.aws_iam_policy_document.trust[each.key].json
}

resource "aws_iam_role_policy" "workload" {
  for_each = local.access
  name     = "access"
  role     = aws_iam_role.workload[each.key].id
  policy   = data.aws_iam_policy_document.access[each.key].json
}

output "role_arns" { value = { for k, r in aws_iam_role.workload : k => r.arn } }
