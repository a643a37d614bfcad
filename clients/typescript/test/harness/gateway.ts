// Starts a real exec-gateway for a test: a fresh HS256 key, a config with a
// tenant template under a fresh /tmp directory, its own state directory, and
// the ports it picked read from its stdout.
import { spawn, type ChildProcess } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { existsSync, readFileSync, readlinkSync, realpathSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The package's directory (build/test/harness/ → ../../..). */
export const PACKAGE_DIR = fileURLToPath(new URL("../../../", import.meta.url));

/** The gateway binary: $EXEC_GATEWAY_BIN, else the repository's debug build. */
export function gatewayBinary(): string {
  return process.env["EXEC_GATEWAY_BIN"] ?? path.join(PACKAGE_DIR, "..", "..", "target", "debug", "exec-gateway");
}

/**
 * Why the suite cannot run here (given to `describe(..., {skip})`), or
 * undefined when it can.
 */
export function skipReason(): string | undefined {
  const bin = gatewayBinary();
  if (!existsSync(bin)) {
    return `no exec-gateway binary at ${bin} (build it, or set EXEC_GATEWAY_BIN)`;
  }
  return undefined;
}

export interface GatewayOptions {
  /** TOML lines for `[server]`. */
  server?: string;
  /** TOML appended to the generated config (after [tenant_template]). */
  templateExtra?: string;
  /** Whole extra TOML sections appended at the end. */
  extra?: string;
  /** `[server.tls]`: PEM file paths. */
  tls?: { certFile: string; keyFile: string; clientCaFile?: string };
}

export interface TokenOptions {
  tenant?: string;
  scope?: string | undefined;
  sub?: string;
  /** Seconds from now. */
  expiresIn?: number;
  /** Sign with this secret instead of the gateway's. */
  secret?: string;
}

/** A running gateway. */
export class Gateway {
  private constructor(
    readonly dir: string,
    readonly roots: string,
    readonly secret: string,
    /** `grpc://127.0.0.1:PORT` (or `grpcs://` with TLS). */
    readonly target: string,
    /** `127.0.0.1:PORT`. */
    readonly address: string,
    /** The client listener (websocket, previews): `ws://127.0.0.1:PORT`. */
    readonly listenUrl: string,
    private readonly child: ChildProcess,
    private readonly stderr: string[],
  ) {}

  /** Set once a restart took this gateway's directory over: stop leaves it. */
  private handedOver = false;

  static async start(opts: GatewayOptions = {}): Promise<Gateway> {
    const dir = await mkdtemp(path.join(tmpdir(), "eg-ts-"));
    // Tenant uids must traverse the roots' parent: mkdtemp makes it 0700.
    await chmod(dir, 0o755);
    const roots = path.join(dir, "roots");
    await mkdir(roots, { mode: 0o755 });
    await chmod(roots, 0o755);
    const secret = randomBytes(32).toString("hex");
    await writeFile(path.join(dir, "key"), secret);
    let config =
      // A short drain: a test's leftover processes do not hold its end up.
      `[server]\n${opts.server?.includes("shutdown_grace") ? "" : 'shutdown_grace = "1s"\n'}${opts.server ?? ""}\n` +
      `[[auth.keys]]\nalgorithm = "HS256"\nsecret_file = "${dir}/key"\n` +
      `[tenant_template]\nroot = "${roots}/{tenant}"\n` +
      (opts.templateExtra ?? "") +
      "\n";
    if (opts.tls) {
      config += `[server.tls]\ncert_file = "${opts.tls.certFile}"\nkey_file = "${opts.tls.keyFile}"\n`;
      if (opts.tls.clientCaFile) config += `client_ca_file = "${opts.tls.clientCaFile}"\n`;
    }
    config += opts.extra ?? "";
    await writeFile(path.join(dir, "gateway.toml"), config);
    return Gateway.launch(dir, roots, secret, 0);
  }

  /**
   * SIGKILL this gateway (no drain: its connections break under their
   * calls), then start another on the same directory (config, key, roots,
   * state) and the same port. This one's `stop` then leaves the directory.
   */
  async restart(): Promise<Gateway> {
    if (!this.exited) {
      const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
      this.child.kill("SIGUSR1");
      await exited;
    }
    this.handedOver = true;
    const port = Number(this.address.split(":")[1]);
    return Gateway.launch(this.dir, this.roots, this.secret, port);
  }

  private static async launch(dir: string, roots: string, secret: string, port: number): Promise<Gateway> {
    // Through a shell that ends the gateway when our end of its stdin
    // closes: however this test process dies (a runner's timeout
    // included), no gateway is left behind.
    const child = spawn(
      "sh",
      [
        "-c",
        'exec 3<&0; "$0" "$@" <&- 3<&- & pid=$!; trap \'kill -KILL $pid\' USR1; (read _ <&3; kill -TERM $pid) & wait $pid',
        gatewayBinary(),
        "serve",
        "--listen",
        "ws://127.0.0.1:0",
        "--grpc-listen",
        `127.0.0.1:${port}`,
        "--admin-listen",
        "off",
        "--config",
        path.join(dir, "gateway.toml"),
      ],
      {
        env: { ...process.env, XDG_STATE_HOME: path.join(dir, "state"), NO_COLOR: "1" },
        stdio: ["pipe", "pipe", "pipe"],
      },
    );
    // The last lines of its log, for a failure's message.
    const stderr: string[] = [];
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (s: string) => {
      stderr.push(s);
      if (stderr.length > 200) stderr.splice(0, stderr.length - 200);
    });
    const lines = createInterface({ input: child.stdout! });
    let listenLine = "";
    const grpcLine = await new Promise<string>((resolve, reject) => {
      let seen = 0;
      const onExit = (code: number | null): void =>
        reject(new Error(`exec-gateway exited (${code}) before listening:\n${stderr.join("")}`));
      child.once("exit", onExit);
      child.once("error", reject);
      lines.on("line", (line) => {
        seen += 1;
        if (seen === 1) listenLine = line.trim();
        if (seen === 2) {
          child.off("exit", onExit);
          resolve(line.trim());
        }
      });
    });
    const m = /^(grpcs?):\/\/(127\.0\.0\.1:\d+)$/.exec(grpcLine);
    if (!m) throw new Error(`unexpected second line from exec-gateway: ${grpcLine}`);
    return new Gateway(dir, roots, secret, grpcLine, m[2]!, listenLine, child, stderr);
  }

  /** A root path of `tenant`'s as the gateway made it. */
  root(tenant: string): string {
    return path.join(this.roots, tenant);
  }

  /** An HS256 JWT for `tenant` with all three scopes unless told. */
  token(opts: TokenOptions = {}): string {
    const claims: Record<string, unknown> = {
      sub: opts.sub ?? "ts-test",
      tenant: opts.tenant ?? "t1",
      exp: Math.floor(Date.now() / 1000) + (opts.expiresIn ?? 3600),
    };
    if (!("scope" in opts)) claims["scope"] = "exec fs:read fs:write";
    else if (opts.scope !== undefined) claims["scope"] = opts.scope;
    return signHs256(claims, opts.secret ?? this.secret);
  }

  /** Recent log output, for diagnosing a failure. */
  log(): string {
    return this.stderr.join("");
  }

  /** SIGTERM the gateway (it drains, then exits) without waiting. */
  terminate(): void {
    this.child.stdin?.end();
  }

  /**
   * Send `sig` to the gateway process itself (not the shell around it):
   * SIGSTOP freezes it with its connections open.
   */
  signal(sig: NodeJS.Signals): void {
    const shell = this.child.pid;
    if (shell === undefined) throw new Error("the gateway's shell has no pid");
    const children = readFileSync(`/proc/${shell}/task/${shell}/children`, "utf8").trim().split(/\s+/);
    const pid = children.find((c) => c !== "" && readlinkSync(`/proc/${c}/exe`) === realpathSync(gatewayBinary()));
    if (pid === undefined) throw new Error("the gateway process is gone");
    process.kill(Number(pid), sig);
  }

  /** Whether the gateway process has exited. */
  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
      // EOF on the shell's stdin: it SIGTERMs the gateway and waits.
      this.child.stdin?.end();
      const timer = setTimeout(() => this.child.kill("SIGUSR1"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    if (this.handedOver) return;
    await rm(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }
}

function b64url(data: string | Buffer): string {
  return Buffer.from(data).toString("base64url");
}

/** A compact HS256 JWT. */
export function signHs256(claims: Record<string, unknown>, secret: string): string {
  const head = `${b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }))}.${b64url(JSON.stringify(claims))}`;
  return `${head}.${createHmac("sha256", secret).update(head).digest("base64url")}`;
}

/** An unsigned JWT (`alg: none`), which no gateway may accept. */
export function unsignedToken(claims: Record<string, unknown>): string {
  return `${b64url(JSON.stringify({ alg: "none", typ: "JWT" }))}.${b64url(JSON.stringify(claims))}.`;
}
