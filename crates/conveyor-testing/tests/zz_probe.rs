use std::time::Duration;
use conveyor_testing::localstack::*;

async fn recv(c: &aws_sdk_sqs::Client, url: &str) -> Option<(String, String)> {
    let out = c.receive_message().queue_url(url).max_number_of_messages(1).wait_time_seconds(5)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
        .send().await.unwrap();
    let m = out.messages.unwrap_or_default().into_iter().next()?;
    let count = m.attributes.as_ref().and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount).cloned()).unwrap_or_default();
    Some((m.receipt_handle.unwrap(), count))
}

async fn probe(fifo: bool) {
    let c = sqs_client().await;
    let q = create_queue(&c, &QueueSpec { name_prefix: "probe".into(), fifo, visibility_timeout_secs: 1, max_receive_count: None }).await.unwrap();
    let mut send = c.send_message().queue_url(&q.url).message_body("x");
    if fifo { send = send.message_group_id("g"); }
    send.send().await.unwrap();
    let (r1, n1) = recv(&c, &q.url).await.unwrap();
    let (r2, n2) = loop { if let Some(x) = recv(&c, &q.url).await { break x } };
    println!("fifo={fifo} counts {n1} {n2}");
    let cv = c.change_message_visibility().queue_url(&q.url).receipt_handle(&r1).visibility_timeout(10).send().await;
    println!("fifo={fifo} change_visibility stale: {:?}", cv.as_ref().map(|_| ()).map_err(|e| format!("{:?}", e.as_service_error())));
    let cvb = c.change_message_visibility_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder().id("0").receipt_handle(&r1).visibility_timeout(10).build().unwrap()).send().await;
    println!("fifo={fifo} change_visibility_batch stale: {:?}", cvb.map(|o| o.failed));
    let d = c.delete_message_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder().id("0").receipt_handle(&r1).build().unwrap()).send().await;
    println!("fifo={fifo} delete_batch stale: {:?}", d.map(|o| o.failed));
    let cv2 = c.change_message_visibility().queue_url(&q.url).receipt_handle(&r2).visibility_timeout(0).send().await;
    println!("fifo={fifo} change_visibility latest after stale delete: {:?}", cv2.map(|_| ()).map_err(|e| format!("{:?}", e.as_service_error())));
    let (r3, n3) = loop { if let Some(x) = recv(&c, &q.url).await { break x } };
    println!("fifo={fifo} count {n3}");
    // let visibility of r3 expire without re-receive, then delete with r3
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let d3 = c.delete_message_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder().id("0").receipt_handle(&r3).build().unwrap()).send().await;
    println!("fifo={fifo} delete expired latest: {:?}", d3.map(|o| o.failed));
    let attrs = c.get_queue_attributes().queue_url(&q.url).attribute_names(aws_sdk_sqs::types::QueueAttributeName::All).send().await.unwrap();
    println!("fifo={fifo} attrs after: {:?}", attrs.attributes.map(|a| (a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages).cloned(), a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible).cloned())));
    let (r4, _) = loop { if let Some(x) = recv(&c, &q.url).await { break x } };
    let d4 = c.delete_message_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder().id("0").receipt_handle(&r4).build().unwrap()).send().await;
    println!("fifo={fifo} delete latest: {:?}", d4.map(|o| o.failed));
    let d5 = c.delete_message_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder().id("0").receipt_handle(&r4).build().unwrap()).send().await;
    println!("fifo={fifo} delete again: {:?}", d5.map(|o| o.failed));
    let d6 = c.delete_message_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder().id("0").receipt_handle("garbage").build().unwrap()).send().await;
    println!("fifo={fifo} delete garbage: {:?}", d6.map(|o| o.failed));
    let cv7 = c.change_message_visibility_batch().queue_url(&q.url).entries(aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder().id("0").receipt_handle(&r4).visibility_timeout(10).build().unwrap()).send().await;
    println!("fifo={fifo} change vis deleted: {:?}", cv7.map(|o| o.failed));
}

#[tokio::test]
async fn probe_all() {
    ensure_local_aws().await.unwrap();
    probe(false).await;
    probe(true).await;
}
