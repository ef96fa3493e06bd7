//! S3 errors → [`PayloadError`]: the pipeline dead-letters only on `NotFound`, defers on the rest.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use conveyor_core::port::PayloadError;
use conveyor_core::runtime::display_chain;

/// What an S3 call failed with, for `bucket`/`key`.
pub(crate) fn classify<E>(error: &SdkError<E, HttpResponse>, bucket: &str, key: &str) -> PayloadError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let unavailable = |what: &str| PayloadError::Unavailable {
        message: format!("S3 call for s3://{bucket}/{key} {what}: {}", display_chain(error)),
    };
    let service = match error {
        SdkError::TimeoutError(_) => return unavailable("timed out"),
        SdkError::DispatchFailure(_) => {
            return unavailable(
                "did not reach S3 (is it running at the endpoint the SDK uses? AWS_ENDPOINT_URL_S3 when set, \
                 else AWS's for AWS_REGION; locally `make local-aws` and `source localstack/env.sh`)",
            );
        }
        SdkError::ResponseError(_) => return unavailable("got an unreadable response"),
        SdkError::ServiceError(service) => service,
        _ => return unavailable("failed"),
    };
    let status = service.raw().status().as_u16();
    let code = service.err().code().unwrap_or_default();
    match code {
        "NoSuchKey" => PayloadError::NotFound {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        },
        "NoSuchBucket" => PayloadError::Misconfigured {
            message: format!(
                "bucket {bucket} does not exist: check CONVEYOR_PAYLOAD_BUCKET and the producer's bucket"
            ),
        },
        "AccessDenied" | "AllAccessDisabled" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" => {
            PayloadError::Misconfigured {
                message: format!(
                    "access to s3://{bucket}/{key} denied ({code}): consumers need s3:GetObject, s3:DeleteObject \
                     and s3:ListBucket (without ListBucket S3 answers a missing key with AccessDenied), producers \
                     s3:PutObject; see infra/modules/payload-bucket"
                ),
            }
        }
        _ if status == 404 => PayloadError::NotFound {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        },
        _ if (400..500).contains(&status) && status != 429 && status != 408 => PayloadError::Misconfigured {
            message: format!(
                "S3 refused the request for s3://{bucket}/{key} ({status} {code}): {}",
                display_chain(error)
            ),
        },
        _ => unavailable("failed"),
    }
}
