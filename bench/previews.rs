//! Previews and forwards (docs/preview.md, docs/forward.md), beside the
//! same server reached directly in the same run: nginx serves the same
//! files twice, once on the host's loopback (the baseline, reached
//! directly) and once inside a tenant's network namespace (reached through
//! a path preview with a token, and through `exec-gateway port-forward`).
//! Figures: the p50 of 2,000 sequential 1 KiB GETs on one keep-alive
//! connection (the overhead is the difference), and one 256 MiB GET
//! (throughput). Every layer at its default (as root).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use super::harness::{BenchResult, Conn, Row, Server, err, ms, percentile};

const REQUESTS: usize = 2000;
const BULK_BYTES: usize = 256 << 20;
const PORT: u16 = 18_080;

/// nginx serving `www` on `127.0.0.1:port`, everything it writes under
/// `dir`, in the foreground.
fn nginx_conf(dir: &Path, www: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "daemon off; master_process off; worker_processes 1; error_log stderr error; pid {d}/nginx.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 1000000;\n\
         client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;\n\
         uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;\n\
         server {{ listen 127.0.0.1:{port}; root {w}; }} }}\n",
        w = www.display()
    )
}

/// One GET on `s` (keep-alive): the body's length.
async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut BufReader<S>,
    path: &str,
    auth: &str,
) -> BenchResult<usize> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n{auth}\r\n");
    s.get_mut().write_all(req.as_bytes()).await.map_err(err)?;
    let mut len = None;
    let mut status = String::new();
    s.read_line(&mut status).await.map_err(err)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {}", status.trim()));
    }
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.map_err(err)? == 0 {
            return Err("connection closed in the head".into());
        }
        if line == "\r\n" {
            break;
        }
        if let Some((n, v)) = line.split_once(':')
            && n.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let len = len.ok_or("no content-length")?;
    let mut left = len;
    let mut buf = vec![0u8; 256 << 10];
    while left > 0 {
        let n = s.read(&mut buf[..left.min(256 << 10)]).await.map_err(err)?;
        if n == 0 {
            return Err("connection closed in the body".into());
        }
        left -= n;
    }
    Ok(len)
}

/// p50 of `REQUESTS` small GETs and the time of one bulk GET, on one
/// connection to `addr` with `prefix` before each path.
async fn measure(addr: &str, prefix: &str, auth: &str) -> BenchResult<(Duration, Duration)> {
    let tcp = TcpStream::connect(addr).await.map_err(err)?;
    tcp.set_nodelay(true).map_err(err)?;
    let mut s = BufReader::with_capacity(256 << 10, tcp);
    for _ in 0..100 {
        get(&mut s, &format!("{prefix}/1k"), auth).await?;
    }
    let mut times = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        get(&mut s, &format!("{prefix}/1k"), auth).await?;
        times.push(t.elapsed());
    }
    times.sort();
    let t = Instant::now();
    let n = get(&mut s, &format!("{prefix}/bulk"), auth).await?;
    let bulk = t.elapsed();
    if n != BULK_BYTES {
        return Err(format!("bulk GET gave {n} bytes"));
    }
    Ok((percentile(&times, 0.5), bulk))
}

fn mbps(d: Duration) -> String {
    format!("{:.0} MB/s", BULK_BYTES as f64 / d.as_secs_f64() / 1e6)
}

pub async fn figures(exe: &Path, dir: &Path, secret: &str) -> BenchResult<Vec<Row>> {
    if !Path::new("/usr/sbin/nginx").exists() {
        return Err("the preview figures need nginx (Debian package nginx)".into());
    }
    let roots = dir.join("preview-roots");
    std::fs::create_dir_all(&roots).map_err(err)?;
    let path = dir.join("previews.toml");
    std::fs::write(
        &path,
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{k}\"\n\
             [tenant_template]\nroot = \"{r}/{{tenant}}\"\n\
             requests_per_second = 1000000\nburst = 1000000\n",
            k = dir.join("hs256.key").display(),
            r = roots.display(),
        ),
    )
    .map_err(err)?;
    let settings = exec_gateway::config::Config::load(&path)
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let gw = Server::gateway(exe, &path.display().to_string()).await?;
    let token = exec_gateway::auth::mint(
        jsonwebtoken::Algorithm::HS256,
        secret.as_bytes(),
        &settings.auth,
        "bench",
        &[
            "exec".to_owned(),
            "preview".to_owned(),
            "forward".to_owned(),
        ],
        Duration::from_secs(3600),
        "bench",
    )?;
    let url = format!("{}/?access_token={token}", gw.url);
    let root = roots.join("bench");
    let cwd = root.display().to_string();
    let mut c = Conn::open_in(&url, &cwd).await?;
    // The same files for both servers.
    let www = root.join("www");
    std::fs::create_dir_all(&www).map_err(err)?;
    std::fs::write(www.join("1k"), vec![b'x'; 1024]).map_err(err)?;
    std::fs::write(www.join("bulk"), vec![b'y'; BULK_BYTES]).map_err(err)?;
    let inside = root.join("nginx-in");
    std::fs::create_dir_all(&inside).map_err(err)?;
    std::fs::write(inside.join("nginx.conf"), nginx_conf(&inside, &www, PORT)).map_err(err)?;
    let _ = std::process::Command::new("chown")
        .args(["-R", "--reference", &cwd, &cwd])
        .status();
    c.send(
        "process/start",
        json!({"processId": "nginx", "argv": ["/usr/sbin/nginx", "-c", inside.join("nginx.conf"), "-p", &inside],
               "cwd": cwd, "env": {"PATH": "/usr/bin:/bin:/usr/sbin"}, "tty": false}),
    )
    .await?;
    // The baseline: the same nginx on the host's loopback.
    let outside = dir.join("nginx-out");
    std::fs::create_dir_all(&outside).map_err(err)?;
    let port_out = PORT + 1;
    std::fs::write(
        outside.join("nginx.conf"),
        nginx_conf(&outside, &www, port_out),
    )
    .map_err(err)?;
    let mut host_nginx = tokio::process::Command::new("/usr/sbin/nginx")
        .arg("-c")
        .arg(outside.join("nginx.conf"))
        .arg("-p")
        .arg(&outside)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(err)?;
    // A production reverse proxy for scale: nginx's proxy_pass (keep-alive
    // upstream, buffering off: streamed like ours) to the host's server.
    let proxy = dir.join("nginx-proxy");
    std::fs::create_dir_all(&proxy).map_err(err)?;
    let port_proxy = PORT + 2;
    let pd = proxy.display();
    std::fs::write(
        proxy.join("nginx.conf"),
        format!(
            "daemon off; master_process off; worker_processes 1; error_log stderr error; pid {pd}/nginx.pid;\n\
             events {{ worker_connections 256; }}\n\
             http {{ access_log off; keepalive_requests 1000000;\n\
             client_body_temp_path {pd}/t1; proxy_temp_path {pd}/t2; fastcgi_temp_path {pd}/t3;\n\
             uwsgi_temp_path {pd}/t4; scgi_temp_path {pd}/t5;\n\
             upstream app {{ server 127.0.0.1:{port_out}; keepalive 4; }}\n\
             server {{ listen 127.0.0.1:{port_proxy}; location / {{ proxy_pass http://app;\n\
             proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }} }} }}\n"
        ),
    )
    .map_err(err)?;
    let mut proxy_nginx = tokio::process::Command::new("/usr/sbin/nginx")
        .arg("-c")
        .arg(proxy.join("nginx.conf"))
        .arg("-p")
        .arg(&proxy)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(err)?;
    let via_nginx = format!("127.0.0.1:{port_proxy}");
    let gw_addr = gw
        .url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .to_owned();
    let direct = format!("127.0.0.1:{port_out}");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let prefix = format!("/preview/{}/{PORT}", c.session_id);
    // Both servers answer before anything is measured.
    let mut ready = false;
    for _ in 0..200 {
        if measure_once(&gw_addr, &prefix, &auth).await
            && measure_once(&direct, "", "").await
            && measure_once(&via_nginx, "", "").await
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !ready {
        return Err("nginx did not answer inside the tenant or on the host".into());
    }
    let (d_p50, d_bulk) = measure(&direct, "", "").await?;
    let (p_p50, p_bulk) = measure(&gw_addr, &prefix, &auth).await?;
    let (n_p50, n_bulk) = measure(&via_nginx, "", "").await?;
    let _ = proxy_nginx.kill().await;
    // Through `exec-gateway port-forward` (a websocket per connection).
    let mut pf = tokio::process::Command::new(exe)
        .args([
            "port-forward",
            "--url",
            &gw.url,
            "--token",
            &token,
            &c.session_id,
        ])
        .arg(format!("0:{PORT}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(err)?;
    let mut line = String::new();
    BufReader::new(pf.stdout.take().ok_or("no stdout")?)
        .read_line(&mut line)
        .await
        .map_err(err)?;
    let local = line.trim().to_owned();
    let (f_p50, f_bulk) = measure(&local, "", "").await?;
    let _ = pf.kill().await;
    let _ = host_nginx.kill().await;
    let over = |p: Duration| p.saturating_sub(d_p50);
    let ratio = |b: Duration| d_bulk.as_secs_f64() / b.as_secs_f64();
    Ok(vec![
        Row {
            figure: "preview (path, token): 1 KiB GET p50 overhead over nginx reached directly",
            ours: format!("+{}", ms(over(p_p50))),
            baseline: format!("{} direct; {} through", ms(d_p50), ms(p_p50)),
            ratio: format!("{:.2}x", p_p50.as_secs_f64() / d_p50.as_secs_f64()),
            target: "<= +0.3 ms",
            met: Some(over(p_p50) <= Duration::from_micros(300)),
            reference: String::new(),
        },
        Row {
            figure: "preview: one 256 MiB GET, throughput against direct",
            ours: mbps(p_bulk),
            baseline: format!("{} (nginx directly)", mbps(d_bulk)),
            ratio: format!("{:.0}%", ratio(p_bulk) * 100.0),
            target: ">= 70%",
            met: Some(ratio(p_bulk) >= 0.7),
            reference: String::new(),
        },
        Row::reported(
            "nginx proxy_pass to the same server (a reference proxy): 1 KiB GET p50 overhead",
            format!("+{}", ms(over(n_p50))),
            format!("{} direct; {} through", ms(d_p50), ms(n_p50)),
            format!("{:.2}x", n_p50.as_secs_f64() / d_p50.as_secs_f64()),
        ),
        Row::reported(
            "nginx proxy_pass: one 256 MiB GET, throughput against direct",
            mbps(n_bulk),
            format!("{} (nginx directly)", mbps(d_bulk)),
            format!("{:.0}%", ratio(n_bulk) * 100.0),
        ),
        Row {
            figure: "port-forward: 1 KiB GET p50 overhead over nginx reached directly",
            ours: format!("+{}", ms(over(f_p50))),
            baseline: format!("{} direct; {} through", ms(d_p50), ms(f_p50)),
            ratio: format!("{:.2}x", f_p50.as_secs_f64() / d_p50.as_secs_f64()),
            target: "<= +0.3 ms",
            met: Some(over(f_p50) <= Duration::from_micros(300)),
            reference: String::new(),
        },
        Row {
            figure: "port-forward: one 256 MiB GET, throughput against direct",
            ours: mbps(f_bulk),
            baseline: format!("{} (nginx directly)", mbps(d_bulk)),
            ratio: format!("{:.0}%", ratio(f_bulk) * 100.0),
            target: ">= 70%",
            met: Some(ratio(f_bulk) >= 0.7),
            reference: String::new(),
        },
    ])
}

/// Whether one small GET through `addr` answers.
async fn measure_once(addr: &str, prefix: &str, auth: &str) -> bool {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return false;
    };
    let mut s = BufReader::new(tcp);
    get(&mut s, &format!("{prefix}/1k"), auth).await.is_ok()
}
