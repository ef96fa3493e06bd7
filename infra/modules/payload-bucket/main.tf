# The S3 bucket behind Conveyor's large payloads (claim check): a job body too large for SQS is stored
# here and the message carries a pointer (the SQS Extended Client Library's format). Consumers delete an
# object after its job succeeded; the lifecycle rule below is the backstop for the rest (objects of
# failed sends, jobs kept with CONVEYOR_PAYLOAD_CLEANUP=false, and dead-lettered jobs once their DLQ
# message is long gone).

resource "aws_s3_bucket" "this" {
  bucket        = var.name
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

# The backstop: every object expires `expiration_days` after it was last written. The default (29 days)
# outlives every message that can point at an object nobody touched: up to 14 days in the source queue
# (moved to the DLQ by SQS's redrive, which touches nothing), then redriven from the DLQ with 14 fresh
# days, plus a day. Consumers rewrite ("touch") an object before every copy of its
# message they make (a DLQ copy always, a delay hop or deferral once a day: CopyObject onto itself,
# conveyor-core/src/payload.rs), so the clock restarts and the object outlives every message that points
# at it, however long the job was delayed or how late its DLQ copy is redriven.
resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    id     = "expire-payloads"
    status = "Enabled"

    filter {}

    expiration {
      days = var.expiration_days
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

# Only TLS: the payloads are job bodies.
data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  depends_on = [aws_s3_bucket_public_access_block.this]
}

# Producers: Producer::with_large_payloads writes one object per large job (conveyor_s3::iam::PRODUCER).
data "aws_iam_policy_document" "producer" {
  statement {
    sid       = "WritePayloads"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.this.arn}/*"]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]

    content {
      sid = "EncryptPayloads"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = [statement.value]

      condition {
        test     = "StringLike"
        variable = "kms:ViaService"
        values   = ["s3.*.amazonaws.com"]
      }
    }
  }
}
