//! The fault layer over the real SDK clients (feature `aws`): an HTTP client wrapper that applies a
//! [`Faults`] schedule below the SDK's timeouts, retries and error parsing, and the SQS and DynamoDB
//! clients built with it. See the module docs of [`crate::faults`].

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::{RuntimeComponents, RuntimeComponentsBuilder};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;

use super::{Fault, Faults, HANG};
use crate::localstack;

impl Faults {
    /// An HTTP client that applies this schedule in front of the SDK's default HTTPS client (rustls,
    /// as the SDK's `default-https-client` feature builds it); give it to a service config builder's
    /// `.http_client(...)`.
    pub fn http_client(&self) -> SharedHttpClient {
        self.wrap(None)
    }

    /// An HTTP client that applies this schedule in front of `inner` (the default HTTPS client when
    /// `None`, e.g. `config.http_client()` of a client that has none of its own).
    pub fn wrap(&self, inner: Option<SharedHttpClient>) -> SharedHttpClient {
        let inner = inner.unwrap_or_else(default_http_client);
        SharedHttpClient::new(FaultyHttpClient {
            inner,
            faults: self.clone(),
        })
    }
}

fn default_http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https()
}

/// The HTTP client wrapper: hands out [`FaultyConnector`]s around the inner client's connectors.
#[derive(Debug)]
struct FaultyHttpClient {
    inner: SharedHttpClient,
    faults: Faults,
}

impl HttpClient for FaultyHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(FaultyConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults.clone(),
        })
    }

    fn validate_base_client_config(
        &self,
        runtime_components: &RuntimeComponentsBuilder,
        cfg: &ConfigBag,
    ) -> Result<(), BoxError> {
        self.inner.validate_base_client_config(runtime_components, cfg)
    }

    fn validate_final_config(
        &self,
        runtime_components: &RuntimeComponents,
        cfg: &ConfigBag,
    ) -> Result<(), BoxError> {
        self.inner.validate_final_config(runtime_components, cfg)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.inner.connector_metadata()
    }
}

#[derive(Debug)]
struct FaultyConnector {
    inner: SharedHttpConnector,
    faults: Faults,
}

/// The service and operation of a request, from `X-Amz-Target` (`AmazonSQS.SendMessage`,
/// `DynamoDB_20120810.PutItem`; both services speak the AWS JSON 1.0 protocol), else from a Smithy RPC v2
/// path (`/service/GraniteServiceVersion20100801/operation/GetMetricData`: CloudWatch, whose calls can
/// be counted, delayed and hung; the error answers are JSON 1.0, which its SDK cannot read).
fn target(request: &HttpRequest) -> (Service, String) {
    let Some(target) = request.headers().get("x-amz-target") else {
        let operation = request
            .uri()
            .split_once("/operation/")
            .and_then(|(_, rest)| rest.split(['/', '?']).next())
            .unwrap_or_default();
        return (Service::Other, operation.to_owned());
    };
    let (prefix, operation) = target.rsplit_once('.').unwrap_or(("", target));
    let service = if prefix.starts_with("AmazonSQS") {
        Service::Sqs
    } else if prefix.starts_with("DynamoDB") {
        Service::DynamoDb
    } else {
        Service::Other
    };
    (service, operation.to_owned())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Sqs,
    DynamoDb,
    Other,
}

/// A reset connection: what a caller sees when the response is lost on the way back.
#[derive(Debug, thiserror::Error)]
#[error("connection reset by peer (response to {operation} dropped by conveyor-testing's fault layer)")]
struct DroppedResponse {
    operation: String,
}

impl HttpConnector for FaultyConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let (service, operation) = target(&request);
        let Some(fault) = self.faults.decide(&operation) else {
            return self.inner.call(request);
        };
        tracing::debug!(%operation, ?fault, "injecting a fault");
        let inner = self.inner.clone();
        HttpConnectorFuture::new(async move {
            match fault {
                Fault::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    inner.call(request).await
                }
                Fault::Hang => {
                    tokio::time::sleep(HANG).await;
                    inner.call(request).await
                }
                Fault::Throttle => error_response(service, 400, throttling_code(service)),
                Fault::ServerError => error_response(service, 500, server_error_code(service)),
                Fault::DropResponse => {
                    let response = inner.call(request).await?;
                    drop(response);
                    Err(ConnectorError::io(Box::new(DroppedResponse { operation })))
                }
            }
        })
    }
}

fn throttling_code(_service: Service) -> &'static str {
    // The code both services use for request-rate throttling, which the SDK's standard retry mode treats
    // as throttling and conveyor-sqs / conveyor-dynamodb classify as `Unavailable`.
    "ThrottlingException"
}

fn server_error_code(service: Service) -> &'static str {
    match service {
        Service::DynamoDb => "InternalServerError",
        Service::Sqs | Service::Other => "InternalFailure",
    }
}

/// An AWS JSON 1.0 error response, as the services send it (SQS adds its query-compatible code).
fn error_response(service: Service, status: u16, code: &str) -> Result<HttpResponse, ConnectorError> {
    let body = serde_json::json!({
        "__type": code,
        "message": format!("{code} injected by conveyor-testing's fault layer"),
    });
    let status = StatusCode::try_from(status).map_err(|error| ConnectorError::other(error.into(), None))?;
    let mut response = HttpResponse::new(status, SdkBody::from(body.to_string()));
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    if service == Service::Sqs {
        let fault = if status.as_u16() >= 500 {
            "Receiver"
        } else {
            "Sender"
        };
        response
            .headers_mut()
            .insert("x-amzn-query-error", format!("{code};{fault}"));
    }
    Ok(response)
}

/// An SQS client for LocalStack (as [`localstack::sqs_client`] builds it) with the production deadlines
/// and retries of `conveyor_sqs::sqs_client_from_env`, whose calls go through `faults`.
pub async fn faulty_sqs_client(faults: &Faults) -> aws_sdk_sqs::Client {
    let client = localstack::sqs_client().await;
    let config = client
        .config()
        .to_builder()
        .timeout_config(conveyor_sqs::timeout_config())
        .retry_config(conveyor_sqs::retry_config())
        .build();
    with_faults_sqs(&aws_sdk_sqs::Client::from_conf(config), faults)
}

/// A DynamoDB client for DynamoDB Local (as [`localstack::dynamodb_client`] builds it) with the
/// production deadlines and retries of `conveyor_dynamodb::dynamodb_client_from_env`, whose calls go
/// through `faults`.
pub async fn faulty_dynamodb_client(faults: &Faults) -> aws_sdk_dynamodb::Client {
    let client = localstack::dynamodb_client().await;
    let config = client
        .config()
        .to_builder()
        .timeout_config(conveyor_dynamodb::timeout_config())
        .retry_config(conveyor_dynamodb::retry_config())
        .build();
    with_faults_dynamodb(&aws_sdk_dynamodb::Client::from_conf(config), faults)
}

/// The same client (endpoint, credentials, deadlines, retries) with its calls going through `faults`.
pub fn with_faults_sqs(client: &aws_sdk_sqs::Client, faults: &Faults) -> aws_sdk_sqs::Client {
    let config = client.config();
    let http_client = faults.wrap(config.http_client());
    aws_sdk_sqs::Client::from_conf(config.to_builder().http_client(http_client).build())
}

/// The same client (endpoint, credentials, deadlines, retries) with its calls going through `faults`.
pub fn with_faults_dynamodb(client: &aws_sdk_dynamodb::Client, faults: &Faults) -> aws_sdk_dynamodb::Client {
    let config = client.config();
    let http_client = faults.wrap(config.http_client());
    aws_sdk_dynamodb::Client::from_conf(config.to_builder().http_client(http_client).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_responses_carry_the_service_code() {
        let response = error_response(Service::Sqs, 400, "ThrottlingException").unwrap();
        assert_eq!(response.status().as_u16(), 400);
        assert_eq!(
            response.headers().get("x-amzn-query-error"),
            Some("ThrottlingException;Sender")
        );
        let body = std::str::from_utf8(response.body().bytes().unwrap_or_default()).unwrap_or("");
        assert!(body.contains("\"__type\":\"ThrottlingException\""), "{body}");
        let response = error_response(Service::DynamoDb, 500, "InternalServerError").unwrap();
        assert_eq!(response.status().as_u16(), 500);
        assert_eq!(response.headers().get("x-amzn-query-error"), None);
    }
}
