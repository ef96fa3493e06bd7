#![doc = include_str!("../README.md")]

use aws_config::{BehaviorVersion, SdkConfig};
use tokio::sync::OnceCell;

static SHARED: OnceCell<SdkConfig> = OnceCell::const_new();

/// The process's AWS configuration, loaded the standard way on the first call (concurrent first
/// callers wait for that one load) and shared by every client built after it. Deadlines and retries
/// are not set here: each client sets its own service's.
pub async fn shared_config() -> &'static SdkConfig {
    SHARED.get_or_init(load).await
}

async fn load() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest()).load().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn concurrent_first_callers_share_one_load() {
        let (a, b) = tokio::join!(shared_config(), shared_config());
        assert!(std::ptr::eq(a, b));
        assert!(std::ptr::eq(a, shared_config().await));
    }
}
