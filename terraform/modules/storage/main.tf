# S3 zones (raw logs, curated data, MLflow artifacts, Triton model repository): KMS-encrypted,
# versioned, public access blocked, TLS only; an ECR registry for the flywheel images.
variable "name" { type = string }

locals {
  zones = ["raw", "curated", "mlflow", "models"]
}

resource "aws_kms_key" "this" {
  description         = "${var.name} data at rest"
  enable_key_rotation = true
}

resource "aws_s3_bucket" "zone" {
  for_each = toset(local.zones)
  bucket   = "${var.name}-${each.key}"
}

resource "aws_s3_bucket_versioning" "zone" {
  for_each = aws_s3_bucket.zone
  bucket   = each.value.id
  versioning_configuration { status = "Enabled" }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "zone" {
  for_each = aws_s3_bucket.zone
  bucket   = each.value.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "zone" {
  for_each                = aws_s3_bucket.zone
  bucket                  = each.value.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "zone" {
  for_each = aws_s3_bucket.zone
  bucket   = each.value.id
  rule { object_ownership = "BucketOwnerEnforced" }
}

resource "aws_s3_bucket_policy" "tls_only" {
  for_each = aws_s3_bucket.zone
  bucket   = each.value.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = "*"
      Action    = "s3:*"
      Resource  = [each.value.arn, "${each.value.arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
}

resource "aws_s3_bucket_lifecycle_configuration" "raw" {
  bucket = aws_s3_bucket.zone["raw"].id
  rule {
    id     = "raw-logs-to-infrequent-access"
    status = "Enabled"
    filter {}
    transition {
      days          = 30
      storage_class = "STANDARD_IA"
    }
    noncurrent_version_expiration { noncurrent_days = 90 }
  }
}

resource "aws_ecr_repository" "flywheel" {
  name                 = var.name
  image_tag_mutability = "IMMUTABLE"
  image_scanning_configuration { scan_on_push = true }
  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = aws_kms_key.this.arn
  }
}

output "kms_key_arn" { value = aws_kms_key.this.arn }
output "bucket_names" { value = { for k, b in aws_s3_bucket.zone : k => b.bucket } }
output "bucket_arns" { value = { for k, b in aws_s3_bucket.zone : k => b.arn } }
output "registry_url" { value = aws_ecr_repository.flywheel.repository_url }
output "public_access" { value = aws_s3_bucket_public_access_block.zone }
output "encryption" { value = aws_s3_bucket_server_side_encryption_configuration.zone }
output "versioning" { value = aws_s3_bucket_versioning.zone }
