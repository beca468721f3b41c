//! What a model call is sent: the context (the transcript after the latest
//! summary), and compaction when it nears the model's window.

use super::*;

impl Runtime {
    /// Starts a compaction when one is due (at the threshold), or whenever
    /// there is something to compact (after an overflow, or asked for);
    /// false when none started.
    pub(super) fn start_compaction(&mut self, why: Why) -> bool {
        let compacting = matches!(
            self.turn,
            Some(Turn {
                stage: Stage::Compacting { .. },
                ..
            })
        );
        if compacting {
            return false;
        }
        let Some((context, through)) = self.compaction_plan(why) else {
            return false;
        };
        let call = self.fresh_call();
        let request = ModelRequest {
            model: self.state.model.clone(),
            thinking_level: ThinkingLevel::Off,
            purpose: Purpose::Summarize,
            summary: self.state.summary.as_ref().map(|s| s.text.clone()),
            instructions: self.turn.as_ref().and_then(|t| t.instructions.clone()),
            context,
            approvals: self.state.approvals.effective(self.policy.approvals),
        };
        self.set_stage(Stage::Compacting {
            call,
            text: String::new(),
            through,
        });
        self.bump();
        self.send_snapshot();
        self.out.push(RuntimeOutput::StartModel { call, request });
        true
    }

    /// The items to summarise and the last one's id, as [`Why`] says. `None`
    /// when there is nothing older to summarise.
    pub(super) fn compaction_plan(
        &mut self,
        why: Why,
    ) -> Option<(Arc<Vec<TranscriptItem>>, String)> {
        let window = find_model(&self.models, &self.state.model)
            .ok()?
            .context_window;
        let context = self.context();
        let summary = self
            .state
            .summary
            .as_ref()
            .map_or(0, |s| estimate_text(&s.text));
        if why == Why::Threshold
            && (summary + context_tokens(&context)) * 100 <= window * self.policy.compaction_percent
        {
            return None;
        }
        // After an overflow the window is known to be too small for what is
        // there: keep only the least (the newest item the model is sent).
        let budget = match why {
            Why::Overflow => 0,
            Why::Threshold | Why::Asked => window * self.policy.keep_recent_percent / 100,
        };
        let cut = keep_from(&context, budget);
        let older = context[..cut].to_vec();
        let through = older.last()?.id().to_string();
        Some((Arc::new(older), through))
    }

    /// The transcript the model sees: everything after the summary. Kept
    /// between calls and extended by what was added since, so a call
    /// copies what the turn added, not the history; built again when the
    /// summary moves or items changed out of order.
    pub(super) fn context(&mut self) -> Arc<Vec<TranscriptItem>> {
        let through = self.state.summary.as_ref().map(|s| s.through.as_str());
        let items = &self.state.transcript;
        let cache = &mut self.context;
        let have = cache.start + cache.items.len();
        let added = if cache.stale || cache.through.as_deref() != through || have > items.len() {
            cache.start = match through {
                Some(id) => items.iter().position(|i| i.id() == id).map_or(0, |p| p + 1),
                None => 0,
            };
            cache.through = through.map(str::to_string);
            cache.items = Arc::new(items[cache.start..].to_vec());
            cache.items.len()
        } else {
            Arc::make_mut(&mut cache.items).extend_from_slice(&items[have..]);
            items.len() - have
        };
        // An item still running could change: the next call builds it again.
        cache.stale = cache
            .items
            .iter()
            .rev()
            .take(added)
            .any(|i| !i.is_terminal());
        debug_assert_eq!(
            *cache.items,
            items[cache.start..],
            "the kept context is the transcript's"
        );
        Arc::clone(&cache.items)
    }
}

/// Tokens the model would be sent for `context`: the input and output the
/// provider reported for the newest reply that has usage (what the context
/// up to it cost), plus an estimate of every item after it. Failed and
/// aborted replies are not sent, so they count nothing.
pub(super) fn context_tokens(context: &[TranscriptItem]) -> u64 {
    let reported = context.iter().rposition(
        |item| matches!(item, TranscriptItem::Assistant(a) if a.usage.is_some() && is_sent(a)),
    );
    let (base, rest) = match reported {
        Some(i) => {
            let TranscriptItem::Assistant(a) = &context[i] else {
                unreachable!("found above")
            };
            let usage = a.usage.as_ref().expect("found above");
            let total = usage.input + usage.output + usage.cache_read + usage.cache_write;
            (total.max(usage.total_tokens), &context[i + 1..])
        }
        None => (0, context),
    };
    base + rest.iter().map(estimate_item).sum::<u64>()
}

/// Where the kept part of `context` starts: the newest items whose estimate
/// fits in `budget` tokens, at least the newest one the model is sent (a
/// failed reply after it is not), moved back so that it never starts with a
/// tool result (its call stays with it).
pub(super) fn keep_from(context: &[TranscriptItem], budget: u64) -> usize {
    let newest_sent = context.iter().rposition(|item| match item {
        TranscriptItem::Assistant(a) => is_sent(a),
        _ => true,
    });
    let mut cut = newest_sent.unwrap_or(context.len().saturating_sub(1));
    let mut kept: u64 = context[cut.min(context.len())..]
        .iter()
        .map(estimate_item)
        .sum();
    while cut > 0 {
        let cost = estimate_item(&context[cut - 1]);
        if kept + cost > budget {
            break;
        }
        kept += cost;
        cut -= 1;
    }
    while cut > 0 && matches!(context[cut], TranscriptItem::Tool(_)) {
        cut -= 1;
    }
    cut
}

/// Rough token estimate of a text: four bytes per token.
pub(super) fn estimate_text(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

pub(super) fn estimate_item(item: &TranscriptItem) -> u64 {
    let parts = match item {
        TranscriptItem::User(u) => &u.content,
        TranscriptItem::Assistant(a) if !is_sent(a) => return 0,
        TranscriptItem::Assistant(a) => &a.content,
        TranscriptItem::Tool(t) => &t.content,
    };
    parts
        .iter()
        .map(|c| match c {
            Content::Text { text } => estimate_text(text),
            Content::Thinking { thinking, .. } => estimate_text(thinking),
            Content::Image { .. } => 1000,
            Content::ToolCall { .. } => 50,
        })
        .sum::<u64>()
        + 4
}

/// Adds `more` to `total`, tokens and cost.
pub(super) fn add_usage(total: &mut Usage, more: &Usage) {
    total.input += more.input;
    total.output += more.output;
    total.cache_read += more.cache_read;
    total.cache_write += more.cache_write;
    total.reasoning = match (total.reasoning, more.reasoning) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    total.total_tokens += more.total_tokens;
    let (c, m) = (&mut total.cost, &more.cost);
    c.input += m.input;
    c.output += m.output;
    c.cache_read += m.cache_read;
    c.cache_write += m.cache_write;
    c.total += m.total;
}
