//! Imports between the top-level modules of `src/` run one way, in the
//! order the crate's `# Layout` (src/lib.rs) lists them: a module may use
//! only modules below it. A new import that points up (and so could close
//! a circle) fails here, naming the file.
//!
//! A module is a top-level file or folder under `src/`; a use is any
//! `crate::name` (paths, `use` lines, `crate::{a, b}` groups) outside the
//! unit tests at the bottom of a file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top to bottom. Keep in step with `src/lib.rs`.
const ORDER: &[&str] = &[
    "cli",
    "client",
    "server",
    "transport",
    "gateway",
    "probe",
    "middleware",
    "dispatch",
    "session",
    "tenant",
    "backend",
    "exec",
    "worker",
    "executors",
    "spawn",
    "isolation",
    "rpc",
    "fleet",
    "auth",
    "config",
    "fs",
    "outbound",
    "error",
    "protocol",
    "metrics",
    "telemetry",
    "task",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level modules of `src/` and the files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut mods = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "bin" {
                let mut files = Vec::new();
                rust_files(&p, &mut files);
                mods.insert(name, files);
            }
        } else if name != "main" && name != "lib" {
            mods.insert(name, vec![p]);
        }
    }
    mods
}

/// The `crate::name`s a file mentions outside its unit tests.
fn crate_names(text: &str) -> Vec<String> {
    let text = text
        .split("\n#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or_default();
            names.extend(inner.split(',').map(|item| ident(item.trim())));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn imports_run_one_way_in_the_documented_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let unlisted: Vec<&String> = mods.keys().filter(|m| rank(m).is_none()).collect();
    assert!(
        unlisted.is_empty(),
        "modules missing from ORDER (and the Layout of src/lib.rs): {unlisted:?}"
    );
    let mut upward = Vec::new();
    for (m, files) in &mods {
        for f in files {
            let text = std::fs::read_to_string(f).unwrap();
            for n in crate_names(&text) {
                if n == *m || !mods.contains_key(&n) {
                    continue;
                }
                if rank(&n) < rank(m) {
                    upward.push(format!(
                        "{} uses crate::{n}, which is above {m}",
                        f.strip_prefix(&src).unwrap_or(f).display()
                    ));
                }
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports pointing up the layering:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_layout_in_lib_rs_lists_the_same_order() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let listed: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let top: Vec<&str> = ORDER.iter().copied().take(listed.len()).collect();
    assert_eq!(listed, top, "src/lib.rs's Layout and ORDER disagree");
}

#[test]
fn the_scanner_sees_paths_and_groups() {
    let names = crate_names(
        "use crate::a::b;\nuse crate::{c, d::e};\nfn f() { crate::g(); }\n#[cfg(test)]\nmod tests { use crate::h; }",
    );
    assert_eq!(names, ["a", "c", "d", "g"]);
}
