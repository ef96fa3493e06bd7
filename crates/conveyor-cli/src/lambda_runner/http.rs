//! Just enough HTTP/1.1 for the Lambda Runtime API: small requests, `Content-Length` or chunked
//! bodies, persistent connections (`lambda_runtime`'s hyper client keeps one open), no TLS, no
//! pipelining tricks. Responses always carry `Content-Length`.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The longest request line plus headers accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The largest body accepted: Lambda's 6 MB synchronous response limit.
pub const MAX_BODY_BYTES: usize = 6 * 1024 * 1024;
/// A body over [`MAX_BODY_BYTES`] but under this is read and dropped, so the connection stays usable
/// and the route can answer 413 (a function's oversized response is a function error, as on Lambda);
/// a larger one closes the connection.
pub const MAX_DISCARDED_BYTES: usize = 64 * 1024 * 1024;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target, e.g. `/2018-06-01/runtime/invocation/next`.
    pub path: String,
    /// Header names (lowercased) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked); empty when it was over [`MAX_BODY_BYTES`] (see `oversized`).
    pub body: Vec<u8>,
    /// The size of a body over [`MAX_BODY_BYTES`], which was read and dropped.
    pub oversized: Option<usize>,
    /// True when the client asked to close the connection after this request (or speaks HTTP/1.0).
    pub close: bool,
}

impl Request {
    /// A header's value by (lowercase) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The connection failed or closed mid-request.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// Not HTTP/1.x as this server speaks it.
    #[error("bad request: {0}")]
    Malformed(String),
    /// The head or the body is over the limit.
    #[error("request too large: {0}")]
    TooLarge(String),
}

impl HttpError {
    /// The status to answer with, when the connection can still take one.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Io(_) => None,
            HttpError::Malformed(_) => Some(400),
            HttpError::TooLarge(_) => Some(413),
        }
    }
}

/// Reads one request; `Ok(None)` when the client closed the connection between requests.
pub async fn read_request<R: AsyncBufRead + Unpin>(reader: &mut R) -> Result<Option<Request>, HttpError> {
    let mut head_bytes = 0usize;
    let mut line = String::new();
    // Tolerate empty lines before a request (RFC 9112 2.2).
    loop {
        line.clear();
        let read = read_line(reader, &mut line, &mut head_bytes).await?;
        if read == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(HttpError::Malformed(format!(
            "request line {:?}",
            line.trim_end()
        )));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed(format!("unsupported version {version}")));
    }
    let (method, path, http10) = (method.to_owned(), path.to_owned(), version == "HTTP/1.0");

    let mut headers = Vec::new();
    loop {
        line.clear();
        if read_line(reader, &mut line, &mut head_bytes).await? == 0 {
            return Err(HttpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let trimmed = line.trim_end_matches(['\r', '\n']);
        if trimmed.is_empty() {
            break;
        }
        let Some((name, value)) = trimmed.split_once(':') else {
            return Err(HttpError::Malformed(format!("header line {trimmed:?}")));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }

    let find = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_ascii_lowercase())
    };
    let connection = find("connection").unwrap_or_default();
    let close = connection.contains("close") || (http10 && !connection.contains("keep-alive"));
    let chunked = find("transfer-encoding").is_some_and(|encoding| encoding.contains("chunked"));
    let mut oversized = None;
    let body = if chunked {
        let (body, length) = read_chunked(reader).await?;
        if length > MAX_BODY_BYTES {
            oversized = Some(length);
        }
        body
    } else {
        let length = match find("content-length") {
            None => 0,
            Some(text) => text
                .trim()
                .parse::<usize>()
                .map_err(|_| HttpError::Malformed(format!("content-length {text:?}")))?,
        };
        if length > MAX_DISCARDED_BYTES {
            return Err(HttpError::TooLarge(format!("{length} bytes")));
        }
        if length > MAX_BODY_BYTES {
            discard(reader, length).await?;
            oversized = Some(length);
            Vec::new()
        } else {
            let mut body = vec![0; length];
            reader.read_exact(&mut body).await?;
            body
        }
    };
    Ok(Some(Request {
        method,
        path,
        headers,
        body,
        oversized,
        close,
    }))
}

async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut String,
    head_bytes: &mut usize,
) -> Result<usize, HttpError> {
    let limit = (MAX_HEAD_BYTES - *head_bytes) as u64 + 1;
    let read = (&mut *reader).take(limit).read_line(line).await?;
    *head_bytes += read;
    if *head_bytes > MAX_HEAD_BYTES {
        return Err(HttpError::TooLarge(format!("head over {MAX_HEAD_BYTES} bytes")));
    }
    Ok(read)
}

/// Reads and drops `length` bytes.
async fn discard<R: AsyncBufRead + Unpin>(reader: &mut R, length: usize) -> Result<(), HttpError> {
    let copied = tokio::io::copy(&mut (&mut *reader).take(length as u64), &mut tokio::io::sink()).await?;
    if copied < length as u64 {
        return Err(HttpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(())
}

/// The de-chunked body (empty once it went over [`MAX_BODY_BYTES`]) and its whole length.
async fn read_chunked<R: AsyncBufRead + Unpin>(reader: &mut R) -> Result<(Vec<u8>, usize), HttpError> {
    let mut body = Vec::new();
    let mut length = 0usize;
    let mut line = String::new();
    let mut head_bytes: usize;
    loop {
        line.clear();
        head_bytes = 0;
        if read_line(reader, &mut line, &mut head_bytes).await? == 0 {
            return Err(HttpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let size_text = line.trim().split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| HttpError::Malformed(format!("chunk size {size_text:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                line.clear();
                if read_line(reader, &mut line, &mut head_bytes).await? == 0 || line.trim().is_empty() {
                    return Ok((body, length));
                }
            }
        }
        length = length.saturating_add(size);
        if length > MAX_DISCARDED_BYTES {
            return Err(HttpError::TooLarge(format!(
                "chunked body over {MAX_DISCARDED_BYTES} bytes"
            )));
        }
        if length > MAX_BODY_BYTES {
            body = Vec::new();
            discard(reader, size).await?;
        } else {
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..]).await?;
        }
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf).await?;
        if &crlf != b"\r\n" {
            return Err(HttpError::Malformed("chunk not followed by CRLF".to_owned()));
        }
    }
}

/// Writes a response with `Content-Length`; `close` adds `Connection: close`.
pub async fn write_response<W: AsyncWrite + Unpin>(
    writer: &mut W,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    close: bool,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    writer.write_all(&bytes).await?;
    writer.flush().await
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::BufReader;

    use super::*;

    async fn parse_all(raw: &[u8]) -> Vec<Result<Option<Request>, String>> {
        let mut reader = BufReader::new(raw);
        let mut out = Vec::new();
        loop {
            let result = read_request(&mut reader).await.map_err(|error| error.to_string());
            let stop = !matches!(result, Ok(Some(_)));
            out.push(result);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn persistent_connections_carry_several_requests() {
        let raw = b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n\
POST /2018-06-01/runtime/invocation/abc/response HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
POST /x HTTP/1.1\r\ncontent-length: 2\r\nConnection: close\r\n\r\n{}";
        let requests = parse_all(raw).await;
        assert_eq!(requests.len(), 4, "three requests then end of stream");
        let first = requests[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(first.method, "GET");
        assert_eq!(first.path, "/2018-06-01/runtime/invocation/next");
        assert_eq!(first.header("user-agent"), Some("t"));
        assert!(first.body.is_empty() && !first.close);
        let second = requests[1].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(second.body, b"hello");
        let third = requests[2].as_ref().unwrap().as_ref().unwrap();
        assert!(third.close);
        assert!(matches!(requests[3], Ok(None)));
    }

    #[tokio::test]
    async fn chunked_bodies_are_decoded() {
        let raw = b"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n";
        let requests = parse_all(raw).await;
        let request = requests[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(request.body, b"hello world");
    }

    #[tokio::test]
    async fn malformed_and_oversized_requests_are_refused() {
        let bad = parse_all(b"NONSENSE\r\n\r\n").await;
        assert!(bad[0].as_ref().unwrap_err().contains("bad request"));
        let huge = format!(
            "POST /r HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_DISCARDED_BYTES + 1
        );
        let huge = parse_all(huge.as_bytes()).await;
        assert!(huge[0].as_ref().unwrap_err().contains("too large"));
        let truncated = parse_all(b"POST /r HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc").await;
        assert!(truncated[0].as_ref().unwrap_err().contains("connection error"));
        let http2 = parse_all(b"PRI * HTTP/2.0\r\n\r\n").await;
        assert!(http2[0].is_err());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_dropped_and_the_connection_goes_on() {
        let mut raw = format!(
            "POST /big HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        )
        .into_bytes();
        raw.resize(raw.len() + MAX_BODY_BYTES + 1, b'x');
        raw.extend_from_slice(b"POST /chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        let chunk = MAX_BODY_BYTES / 2 + 1;
        for _ in 0..2 {
            raw.extend_from_slice(format!("{chunk:x}\r\n").as_bytes());
            raw.resize(raw.len() + chunk, b'y');
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"0\r\n\r\nGET /next HTTP/1.1\r\n\r\n");
        let requests = parse_all(&raw).await;
        assert_eq!(requests.len(), 4, "three requests then end of stream");
        let big = requests[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!((big.oversized, big.body.len()), (Some(MAX_BODY_BYTES + 1), 0));
        let chunked = requests[1].as_ref().unwrap().as_ref().unwrap();
        assert_eq!((chunked.oversized, chunked.body.len()), (Some(2 * chunk), 0));
        let next = requests[2].as_ref().unwrap().as_ref().unwrap();
        assert_eq!((next.path.as_str(), next.oversized), ("/next", None));
    }

    #[tokio::test]
    async fn responses_carry_their_length() {
        let mut out = Vec::new();
        write_response(&mut out, 202, &[("X-A", "b".to_owned())], b"{}", false)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 202 Accepted\r\nX-A: b\r\nContent-Length: 2\r\n\r\n{}"
        );
    }
}
