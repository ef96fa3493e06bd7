output "name" {
  description = "Name of the bucket (CONVEYOR_PAYLOAD_BUCKET, for producers and consumers)."
  value       = aws_s3_bucket.this.bucket
}

output "arn" {
  description = "ARN of the bucket (the consumer modules' payload_bucket_arn)."
  value       = aws_s3_bucket.this.arn
}

output "producer_policy_json" {
  description = "An IAM policy for producers: s3:PutObject on the bucket's objects (plus the KMS key through S3 when one is set). Attach it next to the queue's producer_policy_json."
  value       = data.aws_iam_policy_document.producer.json
}
