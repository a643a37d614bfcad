//! A minute of the reliability soak (`exec-gateway-bench --soak
//! --reliability`, docs/benchmarks.md): a mixed workload on both doors in
//! three tenants while a worker is killed, every connection is reset and a
//! client stalls. Every operation must succeed or fail exactly as the docs
//! promise for the chaos that hit it; everything else is byte-exact.
//! (Replica chaos needs a fleet and runs in the long soak.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use serde_json::Value;

#[test]
fn a_minute_of_chaos_has_no_unexpected_failure() {
    let out = Command::new(env!("CARGO_BIN_EXE_exec-gateway-bench"))
        .args([
            "--gateway",
            env!("CARGO_BIN_EXE_exec-gateway"),
            "--soak",
            "45s",
            "--soak-baseline",
            "15s",
            "--reliability",
            "--soak-chaos",
            "worker,cut,stall",
            "--soak-interval",
            "7s",
            "--json",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: Value = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary\n{stdout}\n{stderr}"));
    assert_eq!(
        summary["unexpected"], 0,
        "unexpected failures: {}\n{stdout}",
        summary["first_unexpected"]
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The chaos happened and bit: a worker died, live connections were
    // reset (the clients resumed them), a client was cut loose.
    let events = summary["chaos"].as_array().unwrap();
    let acted = |chaos: &str, check: &dyn Fn(&str) -> bool| {
        events
            .iter()
            .any(|e| e["chaos"] == chaos && check(e["detail"].as_str().unwrap_or("")))
    };
    assert!(
        acted("worker killed", &|d| !d.starts_with("0 ")),
        "no worker was killed: {events:?}"
    );
    assert!(
        acted("connections cut", &|d| !d.starts_with("0 ")),
        "no live connection was cut: {events:?}"
    );
    assert!(
        summary["per_operation"]["stalled client"]["expected"]["client stalled"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "no stalled client was cut loose: {}",
        summary["per_operation"]
    );
    // Every kind of operation ran and succeeded at least once.
    for op in [
        "session", "short", "long", "pty", "stdin", "flood", "files", "resume",
    ] {
        let ok = summary["per_operation"][op]["succeeded"]
            .as_u64()
            .unwrap_or(0);
        assert!(ok > 0, "{op} never succeeded: {}", summary["per_operation"]);
    }
}
