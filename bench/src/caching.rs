//! Anthropic prompt caching (issue #17, item 2): a few turns of one session
//! on `anthropic/claude-sonnet-4-5`, reached through `models.json` at a mock
//! Messages server in this process that honours `cache_control` as the API
//! does: each marked block ends a prefix (tools, system, then messages in
//! order) that is written to the cache, and the longest cached prefix
//! ending at a marker or up to 20 blocks before it is read from it. The figures are the `cacheRead` / `cacheWrite`
//! totals of the replies' usage as the store kept it, and what the input
//! would have cost without caching.
//!
//! A token is counted as 4 bytes of the block's JSON; the API's own minimum
//! cacheable length is not modelled.

use crate::server::{Server, stored_session};
use crate::util::{Env, Report, read_http_request};
use kernel::protocol::{ModelRef, TranscriptItem, Usage};
use pi_store::SessionStore;
use serde_json::{Value as Json, json};
use std::collections::BTreeSet;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Sonnet 4.5's input price, USD per million tokens.
const INPUT_PRICE: f64 = 3.0;

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let turns = env.pick(3, 8);
    let mock = MockAnthropic::start()?;
    let agent = env.fresh_dir("caching-agent");
    let models = json!({"providers": {"anthropic": {
        "baseUrl": format!("http://{}", mock.addr),
        "apiKey": "bench-key",
    }}});
    std::fs::write(agent.join("models.json"), models.to_string()).map_err(|e| e.to_string())?;
    let dir = env.fresh_dir("caching");
    let id = pi_config::new_uuid();
    let mut stored = stored_session(&id, 1_700_000_000_000);
    stored.model = ModelRef {
        provider: "anthropic".into(),
        id: "claude-sonnet-4-5".into(),
    };
    stored.cwd = env.fresh_dir("caching-project").display().to_string();
    drop(SessionStore::create(&dir, &stored).map_err(|e| e.to_string())?);
    let vars = [("PI_CODING_AGENT_DIR", agent.display().to_string())];
    let mut server = Server::start(env, &dir, &vars)?;
    let (runtime, client) = server.client("caching")?;
    runtime
        .block_on(client.attach(&id))
        .map_err(|e| format!("attach: {e}"))?;
    for turn in 0..turns {
        // Each prompt about 2 KB, like a pasted file or a long request.
        let text = format!("turn {turn}: {}", "please look at this code; ".repeat(80));
        runtime
            .block_on(client.prompt(&id, &text))
            .map_err(|e| format!("prompt {turn}: {e}"))?;
    }
    drop(client);
    drop(runtime);
    server.stop();

    let (_store, stored) = SessionStore::open(&dir, &id).map_err(|e| e.to_string())?;
    let usages: Vec<Usage> = stored
        .transcript
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::Assistant(a) => a.usage.clone(),
            _ => None,
        })
        .collect();
    if usages.len() != turns {
        return Err(format!(
            "{} replies with usage stored, {turns} expected; server log:\n{}",
            usages.len(),
            server.log_tail()
        ));
    }
    let sum = |f: fn(&Usage) -> u64| usages.iter().map(f).sum::<u64>();
    let (input, read, write) = (
        sum(|u| u.input),
        sum(|u| u.cache_read),
        sum(|u| u.cache_write),
    );
    let first = &usages[0];
    report.info(
        "caching",
        "first call: cacheWrite / cacheRead / uncached input (tokens)",
        format!(
            "{} / {} / {}",
            first.cache_write, first.cache_read, first.input
        ),
    );
    report.info(
        "caching",
        format!("{turns} turns, stored usage: cacheRead / cacheWrite / uncached input (tokens)"),
        format!("{read} / {write} / {input}"),
    );
    // The stored cost is the registry's prices applied by the provider; the
    // price table here only prices the same tokens without a cache.
    let with: f64 = usages
        .iter()
        .map(|u| u.cost.input + u.cost.cache_read + u.cost.cache_write)
        .sum();
    let without = (input + read + write) as f64 * INPUT_PRICE / 1e6;
    report.info(
        "caching",
        "input cost with caching (stored) / without (Sonnet 4.5 prices)",
        format!(
            "${with:.4} / ${without:.4} ({:.0} % saved)",
            (1.0 - with / without) * 100.0
        ),
    );
    let requests = mock.requests.lock().map_or(0, |r| *r);
    report.push(
        "caching",
        "every call after the first reads the cache",
        format!(
            "{} of {}",
            usages[1..].iter().filter(|u| u.cache_read > 0).count(),
            requests.saturating_sub(1)
        ),
        "all",
        Some(usages[1..].iter().all(|u| u.cache_read > 0)),
    );
    Ok(())
}

/// A Messages API stand-in on a loopback port: one thread, one connection
/// at a time, each answered with a short streamed reply whose usage follows
/// the request's `cache_control` markers.
struct MockAnthropic {
    addr: String,
    requests: Arc<Mutex<u64>>,
}

impl MockAnthropic {
    fn start() -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener
            .local_addr()
            .map_err(|e| e.to_string())?
            .to_string();
        let requests = Arc::new(Mutex::new(0u64));
        let counter = requests.clone();
        std::thread::spawn(move || {
            let mut cache = BTreeSet::new();
            for stream in listener.incoming().flatten() {
                if let Ok(mut n) = counter.lock() {
                    *n += 1;
                }
                let _ = serve(stream, &mut cache);
            }
        });
        Ok(Self { addr, requests })
    }
}

/// Answers one request (`connection: close`).
fn serve(stream: TcpStream, cache: &mut BTreeSet<String>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let Some((_, body)) = read_http_request(&mut reader)? else {
        return Ok(());
    };
    let request: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
    let (read, write, input) = cached_usage(&request, cache);
    let usage = json!({"input_tokens": input, "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write, "output_tokens": 1});
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_bench", "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5-20250929", "content": [],
            "usage": usage}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Looked at it; it is fine."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 8}}),
        json!({"type": "message_stop"}),
    ];
    let mut sse = String::new();
    for e in events {
        sse.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            e["type"].as_str().unwrap_or("")
        ));
    }
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{sse}",
        sse.len()
    )?;
    out.flush()
}

/// (cache read, cache write, uncached input) tokens of a request: the
/// prompt's blocks in cache order, each marked block closing a cached
/// prefix; the longest marked prefix already cached is read, the rest up to
/// the last marker written, what follows it is plain input.
fn cached_usage(request: &Json, cache: &mut BTreeSet<String>) -> (u64, u64, u64) {
    let mut blocks: Vec<&Json> = Vec::new();
    let list = |v: &Json| v.as_array().cloned().unwrap_or_default();
    let tools = list(&request["tools"]);
    let system = list(&request["system"]);
    let mut message_blocks = Vec::new();
    for m in list(&request["messages"]) {
        message_blocks.extend(
            list(&m["content"])
                .into_iter()
                .map(|b| json!([m["role"], b])),
        );
    }
    blocks.extend(tools.iter());
    blocks.extend(system.iter());
    blocks.extend(message_blocks.iter());
    let marked = |b: &Json| b.get("cache_control").is_some() || b[1].get("cache_control").is_some();
    // A block's identity leaves its marker out: moving the marker on does
    // not change the prefix.
    let strip = |b: &Json| {
        let mut b = b.clone();
        if let Some(map) = b.as_object_mut() {
            map.remove("cache_control");
        }
        if let Some(inner) = b.get_mut(1).and_then(Json::as_object_mut) {
            inner.remove("cache_control");
        }
        b.to_string()
    };
    // Each block boundary: the prefix ending there, its tokens, and whether
    // a marker closes it.
    let mut bounds: Vec<(String, u64, bool)> = Vec::new();
    let (mut prefix, mut tokens) = (String::new(), 0u64);
    for b in blocks {
        let text = strip(b);
        tokens += (text.len() as u64).div_ceil(4);
        prefix.push_str(&text);
        bounds.push((prefix.clone(), tokens, marked(b)));
    }
    // As the API does, a marker looks for a hit at its own boundary and the
    // 20 before it (so the previous turn's prefix, no longer marked, is
    // found), and writes its prefix; what this request writes is not read
    // by it.
    let (mut read, mut last_mark) = (0u64, 0u64);
    let marks: Vec<usize> = (0..bounds.len()).filter(|i| bounds[*i].2).collect();
    for &i in &marks {
        if let Some(hit) = bounds[i.saturating_sub(20)..=i]
            .iter()
            .rev()
            .find(|(p, ..)| cache.contains(p))
        {
            read = read.max(hit.1);
        }
        last_mark = bounds[i].1;
    }
    for &i in &marks {
        cache.insert(bounds[i].0.clone());
    }
    (read, last_mark - read.min(last_mark), tokens - last_mark)
}
