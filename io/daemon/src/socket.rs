//! Race-free binding of a Unix socket at a public path.
//!
//! The socket is bound at a private sibling name, made mode 0600, then
//! hard-linked into place: `link(2)` fails if the public path exists, so two
//! servers starting at once cannot both win. Before binding, an existing
//! path is inspected: a non-socket is refused, a socket with a live server
//! behind it is "already running", and a stale socket is removed.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the socket could not be bound.
#[derive(Debug, PartialEq, Eq)]
pub enum BindError {
    /// Something that is not a socket sits at the path.
    NotASocket(PathBuf),
    /// A server answers at the path.
    AlreadyRunning(PathBuf),
    /// Anything else.
    Io(String),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotASocket(p) => write!(
                f,
                "refusing to replace {}: it exists and is not a socket",
                p.display()
            ),
            Self::AlreadyRunning(p) => write!(f, "a server is already running at {}", p.display()),
            Self::Io(e) => f.write_str(e),
        }
    }
}

/// True when a server accepts connections at `path`.
pub fn is_live(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Binds a listening socket at `path` (mode 0600), race-free.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, BindError> {
    let io =
        |what: &str, e: std::io::Error| BindError::Io(format!("{what} {}: {e}", path.display()));
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.to_path_buf()));
        }
        if is_live(path) {
            return Err(BindError::AlreadyRunning(path.to_path_buf()));
        }
        match fs::remove_file(path) {
            Ok(()) => tracing::info!(path = %path.display(), "removed a stale socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("cannot remove stale socket", e)),
        }
    }
    let dir = path
        .parent()
        .ok_or_else(|| BindError::Io(format!("{} has no parent directory", path.display())))?;
    let private = dir.join(format!(
        ".bind-{}-{:x}",
        std::process::id(),
        pi_config::random_u64()
    ));
    let listener =
        std::os::unix::net::UnixListener::bind(&private).map_err(|e| io("cannot bind", e))?;
    let result = (|| {
        fs::set_permissions(&private, fs::Permissions::from_mode(0o600))
            .map_err(|e| io("cannot chmod", e))?;
        match fs::hard_link(&private, path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(BindError::AlreadyRunning(path.to_path_buf()))
            }
            Err(e) => Err(io("cannot link socket into place at", e)),
        }
    })();
    let _ = fs::remove_file(&private);
    result?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("cannot configure", e))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_refuses_live_and_non_sockets_and_replaces_stale() {
        let dir = std::env::temp_dir().join(format!("pi-socket-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let live = bind(&path).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            bind(&path).unwrap_err(),
            BindError::AlreadyRunning(path.clone())
        );
        drop(live);
        let again = bind(&path).expect("a stale socket is replaced");
        drop(again);
        fs::remove_file(&path).unwrap();
        fs::write(&path, "not a socket").unwrap();
        assert_eq!(
            bind(&path).unwrap_err(),
            BindError::NotASocket(path.clone())
        );
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".bind"))
            .collect();
        assert!(leftovers.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
