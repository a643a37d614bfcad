//! `fs/readFile` of a 1 MiB file, p50, read by the lean client (borrowed
//! fields, base64 left undecoded) and by a parsing client (a
//! `serde_json::Value`, the scalar `base64` crate), against the same file
//! read and base64-encoded by this process with the scalar `base64` crate
//! (`read+b64`, the targets' baseline) and with the SIMD codec the gateway
//! uses (`read+simd`, reported); and the parsing client's own share, the
//! reply taken apart from memory.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use super::harness::{BenchResult, Conn, Row, Run, err, ms, percentile, scalar_b64};

/// The 1 MiB file the figures read, written in `dir`; its path.
pub(crate) fn one_mib_file(dir: &Path) -> BenchResult<String> {
    let file = dir.join("1mib.bin");
    let data: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).map_err(err)?;
    let file = file.display().to_string();
    Ok(file)
}

/// Figure 4, reading `file` (from [`one_mib_file`]).
pub(crate) async fn figures(run: &Run<'_>, file: &str, rows: &mut Vec<Row>) -> BenchResult<()> {
    let Run {
        gw,
        reference,
        n,
        ref_n,
        ..
    } = *run;
    // 4. fs/readFile 1 MiB.
    let direct = direct_read_file_p50(file, n.min(500), false)?;
    let direct_simd = direct_read_file_p50(file, n.min(500), true)?;
    let ours = read_file_p50(&gw.url, file, n.min(500), Consume::Lean).await?;
    let r = match &reference {
        Some(r) => ms(read_file_p50(&r.url, file, ref_n, Consume::Lean).await?),
        None => String::new(),
    };
    let ratio = ours.as_secs_f64() / direct.as_secs_f64();
    rows.push(Row {
        figure: "fs/readFile 1 MiB, p50",
        ours: ms(ours),
        baseline: format!("{} read+b64", ms(direct)),
        ratio: format!("{ratio:.2}x"),
        target: "≤ 2x read+base64",
        met: Some(ratio <= 2.0),
        reference: r,
    });
    let parsing = read_file_p50(&gw.url, file, n.min(500), Consume::Parsing).await?;
    let r = match &reference {
        Some(r) => ms(read_file_p50(&r.url, file, ref_n, Consume::Parsing).await?),
        None => String::new(),
    };
    let ratio = parsing.as_secs_f64() / direct.as_secs_f64();
    rows.push(Row {
        figure: "fs/readFile 1 MiB, p50, parsing client",
        ours: ms(parsing),
        baseline: format!("{} read+b64", ms(direct)),
        ratio: format!("{ratio:.2}x"),
        target: "≤ 2x read+base64",
        met: Some(ratio <= 2.0),
        reference: r,
    });
    // What bounds the row above: the parsing client alone taking the 1 MiB
    // reply apart (parse + scalar base64), no gateway and no file.
    let floor = parsing_reply_p50(n.min(500))?;
    rows.push(Row::reported(
        "parsing client alone: a 1 MiB readFile reply, p50",
        ms(floor),
        format!("{} read+b64", ms(direct)),
        format!("{:.2}x", floor.as_secs_f64() / direct.as_secs_f64()),
    ));
    rows.push(Row::reported(
        "fs/readFile 1 MiB, p50 (vs SIMD base64)",
        ms(ours),
        format!("{} read+simd", ms(direct_simd)),
        format!("{:.2}x", ours.as_secs_f64() / direct_simd.as_secs_f64()),
    ));
    Ok(())
}

/// The parsing client's own share of `fs/readFile` 1 MiB: the reply's
/// JSON parsed into a `Value` and its data decoded, from memory.
fn parsing_reply_p50(n: usize) -> BenchResult<Duration> {
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let reply = json!({"id": 1, "result": {
        "dataBase64": base64_simd::STANDARD.encode_to_string(&data)}})
    .to_string();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let v: Value = serde_json::from_str(&reply).map_err(err)?;
        let back = scalar_b64(v["result"]["dataBase64"].as_str().unwrap_or_default())?;
        if back.len() != data.len() {
            return Err("readFile reply did not round-trip".to_owned());
        }
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// How a benchmark client consumes what the gateway sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consume {
    /// Borrowed fields only, base64 left undecoded (or SIMD-decoded).
    Lean,
    /// As Codex's client does: every frame parsed into a
    /// `serde_json::Value`, every chunk decoded with the `base64` crate.
    Parsing,
}

async fn read_file_p50(url: &str, path: &str, n: usize, consume: Consume) -> BenchResult<Duration> {
    let mut c = Conn::open(url).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let id = c.send("fs/readFile", json!({"path": path})).await?;
        let text = c.next_text().await?;
        if consume == Consume::Parsing {
            let v: Value = serde_json::from_str(&text).map_err(err)?;
            let data = scalar_b64(v["result"]["dataBase64"].as_str().unwrap_or_default())?;
            if v["id"] != json!(id) || data.len() != 1024 * 1024 {
                return Err("unexpected readFile response".to_owned());
            }
            if i >= 10 {
                lat.push(t.elapsed());
            }
            continue;
        }
        #[derive(Deserialize)]
        struct Resp<'a> {
            id: i64,
            #[serde(borrow)]
            result: ReadFile<'a>,
        }
        #[derive(Deserialize)]
        struct ReadFile<'a> {
            #[serde(borrow, rename = "dataBase64")]
            data_base64: &'a str,
        }
        let r: Resp<'_> = serde_json::from_str(&text).map_err(err)?;
        if r.id != id || r.result.data_base64.len() < 1024 * 1024 {
            return Err("unexpected readFile response".to_owned());
        }
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// Direct read + base64, with the scalar `base64` crate (the baseline the
/// target was set against) or with the SIMD codec the gateway uses.
fn direct_read_file_p50(path: &str, n: usize, simd: bool) -> BenchResult<Duration> {
    use base64::Engine as _;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let data = std::fs::read(path).map_err(err)?;
        let s = if simd {
            base64_simd::STANDARD.encode_to_string(&data)
        } else {
            base64::engine::general_purpose::STANDARD.encode(&data)
        };
        std::hint::black_box(s);
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}
