//! The SQS client, configured the standard AWS way.

use aws_config::{BehaviorVersion, Region};
use clap::Args;

/// Where and as whom to call AWS. Without these options everything comes from the standard AWS
/// environment and shared config (`AWS_PROFILE`, `AWS_REGION`, `AWS_ENDPOINT_URL_SQS`, SSO, ...).
#[derive(Debug, Clone, Default, Args)]
pub struct AwsArgs {
    /// Named profile from ~/.aws/config (instead of AWS_PROFILE).
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,
    /// AWS region (instead of AWS_REGION or the profile's region).
    #[arg(long, global = true, value_name = "REGION")]
    pub region: Option<String>,
    /// SQS endpoint, e.g. http://127.0.0.1:4566 for LocalStack (instead of AWS_ENDPOINT_URL_SQS).
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,
}

impl AwsArgs {
    /// An SQS client from the environment, with these options applied on top.
    pub async fn sqs_client(&self) -> aws_sdk_sqs::Client {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(profile) = &self.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let config = loader.load().await;
        let mut sqs = aws_sdk_sqs::config::Builder::from(&config);
        if let Some(endpoint) = &self.endpoint_url {
            sqs = sqs.endpoint_url(endpoint);
        }
        aws_sdk_sqs::Client::from_conf(sqs.build())
    }
}
