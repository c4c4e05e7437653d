# Plan-only checks with a mocked AWS provider: no credentials, no cloud calls.
mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
  }
  mock_resource "aws_eks_cluster" {
    defaults = {
      identity = [{ oidc = [{ issuer = "https://oidc.eks.us-east-1.amazonaws.com/id/TEST" }] }]
      vpc_config = [{ cluster_security_group_id = "sg-0123456789abcdef0", subnet_ids = [], endpoint_private_access = true,
      endpoint_public_access = false, public_access_cidrs = [], security_group_ids = [], vpc_id = "vpc-1" }]
    }
  }
  mock_resource "aws_db_instance" {
    defaults = { master_user_secret = [{ secret_arn = "arn:aws:secretsmanager:us-east-1:000000000000:secret:db", kms_key_id = "k", secret_status = "active" }] }
  }
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:us-east-1:000000000000:key/test" }
  }
  mock_resource "aws_iam_openid_connect_provider" {
    defaults = { arn = "arn:aws:iam::000000000000:oidc-provider/test" }
  }
  mock_resource "aws_s3_bucket" {
    override_during = plan # the buckets' ARNs are known when the plan is checked (the projects' prefixes name them)
    defaults        = { arn = "arn:aws:s3:::flywheel-test-bucket" }
  }
}

variables {
  environment = "test"
}

run "gpu_node_groups_are_labelled_and_tainted" {
  command = plan
  assert {
    condition     = alltrue([for k, g in module.eks.gpu_taints : length([for t in g : t if t.key == "nvidia.com/gpu" && t.effect == "NO_SCHEDULE"]) == 1])
    error_message = "every GPU node group needs the nvidia.com/gpu NoSchedule taint"
  }
  assert {
    condition     = module.eks.gpu_node_selectors["h100"]["flywheel.io/gpu"] == "h100" && module.eks.gpu_node_selectors["b200"]["flywheel.io/gpu"] == "b200"
    error_message = "GPU node selectors must name the accelerator"
  }
}

run "data_is_encrypted_and_never_public" {
  command = plan
  assert {
    condition     = alltrue([for k, b in module.storage.public_access : b.block_public_acls && b.block_public_policy && b.ignore_public_acls && b.restrict_public_buckets])
    error_message = "every bucket blocks public access"
  }
  assert {
    condition     = alltrue([for k, e in module.storage.encryption : one(e.rule).apply_server_side_encryption_by_default[0].sse_algorithm == "aws:kms"])
    error_message = "every bucket is KMS-encrypted"
  }
  assert {
    condition     = alltrue([for k, v in module.storage.versioning : v.versioning_configuration[0].status == "Enabled"])
    error_message = "every bucket is versioned"
  }
  assert {
    condition     = length(module.storage.versioning) == 4 && length(module.storage.lifecycle) == 4
    error_message = "all four zones (raw, curated, mlflow, models) are versioned and have a lifecycle"
  }
  assert {
    condition     = alltrue([for k, l in module.storage.lifecycle : anytrue([for r in l.rule : length(r.abort_incomplete_multipart_upload) > 0])])
    error_message = "every bucket aborts half-finished uploads"
  }
  assert {
    condition     = module.database.settings.publicly_accessible == false && module.database.settings.storage_encrypted && module.database.settings.manage_master_user_password
    error_message = "the database is private, encrypted, and its password is managed by RDS"
  }
}

run "prod_environment_file_plans" {
  command = plan
  variables {
    environment = "prod"
    gpu_node_groups = {
      h100 = { instance_type = "p5.48xlarge", min = 0, max = 4, desired = 1, disk_gb = 500 }
      b200 = { instance_type = "p6-b200.48xlarge", min = 0, max = 2, desired = 0, disk_gb = 500 }
    }
  }
  assert {
    condition     = length(module.eks.gpu_taints) == 2
    error_message = "prod has H100 and B200 node groups"
  }
}

run "bad_environment_name_is_refused" {
  command = plan
  variables {
    environment = "Prod Env"
  }
  expect_failures = [var.environment]
}

run "each_project_reaches_only_its_own_prefix" {
  command = plan
  variables {
    projects = ["shop", "search", "se"]
  }
  assert {
    condition     = length(module.iam.project_access) == 3 && length(module.iam.project_role_arns) == 3
    error_message = "one access entry per project"
  }
  assert {
    condition = alltrue([for p, a in module.iam.project_access : alltrue([
      for o in a.objects : endswith(o, "/projects/${p}/*")
    ]) && length(a.objects) == 2])
    error_message = "a project's objects are its own prefix in the raw and curated buckets, nothing else"
  }
  assert {
    condition = alltrue([for p, a in module.iam.project_access : alltrue([
      for q in keys(module.iam.project_access) : q == p || !anytrue([for o in concat(a.objects, a.prefixes) : can(regex("projects/${q}(/|$)", o))])
    ])])
    error_message = "no project's policy names another project's prefix"
  }
  assert {
    condition     = alltrue([for p, a in module.iam.project_access : alltrue([for x in a.prefixes : startswith(x, "projects/${p}/")])])
    error_message = "a project lists only under its own prefix, slash included (`se` must not list `search`)"
  }
}

run "a_project_name_must_be_a_safe_identifier" {
  command = plan
  variables {
    projects = ["Shop-Team"]
  }
  expect_failures = [var.projects]
}
