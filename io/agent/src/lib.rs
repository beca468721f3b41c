//! The real agent back-ends the session worker calls: streaming model
//! providers, the model registry (metadata, keys, custom models) and the
//! coding tools. Nothing here takes a protocol decision: the kernel's
//! [`Runtime`](kernel::runtime::Runtime) decides what to call and what to
//! record; this module carries it out against HTTP servers and the
//! session's working directory and reports what happened.
//!
//! - [`stream`]: one model call against an OpenAI-compatible Chat
//!   Completions server, the OpenAI Responses API or the Anthropic Messages
//!   API, as a sequence of [`ModelEvent`]s ending in exactly one `Done` or
//!   `Failed` (nothing more after a cancellation).
//! - [`registry::ModelRegistry`]: built-in OpenAI and Anthropic models, the
//!   faux models, custom models from `<agentDir>/models.json`, keys from the
//!   environment or `<agentDir>/auth.json`.
//! - [`tools::run_tool`]: `read`, `write`, `edit`, `bash`, `grep`, `find`
//!   and `ls`, run in the session's cwd; [`tools::select_tools`] describes
//!   the ones a session offers (its `tools` setting) to the providers.

mod anthropic;
pub mod context;
pub mod limits;
pub mod mcp;
mod model;
mod openai;
mod prompt;
pub mod registry;
mod responses;
pub mod settings;
mod sse;
mod text;
pub mod tools;
mod transport;

pub use model::{ModelEvent, ModelRequest, Purpose};
pub use registry::{Api, ModelRegistry, ProviderConfig, Timeouts};
pub use rmcp;
pub use tokio_util::sync::CancellationToken;
pub use tools::{ToolOutcome, ToolSpec, reap_tool_groups, run_tool, run_tool_in, tool_specs};

use tokio::sync::mpsc;

/// Runs one model call and sends its events to `events`.
///
/// Exactly one terminal event (`Done` or `Failed`) is sent, last — unless
/// `cancel` fires or the receiver is dropped, in which case the call stops at
/// once, drops the HTTP connection and sends nothing more. Every wait is
/// bounded by the provider's [`Timeouts`].
pub async fn stream(
    provider: &ProviderConfig,
    request: &ModelRequest,
    events: mpsc::Sender<ModelEvent>,
    cancel: CancellationToken,
) {
    let sink = transport::Sink::new(events, cancel);
    let outcome = match provider.api {
        Api::OpenAiCompletions => openai::run(provider, request, &sink).await,
        Api::AnthropicMessages => anthropic::run(provider, request, &sink).await,
        Api::OpenAiResponses => responses::run(provider, request, &sink).await,
    };
    if let Err(transport::Stop::Failed(failure)) = outcome {
        let _ = sink.send(failure.into_event()).await;
    }
}
