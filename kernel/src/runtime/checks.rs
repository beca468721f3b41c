//! The runtime's invariants, checked after every step (its transcript's
//! tail in release builds, all of it at open and at a turn's end).

use super::*;

impl Runtime {
    /// The invariants outside the transcript, checked by both
    /// [`Runtime::check_invariants`] and [`Runtime::check_tail`].
    pub(super) fn check_settings(&self) {
        if !matches!(
            self.turn,
            Some(Turn {
                stage: Stage::Streaming { .. },
                ..
            })
        ) {
            assert!(
                self.unsaved.is_none(),
                "unsaved text only while a reply streams"
            );
        }
        let s = &self.state;
        // A question waits exactly while its tool call is held for it.
        match &self.turn {
            Some(Turn {
                stage:
                    Stage::Tools {
                        running,
                        asking: true,
                        ..
                    },
                ..
            }) => assert!(
                s.approvals.pending.len() == 1 && s.approvals.pending[0].id == *running,
                "the held tool call has the one question"
            ),
            _ => assert!(
                s.approvals.pending.is_empty(),
                "no question waits unless a tool call is held for it"
            ),
        }
        let meta = self
            .models
            .iter()
            .find(|m| m.provider == s.model.provider && m.id == s.model.id);
        if let Some(meta) = meta {
            assert!(
                meta.supported_thinking_levels.contains(&s.thinking_level),
                "unsupported thinking level"
            );
        }
    }

    /// Asserts the runtime's invariants over the whole transcript. Runs at
    /// the end of every step in debug builds (every test and the
    /// simulator); in release builds at open and at the end of each turn.
    /// [`Runtime::check_tail`] runs after every step in both.
    pub(super) fn check_invariants(&self) {
        self.check_settings();
        let s = &self.state;
        let streaming = s.transcript.iter().filter(|i| is_streaming(i)).count();
        let running: Vec<&str> = s
            .transcript
            .iter()
            .filter(|i| is_running(i))
            .map(TranscriptItem::id)
            .collect();
        match self.turn.as_ref().map(|t| &t.stage) {
            None => {
                assert!(
                    streaming == 0 && running.is_empty(),
                    "nothing runs while idle"
                );
                assert!(s.queued_steer.is_empty(), "steer only queues during a turn");
            }
            Some(Stage::Streaming { item, .. }) => {
                assert_eq!(streaming, 1, "one reply streams");
                assert_eq!(*item, s.transcript.len() - 1, "the streaming item is last");
                assert!(running.is_empty(), "no tool runs while the model streams");
            }
            Some(Stage::Tools {
                running: r,
                waiting,
                ..
            }) => {
                assert_eq!(streaming, 0);
                check_running_tools(&running, r, waiting.len());
            }
            Some(Stage::Retrying { .. } | Stage::Compacting { .. }) => {
                assert!(
                    streaming == 0 && running.is_empty(),
                    "nothing streams while waiting"
                );
            }
        }
    }

    /// [`Runtime::check_invariants`] for what a step can touch, in release
    /// builds: a step only appends items, or changes the streaming reply or
    /// a running tool, and those are the transcript's tail (the streaming
    /// reply is the last item; a reply's tool items follow it, all at once).
    /// The full scan after every step made a turn cost O(transcript): 79 %
    /// of a worker's CPU at 15,000 items (BENCHMARKS.md, the soak).
    pub(super) fn check_tail(&self) {
        self.check_settings();
        let s = &self.state;
        let last = s.transcript.last();
        match self.turn.as_ref().map(|t| &t.stage) {
            None | Some(Stage::Retrying { .. } | Stage::Compacting { .. }) => {
                assert!(
                    !last.is_some_and(|i| is_streaming(i) || is_running(i)),
                    "nothing runs while idle or waiting"
                );
                if self.turn.is_none() {
                    assert!(s.queued_steer.is_empty(), "steer only queues during a turn");
                }
            }
            Some(Stage::Streaming { item, .. }) => {
                assert_eq!(*item + 1, s.transcript.len(), "the streaming item is last");
                assert!(last.is_some_and(is_streaming), "one reply streams");
                let before = s.transcript.len().checked_sub(2).map(|i| &s.transcript[i]);
                assert!(
                    !before.is_some_and(|i| is_streaming(i) || is_running(i)),
                    "no tool runs while the model streams"
                );
            }
            Some(Stage::Tools {
                running: r,
                waiting,
                ..
            }) => {
                let tools = s
                    .transcript
                    .iter()
                    .rev()
                    .take_while(|i| matches!(i, TranscriptItem::Tool(_)));
                let running: Vec<&str> = tools
                    .filter(|i| is_running(i))
                    .map(TranscriptItem::id)
                    .collect();
                check_running_tools(&running, r, waiting.len());
                let reply = s
                    .transcript
                    .iter()
                    .rev()
                    .find(|i| !matches!(i, TranscriptItem::Tool(_)));
                assert!(
                    !reply.is_some_and(is_streaming),
                    "no reply streams while tools run"
                );
            }
        }
    }
}

/// While tools run: the ids of the running tool items hold the one running
/// now and one for each tool still waiting, no more.
pub(super) fn check_running_tools(running: &[&str], now: &str, waiting: usize) {
    assert!(running.contains(&now), "the running tool item is running");
    assert_eq!(
        running.len(),
        waiting + 1,
        "exactly the pending tools are running"
    );
}
