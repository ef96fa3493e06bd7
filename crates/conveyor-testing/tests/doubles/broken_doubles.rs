//! The suites must catch broken backends: a queue that never redelivers expired messages (the bug
//! quickwit's test queue had, unnoticed), a store whose claim ignores the existing record, and a store
//! whose fencing tokens do not increase.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::port::next_token;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{
        Claim, ClaimOutcome, ClaimRequest, DeadLetter, EntryFailure, IdempotencyRecord, IdempotencyStore,
        OutgoingMessage, Queue, QueueDepth, QueueError, StoreError, VisibilityChange,
    },
    runtime::Failure,
};
use conveyor_testing::queue_conformance::{self, MemoryQueueFactory, QueueFactory, QueueUnderTest};
use conveyor_testing::{MemoryIdempotencyStore, QueueSpec, store_conformance};

/// Delivers each message once: after its visibility timeout it stays in flight forever.
struct NeverRedelivers(Arc<dyn Queue>);

#[async_trait]
impl Queue for NeverRedelivers {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn visibility_timeout(&self) -> Duration {
        self.0.visibility_timeout()
    }

    fn max_receive_count(&self) -> Option<u32> {
        self.0.max_receive_count()
    }

    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        let mut messages = self
            .0
            .receive_with_visibility(max_messages, wait, visibility)
            .await?;
        messages.retain(|message| message.receive_count == 1);
        Ok(messages)
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        self.0.delete_batch(receipts).await
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        self.0.change_visibility_batch(changes).await
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        self.0.send(message).await
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        self.0.dead_letter(message, failure).await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.0.depth().await
    }
}

struct BrokenQueueFactory;

#[async_trait]
impl QueueFactory for BrokenQueueFactory {
    async fn create(&self, spec: &QueueSpec) -> anyhow::Result<QueueUnderTest> {
        let under = MemoryQueueFactory.create(spec).await?;
        Ok(QueueUnderTest {
            queue: Arc::new(NeverRedelivers(under.queue)),
            ..under
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_queue_that_never_redelivers_fails_the_queue_suite() {
    let failures = queue_conformance::run_all(&BrokenQueueFactory).await.unwrap_err();
    for case in [
        "received_message_is_invisible_then_redelivered",
        "change_visibility_zero_makes_visible_at_once",
        "redrive_moves_to_dlq_after_max_receive_count",
        "batch_operations_of_23_entries",
    ] {
        assert!(
            failures.failed(case),
            "{case} did not catch the broken queue: {failures}"
        );
    }
    // The cases that never need a redelivery still pass: the failures point at the bug.
    for case in [
        "receive_returns_at_most_max",
        "attribute_round_trip",
        "delete_removes_for_good",
    ] {
        assert!(!failures.failed(case), "{case} failed on what works: {failures}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_redelivery_case_fails_alone_on_the_broken_queue_and_passes_on_the_real_one() {
    let broken = queue_conformance::received_message_is_invisible_then_redelivered(&BrokenQueueFactory).await;
    let failure = broken.unwrap_err();
    assert_eq!(failure.case, "received_message_is_invisible_then_redelivered");
    assert!(failure.message.contains("not received"), "{failure}");
    queue_conformance::received_message_is_invisible_then_redelivered(&conveyor_testing::MemoryQueueFactory)
        .await
        .unwrap();
}

/// Claims unconditionally: the write a store makes when it forgets the condition.
struct AlwaysAcquires(MemoryIdempotencyStore);

#[async_trait]
impl IdempotencyStore for AlwaysAcquires {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if let ClaimOutcome::Acquired(claim) = self.0.claim(request).await? {
            return Ok(ClaimOutcome::Acquired(claim));
        }
        let previous = self.0.get(&request.key).await?.and_then(|record| record.token);
        let token = next_token(previous, SystemTime::now());
        self.0.insert(IdempotencyRecord::in_progress(request, token));
        Ok(ClaimOutcome::Acquired(Claim {
            key: request.key.clone(),
            token,
            run: 1,
        }))
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.0.complete(claim, output, expires_at).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.0.release(claim).await
    }

    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError> {
        self.0.extend_lease(claim, lease_until).await
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.0.get(key).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_always_acquires_fails_the_store_suite() {
    let store = Arc::new(AlwaysAcquires(MemoryIdempotencyStore::new()));
    let failures = store_conformance::run_all(store.clone()).await.unwrap_err();
    for case in [
        "claim_race_exactly_one_wins",
        "live_claim_blocks_a_second_claim",
        "completed_is_a_duplicate_with_its_output",
        "extend_lease_moves_the_lease",
    ] {
        assert!(
            failures.failed(case),
            "{case} did not catch the broken store: {failures}"
        );
    }
    // Fencing still works in this store, and the suite says so.
    assert!(
        !failures.failed("settling_is_fenced_after_takeover"),
        "{failures}"
    );
    let race = store_conformance::claim_race_exactly_one_wins(store)
        .await
        .unwrap_err();
    assert!(race.message.contains("20 of 20"), "{race}");
}

/// Gives every claim the same token: conditions right, fencing token meaningless.
struct ConstantToken(MemoryIdempotencyStore);

#[async_trait]
impl IdempotencyStore for ConstantToken {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.0.claim(request).await?;
        let ClaimOutcome::Acquired(_) = outcome else {
            return Ok(outcome);
        };
        self.0.insert(IdempotencyRecord::in_progress(request, 1));
        Ok(ClaimOutcome::Acquired(Claim {
            key: request.key.clone(),
            token: 1,
            run: 1,
        }))
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.0.complete(claim, output, expires_at).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.0.release(claim).await
    }

    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError> {
        self.0.extend_lease(claim, lease_until).await
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.0.get(key).await
    }
}

#[tokio::test]
async fn a_store_whose_tokens_do_not_increase_fails_the_fencing_cases() {
    let store = ConstantToken(MemoryIdempotencyStore::new());
    let failure = store_conformance::fencing_token_increases_with_every_claim(&store)
        .await
        .unwrap_err();
    assert!(failure.message.contains("did not increase"), "{failure}");
    assert!(
        store_conformance::settling_is_fenced_after_takeover(&store)
            .await
            .is_err()
    );
    store_conformance::fencing_token_increases_with_every_claim(&MemoryIdempotencyStore::new())
        .await
        .unwrap();
}
