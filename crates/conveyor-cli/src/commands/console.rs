//! `conveyor console`: the web console (crates/conveyor-console) on this machine's AWS settings.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use conveyor_console::{Console, ConsoleConfig, TOKEN_ENV, VIEWER_TOKEN_ENV};
use conveyor_sqs::admin::QueueRef;
use tokio_util::sync::CancellationToken;

use crate::aws::Aws;
use crate::output::{Format, print_json_line};

/// Arguments of `conveyor console`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor console --queue-prefix jobs --worker http://127.0.0.1:9090 --table conveyor-idempotency
  CONVEYOR_CONSOLE_TOKEN=$(openssl rand -hex 16) conveyor console --listen 0.0.0.0:8025 \
    --behind-tls-proxy --public-name console.example.com --queue-url $URL

Open the printed address in a browser: it carries the token once (/?token=<token>), which the browser then
keeps in a cookie; scripts send Authorization: Bearer <token>. Without --token a random token is
generated at every start. Off loopback the console must sit behind a proxy that terminates TLS.")]
pub(crate) struct ConsoleArgs {
    /// Address to listen on; anything but loopback needs --behind-tls-proxy.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8025")]
    pub listen: SocketAddr,
    /// The token every request must carry (at least 16 characters); generated when not given.
    #[arg(long, value_name = "TOKEN", env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// A viewer's token (at least 16 characters): it sees queues, jobs and metrics, but no message body,
    /// payload or job output, and takes no action. For a console opened to a team.
    #[arg(long, value_name = "TOKEN", env = VIEWER_TOKEN_ENV, hide_env_values = true)]
    pub viewer_token: Option<String>,
    /// A name the console answers to besides localhost, 127.0.0.1 and [::1] (the TLS proxy's); repeat for more.
    #[arg(long = "public-name", value_name = "NAME")]
    pub public_names: Vec<String>,
    /// A proxy in front terminates TLS: allows listening off loopback; the token's cookie is Secure.
    #[arg(long)]
    pub behind_tls_proxy: bool,
    /// A queue to show (URL or name); repeat for more.
    #[arg(long = "queue-url", value_name = "URL")]
    pub queues: Vec<QueueRef>,
    /// Show every queue whose name starts with PREFIX; repeat for more.
    #[arg(long = "queue-prefix", value_name = "PREFIX")]
    pub prefixes: Vec<String>,
    /// A worker's operations endpoint (its --listen address, e.g. http://127.0.0.1:9090); repeat for more.
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// A job type the send form offers; repeat for more.
    #[arg(long = "job-type", value_name = "TYPE")]
    pub job_types: Vec<String>,
    /// The idempotency table for the job lookup.
    #[arg(long, value_name = "NAME")]
    pub table: Option<String>,
    /// Seconds between live refreshes of a page.
    #[arg(long, value_name = "SECONDS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub refresh_secs: u64,
    /// Seconds between the samples the queues page's charts draw (an hour of them is kept); each costs
    /// what one refresh of the page costs.
    #[arg(long, value_name = "SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub history_secs: u64,
    /// A bucket the dead-letter page follows large-payload pointers into (the workers' payload bucket);
    /// repeat for more. A pointer into any other bucket is shown as a pointer and never read.
    #[arg(long = "payload-bucket", value_name = "BUCKET", env = conveyor_s3::BUCKET_ENV)]
    pub payload_buckets: Vec<String>,
    /// The most bytes of one payload the dead-letter page reads (the read stops there).
    #[arg(long, value_name = "BYTES", default_value_t = conveyor_console::DEFAULT_MAX_PAYLOAD_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=64 * 1024 * 1024))]
    pub max_payload_bytes: u64,
    /// Do not read SQS's fair-queue metrics from CloudWatch: the queues page leaves that view out and
    /// the console needs no cloudwatch:GetMetricData.
    #[arg(long)]
    pub no_fair_queues: bool,
}

/// Runs the console until Ctrl-C.
pub(crate) async fn run(args: &ConsoleArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let config = ConsoleConfig::default()
        .with_listen(args.listen)
        .with_token(args.token.clone())
        .with_viewer_token(args.viewer_token.clone())
        .with_public_names(args.public_names.clone())
        .with_behind_tls_proxy(args.behind_tls_proxy)
        .with_queues(args.queues.clone())
        .with_prefixes(args.prefixes.clone())
        .with_workers(args.workers.clone())
        .with_job_types(args.job_types.clone())
        .with_table(args.table.clone())
        .with_payload_buckets(args.payload_buckets.clone())
        .with_max_payload_bytes(args.max_payload_bytes)
        .with_refresh(Duration::from_secs(args.refresh_secs))
        .with_history_every(Duration::from_secs(args.history_secs));
    let payloads = std::sync::Arc::new(
        conveyor_s3::S3PayloadStore::new(aws.s3_client()).with_max_read(args.max_payload_bytes),
    );
    let mut console = Console::new(config, aws.sqs_client(), aws.dynamodb_client())
        .await?
        .with_payloads(payloads);
    // Queues on an emulator have no metrics in AWS's CloudWatch: it is read when SQS is AWS's, or when
    // an endpoint is set for CloudWatch too (an emulator that speaks its protocol, such as moto).
    let emulated_queues = aws.local_sqs_endpoint().is_some() && aws.cloudwatch_endpoint().is_none();
    if emulated_queues && !args.no_fair_queues {
        crate::errln!(
            "the queues are on an emulator and no CloudWatch endpoint is set: the fair-queue view is off \
             (--endpoint-url or AWS_ENDPOINT_URL_CLOUDWATCH turns it on)"
        );
    } else if !args.no_fair_queues {
        console = console.with_cloudwatch(aws.cloudwatch_client());
    }
    let listener = conveyor_http::bind(&args.listen.to_string()).await?;
    let addr = listener.local_addr().context("reading the console's address")?;
    // A token the operator chose is not echoed into logs; a generated one is the only way in.
    let token = match args.token {
        Some(_) => "<your token>",
        None => console.token(),
    };
    if format == Format::Json {
        // For a script that starts the console: where it listens and the address to open, on stdout.
        print_json_line(&serde_json::json!({
            "listening": format!("http://{addr}/"),
            "open": format!("http://{addr}/?token={token}"),
        }))?;
    } else {
        crate::errln!("console on http://{addr}/ (Ctrl-C stops it); open http://{addr}/?token={token}");
    }
    let stop = CancellationToken::new();
    let serving = tokio::spawn(console.serve(listener, stop.clone()));
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    stop.cancel();
    serving.await.context("the console stopped abnormally")?;
    Ok(())
}
