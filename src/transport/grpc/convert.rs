//! Conversions between the gRPC messages and the protocol types.

use std::collections::HashMap;

use tonic::Status;

use super::pb;
use crate::protocol::environment::EnvironmentInfo;
use crate::protocol::fs::{
    MetadataResponse, ReadDirectoryResponse, WalkKind, WalkOptions, WalkParams, WalkResponse,
};
use crate::protocol::path::WirePath;
use crate::protocol::process::{
    EnvInherit, EnvPolicy, ExecParams, ListResponse, ProcessEvent, ProcessState, ReadResponse,
    SignalName, StreamName, WriteStatus,
};

pub fn spec_to_params(spec: Option<pb::ProcessSpec>) -> Result<ExecParams, Status> {
    let spec = spec.ok_or_else(|| Status::invalid_argument("spec is required"))?;
    let env_policy = spec.env_policy.map(|p| EnvPolicy {
        inherit: match pb::EnvInherit::try_from(p.inherit) {
            Ok(pb::EnvInherit::All) => EnvInherit::All,
            Ok(pb::EnvInherit::Core) => EnvInherit::Core,
            _ => EnvInherit::None,
        },
        ignore_default_excludes: p.ignore_default_excludes,
        exclude: p.exclude,
        set: p.set.into_iter().collect(),
        include_only: p.include_only,
    });
    Ok(ExecParams {
        process_id: spec.process_id,
        argv: spec.argv,
        cwd: WirePath::plain(spec.cwd),
        env: spec.env.into_iter().collect::<HashMap<_, _>>(),
        tty: spec.tty,
        pipe_stdin: spec.pipe_stdin,
        arg0: spec.arg0,
        env_policy,
        sandbox: None,
        network_proxy: None,
    })
}

pub fn stream_kind(s: StreamName) -> i32 {
    match s {
        StreamName::Stdout => pb::OutputStream::Stdout as i32,
        StreamName::Stderr => pb::OutputStream::Stderr as i32,
        StreamName::Pty => pb::OutputStream::Pty as i32,
    }
}

pub fn event(e: ProcessEvent) -> pb::ProcessEvent {
    use pb::process_event::Event;
    match e {
        ProcessEvent::Output { seq, stream, data } => pb::ProcessEvent {
            seq,
            event: Some(Event::Output(pb::OutputChunk {
                stream: stream_kind(stream),
                data,
            })),
        },
        ProcessEvent::Exited { seq, code, signal } => pb::ProcessEvent {
            seq,
            event: Some(Event::Exited(pb::Exited {
                exit_code: code,
                signal,
            })),
        },
        ProcessEvent::Closed { seq } => pb::ProcessEvent {
            seq,
            event: Some(Event::Closed(pb::Closed {})),
        },
    }
}

pub fn signal(kind: i32) -> Result<SignalName, Status> {
    Ok(match pb::SignalKind::try_from(kind) {
        Ok(pb::SignalKind::Interrupt) => SignalName::Interrupt,
        Ok(pb::SignalKind::Terminate) => SignalName::Terminate,
        Ok(pb::SignalKind::Kill) => SignalName::Kill,
        Ok(pb::SignalKind::Hangup) => SignalName::Hangup,
        Ok(pb::SignalKind::Quit) => SignalName::Quit,
        Ok(pb::SignalKind::User1) => SignalName::User1,
        Ok(pb::SignalKind::User2) => SignalName::User2,
        _ => return Err(Status::invalid_argument("signal is required")),
    })
}

pub fn write_status(s: WriteStatus) -> i32 {
    (match s {
        WriteStatus::Accepted => pb::WriteStatus::Accepted,
        WriteStatus::UnknownProcess => pb::WriteStatus::UnknownProcess,
        WriteStatus::StdinClosed => pb::WriteStatus::StdinClosed,
        WriteStatus::Starting => pb::WriteStatus::Starting,
    }) as i32
}

pub fn read(r: ReadResponse) -> pb::ReadResponse {
    pb::ReadResponse {
        chunks: r
            .chunks
            .into_iter()
            .map(|c| pb::ReadChunk {
                seq: c.seq,
                stream: stream_kind(c.stream),
                data: c.chunk.0.into(),
            })
            .collect(),
        next_seq: r.next_seq,
        exited: r.exited,
        exit_code: r.exit_code,
        closed: r.closed,
    }
}

pub fn list(l: ListResponse) -> pb::ListResponse {
    pb::ListResponse {
        processes: l
            .processes
            .into_iter()
            .map(|p| pb::ProcessInfo {
                process_id: p.process_id,
                state: (match p.state {
                    ProcessState::Starting => pb::ProcessState::Starting,
                    ProcessState::Running => pb::ProcessState::Running,
                    ProcessState::Exited => pb::ProcessState::Exited,
                    ProcessState::Closed => pb::ProcessState::Closed,
                }) as i32,
                tty: p.tty,
                exit_code: p.exit_code,
                next_seq: p.next_seq,
                first_retained_seq: p.first_retained_seq,
            })
            .collect(),
    }
}

pub fn metadata(m: MetadataResponse) -> pb::GetMetadataResponse {
    pb::GetMetadataResponse {
        is_directory: m.is_directory,
        is_file: m.is_file,
        is_symlink: m.is_symlink,
        created_at_ms: m.created_at_ms,
        modified_at_ms: m.modified_at_ms,
        size: m.size.unwrap_or(0),
    }
}

pub fn walk_request(r: pb::WalkRequest) -> WalkParams {
    WalkParams {
        path: WirePath::plain(r.path),
        options: WalkOptions {
            max_depth: r.max_depth,
            max_directories: r.max_directories,
            max_entries: r.max_entries,
            follow_directory_symlinks: r.follow_directory_symlinks,
            prune_hidden_directories: r.prune_hidden_directories,
        },
    }
}

pub fn walk(w: WalkResponse) -> pb::WalkResponse {
    pb::WalkResponse {
        entries: w
            .entries
            .into_iter()
            .map(|e| pb::WalkEntry {
                path: e.path,
                kind: (match e.kind {
                    WalkKind::File => pb::WalkEntryKind::File,
                    WalkKind::Directory => pb::WalkEntryKind::Directory,
                }) as i32,
            })
            .collect(),
        errors: w
            .errors
            .into_iter()
            .map(|e| pb::WalkError {
                path: e.path,
                message: e.message,
            })
            .collect(),
        truncated: w.truncated,
    }
}

pub fn environment(e: EnvironmentInfo) -> pb::GetInfoResponse {
    pb::GetInfoResponse {
        shell_name: e.shell.name,
        shell_path: e.shell.path,
        executor_version: e.executor_version,
        provider_id: e.provider_id,
        cwd: e.cwd,
        user_home_dir: e.user_home_dir,
        platform_os: e.platform_os,
        prepend_path_dirs: e.prepend_path_dirs,
        temporary_directories: e.temporary_directories,
        temp_dir: e.temp_dir,
        capabilities: e.capabilities.into_iter().collect(),
        image: e.image.map(|i| pb::ImageInfo {
            reference: i.reference,
            digest: i.digest,
            working_dir: i.working_dir.unwrap_or_default(),
        }),
    }
}

pub fn directory(d: ReadDirectoryResponse) -> pb::ReadDirectoryResponse {
    pb::ReadDirectoryResponse {
        entries: d
            .entries
            .into_iter()
            .map(|e| pb::DirectoryEntry {
                file_name: e.file_name,
                is_directory: e.is_directory,
                is_file: e.is_file,
            })
            .collect(),
    }
}
