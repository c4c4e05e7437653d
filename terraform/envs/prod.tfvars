environment = "prod"
region      = "us-east-1"
cpu_nodes   = { instance_type = "m7i.2xlarge", min = 3, max = 12, desired = 3 }
gpu_node_groups = {
  h100 = { instance_type = "p5.48xlarge", min = 0, max = 4, desired = 1, disk_gb = 500 }
  b200 = { instance_type = "p6-b200.48xlarge", min = 0, max = 2, desired = 0, disk_gb = 500 }
}
db_instance_class       = "db.m7g.large"
db_allocated_storage_gb = 200
