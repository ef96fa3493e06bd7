//! Classification of SDK errors into what the pipeline can act on: retry later (`Unavailable`), fix the
//! configuration (`Misconfigured`), a failed condition, or an item over DynamoDB's size limit.

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::get_item::GetItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_smithy_runtime_api::http::Response;
use conveyor_core::port::StoreError;

/// What went wrong with one request.
#[derive(Debug)]
pub(crate) enum Failure {
    /// `ConditionalCheckFailedException`: the item did not carry what the condition required.
    ConditionFailed,
    /// The item would exceed 400 KB (a `ValidationException` about item size).
    ItemTooLarge,
    /// Anything else, already classified.
    Store(StoreError),
}

/// Where a request went, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The operation, e.g. `PutItem`.
    pub operation: &'static str,
    /// The table.
    pub table: &'a str,
    /// The record's key.
    pub key: &'a str,
}

/// Operation errors that can report a failed condition in their own type.
pub(crate) trait ConditionalError {
    /// True for `ConditionalCheckFailedException`.
    fn is_condition_failure(&self) -> bool;
}

impl ConditionalError for PutItemError {
    fn is_condition_failure(&self) -> bool {
        self.is_conditional_check_failed_exception()
    }
}

impl ConditionalError for UpdateItemError {
    fn is_condition_failure(&self) -> bool {
        self.is_conditional_check_failed_exception()
    }
}

impl ConditionalError for DeleteItemError {
    fn is_condition_failure(&self) -> bool {
        self.is_conditional_check_failed_exception()
    }
}

impl ConditionalError for aws_sdk_dynamodb::operation::query::QueryError {
    fn is_condition_failure(&self) -> bool {
        false
    }
}

impl ConditionalError for aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError {
    fn is_condition_failure(&self) -> bool {
        false
    }
}

impl ConditionalError for aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemError {
    fn is_condition_failure(&self) -> bool {
        false
    }
}

impl ConditionalError for GetItemError {
    fn is_condition_failure(&self) -> bool {
        false
    }
}

/// Error codes that mean "try again later".
const TRANSIENT_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
    "LimitExceededException",
    "ExpiredTokenException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Error codes that mean the credentials or their permissions are wrong.
const ACCESS_CODES: &[&str] = &[
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "MissingAuthenticationTokenException",
    "IncompleteSignatureException",
];

/// Classifies a failed request.
pub(crate) fn classify<E>(error: &SdkError<E, Response>, target: Target<'_>) -> Failure
where
    E: ConditionalError + ProvideErrorMetadata + std::error::Error + 'static,
{
    let detail = DisplayErrorContext(error).to_string();
    let unavailable = |what: &str| {
        Failure::Store(StoreError::Unavailable {
            message: format!(
                "{} on table {} for {:?} {what}: {detail}",
                target.operation, target.table, target.key
            ),
        })
    };
    let misconfigured = |message: String| Failure::Store(StoreError::Misconfigured { message });
    match error {
        SdkError::TimeoutError(_) => return unavailable("timed out"),
        SdkError::DispatchFailure(_) => return unavailable("could not be sent (connection failed)"),
        SdkError::ResponseError(_) => return unavailable("got an unreadable response"),
        SdkError::ConstructionFailure(_) => {
            return misconfigured(format!(
                "{} on table {} could not be built (check the client's region and endpoint): {detail}",
                target.operation, target.table
            ));
        }
        _ => {}
    }
    let code = error.code().unwrap_or("");
    let message = error.message().unwrap_or("");
    let typed = error
        .as_service_error()
        .is_some_and(ConditionalError::is_condition_failure);
    if typed || code == "ConditionalCheckFailedException" {
        return Failure::ConditionFailed;
    }
    if TRANSIENT_CODES.contains(&code) {
        return unavailable("was throttled or failed on the server");
    }
    if code == "ResourceNotFoundException" {
        return misconfigured(format!(
            "idempotency table {} does not exist (or is not ACTIVE) in this account and region: create it with \
             infra/modules/idempotency-table (partition key `id` of type S, TTL on `expiration`), or point \
             the store at the right table ({code}: {message})",
            target.table
        ));
    }
    if ACCESS_CODES.contains(&code) {
        return misconfigured(format!(
            "{} on idempotency table {} was denied: the role needs dynamodb:PutItem, UpdateItem, DeleteItem \
             and GetItem on the table ({code}: {message})",
            target.operation, target.table
        ));
    }
    if code == "ItemCollectionSizeLimitExceededException" {
        return misconfigured(format!(
            "table {} has a local secondary index whose item collection for {:?} is full; an idempotency \
             table needs no index ({code}: {message})",
            target.table, target.key
        ));
    }
    if code == "ValidationException" && is_about_item_size(message) {
        return Failure::ItemTooLarge;
    }
    if code == "ValidationException" {
        return misconfigured(format!(
            "{} on idempotency table {} was refused as invalid; check that its partition key is a string \
             named like the store's `id` attribute ({code}: {message})",
            target.operation, target.table
        ));
    }
    let status = error.raw_response().map(|response| response.status().as_u16());
    match status {
        Some(status) if status >= 500 => unavailable("failed on the server"),
        _ => misconfigured(format!(
            "{} on idempotency table {} was refused: {detail}",
            target.operation, target.table
        )),
    }
}

/// DynamoDB's wording: "Item size has exceeded the maximum allowed size", "Item size to update has
/// exceeded the maximum allowed size".
fn is_about_item_size(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("item size") && message.contains("exceeded")
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    const TARGET: Target<'static> = Target {
        operation: "PutItem",
        table: "jobs-idem",
        key: "k",
    };

    fn service_error(code: &str, message: &str, status: u16) -> SdkError<PutItemError, Response> {
        let meta = ErrorMetadata::builder().code(code).message(message).build();
        let response = Response::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
        SdkError::service_error(PutItemError::generic(meta), response)
    }

    fn unavailable(failure: Failure) -> bool {
        matches!(failure, Failure::Store(StoreError::Unavailable { .. }))
    }

    fn misconfigured(failure: Failure) -> Option<String> {
        match failure {
            Failure::Store(StoreError::Misconfigured { message }) => Some(message),
            _ => None,
        }
    }

    #[test]
    fn throttling_and_server_errors_are_unavailable() {
        for code in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
            "InternalServerError",
        ] {
            assert!(
                unavailable(classify(&service_error(code, "slow down", 400), TARGET)),
                "{code}"
            );
        }
        assert!(unavailable(classify(
            &service_error("SomethingNew", "boom", 503),
            TARGET
        )));
    }

    #[test]
    fn a_missing_table_names_the_table_and_the_module() {
        let message = misconfigured(classify(
            &service_error("ResourceNotFoundException", "Requested resource not found", 400),
            TARGET,
        ))
        .unwrap();
        assert!(message.contains("jobs-idem"), "{message}");
        assert!(message.contains("infra/modules/idempotency-table"), "{message}");
    }

    #[test]
    fn access_denied_is_misconfigured() {
        let message = misconfigured(classify(
            &service_error("AccessDeniedException", "not authorized", 400),
            TARGET,
        ))
        .unwrap();
        assert!(message.contains("dynamodb:PutItem"), "{message}");
    }

    #[test]
    fn item_size_validation_is_too_large_other_validation_is_misconfigured() {
        let too_large = service_error(
            "ValidationException",
            "Item size to update has exceeded the maximum allowed size",
            400,
        );
        assert!(matches!(classify(&too_large, TARGET), Failure::ItemTooLarge));
        let bad_key = service_error(
            "ValidationException",
            "One or more parameter values were invalid: Missing the key id in the item",
            400,
        );
        assert!(misconfigured(classify(&bad_key, TARGET)).is_some());
        let collection = service_error("ItemCollectionSizeLimitExceededException", "full", 400);
        assert!(misconfigured(classify(&collection, TARGET)).is_some());
    }

    #[test]
    fn a_failed_condition_is_recognised() {
        let failed = service_error(
            "ConditionalCheckFailedException",
            "The conditional request failed",
            400,
        );
        assert!(matches!(classify(&failed, TARGET), Failure::ConditionFailed));
    }

    #[test]
    fn timeouts_and_connection_failures_are_unavailable() {
        let timeout: SdkError<PutItemError, Response> = SdkError::timeout_error("took too long");
        assert!(unavailable(classify(&timeout, TARGET)));
        let dispatch: SdkError<PutItemError, Response> = SdkError::dispatch_failure(
            aws_smithy_runtime_api::client::result::ConnectorError::io("connection refused".into()),
        );
        assert!(unavailable(classify(&dispatch, TARGET)));
    }
}
