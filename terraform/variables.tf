variable "region" {
  type    = string
  default = "us-east-1"
}

variable "environment" {
  description = "dev, prod, ...: prefixes every resource name"
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.environment))
    error_message = "environment: lowercase letters, digits and dashes, 2-16 characters."
  }
}

variable "vpc_cidr" {
  type    = string
  default = "10.40.0.0/16"
}

variable "availability_zones" {
  type    = list(string)
  default = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

variable "kubernetes_version" {
  type    = string
  default = "1.33"
}

variable "cpu_nodes" {
  description = "general node group: Airflow, MLflow, Feast, Spark driver"
  type        = object({ instance_type = string, min = number, max = number, desired = number })
  default     = { instance_type = "m7i.2xlarge", min = 2, max = 10, desired = 3 }
}

variable "gpu_node_groups" {
  description = "GPU node groups by accelerator; each gets the label flywheel.io/gpu=<key> and a NoSchedule taint"
  type = map(object({
    instance_type = string
    min           = number
    max           = number
    desired       = number
    disk_gb       = number
  }))
  default = {
    h100 = { instance_type = "p5.48xlarge", min = 0, max = 4, desired = 0, disk_gb = 500 }
    b200 = { instance_type = "p6-b200.48xlarge", min = 0, max = 2, desired = 0, disk_gb = 500 }
  }
}

variable "db_instance_class" {
  type    = string
  default = "db.m7g.large"
}

variable "db_allocated_storage_gb" {
  type    = number
  default = 100
}

variable "admin_cidrs" {
  description = "CIDRs allowed to reach the EKS API endpoint (empty: private endpoint only)"
  type        = list(string)
  default     = []
}

variable "projects" {
  description = "AI projects (flywheel project list): each gets an IAM role reaching only its own prefix, projects/<name>/, in the data buckets"
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for p in var.projects : can(regex("^[a-z][a-z0-9_]{1,30}$", p)) && p != "default"])
    error_message = "a project name is 2-31 characters of a-z, 0-9 and _, starting with a letter (not `default`, the platform's own)"
  }
}
