// How the examples connect: EXEC_GATEWAY_TARGET (grpc://HOST:PORT or
// grpcs://HOST:PORT), EXEC_GATEWAY_TOKEN (a JWT), EXEC_GATEWAY_CA (a PEM
// file, for grpcs:// with a private CA).
import { connect, type Client } from "@exec-gateway/client";

export async function clientFromEnv(clientName: string): Promise<Client> {
  const target = process.env["EXEC_GATEWAY_TARGET"];
  if (!target) {
    console.error("set EXEC_GATEWAY_TARGET (grpc://HOST:PORT) and EXEC_GATEWAY_TOKEN");
    process.exit(2);
  }
  const token = process.env["EXEC_GATEWAY_TOKEN"];
  const ca = process.env["EXEC_GATEWAY_CA"];
  return connect(target, {
    clientName,
    ...(token ? { token } : {}),
    ...(ca ? { ca } : {}),
  });
}
