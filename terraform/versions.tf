terraform {
  required_version = ">= 1.11"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = {
      project     = "commerce-flywheel"
      environment = var.environment
      managed-by  = "terraform"
    }
  }
}
