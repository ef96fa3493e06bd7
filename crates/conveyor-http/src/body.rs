//! Reading a request body under a deadline and a size limit before the route sees it.
//!
//! Every body our servers take is small (a form, a JSON document, a Lambda response of at most 6 MB), so
//! the middleware reads it whole: the deadline then covers the *whole* body, which a per-read timeout
//! would not (a client sending one byte every few seconds would never trip it).

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::Limits;

/// Set on a request whose body was over [`Limits::max_body`] and was read and dropped (see
/// [`Limits::drain_oversized`]): the body the route sees is empty, this holds its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OversizedBody(pub usize);

enum Read {
    Whole(Bytes),
    Drained(usize),
    TooLarge(usize),
}

pub(crate) async fn bound_body(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let read = match announced {
        // Refused before reading a byte of it.
        Some(length) if length > limits.max_body.max(limits.drain_oversized) => {
            Ok(Ok(Read::TooLarge(length)))
        }
        _ => tokio::time::timeout(limits.body_timeout, read_bounded(body, &limits)).await,
    };
    let read = match read {
        Ok(Ok(read)) => read,
        Ok(Err(error)) => {
            tracing::debug!(%error, "http: request body failed");
            return (
                StatusCode::BAD_REQUEST,
                "bad request: the body could not be read\n",
            )
                .into_response();
        }
        Err(_) => {
            let message = format!(
                "request timeout: the body did not arrive within {:?}\n",
                limits.body_timeout
            );
            let mut response = (StatusCode::REQUEST_TIMEOUT, message).into_response();
            close(&mut response);
            return response;
        }
    };
    let body = match read {
        Read::Whole(bytes) => Body::from(bytes),
        Read::Drained(length) => {
            parts.extensions.insert(OversizedBody(length));
            Body::empty()
        }
        Read::TooLarge(length) => {
            let message = format!(
                "payload too large: {length} bytes or more, the limit is {} bytes\n",
                limits.max_body
            );
            let mut response = (StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
            close(&mut response);
            return response;
        }
    };
    next.run(Request::from_parts(parts, body)).await
}

/// The rest of the request is not read: the connection cannot carry another one.
fn close(response: &mut Response) {
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
}

async fn read_bounded(mut body: Body, limits: &Limits) -> Result<Read, axum::Error> {
    let mut kept: Vec<u8> = Vec::new();
    let mut length = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers
        };
        length = length.saturating_add(data.len());
        if length > limits.max_body.max(limits.drain_oversized) {
            return Ok(Read::TooLarge(length));
        }
        if length <= limits.max_body {
            kept.extend_from_slice(&data);
        } else {
            kept = Vec::new();
        }
    }
    if length > limits.max_body {
        return Ok(Read::Drained(length));
    }
    Ok(Read::Whole(Bytes::from(kept)))
}
