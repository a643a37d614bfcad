//! Where a preview request is going: by path on the client listener
//! (`/preview/{session}/{port}/…`) or by host name
//! (`{port}-{session}.{domain}`).
//!
//! A host name is one DNS label under the domain (a wildcard certificate
//! covers one label), so the session's id is written compactly: its UUID
//! as 32 hex digits, and in a fleet `-{boot}-{replica}` after it (a fleet
//! id is `{replica}.{boot}.{uuid}`): at most 63 bytes, so a replica id of
//! at most 15 characters.

/// A path preview: the session, the port, and the rest of the path
/// (empty, or starting with `/`).
pub fn path(path: &str) -> Option<Result<(&str, u16, &str), &'static str>> {
    let rest = path.strip_prefix("/preview/")?;
    const BAD: &str = "expected /preview/{session}/{port}/";
    let Some((session, rest)) = rest.split_once('/') else {
        return Some(Err(BAD));
    };
    let (port, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if session.is_empty() || session.len() > 256 {
        return Some(Err(BAD));
    }
    Some(parse_port(port).map(|p| (session, p, tail)))
}

fn parse_port(s: &str) -> Result<u16, &'static str> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 && !s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err("the port must be 1 to 65535"),
    }
}

/// The session a host name's label names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSession {
    /// The session's UUID, in its usual dashed form.
    pub uuid: String,
    /// The replica that owns it and its boot, in a fleet.
    pub replica: Option<(String, String)>,
}

impl HostSession {
    /// The full session id.
    pub fn id(&self) -> String {
        match &self.replica {
            Some((r, b)) => format!("{r}.{b}.{}", self.uuid),
            None => self.uuid.clone(),
        }
    }
}

/// A host preview, if `host` (the `Host` header, maybe with a port) is a
/// name under `domain`: the port and the session.
pub fn host(host: &str, domain: &str) -> Option<Result<(u16, HostSession), &'static str>> {
    let name = match host.rsplit_once(':') {
        Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    const BAD: &str = "a preview host name is {port}-{session}.{domain}";
    if label.contains('.') || label.len() > 63 {
        return Some(Err(BAD));
    }
    let Some((port, rest)) = label.split_once('-') else {
        return Some(Err(BAD));
    };
    let port = match parse_port(port) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let is_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (hex, replica) = match rest.split_once('-') {
        Some((h, r)) => match r.split_once('-') {
            Some((boot, replica))
                if boot.len() == 8 && is_hex(boot) && crate::config::is_replica_id(replica) =>
            {
                (h, Some((replica.to_owned(), boot.to_owned())))
            }
            _ => return Some(Err(BAD)),
        },
        None => (rest, None),
    };
    if hex.len() != 32 || !is_hex(hex) {
        return Some(Err(BAD));
    }
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    Some(Ok((port, HostSession { uuid, replica })))
}

/// The host name label of `port` of session `id`, if the id has a form
/// one label can hold (a UUID, optionally after `replica.boot.`) and the
/// label fits in 63 bytes.
pub fn host_label(id: &str, port: u16) -> Option<String> {
    let (replica, uuid) = match crate::fleet::parse_owner(id) {
        Some((replica, boot)) => (
            Some((replica, boot)),
            id.strip_prefix(replica)?.get(boot.len() + 2..)?,
        ),
        None => (None, id),
    };
    let parsed = uuid::Uuid::try_parse(uuid).ok()?;
    if parsed.hyphenated().to_string() != uuid {
        return None;
    }
    let mut label = format!("{port}-{}", parsed.simple());
    if let Some((r, boot)) = replica {
        label.push_str(&format!("-{boot}-{r}"));
    }
    (label.len() <= 63).then_some(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_a_session_a_port_and_the_rest() {
        assert_eq!(path("/preview/s-1/8080/"), Some(Ok(("s-1", 8080, "/"))));
        assert_eq!(path("/preview/s-1/8080"), Some(Ok(("s-1", 8080, ""))));
        assert_eq!(
            path("/preview/s-1/80/a/b?c"),
            Some(Ok(("s-1", 80, "/a/b?c")))
        );
        assert_eq!(path("/previews"), None);
        for bad in [
            "/preview/",
            "/preview/s",
            "/preview/s/0/",
            "/preview//80/",
            "/preview/s/x/",
        ] {
            assert!(matches!(path(bad), Some(Err(_))), "{bad}");
        }
    }

    #[test]
    fn a_host_label_round_trips() {
        let id = "0b8a4f8e-2b1c-4c3d-9e5f-0123456789ab";
        let label = host_label(id, 3000).unwrap();
        assert_eq!(label, "3000-0b8a4f8e2b1c4c3d9e5f0123456789ab");
        let (port, s) = host(
            &format!("{label}.Preview.Example.com:443"),
            "preview.example.com",
        )
        .unwrap()
        .unwrap();
        assert_eq!((port, s.id(), s.replica), (3000, id.to_owned(), None));
        let fleet = format!("r1.0a0b0c0d.{id}");
        let label = host_label(&fleet, 80).unwrap();
        let (_, s) = host(&format!("{label}.p.test"), "p.test").unwrap().unwrap();
        assert_eq!(label, "80-0b8a4f8e2b1c4c3d9e5f0123456789ab-0a0b0c0d-r1");
        assert_eq!(s.id(), fleet);
        // Not one of ours, or not a preview.
        assert_eq!(host("p.test", "p.test"), None);
        assert_eq!(host("evil-p.test", "p.test"), None);
        assert!(host_label("x-e@pool.s", 80).is_none());
        for bad in [
            "80.p.test",
            "80-xyz.p.test",
            "a.80-0b8a4f8e2b1c4c3d9e5f0123456789ab.p.test",
            "0-0b8a4f8e2b1c4c3d9e5f0123456789ab.p.test",
        ] {
            assert!(matches!(host(bad, "p.test"), Some(Err(_))), "{bad}");
        }
    }
}
