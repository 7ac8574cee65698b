// A live terminal into the sandbox: xterm.js over the service's PTY WebSocket
// (/v1/sandboxes/{id}/pty, subprotocol sandboxes.pty.v1). Terminal bytes go both ways as binary
// messages; a resize goes as a JSON text message ({resize: {cols, rows}}); the service's text
// messages say the session first ({session}) and how it ended last ({exit}).

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { Api } from "./api";
import { h, notice, replace } from "./dom";

/** The WebSocket subprotocols that carry the key: a browser cannot set headers on a WebSocket. */
export function keyProtocols(key: string): string[] {
  return ["sandboxes.pty.v1", `bearer.${key}`];
}

export function openTerminal(api: Api, id: string): { element: HTMLElement; close: () => void } {
  const screen = h("div", { class: "terminal", "aria-label": "Terminal", role: "application" });
  const status = h("div", { "aria-live": "polite" });
  const element = h("div", {}, status, screen);
  const terminal = new Terminal({ cursorBlink: true, convertEol: false, fontSize: 14 });
  const fit = new FitAddon();
  terminal.loadAddon(fit);
  let socket: WebSocket | null = null;
  const encoder = new TextEncoder();

  requestAnimationFrame(() => {
    terminal.open(screen);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/v1/sandboxes/${encodeURIComponent(id)}/pty?cols=${terminal.cols}&rows=${terminal.rows}`;
    socket = new WebSocket(url, keyProtocols(api.key));
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      replace(status, notice("Connected"));
      terminal.focus();
    };
    socket.onmessage = (event: MessageEvent) => {
      if (typeof event.data === "string") {
        const message = JSON.parse(event.data) as {
          session?: string | null;
          exit?: { exit_code?: number | null; error?: string | null; message?: string | null } | null;
        };
        const ended = message.exit;
        if (ended?.error) replace(status, notice(`${ended.error}: ${ended.message ?? ""}`, "error"));
        else if (ended) replace(status, notice(`The shell exited (${ended.exit_code ?? "killed"})`));
        return;
      }
      terminal.write(new Uint8Array(event.data as ArrayBuffer));
    };
    socket.onclose = () => replace(status, notice("Disconnected"));
    terminal.onData((data) => socket?.readyState === WebSocket.OPEN && socket.send(encoder.encode(data)));
    terminal.onResize(({ cols, rows }) => socket?.readyState === WebSocket.OPEN && socket.send(JSON.stringify({ resize: { cols, rows } })));
  });
  const onWindowResize = (): void => fit.fit();
  window.addEventListener("resize", onWindowResize);
  return {
    element,
    close: () => {
      window.removeEventListener("resize", onWindowResize);
      socket?.close();
      terminal.dispose();
    },
  };
}
