//! A scripted model server on a loopback port, for the `peers` item: every
//! system under test is pointed at it and streams the same reply, whichever
//! wire API it speaks.
//!
//! - `POST …/responses`: an OpenAI Responses stream (`response.created`,
//!   `response.output_item.added`, `response.content_part.added`, one
//!   `response.output_text.delta` per word, the `done` events and
//!   `response.completed` with usage), as in
//!   `io/agent/tests/fixtures/sse/openai-responses-text.sse`;
//! - `POST …/chat/completions`: a Chat Completions stream (a role chunk, one
//!   content chunk per word, a `finish_reason` chunk, a usage chunk and
//!   `[DONE]`), as in `io/agent/tests/fixtures/sse/openai-text.sse`;
//! - `GET …/models`: one model, `mock`;
//! - anything else: 404.
//!
//! The reply is `words` words (`w0000 w0001 …`), one delta each, written as
//! one HTTP chunk each, `delay_us` apart (0: as fast as the socket takes
//! them). One thread per connection; each answer closes its connection.
//! The reported usage is constant (10 input tokens), so no system under
//! test compacts because of it.

use crate::util::read_http_request;
use serde_json::{Value as Json, json};
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters and the script, shared with the connection threads.
#[derive(Debug, Default)]
pub(crate) struct Script {
    /// Words (deltas) in each reply.
    pub(crate) words: AtomicU64,
    /// Pause before each delta, µs.
    pub(crate) delay_us: AtomicU64,
    /// Streams answered, by API.
    pub(crate) responses: AtomicU64,
    pub(crate) chats: AtomicU64,
    /// Deltas written, over every stream.
    pub(crate) deltas: AtomicU64,
    /// When each stream's request arrived.
    pub(crate) arrivals: std::sync::Mutex<Vec<std::time::Instant>>,
}

/// The running mock.
#[derive(Debug)]
pub(crate) struct MockLlm {
    /// `http://127.0.0.1:<port>/v1`
    pub(crate) base: String,
    pub(crate) script: Arc<Script>,
}

impl MockLlm {
    /// Binds a free loopback port and serves until the process exits.
    pub(crate) fn start(words: u64) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let script = Arc::new(Script::default());
        script.words.store(words, Ordering::Relaxed);
        let shared = script.clone();
        std::thread::Builder::new()
            .name("mockllm".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let script = shared.clone();
                    let _ = std::thread::Builder::new()
                        .name("mockllm-conn".into())
                        .spawn(move || {
                            let _ = serve(stream, &script);
                        });
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Self {
            base: format!("http://{addr}/v1"),
            script,
        })
    }

    /// Deltas written so far.
    pub(crate) fn deltas(&self) -> u64 {
        self.script.deltas.load(Ordering::Relaxed)
    }

    /// Streams answered so far (both APIs).
    pub(crate) fn streams(&self) -> u64 {
        self.script.responses.load(Ordering::Relaxed) + self.script.chats.load(Ordering::Relaxed)
    }
}

/// Answers one request, then closes.
fn serve(stream: TcpStream, script: &Script) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let Some((request_line, _)) = read_http_request(&mut reader)? else {
        return Ok(());
    };
    let arrived = std::time::Instant::now();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("").split('?').next().unwrap_or("");
    let mut out = stream;
    match (method, path) {
        ("POST", p) if p.ends_with("/responses") => {
            script.responses.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut a) = script.arrivals.lock() {
                a.push(arrived);
            }
            stream_reply(&mut out, script, Api::Responses)
        }
        ("POST", p) if p.ends_with("/chat/completions") => {
            script.chats.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut a) = script.arrivals.lock() {
                a.push(arrived);
            }
            stream_reply(&mut out, script, Api::Chat)
        }
        ("GET", p) if p.ends_with("/models") => {
            let body = json!({"object": "list", "data": [{"id": "mock", "object": "model",
                "created": 1_700_000_000, "owned_by": "bench"}]})
            .to_string();
            write!(
                out,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            )?;
            out.flush()
        }
        _ => {
            out.write_all(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )?;
            out.flush()
        }
    }
}

#[derive(Clone, Copy)]
enum Api {
    Responses,
    Chat,
}

/// Writes one SSE event as one HTTP chunk.
fn chunk(out: &mut TcpStream, event: Option<&str>, data: &str) -> std::io::Result<()> {
    let text = match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    write!(out, "{:x}\r\n{text}\r\n", text.len())
}

fn typed(out: &mut TcpStream, value: &Json) -> std::io::Result<()> {
    chunk(out, value["type"].as_str(), &value.to_string())
}

/// The scripted reply, streamed.
fn stream_reply(out: &mut TcpStream, script: &Script, api: Api) -> std::io::Result<()> {
    let words = script.words.load(Ordering::Relaxed);
    let delay = Duration::from_micros(script.delay_us.load(Ordering::Relaxed));
    out.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
          transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )?;
    let word = |i: u64| format!("w{i:04} ");
    let text: String = (0..words).map(word).collect();
    let usage_in = 10u64;
    match api {
        Api::Responses => {
            let response = json!({"id": "resp_bench", "object": "response", "created_at": 1_700_000_000,
                "status": "in_progress", "model": "mock", "output": []});
            typed(
                out,
                &json!({"type": "response.created", "sequence_number": 0, "response": response}),
            )?;
            typed(
                out,
                &json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                "item": {"id": "msg_bench", "type": "message", "status": "in_progress", "content": [],
                    "role": "assistant"}}),
            )?;
            typed(
                out,
                &json!({"type": "response.content_part.added", "sequence_number": 2,
                "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "annotations": [], "text": ""}}),
            )?;
            out.flush()?;
            for i in 0..words {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                typed(
                    out,
                    &json!({"type": "response.output_text.delta", "sequence_number": 3 + i,
                    "item_id": "msg_bench", "output_index": 0, "content_index": 0, "delta": word(i)}),
                )?;
                out.flush()?;
                script.deltas.fetch_add(1, Ordering::Relaxed);
            }
            let n = 3 + words;
            let item = json!({"id": "msg_bench", "type": "message", "status": "completed",
                "content": [{"type": "output_text", "annotations": [], "text": text}], "role": "assistant"});
            typed(
                out,
                &json!({"type": "response.output_text.done", "sequence_number": n,
                "item_id": "msg_bench", "output_index": 0, "content_index": 0, "text": text}),
            )?;
            typed(
                out,
                &json!({"type": "response.content_part.done", "sequence_number": n + 1,
                "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "annotations": [], "text": text}}),
            )?;
            typed(
                out,
                &json!({"type": "response.output_item.done", "sequence_number": n + 2,
                "output_index": 0, "item": item}),
            )?;
            let mut done = response;
            done["status"] = json!("completed");
            done["output"] = json!([item]);
            done["usage"] = json!({"input_tokens": usage_in, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": words, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage_in + words});
            typed(
                out,
                &json!({"type": "response.completed", "sequence_number": n + 3, "response": done}),
            )?;
        }
        Api::Chat => {
            let base = |choices: Json| {
                json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
                    "created": 1_700_000_000, "model": "mock", "choices": choices})
            };
            let first = base(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
            );
            chunk(out, None, &first.to_string())?;
            out.flush()?;
            for i in 0..words {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                let delta = base(
                    json!([{"index": 0, "delta": {"content": word(i)}, "finish_reason": null}]),
                );
                chunk(out, None, &delta.to_string())?;
                out.flush()?;
                script.deltas.fetch_add(1, Ordering::Relaxed);
            }
            let stop = base(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]));
            chunk(out, None, &stop.to_string())?;
            let mut usage = base(json!([]));
            usage["usage"] = json!({"prompt_tokens": usage_in, "completion_tokens": words,
                "total_tokens": usage_in + words});
            chunk(out, None, &usage.to_string())?;
            chunk(out, None, "[DONE]")?;
        }
    }
    out.write_all(b"0\r\n\r\n")?;
    out.flush()
}
