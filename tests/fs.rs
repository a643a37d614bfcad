//! fs/* over a real websocket against a real directory tree (docs/protocol.md, "Filesystem"):
//! params, defaults, results and the error mapping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Gateway, b64, unb64};
use serde_json::json;

#[tokio::test]
async fn read_write_metadata_and_directories() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let tmp = common::scratch();
    let dir = tmp.path().display().to_string();
    let file = format!("{dir}/a/b/f.bin");
    // Missing parent → -32004.
    let (code, msg) = c
        .call_err(
            "fs/writeFile",
            json!({"path": file, "dataBase64": b64(b"x")}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32004, "No such file or directory (os error 2)")
    );
    // recursive defaults to true.
    assert_eq!(
        c.call("fs/createDirectory", json!({"path": format!("{dir}/a/b")}))
            .await,
        json!({})
    );
    let (code, _) = c
        .call_err(
            "fs/createDirectory",
            json!({"path": format!("{dir}/x/y"), "recursive": false}),
        )
        .await;
    assert_eq!(code, -32004);
    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    c.call(
        "fs/writeFile",
        json!({"path": file, "dataBase64": b64(&data)}),
    )
    .await;
    let r = c.call("fs/readFile", json!({"path": file})).await;
    assert_eq!(unb64(r["dataBase64"].as_str().unwrap()), data);
    // `..` is resolved lexically.
    let r = c
        .call(
            "fs/readFile",
            json!({"path": format!("{dir}/a/b/../b/f.bin")}),
        )
        .await;
    assert_eq!(unb64(r["dataBase64"].as_str().unwrap()).len(), data.len());
    let (code, msg) = c
        .call_err("fs/writeFile", json!({"path": file, "dataBase64": "***"}))
        .await;
    assert_eq!(code, -32600);
    assert!(
        msg.starts_with("fs/writeFile requires valid base64 dataBase64: "),
        "{msg}"
    );
    let (code, msg) = c
        .call_err("fs/readFile", json!({"path": "relative/path"}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32602, "AbsolutePathBuf deserialized without a base path")
    );
    let m = c.call("fs/getMetadata", json!({"path": file})).await;
    assert_eq!(m["isFile"], true);
    assert_eq!(m["isDirectory"], false);
    assert_eq!(m["isSymlink"], false);
    assert!(m["modifiedAtMs"].as_i64().unwrap() > 1_600_000_000_000);
    std::os::unix::fs::symlink(&file, format!("{dir}/link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", format!("{dir}/dangling")).unwrap();
    let m = c
        .call("fs/getMetadata", json!({"path": format!("{dir}/link")}))
        .await;
    assert_eq!(
        (m["isFile"].as_bool(), m["isSymlink"].as_bool()),
        (Some(true), Some(true))
    );
    let r = c.call("fs/readDirectory", json!({"path": dir})).await;
    let mut names: Vec<(String, bool, bool)> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["fileName"].as_str().unwrap().to_owned(),
                e["isDirectory"].as_bool().unwrap(),
                e["isFile"].as_bool().unwrap(),
            )
        })
        .collect();
    names.sort();
    // The dangling symlink is skipped.
    assert_eq!(
        names,
        vec![("a".into(), true, false), ("link".into(), false, true)]
    );
    let (code, msg) = c
        .call_err("fs/getMetadata", json!({"path": format!("{dir}/nope")}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32004, "No such file or directory (os error 2)")
    );
}

#[tokio::test]
async fn remove_and_copy_follow_the_reference_rules() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let tmp = common::scratch();
    let dir = tmp.path().display().to_string();
    std::fs::create_dir_all(format!("{dir}/src/sub")).unwrap();
    std::fs::write(format!("{dir}/src/sub/f"), b"data").unwrap();
    std::os::unix::fs::symlink("sub/f", format!("{dir}/src/rel-link")).unwrap();
    nix_mkfifo(&format!("{dir}/src/fifo"));
    let (code, msg) = c
        .call_err("fs/copy", json!({"sourcePath": format!("{dir}/src"), "destinationPath": format!("{dir}/dst"), "recursive": false}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32600,
            "fs/copy requires recursive: true when sourcePath is a directory"
        )
    );
    let (code, msg) = c
        .call_err("fs/copy", json!({"sourcePath": format!("{dir}/src"), "destinationPath": format!("{dir}/src/sub/inner"), "recursive": true}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32600,
            "fs/copy cannot copy a directory to itself or one of its descendants"
        )
    );
    let (code, _) = c
        .call_err(
            "fs/copy",
            json!({"sourcePath": format!("{dir}/src"), "destinationPath": format!("{dir}/dst")}),
        )
        .await;
    assert_eq!(code, -32602, "recursive is required");
    c.call("fs/copy", json!({"sourcePath": format!("{dir}/src"), "destinationPath": format!("{dir}/dst"), "recursive": true}))
        .await;
    assert_eq!(std::fs::read(format!("{dir}/dst/sub/f")).unwrap(), b"data");
    assert_eq!(
        std::fs::read_link(format!("{dir}/dst/rel-link"))
            .unwrap()
            .to_str(),
        Some("sub/f")
    );
    assert!(
        !std::path::Path::new(&format!("{dir}/dst/fifo")).exists(),
        "special files skipped"
    );
    let (code, msg) = c
        .call_err("fs/copy", json!({"sourcePath": format!("{dir}/src/fifo"), "destinationPath": format!("{dir}/f2"), "recursive": false}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32600,
            "fs/copy only supports regular files, directories, and symlinks"
        )
    );
    // Reading a FIFO fails at once instead of hanging.
    let (code, _) = c
        .call_err("fs/readFile", json!({"path": format!("{dir}/src/fifo")}))
        .await;
    assert_eq!(code, -32600);
    // remove: non-empty dir without recursive, missing path with/without force.
    let (code, msg) = c
        .call_err(
            "fs/remove",
            json!({"path": format!("{dir}/dst"), "recursive": false}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32603, "Directory not empty (os error 39)")
    );
    assert_eq!(
        c.call("fs/remove", json!({"path": format!("{dir}/missing")}))
            .await,
        json!({})
    );
    let (code, _) = c
        .call_err(
            "fs/remove",
            json!({"path": format!("{dir}/missing"), "force": false}),
        )
        .await;
    assert_eq!(code, -32004);
    // Removing a symlink removes the link, not its target.
    c.call("fs/remove", json!({"path": format!("{dir}/dst/rel-link")}))
        .await;
    assert!(std::path::Path::new(&format!("{dir}/dst/sub/f")).exists());
    c.call("fs/remove", json!({"path": format!("{dir}/dst")}))
        .await;
    assert!(!std::path::Path::new(&format!("{dir}/dst")).exists());
}

fn nix_mkfifo(path: &str) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn confined_root_refuses_escapes() {
    let tmp = common::scratch();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(tmp.path().join("secret"), b"s3cret").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("secret"), root.join("abs-out")).unwrap();
    std::os::unix::fs::symlink("../secret", root.join("rel-out")).unwrap();
    std::os::unix::fs::symlink("/proc/self/root/etc/passwd", root.join("proc-out")).unwrap();
    std::fs::write(root.join("ok"), b"fine").unwrap();
    let root_s = root.display().to_string();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"{root_s}\"\n",
            dir.display()
        )
    });
    let (mut c, _) = gw.session().await;
    let r = root.display().to_string();
    let ok = c
        .call("fs/readFile", json!({"path": format!("{r}/ok")}))
        .await;
    assert_eq!(unb64(ok["dataBase64"].as_str().unwrap()), b"fine");
    // Every escape reads as "not found" (-32004), saying why.
    for path in [
        format!("{r}/../secret"),
        format!("{r}/abs-out"),
        format!("{r}/rel-out"),
        format!("{r}/proc-out"),
        "/etc/passwd".to_owned(),
    ] {
        let resp = c.call_raw("fs/readFile", json!({"path": path})).await;
        assert_eq!(resp["error"]["code"], -32004, "escape via {path}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap();
        assert!(msg.ends_with("is outside the tenant root"), "{path}: {msg}");
    }
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"p","argv":["true"],"cwd":"/tmp","env":{},"tty":false}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32004, "path `/tmp` is outside the tenant root"),
        "cwd outside the root"
    );
    c.call(
        "process/start",
        json!({"processId":"p","argv":["true"],"cwd": r,"env":{},"tty":false}),
    )
    .await;
}

/// `ln -s "$PWD/x" y`: an absolute symlink naming a path inside the root
/// works in every fs method, as a relative one does; one that leaves the
/// root (directly, through `..`, or through a chain) is still refused.
#[tokio::test]
async fn absolute_symlinks_inside_the_root_work_everywhere() {
    let tmp = common::scratch();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("dir/sub")).unwrap();
    std::fs::write(root.join("dir/f"), b"inside").unwrap();
    std::fs::write(tmp.path().join("secret"), b"s3cret").unwrap();
    let link = |target: &std::path::Path, name: &str| {
        std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    };
    link(&root.join("dir/f"), "file-link");
    link(&root.join("dir"), "dir-link");
    link(&root, "root-link");
    link(&root.join("dir-link/f"), "chain-link");
    link(&root.join("dir/new"), "dangling-in");
    link(&root.join("dir/../../secret"), "dotdot-out");
    link(&tmp.path().join("secret"), "abs-out");
    link(&root.join("abs-out"), "chain-out");
    let root_s = root.display().to_string();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"{root_s}\"\n",
            dir.display()
        )
    });
    let (mut c, _) = gw.session().await;
    let r = root_s.as_str();
    for path in [
        format!("{r}/file-link"),
        format!("{r}/dir-link/f"),
        format!("{r}/root-link/dir/f"),
        format!("{r}/chain-link"),
    ] {
        let got = c.call("fs/readFile", json!({"path": path})).await;
        assert_eq!(
            unb64(got["dataBase64"].as_str().unwrap()),
            b"inside",
            "{path}"
        );
        let meta = c.call("fs/getMetadata", json!({"path": path})).await;
        assert_eq!(meta["isFile"], true, "{path}: {meta}");
        let canon = c.call("fs/canonicalize", json!({"path": path})).await;
        assert_eq!(canon["path"], format!("{r}/dir/f"), "{path}");
    }
    let listed = c
        .call("fs/readDirectory", json!({"path": format!("{r}/dir-link")}))
        .await;
    let mut names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fileName"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "sub"]);
    // Writes through the links land inside the root.
    c.call(
        "fs/writeFile",
        json!({"path": format!("{r}/dangling-in"), "dataBase64": b64(b"made")}),
    )
    .await;
    assert_eq!(std::fs::read(root.join("dir/new")).unwrap(), b"made");
    c.call(
        "fs/createDirectory",
        json!({"path": format!("{r}/dir-link/sub/deep"), "recursive": false}),
    )
    .await;
    assert!(root.join("dir/sub/deep").is_dir());
    c.call(
        "fs/copy",
        json!({"sourcePath": format!("{r}/file-link"), "destinationPath": format!("{r}/dir-link/copied"), "recursive": false}),
    )
    .await;
    // A link is copied as the link it is (verbatim), as the reference does.
    assert_eq!(
        std::fs::read_link(root.join("dir/copied")).unwrap(),
        root.join("dir/f")
    );
    c.call(
        "fs/remove",
        json!({"path": format!("{r}/dir-link/copied"), "recursive": false, "force": false}),
    )
    .await;
    assert!(!root.join("dir/copied").exists());
    assert!(root.join("dir/f").exists(), "the link's target stays");
    // Removing a link removes the link, not what it names.
    c.call(
        "fs/remove",
        json!({"path": format!("{r}/dir-link"), "recursive": true, "force": false}),
    )
    .await;
    assert!(root.join("dir/f").exists() && !root.join("dir-link").exists());
    for path in [
        format!("{r}/dotdot-out"),
        format!("{r}/abs-out"),
        format!("{r}/chain-out"),
    ] {
        for method in ["fs/readFile", "fs/getMetadata", "fs/canonicalize"] {
            let resp = c.call_raw(method, json!({"path": path})).await;
            assert_eq!(resp["error"]["code"], -32004, "{method} {path}: {resp}");
            let msg = resp["error"]["message"].as_str().unwrap();
            assert!(msg.ends_with("is outside the tenant root"), "{path}: {msg}");
        }
    }
    let resp = c
        .call_raw(
            "fs/writeFile",
            json!({"path": format!("{r}/abs-out"), "dataBase64": b64(b"x")}),
        )
        .await;
    assert_eq!(resp["error"]["code"], -32004, "{resp}");
    assert_eq!(std::fs::read(tmp.path().join("secret")).unwrap(), b"s3cret");
}
