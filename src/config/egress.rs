//! `tenants.NAME.egress_names`: the host names a tenant's processes may
//! reach (docs/isolation.md, "Egress by name"). An entry is a name
//! (`github.com`), a wildcard for every name under one (`*.github.com`:
//! not the apex), either with an optional `:PORT` (any port without).

use std::fmt;

use super::common::ConfigError;

/// The most entries one tenant's list (or one change through the API) may
/// hold.
pub const MAX_EGRESS_NAMES: usize = 1024;

/// One entry of a name list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamePattern {
    /// Lowercase, without a trailing dot; for a wildcard, what follows `*.`.
    name: String,
    wildcard: bool,
    port: Option<u16>,
}

impl NamePattern {
    /// Parse one entry, or say what is wrong with it.
    pub fn parse(entry: &str) -> Result<NamePattern, String> {
        let (host, port) = match entry.rsplit_once(':') {
            Some((h, p)) => {
                let digits = p.bytes().all(|b| b.is_ascii_digit()) && !p.starts_with('0');
                let port = p
                    .parse::<u16>()
                    .ok()
                    .filter(|_| digits)
                    .ok_or_else(|| format!("{entry:?}: the port must be 1 to 65535"))?;
                (h, Some(port))
            }
            None => (entry, None),
        };
        let (wildcard, rest) = match host.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, host),
        };
        let name = normalize(rest).ok_or_else(|| {
            format!(
                "{entry:?} is not a host name (letters, digits, '-' and '.'; a wildcard only as a leading \"*.\"; IP addresses go in `egress`)"
            )
        })?;
        if wildcard && !name.contains('.') {
            return Err(format!(
                "{entry:?} would match every name under a top-level domain"
            ));
        }
        Ok(NamePattern {
            name,
            wildcard,
            port,
        })
    }

    /// The name a CA's DNS name constraint permits for this pattern (it
    /// and the names under it).
    pub fn subtree(&self) -> &str {
        &self.name
    }

    /// Whether `name` (already normalized) on `port` matches.
    pub fn matches(&self, name: &str, port: Option<u16>) -> bool {
        if let (Some(want), Some(got)) = (self.port, port)
            && want != got
        {
            return false;
        }
        if self.wildcard {
            name.len() > self.name.len() + 1
                && name.ends_with(&self.name)
                && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
        } else {
            name == self.name
        }
    }
}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// A host name as the policy compares it: ASCII lowercase, no trailing
/// dot, each label 1–63 of letters, digits, `-` and `_` (not starting or
/// ending with `-`), at most 253 bytes, not all digits and dots (an
/// address). `None` for anything else (an internationalized name is
/// compared in its `xn--` form).
pub fn normalize(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    let labels_ok = lower.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    });
    let address_like = lower.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (labels_ok && !address_like).then_some(lower)
}

/// A tenant's names: the list decides what its processes reach by name
/// (on top of `egress`'s addresses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressNames {
    patterns: Vec<NamePattern>,
}

impl EgressNames {
    /// Parse a list (duplicates kept once), or say which entry is wrong.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<EgressNames, String> {
        if entries.len() > MAX_EGRESS_NAMES {
            return Err(format!(
                "{} entries; at most {MAX_EGRESS_NAMES}",
                entries.len()
            ));
        }
        let mut patterns: Vec<NamePattern> = Vec::with_capacity(entries.len());
        for e in entries {
            let p = NamePattern::parse(e.as_ref().trim())?;
            if !patterns.contains(&p) {
                patterns.push(p);
            }
        }
        Ok(EgressNames { patterns })
    }

    /// Whether `name` (normalized) may be reached on `port` (`None`: on
    /// some port, as a DNS query asks).
    pub fn allows(&self, name: &str, port: Option<u16>) -> bool {
        self.patterns.iter().any(|p| p.matches(name, port))
    }

    /// The first entry that allows it, for the audit trail.
    pub fn rule_for(&self, name: &str, port: Option<u16>) -> Option<&NamePattern> {
        self.patterns.iter().find(|p| p.matches(name, port))
    }

    pub fn entries(&self) -> Vec<String> {
        self.patterns.iter().map(ToString::to_string).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn patterns(&self) -> &[NamePattern] {
        &self.patterns
    }
}

/// Validate `tenants.NAME.egress_names`.
pub(super) fn validate_names(tenant: &str, entries: &[String]) -> Result<EgressNames, ConfigError> {
    EgressNames::parse(entries)
        .map_err(|e| ConfigError(format!("tenants.{tenant}.egress_names: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_matches_names_under_it_and_not_the_apex_or_a_lookalike() {
        let n = EgressNames::parse(&["*.cdn.test", "Git.Test.:443"]).unwrap();
        assert!(n.allows("a.cdn.test", Some(443)));
        assert!(n.allows("x.y.cdn.test", None));
        assert!(!n.allows("cdn.test", None));
        assert!(!n.allows("evilcdn.test", None));
        assert!(!n.allows("a.cdn.test.evil", None));
        assert!(n.allows("git.test", Some(443)));
        assert!(n.allows("git.test", None));
        assert!(!n.allows("git.test", Some(80)));
        assert_eq!(n.entries(), ["*.cdn.test", "git.test:443"]);
    }

    #[test]
    fn what_is_not_a_name_is_refused() {
        for bad in [
            "",
            "*",
            "*.com",
            "a.*.b",
            "1.2.3.4",
            "a..b",
            "-a.b",
            "a b",
            "a.b:0",
            "a.b:65536",
            "a.b:+1",
            "a.b:08",
            "[::1]",
            "ex\u{e4}mple.com",
        ] {
            assert!(NamePattern::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            normalize("WWW.Example.COM."),
            Some("www.example.com".into())
        );
    }
}
