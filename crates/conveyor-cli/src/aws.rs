//! The AWS clients, configured the standard AWS way, and the configuration mistakes caught before the
//! first call: no region, no credentials.
//!
//! Without these checks the SDK turns both into a "dispatch failure" of the first request, after probing
//! the EC2 instance metadata service (IMDS) and logging its failures; the CLI would then call that an
//! outage. Checking up front costs nothing on the happy path (the credentials are resolved once more by
//! the SDK's own cache) and names what is missing and how to set it.

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_sqs::config::ProvideCredentials as _;
use clap::Args;
use conveyor_sqs::admin::display_chain;

/// What to run `source localstack/env.sh` for, said once in every configuration error.
const LOCAL_HINT: &str =
    "for the local emulators, `source localstack/env.sh` sets region, endpoints and dummy credentials";

/// Where and as whom to call AWS. Without these options everything comes from the standard AWS
/// environment and shared config (`AWS_PROFILE`, `AWS_REGION`, `AWS_ENDPOINT_URL_SQS`, SSO, ...).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct AwsArgs {
    /// Named profile from ~/.aws/config (instead of AWS_PROFILE).
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,
    /// AWS region (instead of AWS_REGION or the profile's region).
    #[arg(long, global = true, value_name = "REGION")]
    pub region: Option<String>,
    /// Endpoint of every AWS service the command calls (SQS, DynamoDB, S3, CloudWatch), e.g.
    /// http://127.0.0.1:4566 for LocalStack; beats AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE>, as in
    /// the AWS CLI.
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// DynamoDB's endpoint, when it differs from --endpoint-url (DynamoDB Local: http://127.0.0.1:8000).
    #[arg(long, global = true, value_name = "URL")]
    pub dynamodb_endpoint_url: Option<String>,
    /// S3's endpoint, when it differs from --endpoint-url (MinIO, LocalStack's S3).
    #[arg(long, global = true, value_name = "URL")]
    pub s3_endpoint_url: Option<String>,
}

/// The endpoints given on the command line, per service (see [`AwsArgs`]).
#[derive(Debug, Clone, Default)]
struct Endpoints {
    sqs: Option<String>,
    dynamodb: Option<String>,
    s3: Option<String>,
    /// `--endpoint-url`, else `AWS_ENDPOINT_URL_CLOUDWATCH` (the SDK's own). An emulator must speak
    /// CloudWatch's current protocol (Smithy RPC v2 CBOR): moto 5.2 does, LocalStack 4.8.1 does not.
    cloudwatch: Option<String>,
}

impl Endpoints {
    fn from_args(args: &AwsArgs) -> Self {
        let or_all = |own: &Option<String>| own.clone().or_else(|| args.endpoint_url.clone());
        Self {
            sqs: args.endpoint_url.clone(),
            dynamodb: or_all(&args.dynamodb_endpoint_url),
            s3: or_all(&args.s3_endpoint_url),
            cloudwatch: args.endpoint_url.clone(),
        }
    }
}

/// A configuration mistake found before any call: fatal, with what to set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// No region from `--region`, `AWS_REGION` / `AWS_DEFAULT_REGION` or the profile.
    #[error(
        "no AWS region is configured: pass --region (e.g. --region us-east-1), set AWS_REGION, or set `region` \
         in your AWS profile; {LOCAL_HINT}"
    )]
    NoRegion,
    /// The credential chain found nothing usable.
    #[error(
        "no AWS credentials were found ({reason}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE \
         (after `aws configure` or `aws sso login`); {LOCAL_HINT}"
    )]
    NoCredentials {
        /// The credential chain's own words, without the SDK's debug structures.
        reason: String,
    },
}

/// The loaded AWS configuration, with the settings the error messages name.
#[derive(Debug, Clone)]
pub(crate) struct Aws {
    config: SdkConfig,
    endpoints: Endpoints,
    /// The region every client uses.
    pub region: String,
}

impl AwsArgs {
    /// Loads the standard AWS configuration with these options on top, and checks that it has a region
    /// and credentials.
    pub(crate) async fn load(&self) -> Result<Aws, ConfigError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(profile) = &self.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let config = loader.load().await;
        let region = config
            .region()
            .map(ToString::to_string)
            .filter(|region| !region.is_empty())
            .ok_or(ConfigError::NoRegion)?;
        let Some(provider) = config.credentials_provider() else {
            return Err(ConfigError::NoCredentials {
                reason: "no credential provider is configured".to_owned(),
            });
        };
        if let Err(error) = provider.provide_credentials().await {
            return Err(ConfigError::NoCredentials {
                reason: credentials_reason(&display_chain(&error)),
            });
        }
        Ok(Aws {
            config,
            endpoints: Endpoints::from_args(self),
            region,
        })
    }
}

impl Aws {
    /// Settings for unit tests of the messages that name them.
    #[cfg(test)]
    pub(crate) fn for_tests(region: &str, endpoint: Option<&str>) -> Self {
        Self {
            config: SdkConfig::builder()
                .region(Region::new(region.to_owned()))
                .build(),
            endpoints: Endpoints {
                sqs: endpoint.map(str::to_owned),
                ..Endpoints::default()
            },
            region: region.to_owned(),
        }
    }

    /// An SQS client with `--endpoint-url` applied.
    pub(crate) fn sqs_client(&self) -> aws_sdk_sqs::Client {
        let mut sqs = aws_sdk_sqs::config::Builder::from(&self.config);
        if let Some(endpoint) = &self.endpoints.sqs {
            sqs = sqs.endpoint_url(endpoint);
        }
        aws_sdk_sqs::Client::from_conf(sqs.build())
    }

    /// A DynamoDB client with `--dynamodb-endpoint-url` or `--endpoint-url` applied (else
    /// `AWS_ENDPOINT_URL_DYNAMODB`, as the worker's).
    pub(crate) fn dynamodb_client(&self) -> aws_sdk_dynamodb::Client {
        let mut dynamodb = aws_sdk_dynamodb::config::Builder::from(&self.config);
        if let Some(endpoint) = &self.endpoints.dynamodb {
            dynamodb = dynamodb.endpoint_url(endpoint);
        }
        aws_sdk_dynamodb::Client::from_conf(dynamodb.build())
    }

    /// A CloudWatch client (the console's fair-queue metrics) with `--endpoint-url` applied.
    pub(crate) fn cloudwatch_client(&self) -> aws_sdk_cloudwatch::Client {
        let mut cloudwatch = aws_sdk_cloudwatch::config::Builder::from(&self.config);
        if let Some(endpoint) = &self.endpoints.cloudwatch {
            cloudwatch = cloudwatch.endpoint_url(endpoint);
        }
        aws_sdk_cloudwatch::Client::from_conf(cloudwatch.build())
    }

    /// An S3 client with `--s3-endpoint-url` or `--endpoint-url` applied (else `AWS_ENDPOINT_URL_S3`),
    /// with the profile and region of the other clients and the payload store's deadlines.
    pub(crate) fn s3_client(&self) -> aws_sdk_s3::Client {
        conveyor_s3::s3_client(&self.config, self.endpoints.s3.as_deref())
    }

    /// The DynamoDB endpoint the client calls: `--dynamodb-endpoint-url`, else `--endpoint-url`, else
    /// `AWS_ENDPOINT_URL_DYNAMODB`, else `AWS_ENDPOINT_URL`, else AWS's regional endpoint.
    pub(crate) fn dynamodb_endpoint(&self) -> String {
        self.endpoints
            .dynamodb
            .clone()
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL_DYNAMODB"))
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://dynamodb.{}.amazonaws.com", self.region))
    }

    /// The SQS endpoint when it is not AWS's own (an emulator).
    pub(crate) fn local_sqs_endpoint(&self) -> Option<String> {
        Some(self.sqs_endpoint()).filter(|endpoint| !is_aws(endpoint))
    }

    /// The DynamoDB endpoint when it is not AWS's own (an emulator).
    pub(crate) fn local_dynamodb_endpoint(&self) -> Option<String> {
        Some(self.dynamodb_endpoint()).filter(|endpoint| !is_aws(endpoint))
    }

    /// The endpoint set for CloudWatch: `--endpoint-url`, else `AWS_ENDPOINT_URL_CLOUDWATCH`, else
    /// `AWS_ENDPOINT_URL`; `None`: AWS's own.
    pub(crate) fn cloudwatch_endpoint(&self) -> Option<String> {
        self.endpoints
            .cloudwatch
            .clone()
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL_CLOUDWATCH"))
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL"))
    }

    /// The SQS endpoint the client calls, as a person would write it: `--endpoint-url`, else
    /// `AWS_ENDPOINT_URL_SQS`, else `AWS_ENDPOINT_URL`, else AWS's regional endpoint.
    pub(crate) fn sqs_endpoint(&self) -> String {
        self.endpoints
            .sqs
            .clone()
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL_SQS"))
            .or_else(|| env_nonempty("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://sqs.{}.amazonaws.com", self.region))
    }
}

/// The credential chain's failure in a few words. Its last attempt is the EC2 instance metadata service
/// (IMDS), so its raw text is about IMDS even when the real problem is that nothing was configured at all.
fn credentials_reason(chain: &str) -> String {
    if chain.contains("IMDS") || chain.contains("no providers in chain provided credentials") {
        return "none in the environment, the AWS config and credentials files, SSO, or the instance metadata \
                service"
            .to_owned();
    }
    chain.to_owned()
}

/// True for AWS's own endpoints (`https://sqs.us-east-1.amazonaws.com`, `....amazonaws.com.cn`).
fn is_aws(endpoint: &str) -> bool {
    let host = endpoint.split("://").nth(1).unwrap_or(endpoint);
    let host = host.split(['/', ':']).next().unwrap_or(host);
    host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn")
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_url_reaches_every_service_and_a_service_flag_beats_it() {
        let args = AwsArgs {
            endpoint_url: Some("http://127.0.0.1:4566".to_owned()),
            dynamodb_endpoint_url: Some("http://127.0.0.1:8000".to_owned()),
            ..AwsArgs::default()
        };
        let endpoints = Endpoints::from_args(&args);
        assert_eq!(endpoints.sqs.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(endpoints.dynamodb.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(endpoints.s3.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(endpoints.cloudwatch.as_deref(), Some("http://127.0.0.1:4566"));
        let none = Endpoints::from_args(&AwsArgs::default());
        assert!(none.sqs.is_none() && none.dynamodb.is_none() && none.s3.is_none());
    }
}
