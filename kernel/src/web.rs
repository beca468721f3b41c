//! Who may use the web endpoint: the rules for an HTTP request before it
//! reaches the page or becomes a WebSocket carrying pi protocol v1.
//!
//! The endpoint may be reachable from other machines, and a browser visiting
//! any other site can be made to send requests to it. So:
//!
//! - **`Host` on an allow-list**, against DNS rebinding: a hostile name that
//!   resolves to this machine reaches us with its own name in `Host`.
//! - **`Origin` matching the page's origin** (`scheme://Host`) or an
//!   allow-list, for the socket: a page of another site may open a WebSocket
//!   to any address, and the browser says whose page it is. A request with
//!   no `Origin` is not from a browser page; it still needs the token.
//! - The token is checked in the protocol's hello (the server machine),
//!   never here and never in a URL; failed tokens back off per address there.
//! - `X-Forwarded-*` is believed only from a configured proxy: then the
//!   scheme, host and client address are the proxy's report of them.
//!
//! A pure function of the request's facts; the driver (`io/daemon/src/web/`) only
//! reads the headers and carries out the verdict.

use crate::ids::PeerAddr;

/// The path of the WebSocket.
pub const SOCKET_PATH: &str = "/ws";

/// What is allowed, fixed when the listener is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebPolicy {
    /// `Host` values accepted, lowercase, `host` or `host:port`.
    pub hosts: Vec<String>,
    /// Origins accepted besides the page's own, lowercase `scheme://host[:port]`.
    pub origins: Vec<String>,
    /// Peers whose `X-Forwarded-Proto`, `-Host` and `-For` are believed.
    pub proxies: Vec<PeerAddr>,
    /// Whether the listener itself speaks TLS (the page's scheme is `https`).
    pub tls: bool,
}

/// Where a listener is bound, as the driver read it off its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// The address in canonical text form (`127.0.0.1`, `::`).
    pub ip: String,
    /// Whether it is an IPv6 address (written in brackets before a port).
    pub v6: bool,
    /// Whether it is a loopback or the unspecified address.
    pub local: bool,
    pub port: u16,
}

impl WebPolicy {
    /// The policy of a listener bound at `addr`: its own address, and on a
    /// loopback or unspecified address also `localhost` and the loopback
    /// addresses, each with its port; then `hosts` and `origins` given by the
    /// user (normalised to lowercase).
    pub fn for_listener(
        addr: &ListenAddr,
        tls: bool,
        hosts: &[String],
        origins: &[String],
        proxies: &[PeerAddr],
    ) -> Self {
        let port = addr.port;
        let loopback_names: &[&str] = if addr.local {
            &["localhost", "127.0.0.1", "::1"]
        } else {
            &[]
        };
        let candidates = std::iter::once(host_port(&addr.ip, addr.v6, port))
            .chain(
                loopback_names
                    .iter()
                    .map(|name| host_port(name, name.contains(':'), port)),
            )
            .chain(hosts.iter().map(|h| h.trim().to_ascii_lowercase()));
        let mut allowed: Vec<String> = Vec::new();
        for host in candidates {
            if !allowed.contains(&host) {
                allowed.push(host);
            }
        }
        Self {
            hosts: allowed,
            origins: origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            proxies: proxies.to_vec(),
            tls,
        }
    }
}

fn host_port(host: &str, v6: bool, port: u16) -> String {
    if v6 {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The facts of one request the rules look at.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The connection's peer.
    pub peer: &'a PeerAddr,
    /// The `Host` header.
    pub host: Option<&'a str>,
    /// The `Origin` header.
    pub origin: Option<&'a str>,
    /// `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Forwarded-For`.
    pub forwarded_proto: Option<&'a str>,
    pub forwarded_host: Option<&'a str>,
    pub forwarded_for: Option<&'a str>,
    /// Whether it asks for the socket (as opposed to the page and its assets).
    pub socket: bool,
}

/// A request that may proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The client's address (the proxy's report of it behind a proxy): the
    /// address failed tokens back off by.
    pub client: PeerAddr,
}

/// A refused request: the status and a plain-text reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

/// The first of a header's comma-separated values.
fn first(value: Option<&str>) -> Option<&str> {
    value.and_then(|v| v.split(',').next()).map(str::trim)
}

/// Judges `request` by `policy`.
pub fn admit(policy: &WebPolicy, request: &Request<'_>) -> Result<Admitted, Refusal> {
    let proxied = policy.proxies.contains(request.peer);
    let (scheme, host, client) = if proxied {
        let scheme =
            first(request.forwarded_proto).unwrap_or(if policy.tls { "https" } else { "http" });
        let host = first(request.forwarded_host).or(request.host);
        // The proxy appends the address it saw last: the one it vouches for.
        let client = request
            .forwarded_for
            .and_then(|v| v.rsplit(',').next())
            .and_then(PeerAddr::parse)
            .unwrap_or_else(|| request.peer.clone());
        (scheme.to_ascii_lowercase(), host, client)
    } else {
        let scheme = if policy.tls { "https" } else { "http" };
        (scheme.to_string(), request.host, request.peer.clone())
    };
    let Some(host) = host.map(|h| h.trim().to_ascii_lowercase()) else {
        return Err(refuse(400, "a Host header is required".into()));
    };
    if !policy.hosts.contains(&host) {
        return Err(refuse(
            403,
            format!(
                "Host {host} is not allowed; start the server with --allow-host {host} to allow it"
            ),
        ));
    }
    if request.socket
        && let Some(origin) = request.origin
    {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        let own = format!("{scheme}://{host}");
        if origin != own && !policy.origins.contains(&origin) {
            return Err(refuse(
                403,
                format!(
                    "Origin {origin} is not allowed (the page's origin is {own}); start the server with --allow-origin {origin} to allow it"
                ),
            ));
        }
    }
    Ok(Admitted { client })
}

fn refuse(status: u16, reason: String) -> Refusal {
    Refusal { status, reason }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in
/// any case, one or more spaces after it), which a WebSocket client
/// presents at its upgrade for protocol v8 (whose hello has no token).
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The WebSocket subprotocol of pi protocol v8 from a browser page.
pub const V8_SUBPROTOCOL: &str = "pi.v8";

/// The prefix of the subprotocol entry that carries a browser page's token,
/// base64url without padding: a browser cannot set `Authorization` on a
/// WebSocket, but it can offer subprotocols (`new WebSocket(url, ["pi.v8",
/// "pi.token.<base64url>"])`).
pub const TOKEN_SUBPROTOCOL_PREFIX: &str = "pi.token.";

/// What a WebSocket upgrade presents: its token, and the subprotocol the
/// answer selects (one the client offered; never the token's entry).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Upgrade {
    /// From `Authorization: Bearer`, else from the token's subprotocol entry.
    pub credential: Option<String>,
    /// [`V8_SUBPROTOCOL`] when offered.
    pub protocol: Option<&'static str>,
}

/// Reads an upgrade's `Authorization` and `Sec-WebSocket-Protocol` headers
/// (every value of the latter joined by commas). A token entry that does
/// not decode is no token: the hello then fails as one without.
pub fn upgrade(authorization: Option<&str>, protocols: Option<&str>) -> Upgrade {
    let offered: Vec<&str> = protocols
        .into_iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .collect();
    let from_protocol = || {
        offered
            .iter()
            .find_map(|p| p.strip_prefix(TOKEN_SUBPROTOCOL_PREFIX))
            .and_then(base64url)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .filter(|t| !t.is_empty())
    };
    Upgrade {
        credential: bearer(authorization)
            .map(str::to_owned)
            .or_else(from_protocol),
        protocol: offered.contains(&V8_SUBPROTOCOL).then_some(V8_SUBPROTOCOL),
    }
}

/// base64url without padding (RFC 4648 §5), strictly: `None` for any
/// other character, a dangling sixth of a byte, or bits left over.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'-' => Some(62),
        b'_' => Some(63),
        _ => None,
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        acc = (acc << 6) | u32::from(sextet(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_presents_its_token_as_a_subprotocol_and_is_answered_with_v8() {
        // "s3cret/ü" in base64url: `czNjcmV0L8O8`.
        let up = upgrade(None, Some("pi.v8, pi.token.czNjcmV0L8O8"));
        assert_eq!(up.credential.as_deref(), Some("s3cret/ü"));
        assert_eq!(up.protocol, Some(V8_SUBPROTOCOL));
        // Split over two header values, in any order.
        let up = upgrade(None, Some("pi.token.YWJj,pi.v8"));
        assert_eq!(up.credential.as_deref(), Some("abc"));
        // Authorization wins; no subprotocol offered, none selected.
        let up = upgrade(Some("Bearer xyz"), None);
        assert_eq!(
            up,
            Upgrade {
                credential: Some("xyz".into()),
                protocol: None
            }
        );
        let up = upgrade(Some("Bearer xyz"), Some("pi.token.YWJj"));
        assert_eq!(up.credential.as_deref(), Some("xyz"));
        assert_eq!(up.protocol, None, "the token's entry is never selected");
        // Bad encodings are no token.
        for bad in [
            "pi.token.",
            "pi.token.a",
            "pi.token.YW=j",
            "pi.token.YWJ",
            "pi.token.w_8",
        ] {
            assert_eq!(upgrade(None, Some(bad)).credential, None, "{bad}");
        }
        // Bits left over in the last sextet: not canonical.
        assert_eq!(base64url("YWJk"), Some(b"abd".to_vec()));
        assert_eq!(base64url("YQ"), Some(b"a".to_vec()));
        assert_eq!(base64url("YR"), None);
    }

    #[test]
    fn a_bearer_token_is_read_from_its_header() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer   abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }
    use super::*;

    fn at(ip: &str, port: u16) -> ListenAddr {
        ListenAddr {
            ip: ip.into(),
            v6: false,
            local: ip.starts_with("127.") || ip == "0.0.0.0",
            port,
        }
    }

    fn peer(ip: &str) -> PeerAddr {
        PeerAddr(ip.into())
    }

    fn local() -> WebPolicy {
        WebPolicy::for_listener(&at("127.0.0.1", 8080), false, &[], &[], &[])
    }

    static LOOPBACK: std::sync::LazyLock<PeerAddr> = std::sync::LazyLock::new(|| peer("127.0.0.1"));

    fn req<'a>(host: Option<&'a str>, origin: Option<&'a str>) -> Request<'a> {
        Request {
            peer: &LOOPBACK,
            host,
            origin,
            forwarded_proto: None,
            forwarded_host: None,
            forwarded_for: None,
            socket: true,
        }
    }

    #[test]
    fn the_page_origin_and_loopback_names_are_allowed() {
        let p = local();
        assert_eq!(
            p.hosts,
            ["127.0.0.1:8080", "localhost:8080", "[::1]:8080"],
            "each once"
        );
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            let origin = format!("http://{}", host.to_ascii_lowercase());
            assert!(admit(&p, &req(Some(host), Some(&origin))).is_ok(), "{host}");
        }
        assert!(
            admit(&p, &req(Some("localhost:8080"), None)).is_ok(),
            "no Origin: not a browser page"
        );
    }

    #[test]
    fn a_rebound_host_is_refused() {
        let p = local();
        let r = admit(
            &p,
            &req(Some("evil.example:8080"), Some("http://evil.example:8080")),
        )
        .unwrap_err();
        assert_eq!(r.status, 403);
        assert!(
            r.reason.contains("--allow-host evil.example:8080"),
            "{}",
            r.reason
        );
        assert_eq!(admit(&p, &req(None, None)).unwrap_err().status, 400);
        assert!(
            admit(&p, &req(Some("localhost:9999"), None)).is_err(),
            "another port"
        );
    }

    #[test]
    fn a_foreign_origin_is_refused_for_the_socket_only() {
        let p = local();
        let foreign = req(Some("localhost:8080"), Some("http://evil.example"));
        let r = admit(&p, &foreign).unwrap_err();
        assert_eq!(r.status, 403);
        assert!(
            r.reason.contains("Origin http://evil.example"),
            "{}",
            r.reason
        );
        assert!(
            admit(
                &p,
                &Request {
                    socket: false,
                    ..foreign
                }
            )
            .is_ok(),
            "assets are not secret"
        );
        assert!(
            admit(
                &p,
                &req(Some("localhost:8080"), Some("https://localhost:8080"))
            )
            .is_err(),
            "the scheme is part of the origin"
        );
        let allowed = WebPolicy::for_listener(
            &at("127.0.0.1", 8080),
            false,
            &[],
            &["http://evil.example/".into()],
            &[],
        );
        assert!(admit(&allowed, &foreign).is_ok());
    }

    #[test]
    fn an_unspecified_address_needs_its_names_allowed() {
        let p = WebPolicy::for_listener(
            &at("0.0.0.0", 80),
            false,
            &["Laptop.lan:80".into()],
            &[],
            &[],
        );
        assert!(
            admit(
                &p,
                &req(Some("laptop.lan:80"), Some("http://laptop.lan:80"))
            )
            .is_ok()
        );
        assert!(admit(&p, &req(Some("192.168.1.9:80"), None)).is_err());
    }

    #[test]
    fn forwarded_headers_count_only_from_a_configured_proxy() {
        let proxy = peer("10.0.0.1");
        let p = WebPolicy::for_listener(
            &at("127.0.0.1", 8080),
            false,
            &["pi.example.com".into()],
            &[],
            std::slice::from_ref(&proxy),
        );
        let behind = Request {
            peer: &proxy,
            host: Some("127.0.0.1:8080"),
            origin: Some("https://pi.example.com"),
            forwarded_proto: Some("https"),
            forwarded_host: Some("pi.example.com"),
            forwarded_for: Some("203.0.113.9, 198.51.100.4"),
            socket: true,
        };
        assert_eq!(
            admit(&p, &behind),
            Ok(Admitted {
                client: peer("198.51.100.4")
            })
        );
        let unreadable = Request {
            forwarded_for: Some("unknown"),
            ..behind
        };
        assert_eq!(
            admit(&p, &unreadable).map(|a| a.client),
            Ok(proxy.clone()),
            "an address that does not read as one is not believed"
        );
        let stranger = peer("10.0.0.2");
        let spoofed = Request {
            peer: &stranger,
            ..behind
        };
        assert!(
            admit(&p, &spoofed).is_err(),
            "not a proxy: its X-Forwarded-* are ignored"
        );
    }
}
