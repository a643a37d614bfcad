//! Delivery to one endpoint: each message is POSTed, signed anew at each
//! attempt (the timestamp is the attempt's: receivers refuse old ones),
//! until a 2xx, a refusal, or its attempts or age run out. Retries back
//! off exponentially with jitter; a 429 or 503's `Retry-After` is waited
//! for, within the endpoint's `retry_max`. At most `concurrency` attempts
//! to one endpoint at once.

use std::sync::Arc;
use std::time::Duration;

use super::spool::Message;
use super::{Endpoint, Hub, Pending};

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Never again: the endpoint refused it (4xx but 408 and 429, or a
    /// redirect, which is not followed).
    Rejected(u16),
    /// Again later: a network error, a timeout, 408, 429 or 5xx; the
    /// endpoint's `Retry-After`, when it gave one.
    Retry {
        why: String,
        after: Option<Duration>,
    },
}

/// What a status means for the message.
pub fn judge(status: u16, retry_after: Option<Duration>) -> Attempt {
    match status {
        200..=299 => Attempt::Delivered,
        408 | 429 | 500..=599 => Attempt::Retry {
            why: format!("HTTP {status}"),
            after: retry_after,
        },
        _ => Attempt::Rejected(status),
    }
}

/// `Retry-After` in seconds (an HTTP date is not used: the backoff
/// stands).
pub fn retry_after(h: Option<&reqwest::header::HeaderValue>) -> Option<Duration> {
    let s = h?.to_str().ok()?.trim();
    s.parse::<u64>().ok().map(Duration::from_secs)
}

/// The wait before attempt `n + 1` after `n` failed: `initial * 2^(n-1)`
/// capped at `max`, a random part of its upper half; at least what the
/// endpoint asked for (itself capped at `max`).
pub fn backoff(n: u32, initial: Duration, max: Duration, asked: Option<Duration>) -> Duration {
    let exp = initial
        .saturating_mul(
            1u32.checked_shl(n.saturating_sub(1).min(31))
                .unwrap_or(u32::MAX),
        )
        .min(max);
    let mut r = [0u8; 4];
    let _ = getrandom::fill(&mut r);
    let frac = f64::from(u32::from_be_bytes(r)) / f64::from(u32::MAX);
    let jittered = exp.mul_f64(0.5 + 0.5 * frac);
    jittered.max(asked.unwrap_or(Duration::ZERO).min(max))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One POST of `m` to the endpoint as configured now.
async fn attempt(ep: &Endpoint, m: &Message) -> Attempt {
    let cfg = ep.settings.load_full();
    let client = ep.client.load_full();
    let ts = i64::try_from(now_ms() / 1000).unwrap_or(i64::MAX);
    let sig = super::sign::signature(&cfg.secrets, &m.id, ts, &m.body);
    let sent = client
        .post(cfg.url.clone())
        .timeout(cfg.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", &m.id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(m.body.clone())
        .send()
        .await;
    match sent {
        Ok(r) => judge(
            r.status().as_u16(),
            retry_after(r.headers().get(reqwest::header::RETRY_AFTER)),
        ),
        Err(e) => Attempt::Retry {
            why: if e.is_timeout() {
                "timed out".to_owned()
            } else {
                // The source chain says why (refused, TLS, reset).
                let mut s = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(c) = src {
                    s.push_str(": ");
                    s.push_str(&c.to_string());
                    src = c.source();
                }
                s
            },
            after: None,
        },
    }
}

/// Deliver `p` to `ep` until it is done, then release it from the queue.
pub async fn deliver(hub: &'static Hub, ep: Arc<Endpoint>, p: Pending) {
    let label = super::counters::EndpointLabel {
        endpoint: ep.name.clone(),
    };
    let mut n: u32 = 0;
    let outcome = loop {
        n += 1;
        let result = {
            let _slot = ep.slots.acquire().await;
            attempt(&ep, &p.msg).await
        };
        match result {
            Attempt::Delivered => {
                hub.metrics.delivered.get_or_create(&label).inc();
                break None;
            }
            Attempt::Rejected(status) => {
                hub.metrics.failed_attempts.get_or_create(&label).inc();
                tracing::warn!(endpoint = %ep.name, id = %p.msg.id, r#type = %p.msg.ty, status, "webhook refused by its endpoint; given up");
                break Some("rejected");
            }
            Attempt::Retry { why, after } => {
                hub.metrics.failed_attempts.get_or_create(&label).inc();
                let cfg = ep.settings.load_full();
                let wait = backoff(n, cfg.retry_initial, cfg.retry_max, after);
                let age = Duration::from_millis(now_ms().saturating_sub(p.msg.created_ms));
                if n >= cfg.max_attempts || age + wait > cfg.max_age {
                    tracing::warn!(endpoint = %ep.name, id = %p.msg.id, r#type = %p.msg.ty, attempts = n, error = %why, "webhook out of attempts or age; given up");
                    break Some("expired");
                }
                tracing::debug!(endpoint = %ep.name, id = %p.msg.id, attempt = n, error = %why, wait_ms = wait.as_millis() as u64, "webhook attempt failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    };
    if let Some(reason) = outcome {
        hub.metrics
            .given_up
            .get_or_create(&super::counters::GiveUpLabels {
                endpoint: ep.name.clone(),
                reason: reason.to_owned(),
            })
            .inc();
    }
    hub.finish(p);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decide_retry_or_give_up() {
        assert_eq!(judge(204, None), Attempt::Delivered);
        assert_eq!(judge(400, None), Attempt::Rejected(400));
        assert_eq!(judge(410, None), Attempt::Rejected(410));
        assert_eq!(judge(302, None), Attempt::Rejected(302));
        for s in [408, 429, 500, 503] {
            assert!(matches!(judge(s, None), Attempt::Retry { .. }), "{s}");
        }
        let asked = Some(Duration::from_secs(7));
        assert_eq!(
            judge(429, asked),
            Attempt::Retry {
                why: "HTTP 429".to_owned(),
                after: asked
            }
        );
    }

    #[test]
    fn backoff_doubles_within_its_cap_and_honours_retry_after_within_it() {
        let (i, m) = (Duration::from_secs(1), Duration::from_secs(60));
        for n in 1..40 {
            let w = backoff(n, i, m, None);
            let full = i.saturating_mul(1 << (n - 1).min(20)).min(m);
            assert!(w >= full / 2 && w <= full, "{n}: {w:?} of {full:?}");
        }
        assert!(backoff(1, i, m, Some(Duration::from_secs(30))) >= Duration::from_secs(30));
        // An endpoint cannot hold a message past the cap.
        assert_eq!(backoff(1, i, m, Some(Duration::from_secs(3600))), m);
        let v = reqwest::header::HeaderValue::from_static("12");
        assert_eq!(retry_after(Some(&v)), Some(Duration::from_secs(12)));
        let d = reqwest::header::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(retry_after(Some(&d)), None);
    }
}
