//! The tools' descriptions: name, scope, what the model is told, the
//! JSON Schema of the arguments (their bounds are `tools`' constants).

use serde_json::{Value, json};

use super::tools::{
    DEFAULT_OUTPUT_BYTES, DEFAULT_READ_BYTES, DEFAULT_RUN_TIMEOUT, MAX_READ_WAIT, MAX_RUN_TIMEOUT,
    MAX_TOOL_BYTES, SEARCH_MAX_RESULTS,
};
use crate::auth::Scope;

/// One tool: its name, the scope it needs, what it says it does, the JSON
/// Schema of its arguments and whether it only reads.
pub struct Spec {
    pub name: &'static str,
    pub scope: Scope,
    pub description: &'static str,
    pub input: fn() -> Value,
    pub read_only: bool,
    /// Whether it ends or replaces what runs (terminate, fork).
    pub destructive: bool,
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn command_props() -> Value {
    json!({
        "command": {"type": "string", "description": "A shell command line, run with `sh -c`."},
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                 "description": "The program and its arguments, run without a shell (instead of `command`)."},
        "cwd": {"type": "string", "description": "Working directory (default: the tenant's root); relative to the root when relative."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment variables to set."},
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

pub const TOOLS: &[Spec] = &[
    Spec {
        name: "run_command",
        scope: Scope::Exec,
        description: "Run a command to completion in the sandbox and return its exit code and output \
(each stream cut to max_output_bytes, the cut counted). Past timeout_ms the process is terminated \
and timed_out is true.",
        input: || {
            object(
                merge(
                    command_props(),
                    json!({
                        "stdin": {"type": "string", "description": "Text written to the command's standard input, which is then closed."},
                        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": MAX_RUN_TIMEOUT.as_millis() as u64, "default": DEFAULT_RUN_TIMEOUT.as_millis() as u64},
                        "max_output_bytes": {"type": "integer", "minimum": 0, "maximum": MAX_TOOL_BYTES, "default": DEFAULT_OUTPUT_BYTES},
                    }),
                ),
                &[],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "process_start",
        scope: Scope::Exec,
        description: "Start a long-running process (a server, a watcher, an interactive program) and \
return its process_id at once; read its output with process_read, write to it with process_write.",
        input: || {
            object(
                merge(
                    command_props(),
                    json!({
                        "process_id": {"type": "string", "description": "Its id (default: one is chosen)."},
                        "tty": {"type": "boolean", "default": false, "description": "Run on a terminal."},
                    }),
                ),
                &[],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "process_read",
        scope: Scope::Exec,
        description: "Read a process's output after a sequence number (0: from the start), waiting up \
to wait_ms for some; says whether it has exited and with what code. Pass the result's \
next_after_seq as after_seq to read on.",
        input: || {
            object(
                json!({
                    "process_id": {"type": "string"},
                    "after_seq": {"type": "integer", "minimum": 0, "default": 0},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_TOOL_BYTES, "default": DEFAULT_OUTPUT_BYTES},
                    "wait_ms": {"type": "integer", "minimum": 0, "maximum": MAX_READ_WAIT.as_millis() as u64, "default": 0},
                }),
                &["process_id"],
            )
        },
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "process_write",
        scope: Scope::Exec,
        description: "Write text to a process's standard input (started with stdin open: process_start), \
and optionally close it.",
        input: || {
            object(
                json!({
                    "process_id": {"type": "string"},
                    "data": {"type": "string"},
                    "close_stdin": {"type": "boolean", "default": false},
                }),
                &["process_id"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "process_terminate",
        scope: Scope::Exec,
        description: "Terminate a process (and its process group).",
        input: || object(json!({"process_id": {"type": "string"}}), &["process_id"]),
        read_only: false,
        destructive: true,
    },
    Spec {
        name: "process_list",
        scope: Scope::Exec,
        description: "List this session's processes: running or exited, with exit codes.",
        input: || object(json!({}), &[]),
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "read_file",
        scope: Scope::FsRead,
        description: "Read a file (at most max_bytes from offset); text when it is UTF-8, else base64. \
eof says whether the end was reached.",
        input: || {
            object(
                json!({
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 0, "default": 0},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_TOOL_BYTES, "default": DEFAULT_READ_BYTES},
                }),
                &["path"],
            )
        },
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "write_file",
        scope: Scope::FsWrite,
        description: "Write a whole file (created or replaced); `encoding: base64` for bytes. \
create_parents makes missing directories first.",
        input: || {
            object(
                json!({
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf8", "base64"], "default": "utf8"},
                    "create_parents": {"type": "boolean", "default": false},
                }),
                &["path", "content"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "list_directory",
        scope: Scope::FsRead,
        description: "List a directory's entries (name and kind).",
        input: || object(json!({"path": {"type": "string", "default": "."}}), &[]),
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "search_files",
        scope: Scope::FsRead,
        description: "Search the files under a directory for lines containing a text (or matching a \
regular expression), optionally only files whose name ends with name_suffix; hidden directories are \
not entered. Returns path, line number and line of each match.",
        input: || {
            object(
                json!({
                    "path": {"type": "string", "default": "."},
                    "pattern": {"type": "string", "minLength": 1},
                    "regex": {"type": "boolean", "default": false},
                    "name_suffix": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": SEARCH_MAX_RESULTS, "default": 100},
                }),
                &["pattern"],
            )
        },
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "snapshot_create",
        scope: Scope::Snapshot,
        description: "Snapshot this session's workspace (its files); fork_snapshot starts from it later, \
on any replica.",
        input: || {
            object(
                json!({
                    "name": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                }),
                &[],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "snapshot_list",
        scope: Scope::Snapshot,
        description: "List the tenant's snapshots.",
        input: || object(json!({}), &[]),
        read_only: true,
        destructive: false,
    },
    Spec {
        name: "fork_snapshot",
        scope: Scope::Snapshot,
        description: "Continue this MCP session in a copy of a snapshot's workspace: a new sandbox \
session starts from it, and the current one ends (its processes are terminated).",
        input: || object(json!({"snapshot_id": {"type": "string"}}), &["snapshot_id"]),
        read_only: false,
        destructive: true,
    },
    Spec {
        name: "preview_create",
        scope: Scope::Preview,
        description: "Make a URL that reaches a port on this session's loopback (a web app the agent \
started): signed and expiring by default, public when asked.",
        input: || {
            object(
                json!({
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "public": {"type": "boolean", "default": false},
                }),
                &["port"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Spec {
        name: "preview_revoke",
        scope: Scope::Preview,
        description: "Revoke the preview URLs of a port (open connections through them are closed).",
        input: || {
            object(
                json!({"port": {"type": "integer", "minimum": 1, "maximum": 65535}}),
                &["port"],
            )
        },
        read_only: false,
        destructive: true,
    },
];

pub fn spec(name: &str) -> Option<&'static Spec> {
    TOOLS.iter().find(|t| t.name == name)
}
