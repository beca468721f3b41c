//! HTTP for the providers: one POST answered by an event stream, with a
//! timeout on every wait, prompt cancellation, and errors mapped to clear,
//! classified failures.

use super::model::ModelEvent;
use super::registry::ProviderConfig;
use super::sse::{SseEvent, SseParser};
use super::text::excerpt;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Largest error body we read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why a call stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Cancelled, or nobody listens any more: send nothing more.
    Cancelled,
    /// Failed: report it.
    Failed(Failure),
}

/// A classified failure.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) retryable: bool,
    pub(crate) retry_after_ms: Option<u64>,
}

impl Failure {
    pub(crate) fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            retry_after_ms: None,
        }
    }

    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            retry_after_ms: None,
        }
    }

    pub(crate) fn malformed(detail: impl std::fmt::Display) -> Self {
        Self::permanent(format!("malformed stream: {detail}"))
    }

    pub(crate) fn into_event(self) -> ModelEvent {
        ModelEvent::Failed {
            message: self.message,
            retryable: self.retryable,
            retry_after_ms: self.retry_after_ms,
        }
    }
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Self {
        Stop::Failed(f)
    }
}

/// Where events go, and the cancellation every wait races against.
pub(crate) struct Sink {
    events: mpsc::Sender<ModelEvent>,
    cancel: CancellationToken,
}

impl Sink {
    pub(crate) fn new(events: mpsc::Sender<ModelEvent>, cancel: CancellationToken) -> Self {
        Self { events, cancel }
    }

    /// Sends one event; `Cancelled` if the call was cancelled or the receiver is gone.
    pub(crate) async fn send(&self, event: ModelEvent) -> Result<(), Stop> {
        if self.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Stop::Cancelled),
            sent = self.events.send(event) => sent.map_err(|_| Stop::Cancelled),
        }
    }

    /// Runs `fut` unless the call is cancelled first.
    async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, Stop> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Stop::Cancelled),
            out = fut => Ok(out),
        }
    }
}

/// A response body being read as server-sent events.
pub(crate) struct EventStream {
    response: reqwest::Response,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
    ended: bool,
    idle: Duration,
    label: String,
}

impl EventStream {
    /// The next event; `None` at the end of the body.
    pub(crate) async fn next(&mut self, sink: &Sink) -> Result<Option<SseEvent>, Stop> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            let read = tokio::time::timeout(self.idle, self.response.chunk());
            let mut out = Vec::new();
            match sink.guard(read).await? {
                Err(_) => {
                    return Err(Failure::transient(format!(
                        "{}: the stream stalled: no data for {} (idle timeout)",
                        self.label,
                        seconds(self.idle)
                    ))
                    .into());
                }
                Ok(Err(e)) => {
                    return Err(Failure::transient(format!(
                        "{}: network error while streaming: {}",
                        self.label,
                        error_chain(&e)
                    ))
                    .into());
                }
                Ok(Ok(Some(bytes))) => self.parser.push(&bytes, &mut out),
                Ok(Ok(None)) => {
                    self.ended = true;
                    self.parser.finish(&mut out)
                }
            }
            .map_err(|e| Failure::malformed(e).with_label(&self.label))?;
            self.ready.extend(out);
        }
    }
}

impl Failure {
    /// Prefixes the message with the provider label.
    pub(crate) fn with_label(mut self, label: &str) -> Self {
        self.message = format!("{label}: {}", self.message);
        self
    }
}

/// A provider's stream translator: SSE events in, model events out.
pub(crate) trait Translate {
    /// One event of the stream.
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, Failure>;
    /// The provider said its last word: the rest of the body is not read.
    fn ended(&self) -> bool;
    /// The stream ended (or the provider said its last word).
    fn finish(self) -> Result<Vec<ModelEvent>, Failure>;
}

/// Posts `body` and streams the reply through `translator` into `sink`:
/// the one loop every provider runs.
pub(crate) async fn stream(
    provider: &ProviderConfig,
    url: &str,
    headers: &[(String, String)],
    body: &serde_json::Value,
    sink: &Sink,
    mut translator: impl Translate,
) -> Result<(), Stop> {
    let mut events = post_events(provider, url, headers, body, sink).await?;
    let label = |f: Failure| Stop::Failed(f.with_label(&provider.provider));
    while let Some(event) = events.next(sink).await? {
        for e in translator.on_event(&event).map_err(label)? {
            sink.send(e).await?;
        }
        if translator.ended() {
            break;
        }
    }
    for e in translator.finish().map_err(label)? {
        sink.send(e).await?;
    }
    Ok(())
}

/// POSTs `body` to `url` and returns the event stream of a successful answer.
pub(crate) async fn post_events(
    provider: &ProviderConfig,
    url: &str,
    headers: &[(String, String)],
    body: &serde_json::Value,
    sink: &Sink,
) -> Result<EventStream, Stop> {
    let label = provider.provider.clone();
    let timeouts = provider.timeouts;
    let client = client_for(url, timeouts.connect)
        .map_err(|e| Failure::permanent(format!("{label}: cannot set up HTTP: {e}")))?;
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(serde_json::to_vec(body).expect("JSON values serialise"));
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let sent = tokio::time::timeout(timeouts.first_byte, request.send());
    let response = match sink.guard(sent).await? {
        Err(_) => {
            return Err(Failure::transient(format!(
                "{label}: no response from {url} within {} (first-byte timeout)",
                seconds(timeouts.first_byte)
            ))
            .into());
        }
        Ok(Err(e)) => {
            let what = if e.is_connect() {
                "cannot connect to"
            } else {
                "request failed to"
            };
            return Err(
                Failure::transient(format!("{label}: {what} {url}: {}", error_chain(&e))).into(),
            );
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if !status.is_success() {
        let retry_after_ms = retry_after(response.headers(), SystemTime::now());
        let body = read_error_body(response, timeouts.idle, sink).await?;
        return Err(http_failure(&label, status, &body, retry_after_ms).into());
    }
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("application/json") {
        let body = read_error_body(response, timeouts.idle, sink).await?;
        return Err(Failure::malformed(format!(
            "expected an event stream (text/event-stream) but got JSON: {}",
            excerpt(&body, 500)
        ))
        .with_label(&label)
        .into());
    }
    Ok(EventStream {
        response,
        parser: SseParser::default(),
        ready: VecDeque::new(),
        ended: false,
        idle: timeouts.idle,
        label,
    })
}

/// The failure for a non-2xx answer.
pub(crate) fn http_failure(
    label: &str,
    status: reqwest::StatusCode,
    body: &str,
    retry_after_ms: Option<u64>,
) -> Failure {
    let code = status.as_u16();
    let retryable = code == 408 || code == 429 || status.is_server_error();
    let reason = status.canonical_reason().unwrap_or("");
    let mut message = format!("{label}: HTTP {code} {reason}")
        .trim_end()
        .to_string();
    match provider_message(body) {
        Some(detail) => {
            message.push_str(": ");
            message.push_str(&detail);
        }
        None if !body.trim().is_empty() => {
            message.push_str(": ");
            message.push_str(&excerpt(body.trim(), 500));
        }
        None => {}
    }
    let retry_after_ms = if retryable { retry_after_ms } else { None };
    if let Some(ms) = retry_after_ms {
        message.push_str(&format!(
            " (retry after {})",
            seconds(Duration::from_millis(ms))
        ));
    }
    Failure {
        message,
        retryable,
        retry_after_ms,
    }
}

/// The error message inside a provider's JSON error body
/// (`{"error":{"message","type"}}`, `{"error":"..."}` or `{"message":"..."}`).
pub(crate) fn provider_message(body: &str) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    let error = json.get("error").unwrap_or(&json);
    if let Some(text) = error.as_str() {
        return Some(text.to_string());
    }
    let message = error.get("message").and_then(|m| m.as_str())?;
    match error.get("type").and_then(|t| t.as_str()) {
        Some(kind) if !kind.is_empty() && kind != "error" => Some(format!("{message} ({kind})")),
        _ => Some(message.to_string()),
    }
}

async fn read_error_body(
    mut response: reqwest::Response,
    idle: Duration,
    sink: &Sink,
) -> Result<String, Stop> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match sink
            .guard(tokio::time::timeout(idle, response.chunk()))
            .await?
        {
            Ok(Ok(Some(bytes))) => body.extend_from_slice(&bytes),
            // A body we cannot finish reading still says what arrived.
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// `retry-after-ms`, or `retry-after` in seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<u64> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(ms.ceil() as u64);
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).ceil() as u64);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0, |d| d.as_millis() as u64))
}

/// `e` and its sources, `: `-separated, without repeats.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// True for `localhost`, 127.0.0.0/8 and `::1`.
pub(crate) fn is_loopback(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A pooled client per (connect timeout, loopback). Loopback servers never go
/// through a proxy.
fn client_for(url: &str, connect: Duration) -> Result<reqwest::Client, String> {
    type Clients = Mutex<Vec<((Duration, bool), reqwest::Client)>>;
    static CLIENTS: OnceLock<Clients> = OnceLock::new();
    let loopback = is_loopback(url);
    let key = (connect, loopback);
    let mut clients = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, client)) = clients.iter().find(|(k, _)| *k == key) {
        return Ok(client.clone());
    }
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect)
        .user_agent(concat!("pi-server/", env!("CARGO_PKG_VERSION")))
        .pool_idle_timeout(crate::limits::POOL_IDLE);
    if loopback {
        builder = builder.no_proxy();
    }
    let client = builder.build().map_err(|e| error_chain(&e))?;
    clients.push((key, client.clone()));
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    #[test]
    fn retry_after_in_seconds_ms_and_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(7000));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&h, now), Some(30_000));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&earlier).unwrap());
        assert_eq!(retry_after(&h, now), Some(0));
        h.insert("retry-after-ms", HeaderValue::from_static("1500.2"));
        assert_eq!(retry_after(&h, now), Some(1501));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn http_failures_are_classified_with_the_provider_message() {
        let body = r#"{"error":{"message":"Invalid model","type":"invalid_request_error"}}"#;
        let f = http_failure("openai", reqwest::StatusCode::BAD_REQUEST, body, Some(5));
        assert_eq!(
            f.message,
            "openai: HTTP 400 Bad Request: Invalid model (invalid_request_error)"
        );
        assert!(!f.retryable);
        assert_eq!(f.retry_after_ms, None);
        let f = http_failure("x", reqwest::StatusCode::TOO_MANY_REQUESTS, "", Some(2000));
        assert!(f.retryable && f.retry_after_ms == Some(2000), "{f:?}");
        assert!(f.message.ends_with("(retry after 2 s)"), "{}", f.message);
        let f = http_failure(
            "x",
            reqwest::StatusCode::BAD_GATEWAY,
            "<html>oops</html>",
            None,
        );
        assert!(f.retryable);
        assert!(f.message.contains("<html>oops</html>"));
    }

    #[test]
    fn loopback_urls() {
        assert!(is_loopback("http://localhost:8080/v1"));
        assert!(is_loopback("http://127.0.0.5/v1"));
        assert!(is_loopback("http://[::1]:11434/v1"));
        assert!(!is_loopback("https://api.openai.com/v1"));
    }
}
