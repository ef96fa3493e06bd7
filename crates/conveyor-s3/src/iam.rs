//! The IAM actions behind the S3 calls the payload store makes.
//!
//! The one place that says which S3 operation needs which IAM permission: `infra/modules/consumer-permissions`
//! grants [`CONSUMER`] on the payload bucket's objects and `infra/modules/payload-bucket`'s producer policy
//! grants [`PRODUCER`]; `tests/tests/infra.rs` checks the store's SDK calls against these lists and the
//! lists against the policies. Consumers also get `s3:ListBucket` on the bucket, for no call of ours: S3
//! answers a missing key with `AccessDenied` instead of `NoSuchKey` without it.

/// What a consumer calls: the payload is fetched before the job runs, touched (copied onto itself, which
/// needs `s3:GetObject` on the source and `s3:PutObject` on the target) before a copy of its message is
/// made, and deleted after the job completed. Each entry is the `aws_sdk_s3::Client` method and the IAM
/// action it needs.
pub const CONSUMER: &[(&str, &str)] = &[
    ("get_object", "s3:GetObject"),
    ("copy_object", "s3:PutObject"),
    ("delete_object", "s3:DeleteObject"),
];

/// What a producer calls: one object per large job.
pub const PRODUCER: &[(&str, &str)] = &[("put_object", "s3:PutObject")];
