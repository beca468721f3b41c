//! `pi-server acp`: an Agent Client Protocol agent on stdin and stdout,
//! fronting the daemon's durable sessions for editors (Zed, JetBrains,
//! Neovim, Emacs...).
//!
//! This module is the host: it reads newline-delimited JSON-RPC from stdin,
//! writes the adapter's lines to stdout (protocol lines only; logs go to
//! stderr through `tracing`), carries the adapter's pi calls out on the
//! shared [`Client`] (which owns the connection, its reconnection and the
//! re-attachment of open sessions), and feeds back what happens. What any of
//! it means is decided in [`adapter`].

mod adapter;

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc};

use crate::limits::{DONE_QUEUE, MAX_LINE};
use adapter::{Adapter, Input, Output};
use pi_client::{Client, Status};

/// Serves ACP on stdin/stdout over `client` until the editor closes stdin
/// or the server is gone for good.
pub(crate) async fn run(client: Client) -> Result<(), String> {
    let mut adapter = Adapter::new(client.server_snapshot().models);
    let mut events = client.events();
    let mut status = client.status();
    // Answers of calls on their way; a full channel only makes their tasks wait.
    let (done_tx, mut done_rx) = mpsc::channel(DONE_QUEUE);
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut stdout = tokio::io::stdout();
    let mut line = Vec::new();
    let result = loop {
        let input = tokio::select! {
            // A reconnection first: no delta after it may be trusted.
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        tracing::warn!("lost the server ({reason}); reconnecting");
                        Input::Gap
                    }
                    Status::Closed { error } => {
                        break Err(format!("the connection to the server ended: {error}"));
                    }
                    Status::Ready { .. } => continue,
                },
                Err(_) => break Err("the client ended".into()),
            },
            Some((token, result)) = done_rx.recv() => Input::Done { token, result },
            event = events.recv() => match event {
                Ok(event) => Input::Event(event),
                Err(broadcast::error::RecvError::Lagged(_)) => Input::Gap,
                Err(broadcast::error::RecvError::Closed) => break Err("the client ended".into()),
            },
            read = read_line(&mut stdin, &mut line) => match read {
                Ok(Some(Ok(text))) => Input::Line(text),
                Ok(Some(Err(bytes))) => {
                    tracing::warn!("a line of {bytes} bytes or more was skipped");
                    Input::Oversized
                }
                // The editor closed our stdin: its sessions stay on the
                // server, and their turns go on.
                Ok(None) => break Ok(()),
                Err(e) => break Err(format!("cannot read stdin: {e}")),
            },
        };
        for output in adapter.step(input) {
            match output {
                Output::Send(message) => {
                    let mut bytes = serde_json::to_vec(&message)
                        .map_err(|e| format!("cannot encode a message: {e}"))?;
                    bytes.push(b'\n');
                    if let Err(e) = write_all(&mut stdout, &bytes).await {
                        // The editor is gone.
                        tracing::info!("stdout closed: {e}");
                        client.close().await;
                        return Ok(());
                    }
                }
                Output::Call { token, command } => {
                    let client = client.clone();
                    let done = done_tx.clone();
                    tokio::spawn(async move {
                        let result = client.request(command).await;
                        let _ = done.send((token, result)).await;
                    });
                }
                Output::Log(line) => tracing::warn!("{line}"),
            }
        }
    };
    client.close().await;
    result
}

async fn write_all(stdout: &mut tokio::io::Stdout, bytes: &[u8]) -> io::Result<()> {
    stdout.write_all(bytes).await?;
    stdout.flush().await
}

/// Reads one line: `Some(Ok(text))`, `Some(Err(length))` for a line longer
/// than [`MAX_LINE`] (skipped to its end) or not UTF-8, `None` at the end of
/// input.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> io::Result<Option<Result<String, usize>>> {
    // Cancel-safe: this future loses the select whenever an event comes
    // first, and what it read of a line stays in `line` for the next call
    // (cleared only once a whole line is taken), so a line that arrives in
    // pieces is never cut in two.
    let room = (MAX_LINE as u64 + 1).saturating_sub(line.len() as u64);
    let read = (&mut *reader).take(room).read_until(b'\n', line).await?;
    if read == 0 && line.is_empty() {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && line.len() > MAX_LINE {
        // Skip the rest of the line.
        let mut skipped = line.len();
        loop {
            line.clear();
            let n = (&mut *reader)
                .take(MAX_LINE as u64)
                .read_until(b'\n', line)
                .await?;
            skipped += n;
            if n == 0 || line.last() == Some(&b'\n') {
                break;
            }
        }
        line.clear();
        return Ok(Some(Err(skipped)));
    }
    // A whole line, or the unterminated last one at the end of input.
    let text = match std::str::from_utf8(line) {
        Ok(text) => Ok(text.trim_end_matches(['\n', '\r']).to_owned()),
        Err(_) => Err(line.len()),
    };
    line.clear();
    Ok(Some(text))
}

/// The ACP fuzz target's body (`io/front/fuzz`, and the short run in this
/// module's tests): `data` as the editor's stdin, read as [`serve`] reads
/// it, each line stepped through one adapter, and every pi call answered:
/// `create` and `attach` with a fresh idle session, the rest with a lost
/// connection. Every line the adapter writes must encode. Must not panic.
#[doc(hidden)]
pub fn fuzz_stdin(data: &[u8]) {
    use kernel::protocol::{Command, CommandResult, SessionPhase, SessionSnapshot};
    let session = |id: &str| SessionSnapshot {
        id: id.to_owned(),
        name: None,
        cwd: "/work".into(),
        created_at: 1,
        updated_at: 1,
        phase: SessionPhase::Idle,
        model: kernel::faux::default_model(),
        thinking_level: kernel::protocol::ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision: 1,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut reader = BufReader::new(data);
        let mut line = Vec::new();
        let mut adapter = Adapter::new(kernel::faux::models());
        let mut inputs = std::collections::VecDeque::new();
        while let Ok(Some(read)) = read_line(&mut reader, &mut line).await {
            inputs.push_back(match read {
                Ok(text) => Input::Line(text),
                Err(_) => Input::Oversized,
            });
            while let Some(input) = inputs.pop_front() {
                for output in adapter.step(input) {
                    match output {
                        Output::Send(message) => {
                            serde_json::to_vec(&message).expect("every line encodes");
                        }
                        Output::Call { token, command } => {
                            let result = match command {
                                Command::Create(_) => Ok(CommandResult::Create {
                                    session: session("s1"),
                                }),
                                Command::Attach { session_id } => Ok(CommandResult::Attach {
                                    session: session(&session_id),
                                }),
                                _ => Err(pi_client::ClientError::Disconnected(
                                    "the fuzz target's server is gone".into(),
                                )),
                            };
                            inputs.push_back(Input::Done { token, result });
                        }
                        Output::Log(_) => {}
                    }
                }
            }
        }
    });
}

#[cfg(test)]
#[path = "../../../../kernel/fuzz/src/short.rs"]
mod fuzz_short;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// CI's short run of the ACP fuzz target (`io/front/fuzz`): its kept corpus
    /// and seeded mutations of it, none of which may panic.
    #[test]
    fn the_fuzz_target_survives_its_corpus_and_mutations_of_it() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/acp");
        fuzz_short::short_run(&corpus, 5_000, fuzz_stdin);
    }

    /// A line that arrives in two pieces, with the read cancelled in
    /// between (another select branch won), comes out whole.
    #[tokio::test]
    async fn a_line_read_in_pieces_survives_a_cancelled_read() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut reader = BufReader::new(rx);
        let mut line = Vec::new();
        tx.write_all(b"{\"jsonrpc\":").await.unwrap();
        let cut =
            tokio::time::timeout(Duration::from_millis(50), read_line(&mut reader, &mut line));
        assert!(
            cut.await.is_err(),
            "nothing whole yet: the read is cancelled"
        );
        tx.write_all(b"\"2.0\"}\nnext\n").await.unwrap();
        let first = read_line(&mut reader, &mut line).await.unwrap();
        assert_eq!(first, Some(Ok("{\"jsonrpc\":\"2.0\"}".to_string())));
        let second = read_line(&mut reader, &mut line).await.unwrap();
        assert_eq!(second, Some(Ok("next".to_string())));
        tx.write_all(b"tail").await.unwrap();
        drop(tx);
        assert_eq!(
            read_line(&mut reader, &mut line).await.unwrap(),
            Some(Ok("tail".into()))
        );
        assert_eq!(read_line(&mut reader, &mut line).await.unwrap(), None);
    }
}
