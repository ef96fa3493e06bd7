"""AWS's SQS Extended Client Library for Python on one side of Conveyor's large-payload interop test.

    interop.py send QUEUE_URL BUCKET LIST_ID ROWS JOB_TYPE
                                                     sends a contact import ({"list_id", "csv"} with ROWS
                                                     contacts) through the library (always through S3),
                                                     prints {"message_id", "sha256"}
    interop.py receive QUEUE_URL BUCKET              receives one message through the library (waits up to
                                                     20 s per poll, 3 polls), prints what it got, then
                                                     deletes it through the library (which deletes the object)

Endpoints, region and credentials come from the standard variables (AWS_ENDPOINT_URL, AWS_REGION, ...);
boto3 reads them. Output: one JSON line.
"""

import hashlib
import json
import sys

from sqs_extended_client import SQSExtendedClientSession


def client(bucket):
    sqs = SQSExtendedClientSession().client("sqs")
    sqs.large_payload_support = bucket
    sqs.use_legacy_attribute = False
    sqs.delete_payload_from_s3 = True
    return sqs


def send(queue_url, bucket, list_id, rows, job_type):
    sqs = client(bucket)
    sqs.always_through_s3 = True
    csv = "email,name\n" + "".join(f"py{row}@example.com,Python {row}\n" for row in range(rows))
    body = json.dumps({"list_id": list_id, "csv": csv})
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageAttributes={"conveyor.type": {"DataType": "String", "StringValue": job_type}},
    )
    print(json.dumps({"message_id": response["MessageId"], "sha256": hashlib.sha256(body.encode()).hexdigest()}))


def receive(queue_url, bucket):
    sqs = client(bucket)
    for _ in range(3):
        response = sqs.receive_message(
            QueueUrl=queue_url, MessageAttributeNames=["All"], MaxNumberOfMessages=1, WaitTimeSeconds=20
        )
        messages = response.get("Messages", [])
        if not messages:
            continue
        message = messages[0]
        body = message["Body"]
        attributes = {
            name: value.get("StringValue") for name, value in message.get("MessageAttributes", {}).items()
        }
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        print(json.dumps({
            "length": len(body.encode()),
            "sha256": hashlib.sha256(body.encode()).hexdigest(),
            "attributes": attributes,
            "decorated_receipt": "-..s3Key..-" in message["ReceiptHandle"],
        }))
        return
    print(json.dumps({"error": "no message within 60 s"}))
    sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "receive":
        receive(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}; see the docstring")
