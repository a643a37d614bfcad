//! Imports between the top-level modules of `src/` run one way, in the
//! order the crate's `# Layout` (src/lib.rs) lists them: a module may use
//! only modules below it. A new import that points up (and so could close
//! a circle) fails here, naming the file.
//!
//! A module is a top-level file or folder under `src/`; a use is any
//! `crate::name` (paths, `use` lines, `crate::{a, b}` groups) outside the
//! unit tests at the bottom of a file.
//!
//! Inside every folder the same holds between its files and subfolders: no
//! circle (a file names a sibling as `crate::<folder>::x` or `super::x`);
//! and no file of `src/` is over 800 lines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top to bottom. Keep in step with `src/lib.rs`.
const ORDER: &[&str] = &[
    "cli",
    "client",
    "server",
    "transport",
    "forward",
    "gateway",
    "mcp",
    "probe",
    "middleware",
    "dispatch",
    "session",
    "preview",
    "tenant",
    "backend",
    "egress",
    "process",
    "worker",
    "registry",
    "snapshot",
    "image",
    "spawn",
    "isolation",
    "rpc",
    "fleet",
    "tls",
    "auth",
    "config",
    "fs",
    "outbound",
    "error",
    "protocol",
    "metrics",
    "audit",
    "webhooks",
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

/// A file's text without its unit tests at the bottom.
fn outside_tests(text: &str) -> &str {
    text.split("\n#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default()
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The names right after each `prefix` in `text`: `prefix name` or
/// `prefix{a, b::c}` (each item of the group).
fn names_after(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        let rest = &text[i + prefix.len()..];
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

/// The `crate::name`s a file mentions outside its unit tests.
fn crate_names(text: &str) -> Vec<String> {
    names_after(outside_tests(text), "crate::")
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

/// The modules inside one folder of `src/`: its files (but `mod.rs`) and
/// subfolders, each with its files and how many `super::` reach the
/// folder from each file.
fn folder_modules(dir: &Path) -> BTreeMap<String, Vec<(PathBuf, usize)>> {
    let mut mods = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut files = Vec::new();
            rust_files(&p, &mut files);
            let depth = |f: &PathBuf| {
                let up = f
                    .parent()
                    .unwrap()
                    .strip_prefix(dir)
                    .unwrap()
                    .components()
                    .count();
                up + usize::from(f.file_name().unwrap() != "mod.rs")
            };
            mods.insert(name, files.iter().map(|f| (f.clone(), depth(f))).collect());
        } else if p.extension().is_some_and(|x| x == "rs") && name != "mod.rs" && name != "mod" {
            mods.insert(name, vec![(p, 1)]);
        }
    }
    mods
}

/// The sibling modules a file of a folder names: `crate::<folder>::x`,
/// `crate::<folder>::{x, …}` or `super::x` (`super::` repeated `depth` times).
fn sibling_names(text: &str, folder_path: &str, depth: usize) -> Vec<String> {
    let text = outside_tests(text);
    let mut names = names_after(text, &format!("crate::{folder_path}::"));
    let sup = "super::".repeat(depth);
    for (i, _) in text.match_indices(&sup) {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c == ':' || c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        names.push(ident(&text[i + sup.len()..]));
    }
    names.retain(|n| !n.is_empty() && n != "super");
    names
}

/// A circle among `edges`, if any (depth-first search).
fn find_circle(edges: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut circle = path[at..].to_vec();
            circle.push(n.to_owned());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// Folders of `src/`, recursively.
fn folders(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.push(p.clone());
            folders(&p, out);
        }
    }
}

#[test]
fn no_import_circle_inside_any_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = Vec::new();
    folders(&src, &mut dirs);
    let mut circles = Vec::new();
    for dir in dirs {
        let rel = dir.strip_prefix(&src).unwrap();
        let folder_path = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("::");
        let mods = folder_modules(&dir);
        let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (m, files) in &mods {
            let out = edges.entry(m.clone()).or_default();
            for (f, depth) in files {
                let text = std::fs::read_to_string(f).unwrap();
                for n in sibling_names(&text, &folder_path, *depth) {
                    if n != *m && mods.contains_key(&n) && !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        if let Some(c) = find_circle(&edges) {
            circles.push(format!("{}/: {}", rel.display(), c.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles inside folders:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_folder_scanner_sees_siblings_and_circles() {
    let names = sibling_names(
        "use super::a::X;\nuse crate::t::{b, c::D};\nfn f() { crate::t::e(); super::super::z(); }",
        "t",
        1,
    );
    assert_eq!(names, ["b", "c", "e", "a"]);
    let edges: BTreeMap<String, Vec<String>> = [
        ("a".to_owned(), vec!["b".to_owned()]),
        ("b".to_owned(), vec!["c".to_owned()]),
        ("c".to_owned(), vec!["a".to_owned()]),
    ]
    .into_iter()
    .collect();
    assert_eq!(find_circle(&edges).unwrap(), ["a", "b", "c", "a"]);
    let one_way: BTreeMap<String, Vec<String>> = [
        ("a".to_owned(), vec!["b".to_owned()]),
        ("b".to_owned(), vec![]),
    ]
    .into_iter()
    .collect();
    assert_eq!(find_circle(&one_way), None);
}

#[test]
fn no_file_in_src_is_over_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 800).then(|| format!("{}: {n} lines", f.strip_prefix(&src).unwrap().display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "files over 800 lines:\n{}",
        long.join("\n")
    );
}
