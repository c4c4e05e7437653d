environment = "dev"
region      = "us-east-1"
cpu_nodes   = { instance_type = "m7i.xlarge", min = 1, max = 4, desired = 2 }
gpu_node_groups = {
  h100 = { instance_type = "p5.48xlarge", min = 0, max = 1, desired = 0, disk_gb = 300 }
}
db_instance_class       = "db.t4g.medium"
db_allocated_storage_gb = 50
