//! `pi-server attach` in a real pseudo-terminal: keys are written to the pty
//! as a terminal would send them, and the screen is read back through a
//! terminal emulator (vt100). Every assertion is on the screen's text.

mod durable_common;

use durable_common::*;
use kernel::protocol::CreateParams;
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `pi-server <args>` on a pty of 100×30, with the screen it draws.
struct Tui {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    writer: Box<dyn Write + Send>,
    parser: Arc<Mutex<vt100::Parser>>,
    _master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Tui {
    fn spawn(env: &Env, args: &[&str]) -> Self {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: 30,
                cols: 100,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("open a pty");
        let mut cmd = CommandBuilder::new(BIN);
        cmd.args(args);
        cmd.cwd(&env.root);
        let (set, removed) = env.environment();
        for name in removed {
            cmd.env_remove(name);
        }
        for (name, value) in set {
            cmd.env(name, value);
        }
        cmd.env("TERM", "xterm-256color");
        let child = pty.slave.spawn_command(cmd).expect("spawn in the pty");
        drop(pty.slave);
        let parser = Arc::new(Mutex::new(vt100::Parser::new(
            std::num::NonZero::new(30).expect("rows"),
            std::num::NonZero::new(100).expect("columns"),
            0,
        )));
        let mut reader = pty.master.try_clone_reader().expect("pty reader");
        let feed = Arc::clone(&parser);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                feed.lock().unwrap().process(&buf[..n]);
            }
        });
        let writer = pty.master.take_writer().expect("pty writer");
        Self {
            child,
            writer,
            parser,
            _master: pty.master,
        }
    }

    fn screen(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    fn send(&mut self, bytes: &str) {
        self.writer
            .write_all(bytes.as_bytes())
            .expect("write to the pty");
        self.writer.flush().expect("flush the pty");
    }

    /// Types `text` a key at a time, as a person does.
    fn type_text(&mut self, text: &str) {
        for c in text.chars() {
            self.send(c.encode_utf8(&mut [0; 4]));
        }
    }

    /// Waits until the screen satisfies `test`; panics with the screen after `timeout`.
    fn wait(&self, what: &str, timeout: Duration, test: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if test(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for(&self, text: &str) -> String {
        self.wait(&format!("{text:?}"), SOON, |s| s.contains(text))
    }

    /// Waits for `attach` to exit, and checks that it exited 0.
    fn exits_cleanly(&mut self) {
        let deadline = Instant::now() + SOON;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "attach did not exit:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "attach exited {status:?}");
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

const LONG: &str =
    "please write a long answer with many many words so that the turn keeps running for a while";

#[test]
fn attach_in_a_terminal_prompts_steers_pastes_aborts_survives_a_restart_and_detaches() {
    let mut env = Env::new("tui");
    env.var("PI_FAUX_DELAY_MS", "60");
    let id = uuid();
    let mut server = env.serve(&id, &[]);
    let session = env
        .connect(&id)
        .create(CreateParams {
            cwd: Some("/".into()),
            ..CreateParams::default()
        })
        .id;
    let mut tui = Tui::spawn(&env, &["--server-id", &id, "attach", &session]);
    tui.wait_for("prompt ›");

    // A prompt, then a steer while it runs: the input box says which first.
    tui.type_text(LONG);
    tui.send("\r");
    tui.wait_for("steer ›");
    tui.wait_for("You said:");
    tui.type_text("and mention steering");
    tui.send("\r");
    let screen = tui.wait("the steer taken into the turn", SOON, |s| {
        s.contains("› and mention steering") && s.contains("You said: and mention steering")
    });
    assert!(screen.contains(&format!("› {}", &LONG[..40])), "{screen}");
    tui.wait_for("prompt ›");

    // A bracketed paste of three lines is one message.
    tui.send("\x1b[200~line one\nline two\nline three\x1b[201~");
    tui.send("\r");
    let screen = tui.wait("the pasted message answered", SOON, |s| {
        s.contains("You said: line one") && s.contains("prompt ›")
    });
    assert!(
        screen.contains("› line one\n  line two\n  line three"),
        "{screen}"
    );
    assert!(
        !screen.contains("› line two"),
        "one message, not three:\n{screen}"
    );

    // Ctrl-C aborts the running turn, and says so once.
    tui.type_text(LONG);
    tui.send("\r");
    tui.wait_for("steer ›");
    tui.send("\x03");
    let screen = tui.wait_for("turn aborted");
    assert_eq!(screen.matches("turn aborted").count(), 1, "{screen}");
    tui.wait_for("prompt ›");

    // The server is killed: the UI says so, and comes back with a new one.
    signal(server.pid(), "KILL");
    server.wait_exit(SOON);
    tui.wait_for("reconnecting");
    let _server = env.serve(&id, &[]);
    tui.wait("the reconnection", Duration::from_secs(20), |s| {
        s.contains("reconnected")
    });
    tui.type_text("still there?");
    tui.send("\r");
    tui.wait_for("You said: still there?");
    tui.wait_for("prompt ›");

    // Ctrl-D on an empty input detaches.
    tui.send("\x04");
    tui.exits_cleanly();
    tui.wait_for("detached from session");
}

/// Slash commands in the terminal: an unknown one is not sent, `//` escapes,
/// Tab completes, `/model`, `/thinking` and `/name` change the session for
/// every client, `/new` and `/sessions` switch sessions, `/export` writes
/// the transcript, Esc aborts a turn, `/quit` detaches.
#[test]
fn slash_commands_change_the_session_switch_and_export() {
    let mut env = Env::new("tui-slash");
    env.var("PI_FAUX_DELAY_MS", "30");
    let id = uuid();
    let _server = env.serve(&id, &[]);
    let mut other = env.connect(&id);
    let session = other
        .create(CreateParams {
            cwd: Some("/".into()),
            ..CreateParams::default()
        })
        .id;
    let mut tui = Tui::spawn(&env, &["--server-id", &id, "attach", &session]);
    tui.wait_for("prompt ›");

    tui.type_text("/frobnicate");
    tui.send("\r");
    tui.wait_for("unknown command /frobnicate");
    tui.send("\x15"); // Ctrl-U: the line came back into the input
    tui.type_text("//slash as text");
    tui.send("\r");
    tui.wait_for("You said: /slash as text");
    tui.wait_for("prompt ›");

    tui.type_text("/help");
    tui.send("\r");
    tui.wait_for("/thinking [LEVEL]");

    tui.type_text("/mo");
    tui.send("\t");
    tui.wait_for("│/model ");
    tui.type_text("faux/faux-reasoner");
    tui.send("\r");
    tui.wait_for("done: /model faux/faux-reasoner");
    tui.type_text("/thinking high");
    tui.send("\r");
    tui.wait_for("done: /thinking high");
    tui.type_text("/name slashed");
    tui.send("\r");
    tui.wait_for("done: /name slashed");
    let seen = other.attach(&session);
    assert_eq!(
        (
            seen.model.id.as_str(),
            seen.thinking_level.as_str(),
            seen.name.as_deref()
        ),
        ("faux-reasoner", "high", Some("slashed")),
        "another client sees the settings"
    );

    // Esc aborts a running turn.
    tui.type_text(LONG);
    tui.send("\r");
    tui.wait_for("steer ›");
    tui.send("\x1b");
    tui.wait_for("turn aborted");
    tui.wait_for("prompt ›");

    tui.type_text("/export");
    tui.send("\r");
    tui.wait_for("transcript written to slashed.md");
    let exported = std::fs::read_to_string(env.root.join("slashed.md")).expect("exported");
    assert!(
        exported.contains("› //slash as text") || exported.contains("› /slash as text"),
        "{exported}"
    );

    // A new session in the same directory, then back by name.
    tui.type_text("/new");
    tui.send("\r");
    tui.wait("the new session's empty screen", SOON, |s| {
        !s.contains("slash as text") && s.contains("prompt ›")
    });
    tui.type_text("/sessions");
    tui.send("\r");
    let listed = tui.wait_for("NAME-OR-ID");
    assert!(listed.contains("slashed"), "{listed}");
    tui.type_text("/sessions slashed");
    tui.send("\r");
    tui.wait_for("You said: /slash as text");

    tui.type_text("/quit");
    tui.send("\r");
    tui.exits_cleanly();
}

/// The pids of this world's `pi-server serve` processes.
fn servers(env: &Env) -> Vec<u32> {
    env.processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"serve"))
        })
        .collect()
}

/// A server the CLI started, killed under an attached terminal: the UI
/// starts it again (as every client command would) and says so, and the
/// session goes on.
#[test]
fn the_terminal_starts_its_crashed_server_again() {
    let mut env = Env::new("tui-restart");
    env.var("PI_FAUX_DELAY_MS", "5");
    let created = env.run(&["create", "--cwd", "/", "--name", "phoenix"]);
    created.ok();
    let mut tui = Tui::spawn(&env, &["attach", "phoenix"]);
    tui.wait_for("prompt ›");
    let [server] = servers(&env)[..] else {
        panic!("one server: {:?}", servers(&env));
    };
    signal(server, "KILL");
    tui.wait("the restart", Duration::from_secs(20), |s| {
        s.contains("starting a server") || s.contains("reconnected")
    });
    tui.wait("the reconnection", Duration::from_secs(20), |s| {
        s.contains("reconnected")
    });
    let after = servers(&env);
    assert!(
        after.len() == 1 && after[0] != server,
        "a new server: {after:?}"
    );
    tui.type_text("still here?");
    tui.send("\r");
    tui.wait_for("You said: still here?");
}

/// A session longer than `--history`: PageUp past the oldest turn shown
/// pages the earlier ones in; Alt-Up selects the tool call and Ctrl-O shows
/// its whole output.
#[test]
fn earlier_turns_page_in_and_one_tool_output_expands() {
    let mut env = Env::new("tui-paging");
    env.var("PI_FAUX_DELAY_MS", "0");
    let id = uuid();
    let _server = env.serve(&id, &[]);
    let mut other = env.connect(&id);
    let session = other
        .create(CreateParams {
            cwd: Some("/".into()),
            ..CreateParams::default()
        })
        .id;
    let prompt = |other: &mut Conn, text: &str| {
        let command = kernel::protocol::Command::Prompt {
            session_id: session.clone(),
            text: text.into(),
        };
        other.request(command).expect("the turn ends");
    };
    for i in 0..12 {
        prompt(&mut other, &format!("question {i:02}"));
    }
    prompt(&mut other, "!seq 101 120");
    let mut tui = Tui::spawn(&env, &["--server-id", &id, "attach", &session]);
    let cut = tui.wait_for("more lines");
    assert!(!cut.contains("question 00"), "{cut}");
    assert!(!cut.contains("119"), "cut to its first lines: {cut}");

    tui.send("\x1b[1;3A"); // Alt-Up: the newest tool call
    tui.send("\x0f"); // Ctrl-O: its whole output
    tui.wait("the whole output", SOON, |s| {
        s.contains("119") && !s.contains("more lines")
    });

    // Scrolling up reaches the oldest turn shown and says what is left,
    // then pages in the rest.
    let mut told = false;
    let deadline = Instant::now() + SOON;
    while !tui.screen().contains("question 00") {
        told |= tui.screen().contains("3 earlier turns (PageUp loads them)");
        assert!(
            Instant::now() < deadline,
            "never paged in:\n{}",
            tui.screen()
        );
        tui.send("\x1b[5~"); // PageUp
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        told,
        "the notice of the turns not loaded showed on the way up"
    );
    tui.send("\x04");
    tui.exits_cleanly();
}

/// A server replaced gracefully (a new one with its id hands over) while a
/// turn streams: the terminal reconnects, is attached to its session again,
/// shows the whole reply once, and takes the next prompt.
#[test]
fn the_terminal_follows_its_session_across_a_graceful_replacement() {
    let mut env = Env::new("tui-handover");
    env.var("PI_FAUX_DELAY_MS", "40");
    let id = uuid();
    let mut old = env.serve(&id, &[]);
    let session = env
        .connect(&id)
        .create(CreateParams {
            cwd: Some("/".into()),
            ..CreateParams::default()
        })
        .id;
    let mut tui = Tui::spawn(&env, &["--server-id", &id, "attach", &session]);
    tui.wait_for("prompt ›");
    tui.type_text("one two three four five six seven eight nine ten eleven twelve");
    tui.send("\r");
    tui.wait_for("You said:");
    let _new = env.serve(&id, &[]);
    assert!(old.wait_exit(SOON).success(), "the old server handed over");
    let screen = tui.wait("the reply, once, after the hand-over", SOON, |s| {
        s.contains("word by word.") && s.contains("prompt ›")
    });
    assert_eq!(screen.matches("You said: one two").count(), 1, "{screen}");
    tui.type_text("still attached?");
    tui.send("\r");
    tui.wait_for("You said: still attached?");
}

/// Approvals in the terminal: `/approvals ask` sets the policy; a tool
/// call's question is shown with the keys that answer it; `n` denies it
/// (the model is told) and `y` allows the next one, which runs.
#[test]
fn a_tool_calls_question_is_shown_and_answered_with_a_key() {
    let env = Env::new("tui-ask");
    let id = uuid();
    let _server = env.serve(&id, &[]);
    let mut other = env.connect(&id);
    let session = other
        .create(CreateParams {
            cwd: Some("/".into()),
            ..CreateParams::default()
        })
        .id;
    let mut tui = Tui::spawn(&env, &["--server-id", &id, "attach", &session]);
    tui.wait_for("prompt ›");
    tui.type_text("/approvals ask");
    tui.send("\r");
    tui.wait_for("done: /approvals ask");
    tui.type_text("!echo from-the-tui");
    tui.send("\r");
    tui.wait_for("approve?");
    tui.wait_for("$ echo from-the-tui");
    tui.send("n");
    tui.wait_for("tool failed: Denied");
    tui.wait_for("prompt ›");
    tui.type_text("!echo allowed-now");
    tui.send("\r");
    tui.wait_for("$ echo allowed-now");
    tui.send("y");
    tui.wait_for("tool finished: allowed-now");
}
