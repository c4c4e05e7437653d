# One role per AI project (service account `project-<name>`): it reads and writes only its own prefix,
# projects/<name>/, in the raw and curated buckets (the cluster profile's root), and lists only that prefix.
# The platform's workloads (airflow, mlflow, training, triton) keep their roles in main.tf.
variable "projects" {
  type    = list(string)
  default = []
}

locals {
  project_buckets = ["raw", "curated"]
  project_access = {
    for p in var.projects : p => {
      buckets  = [for b in local.project_buckets : var.buckets[b]]
      prefixes = ["projects/${p}/", "projects/${p}/*"] # with the slash: `se` never lists `search`
      objects  = [for b in local.project_buckets : "${var.buckets[b]}/projects/${p}/*"]
    }
  }
}

data "aws_iam_policy_document" "project_trust" {
  for_each = local.project_access
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.issuer}:sub"
      values   = ["system:serviceaccount:${var.namespace}:project-${each.key}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "project" {
  for_each = local.project_access
  statement {
    sid       = "ListOwnPrefix"
    actions   = ["s3:ListBucket"]
    resources = each.value.buckets
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = each.value.prefixes
    }
  }
  statement {
    sid       = "ReadWriteOwnPrefix"
    actions   = ["s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = each.value.objects
  }
  statement {
    sid       = "DataKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
}

resource "aws_iam_role" "project" {
  for_each           = local.project_access
  name               = "${var.name}-project-${replace(each.key, "_", "-")}"
  assume_role_policy = data.aws_iam_policy_document.project_trust[each.key].json
}

resource "aws_iam_role_policy" "project" {
  for_each = local.project_access
  name     = "own-prefix"
  role     = aws_iam_role.project[each.key].id
  policy   = data.aws_iam_policy_document.project[each.key].json
}

output "project_role_arns" { value = { for k, r in aws_iam_role.project : k => r.arn } }
output "project_access" {
  description = "per project: the buckets it may list (only under its prefixes) and the objects it may read and write"
  value       = local.project_access
}
