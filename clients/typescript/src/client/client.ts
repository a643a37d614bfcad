// The entry point: a channel to the gateway, its sessions, and the
// tenant's files without a session.
import { inspect } from "node:util";
import { bind, Caller, unaryOnce, type CallOptions } from "./calls.js";
import { Connection, type ConnectOptions } from "./connection.js";
import { Files } from "./files.js";
import { RootResolver, Session } from "./session.js";
import {
  toEgressPolicy,
  toEnvironmentInfo,
  toSnapshot,
  type EgressPolicy,
  type EnvironmentInfo,
  type Snapshot,
} from "./types.js";

export interface SessionOptions extends CallOptions {
  /** Resume this session (one of this tenant's) instead of creating one. */
  resume?: string;
  /**
   * The image a new session's processes see as `/`: a reference the tenant
   * may use (its own image, or one its `images` allow; `Forbidden`
   * otherwise). Default: the tenant's own image (or the token's `image`
   * claim), if any. A resumed session keeps its image: not with `resume`.
   */
  image?: string;
  /**
   * A snapshot of the tenant's (or its id): the new session works in a
   * copy-on-write fork of it, on the image it was taken on. Needs the
   * token's `snapshot` scope. Not with `resume`.
   */
  snapshot?: Snapshot | string;
}

const snapshotId = (s: Snapshot | string | undefined): string => (typeof s === "string" ? s : (s?.id ?? ""));

export class Client {
  /** The tenant's files without a session (its root). */
  readonly files: Files;
  /** A private field: the channel (and the calls on it) stay out of `util.inspect`, whatever its options. */
  readonly #caller: Caller;
  private readonly paths: RootResolver;
  /** Open sessions, kept alive until closed, detached, or this client closes. */
  private readonly open = new Set<Session>();
  private readonly forget = (s: Session): void => void this.open.delete(s);

  /** @internal Use {@link connect}. */
  constructor(conn: Connection) {
    this.#caller = new Caller(conn);
    this.paths = new RootResolver((opts) => this.environmentInfo(opts));
    this.files = new Files(this.#caller, "", this.paths.resolve);
  }

  /**
   * A new session, or with `resume` the session of that id (NotFound if
   * it is gone or another tenant's).
   */
  async session(opts: SessionOptions = {}): Promise<Session> {
    const { sessions, clientName } = this.#caller.conn;
    const resume = opts.resume;
    if (resume !== undefined && (opts.image !== undefined || opts.snapshot !== undefined)) {
      throw new TypeError(
        "a resumed session keeps its image and workspace: pass resume, or image and snapshot, not both",
      );
    }
    if (resume !== undefined) {
      const r = await this.#caller.unary(opts, true, bind(sessions.resumeSession, sessions, { sessionId: resume }));
      return this.track(new Session(this.#caller, r.sessionId || resume, this.forget));
    }
    // Retried like the rest: a creation whose answer was lost leaves a
    // session nobody uses, which the gateway removes after its detach TTL.
    const r = await this.#caller.retrying(opts, true, (a) =>
      unaryOnce(
        bind(sessions.createSession, sessions, {
          clientName,
          image: opts.image ?? "",
          snapshot: snapshotId(opts.snapshot),
        }),
        a,
        opts.signal,
      ),
    );
    return this.track(new Session(this.#caller, r.sessionId, this.forget));
  }

  /**
   * `n` new sessions, each working in a copy-on-write fork of `snapshot`:
   * all of them or none (`QuotaExceeded` past the tenant's
   * `max_forks_per_tenant`).
   */
  async fork(snapshot: Snapshot | string, n = 1, opts: CallOptions = {}): Promise<Session[]> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(
      opts,
      false,
      bind(sessions.forkSessions, sessions, { snapshotId: snapshotId(snapshot), count: n }),
    );
    return r.sessionIds.map((id) => this.track(new Session(this.#caller, id, this.forget)));
  }

  /** The tenant's snapshots, oldest first. */
  async snapshots(opts?: CallOptions): Promise<Snapshot[]> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(sessions.listSnapshots, sessions, {}));
    return r.snapshots.map(toSnapshot);
  }

  /** One of the tenant's snapshots (`NotFound`: not the tenant's). */
  async getSnapshot(id: string, opts?: CallOptions): Promise<Snapshot> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(sessions.getSnapshot, sessions, { snapshotId: id }));
    if (!r.snapshot) throw new TypeError("the gateway answered GetSnapshot without a snapshot");
    return toSnapshot(r.snapshot);
  }

  /** Delete one of the tenant's snapshots; forks working on it keep it. */
  async deleteSnapshot(snapshot: Snapshot | string, opts?: CallOptions): Promise<void> {
    const { sessions } = this.#caller.conn;
    await this.#caller.unary(
      opts,
      false,
      bind(sessions.deleteSnapshot, sessions, { snapshotId: snapshotId(snapshot) }),
    );
  }

  /**
   * Push a snapshot to the gateway's snapshot registry, from which any
   * replica restores it (`pushed` says where).
   */
  async pushSnapshot(snapshot: Snapshot | string, opts?: CallOptions): Promise<Snapshot> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(
      opts,
      true,
      bind(sessions.pushSnapshot, sessions, { snapshotId: snapshotId(snapshot) }),
    );
    if (!r.snapshot) throw new TypeError("the gateway answered PushSnapshot without a snapshot");
    return toSnapshot(r.snapshot);
  }

  /**
   * Keep a snapshot until it is deleted (`expiresAtMs` null), and push it
   * when the gateway has a snapshot registry: every session of the tenant,
   * on any replica, can start from it.
   */
  async promoteSnapshot(snapshot: Snapshot | string, opts?: CallOptions): Promise<Snapshot> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(
      opts,
      true,
      bind(sessions.promoteSnapshot, sessions, { snapshotId: snapshotId(snapshot) }),
    );
    if (!r.snapshot) throw new TypeError("the gateway answered PromoteSnapshot without a snapshot");
    return toSnapshot(r.snapshot);
  }

  /**
   * The tenant's egress: the host names its processes may reach (null:
   * decided by addresses alone), beside its CIDRs. Needs the `egress` scope
   * (`Forbidden`).
   */
  async getEgress(opts?: CallOptions): Promise<EgressPolicy> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(sessions.getEgress, sessions, {}));
    return toEgressPolicy(r.policy);
  }

  /**
   * Replace the tenant's host names: new connections take them at once, and
   * open connections to names they no longer allow are closed (`closed`
   * counts them). Needs the `egress` scope (`Forbidden`); `InvalidArgument`
   * for a name that is not a host name, `*.` wildcard or `NAME:PORT`, or a
   * tenant without `egress_names` in its configuration (the names in force
   * then stay).
   */
  async setEgress(names: readonly string[], opts?: CallOptions): Promise<EgressPolicy> {
    if (typeof names === "string") throw new TypeError("names is an array of names, not one string");
    const { sessions } = this.#caller.conn;
    // Retried: the same list again changes nothing (though a retry's
    // `closed` counts only what it closed itself).
    const r = await this.#caller.unary(opts, true, bind(sessions.setEgress, sessions, { names: [...names] }));
    return toEgressPolicy(r.policy);
  }

  private track(s: Session): Session {
    this.open.add(s);
    return s;
  }

  /** The tenant's environment (without a session). */
  async environmentInfo(opts?: CallOptions): Promise<EnvironmentInfo> {
    const env = this.#caller.conn.environment;
    const r = await this.#caller.unary(opts, true, bind(env.getInfo, env, { sessionId: "" }));
    const info = toEnvironmentInfo(r);
    this.paths.learn(info.cwd);
    return info;
  }

  /**
   * Stop keeping sessions alive and close the channel; calls still in
   * flight fail. The sessions are not closed: they live the gateway's
   * detach TTL, to be resumed.
   */
  close(): void {
    for (const s of [...this.open]) s.detach();
    this.#caller.conn.close();
  }

  /** What `console.log` shows: the target and open sessions, never the token. */
  [inspect.custom](): string {
    const ids = [...this.open].map((s) => inspect(s.id)).join(", ");
    return `Client { target: ${inspect(this.#caller.conn.target)}, sessions: [${ids}] }`;
  }
}

/**
 * A client of the gateway at `target` (`grpc://HOST:PORT`, `grpcs://HOST:PORT`,
 * or a bare `HOST:PORT` for plaintext). Nothing is dialled until the first call.
 */
export async function connect(target: string, opts: ConnectOptions = {}): Promise<Client> {
  return new Client(new Connection(target, opts));
}
