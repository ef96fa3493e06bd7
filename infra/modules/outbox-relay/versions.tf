terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.80 brings the event source mapping's metrics_config; 6.x is admitted (nothing used here is
      # deprecated there).
      version = ">= 5.80"
    }
  }
}
