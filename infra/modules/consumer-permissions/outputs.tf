output "json" {
  description = "The policy document, for aws_iam_role_policy or as a source_policy_documents entry."
  value       = data.aws_iam_policy_document.this.json
}
