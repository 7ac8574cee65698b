// The service's public API as the console uses it: the tenant's key as a bearer token, JSON
// both ways, errors as the service words them ({error, message}).

export interface SandboxInfo {
  id: string;
  template: string;
  backend: string;
  state?: string;
  created_at: number;
  expires_at: number | null;
  labels: Record<string, string>;
  workdir?: string | null;
}

export interface FileInfo {
  path: string;
  is_dir: boolean;
  size: number | null;
  modified_at: string | null;
}

export interface ExecuteResult {
  output: string;
  exit_code: number | null;
  error?: string | null;
  message?: string | null;
}

export interface StreamEvent {
  type: "output" | "exit";
  data?: string | null;
  stream?: "stderr" | "merged" | null;
  result?: ExecuteResult | null;
  id?: string | null;
}

/** What every file operation's answer has: its error in the protocol's words, if any. */
export interface FileAnswer {
  error?: string | null;
  message?: string | null;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const KEY = "sandboxes.console.key";

export function storedKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key: string | null): void {
  if (key === null) sessionStorage.removeItem(KEY);
  else sessionStorage.setItem(KEY, key);
}

export class Api {
  constructor(readonly key: string) {}

  private headers(json: boolean): HeadersInit {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.key}` };
    if (json) headers["Content-Type"] = "application/json";
    return headers;
  }

  async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const response = await fetch(path, {
      method,
      headers: this.headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) throw await failure(response);
    if (response.status === 204) return undefined as T;
    return (await response.json()) as T;
  }

  /** A file operation's answer, its protocol error raised as an `ApiError`. */
  async file<T>(id: string, op: string, body: unknown): Promise<T> {
    const answer = await this.call<T & FileAnswer>("POST", `/v1/sandboxes/${id}/files/${op}`, body);
    if (answer.error) throw new ApiError(200, answer.error, answer.message ?? answer.error);
    return answer;
  }

  /** Run a command, its events handed to `onEvent` as they arrive; its result at the end. */
  async stream(id: string, command: string, onEvent: (event: StreamEvent) => void): Promise<ExecuteResult> {
    const response = await fetch(`/v1/sandboxes/${id}/execute/stream`, {
      method: "POST",
      headers: this.headers(true),
      body: JSON.stringify({ command }),
    });
    if (!response.ok || response.body === null) throw await failure(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    let result: ExecuteResult | null = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline).trim();
        buffered = buffered.slice(newline + 1);
        if (!line) continue;
        const event = JSON.parse(line) as StreamEvent;
        if (event.type === "exit" && event.result) result = event.result;
        onEvent(event);
      }
    }
    if (result === null) throw new ApiError(0, "connection_lost", "the stream ended before the command did");
    return result;
  }
}

async function failure(response: Response): Promise<ApiError> {
  try {
    const body = (await response.json()) as { error?: string; message?: string };
    return new ApiError(response.status, body.error ?? "error", body.message ?? response.statusText);
  } catch {
    return new ApiError(response.status, "error", response.statusText);
  }
}

export function base64ToBytes(data: string): Uint8Array<ArrayBuffer> {
  const text = atob(data);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

export function bytesToBase64(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}
