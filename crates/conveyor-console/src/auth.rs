//! The checks every request passes before a page sees it, in order, each on the request's head alone
//! (they run before its body is read: `conveyor_http::serve_gated`).
//!
//! 1. [`closed_to_other_sites`]: what no page on another site can pass.
//!    - DNS rebinding: a request must be addressed (`Host`) to `localhost`, `127.0.0.1` or `[::1]`
//!      (any port: an SSH tunnel may change it) or to a name given with `--public-name`. A page that
//!      rebinds its own name to the console's address sends its own name as `Host`, so it reads
//!      nothing (not even the CSRF value) and changes nothing: 421.
//!    - Cross-site POSTs: a POST whose `Sec-Fetch-Site` says it came from another site (or, from a
//!      browser that does not send it, whose `Origin` names another host than `Host`) is refused
//!      before anything happens, and so is one with `Origin: null` (a sandboxed frame, a `data:` page,
//!      a redirect across sites: the console's own pages, served with `Referrer-Policy: same-origin`,
//!      send their real origin). Clients that send neither header, such as curl, are judged by the
//!      token and CSRF alone.
//! 2. [`require_token`]: the token, always (generated at start when none is given, and printed as
//!    a URL, as Jupyter does): `Authorization: Bearer <token>`, or the `HttpOnly`, `SameSite=Strict`
//!    cookie the console sets when a page is opened once with `?token=<token>` (it then redirects to
//!    the same page without it, so the token does not stay in the address bar or the history). Behind
//!    a TLS proxy the cookie is `__Host-` prefixed and `Secure`.
//!
//! After them, every state-changing form carries the per-process CSRF value
//! ([`refuse_without_csrf`]); a POST without it is refused with 403 before anything happens.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use conveyor_http::ClientAddr;
use cookie::{Cookie, SameSite};
use subtle::ConstantTimeEq as _;
use tracing::Instrument;

use crate::fields::Fields;
use crate::html::problem;
use crate::state::AppState;

/// The cookie holding the token, on plain HTTP (loopback).
const COOKIE: &str = "conveyor_console_token";
/// The cookie holding the token behind a TLS proxy: the browser keeps a `__Host-` cookie only when it
/// is `Secure`, has `Path=/` and no `Domain`, so no other host can set or shadow it.
const SECURE_COOKIE: &str = "__Host-conveyor_console_token";

/// Equal in time independent of where the first difference is (`subtle`'s comparison).
fn same(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Every value of the cookies named `name` (parsed by the `cookie` crate): all of them, not the first,
/// so a cookie of the same name that another page on this host set (shadowing ours) does not lock the
/// operator out.
fn cookies(request: &Request, name: &str) -> Vec<String> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .filter(|cookie| cookie.name() == name)
        .map(|cookie| cookie.value().to_owned())
        .collect()
}

/// `?token=...` on a GET (percent-decoded by `form_urlencoded`), and the query without it, its other
/// pairs as they were written.
fn query_token(request: &Request) -> Option<(String, String)> {
    let query = request.uri().query()?;
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match form_urlencoded::parse(pair.as_bytes()).next() {
            Some((name, value)) if name == "token" => token = Some(value.into_owned()),
            _ => rest.push(pair),
        }
    }
    Some((token?, rest.join("&")))
}

/// The host a request is addressed to, without its port: `Host`, lower-cased.
fn host(request: &Request) -> Option<String> {
    let value = request.headers().get(header::HOST)?.to_str().ok()?;
    Some(host_without_port(value).to_ascii_lowercase())
}

/// `example.com:8025` → `example.com`, `[::1]:8025` → `[::1]`.
fn host_without_port(value: &str) -> &str {
    if value.starts_with('[') {
        return value.split_inclusive(']').next().unwrap_or(value);
    }
    value.split(':').next().unwrap_or(value)
}

/// A name that only ever means this machine.
fn loopback_name(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// A name this console answers to: a loopback name or one of `public_names` (any port).
fn known_host(host: &str, public_names: &[String]) -> bool {
    loopback_name(host) || public_names.iter().any(|name| name.eq_ignore_ascii_case(host))
}

/// Why a POST looks cross-site, if it does (see the module's notes).
fn cross_site(request: &Request) -> Option<&'static str> {
    let headers = request.headers();
    if headers
        .get(header::ORIGIN)
        .is_some_and(|origin| origin.as_bytes().eq_ignore_ascii_case(b"null"))
    {
        return Some("its Origin is null, which the console's own pages never send");
    }
    let fetch_site = headers
        .get("sec-fetch-site")
        .and_then(|value| value.to_str().ok());
    if let Some(site) = fetch_site {
        // The browser's own word, when it gives it, decides.
        return (!matches!(site, "same-origin" | "none"))
            .then_some("the browser says it came from another site (Sec-Fetch-Site)");
    }
    // The console's own pages are served with `Referrer-Policy: same-origin`, so their forms send
    // their real origin: `Origin: null` comes from a sandboxed frame, a `data:` page or a redirect
    // across sites, never from them.
    let origin = headers.get(header::ORIGIN)?;
    let Some((_, origin_host)) = origin.to_str().ok().and_then(|origin| origin.split_once("://")) else {
        return Some("its Origin is null or unreadable, which the console's own pages never send");
    };
    let addressed = headers.get(header::HOST).and_then(|value| value.to_str().ok());
    match addressed {
        Some(addressed) if origin_host.eq_ignore_ascii_case(addressed) => None,
        _ => Some("its Origin is not this console"),
    }
}

/// Runs the request in a span naming the client's address, method and path, at `warn` so that the
/// CLI's default filter keeps it: every action's log line (a purge, a redrive, a refusal) then says
/// who asked for it.
pub(crate) async fn audit(request: Request, next: Next) -> Response {
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map_or_else(|| "unknown".to_owned(), |ClientAddr(addr)| addr.to_string());
    let span = tracing::warn_span!(
        "console",
        %client,
        role = tracing::field::Empty,
        method = %request.method(),
        path = %request.uri().path()
    );
    next.run(request).instrument(span).await
}

/// Refuses a request addressed to a name this console does not answer to, and a POST from another
/// site (see the module's notes).
pub(crate) async fn closed_to_other_sites(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let addressed = host(&request).unwrap_or_default();
    if !known_host(&addressed, &state.config.public_names) {
        tracing::warn!(host = %addressed, "console: a request addressed to another name was refused (DNS rebinding?)");
        return problem(
            StatusCode::MISDIRECTED_REQUEST,
            "Unknown host",
            "This console answers only requests addressed to localhost, 127.0.0.1, [::1] or a name given \
             with --public-name. Open it as http://127.0.0.1:<port>/, or start it with --public-name \
             <the name in the address bar> to reach it by that name.",
        );
    }
    if request.method() == Method::POST
        && let Some(why) = cross_site(&request)
    {
        tracing::warn!(why, "console: a cross-site POST was refused");
        return problem(
            StatusCode::FORBIDDEN,
            "Cross-site request refused",
            &format!("Nothing was done: {why}. Submit the form from the console's own page."),
        );
    }
    next.run(request).await
}

/// Who a request's token says it is: the operator (everything) or a viewer (queues, jobs and
/// metrics: no message body, no payload, no job output, no action).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The `--token`: every page and action.
    Operator,
    /// The `--viewer-token`: reads without bodies, never acts.
    Viewer,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Viewer => "viewer",
        }
    }
}

/// The role `given` is the token of, comparing it with both tokens every time.
fn role_of(state: &AppState, given: &str) -> Option<Role> {
    let operator = same(given, &state.token);
    let viewer = state
        .config
        .viewer_token
        .as_deref()
        .is_some_and(|token| same(given, token));
    match (operator, viewer) {
        (true, _) => Some(Role::Operator),
        (false, true) => Some(Role::Viewer),
        (false, false) => None,
    }
}

/// The query names that ask for a message body, a payload or a job's output.
const BODY_READS: [&str; 3] = ["show", "fetch", "show_output"];

/// What a viewer may do: GET (or HEAD) a page that shows no body ([`BODY_READS`]).
fn viewer_may(request: &Request) -> bool {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return false;
    }
    let query = request.uri().query().unwrap_or_default();
    !form_urlencoded::parse(query.as_bytes()).any(|(name, _)| BODY_READS.contains(&name.as_ref()))
}

/// Refuses every request without a token; a GET with `?token=` sets the cookie and redirects to
/// the same address without it. A viewer's token is refused every action and every body read
/// ([`viewer_may`]); the role is recorded on the request's audit span.
pub(crate) async fn require_token(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let secure = state.config.behind_tls_proxy;
    let cookie_name = if secure { SECURE_COOKIE } else { COOKIE };
    let presented = bearer(&request)
        .and_then(|given| role_of(&state, given))
        .or_else(|| {
            let roles: Vec<Role> = cookies(&request, cookie_name)
                .iter()
                .filter_map(|given| role_of(&state, given))
                .collect();
            roles
                .iter()
                .find(|role| **role == Role::Operator)
                .or(roles.first())
                .copied()
        });
    if let Some(role) = presented {
        tracing::Span::current().record("role", role.name());
        if role == Role::Viewer && !viewer_may(&request) {
            tracing::warn!(
                role = role.name(),
                "console: a viewer's action or body read was refused"
            );
            return problem(
                StatusCode::FORBIDDEN,
                "Read-only",
                "This token is a viewer's: it shows queues, jobs and metrics, but no message body, payload \
                 or job output, and it takes no action. Nothing was done; ask for the operator's token.",
            );
        }
        return next.run(request).await;
    }
    if request.method() == Method::GET
        && let Some((given, rest)) = query_token(&request)
        && role_of(&state, &given).is_some()
    {
        let path = request.uri().path();
        let target = if rest.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{rest}")
        };
        let mut response = Redirect::to(&target).into_response();
        let cookie = Cookie::build((cookie_name, given))
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(secure)
            .path("/")
            .build();
        if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
        return response;
    }
    tracing::warn!("console: a request without a valid token was refused");
    problem(
        StatusCode::UNAUTHORIZED,
        "Token needed",
        "This console needs its token. Open the address the console printed when it started \
         (/?token=<token>: the browser then keeps the token in a cookie), or send the header \
         Authorization: Bearer <token>. The token is the --token value (or CONVEYOR_CONSOLE_TOKEN) the \
         console was started with, or the one it generated and printed.",
    )
}

/// Checks a POSTed form's CSRF value: `None` when it is right, else the 403 page to answer with.
pub(crate) fn refuse_without_csrf(state: &AppState, fields: &Fields) -> Option<Response> {
    if fields.get("csrf").is_some_and(|given| same(given, &state.csrf)) {
        return None;
    }
    tracing::warn!("console: a form without a valid CSRF value was refused");
    Some(problem(
        StatusCode::FORBIDDEN,
        "Refused",
        "This form did not carry the console's CSRF value, so nothing was done. Reload the page and \
         submit it again from the console itself.",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        assert!(same("0123456789abcdef", "0123456789abcdef"));
        assert!(!same("0123456789abcdeX", "0123456789abcdef"));
        assert!(!same("0123", "0123456789abcdef"));
    }

    #[test]
    fn hosts_and_origins() {
        assert_eq!(host_without_port("127.0.0.1:8025"), "127.0.0.1");
        assert_eq!(host_without_port("[::1]:8025"), "[::1]");
        assert_eq!(host_without_port("localhost"), "localhost");
        assert!(loopback_name("localhost") && loopback_name("[::1]"));
        assert!(!loopback_name("localhost.evil.example") && !loopback_name("127.0.0.1.nip.io"));
        let public = ["console.example.com".to_owned()];
        assert!(known_host("console.example.com", &public) && known_host("[::1]", &public));
        assert!(!known_host("evil.example", &public) && !known_host("console.example.com", &[]));
        let post = |headers: &[(&str, &str)]| {
            let mut request = Request::builder().method(Method::POST).uri("/send");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            request.body(axum::body::Body::empty()).unwrap_or_default()
        };
        let local = ("host", "127.0.0.1:8025");
        assert_eq!(cross_site(&post(&[local])), None, "curl sends neither");
        assert_eq!(
            cross_site(&post(&[local, ("origin", "http://127.0.0.1:8025")])),
            None
        );
        assert!(cross_site(&post(&[local, ("origin", "http://evil.example")])).is_some());
        assert!(
            cross_site(&post(&[local, ("origin", "null")])).is_some(),
            "a sandboxed or data: page"
        );
        assert!(
            cross_site(&post(&[
                local,
                ("origin", "null"),
                ("sec-fetch-site", "same-origin")
            ]))
            .is_some(),
            "null whatever Sec-Fetch-Site says"
        );
        assert!(
            cross_site(&post(&[
                local,
                ("origin", "null"),
                ("sec-fetch-site", "cross-site")
            ]))
            .is_some()
        );
        assert!(cross_site(&post(&[local, ("sec-fetch-site", "cross-site")])).is_some());
        assert!(cross_site(&post(&[local, ("sec-fetch-site", "same-site")])).is_some());
        assert_eq!(
            cross_site(&post(&[local, ("sec-fetch-site", "same-origin")])),
            None
        );
    }

    #[test]
    fn the_query_token_is_percent_decoded_and_every_cookie_of_the_name_counts() {
        let request = Request::builder()
            .uri("/?token=ab%2Bcd+ef&queue=q%2F1")
            .body(axum::body::Body::empty())
            .unwrap_or_default();
        assert_eq!(
            query_token(&request),
            Some(("ab+cd ef".to_owned(), "queue=q%2F1".to_owned()))
        );
        let request = Request::builder()
            .header("cookie", "conveyor_console_token=shadow; other=1")
            .header("cookie", "conveyor_console_token=mine")
            .body(axum::body::Body::empty())
            .unwrap_or_default();
        assert_eq!(
            cookies(&request, COOKIE),
            vec!["shadow".to_owned(), "mine".to_owned()]
        );
    }

    #[test]
    fn the_query_token_is_taken_out_of_the_address() {
        let request = Request::builder()
            .uri("/dlq?queue=q&token=secret&max=5")
            .body(axum::body::Body::empty())
            .unwrap_or_default();
        assert_eq!(
            query_token(&request),
            Some(("secret".to_owned(), "queue=q&max=5".to_owned()))
        );
    }
}
