//! Waiting for a condition with a deadline: the only way tests here synchronise with time.

use std::time::Duration;

use tokio::time::Instant;

/// Polls `condition` every `poll_interval` until it returns true; fails once `timeout` has passed.
///
/// The condition is an async closure and may borrow (and mutate) the test's state:
/// `wait_until(timeout, interval, async || queue.depth().await.is_ok_and(|d| d.visible == 0)).await?`.
/// Uses tokio's clock, so it runs instantly under `tokio::time::pause()`.
pub async fn wait_until<F>(timeout: Duration, poll_interval: Duration, mut condition: F) -> anyhow::Result<()>
where
    F: AsyncFnMut() -> bool,
{
    let found = wait_for(timeout, poll_interval, async || condition().await.then_some(())).await;
    found.map_err(|_| anyhow::anyhow!("condition not met within {timeout:?}"))
}

/// Polls `probe` every `poll_interval` until it returns `Some`; fails once `timeout` has passed.
pub async fn wait_for<T, F>(timeout: Duration, poll_interval: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: AsyncFnMut() -> Option<T>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        let now = Instant::now();
        if now >= deadline {
            anyhow::bail!("nothing found within {timeout:?}");
        }
        tokio::time::sleep(poll_interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_until_true_and_fails_after_the_timeout() {
        let started = Instant::now();
        let mut polls = 0;
        wait_until(Duration::from_secs(5), Duration::from_millis(100), async || {
            polls += 1;
            polls == 3
        })
        .await
        .unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(200));

        let never = wait_until(Duration::from_secs(1), Duration::from_millis(300), async || false).await;
        assert!(never.unwrap_err().to_string().contains("within 1s"));
    }
}
