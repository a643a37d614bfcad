"""What the SDK returns: plain frozen dataclasses, no protobuf types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

StreamName = Literal["stdout", "stderr", "pty"]
SignalName = Literal["interrupt", "terminate", "kill", "hangup", "quit", "user1", "user2"]


@dataclass(frozen=True)
class Output:
    """A chunk of a process's output, in seq order."""
    seq: int
    stream: StreamName
    data: bytes


@dataclass(frozen=True)
class Exited:
    """The process exited: its code, and the signal that killed it, if one did.
    Output may still follow (a background child holding the pipe)."""
    seq: int
    exit_code: int
    signal: Optional[int]


@dataclass(frozen=True)
class Closed:
    """Exited and every stream reached its end: the last event."""
    seq: int


@dataclass(frozen=True)
class OutputLost:
    """`chunks` events from `seq` on are no longer retained by the gateway
    (the stream resumed, or started, past its retention)."""
    seq: int
    chunks: int


Event = Union[Output, Exited, Closed, OutputLost]


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int
    signal: Optional[int]


@dataclass(frozen=True)
class Result:
    """What `run` returns."""
    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: Optional[int]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.signal is None

    def text(self, errors: str = "replace") -> str:
        """stdout as text (UTF-8)."""
        return self.stdout.decode("utf-8", errors)


@dataclass(frozen=True)
class ProcessInfo:
    process_id: str
    state: Literal["starting", "running", "exited", "closed", "unknown"]
    tty: bool
    exit_code: Optional[int]
    next_seq: int
    first_retained_seq: Optional[int]


@dataclass(frozen=True)
class DirEntry:
    name: str
    is_directory: bool
    is_file: bool


@dataclass(frozen=True)
class Metadata:
    is_directory: bool
    is_file: bool
    is_symlink: bool
    size: int
    created_at_ms: int
    modified_at_ms: int


@dataclass(frozen=True)
class WalkEntry:
    path: str
    kind: Literal["file", "directory", "unknown"]


@dataclass(frozen=True)
class WalkError:
    path: str
    message: str


@dataclass(frozen=True)
class WalkResult:
    entries: list[WalkEntry]
    errors: list[WalkError]
    truncated: bool


@dataclass(frozen=True)
class EnvironmentInfo:
    shell_name: str
    shell_path: str
    executor_version: str
    provider_id: str
    cwd: str
    user_home_dir: str
    platform_os: str
    temp_dir: str
    prepend_path_dirs: list[str] = field(default_factory=list)
    temporary_directories: list[str] = field(default_factory=list)
    capabilities: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """A saved workspace (`Session.snapshot()`), to fork sessions from."""
    id: str
    name: Optional[str]
    labels: dict[str, str]
    #: The image the workspace ran on (None: the host's userland).
    image: Optional[str]
    #: `sha256:` of the workspace's deterministic tar stream.
    digest: str
    bytes: int
    entries: int
    #: FIFOs, sockets, devices and mount points left out.
    skipped: int
    created_at_ms: int
    #: When retention deletes it; None once promoted (kept until deleted).
    expires_at_ms: Optional[int]
    #: Where it was pushed (`registry/repository@sha256:…`), if it was.
    pushed: Optional[str] = None


@dataclass(frozen=True)
class Preview:
    """A preview of one of a session's ports (`Session.create_preview`):
    HTTP into it from outside (the gateway's docs/preview.md)."""
    port: int
    #: The host-name URL (with its grant, for a signed one: a credential);
    #: None without the gateway's `[preview] base_url`.
    url: Optional[str]
    #: `/preview/{session}/{port}/` on the gateway's client listener, for
    #: token holders (`preview` scope), and anyone while public.
    path: str
    public: bool
    #: When a signed URL stops working (ms since the epoch); None for a
    #: public preview.
    expires_at_ms: Optional[int]


@dataclass(frozen=True)
class PreviewPort:
    """A port with preview state: public, or with signed URLs minted."""
    port: int
    public: bool


@dataclass(frozen=True)
class Previews:
    """What `Session.list_previews` returns."""
    ports: list[PreviewPort]
    #: Connections open into the session's ports through previews now.
    open_connections: int


@dataclass(frozen=True)
class EgressPolicy:
    """The tenant's egress (`Client.get_egress`, `set_egress`): what its
    processes may reach outside its network namespace (the gateway's
    docs/isolation.md, "Egress by name")."""
    #: The host names in force (`github.com`, `*.example.org`,
    #: `pypi.org:443`); None for a tenant whose egress is decided by
    #: addresses alone (no `egress_names` in its configuration).
    names: Optional[list[str]]
    #: The addresses (CIDRs) its `egress` allows directly.
    cidrs: list[str]
    #: Every public address is allowed (`egress = "internet"`).
    internet: bool
    #: `set_egress` only: the open connections the new names closed.
    closed: Optional[int] = None
