//! Paths on the wire: a plain absolute path (Codex 0.130.0) or a `file://`
//! URI (Codex 0.169.0).
//!
//! A [`WirePath`] always decodes, keeping what the client sent; whether it
//! is acceptable depends on the session's revision, so the connection
//! checks it afterwards ([`WirePath::check`]) and answers with the error
//! text that revision's reference server gives. Results carry paths back in
//! the session's form ([`to_wire`]).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::revision::Revision;

/// How a path was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathForm {
    /// `/abs/path` (or a relative path, which is an error).
    Plain,
    /// `file:///abs/path` (or any other `scheme:`).
    Uri,
}

/// Which field a path is in: the reference words a bad `cwd` differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathField {
    Cwd,
    Path,
}

/// Why a path is refused: the JSON-RPC code and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError {
    pub kind: PathErrorKind,
    pub message: String,
}

/// How a path's error is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathErrorKind {
    /// -32602: malformed.
    InvalidParams,
    /// -32600: a URI naming another host.
    InvalidRequest,
    /// -32603: a May cwd that is not absolute, which the reference only
    /// finds out when the spawn fails.
    Spawn,
}

/// A path field as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WirePath {
    raw: String,
    form: PathForm,
    /// The absolute path a URI names, or why it names none.
    decoded: Result<String, UriError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum UriError {
    Invalid(String),
    Scheme(String),
    Host,
}

const ABSOLUTE_REQUIRED: &str = "AbsolutePathBuf deserialized without a base path";

impl WirePath {
    /// A plain path (gRPC, internal callers).
    pub fn plain(path: impl Into<String>) -> WirePath {
        let raw = path.into();
        WirePath {
            decoded: Ok(raw.clone()),
            raw,
            form: PathForm::Plain,
        }
    }

    /// A path as written on the wire: a plain path or a `file://` URI
    /// (what decoding gives; the client builds its paths with it).
    pub fn parse(raw: String) -> WirePath {
        // `scheme:` (a letter, then letters/digits/+-.) marks a URI; a plain
        // path has no such prefix (absolute paths start with `/`).
        let is_uri = raw.split_once(':').is_some_and(|(scheme, _)| {
            scheme
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
        if !is_uri {
            return WirePath {
                decoded: Ok(raw.clone()),
                raw,
                form: PathForm::Plain,
            };
        }
        let decoded = match url::Url::parse(&raw) {
            Err(e) => Err(UriError::Invalid(e.to_string())),
            Ok(u) if u.scheme() != "file" => Err(UriError::Scheme(u.scheme().to_owned())),
            Ok(u) => match u.host_str() {
                None | Some("") | Some("localhost") => u
                    .to_file_path()
                    .map(|p| p.to_string_lossy().into_owned())
                    .map_err(|()| UriError::Host),
                Some(_) => Err(UriError::Host),
            },
        };
        WirePath {
            raw,
            form: PathForm::Uri,
            decoded,
        }
    }

    /// As the client wrote it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    pub fn form(&self) -> PathForm {
        self.form
    }

    /// The revision this path tells, if any: an absolute plain path is the
    /// older revision, any URI the newer one.
    pub fn tells(&self) -> Option<Revision> {
        match self.form {
            PathForm::Uri => Some(Revision::Nov2026),
            PathForm::Plain if self.raw.starts_with('/') => Some(Revision::May2026),
            PathForm::Plain => None,
        }
    }

    /// Whether the path is acceptable in a session of `revision`, with that
    /// revision's error when not.
    pub fn check(&self, revision: Revision, field: PathField) -> Result<(), PathError> {
        let invalid = |message: String| PathError {
            kind: PathErrorKind::InvalidParams,
            message,
        };
        match (revision, self.form) {
            // May's cwd is a plain PathBuf: anything not absolute (a
            // `file://` URI included) is a relative directory, missing.
            (Revision::May2026, _) if field == PathField::Cwd && !self.raw.starts_with('/') => {
                Err(PathError {
                    kind: PathErrorKind::Spawn,
                    message: "No such file or directory (os error 2)".to_owned(),
                })
            }
            (Revision::May2026, PathForm::Uri) => Err(invalid(ABSOLUTE_REQUIRED.to_owned())),
            (Revision::May2026, PathForm::Plain) if !self.raw.starts_with('/') => {
                Err(invalid(ABSOLUTE_REQUIRED.to_owned()))
            }
            (Revision::May2026, PathForm::Plain) => Ok(()),
            (Revision::Nov2026, PathForm::Plain) => Err(invalid(
                "invalid URI: relative URL without a base".to_owned(),
            )),
            (Revision::Nov2026, PathForm::Uri) => match &self.decoded {
                Ok(_) => Ok(()),
                Err(UriError::Invalid(e)) => Err(invalid(format!("invalid URI: {e}"))),
                Err(UriError::Scheme(s)) => {
                    Err(invalid(format!("unsupported path URI scheme `{s}`")))
                }
                Err(UriError::Host) => {
                    let host = format!("'{}' is invalid on 'linux'", self.raw);
                    match field {
                        PathField::Cwd => Err(invalid(format!(
                            "cwd URI `{}` is not valid on this exec-server host: {host}",
                            self.raw
                        ))),
                        PathField::Path => Err(PathError {
                            kind: PathErrorKind::InvalidRequest,
                            message: host,
                        }),
                    }
                }
            },
        }
    }

    /// The path on the host (for a checked path: absolute).
    pub fn as_str(&self) -> &str {
        match &self.decoded {
            Ok(p) => p,
            Err(_) => &self.raw,
        }
    }
}

impl Serialize for WirePath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for WirePath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(WirePath::parse)
    }
}

/// A host path as a session of `revision` writes it.
pub fn to_wire(path: &str, revision: Revision) -> String {
    revision.policy().wire_path(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn wire(s: &str) -> WirePath {
        serde_json::from_value(serde_json::Value::from(s)).unwrap()
    }

    const NOV: Revision = Revision::Nov2026;
    const MAY: Revision = Revision::May2026;

    #[test]
    fn uris_decode_like_the_reference() {
        for (uri, path) in [
            ("file:///tmp", "/tmp"),
            ("file://localhost/tmp", "/tmp"),
            ("FILE:///tmp", "/tmp"),
            ("file:tmp", "/tmp"),
            ("file:///tmp/../tmp", "/tmp"),
            ("file:///a%20b", "/a b"),
        ] {
            let w = wire(uri);
            assert_eq!(w.check(NOV, PathField::Path), Ok(()), "{uri}");
            assert_eq!(w.as_str(), path, "{uri}");
            assert_eq!(w.tells(), Some(NOV));
        }
    }

    #[test]
    fn bad_paths_get_each_revisions_words() {
        let msg = |s: &str, r, f| wire(s).check(r, f).unwrap_err().message;
        assert_eq!(
            msg("/tmp", NOV, PathField::Path),
            "invalid URI: relative URL without a base"
        );
        assert_eq!(
            msg("http://x/tmp", NOV, PathField::Path),
            "unsupported path URI scheme `http`"
        );
        let e = wire("file://host/tmp")
            .check(NOV, PathField::Path)
            .unwrap_err();
        assert_eq!(e.kind, PathErrorKind::InvalidRequest);
        assert_eq!(e.message, "'file://host/tmp' is invalid on 'linux'");
        assert_eq!(
            msg("file://host/tmp", NOV, PathField::Cwd),
            "cwd URI `file://host/tmp` is not valid on this exec-server host: 'file://host/tmp' is invalid on 'linux'"
        );
        assert_eq!(msg("file:///tmp", MAY, PathField::Path), ABSOLUTE_REQUIRED);
        assert_eq!(msg("tmp", MAY, PathField::Path), ABSOLUTE_REQUIRED);
        assert_eq!(wire("tmp").tells(), None);
        assert_eq!(wire("/tmp").check(MAY, PathField::Cwd), Ok(()));
    }

    #[test]
    fn results_use_the_sessions_form() {
        assert_eq!(to_wire("/a b/c", NOV), "file:///a%20b/c");
        assert_eq!(to_wire("/a b/c", MAY), "/a b/c");
    }
}
