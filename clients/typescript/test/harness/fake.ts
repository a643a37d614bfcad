// A fake gateway: a grpc-js server with the generated services, answering
// what a test tells it to (a broken or hostile gateway the real one cannot
// be made to be). Sessions and the environment answer plainly; process and
// file methods a test does not give are UNIMPLEMENTED. Every call is
// counted, by method and process id (or path).
import {
  Metadata,
  Server,
  ServerCredentials,
  status,
  type ServiceError,
  type UntypedServiceImplementation,
} from "@grpc/grpc-js";
import { environment, file, process as pb, session } from "@exec-gateway/client/stubs";

export interface FakeHandlers {
  process?: Partial<pb.ProcessServiceServer>;
  files?: Partial<file.FileServiceServer>;
}

/** The error a handler ends a call with, `data` as the gateway's error-data trailer. */
export function failure(code: status, details: string, data?: string): ServiceError {
  const metadata = new Metadata();
  if (data !== undefined) metadata.set("x-exec-gateway-error-data", data);
  return Object.assign(new Error(details), { code, details, metadata });
}

/** The session id the fake hands out. */
export const FAKE_SESSION = "fake-session";

/** The tenant root the fake reports. */
export const FAKE_ROOT = "/fake/root";

export class FakeGateway {
  private readonly counts = new Map<string, number>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(handlers: FakeHandlers = {}): Promise<FakeGateway> {
    const server = new Server();
    let fake: FakeGateway | undefined;
    const count = (key: string): void => fake?.note(key);
    server.addService(pb.ProcessServiceService, wrap(pb.ProcessServiceService, handlers.process ?? {}, count));
    server.addService(file.FileServiceService, wrap(file.FileServiceService, handlers.files ?? {}, count));
    server.addService(session.SessionServiceService, {
      createSession: (_call, cb) => cb(null, { sessionId: FAKE_SESSION }),
      resumeSession: (call, cb) => cb(null, { sessionId: call.request.sessionId }),
      closeSession: (_call, cb) => cb(null, {}),
      createSnapshot: (_call, cb) => cb(unimplemented()),
      listSnapshots: (_call, cb) => cb(unimplemented()),
      getSnapshot: (_call, cb) => cb(unimplemented()),
      deleteSnapshot: (_call, cb) => cb(unimplemented()),
      pushSnapshot: (_call, cb) => cb(unimplemented()),
      promoteSnapshot: (_call, cb) => cb(unimplemented()),
      forkSessions: (_call, cb) => cb(unimplemented()),
      forwardPort: (call) => call.emit("error", unimplemented()),
      createPreview: (_call, cb) => cb(unimplemented()),
      revokePreview: (_call, cb) => cb(unimplemented()),
      listPreviews: (_call, cb) => cb(unimplemented()),
      getEgress: (_call, cb) => cb(unimplemented()),
      setEgress: (_call, cb) => cb(unimplemented()),
    } satisfies session.SessionServiceServer);
    server.addService(environment.EnvironmentServiceService, {
      getInfo: (_call, cb) => cb(null, environment.GetInfoResponse.fromPartial({ cwd: FAKE_ROOT })),
    } satisfies environment.EnvironmentServiceServer);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
    );
    fake = new FakeGateway(server, port);
    return fake;
  }

  get target(): string {
    return `grpc://127.0.0.1:${this.port}`;
  }

  /** Calls of `method` (the stub's name, e.g. `attach`) for `id` (a process id or path). */
  count(method: string, id = ""): number {
    return this.counts.get(`${method}:${id}`) ?? 0;
  }

  private note(key: string): void {
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
  }

  stop(): void {
    this.server.forceShutdown();
  }
}

/**
 * The handlers of `service`: each given one, counted; the others
 * UNIMPLEMENTED.
 */
function wrap(
  service: Record<string, { responseStream: boolean }>,
  given: object,
  count: (key: string) => void,
): UntypedServiceImplementation {
  const impl: UntypedServiceImplementation = {};
  const handlers = given as Record<string, ((call: never, cb?: never) => void) | undefined>;
  for (const [name, def] of Object.entries(service)) {
    const handler = handlers[name];
    impl[name] = (call: { request?: unknown; emit(ev: string, e: unknown): void }, cb?: (e: unknown) => void) => {
      const req = (call.request ?? {}) as { processId?: string; path?: string; spec?: { processId?: string } };
      count(`${name}:${req.processId ?? req.spec?.processId ?? req.path ?? ""}`);
      if (handler !== undefined) {
        (handler as (c: unknown, cb?: unknown) => void)(call, cb);
        return;
      }
      const e = failure(status.UNIMPLEMENTED, `the fake does not serve ${name}`);
      if (def.responseStream) call.emit("error", e);
      else cb?.(e);
    };
  }
  return impl;
}

/** What the fake answers for what it does not serve. */
function unimplemented(): ServiceError {
  return Object.assign(new Error("not served by the fake gateway"), {
    code: status.UNIMPLEMENTED,
    details: "not served by the fake gateway",
    metadata: new Metadata(),
  });
}
