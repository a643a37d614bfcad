//! The reliability soak's verdict: every operation classified, counts per
//! class and per operation, the first unexpected failures, the untouched
//! tenants' latencies beside their baseline, and the gateways' memory and
//! descriptors over time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::super::harness::{ms, percentile};
use super::Sample;
use super::chaos::{Chaos, Event};
use super::workload::{Kind, Record};

/// How many unexpected failures are printed in full.
const SHOWN: usize = 10;

pub struct Setting {
    pub begun: Instant,
    pub chaos_start: Instant,
    pub replicas: usize,
    /// Tenants no chaos is aimed at (besides cuts, which must cost nothing).
    pub untouched: Vec<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Succeeded,
    Expected(Chaos),
    Unexpected,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Counts {
    pub succeeded: u64,
    /// Failed as documented, by the chaos that caused it.
    pub expected: BTreeMap<&'static str, u64>,
    pub unexpected: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Latency {
    pub operation: &'static str,
    pub baseline_count: usize,
    pub baseline_p50_ms: f64,
    pub baseline_p99_ms: f64,
    pub chaos_count: usize,
    pub chaos_p50_ms: f64,
    pub chaos_p99_ms: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct Unexpected {
    pub second: f64,
    pub operation: &'static str,
    pub tenant: &'static str,
    pub door: &'static str,
    pub owner: Option<String>,
    pub error: String,
}

#[derive(Debug, serde::Serialize)]
pub struct ChaosEvent {
    pub second: f64,
    pub chaos: &'static str,
    pub target: String,
    pub detail: String,
}

#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub replicas: usize,
    pub seconds: f64,
    pub total: Counts,
    pub unexpected: u64,
    pub per_operation: BTreeMap<&'static str, Counts>,
    pub chaos: Vec<ChaosEvent>,
    pub first_unexpected: Vec<Unexpected>,
    /// Succeeded operations of the untouched tenants, per kind.
    pub victims: Vec<Latency>,
    pub samples: Vec<Sample>,
}

fn classify(r: &Record, log: &[Event]) -> Class {
    if r.kind == Kind::Stalled {
        // The stalled client's outcome is whether the gateway cut it.
        return match r.error {
            None => Class::Expected(Chaos::Stall),
            Some(_) => Class::Unexpected,
        };
    }
    if r.error.is_none() {
        return Class::Succeeded;
    }
    for e in log {
        let overlaps = r.started <= e.until && r.ended >= e.at;
        let caused = match e.chaos {
            // The tenant's processes running when its worker died.
            Chaos::Worker => r.tenant == e.target && overlaps,
            // The replica's own sessions, from the moment it went: they
            // end with it (killed) or with its grace (drained).
            Chaos::Replica | Chaos::Drain => {
                r.owner.as_deref() == Some(e.target.as_str())
                    && r.session_created <= e.until
                    && r.ended >= e.at
            }
            // Cuts are resumed and stalls cost others nothing.
            Chaos::Cut | Chaos::Stall => false,
        };
        if caused {
            return Class::Expected(e.chaos);
        }
    }
    Class::Unexpected
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

impl Counts {
    fn add(&mut self, c: Class) {
        match c {
            Class::Succeeded => self.succeeded += 1,
            Class::Expected(chaos) => *self.expected.entry(chaos.name()).or_default() += 1,
            Class::Unexpected => self.unexpected += 1,
        }
    }
}

impl Summary {
    pub fn new(records: &[Record], log: &[Event], samples: &[Sample], s: Setting) -> Summary {
        let mut total = Counts::default();
        let mut per_operation: BTreeMap<&'static str, Counts> = BTreeMap::new();
        let mut first_unexpected = Vec::new();
        let mut sorted: Vec<&Record> = records.iter().collect();
        sorted.sort_by_key(|r| r.ended);
        let mut lat: BTreeMap<Kind, (Vec<Duration>, Vec<Duration>)> = BTreeMap::new();
        for r in sorted {
            let class = classify(r, log);
            total.add(class);
            per_operation.entry(r.kind.name()).or_default().add(class);
            if class == Class::Unexpected && first_unexpected.len() < SHOWN {
                first_unexpected.push(Unexpected {
                    second: secs(r.ended - s.begun),
                    operation: r.kind.name(),
                    tenant: r.tenant,
                    door: r.door,
                    owner: r.owner.clone(),
                    error: r.error.clone().unwrap_or_default(),
                });
            }
            if class == Class::Succeeded && s.untouched.contains(&r.tenant) {
                let e = lat.entry(r.kind).or_default();
                let d = r.ended - r.started;
                if r.started < s.chaos_start {
                    e.0.push(d);
                } else {
                    e.1.push(d);
                }
            }
        }
        let victims = lat
            .into_iter()
            .map(|(kind, (mut base, mut chaos))| {
                base.sort();
                chaos.sort();
                Latency {
                    operation: kind.name(),
                    baseline_count: base.len(),
                    baseline_p50_ms: millis(percentile(&base, 0.5)),
                    baseline_p99_ms: millis(percentile(&base, 0.99)),
                    chaos_count: chaos.len(),
                    chaos_p50_ms: millis(percentile(&chaos, 0.5)),
                    chaos_p99_ms: millis(percentile(&chaos, 0.99)),
                }
            })
            .collect();
        let chaos = log
            .iter()
            .map(|e| ChaosEvent {
                second: secs(e.at - s.begun),
                chaos: e.chaos.name(),
                target: e.target.clone(),
                detail: e.detail.clone(),
            })
            .collect();
        Summary {
            replicas: s.replicas,
            seconds: secs(s.begun.elapsed()),
            unexpected: total.unexpected,
            total,
            per_operation,
            chaos,
            first_unexpected,
            victims,
            samples: samples.to_vec(),
        }
    }

    pub fn print(&self) {
        println!(
            "\nreliability soak: {} replica(s), {:.0}s, {} chaos events",
            self.replicas,
            self.seconds,
            self.chaos.len()
        );
        let mut per_chaos: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &self.chaos {
            *per_chaos.entry(e.chaos).or_default() += 1;
        }
        for (c, n) in &per_chaos {
            println!("  chaos: {c} x{n}");
        }
        println!(
            "\n{:<16} {:>10} {:>10} {:>40} {:>11}",
            "operation", "total", "succeeded", "failed as documented (by chaos)", "unexpected"
        );
        for (op, c) in self
            .per_operation
            .iter()
            .map(|(k, v)| (*k, v))
            .chain([("all", &self.total)])
        {
            let expected: u64 = c.expected.values().sum();
            let by: Vec<String> = c.expected.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!(
                "{:<16} {:>10} {:>10} {:>40} {:>11}",
                op,
                c.succeeded + expected + c.unexpected,
                c.succeeded,
                if by.is_empty() {
                    "0".to_owned()
                } else {
                    by.join(", ")
                },
                c.unexpected
            );
        }
        if self.first_unexpected.is_empty() {
            println!("\nunexpected failures: none");
        } else {
            println!("\nfirst unexpected failures:");
            for u in &self.first_unexpected {
                println!(
                    "  [{:>6.1}s] {} ({}, {}, owner {}): {}",
                    u.second,
                    u.operation,
                    u.tenant,
                    u.door,
                    u.owner.as_deref().unwrap_or("-"),
                    u.error
                );
            }
        }
        println!(
            "\nuntouched tenants, succeeded operations: {:<8} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8}",
            "", "n base", "p50", "p99", "n chaos", "p50", "p99", "p99 x"
        );
        for l in &self.victims {
            let ratio = if l.baseline_p99_ms > 0.0 {
                format!("{:.2}x", l.chaos_p99_ms / l.baseline_p99_ms)
            } else {
                "-".to_owned()
            };
            println!(
                "{:>48} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8}",
                l.operation,
                l.baseline_count,
                ms(Duration::from_secs_f64(l.baseline_p50_ms / 1e3)),
                ms(Duration::from_secs_f64(l.baseline_p99_ms / 1e3)),
                l.chaos_count,
                ms(Duration::from_secs_f64(l.chaos_p50_ms / 1e3)),
                ms(Duration::from_secs_f64(l.chaos_p99_ms / 1e3)),
                ratio
            );
        }
        self.print_resources();
    }

    /// Each replica's RSS and open descriptors at ten points in the run.
    fn print_resources(&self) {
        let mut by: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
        for s in &self.samples {
            by.entry(s.replica.as_str()).or_default().push(s);
        }
        println!("\ngateway resources over time (RSS MiB / open fds):");
        for (replica, samples) in by {
            let step = (samples.len() / 10).max(1);
            let points: Vec<String> = samples
                .iter()
                .step_by(step)
                .chain(samples.last())
                .map(|s| format!("{}s {:.0}/{}", s.second, s.rss_kib as f64 / 1024.0, s.fds))
                .collect();
            let peak_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
            let peak_fds = samples.iter().map(|s| s.fds).max().unwrap_or(0);
            println!(
                "  {replica}: {} (peak {:.0} MiB, {} fds)",
                points.join("  "),
                peak_rss as f64 / 1024.0,
                peak_fds
            );
        }
    }
}
