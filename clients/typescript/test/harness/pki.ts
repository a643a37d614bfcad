// Certificates for the TLS tests, made with the openssl CLI: a CA and a
// server certificate for 127.0.0.1, and a client CA with a client
// certificate whose subject names the tenant (O), scopes (OU) and name (CN).
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";

export interface Pki {
  dir: string;
  /** Paths. */
  caCert: string;
  serverCert: string;
  serverKey: string;
  clientCaCert: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate of the unrelated CA (the gateway must refuse it). */
  strangerCert: string;
  strangerKey: string;
  /** PEM text of the CA the server certificate chains to. */
  caPem: string;
  /** A CA nobody's certificate chains to. */
  otherCaPem: string;
  remove(): Promise<void>;
}

function openssl(args: string[], cwd: string): void {
  execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] });
}

function ca(cwd: string, name: string, cn: string): void {
  openssl(
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.crt`,
      "-days",
      "2",
      "-subj",
      `/CN=${cn}`,
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    ],
    cwd,
  );
}

async function leaf(cwd: string, name: string, issuer: string, subject: string, ext: string): Promise<void> {
  openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", `${name}.key`], cwd);
  openssl(["req", "-new", "-key", `${name}.key`, "-out", `${name}.csr`, "-subj", subject], cwd);
  await writeFile(path.join(cwd, `${name}.ext`), ext);
  openssl(
    [
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      `${issuer}.crt`,
      "-CAkey",
      `${issuer}.key`,
      "-CAcreateserial",
      "-out",
      `${name}.crt`,
      "-days",
      "1",
      "-extfile",
      `${name}.ext`,
    ],
    cwd,
  );
}

/** Whether the openssl CLI is here (the TLS tests skip without it). */
export function haveOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** A fresh PKI; `subject` is the client certificate's (`/O=t1/OU=exec/CN=bot`). */
export async function makePki(clientSubject: string): Promise<Pki> {
  const dir = await mkdtemp(path.join(tmpdir(), "eg-ts-pki-"));
  ca(dir, "ca", "exec-gateway ts test CA");
  ca(dir, "other", "unrelated CA");
  ca(dir, "clientca", "exec-gateway ts client CA");
  await leaf(
    dir,
    "server",
    "ca",
    "/CN=127.0.0.1",
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n" +
      "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
  );
  await leaf(
    dir,
    "client",
    "clientca",
    clientSubject,
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
  );
  await leaf(
    dir,
    "stranger",
    "other",
    clientSubject,
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
  );
  const p = (f: string): string => path.join(dir, f);
  return {
    dir,
    caCert: p("ca.crt"),
    serverCert: p("server.crt"),
    serverKey: p("server.key"),
    clientCaCert: p("clientca.crt"),
    clientCert: p("client.crt"),
    clientKey: p("client.key"),
    strangerCert: p("stranger.crt"),
    strangerKey: p("stranger.key"),
    caPem: await readFile(p("ca.crt"), "utf8"),
    otherCaPem: await readFile(p("other.crt"), "utf8"),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
