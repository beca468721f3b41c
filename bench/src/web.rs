//! The web listener's WebSocket against the Unix socket, on one server:
//!
//! - `list` round trips over each, alternating rounds (the same request,
//!   the same reply bytes, one frame per WebSocket message);
//! - a fan-out burst to 100 clients over each, alternating rounds:
//!   deliveries/s and p99 skew, measured as in item 2.
//!
//! Target: the WebSocket within 1.5× of the Unix socket, both figures.

use crate::fanout::{Audience, prompt_frame, summarize};
use crate::raw::{RawConn, v1_request};
use crate::rtt::{Pair, cycles};
use crate::server::{Server, create_sessions};
use crate::util::{Env, Report, fmt_rate, fmt_us, median};
use kernel::protocol::Command;
use std::time::Duration;

/// The audience of the fan-out comparison.
const CLIENTS: usize = 100;

/// The `web` item.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let sessions = env.fresh_dir("web-sessions");
    let ids = create_sessions(&sessions, 2, 1)?;
    let (server, addr, token) =
        Server::start_web(env, &sessions, &[("PI_FAUX_DELAY_MS", "0".into())])?;
    let err = |e: std::io::Error| e.to_string();
    runtime.block_on(async {
        // `list` round trips.
        let mut unix = RawConn::connect_with_token(&server.socket, &token).await.map_err(err)?;
        unix.hello_v1().await.map_err(err)?;
        let mut web = RawConn::connect_web(&addr, &token).await.map_err(err)?;
        web.hello_v1().await.map_err(err)?;
        let list = [v1_request("l", Command::List)];
        let n = env.pick(2_000, 20_000);
        cycles(&mut unix, &list, n / 5 + 1).await.map_err(err)?;
        cycles(&mut web, &list, n / 5 + 1).await.map_err(err)?;
        let mut pair = Pair::default();
        for _ in 0..env.rounds {
            let a = cycles(&mut unix, &list, n).await.map_err(err)?;
            let b = cycles(&mut web, &list, n).await.map_err(err)?;
            pair.round(a, b);
        }
        let ratio = pair.ratio();
        report.push(
            "web",
            "`list` round trip, WebSocket vs the Unix socket (same server, same request)",
            format!(
                "**{ratio:.2}×** ({}); WebSocket {}, Unix socket {}",
                pair.spread(),
                Pair::describe(&pair.b),
                Pair::describe(&pair.a)
            ),
            "≤ 1.5×",
            Some(ratio <= 1.5),
        );
        drop((unix, web));

        // Fan-out to 100 clients of each kind, one session per kind so each
        // transcript grows alike; rounds alternate.
        let words = env.pick(300, 2000);
        let rounds = env.rounds.min(5);
        let mut fresh = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            fresh.push(RawConn::connect_with_token(&server.socket, &token).await.map_err(err)?);
        }
        let mut unix = Audience::join(fresh, &ids[0]).await?;
        let mut fresh = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            fresh.push(RawConn::connect_web(&addr, &token).await.map_err(err)?);
        }
        let mut web = Audience::join(fresh, &ids[1]).await?;
        let (unix_prompt, web_prompt) = (prompt_frame(&ids[0], words), prompt_frame(&ids[1], words));
        unix.round(&unix_prompt, server.pid).await?; // warm up
        web.round(&web_prompt, server.pid).await?;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            tokio::time::sleep(Duration::from_millis(100)).await;
            a.push(unix.round(&unix_prompt, server.pid).await?);
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.push(web.round(&web_prompt, server.pid).await?);
        }
        let (ua, wb) = (summarize(&a), summarize(&b));
        let rate_ratio = ua.rate / wb.rate.max(1e-9);
        let p99_ratio = wb.p99 / ua.p99.max(1e-9);
        let rounds_rates: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a.rate() / b.rate()).collect();
        report.push(
            "web",
            format!("fan-out burst to {CLIENTS} clients, WebSocket vs the Unix socket, {} events/turn", wb.events),
            format!(
                "WebSocket **{}/s**, skew p99 {}, server+worker CPU {:.2} µs/delivery; Unix socket {}/s, p99 {}, {:.2} µs/delivery; throughput ratio **{rate_ratio:.2}×** (rounds median {:.2}×), p99 ratio **{p99_ratio:.2}×**",
                fmt_rate(wb.rate),
                fmt_us(wb.p99),
                wb.cpu_per_delivery_us,
                fmt_rate(ua.rate),
                fmt_us(ua.p99),
                ua.cpu_per_delivery_us,
                median(&rounds_rates),
            ),
            "≤ 1.5× (throughput and p99)",
            Some(rate_ratio <= 1.5 && p99_ratio <= 1.5),
        );
        Ok::<(), String>(())
    })?;
    drop(server);
    Ok(())
}
