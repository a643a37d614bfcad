// The SDK's public data types, and their conversions from the generated
// messages.
import {
  OutputStream,
  ProcessState,
  type ProcessEvent as PbProcessEvent,
  type ProcessInfo as PbProcessInfo,
} from "../gen/exec_gateway/v1/process.js";
import type { GetInfoResponse } from "../gen/exec_gateway/v1/environment.js";
import type {
  DirectoryEntry as PbDirectoryEntry,
  GetMetadataResponse,
  WalkResponse,
} from "../gen/exec_gateway/v1/file.js";
import { WalkEntryKind } from "../gen/exec_gateway/v1/file.js";
import type {
  EgressPolicy as PbEgressPolicy,
  ListPreviewsResponse,
  Preview as PbPreview,
  Snapshot as PbSnapshot,
} from "../gen/exec_gateway/v1/session.js";

/** A saved workspace (`session.snapshot()`), to fork sessions from. */
export interface Snapshot {
  id: string;
  name: string | null;
  labels: Record<string, string>;
  /** The image the workspace ran on (null: the host's userland). */
  image: string | null;
  /** `sha256:` of the workspace's deterministic tar stream. */
  digest: string;
  bytes: number;
  entries: number;
  /** FIFOs, sockets, devices and mount points left out. */
  skipped: number;
  createdAtMs: number;
  /** When retention deletes it; null once promoted (kept until deleted). */
  expiresAtMs: number | null;
  /** Where it was pushed (`registry/repository@sha256:…`), if it was. */
  pushed: string | null;
}

export function toSnapshot(s: PbSnapshot): Snapshot {
  return {
    id: s.id,
    name: s.name || null,
    labels: { ...s.labels },
    image: s.image || null,
    digest: s.digest,
    bytes: Number(s.bytes),
    entries: Number(s.entries),
    skipped: Number(s.skipped),
    createdAtMs: Number(s.createdAtMs),
    expiresAtMs: Number(s.expiresAtMs) || null,
    pushed: s.pushed || null,
  };
}

/** A preview of one of a session's ports (`session.createPreview`): HTTP into it from outside (docs/preview.md). */
export interface Preview {
  port: number;
  /**
   * The host-name URL (with its grant, for a signed one: a credential);
   * null without the gateway's `[preview] base_url`.
   */
  url: string | null;
  /** `/preview/{session}/{port}/` on the gateway's client listener, for token holders (and anyone, while public). */
  path: string;
  public: boolean;
  /** When a signed URL stops working (ms since the epoch); null for a public preview. */
  expiresAtMs: number | null;
}

/** A port with preview state: public, or with signed URLs minted. */
export interface PreviewPort {
  port: number;
  public: boolean;
}

/** What `session.listPreviews()` returns. */
export interface Previews {
  ports: PreviewPort[];
  /** Connections open into the session's ports through previews now. */
  openConnections: number;
}

export function toPreview(p: PbPreview): Preview {
  return {
    port: p.port,
    url: p.url || null,
    path: p.path,
    public: p.public,
    expiresAtMs: Number(p.expiresAtMs) || null,
  };
}

export function toPreviews(r: ListPreviewsResponse): Previews {
  return {
    ports: r.ports.map((p) => ({ port: p.port, public: p.public })),
    openConnections: Number(r.openConnections),
  };
}

/**
 * The tenant's egress (`client.getEgress()`, `setEgress`): what its
 * processes may reach outside its network namespace (docs/isolation.md,
 * "Egress by name").
 */
export interface EgressPolicy {
  /**
   * The host names in force (`github.com`, `*.example.org`, `pypi.org:443`);
   * null for a tenant whose egress is decided by addresses alone (no
   * `egress_names` in its configuration).
   */
  names: string[] | null;
  /** The addresses (CIDRs) its `egress` allows directly. */
  cidrs: string[];
  /** Every public address is allowed (`egress = "internet"`). */
  internet: boolean;
  /** `setEgress` only: the open connections the new names closed; null otherwise. */
  closed: number | null;
}

export function toEgressPolicy(p: PbEgressPolicy | undefined): EgressPolicy {
  if (p === undefined) throw new Error("the gateway answered without an egress policy");
  return {
    names: p.namesSet ? [...p.names] : null,
    cidrs: [...p.cidrs],
    internet: p.internet,
    closed: p.closed ?? null,
  };
}

export type StreamName = "stdout" | "stderr" | "pty";

/** A chunk of output. */
export interface OutputEvent {
  type: "output";
  seq: number;
  stream: StreamName;
  data: Uint8Array;
}

/** The process exited; output may still follow until `closed`. */
export interface ExitedEvent {
  type: "exited";
  seq: number;
  /** -1 when a signal killed a pipe process (1 under a terminal). */
  exitCode: number;
  /** The signal's number when one killed it (15 for SIGTERM), else null. */
  signal: number | null;
}

/** Exited and every stream at its end: the last event. */
export interface ClosedEvent {
  type: "closed";
  seq: number;
}

/**
 * Output the gateway no longer retained when this client caught up (it
 * keeps a process's newest 1 MiB): `chunks` chunks are missing, the first
 * of them `seq`.
 */
export interface OutputLostEvent {
  type: "outputLost";
  seq: number;
  chunks: number;
}

export type ProcessEvent = OutputEvent | ExitedEvent | ClosedEvent | OutputLostEvent;

export interface ExitStatus {
  exitCode: number;
  signal: number | null;
}

export type ProcessStateName = "starting" | "running" | "exited" | "closed" | "unknown";

/** One process of `session.list()`. */
export interface ProcessInfo {
  processId: string;
  state: ProcessStateName;
  tty: boolean;
  exitCode: number | null;
  /** The seq the next event will take. */
  nextSeq: number;
  /** The oldest retained seq, if any output is retained. */
  firstRetainedSeq: number | null;
}

export interface DirEntry {
  name: string;
  isDirectory: boolean;
  isFile: boolean;
}

export interface FileStat {
  isDirectory: boolean;
  isFile: boolean;
  isSymlink: boolean;
  size: number;
  createdAtMs: number;
  modifiedAtMs: number;
}

export interface WalkEntry {
  path: string;
  kind: "file" | "directory";
}

export interface WalkResult {
  entries: WalkEntry[];
  errors: { path: string; message: string }[];
  truncated: boolean;
}

export interface EnvironmentInfo {
  shellName: string;
  shellPath: string;
  executorVersion: string;
  providerId: string;
  /** The tenant root: the default working directory. */
  cwd: string;
  userHomeDir: string;
  platformOs: string;
  prependPathDirs: string[];
  temporaryDirectories: string[];
  tempDir: string;
  capabilities: Record<string, boolean>;
}

export type SignalName = "interrupt" | "terminate" | "kill" | "hangup" | "quit" | "user1" | "user2";

const decoder = new TextDecoder();

/** What `session.run` returns. */
export class RunResult implements ExitStatus {
  constructor(
    /** Standard output (a terminal's output, with `tty`). */
    readonly stdout: Uint8Array,
    readonly stderr: Uint8Array,
    readonly exitCode: number,
    readonly signal: number | null,
    readonly processId: string,
  ) {}

  /** stdout as UTF-8 text. */
  get stdoutText(): string {
    return decoder.decode(this.stdout);
  }

  /** stderr as UTF-8 text. */
  get stderrText(): string {
    return decoder.decode(this.stderr);
  }
}

function streamName(s: OutputStream): StreamName {
  switch (s) {
    case OutputStream.OUTPUT_STREAM_STDERR:
      return "stderr";
    case OutputStream.OUTPUT_STREAM_PTY:
      return "pty";
    default:
      // Unspecified or newer than this SDK: stdout, as the Rust client does.
      return "stdout";
  }
}

/** A generated event as the SDK's; undefined for a kind this SDK does not know. */
export function toEvent(ev: PbProcessEvent): ProcessEvent | undefined {
  const e = ev.event;
  if (e === undefined) return undefined;
  switch (e.$case) {
    case "output":
      return { type: "output", seq: ev.seq, stream: streamName(e.output.stream), data: e.output.data };
    case "exited":
      return { type: "exited", seq: ev.seq, exitCode: e.exited.exitCode, signal: e.exited.signal ?? null };
    case "closed":
      return { type: "closed", seq: ev.seq };
  }
}

const STATES: Record<number, ProcessStateName> = {
  [ProcessState.PROCESS_STATE_STARTING]: "starting",
  [ProcessState.PROCESS_STATE_RUNNING]: "running",
  [ProcessState.PROCESS_STATE_EXITED]: "exited",
  [ProcessState.PROCESS_STATE_CLOSED]: "closed",
};

export function toProcessInfo(p: PbProcessInfo): ProcessInfo {
  return {
    processId: p.processId,
    state: STATES[p.state] ?? "unknown",
    tty: p.tty,
    exitCode: p.exitCode ?? null,
    nextSeq: p.nextSeq,
    firstRetainedSeq: p.firstRetainedSeq ?? null,
  };
}

export function toDirEntry(e: PbDirectoryEntry): DirEntry {
  return { name: e.fileName, isDirectory: e.isDirectory, isFile: e.isFile };
}

export function toFileStat(m: GetMetadataResponse): FileStat {
  return {
    isDirectory: m.isDirectory,
    isFile: m.isFile,
    isSymlink: m.isSymlink,
    size: m.size,
    createdAtMs: m.createdAtMs,
    modifiedAtMs: m.modifiedAtMs,
  };
}

export function toWalkResult(w: WalkResponse): WalkResult {
  return {
    entries: w.entries.map((e) => ({
      path: e.path,
      kind: e.kind === WalkEntryKind.WALK_ENTRY_KIND_DIRECTORY ? "directory" : "file",
    })),
    errors: w.errors.map((e) => ({ path: e.path, message: e.message })),
    truncated: w.truncated,
  };
}

export function toEnvironmentInfo(i: GetInfoResponse): EnvironmentInfo {
  return {
    shellName: i.shellName,
    shellPath: i.shellPath,
    executorVersion: i.executorVersion,
    providerId: i.providerId,
    cwd: i.cwd,
    userHomeDir: i.userHomeDir,
    platformOs: i.platformOs,
    prependPathDirs: i.prependPathDirs,
    temporaryDirectories: i.temporaryDirectories,
    tempDir: i.tempDir,
    capabilities: { ...i.capabilities },
  };
}
