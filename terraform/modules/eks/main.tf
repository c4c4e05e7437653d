# EKS with a CPU node group and one GPU node group per accelerator (H100: p5, B200: p6-b200).
# GPU nodes run Bottlerocket's NVIDIA variant, which ships the driver and the NVIDIA Kubernetes
# device plugin (nvidia.com/gpu resources); they carry the label flywheel.io/gpu=<accelerator> and a
# NoSchedule taint so only GPU work (NeMo training pods, Triton) lands there.
variable "name" { type = string }
variable "kubernetes_version" { type = string }
variable "subnet_ids" { type = list(string) }
variable "cpu_nodes" { type = object({ instance_type = string, min = number, max = number, desired = number }) }
variable "gpu_node_groups" {
  type = map(object({ instance_type = string, min = number, max = number, desired = number, disk_gb = number }))
}
variable "admin_cidrs" { type = list(string) }
variable "kms_key_arn" { type = string }

data "aws_iam_policy_document" "assume" {
  for_each = toset(["eks.amazonaws.com", "ec2.amazonaws.com"])
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = [each.key]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.name}-eks-cluster"
  assume_role_policy = data.aws_iam_policy_document.assume["eks.amazonaws.com"].json
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-eks-node"
  assume_role_policy = data.aws_iam_policy_document.assume["ec2.amazonaws.com"].json
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
  ])
  role       = aws_iam_role.node.name
  policy_arn = each.key
}

resource "aws_cloudwatch_log_group" "cluster" {
  name              = "/aws/eks/${var.name}/cluster"
  retention_in_days = 365
  kms_key_id        = var.kms_key_arn
}

resource "aws_eks_cluster" "this" {
  name     = var.name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn
  vpc_config {
    subnet_ids              = var.subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = length(var.admin_cidrs) > 0
    public_access_cidrs     = length(var.admin_cidrs) > 0 ? var.admin_cidrs : null
  }
  encryption_config {
    resources = ["secrets"]
    provider { key_arn = var.kms_key_arn }
  }
  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
  depends_on                = [aws_iam_role_policy_attachment.cluster, aws_cloudwatch_log_group.cluster]
}

resource "aws_eks_node_group" "cpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "cpu"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  instance_types  = [var.cpu_nodes.instance_type]
  ami_type        = "AL2023_x86_64_STANDARD"
  labels          = { "flywheel.io/pool" = "cpu" }
  scaling_config {
    min_size     = var.cpu_nodes.min
    max_size     = var.cpu_nodes.max
    desired_size = var.cpu_nodes.desired
  }
  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "gpu" {
  for_each        = var.gpu_node_groups
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-${each.key}"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  instance_types  = [each.value.instance_type]
  ami_type        = "BOTTLEROCKET_x86_64_NVIDIA" # NVIDIA driver + device plugin built in
  disk_size       = each.value.disk_gb
  labels = {
    "flywheel.io/pool"       = "gpu"
    "flywheel.io/gpu"        = each.key
    "nvidia.com/gpu.present" = "true"
  }
  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }
  scaling_config {
    min_size     = each.value.min
    max_size     = each.value.max
    desired_size = each.value.desired
  }
  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_iam_openid_connect_provider" "this" {
  url             = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list  = ["sts.amazonaws.com"]
  thumbprint_list = ["9e99a48a9960b14926bb7f3b02e22da2b0ab7280"]
}

output "cluster_name" { value = aws_eks_cluster.this.name }
output "endpoint" { value = aws_eks_cluster.this.endpoint }
output "node_security_group_id" { value = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id }
output "oidc_provider_arn" { value = aws_iam_openid_connect_provider.this.arn }
output "oidc_issuer" { value = aws_eks_cluster.this.identity[0].oidc[0].issuer }
output "gpu_node_selectors" { value = { for k, _ in var.gpu_node_groups : k => { "flywheel.io/gpu" = k } } }
output "gpu_taints" { value = { for k, g in aws_eks_node_group.gpu : k => g.taint } }
