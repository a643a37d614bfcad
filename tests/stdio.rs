//! The stdio door, and two example sessions from the protocol's original
//! specification (v0 `command/exec`, and `process/*`) replayed as
//! transcripts: each request is sent as written there, and each expected
//! reply is compared field by field (session ids and PTY line endings
//! excepted, which a transcript cannot fix).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};

use common::{EVENT_TIMEOUT, pid_alive};
use serde_json::{Value, json};

struct Stdio1 {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    pending: Vec<Value>,
    _dir: tempfile::TempDir,
}

/// A config with tenant `t1` (host-rooted) and an HS256 key at `dir/k`,
/// after `extra`; returns the dir (keep it alive), the secret and the path.
fn write_config(extra: &str) -> (tempfile::TempDir, Vec<u8>, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let secret = common::random_secret();
    std::fs::write(dir.path().join("k"), &secret).unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "{extra}[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.t1]\nroot = \"/\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    (dir, secret, config)
}

impl Stdio1 {
    fn start() -> Stdio1 {
        let (dir, secret, config) = write_config("");
        Self::start_with(
            &config,
            Some(&common::mint(&secret, "t1", common::ALL_SCOPES)),
            dir,
        )
    }

    fn start_with(config: &std::path::Path, token: Option<&str>, dir: tempfile::TempDir) -> Stdio1 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_exec-gateway"));
        cmd.arg("stdio").arg("--config").arg(config);
        // A state directory of its own (concurrent gateways must not share one).
        cmd.env("XDG_STATE_HOME", dir.path().join("state"));
        match token {
            Some(t) => cmd.env("EXEC_GATEWAY_TOKEN", t),
            None => cmd.env_remove("EXEC_GATEWAY_TOKEN"),
        };
        Self::spawn(cmd, dir)
    }

    fn spawn(mut cmd: Command, dir: tempfile::TempDir) -> Stdio1 {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).expect("stdout carries only JSON lines");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Stdio1 {
            child,
            stdin,
            lines: rx,
            pending: Vec::new(),
            _dir: dir,
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.pending.iter().position(&pred) {
            return self.pending.remove(i);
        }
        loop {
            let v = self
                .lines
                .recv_timeout(EVENT_TIMEOUT)
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            if pred(&v) {
                return v;
            }
            self.pending.push(v);
        }
    }

    fn response(&mut self, id: Value) -> Value {
        self.wait_for(&format!("response {id}"), |v| {
            v.get("id") == Some(&id) && v.get("method").is_none()
        })
    }
}

impl Drop for Stdio1 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Collect PTY/stdout bytes of `id` from notifications named `method`
/// until `want` appears in them.
fn output_until(s: &mut Stdio1, method: &str, id: &str, want: &str) -> String {
    let mut text = String::new();
    while !text.contains(want) {
        let v = s.wait_for(want, |v| {
            v["method"] == method && v["params"]["processId"] == id
        });
        text.push_str(&String::from_utf8_lossy(&common::unb64(
            v["params"]["chunk"].as_str().unwrap(),
        )));
    }
    text
}

#[test]
fn v0_command_exec_transcript() {
    let mut s = Stdio1::start();
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"example-client"}}"#);
    let r = s.response(json!(1));
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    s.send(r#"{"method":"initialized","params":{}}"#);
    s.send(r#"{"id":2,"method":"command/exec","params":{"processId":"proc-1","argv":["bash","-lc","printf 'ready\\n'; while IFS= read -r line; do printf 'echo:%s\\n' \"$line\"; done"],"cwd":"/tmp","env":{"PATH":"/usr/bin:/bin"},"tty":true,"outputBytesCap":4096,"arg0":null}}"#);
    let r = s.response(json!(2));
    assert_eq!(
        r["result"],
        json!({"processId":"proc-1","running":true,"exitCode":null,"stdout":null,"stderr":null})
    );
    let first = s.wait_for("outputDelta", |v| v["method"] == "command/exec/outputDelta");
    assert_eq!(first["params"]["stream"], "stdout");
    assert!(first["params"].get("seq").is_none(), "v0 has no seq");
    s.pending.insert(0, first);
    let text = output_until(&mut s, "command/exec/outputDelta", "proc-1", "ready");
    assert!(text.contains("ready"), "{text}");
    s.send(r#"{"id":3,"method":"command/exec/write","params":{"processId":"proc-1","chunk":"aGVsbG8K"}}"#);
    assert_eq!(s.response(json!(3))["result"], json!({"accepted":true}));
    let text = output_until(&mut s, "command/exec/outputDelta", "proc-1", "echo:hello");
    assert!(text.contains("echo:hello"), "{text}");
    s.send(r#"{"id":4,"method":"command/exec/terminate","params":{"processId":"proc-1"}}"#);
    assert_eq!(s.response(json!(4))["result"], json!({"running":true}));
    let exited = s.wait_for("exited", |v| v["method"] == "command/exec/exited");
    assert_eq!(exited["params"]["processId"], "proc-1");
    assert!(exited["params"]["exitCode"].is_i64());
    // v0 processes never report in the process/* family.
    assert!(
        s.pending
            .iter()
            .all(|v| !v["method"].as_str().unwrap_or("").starts_with("process/"))
    );
    // Unknown notification: an error on id -1 (the original specification's rule).
    s.send(r#"{"method":"bogus"}"#);
    let e = s.response(json!(-1));
    assert_eq!(e["error"]["code"], -32600);
}

#[test]
fn process_api_transcript() {
    let mut s = Stdio1::start();
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"example-client"}}"#);
    assert!(s.response(json!(1))["result"]["sessionId"].is_string());
    s.send(r#"{"method":"initialized","params":{}}"#);
    s.send(r#"{"id":2,"method":"process/start","params":{"processId":"proc-1","argv":["bash","-lc","printf 'ready\\n'; while IFS= read -r line; do printf 'echo:%s\\n' \"$line\"; done"],"cwd":"/tmp","env":{"PATH":"/usr/bin:/bin"},"tty":true,"pipeStdin":false,"arg0":null}}"#);
    assert_eq!(
        s.response(json!(2))["result"],
        json!({"processId":"proc-1"})
    );
    let first = s.wait_for("output", |v| v["method"] == "process/output");
    assert_eq!(first["params"]["seq"], 1);
    assert_eq!(first["params"]["stream"], "pty");
    s.pending.insert(0, first);
    output_until(&mut s, "process/output", "proc-1", "ready");
    s.send(
        r#"{"id":3,"method":"process/write","params":{"processId":"proc-1","chunk":"aGVsbG8K"}}"#,
    );
    assert_eq!(s.response(json!(3))["result"], json!({"status":"accepted"}));
    output_until(&mut s, "process/output", "proc-1", "echo:hello");
    s.send(r#"{"id":4,"method":"process/terminate","params":{"processId":"proc-1"}}"#);
    assert_eq!(s.response(json!(4))["result"], json!({"running":true}));
    let exited = s.wait_for("exited", |v| v["method"] == "process/exited");
    let closed = s.wait_for("closed", |v| v["method"] == "process/closed");
    assert_eq!(exited["params"]["processId"], "proc-1");
    assert_eq!(
        exited["params"]["exitCode"], 1,
        "a killed pty child reports 1"
    );
    assert_eq!(
        closed["params"]["seq"].as_u64().unwrap(),
        exited["params"]["seq"].as_u64().unwrap() + 1,
        "closed is last"
    );
}

#[test]
fn stdio_errors_and_eof_kills_the_session() {
    let mut s = Stdio1::start();
    s.send("");
    s.send("not json");
    let e = s.response(json!(-1));
    assert_eq!(e["error"]["code"], -32600);
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("failed to parse JSON-RPC message from exec-server stdio: "),
        "{msg}"
    );
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#);
    s.response(json!(1));
    s.send(r#"{"method":"initialized"}"#);
    s.send(r#"{"id":2,"method":"process/start","params":{"processId":"p","argv":["sh","-c","echo $$; exec sleep 300"],"cwd":"/tmp","env":{},"tty":false}}"#);
    s.response(json!(2));
    let v = s.wait_for("pid", |v| v["method"] == "process/output");
    let pid: i32 = String::from_utf8(common::unb64(v["params"]["chunk"].as_str().unwrap()))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(pid));
    drop(s.stdin.take());
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stdio gateway did not exit on EOF"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    while pid_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process survived stdio EOF"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// What a client sent before its end of input is answered before the
/// gateway exits: a pipelined session (`printf ... | exec-gateway stdio`)
/// gets every reply, slow calls included.
#[test]
fn calls_sent_before_eof_are_answered() {
    let mut s = Stdio1::start();
    let big = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(big.path(), vec![7u8; 1 << 20]).unwrap();
    // Readable by the tenant's own uid.
    std::fs::set_permissions(
        big.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#);
    s.send(r#"{"method":"initialized"}"#);
    s.send(&format!(
        r#"{{"id":2,"method":"fs/readFile","params":{{"path":"{}"}}}}"#,
        big.path().display()
    ));
    s.send(r#"{"id":3,"method":"process/read","params":{"processId":"none","waitMs":0}}"#);
    s.send(r#"{"id":4,"method":"process/list"}"#);
    drop(s.stdin.take());
    let read = s.response(json!(2));
    let data = common::unb64(
        read["result"]["dataBase64"]
            .as_str()
            .unwrap_or_else(|| panic!("{read}")),
    );
    assert_eq!(data.len(), 1 << 20);
    assert_eq!(s.response(json!(3))["error"]["code"], -32600);
    assert!(s.response(json!(4))["result"]["processes"].is_array());
}

#[test]
fn an_over_long_line_is_answered_and_the_session_goes_on() {
    let (_dir, secret, config) = write_config("[server]\nmax_message_bytes = 1000\n");
    let token = common::mint(&secret, "t1", common::ALL_SCOPES);
    let d = tempfile::tempdir().unwrap();
    let mut s = Stdio1::start_with(&config, Some(&token), d);
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#);
    s.response(json!(1));
    s.send(r#"{"method":"initialized"}"#);
    s.send(&format!(
        r#"{{"id":2,"method":"process/list","pad":"{}"}}"#,
        "x".repeat(5000)
    ));
    let e = s.response(json!(-1));
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000-byte"),
        "{e}"
    );
    // The rest of the long line was discarded; the next line is served.
    s.send(r#"{"id":3,"method":"process/list"}"#);
    let r = s.response(json!(3));
    assert!(r["result"]["processes"].is_array(), "{r}");
}

/// A descriptor the gateway inherited (here fd 7, a "key file") never
/// reaches a tenant process.
#[test]
fn inherited_descriptors_do_not_reach_tenant_processes() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let (dir, secret, config) = write_config("");
    std::fs::write(dir.path().join("leak"), "inherited-secret\n").unwrap();
    let leak = std::fs::File::open(dir.path().join("leak")).unwrap();
    let leak_fd = leak.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exec-gateway"));
    cmd.arg("stdio")
        .arg("--config")
        .arg(&config)
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env(
            "EXEC_GATEWAY_TOKEN",
            common::mint(&secret, "t1", common::ALL_SCOPES),
        );
    // SAFETY: dup2 only, after fork.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(leak_fd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut s = Stdio1::spawn(cmd, tempfile::tempdir().unwrap());
    drop(leak);
    s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#);
    s.response(json!(1));
    s.send(r#"{"method":"initialized"}"#);
    s.send(r#"{"id":2,"method":"process/start","params":{"processId":"p","argv":["sh","-c","cat <&7 || echo no-fd-7; ls /proc/self/fd | tr '\n' ' '; echo END"],"cwd":"/","env":{"PATH":"/usr/bin:/bin"},"tty":false}}"#);
    s.response(json!(2));
    let out = output_until(&mut s, "process/output", "p", "END");
    assert!(!out.contains("inherited-secret"), "{out}");
    assert!(out.contains("no-fd-7"), "{out}");
}

#[test]
fn stdio_without_a_valid_token_fails_initialize_with_32002() {
    let (_dir, _, config) = write_config("");
    let forged = common::mint(&common::random_secret(), "t1", common::ALL_SCOPES);
    for token in [None, Some(forged.as_str())] {
        let d = tempfile::tempdir().unwrap();
        let mut s = Stdio1::start_with(&config, token, d);
        s.send(r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#);
        let r = s.response(json!(1));
        assert_eq!(r["error"]["code"], -32002, "{r}");
        s.send(r#"{"id":2,"method":"process/list"}"#);
        assert_eq!(s.response(json!(2))["error"]["code"], -32600);
    }
}
