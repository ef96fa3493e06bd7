//! The token every request must carry, and the CSRF value every state-changing form must carry.
//!
//! Token: `Authorization: Bearer <token>`, or the `HttpOnly`, `SameSite=Strict` cookie the console sets
//! when a page is opened once with `?token=<token>` (it then redirects to the same page without it, so
//! the token does not stay in the address bar or the history). Without a configured token (loopback
//! only, see [`ConsoleConfig::check`](crate::ConsoleConfig::check)) every request passes.
//!
//! CSRF: a random value per process, in a hidden field of every form; a POST without it is refused
//! with 403 before anything happens. Together with `SameSite=Strict` and `form-action 'self'`, another
//! site cannot make a logged-in browser redrive, delete or purge.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use crate::fields::Fields;
use crate::html::problem;
use crate::state::AppState;

/// The cookie holding the token.
const COOKIE: &str = "conveyor_console_token";

/// Equal in time independent of where the first difference is.
fn same(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    if given.len() != expected.len() {
        return false;
    }
    given
        .iter()
        .zip(expected)
        .fold(0u8, |diff, (a, b)| diff | (a ^ b))
        == 0
}

fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn cookie(request: &Request) -> Option<&str> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// `?token=...` on a GET, and the query without it.
fn query_token(request: &Request) -> Option<(String, String)> {
    let query = request.uri().query()?;
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("token=") {
            Some(value) => token = Some(value.to_owned()),
            None => rest.push(pair),
        }
    }
    Some((token?, rest.join("&")))
}

/// Refuses every request without the token (see the module's notes).
pub(crate) async fn require_token(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.config.token.as_deref() else {
        return next.run(request).await;
    };
    if bearer(&request).is_some_and(|given| same(given, expected))
        || cookie(&request).is_some_and(|given| same(given, expected))
    {
        return next.run(request).await;
    }
    if request.method() == Method::GET
        && let Some((given, rest)) = query_token(&request)
        && same(&given, expected)
    {
        let path = request.uri().path();
        let target = if rest.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{rest}")
        };
        let mut response = Redirect::to(&target).into_response();
        let cookie = format!("{COOKIE}={expected}; HttpOnly; SameSite=Strict; Path=/");
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
        return response;
    }
    tracing::info!(path = %request.uri().path(), method = %request.method(), "console: request without a valid token refused");
    problem(
        StatusCode::UNAUTHORIZED,
        "Token needed",
        "This console needs its token. Open it once as /?token=<token> (the browser then keeps it in a \
         cookie), or send the header Authorization: Bearer <token>. The token is the --token value (or \
         CONVEYOR_CONSOLE_TOKEN) the console was started with.",
    )
}

/// Checks a POSTed form's CSRF value: `None` when it is right, else the 403 page to answer with.
pub(crate) fn refuse_without_csrf(state: &AppState, fields: &Fields) -> Option<Response> {
    if fields.get("csrf").is_some_and(|given| same(given, &state.csrf)) {
        return None;
    }
    tracing::info!("console: a form without a valid CSRF value was refused");
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
