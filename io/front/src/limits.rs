//! Every bound and wait of the front ends' hosts, in one place (named in
//! `kernel::limits`, whose `ClientLimits` hold the client machine's own).

use std::time::Duration;

/// Answers of a front's calls not yet taken by the front end: the calls on
/// their way are the front's (one prompt, one abort, the steers typed), and
/// a full queue only makes their tasks wait.
pub(crate) const FRONT_ANSWERS: usize = 16;

/// The images of one prompt (`--image`), in bytes: with their base64 they
/// stay well within a frame.
pub(crate) const MAX_PROMPT_IMAGE_BYTES: u64 = 12 * 1024 * 1024;

/// At exit, how long tasks still running (a blocking read of stdin) are
/// waited for.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// `mcp list SESSION` waits this long for servers still starting: a start
/// takes at most `McpLimits::start_timeout` (30 s by default).
pub(crate) const MCP_START_WAIT: Duration = Duration::from_secs(35);

/// How often `mcp list SESSION` reads the recorded states again.
pub(crate) const MCP_STATUS_POLL: Duration = Duration::from_millis(100);

/// The demo waits this long for its server to stop after `SIGTERM`.
pub(crate) const DEMO_STOP_WAIT: Duration = Duration::from_secs(5);

/// How often the demo looks again at its server or a session.
pub(crate) const DEMO_POLL: Duration = Duration::from_millis(10);

/// The demo waits this long for a session's snapshot to catch up.
pub(crate) const DEMO_REVISION_WAIT: Duration = Duration::from_secs(2);

/// The demo waits this long for a reply's deltas.
pub(crate) const DEMO_REPLY_WAIT: Duration = Duration::from_secs(5);

/// Grace period of an auto-started server when `$PI_SERVER_IDLE_EXIT_MS` is unset.
pub(crate) const DEFAULT_IDLE_EXIT_MS: u64 = 1000;

/// How often a starting server's socket is tried.
pub(crate) const START_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How long a starting server may take to answer.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a replacing server may take: the old server has up to 15 s to
/// hand over (`daemon::request_handoff`), then the new one starts.
pub(crate) const REPLACE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one server may take to connect and answer the hello.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How many servers are tried at once.
pub(crate) const PROBE_PARALLELISM: usize = 4;

/// Lines of stdin read and not yet taken; the reading thread waits.
pub(crate) const STDIN_LINES: usize = 16;

/// How often the spinner turns while something runs.
pub(crate) const TICK: Duration = Duration::from_millis(120);

/// Terminal events read and not yet handled; the reading thread waits.
pub(crate) const TERMINAL_EVENTS: usize = 256;

/// The longest line read from the editor: a prompt with embedded files fits
/// well inside, a runaway writer does not take the memory.
pub(crate) const MAX_LINE: usize = 32 << 20;

/// Answers of pi calls waiting for the adapter.
pub(crate) const DONE_QUEUE: usize = 64;
