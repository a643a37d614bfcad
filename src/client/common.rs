//! Helpers both backends use: retry backoff, made-up ids, reading a
//! source block by block, URLs as they may be shown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};

/// Backoff between reconnection attempts.
pub(super) struct Backoff {
    next: Duration,
    deadline: tokio::time::Instant,
}

impl Backoff {
    pub(super) fn new(within: Duration) -> Backoff {
        Backoff {
            next: Duration::from_millis(50),
            deadline: tokio::time::Instant::now() + within,
        }
    }

    /// Sleep before the next attempt; false once the time is up.
    pub(super) async fn wait(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.next.min(self.deadline - now)).await;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        true
    }
}

/// Ids this client makes up (write ids, file handles): unique to the
/// client, so a retried write is recognised and two clients never clash.
pub(super) struct Ids {
    prefix: String,
    counter: AtomicU64,
}

impl Ids {
    pub(super) fn new() -> Ids {
        Ids {
            prefix: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            counter: AtomicU64::new(0),
        }
    }

    /// `{kind}-{prefix}-{n}`.
    pub(super) fn next(&self, kind: &str) -> String {
        format!(
            "{kind}-{}-{}",
            self.prefix,
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Read until `buf` is full or the source ends; the bytes read.
pub(super) async fn read_full<R: AsyncRead + Unpin>(
    source: &mut R,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let got = source.read(&mut buf[n..]).await?;
        if got == 0 {
            break;
        }
        n += got;
    }
    Ok(n)
}

/// `url` as it may be shown: no password, no `access_token` value.
pub fn redact_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return url.split(['?', '#']).next().unwrap_or_default().to_owned();
    };
    if u.password().is_some() {
        let _ = u.set_password(Some("REDACTED"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "access_token" {
                    "REDACTED".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.into()
}

/// An error with its sources, `a: b: c`.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_are_unique_per_client_and_kind_prefixed() {
        let (a, b) = (Ids::new(), Ids::new());
        let (a0, a1, b0) = (a.next("w"), a.next("h"), b.next("w"));
        assert!(a0.starts_with("w-") && a0.ends_with("-0"), "{a0}");
        assert!(a1.starts_with("h-") && a1.ends_with("-1"), "{a1}");
        assert_ne!(a0, b0, "two clients never make the same id");
        assert_eq!(a0.len(), "w-".len() + 12 + "-0".len());
    }

    /// Yields its data a few bytes per read, as a pipe may.
    struct Trickle(Vec<u8>);

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.0.len().min(3).min(buf.remaining());
            let head: Vec<u8> = self.0.drain(..n).collect();
            buf.put_slice(&head);
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn read_full_fills_the_buffer_across_short_reads() {
        let mut src = Trickle((0u8..20).collect());
        let mut buf = [0u8; 8];
        assert_eq!(read_full(&mut src, &mut buf).await.unwrap(), 8);
        assert_eq!(buf, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(read_full(&mut src, &mut buf).await.unwrap(), 8);
        assert_eq!(read_full(&mut src, &mut buf).await.unwrap(), 4);
        assert_eq!(&buf[..4], &[16, 17, 18, 19]);
        assert_eq!(read_full(&mut src, &mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn backoff_doubles_and_stops_at_the_deadline() {
        let start = tokio::time::Instant::now();
        let mut b = Backoff::new(Duration::from_millis(400));
        let mut waits = vec![];
        let mut last = start;
        while b.wait().await {
            let now = tokio::time::Instant::now();
            waits.push((now - last).as_millis());
            last = now;
        }
        // 50, 100, 200, then what is left of the 400 ms.
        assert!(waits.len() == 4 || waits.len() == 3, "{waits:?}");
        assert!(
            waits[0] >= 50 && waits[1] >= 100 && waits[2] >= 200,
            "{waits:?}"
        );
        let total = start.elapsed();
        assert!(total >= Duration::from_millis(400) && total < Duration::from_millis(700));
    }

    #[test]
    fn redacted_urls_hide_secrets() {
        assert_eq!(
            redact_url("ws://u:pw@h:1/x?access_token=abc&y=1"),
            "ws://u:REDACTED@h:1/x?access_token=REDACTED&y=1"
        );
        assert_eq!(redact_url("not a url?access_token=x"), "not a url");
    }
}
