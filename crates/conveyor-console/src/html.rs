//! The page frame, the shared fragments, the stylesheet and the one small script (no build step, no
//! Node).
//!
//! Every page is a [`maud`] template: a value spliced in with `(value)` is HTML-escaped (`&`, `<`, `>`,
//! `"`; attributes are always double-quoted), so no page builds markup from strings.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, Render, html};

use crate::state::AppState;

/// `text` as a URL query value.
pub(crate) fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(byte)),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Which navigation entry is lit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Queues,
    Jobs,
    Schedules,
    Delays,
    Send,
    Other,
}

/// A whole page: navigation, then `body`.
pub(crate) fn page(title: &str, nav: Nav, body: Markup) -> Html<String> {
    let nav_link = |href: &str, label: &str, this: Nav| {
        html! { a href=(href) class=[(nav == this).then_some("on")] { (label) } }
    };
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Conveyor" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header {
                    strong { "Conveyor" }
                    nav {
                        (nav_link("/", "Queues", Nav::Queues))
                        (nav_link("/jobs", "Jobs", Nav::Jobs))
                        (nav_link("/schedules", "Schedules", Nav::Schedules))
                        (nav_link("/delays", "Delayed", Nav::Delays))
                        (nav_link("/send", "Send", Nav::Send))
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    };
    Html(page.into_string())
}

/// A page saying what went wrong and what to do, with `status`.
pub(crate) fn problem(status: StatusCode, title: &str, message: &str) -> Response {
    let body = html! {
        p class="bad" id="problem" { (message) }
        p { a href="/" { "Back to the queues" } }
    };
    (status, page(title, Nav::Other, body)).into_response()
}

/// The hidden CSRF field every state-changing form carries.
pub(crate) fn csrf_field(state: &AppState) -> Markup {
    hidden("csrf", &state.csrf)
}

/// A hidden form field.
pub(crate) fn hidden(name: &str, value: &str) -> Markup {
    html! { input type="hidden" name=(name) value=(value); }
}

/// A number card for the top of a page; `alert` colours it when it is not zero.
pub(crate) fn card(label: &str, value: impl Render, alert: bool, id: &str) -> Markup {
    let class = if alert { "card alert" } else { "card" };
    html! {
        div class=(class) {
            b id=(id) { (value) }
            span { (label) }
        }
    }
}

pub(crate) async fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page. The console has Queues, Jobs, Schedules, Delayed and Send.",
    )
}

/// Headers on every answer: no framing, scripts and styles from this origin only, no referrer to other
/// sites (a token may be in a URL once), nothing cached (pages can carry message bodies).
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        // Same-origin (not no-referrer): the pages' own POSTs then carry their real `Origin`, so
        // `Origin: null` can be refused (`auth.rs`); other sites still get no referrer.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

pub(crate) async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLESHEET).into_response()
}

pub(crate) async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response()
}

const STYLESHEET: &str = r#":root{color-scheme:light dark;--fg:#1b1f24;--muted:#57606a;--bg:#fff;--card:#f3f5f7;--line:#d0d7de;--bad:#b42318;--ok:#1a7f37;--accent:#0b5cad}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#9198a1;--bg:#0d1117;--card:#161b22;--line:#30363d;--bad:#ff7b72;--ok:#3fb950;--accent:#58a6ff}}
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:var(--fg);background:var(--bg)}
header{display:flex;gap:1.2rem;align-items:center;padding:.6rem 1rem;border-bottom:1px solid var(--line);flex-wrap:wrap}
nav{display:flex;gap:1rem}nav a{color:var(--fg);text-decoration:none;padding:.2rem 0}nav a.on{font-weight:600;border-bottom:2px solid var(--accent)}
main{padding:.8rem 1rem 2rem;max-width:1200px;margin:auto}h1{font-size:1.3rem;margin:.2rem 0 .8rem}h2{font-size:1.05rem;margin:1.2rem 0 .5rem}
a{color:var(--accent)}.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(130px,1fr));gap:.5rem;margin-bottom:1rem}
.card{background:var(--card);border-radius:8px;padding:.5rem .8rem}.card b{display:block;font-size:1.6rem;font-variant-numeric:tabular-nums}.card span{color:var(--muted);font-size:.85rem}
.card.alert b{color:var(--bad)}.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.35rem .5rem;border-bottom:1px solid var(--line);vertical-align:top}th{font-size:.85rem;color:var(--muted);font-weight:600}
.n{text-align:right;font-variant-numeric:tabular-nums}.muted{color:var(--muted)}.bad{color:var(--bad)}.ok{color:var(--ok)}
button,input,select,textarea{font:inherit;color:var(--fg);background:var(--bg);border:1px solid var(--line);border-radius:6px;padding:.3rem .5rem}
button{cursor:pointer;background:var(--card)}button.danger{border-color:var(--bad);color:var(--bad)}form.inline{display:inline}
textarea{width:100%;min-height:10rem;font-family:ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-all;background:var(--card);padding:.5rem;border-radius:6px;margin:.3rem 0}
.filters,.actions{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin:.5rem 0}.filters label,.actions label,.stack label{display:flex;flex-direction:column;font-size:.85rem;color:var(--muted)}
.stack{display:grid;gap:.6rem;max-width:40rem}.note{background:var(--card);border-left:3px solid var(--accent);padding:.4rem .7rem;border-radius:4px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:.8rem;margin:0 0 1rem}.chart{margin:0;background:var(--card);border-radius:8px;padding:.5rem .7rem}
.chart figcaption{font-size:.85rem;color:var(--muted)}.chart svg{display:block;width:100%;height:90px;margin:.3rem 0}.chart-scale{display:flex;justify-content:space-between;font-size:.75rem}
.axis{stroke:var(--line)}.series{stroke-width:2;vector-effect:non-scaling-stroke}.series.s1{stroke:var(--accent)}.series.s2{stroke:var(--muted)}.series.s3{stroke:var(--bad)}
.key.s1{color:var(--accent)}.key.s2{color:var(--muted)}.key.s3{color:var(--bad)}
dl.details{display:grid;grid-template-columns:max-content 1fr;gap:.1rem .8rem;margin:.3rem 0;font-size:.85rem}dl.details dt{color:var(--muted)}dl.details dd{margin:0;overflow-wrap:anywhere}
@media (max-width:640px){.wide{display:none}main{padding:.6rem}.card b{font-size:1.3rem}th,td{padding:.3rem .3rem}td{overflow-wrap:anywhere}}
"#;

const SCRIPT: &str = r#"// Conveyor console: live regions and "select all". Everything works without it (forms post, pages reload).
(function () {
  document.querySelectorAll('[data-live]').forEach(function (region) {
    var every = Number(region.getAttribute('data-every') || 3000);
    function tick() {
      if (region.querySelector('[data-finished="true"]')) return;
      // A hidden tab costs no AWS requests: it polls again once it is shown.
      if (document.hidden) { document.addEventListener('visibilitychange', tick, { once: true }); return; }
      fetch(region.getAttribute('data-live'), { credentials: 'same-origin' })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) { region.innerHTML = html; })
        .catch(function () {})
        .finally(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  });
  document.querySelectorAll('input[data-select-all]').forEach(function (box) {
    box.addEventListener('change', function () {
      document.querySelectorAll('input[name="id"]').forEach(function (one) { one.checked = box.checked; });
    });
  });
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = r#"<script>alert("x")</script> & 'y'"#;

    #[test]
    fn markup_and_query_values_are_escaped() {
        // Text and double-quoted attribute values: `'` needs no escape there.
        assert_eq!(
            hidden("a\"b", HOSTILE).into_string(),
            "<input type=\"hidden\" name=\"a&quot;b\" \
             value=\"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; 'y'\">"
        );
        assert_eq!(
            card(HOSTILE, HOSTILE, true, "c").into_string(),
            "<div class=\"card alert\"><b id=\"c\">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; 'y'</b>\
             <span>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; 'y'</span></div>"
        );
        let page = page(HOSTILE, Nav::Send, html! { p { (HOSTILE) } }).0;
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(page.contains("<a href=\"/send\" class=\"on\">Send</a>"), "{page}");
        assert_eq!(
            query_value("http://h:4566/000/jobs q"),
            "http%3A%2F%2Fh%3A4566%2F000%2Fjobs%20q"
        );
    }
}
