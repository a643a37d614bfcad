//! The bearer token of an upgrade request, from its `Authorization` header
//! or its query string.

/// The bearer token of an upgrade request: `Authorization: Bearer`, else the
/// `access_token` query parameter (RFC 6750 §2.3).
pub fn bearer_token(authorization: Option<&str>, query: Option<&str>) -> Option<String> {
    if let Some(h) = authorization {
        let h = h.trim();
        if h.len() > 7 && h[..7].eq_ignore_ascii_case("bearer ") {
            return Some(h[7..].trim().to_owned());
        }
    }
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "access_token").then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_from_header_or_query() {
        assert_eq!(
            bearer_token(Some("Bearer abc"), None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer_token(Some("bearer  abc "), None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer_token(None, Some("x=1&access_token=a.b%2Ec")).as_deref(),
            Some("a.b.c")
        );
        assert_eq!(bearer_token(Some("Basic zzz"), None), None);
        assert_eq!(bearer_token(None, Some("x=%")), None);
    }
}
