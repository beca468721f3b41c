//! pi-server's configuration on disk, read by the daemon and by every front
//! end: where things live and making those places safe to use, the agent
//! directory's `settings.json` ([`settings`]), what `serve` is told
//! ([`ServeOptions`]), and the JSON form of kernel values ([`json`]).
//!
//! - server dir: `--server-dir`, else `$PI_SERVER_DIR`, else `~/.pi/server`;
//!   mode 0700, owned by the current user.
//! - server id: `--server-id`, else `$PI_SERVER_ID`, else the file
//!   `<serverDir>/default-server-id` (a lowercase UUIDv4, created exclusively, 0600).
//! - public socket: `<serverDir>/<serverId>.sock`, mode 0600.
//! - session dir: `--session-dir`, else `$PI_CODING_AGENT_DIR/sessions`, else
//!   `~/.pi/agent/sessions`.

pub mod json;
pub mod settings;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A configuration problem, shown to the user as is.
pub type ConfigError = String;

/// What a server is told to do: the `serve` command's options, checked.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Private directory holding sockets and ids.
    pub server_dir: PathBuf,
    /// This server's id (lowercase UUIDv4).
    pub server_id: String,
    /// Where sessions are stored.
    pub session_dir: PathBuf,
    /// Token clients must send in hello, if any.
    pub token: Option<String>,
    /// Retire after this long without clients and sessions (auto-started servers).
    pub idle_exit: Option<std::time::Duration>,
    /// Also accept remote clients on this TCP address (`host:port`). Needs a token.
    pub listen_tcp: Option<String>,
    /// Also serve the web client and its WebSocket on this TCP address
    /// (`host:port`). Needs a token.
    pub listen_web: Option<String>,
    /// Who may use the web listener besides its own address.
    pub web_access: WebAccess,
}

/// The user's additions to the web listener's rules ([`kernel::web::WebPolicy`]).
#[derive(Debug, Clone, Default)]
pub struct WebAccess {
    /// `Host` values accepted besides the listener's own.
    pub hosts: Vec<String>,
    /// Page origins accepted besides the served page's own.
    pub origins: Vec<String>,
    /// Reverse proxies whose `X-Forwarded-*` headers are believed.
    pub proxies: Vec<std::net::IpAddr>,
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The server directory.
pub fn server_dir(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| env_path("PI_SERVER_DIR"))
        .unwrap_or_else(|| home().join(".pi/server"))
}

/// The agent directory (settings, auth, models, default sessions).
pub fn agent_dir() -> PathBuf {
    env_path("PI_CODING_AGENT_DIR").unwrap_or_else(|| home().join(".pi/agent"))
}

/// The session directory.
pub fn session_dir(flag: Option<PathBuf>) -> PathBuf {
    flag.unwrap_or_else(|| agent_dir().join("sessions"))
}

/// The public socket of a server.
pub fn socket_path(server_dir: &Path, server_id: &str) -> PathBuf {
    server_dir.join(format!("{server_id}.sock"))
}

/// The socket workers connect to.
pub fn worker_socket_path(server_dir: &Path, server_id: &str) -> PathBuf {
    server_dir.join(format!("{server_id}.workers.sock"))
}

/// Creates `dir` (and parents) private to this user (mode 0700), or checks
/// it: it must be a directory owned by the current user and closed to
/// others. An existing directory is never chmod-ed behind the user's back:
/// one open to others is refused, with the command that fixes it.
pub fn ensure_private_dir(dir: &Path) -> Result<(), ConfigError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
    }
    let meta =
        fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} exists and is not a directory", dir.display()));
    }
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid {
        return Err(format!(
            "refusing to use {}: it is owned by uid {}, not by you (uid {uid})",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "refusing to use {}: it is open to other users (mode {:o}); make it private with `chmod 700 {}`",
            dir.display(),
            meta.mode() & 0o777,
            dir.display()
        ));
    }
    Ok(())
}

/// The program a server starts its workers from: this very build, even
/// after its file was replaced or removed (an upgrade while it runs), since
/// a worker must speak the server's worker protocol. On Linux that is
/// `/proc/self/exe`, which names the running image, not the path;
/// elsewhere the path it was started from.
pub fn this_program() -> std::io::Result<PathBuf> {
    let image = Path::new("/proc/self/exe");
    if image.exists() {
        return Ok(image.to_owned());
    }
    std::env::current_exe()
}

/// Fills `buf` from the operating system's CSPRNG (`getrandom(2)`), with
/// no fallback: a secret is never drawn from anything weaker.
pub fn entropy(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "cannot read the operating system's entropy (getrandom): {e}"
                )));
            }
        }
    }
    Ok(())
}

/// A secret: 256 bits from [`entropy`], as 64 hex digits. Worker channel
/// tokens are secrets; nothing else here is.
pub fn secret() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    entropy(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// 64 bits for what is not a secret (the kernel's id seed, unique file
/// names): from [`entropy`], else time and pid (unique, just guessable).
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if entropy(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// A fresh lowercase UUIDv4: an id, not a secret (seeded by [`random_u64`]).
pub fn new_uuid() -> String {
    kernel::rng::Rng::new(random_u64()).uuid_v4()
}

/// The server id: the flag, else `$PI_SERVER_ID`, else `default-server-id`
/// in the server dir (created on first use).
pub fn server_id(flag: Option<String>, server_dir: &Path) -> Result<String, ConfigError> {
    let given = flag.or_else(|| std::env::var("PI_SERVER_ID").ok().filter(|s| !s.is_empty()));
    if let Some(id) = given {
        return check_server_id(id);
    }
    let file = server_dir.join("default-server-id");
    let fresh = new_uuid();
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
    {
        Ok(mut f) => {
            f.write_all(format!("{fresh}\n").as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
            Ok(fresh)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            check_server_id(text.trim().to_string()).map_err(|e| format!("{}: {e}", file.display()))
        }
        Err(e) => Err(format!("cannot create {}: {e}", file.display())),
    }
}

fn check_server_id(id: String) -> Result<String, ConfigError> {
    if kernel::rng::is_uuid_v4(&id) {
        Ok(id)
    } else {
        Err(format!(
            "invalid server id {id:?}: expected a lowercase UUIDv4 such as 01234567-89ab-4def-8123-456789abcdef"
        ))
    }
}

/// Reads a token file (trimmed); it must not be empty.
pub fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_256_bits_from_the_csprng_and_never_repeats() {
        let (a, b) = (secret().unwrap(), secret().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pi-config-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn private_dir_is_created_and_an_open_one_refused() {
        let dir = scratch("private");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let refused = ensure_private_dir(&dir).unwrap_err();
        assert!(refused.contains("chmod 700"), "{refused}");
        assert_eq!(
            fs::metadata(&dir).unwrap().mode() & 0o777,
            0o755,
            "left as it was"
        );
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let file = dir.join("f");
        fs::write(&file, "x").unwrap();
        assert!(
            ensure_private_dir(&file)
                .unwrap_err()
                .contains("not a directory")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_server_id_is_created_once() {
        let dir = scratch("id");
        ensure_private_dir(&dir).unwrap();
        let a = server_id(None, &dir).unwrap();
        let b = server_id(None, &dir).unwrap();
        assert_eq!(a, b);
        assert!(kernel::rng::is_uuid_v4(&a));
        assert_eq!(
            fs::metadata(dir.join("default-server-id")).unwrap().mode() & 0o777,
            0o600
        );
        assert!(server_id(Some("nope".into()), &dir).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
