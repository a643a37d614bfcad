//! What name a connection's first bytes carry: the server name of a TLS
//! ClientHello (SNI), or the `Host` of an HTTP/1 request. Nothing else is
//! read; the bytes go on to the server unchanged.

use crate::config::normalize_host;

/// The most bytes read before deciding: a ClientHello (post-quantum key
/// shares included) or a request head fits; a longer one is refused.
pub const MAX_SNIFF_BYTES: usize = 16 << 10;

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// Not complete yet: read more.
    More,
    /// A TLS ClientHello or HTTP request naming this host.
    Name(Proto, String),
    /// TLS or HTTP without a host name (an address, or none at all).
    Nameless(Proto),
    /// Neither TLS nor HTTP.
    Opaque,
    /// Starts as TLS or HTTP but is not well formed.
    Malformed(Proto),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tls,
    Http,
}

/// Read `buf`, the first bytes the client sent.
pub fn sniff(buf: &[u8]) -> Sniff {
    match buf.first() {
        None => Sniff::More,
        Some(0x16) => tls(buf),
        Some(b) if b.is_ascii_uppercase() => http(buf),
        Some(_) => Sniff::Opaque,
    }
}

/// The TLS records' handshake bytes, joined, once the first handshake
/// message is whole: `None` for more to read, `Err` if malformed.
fn handshake(buf: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    let mut hs = Vec::new();
    let mut at = 0;
    loop {
        let Some(head) = buf.get(at..at + 5) else {
            return Ok(None);
        };
        if head[0] != 0x16 || head[1] != 0x03 {
            return Err(());
        }
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if len == 0 {
            return Err(());
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            return Ok(None);
        };
        hs.extend_from_slice(body);
        at += 5 + len;
        if hs.len() >= 4 {
            let need =
                4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
            if hs.len() >= need {
                hs.truncate(need);
                return Ok(Some(hs));
            }
        }
    }
}

fn tls(buf: &[u8]) -> Sniff {
    match handshake(buf) {
        Ok(None) if buf.len() >= MAX_SNIFF_BYTES => Sniff::Malformed(Proto::Tls),
        Ok(None) => Sniff::More,
        Err(()) => Sniff::Malformed(Proto::Tls),
        Ok(Some(hs)) => match client_hello_sni(&hs) {
            Ok(Some(name)) => match normalize_host(&name) {
                Some(n) => Sniff::Name(Proto::Tls, n),
                None => Sniff::Malformed(Proto::Tls),
            },
            Ok(None) => Sniff::Nameless(Proto::Tls),
            Err(()) => Sniff::Malformed(Proto::Tls),
        },
    }
}

/// A cursor over a ClientHello.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ()> {
        if self.0.len() < n {
            return Err(());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<usize, ()> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, ()> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The `host_name` of a ClientHello's `server_name` extension (RFC 6066).
/// Two such extensions, or two names, are malformed (RFC 8446 forbids
/// both; a server and the check could otherwise read different ones).
fn client_hello_sni(hs: &[u8]) -> Result<Option<String>, ()> {
    let mut r = Reader(hs);
    if r.u8()? != 1 {
        return Err(()); // not a ClientHello
    }
    r.take(3)?; // length, already checked
    r.take(2 + 32)?; // version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Ok(None); // no extensions
    }
    let mut exts = Reader(r.vec16()?);
    let mut found: Option<String> = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let body = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        if found.is_some() {
            return Err(());
        }
        let mut list = Reader(Reader(body).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                if found.is_some() {
                    return Err(());
                }
                found = Some(String::from_utf8(name.to_vec()).map_err(|_| ())?);
            }
        }
        if found.is_none() {
            return Err(());
        }
    }
    Ok(found)
}

fn http(buf: &[u8]) -> Sniff {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= MAX_SNIFF_BYTES => {
            Sniff::Malformed(Proto::Http)
        }
        Ok(httparse::Status::Partial) => {
            // A method token not yet followed by a space may still be
            // something else.
            Sniff::More
        }
        Ok(httparse::Status::Complete(_)) => {
            // A proxy's request (CONNECT, or an absolute URL a server may
            // route by instead of `Host`) is not a server's.
            let path = req.path.unwrap_or("");
            if req.method == Some("CONNECT") || !path.starts_with('/') && path != "*" {
                return Sniff::Malformed(Proto::Http);
            }
            let mut hosts = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"));
            let (Some(host), None) = (hosts.next(), hosts.next()) else {
                // None, or two (a server and the check could read
                // different ones).
                return Sniff::Malformed(Proto::Http);
            };
            let Ok(host) = std::str::from_utf8(host.value) else {
                return Sniff::Malformed(Proto::Http);
            };
            let host = host.trim();
            if host.starts_with('[') {
                return Sniff::Nameless(Proto::Http);
            }
            let bare = match host.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
                _ => host,
            };
            match normalize_host(bare) {
                Some(n) => Sniff::Name(Proto::Http, n),
                None if bare.parse::<std::net::Ipv4Addr>().is_ok() => Sniff::Nameless(Proto::Http),
                None => Sniff::Malformed(Proto::Http),
            }
        }
        Err(_) if looks_like_method(buf) => Sniff::Malformed(Proto::Http),
        Err(_) => Sniff::Opaque,
    }
}

/// An uppercase token then a space: an HTTP request line's start.
fn looks_like_method(buf: &[u8]) -> bool {
    let token: Vec<u8> = buf
        .iter()
        .copied()
        .take_while(u8::is_ascii_uppercase)
        .collect();
    (3..=10).contains(&token.len()) && buf.get(token.len()) == Some(&b' ')
}

/// What a refused TLS client reads: a fatal `access_denied` alert.
pub const TLS_ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// Refuse a TLS client with [`TLS_ACCESS_DENIED`] and close.
pub async fn refuse_tls(mut client: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    let _ = client.write_all(&TLS_ACCESS_DENIED).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record naming `names` in one extension (or
    /// `exts` of them).
    fn hello(names: &[&str], exts: usize) -> Vec<u8> {
        let mut ext = Vec::new();
        for _ in 0..exts {
            let mut list = Vec::new();
            for n in names {
                list.push(0u8);
                list.extend((n.len() as u16).to_be_bytes());
                list.extend(n.as_bytes());
            }
            let mut body = (list.len() as u16).to_be_bytes().to_vec();
            body.extend(list);
            ext.extend(0u16.to_be_bytes());
            ext.extend((body.len() as u16).to_be_bytes());
            ext.extend(body);
        }
        let mut ch = vec![0x03, 0x03];
        ch.extend([7u8; 32]);
        ch.push(0); // session id
        ch.extend([0, 2, 0x13, 0x01]); // one suite
        ch.extend([1, 0]); // null compression
        ch.extend((ext.len() as u16).to_be_bytes());
        ch.extend(ext);
        let mut hs = vec![1u8];
        hs.extend(&(ch.len() as u32).to_be_bytes()[1..]);
        hs.extend(ch);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn a_client_hello_names_its_server_even_split_over_reads() {
        let h = hello(&["Allowed.Test"], 1);
        assert_eq!(sniff(&h), Sniff::Name(Proto::Tls, "allowed.test".into()));
        for cut in [1, 5, 20, h.len() - 1] {
            assert_eq!(sniff(&h[..cut]), Sniff::More, "{cut}");
        }
        assert_eq!(sniff(&hello(&[], 0)), Sniff::Nameless(Proto::Tls));
    }

    #[test]
    fn two_names_or_two_extensions_are_malformed() {
        assert_eq!(
            sniff(&hello(&["a.test", "b.test"], 1)),
            Sniff::Malformed(Proto::Tls)
        );
        assert_eq!(sniff(&hello(&["a.test"], 2)), Sniff::Malformed(Proto::Tls));
        assert_eq!(sniff(&hello(&["1.2.3.4"], 1)), Sniff::Malformed(Proto::Tls));
        let mut bad = hello(&["a.test"], 1);
        bad[5] = 2; // a ServerHello
        assert_eq!(sniff(&bad), Sniff::Malformed(Proto::Tls));
    }

    #[test]
    fn an_http_request_names_its_host_once() {
        let r = b"GET / HTTP/1.1\r\nHost: Allowed.test:8080\r\n\r\n";
        assert_eq!(sniff(r), Sniff::Name(Proto::Http, "allowed.test".into()));
        assert_eq!(sniff(&r[..10]), Sniff::More);
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Sniff::Malformed(Proto::Http)
        );
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\n\r\n"),
            Sniff::Malformed(Proto::Http)
        );
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: 93.184.215.10\r\n\r\n"),
            Sniff::Nameless(Proto::Http)
        );
        assert_eq!(sniff(b"SSH-2.0-OpenSSH\r\n"), Sniff::Opaque);
        for proxy in [
            &b"GET http://other.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"[..],
            b"CONNECT other.test:80 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        ] {
            assert_eq!(sniff(proxy), Sniff::Malformed(Proto::Http));
        }
        assert_eq!(sniff(b"\x00\x01binary"), Sniff::Opaque);
    }
}
